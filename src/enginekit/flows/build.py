"""The build flow: a model name or an ONNX file -> a cached engine.

export -> simplify -> fp16 | int8 | fp8 (-> repair) -> engine, each stage a cache entry. Every
option is validated before heavy work; a cache hit loads no model and no ONNX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit import reporting
from enginekit.compare.comparison import Gates
from enginekit.compare.parity import ParityResult
from enginekit.errors import ParityError, UsageError
from enginekit.requests import BuildRequest
from enginekit._version import __version__
from enginekit.backends import ONNX, verifier
from enginekit.cache import Cache
from enginekit.calibration import CalibrationData
from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs
from enginekit.engine_file import write_with_header
from enginekit.families.registry import graph_metadata, resolve_recorded
from enginekit.families.ultralytics.identity import ultralytics_header
from enginekit.flows.repair import repair
from enginekit.flows.store import engine_by_identity, publish_build
from enginekit.gpu import gpu_info
from enginekit.hashing import sha256_file
from enginekit.images import images_of, load_images
from enginekit.onnx.graph import get_metadata, input_dims, load_model
from enginekit.pipeline import Artifact, Stages, copy_file_atomic, engine_key_parts
from enginekit.precisions import get as get_precision
from enginekit.requests import workspace_bytes
from enginekit.shapes import bind_to_inputs, bind_to_model, parse_profile
from enginekit.stages.int8 import DEFAULT_METHOD
from enginekit.trt.builder import BuildOptions
from enginekit.trt.flavours import require_fp8, require_nms, resolve_flavour, resolve_targets


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
    mode = get_precision(r.precision)
    parsed = [parse_profile(p) for p in r.profiles]
    flavour = resolve_flavour(r.flavour)
    options = BuildOptions(
        workspace_bytes=workspace_bytes(r.workspace) if r.workspace else None,
        optimization_level=r.opt_level,
        target_cc=r.target_ccs,
    )
    targets = resolve_targets(flavour, options.target_cc, gpu_info())  # refuse bad --target-cc before any work
    if mode.min_compute_capability is not None:  # fp8
        require_fp8(targets)
    model = None
    if r.nms:
        model = r.model_request  # a model with no NMS to add is bad input, whatever the backend
    calib_cache = Path(r.calib_cache) if r.calib_cache else None
    data = CalibrationData(Path(r.calib_data) if r.calib_data else None, count=r.calib_count)
    if mode.calibrated and not data.is_array and not (calib_cache and calib_cache.is_file()):
        data.image_paths  # noqa: B018 - refuse a missing or empty image folder before any work
    cache = cache or Cache()

    extra: dict = {}
    if r.is_file:
        source_path = Path(r.target)
        adapter, subject = adapter_from_onnx(source_path)
        extra["source_model"] = source_model(source_path)  # what verify by model name checks
        pipe = Stages(None, cache, force=r.force, adapter=adapter, subject=subject)

        graph = load_model(source_path)
        dims = input_dims(graph)
        bound, opt_shape = bind_to_inputs(parsed, dims, adapter, source_path.name)
        if get_metadata(graph).get("nms") == "True":
            check_nms_batch(bound, get_metadata(graph), source_path.name)
        if holds_op(graph.graph, "NonMaxSuppression"):  # enginekit's NMS graphs hold none; another tool's may
            require_nms(flavour, f"{source_path.name}, which holds ONNX NonMaxSuppression")
        chain = [pipe.given(source_path, widen=mode.quantized)]
    else:
        pipe = Stages(model or r.model_request, cache, force=r.force)
        bound, opt_shape, export_shape = bind_to_model(parsed, pipe.adapter)
        if pipe.adapter.nms is not None:  # its NMS is unrolled over the largest batch the engine takes
            largest = max(rng.max[0] for p in bound for rng in p.inputs.values())
            export_shape = (largest, *export_shape[1:])
        if r.explain:
            explain(pipe, "onnx-export", pipe.export_parts(export_shape, r.opset))

        found = engine_by_identity(cache, pipe, r, bound, flavour, targets, pipe.export_parts(export_shape, r.opset))
        if found is not None and found.entry is not None:
            return BuildOutcome(found.entry.file("engine.plan"), found.entry, found.status, [], resolution=found.reason)
        chain = [pipe.export(export_shape, r.opset)]
        chain.append(pipe.simplify(chain[-1], export_shape))

    if getattr(pipe.adapter, "size_note", None):  # what happens to an input size (depth: any H x W)
        extra["input_sizes"] = pipe.adapter.size_note
    # the precision part of the engine key (Precision.key): how a quantized graph was made
    method = exclude = calibration = repaired_nodes = None
    # the family's default method; an ONNX file of no known family gets the stage's

    family_method = getattr(pipe.adapter, "int8_calibration", None)
    calib_method = r.calib_method or family_method or DEFAULT_METHOD
    if r.precision == "fp16":
        chain.append(pipe.fp16(chain[-1], opt_shape, CalibrationData(None, count=2)))
    elif r.precision == "int8":
        chain.append(pipe.int8(chain[-1], opt_shape, data, method=calib_method, exclude=list(r.exclude),
                               calibration_cache=calib_cache))
        method = calib_method
    elif r.precision == "fp8":
        chain.append(pipe.fp8(chain[-1], opt_shape, data, exclude=list(r.exclude)))
        method = mode.method
    if method is not None:
        exclude = chain[-1].manifest.get("exclude", [])
        calibration = chain[-1].manifest.get("calibration_source")
    repair_record = repair_result = None
    also: list = []
    if r.repair:
        repaired, repair_record, repair_result = repair(pipe, chain, r.precision, opt_shape, r.tolerances, data,
                                                        calib_method, list(r.exclude))
        if repaired is not chain[-1]:
            also.append(chain[-1])  # the INT8 graph the repair started from (and its calibration cache)
        chain[-1] = repaired
        if r.precision == "int8":
            exclude = repaired.manifest.get("exclude", [])
    source = chain[-1]

    verify_fn = None
    if r.verify and not r.is_file:  # the graph is judged before any engine is built from it or cached
        checked = graph_parity(pipe, source, r.precision, opt_shape, Gates(pipe.adapter, r.tolerances),
                               repaired=(repair_result, repair_record) if repair_result is not None else None)
        if checked.get("passed") is False:
            raise failed_graph(pipe, source, r, checked)
        verify_fn = lambda _path: checked  # noqa: E731 - the engine's manifest records the verdict its graph got
    if repair_record is not None:  # part of the key: set before --explain computes it
        repaired_nodes = repair_record["nodes"]
        extra["repair"] = repair_record
    if r.explain:
        gpu = gpu_info()
        parts = engine_key_parts(source.sha256, mode.key(method, exclude, calibration, repaired_nodes), bound, flavour,
                                 resolve_targets(flavour, options.target_cc, gpu), gpu, options)
        explain(pipe, "engine", parts)
    entry, status = pipe.engine(source, bound, flavour, options, mode.key(method, exclude, calibration, repaired_nodes),
                                verify_fn, chain, extra=extra or None)

    publish_build(cache, chain, entry)
    return BuildOutcome(entry.file("engine.plan"), entry, status, chain, also=also)


def holds_op(graph, op_type: str) -> bool:
    """Whether ``graph`` or a subgraph of it (Loop, If, Scan bodies) holds a node of ``op_type``."""
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            if node.op_type == op_type:
                return True
            stack.extend(attr.g for attr in node.attribute if attr.HasField("g"))
            stack.extend(sub for attr in node.attribute for sub in attr.graphs)
    return False


def check_nms_batch(profiles: list, metadata: dict[str, str], name: str) -> None:
    """A graph ending in Ultralytics' NMS serves batches up to the one it was traced with: a
    profile beyond it is refused (the images past it would come back with no boxes)."""
    largest = metadata.get("nms_max_batch", "0")
    for profile in profiles:
        for input_name, rng in profile.inputs.items():
            if rng.max[0] > int(largest):
                raise UsageError(f"{name} ends in NMS unrolled over {largest} images: profile batch {rng.max[0]} "
                                 f"exceeds it (export it with --nms --input {rng.max[0]}x...)")


def explain(pipe, kind: str, parts: dict) -> None:
    """``--explain``: hit or miss, and which part of the key changed."""
    reporting.note(f"explain {kind}: {pipe.cache.explain(kind, parts, subject=pipe.subject)}")


def adapter_from_onnx(path: Path):
    """The family adapter named in an enginekit-written ONNX's metadata, else None."""
    meta = graph_metadata(get_metadata(load_model(path)), path.name)
    name = meta.get("model")
    if name:
        try:
            return resolve_recorded(name, meta), name
        except UsageError:
            pass
    return None, path.stem


def source_model(path: Path) -> dict | None:
    """The model and weights identity an enginekit-exported ONNX file records, else None."""
    meta = graph_metadata(get_metadata(load_model(path)), path.name)
    if not meta.get("model"):
        return None
    return {"name": meta["model"], "weights": meta.get("weights")}


def graph_parity(pipe, source: Artifact, precision: str, shape, gates: Gates, repaired=None) -> dict:
    """The parity verdict of the graph an engine is built from, against PyTorch on the embedded photographs at the
    profile's opt shape: kept by content as export's verdicts are (kind ``parity``: the graph's sha256, the model,
    the inputs, the limits, the code), so a second build of the same graph judges nothing again, and ``verify``,
    ``deploy`` and ``cache ls`` find it by the graph's content. As the engine's manifest records it."""
    from enginekit.flows.export import verdict_parts

    candidate = verifier(ONNX).name  # check_onnx runs the graph on ONNX Runtime's CPU provider
    photos = images_of(None, limit=BUILD_PHOTOS)
    parts = {**verdict_parts(pipe, source, precision, gates.parity(precision), shape, photos, 0), "at": "build",
             "overrides": gates.state(precision, {})}
    if repaired is not None:  # one judgement: the repair's final check (its images, its gates) is the verdict
        final, record = repaired
        parts = {**parts, "at": "repair", "inputs": {"judged_on": record.get("judged_on"),
                                                     "repair": record.get("reused") or "search"}}
    refs = ReferenceCache(pipe.adapter, lambda: pipe.loaded)

    def produce(tmp: Path) -> dict:
        if repaired is not None:
            return {"result": final.state(), "passed": final.passed}
        cases = parity_inputs(pipe.adapter, shape, load_images(None, limit=BUILD_PHOTOS))
        checked = check_onnx(refs, source.path, cases, precision, gates=gates)
        checked.artifact = f"{pipe.subject}.{source.stage}"
        return {"result": checked.state(), "passed": checked.passed}

    with reporting.stage(f"parity {precision} (ONNX Runtime)") as s:
        try:
            entry, status = pipe.cache.get_or_create("parity", parts, produce, subject=pipe.subject)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - ORT refuses some graphs (FP8 Q/DQ around Transpose)
            s.status = "not-checked"
            return {"checked": False, "candidate": candidate, "passed": None,
                    "reason": f"ONNX Runtime cannot run this graph: {str(exc).splitlines()[0][:200]}"}
        result = ParityResult.from_state(entry.manifest["result"])
        s.status = result.status
        if status == "hit":
            s.detail = f"stored verdict {entry.key[:12]}"
    summary = {name: {k: round(v, 8) for k, v in w.items()} for name, w in result.worst().items()}
    return {"checked": True, "candidate": candidate, "passed": result.passed, "status": result.status,
            "failures": result.failures(), "summary": summary, "report": result.to_json(), "verdict": entry.key}


#: photographs the build's parity verdict runs on (embedded; the profile's opt shape)
BUILD_PHOTOS = 2


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
