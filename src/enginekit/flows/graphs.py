"""The graphs an engine is built from: a model name or an ONNX file -> export -> simplify -> fp16 | int8 | fp8
(-> repair), each a cache entry; and the engine of them where the cache holds one (found, never built here).

``build`` makes its engine from the chain's last graph; ``verify`` judges the chain's graphs, and the engine where
``build`` made one, without building any. Every option is validated before heavy work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit import reporting
from enginekit.backends import ONNX, verifier
from enginekit.cache import Cache
from enginekit.calibration import CalibrationData
from enginekit.compare.comparison import Gates
from enginekit.compare.parity import ParityResult, ReferenceCache, check_onnx, parity_inputs
from enginekit.errors import UsageError
from enginekit.images import images_of, load_images
from enginekit.flows.repair import repair
from enginekit.flows.store import engine_by_identity
from enginekit.families.registry import graph_metadata, resolve_recorded
from enginekit.onnx.graph import get_metadata, input_dims, load_model
from enginekit.pipeline import Artifact, Stages
from enginekit.precisions import QAT_METHOD, get as get_precision, is_qat
from enginekit.requests import BuildRequest, workspace_bytes
from enginekit.shapes import bind_to_inputs, bind_to_model, parse_profile
from enginekit.stages.int8 import DEFAULT_METHOD
from enginekit.trt.builder import BuildOptions
from enginekit.trt.flavours import gpu_info, require_fp8, require_nms, resolve_flavour, resolve_targets


@dataclass
class GraphChain:
    """The graphs of one build request, in pipeline order, and what the engine of them is keyed by."""

    pipe: Stages
    chain: list
    bound: list  # the optimization profiles, bound to the graph's input
    opt_shape: tuple
    flavour: object
    options: BuildOptions
    precision_key: dict  # the precision part of the engine key (how a quantized graph was made)
    extra: dict = field(default_factory=dict)  # more for the engine's manifest (repair, source model, input sizes)
    also: list = field(default_factory=list)  # graphs made on the way the engine is not built from
    repair_record: dict | None = None
    repair_result: object = None
    found: object = None  # an engine found by identity in the team store (no graph was made)

    def engine(self):
        """The cached engine of this chain (its key, as ``build`` makes it), or None: found, never built."""
        return self.pipe.find_engine(self.chain[-1], self.bound, self.flavour, self.options, self.precision_key)


def graph_chain(r: BuildRequest, cache=None, *, by_identity: bool = True) -> GraphChain:
    """The graphs ``r`` asks for (made or found in the cache). ``by_identity``: a model name's engine may first be
    found in the team store by what it is (then ``found`` is set and no graph is made)."""
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
        if by_identity:
            found = engine_by_identity(cache, pipe, r, bound, flavour, targets,
                                       pipe.export_parts(export_shape, r.opset))
            if found is not None and found.entry is not None:
                return GraphChain(pipe, [], bound, opt_shape, flavour, options, {}, found=found)
        chain = [pipe.export(export_shape, r.opset)]
        chain.append(pipe.simplify(chain[-1], export_shape))

    if getattr(pipe.adapter, "size_note", None):  # what happens to an input size (depth: any H x W)
        extra["input_sizes"] = pipe.adapter.size_note
    qat = graph_is_qat(chain[-1].path)
    if qat:
        check_qat_request(r, pipe.subject)
    # the precision part of the engine key (Precision.key): how a quantized graph was made
    method = exclude = calibration = repaired_nodes = None
    # the family's default method; an ONNX file of no known family gets the stage's
    family_method = getattr(pipe.adapter, "int8_calibration", None)
    calib_method = r.calib_method or family_method or DEFAULT_METHOD
    if r.calib_method == AUTO_METHOD and not measure_methods(r, data, calib_cache):  # nothing apart to judge on
        calib_method = family_method or DEFAULT_METHOD
        if r.precision == "int8":
            reporting.note(f"--calib-method auto measures on a folder of --calib-data's images: calibrating with "
                           f"{calib_method}")
    if r.precision == "fp16":
        chain.append(pipe.fp16(chain[-1], opt_shape, CalibrationData(None, count=2)))
    elif r.precision == "int8" and qat:  # its graph is its INT8: the trained ranges, no calibration
        reporting.note(f"{pipe.subject} int8: trained quantization-aware (QAT): its graph carries the trained INT8 "
                       "ranges as Q/DQ; no calibration")
        method = QAT_METHOD
    elif r.precision == "int8":
        if measure_methods(r, data, calib_cache):  # judged on the folder's other images: the best method kept
            calib_method, chosen, table = choose_calibration(r, pipe, chain[-1], opt_shape, data,
                                                             first=family_method or DEFAULT_METHOD,
                                                             every=r.calib_method == AUTO_METHOD)
            extra["calibration_choice"] = table
            chain.append(chosen)
        else:
            chain.append(pipe.int8(chain[-1], opt_shape, data, method=calib_method, exclude=list(r.exclude),
                                   calibration_cache=calib_cache))
        method = calib_method
    elif r.precision == "fp8":
        chain.append(pipe.fp8(chain[-1], opt_shape, data, exclude=list(r.exclude)))
        method = mode.method
    if method == QAT_METHOD:
        exclude, calibration = [], None
    elif method is not None:
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
    if repair_record is not None:  # part of the key
        repaired_nodes = repair_record["nodes"]
        extra["repair"] = repair_record
    return GraphChain(pipe, chain, bound, opt_shape, flavour, options,
                      mode.key(method, exclude, calibration, repaired_nodes), extra, also, repair_record,
                      repair_result)


def graph_is_qat(path: Path) -> bool:
    """Whether the graph at ``path`` was exported from a quantization-aware trained checkpoint (its metadata)."""
    return is_qat(get_metadata(load_model(path)))


def check_qat_request(r: BuildRequest, subject: str) -> None:
    """A QAT graph is INT8 with its trained ranges: another precision, or calibration options, are refused (exit 2)."""
    if r.precision != "int8":
        raise UsageError(f"{subject} was trained quantization-aware (Ultralytics quantize=8): its graph is INT8 with "
                         f"the trained ranges, not {r.precision}; build it with --precision int8 (no calibration "
                         "data needed)")
    given = [flag for flag, value in (("--calib-data", r.calib_data), ("--calib-cache", r.calib_cache),
                                      ("--calib-method", r.calib_method), ("--exclude", r.exclude),
                                      ("--repair", r.repair)) if value]
    if given:
        raise UsageError(f"{subject} was trained quantization-aware (Ultralytics quantize=8): its INT8 ranges are "
                         f"trained, not calibrated: {given[0]} does not apply (judge it on your images with verify "
                         "--images DIR)")


#: images of a user's folder the build judges its graph on (those it did not calibrate on, or ``--images``'s)
JUDGE_IMAGES = 16


def judging_images(r: BuildRequest, pipe, *, qat: bool = False) -> tuple:
    """(the images build judges its graph on, what they are): ``--images``'s; for a calibrated precision with a folder
    of ``--calib-data``, its images the graph was not calibrated on (said, with how many of the folder calibrated it;
    a folder with no others is judged on its calibration images, said as a warning); else the embedded photographs
    (said where a calibrated graph was calibrated on them too)."""
    from enginekit.flows.repair import judged_on

    if r.images is not None:
        photos = load_images(Path(r.images), limit=JUDGE_IMAGES)
        return photos, f"{len(photos.images)} image(s) of {r.images}"
    folder = Path(r.calib_data) if r.calib_data is not None and Path(r.calib_data).is_dir() else None
    if get_precision(r.precision).calibrated and folder is not None:
        data = CalibrationData(folder, count=r.calib_count)
        total = len(images_of(folder))
        photos, said = judged_on(folder, data, limit=JUDGE_IMAGES)
        reporting.note(f"{pipe.subject} {r.precision}: calibrated on {len(data.image_paths)} of the {total} images "
                       f"of {folder} (--calib-count {r.calib_count}, spread evenly); judged on {said}")
        return photos, said
    photos = load_images(None, limit=BUILD_PHOTOS if get_precision(r.precision).reduced else FP32_BUILD_PHOTOS)
    if get_precision(r.precision).calibrated and r.calib_data is None and r.calib_cache is None and not qat:
        reporting.note(f"{pipe.subject} {r.precision}: no --calib-data: calibrated on the embedded photographs, and "
                       "judged on them (--calib-data DIR calibrates on images of what the model sees and judges on "
                       "others of them)")
    return photos, "the embedded photographs"


def graph_parity(pipe, source: Artifact, precision: str, shape, gates: Gates, repaired=None, judge=None) -> dict:
    """The parity verdict of the graph an engine is built from, against PyTorch on the embedded photographs at the
    profile's opt shape: kept by content as export's verdicts are (kind ``parity``: the graph's sha256, the model,
    the inputs, the limits, the code), so a second build of the same graph judges nothing again, and ``verify``,
    ``deploy`` and ``cache ls`` find it by the graph's content. As the engine's manifest records it."""
    from enginekit.flows.export import verdict_parts

    candidate = verifier(ONNX).name  # check_onnx runs the graph on ONNX Runtime's CPU provider
    judged, judged_said = judge if judge is not None else (load_images(None, limit=BUILD_PHOTOS),
                                                          "the embedded photographs")
    parts = {**verdict_parts(pipe, source, precision, gates.parity(precision), shape, judged.paths, 0), "at": "build",
             "overrides": gates.state(precision, {})}
    parts["inputs"]["judged_on"] = judged_said
    if repaired is not None:  # one judgement: the repair's final check (its images, its gates) is the verdict
        final, record = repaired
        parts = {**parts, "at": "repair", "inputs": {"judged_on": record.get("judged_on"),
                                                     "repair": record.get("reused") or "search"}}
    refs = ReferenceCache(pipe.adapter, lambda: pipe.loaded)

    def produce(tmp: Path) -> dict:
        if repaired is not None:
            return {"result": final.state(), "passed": final.passed}
        cases = parity_inputs(pipe.adapter, shape, judged, photos=len(judged.images))
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


#: photographs the build's parity verdict runs on where no folder of the user's gives them (embedded; the profile's opt
#: shape): every embedded one, for the evidence a share gate's interval needs
BUILD_PHOTOS = 2
FP32_BUILD_PHOTOS = 2


#: the calibration methods ModelOpt's ONNX PTQ offers that ``--calib-method auto`` measures
MEASURED_METHODS = ("max", "entropy")
AUTO_METHOD = "auto"


def measure_methods(r: BuildRequest, data: CalibrationData, calib_cache) -> bool:
    """Whether an INT8 build chooses its calibration by measurement: no method asked for (the default) or
    ``--calib-method auto``; images of the user's to judge on apart from calibration (a folder, a dataset, a video);
    no calibration cache given; the graph's family known (its gates judge the methods). Whatever the verb (``build
    --no-verify`` and ``verify``'s chain too): the same flags give the same graph."""
    return (r.calib_method in (AUTO_METHOD, None) and r.calib_data is not None and not data.is_array
            and calib_cache is None and not r.is_file)


def method_order(first: str) -> list[str]:
    """The methods measured, the family's first: ``max`` for YOLO, then the others ModelOpt offers."""
    if first not in MEASURED_METHODS:
        return list(MEASURED_METHODS)
    return [first, *(m for m in MEASURED_METHODS if m != first)]


def choose_calibration(r: BuildRequest, pipe, source, shape, data, *, first: str = DEFAULT_METHOD,
                       every: bool = True):
    """(method, graph, table): ``MEASURED_METHODS`` calibrated, the family's ``first`` first (each its own cache
    entry, keyed by the method), judged on the images apart from calibration as build judges
    (``build.graph_parity``, stored: the chosen graph's verdict is then a hit), and the best kept: one that passes
    before one that does not, then the one whose gated figures hold most (recall, precision, mAP50 against the
    reference's detections, by their lower bounds), then the lower scores error. ``every`` False (the default
    calibration): the next method is measured only where those before it failed, so a model the family's method
    serves pays for one calibration. The table (method, passed, figures with their intervals, the methods not
    measured and why) is said and kept in the engine's manifest."""
    gates = Gates(pipe.adapter, r.tolerances)
    judge = judging_images(r, pipe)
    rows, graphs = [], {}
    order = method_order(first)
    for method in order:
        graph = pipe.int8(source, shape, data, method=method, exclude=list(r.exclude))
        checked = graph_parity(pipe, graph, "int8", shape, gates, judge=judge)
        task = (checked.get("report") or {}).get("task") or {}
        bounds = {c.get("key") or c["name"]: c.get("interval") for c in (checked.get("report") or {}).get("checks", [])
                  if isinstance(c, dict) and c.get("interval")}
        rows.append({"method": method, "passed": checked.get("passed"),
                     "figures": {k: round(float(task[k]), 4) for k in ("recall", "precision", "map50") if k in task},
                     "intervals": bounds, "failures": list(checked.get("failures") or [])[:3],
                     "graph": graph.sha256})
        graphs[method] = graph
        if not every and checked.get("passed") is not False:  # passed (or could not be judged): no need of another
            break
    skipped = [m for m in order if m not in graphs]

    def rank(row):
        lows = [iv[0] for iv in row["intervals"].values() if iv]
        return (row["passed"] is True, sum(lows) if lows else sum(row["figures"].values()))

    best = max(rows, key=rank)
    for row in rows:
        figures = ", ".join(f"{k} {v:.3g}" + (f" [{row['intervals'][f'task {k}'][0]:.3f}, "
                                              f"{row['intervals'][f'task {k}'][1]:.3f}]"
                                              if row["intervals"].get(f"task {k}") else "")
                            for k, v in row["figures"].items())
        verdict = "pass" if row["passed"] else "FAIL" if row["passed"] is False else "not judged"
        reporting.note(f"int8 calibration {row['method']}: {verdict}; {figures}"
                       + ("  <- chosen" if row is best and len(rows) > 1 else ""), level=1)
    if skipped:
        why = "passed" if best["passed"] else "could not be judged"
        reporting.note(f"int8 calibration {', '.join(skipped)}: not measured ({best['method']} {why}; "
                       "--calib-method auto measures every method)", level=1)
    reporting.note(f"int8 calibration chosen by measurement: {best['method']} (judged on {judge[1]})")
    return best["method"], graphs[best["method"]], {"chosen": best["method"], "judged_on": judge[1], "rows": rows,
                                                    "not_measured": skipped}


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
