"""The build flow: a model name or an ONNX file -> a cached engine.

export -> simplify -> fp16 | int8 | fp8 (-> repair) -> engine, each stage a cache entry (the graphs:
``flows.graphs``). Every option is validated before heavy work; a cache hit loads no model and no ONNX. No
engine is built from a graph whose record holds a failed check (``verification.record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit import reporting
from enginekit.compare.comparison import Gates
from enginekit.errors import ParityError, UsageError
from enginekit.requests import BuildRequest
from enginekit._version import __version__
from enginekit.engine_file import write_with_header
from enginekit.families.ultralytics.identity import ultralytics_header
from enginekit.families.registry import graph_metadata, resolve_recorded
from enginekit.flows.graphs import explain, graph_chain, graph_parity, judging_images
from enginekit.flows.store import publish_build
from enginekit.gpu import gpu_info
from enginekit.hashing import sha256_file
from enginekit.onnx.graph import get_metadata, load_model
from enginekit.pipeline import Artifact, copy_file_atomic, engine_key_parts
from enginekit.precisions import QAT_METHOD, get as get_precision
from enginekit.trt.flavours import resolve_targets
from enginekit.verification.record import record_of


@dataclass
class BuildOutcome:
    engine: Path
    entry: object  # cache.Entry
    status: str
    artifacts: list
    explanations: list[tuple[str, str]] = field(default_factory=list)
    events: list = field(default_factory=list)  # reporting.Event, what the run reported
    resolution: str | None = None  # found by identity in the cache or store: which entry and why
    #: graphs made on the way that the engine was not built from (the INT8 graph a repair replaced)
    also: list = field(default_factory=list)

    @property
    def manifest(self) -> dict:
        return self.entry.manifest

    def made(self) -> list[dict]:
        """Every artifact the build made or found, in pipeline order: each graph (its stage and precision), the INT8
        calibration cache, the engine and its parity report; each with its path and cache key."""
        rows = []
        for a in [*self.artifacts[:-1], *self.also, *self.artifacts[-1:]]:
            if a.entry is None:  # the user's own graph
                rows.append({"what": "graph (given)", "path": str(a.path), "key": None})
                continue
            rows.append({"what": f"graph ({a.stage})", "path": str(a.path), "key": a.entry.key})
            calib = a.entry.file("calibration.cache")
            if calib.is_file():
                rows.append({"what": "calibration cache", "path": str(calib), "key": a.entry.key})
        rows.append({"what": "engine", "path": str(self.engine), "key": self.entry.key})
        report = self.engine.parent / "parity.json"
        if report.is_file():
            rows.append({"what": "parity report", "path": str(report), "key": self.entry.key})
        return rows


def run_build(request: BuildRequest, cache=None) -> BuildOutcome:
    r = request
    g = graph_chain(r, cache)
    if g.found is not None:  # found by identity in the team store: no graph made here
        return BuildOutcome(g.found.entry.file("engine.plan"), g.found.entry, g.found.status, [],
                            resolution=g.found.reason)
    pipe, chain, source = g.pipe, g.chain, g.chain[-1]
    verify_fn = None
    if r.verify and not r.is_file:  # the graph is judged before any engine is built from it or cached
        checked = graph_parity(pipe, source, r.precision, g.opt_shape, Gates(pipe.adapter, r.tolerances),
                               repaired=(g.repair_result, g.repair_record) if g.repair_result is not None else None,
                               judge=judging_images(r, g.pipe, qat=g.precision_key.get("method") == QAT_METHOD))
        if checked.get("passed") is False:
            raise failed_graph(pipe, source, r, checked)
        verify_fn = lambda _path: checked  # noqa: E731 - the engine's manifest records the verdict its graph got
    extra = dict(g.extra)
    failed = refuse_failed_graph(g.pipe.cache, source, f"{pipe.subject} {r.precision}", accept=r.accept_failed)
    if failed:  # built all the same, as asked: the manifest keeps the override and the check (it stays failed)
        extra["override"] = {"accepted": "--accept-failed", "failed_check": failed}
        reporting.warning(f"--accept-failed: building from a graph that failed a check ({failed}); the engine is "
                          "recorded as failed")
    if r.explain:
        gpu = gpu_info()
        parts = engine_key_parts(source.sha256, g.precision_key, g.bound, g.flavour,
                                 resolve_targets(g.flavour, g.options.target_cc, gpu), gpu, g.options)
        explain(pipe, "engine", parts)
    entry, status = pipe.engine(source, g.bound, g.flavour, g.options, g.precision_key, verify_fn, chain,
                                extra=extra or None)

    publish_build(g.pipe.cache, chain, entry)
    return BuildOutcome(entry.file("engine.plan"), entry, status, chain, also=g.also)


def refuse_failed_graph(cache, source: Artifact, what: str, *, accept: bool = False) -> str:
    """Nothing is built from a graph whose record holds a failed check (``verification.record``: export's, build's,
    verify's, against the reference or labels), whatever passed since: one line naming the check, exit 1; with
    ``accept`` (``--accept-failed``) the failed check is returned for the engine's manifest instead."""
    record = record_of(cache, source.sha256)
    if record.failed and accept:
        return record.failure_line()
    if record.failed:
        raise ParityError(f"{what}: its graph failed an earlier check ({record.failure_line()}): no engine built; a "
                          "later pass on other images does not undo a failure (enginekit verify ... --recheck judges "
                          "it again from scratch, and says so), or --accept-failed builds it recorded as failed")
    return ""


def failed_graph(pipe, source: Artifact, r: BuildRequest, checked: dict) -> ParityError:
    """A graph that failed its parity verdict: its figures on the terminal (the lines verify prints), where it and its
    verdict are kept (apart from built engines: no engine was built), and the ways on; exit 1."""
    for line in checked.get("failures", []):
        reporting.note(f"FAIL {line}", level=1)
    task = (checked.get("report") or {}).get("task") or {}
    if task:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in task.items() if isinstance(v, (int, float)) and
                          k in ("recall", "precision", "map50", "compared"))
        reporting.note(f"task: {shown}", level=1)
    reporting.note(f"the {r.precision} graph and its failed verdict are kept apart in the cache (graph {source.path}, "
                   f"verdict {checked['verdict'][:12]}); no engine was built", level=1)
    mode = get_precision(r.precision)
    ways = ["--repair (keep the nodes that cause the loss in higher precision)"] if mode.repairable else []
    if mode.calibrated and not r.calib_data:
        ways.append("--calib-data DIR (calibrate on images of what the model sees)")
    ways.append("--tol PART.LIMIT=VALUE (other limits)")
    failures = checked.get("failures") or ["parity failed"]
    return ParityError(f"{pipe.subject} {r.precision}: its graph failed parity ({failures[0]}"
                       f"{f'; and {len(failures) - 1} more' if len(failures) > 1 else ''}): no engine built; "
                       f"try {', or '.join(ways)}")


def write_engine_file(outcome: BuildOutcome, dest: Path, *, ultralytics: bool = False) -> Path:
    """The built engine copied to ``dest`` (whole or not at all): the bare plan, or with ``ultralytics`` Ultralytics'
    header before it (``engine_file``: what ``YOLO("model.engine")`` reads: task, names, stride, imgsz, batch...),
    made from the graph the engine was built from and the engine's profile. The header also names the cache entry
    (``enginekit``: version, engine key, the plan's sha256)."""
    if not ultralytics:
        return copy_file_atomic(outcome.engine, dest)

    graphs = [a for a in outcome.artifacts if str(getattr(a, "path", "")).endswith(".onnx")]
    meta = graph_metadata(get_metadata(load_model(graphs[-1].path)), graphs[-1].path.name) if graphs else {}
    name = meta.get("model")
    adapter = resolve_recorded(name, meta) if name else None
    if adapter is None or not adapter.family.startswith(("yolo", "rtdetr")):
        raise UsageError(f"--ultralytics-metadata: {name or 'this graph'} is no Ultralytics model (its header describes "
                         "YOLO and RT-DETR engines); copy the plan without it")
    m = outcome.manifest
    profile = m["profiles"][0][adapter.input_name]
    header = ultralytics_header(name, meta, profile, (m.get("precision") or {}).get("mode", "fp32"),
                                extra={"enginekit": {"version": __version__, "engine": outcome.entry.key,
                                                     "plan_sha256": sha256_file(outcome.engine)}})
    return write_with_header(outcome.engine, dest, header)
