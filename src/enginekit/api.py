"""Python API: the CLI's verbs, returning results instead of printing them.

Each verb takes a request (``enginekit.requests``) or the same names as keywords::

    enginekit.build("yolo12n", precision="fp16", random_init=True)
    enginekit.build(BuildRequest(target="yolo12n", precision="fp16", random_init=True))

What a run reports (stages, notes, warnings) is collected into the result's ``events``; when
a renderer listens (the CLI), it also sees them unless ``quiet=True``. The work itself lives
in ``enginekit.flows``.
"""

from __future__ import annotations

from typing import Any

from enginekit.flows import run
from enginekit.flows.build import BuildOutcome
from enginekit.flows.export import ExportResult
from enginekit.flows.verify import VerifyOutcome
from enginekit.bench.flow import BenchOutcome, run_bench
from enginekit.requests import (BenchRequest, BuildRequest, DeployRequest, ExportRequest, PredictRequest, TuneRequest,
                                VerifyRequest, coerce)
from enginekit.families.torch_models.spec import FLAGS
from enginekit.flows.build import run_build
from enginekit.flows.deploy import run_deploy
from enginekit.flows.export import run_export
from enginekit.flows.load import load as run_load
from enginekit.flows.predict import PredictOutcome, run_predict
from enginekit.flows.tune import run_tune
from enginekit.flows.verify import run_verify
from enginekit.store.settings import using

__all__ = ["export", "build", "verify", "tune", "deploy", "predict", "bench", "ExportRequest", "BuildRequest",
           "VerifyRequest", "TuneRequest", "DeployRequest", "PredictRequest", "BenchRequest", "PredictOutcome", "BenchOutcome",
           "ExportResult", "BuildOutcome", "VerifyOutcome"]


def export(model: ExportRequest | str | None = None, /, *, cache=None, quiet: bool = False,
           **options: Any) -> ExportResult:
    """PyTorch -> simplified ONNX (and FP16 with ``fp16=True``), parity-checked, copied to ``output``.

    Nothing is written to ``output`` when the parity gate fails. Options: ``ExportRequest``'s.
    """
    return run(run_export, coerce(ExportRequest, model, options, "model"), cache, quiet=quiet)


def build(target: BuildRequest | str | None = None, /, *, cache=None, quiet: bool = False,
          **options: Any) -> BuildOutcome:
    """A model name or an ONNX file -> a cached engine (export, simplify, precision, build).

    Options: ``BuildRequest``'s (profiles, precision, flavour (the TensorRT that builds; backend= until now), target_cc, calib_*, repair, ...).
    """
    return run(run_build, coerce(BuildRequest, target, options, "target"), cache, quiet=quiet)


def verify(target: VerifyRequest | str | None = None, /, *, cache=None, quiet: bool = False,
           **options: Any) -> VerifyOutcome:
    """Check engines and their ONNX artifacts against the PyTorch reference.

    ``target``: None (every engine in the cache), a cache key (prefix), a model name (built or
    found with ``build_options``), or an ONNX file with ``reference`` (its PyTorch checkpoint).
    Options: ``VerifyRequest``'s.
    """
    return run(run_verify, coerce(VerifyRequest, target, options, "target"), cache, quiet=quiet)


def tune(models: TuneRequest | str | list | None = None, /, *, cache=None, quiet: bool = False, **options: Any):
    """The settings of one or several models that meet a frame budget here (``enginekit.flows.tune``): each
    candidate built through the cache, verified and streamed; ``outcome.chosen`` (None: nothing meets),
    ``outcome.candidates``, ``outcome.recipes`` (with ``write_recipe``). Options: ``TuneRequest``'s."""
    return run(run_tune, coerce(TuneRequest, models, options, "models"), cache, quiet=quiet)


def deploy(target: DeployRequest | str | None = None, /, *, cache=None, quiet: bool = False, **options: Any):
    """A Triton model repository for ``target`` in ``repo`` (``enginekit.flows.deploy``): ``NAME-net`` (the
    cache's checked network) and ``NAME`` (images in, what ``predict`` finds out). Options: ``DeployRequest``'s."""
    return run(run_deploy, coerce(DeployRequest, target, options, "target"), cache, quiet=quiet)


def predict(models: PredictRequest | str | list | None = None, sources=None, /, *, cache=None, quiet: bool = False,
            **options: Any) -> PredictOutcome:
    """Every frame of ``sources`` (images, a folder, videos, cameras) through ``models``, on the streaming pipeline:
    ``outcome.records`` (per frame what each model found), ``outcome.summary`` (frames/s, stage figures),
    overlays and results.json in ``save``. Options: ``PredictRequest``'s."""
    if sources is not None:
        options = {"sources": sources, **options}
    return run(run_predict, coerce(PredictRequest, models, options, "models"), cache, quiet=quiet)


def bench(models: BenchRequest | str | list | None = None, /, *, cache=None, quiet: bool = False,
          **options: Any) -> BenchOutcome:
    """Latency and throughput of ``models`` (a name, a comma list or a list) on the runners that run here, fed the
    same seeded inputs: ``outcome.reports`` (per model, a row per runner and batch: p50/p90/p95/p99, img/s, or why it
    was skipped), ``outcome.e2e`` (``e2e=True``: per frame through ``load``), ``outcome.stream`` (``stream=True``),
    ``outcome.to_json()`` (``bench --json``'s document). Options: ``BenchRequest``'s."""
    return run(run_bench, coerce(BenchRequest, models, options, "models"), cache, quiet=quiet)


def load(target, precision: str = "fp32", backend: str = "auto", *, remote: str | None = None,
         remote_read_only: bool = False, **options: Any):
    """Frames -> predictions over an engine, ONNX Runtime or PyTorch (or any registered backend).

    A model name is exported or built through the cache as its backend needs (``enginekit.flows.load``),
    then the runtime loads the artifact (``enginekit.runtime.loader``, which only loads).
    ``predictor(images)`` returns per image the family's results in the original image's pixels;
    ``predictor.backend`` and ``predictor.reason`` say which backend runs and why (and, for an
    engine found by identity in the team store, which entry and why). ``remote``: the store's URL
    (default ``$ENGINEKIT_REMOTE``), ``remote_read_only``: never write to it.
    """
    with using(remote, read_only=remote_read_only):
        return run_load(target, precision, backend, **options)


# -- signatures: each verb's keywords are its request's fields (declared once, in ``enginekit.requests``) --------
class _Shown:
    """A default as ``help()`` shows it (a field's value, never a shared object to mutate)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default(field):
    import inspect

    if field.is_required():
        return inspect.Parameter.empty
    if field.default_factory is not None:
        return _Shown(repr(field.default_factory()))
    value = field.default
    return value if value is None or isinstance(value, (bool, int, float, str)) else _Shown(repr(value))


def _signature(fn, request_cls, first: str, *more: str) -> None:
    """``fn``'s signature for ``help()`` and editors: ``first`` (or a request) and ``more`` positionally, then every
    field of ``request_cls`` by keyword with its type and default, then ``cache`` and ``quiet``."""
    import inspect

    P = inspect.Parameter
    params = [P(first, P.POSITIONAL_ONLY, default=None, annotation=f"{request_cls.__name__} | str | None")]
    params += [P(name, P.POSITIONAL_ONLY, default=None, annotation=request_cls.model_fields[name].annotation)
               for name in more]
    for name, field in request_cls.model_fields.items():
        if name in (first, *more):
            continue
        params.append(P(name, P.KEYWORD_ONLY, default=_default(field), annotation=field.annotation))
    if hasattr(request_cls, "_imgsz"):  # --imgsz: a size for the input (export) or a profile (build)
        params.append(P("imgsz", P.KEYWORD_ONLY, default=None, annotation="int | str | None"))
    params += [P("cache", P.KEYWORD_ONLY, default=None), P("quiet", P.KEYWORD_ONLY, default=False, annotation=bool)]
    fn.__signature__ = inspect.Signature(params, return_annotation=inspect.signature(fn).return_annotation)


_signature(export, ExportRequest, "model")
_signature(build, BuildRequest, "target")
_signature(verify, VerifyRequest, "target")
_signature(tune, TuneRequest, "models")
_signature(deploy, DeployRequest, "target")
_signature(predict, PredictRequest, "models", "sources")
_signature(bench, BenchRequest, "models")


def _load_signature() -> None:
    """``load``'s: the runtime's own parameters (``flows.load.load``), the store's, then what an engine build and a
    model declaration take (``BuildRequest``'s fields, ``--task``...), by keyword."""
    import inspect

    P = inspect.Parameter
    own = [p for p in inspect.signature(run_load).parameters.values() if p.kind != P.VAR_KEYWORD]
    names = {p.name for p in own}
    params = own[:3] + [P("remote", P.KEYWORD_ONLY, default=None, annotation="str | None"),
                        P("remote_read_only", P.KEYWORD_ONLY, default=False, annotation=bool)] + own[3:]
    for name, field in BuildRequest.model_fields.items():
        if name not in names and name != "target":
            params.append(P(name, P.KEYWORD_ONLY, default=_default(field), annotation=field.annotation))
    for name in (*FLAGS, "bgr"):
        if name not in names and name not in BuildRequest.model_fields:
            params.append(P(name, P.KEYWORD_ONLY, default=None))
    load.__signature__ = inspect.Signature(params)


_load_signature()
