"""Python API: the same verbs as the CLI, returning results instead of printing them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit.errors import UsageError


@dataclass
class ExportResult:
    model: str
    output: Path | None
    artifacts: list  # pipeline.Artifact, in pipeline order
    parity: list  # verify.parity.ParityResult, one per checked graph
    fp16_share: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.parity)

    def failures(self) -> list[str]:
        return [f"{r.artifact} ({r.precision}) {m}" for r in self.parity for m in r.failures()]

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "output": str(self.output) if self.output else None,
            "passed": self.passed,
            "fp16_initializer_share": self.fp16_share,
            "artifacts": [{"stage": a.stage, "sha256": a.sha256, "cache": a.status} for a in self.artifacts],
            "parity": [r.to_json() for r in self.parity],
        }


def export(
    model: str,
    *,
    input: str | None = None,
    fp16: bool = False,
    output: Path | None = None,
    weights: Path | None = None,
    random_init: bool = False,
    seed: int = 0,
    opset: int = 18,
    simplifier: str = "onnxsim",
    images: Path | None = None,
    rel_l2: float | None = None,
    force: bool = False,
    cache=None,
    quiet: bool = False,
) -> ExportResult:
    """Export ``model`` to simplified ONNX (and FP16), check parity, copy the result to ``output``.

    Nothing is written to ``output`` when the parity gate fails.
    """
    from dataclasses import replace

    from enginekit.calibration import CalibrationData
    from enginekit.images import load_images
    from enginekit.pipeline import ModelRequest, Pipeline, copy_out
    from enginekit.shapes import parse_shape
    from enginekit.ui import step
    from enginekit.verify.parity import ReferenceCache, check_onnx, parity_inputs

    request = ModelRequest(model, Path(weights) if weights else None, random_init, seed)
    adapter = request.adapter
    shape = parse_shape(input, what="--input") if input else adapter.default_input
    adapter.constraint.check(shape, what="--input")
    if simplifier not in ("onnxsim", "onnxslim"):
        raise UsageError(f"unknown simplifier {simplifier!r}: choose onnxsim or onnxslim")
    photos = load_images(Path(images) if images else None, limit=4)

    pipe = Pipeline(request, cache, force=force, quiet=quiet)
    reference_data = CalibrationData(Path(images) if images else None, count=2)
    chain = pipe.onnx_chain(shape, opset=opset, fp16=fp16, simplifier=simplifier, reference_data=reference_data)
    simplified, final = chain[1], chain[-1]

    refs = ReferenceCache(adapter, pipe.loaded)
    cases = parity_inputs(adapter, shape, photos, seed=seed)
    results = []
    checks = [(simplified, "fp32")] + ([(final, "fp16")] if fp16 else [])
    for artifact, precision in checks:
        with step(f"parity {precision}", quiet=quiet) as s:
            tol = adapter.tolerance(precision)
            if rel_l2 is not None and artifact is final:
                tol = replace(tol, rel_l2=rel_l2)
            r = check_onnx(refs, artifact.path, cases, precision, tol)
            r.artifact = f"{adapter.variant}.{artifact.stage}"
            s.status = "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        results.append(r)

    share = None
    if fp16:
        share = final.entry.manifest.get("initializer_dtype_share", {}).get("FLOAT16", 0.0)
    result = ExportResult(adapter.variant, None, chain, results, share)
    if result.passed:
        suffix = ".fp16.onnx" if fp16 else ".onnx"
        dest = Path(output) if output else Path.cwd() / f"{adapter.variant}{suffix}"
        result.output = copy_out(final, dest)
    return result


PRECISIONS = ("fp32", "fp16", "int8", "fp8")


@dataclass
class BuildOutcome:
    engine: Path
    entry: object  # cache.Entry
    status: str
    artifacts: list
    explanations: list[tuple[str, str]] = field(default_factory=list)

    @property
    def manifest(self) -> dict:
        return self.entry.manifest


def build(
    target: str,
    *,
    profiles: list[str] | tuple[str, ...] = (),
    precision: str = "fp32",
    backend: str = "auto",
    target_cc: str | None = None,
    workspace: str | None = None,
    opt_level: int | None = None,
    calib_data: Path | None = None,
    calib_count: int = 8,
    calib_method: str = "entropy",
    calib_cache: Path | None = None,
    exclude: list[str] | tuple[str, ...] = (),
    weights: Path | None = None,
    random_init: bool = False,
    seed: int = 0,
    opset: int = 18,
    force: bool = False,
    explain: bool = False,
    verify: bool = True,
    cache=None,
    quiet: bool = False,
) -> BuildOutcome:
    """A model name or an ONNX file -> a cached engine (export, simplify, precision, build).

    Every flag is validated before any heavy work; a cache hit loads no model and no ONNX.
    """
    from enginekit.cache import Cache, parse_size
    from enginekit.calibration import CalibrationData
    from enginekit.pipeline import Artifact, ModelRequest, Pipeline
    from enginekit.shapes import parse_profile
    from enginekit.trt.backends import resolve_backend, resolve_targets
    from enginekit.trt.builder import BuildOptions

    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose {', '.join(PRECISIONS)}")
    if precision == "fp8":
        raise UsageError("fp8 is not supported yet: use fp16 or int8")
    parsed = [parse_profile(p) for p in profiles]
    be = resolve_backend(backend)
    options = BuildOptions(
        workspace_bytes=parse_size(workspace) if workspace else None,
        optimization_level=opt_level,
        target_cc=tuple(t.strip() for t in target_cc.split(",") if t.strip()) if target_cc else None,
    )
    from enginekit.trt.backends import gpu_info

    resolve_targets(be, options.target_cc, gpu_info())  # refuse bad --target-cc before any work
    cache = cache or Cache()

    is_file = target.endswith(".onnx") or Path(target).is_file()
    if is_file:
        source_path = Path(target)
        adapter, subject = _adapter_from_onnx(source_path)
        pipe = Pipeline(None, cache, force=force, quiet=quiet, adapter=adapter, subject=subject)
        bound, opt_shape = _bind_profiles_to_onnx(parsed, source_path, adapter)
        chain = [Artifact.given(source_path)]
    else:
        request = ModelRequest(target, Path(weights) if weights else None, random_init, seed)
        adapter = request.adapter
        pipe = Pipeline(request, cache, force=force, quiet=quiet)
        bound, opt_shape, export_shape = _bind_profiles_to_model(parsed, adapter)
        if explain:
            _explain_stage(pipe, "onnx-export", pipe.export_parts(export_shape, opset))
        chain = [pipe.export(export_shape, opset)]
        chain.append(pipe.simplify(chain[-1], export_shape))

    recipe: dict = {"mode": precision}
    data = CalibrationData(Path(calib_data) if calib_data else None, count=calib_count)
    if precision == "fp16":
        chain.append(pipe.fp16(chain[-1], opt_shape, CalibrationData(None, count=2)))
    elif precision == "int8":
        chain.append(pipe.int8(chain[-1], opt_shape, data, method=calib_method, exclude=list(exclude),
                               calibration_cache=Path(calib_cache) if calib_cache else None))
        recipe.update({"method": calib_method, "exclude": chain[-1].manifest.get("exclude", []),
                       "calibration": chain[-1].manifest.get("calibration_source")})
    source = chain[-1]

    verify_fn = None
    if verify and not is_file:
        verify_fn = _engine_source_parity(pipe, precision, opt_shape)
    if explain:
        from enginekit.pipeline import engine_key_parts
        from enginekit.trt.backends import gpu_info

        gpu = gpu_info()
        parts = engine_key_parts(source.sha256, recipe, bound, be, resolve_targets(be, options.target_cc, gpu),
                                 gpu, options)
        _explain_stage(pipe, "engine", parts)
    entry, status = pipe.engine(source, bound, be, options, recipe, verify_fn)
    return BuildOutcome(entry.file("engine.plan"), entry, status, chain)


def _explain_stage(pipe, kind: str, parts: dict) -> None:
    from enginekit.ui import console

    console.print(f"  explain {kind}: {pipe.cache.explain(kind, parts, subject=pipe.subject)}")


def _adapter_from_onnx(path: Path):
    """The family adapter named in an enginekit-written ONNX's metadata, else None."""
    from enginekit.onnx.graph import get_metadata, load_model

    meta = get_metadata(load_model(path))
    name = meta.get("model")
    if name:
        from enginekit.models import resolve

        try:
            return resolve(name), name
        except UsageError:
            pass
    return None, path.stem


def _bind_profiles_to_onnx(parsed, path: Path, adapter):
    from enginekit.onnx.graph import input_dims, load_model
    from enginekit.shapes import check_against_onnx_input, parse_profile

    dims = input_dims(load_model(path))
    if not parsed:
        if any(not isinstance(d, int) for ds in dims.values() for d in ds):
            raise UsageError(f"{path.name} has dynamic inputs: give --profile min:opt:max (or NxCxHxW)")
        parsed = [parse_profile(",".join(f"{n}={'x'.join(map(str, d))}" for n, d in dims.items()))]
    bound = [p.bind(list(dims)) for p in parsed]
    for profile in bound:
        for name, rng in profile.inputs.items():
            check_against_onnx_input(name, rng, dims[name])
            if adapter is not None and name == adapter.input_name:
                adapter.constraint.check_range(rng, what="profile")
    first = bound[0].inputs[next(iter(bound[0].inputs))]
    return bound, first.opt


def _bind_profiles_to_model(parsed, adapter):
    """Profiles for a model name: defaults, family constraints, and the shape to export at."""
    from enginekit.shapes import InputRange, Profile

    if not parsed:
        s = adapter.default_input
        parsed = [Profile({None: InputRange(s, s, s)})]
    bound = [p.bind([adapter.input_name]) for p in parsed]
    ranges = [p.inputs[adapter.input_name] for p in bound]
    for rng in ranges:
        adapter.constraint.check_range(rng, what="profile")
    dynamic_hw = 2 in adapter.dynamic_axes.get(adapter.input_name, {})
    if dynamic_hw:
        export_shape = adapter.default_input
    else:
        sides = {s[2:] for r in ranges for s in (r.min, r.opt, r.max)}
        if len(sides) != 1:
            raise UsageError(
                f"{adapter.variant} exports with fixed H/W: every profile shape must share one H x W "
                f"(got {', '.join('x'.join(map(str, s)) for s in sorted(sides))})"
            )
        (hw,) = sides
        export_shape = (1, adapter.default_input[1], *hw)
    return bound, ranges[0].opt, export_shape


def _engine_source_parity(pipe, precision: str, shape):
    """Parity of the graph an engine is built from, against PyTorch, for its manifest."""

    def check(onnx_path: Path) -> dict:
        from enginekit.images import load_images
        from enginekit.ui import step
        from enginekit.verify.parity import ReferenceCache, check_onnx, parity_inputs

        with step(f"parity {precision} (ONNX Runtime)", quiet=pipe.quiet) as s:
            refs = ReferenceCache(pipe.adapter, pipe.loaded)
            cases = parity_inputs(pipe.adapter, shape, load_images(None, limit=2))
            result = check_onnx(refs, onnx_path, cases, precision)
            s.status = "[green]pass[/]" if result.passed else "[red]FAIL[/]"
        summary = {name: {k: round(v, 8) for k, v in w.items()} for name, w in result.worst().items()}
        return {"checked": True, "candidate": "onnxruntime-cpu", "passed": result.passed,
                "failures": result.failures(), "summary": summary, "report": result.to_json()}

    return check
