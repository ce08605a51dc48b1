"""Checking one artifact of a verify run: a cached engine and the graphs it came from, an engine file, an ONNX
file, a corrupt entry; the stored verdicts they reuse, the labels flow they add. ``flows.verify`` finds what to
check and runs these."""

from __future__ import annotations

import re

from dataclasses import dataclass
from pathlib import Path

from enginekit import reporting
from enginekit.errors import UsageError
from enginekit.verification.references import engine_accepts_hw, onnx_accepts_hw
from enginekit._version import __version__
from enginekit.backends import Artifact, ENGINE, ONNX, verifier
from enginekit.calibration import CalibrationData
from enginekit.families.registry import graph_metadata, model_in_file, recorded_declaration
from enginekit.hashing import sha256_file
from enginekit.model import ModelRequest
from enginekit.onnx.graph import get_metadata, input_dims, load_model, output_names
from enginekit.pipeline import Stages, model_versions, onnxruntime_version
from enginekit.precisions import PRECISIONS, QAT_METHOD, of_stage
from enginekit.verification.gate import ArtifactReport, Check, Gates, VerifyReport, check_candidate, skipped, unrunnable
from enginekit.verification.labels import GroundTruth
from enginekit.verification.pictures import draw_pictures
from enginekit.verification.record import record_of, set_aside
from enginekit.verification.references import get_references

#: part of every stored verdict's key: bump when a comparison's figures or gates change meaning
VERDICT_VERSION = 3  # 3: share gates and mAP decided on their 95% intervals

@dataclass
class CorruptEntry:
    """An engine entry found corrupt (and removed): verified as a failure that names it."""

    kind: str
    key: str
    subject: str | None
    reason: str

    def describe(self) -> str:
        return f"cache entry {self.kind}/{self.key[:12]} is corrupt ({self.reason}); it was removed"


@dataclass
class UnverifiableEntry:
    """An engine built from an ONNX file, with no PyTorch model recorded to compare it against: listed
    with why, and a failure of ``verify`` (every engine) unless the request allows it."""

    kind: str
    key: str
    subject: str | None
    allowed: bool = False

    @property
    def reason(self) -> str:
        return "built from an ONNX file with no PyTorch model recorded to compare against"

    def describe(self) -> str:
        how = ("allowed by --allow-unverifiable" if self.allowed else
               "verify it by model name (enginekit verify MODEL --weights ... with its build's flags), "
               "or pass --allow-unverifiable")
        return f"engine {self.key[:12]} cannot be checked: {self.reason}; {how}"


def corrupt_artifact(name: str, kind: str, precision: str, what: str):
    """A corrupt cache entry where an artifact should be: nothing ran, and its gate fails."""
    report = ArtifactReport(name, kind, precision, ran=False, reason=what)
    report.checks.append(Check.unmet(name, f"{what}: rebuild it (enginekit build)", key="entry is not corrupt"))
    return report


def verify_corrupt(entry):
    """The report of an engine that cannot be checked: a corrupt entry, or one with no model to compare
    against (``UnverifiableEntry``: listed as skipped, and not part of the verdict, where allowed)."""
    report = VerifyReport(entry.subject or "?", entry.key, "?", "", "not computed")
    if isinstance(entry, UnverifiableEntry) and entry.allowed:
        report.excused = True
        report.artifacts.append(skipped("engine", "engine", "?", entry.describe()))
    elif isinstance(entry, UnverifiableEntry):
        art = ArtifactReport("engine", "engine", "?", ran=False, reason=entry.describe())
        art.checks.append(Check.unmet("engine", entry.describe(), key="engine can be checked"))
        report.artifacts.append(art)
    else:
        report.artifacts.append(corrupt_artifact("engine", "engine", "?", entry.describe()))
    return report


def model_of(entry, given):
    """(ModelRequest, chain links) an engine entry is verified with: its own, or the request's."""
    m = entry.manifest
    if m.get("model_request"):
        if given is not None and given[0].weights_identity == m["model_request"].get("identity"):
            return given[0], m.get("chain", [])  # the same weights, where this machine has them
        return ModelRequest.from_json(m["model_request"]), m.get("chain", [])
    if given is None:
        raise UsageError(f"engine {entry.key[:12]} was built from an ONNX file with no PyTorch model to compare "
                         "against: verify it by model name (enginekit verify MODEL --weights ... and the build's "
                         "flags) or verify that file with --weights CHECKPOINT")
    request, artifacts = given
    recorded = (m.get("source_model") or {}).get("weights")
    if recorded and not request.matches(recorded):
        raise UsageError(f"engine {entry.key[:12]} was built from a graph of weights {recorded[:23]}, not "
                         f"{request.weights_identity[:23]}")
    return request, [a.to_json() for a in artifacts]


def stored_check(cache, name: str, precision: str, graph: str, path: Path, refs, gates, pipe, metadata: dict, *,
                 recheck: bool = False):
    """(the graph's ArtifactReport, the stored verdict's key or None) for ``graph`` (its content) against ``refs``:
    a verdict is kept by what it judged (the graph, the references' key, every limit, the code that ran and
    compared), so a second verify of the same content runs nothing (``recheck``: it does)."""
    parts = {"stage": "verdict", "version": VERDICT_VERSION, "name": name, "precision": precision, "graph": graph,
             "references": refs.key, "gates": gates.state(precision, metadata),
             "versions": {"enginekit": __version__, "onnxruntime": onnxruntime_version()}}

    def produce(tmp: Path) -> dict:
        with onnx_candidate(path) as runner:
            art = check_candidate(name, "onnx", precision, runner.infer_feed, refs, gates, pipe.adapter, metadata,
                                  accepts_hw=onnx_accepts_hw(path))
        return {"report": art.state()}

    entry, status = cache.get_or_create("verdict", parts, produce, force=recheck, subject=pipe.subject)
    return ArtifactReport.from_state(entry.manifest["report"]), (entry.key if status == "hit" else None), entry.key


def set_aside_checks(cache, links, subject: str) -> None:
    """``verify --recheck``: every earlier check of the chain's graphs removed from their record, and said."""
    for link in links:
        graph = link.get("sha256")
        if not graph:
            continue
        gone = set_aside(cache, graph)
        if gone:
            said = "; ".join(("FAIL " if c.passed is False else "PASS " if c.passed else "") + c.line()
                             for c in gone[:4])
            reporting.note(f"--recheck: {len(gone)} earlier check(s) of {subject}'s {link.get('stage')} graph set "
                           f"aside, judging it from scratch ({said}{' ...' if len(gone) > 4 else ''})")


def earlier_failures(report, cache, links, made: set[str]) -> None:
    """An artifact's verdict is every check it has had: a check of the chain's graphs that failed before this run
    (build's parity on its images, verify's on others, labels) fails this report too, named, whatever this run
    found. The engine stands on its source graph, the chain's last."""
    by_stage = {f"onnx-{link['stage']}": link.get("sha256") for link in links if link.get("sha256")}
    last = links[-1].get("sha256") if links else None
    for art in report.artifacts:
        graph = by_stage.get(art.name) if art.kind == "onnx" else (last if art.kind == "engine" else None)
        if not graph:
            continue
        record = record_of(cache, graph)
        earlier = [c for c in record.failed if c.key not in made]
        if earlier:
            more = f" (and {len(earlier) - 1} more)" if len(earlier) > 1 else ""
            art.checks.append(Check.unmet(art.name, f"an earlier check of this graph failed: {earlier[0].line()}{more}",
                                          key="no earlier check of this graph failed"))


def verify_entry(entry, data, overrides, cache, report_dir, given=None, *, task_required: bool = True, labels=None,
                 recheck: bool = False):
    m = entry.manifest
    model, links = model_of(entry, given)
    pipe = Stages(model, cache)
    precision = m["precision"]["mode"]
    refs = get_references(pipe, m["profiles"], data)
    gates = Gates(pipe.adapter, overrides, task_required=task_required, labelled=labels is not None)
    report = VerifyReport(pipe.subject, entry.key, precision, refs.key, refs.status, skipped_images=refs.skipped_images)
    metadata: dict[str, str] = {}
    calibrated_on = None  # what a quantized graph of the chain was calibrated on
    if recheck:  # from scratch: the earlier checks of these graphs are set aside, and that is said
        set_aside_checks(cache, links, pipe.subject)
    made: set[str] = set()  # the stored verdicts this run made or read (its own checks, not earlier ones)
    for link in links:
        name = f"onnx-{link['stage']}"
        found = cache.lookup(link["kind"], link["key"]) if "kind" in link else None
        # every graph of a quantization-aware checkpoint's chain is its INT8 (the trained Q/DQ ranges)
        qat = m["precision"].get("method") == QAT_METHOD
        stage_precision = precision if qat else of_stage(link["stage"]) or precision
        if found is not None and found.status == "corrupt":
            what = CorruptEntry(link["kind"], link["key"], None, found.reason or "corrupt").describe()
            report.artifacts.append(corrupt_artifact(name, "onnx", stage_precision, what))
            continue
        if found is None or found.entry is None:
            gone = "not in the cache any more (removed by gc?)"
            report.artifacts.append(skipped(name, "onnx", stage_precision, gone))
            continue
        path = found.entry.file("model.onnx")
        calibrated_on = found.entry.manifest.get("calibration_data", calibrated_on)
        if not metadata:
            metadata = onnx_metadata(path)
        with reporting.stage(f"verify {name}") as s:
            try:
                art, stored, key = stored_check(cache, name, stage_precision, link.get("sha256") or link["key"], path,
                                                refs, gates, pipe, metadata, recheck=recheck)
                made.add(key)
                if stored:
                    s.detail = f"stored verdict {stored[:12]}"
            except Exception as exc:  # noqa: BLE001 - ORT refuses FP8 Q/DQ graphs: say so, and fail
                first = (str(exc).splitlines() or [""])[0][:160]
                if type(exc).__module__.startswith("onnxruntime"):
                    why = f"ONNX Runtime cannot run it ({first})"
                else:  # a fault of the comparison itself is named, never passed off as ORT's refusal
                    why = f"checking it raised {type(exc).__name__}: {first}"
                art = unrunnable(name, "onnx", stage_precision, why)
            s.status = art.status
        art.key = link.get("key", "")
        report.artifacts.append(art)
    checked = [a.name for a in report.artifacts if a.kind == "onnx" and a.ran]
    if entry.key is None:  # graphs with no engine built from them: judged, and an engine is build's to make
        report.artifacts.append(skipped("engine", "engine", precision, "no engine built from these graphs (verify "
                                        "builds none: enginekit build makes it from a graph that passes)"))
    else:
        report.artifacts.append(verify_engine(entry, pipe, refs, gates, metadata, precision, checked))
        report.artifacts[-1].key = entry.key
    if labels is not None:
        ground_truth_of_entry(report, entry, pipe, links, cache, gates, metadata, labels, made)
    earlier_failures(report, cache, links, made)
    note_calibration(report, calibrated_on)
    repaired = m.get("repair")
    if repaired and repaired.get("nodes"):  # the repair's figures, where the report shows the engine
        report.artifacts[-1].notes.append(
            f"repair: {len(repaired['nodes'])} of {repaired.get('candidates', '?')} quantizable node(s) kept in high "
            f"precision ({100 * repaired.get('share', 0):.1f}%), worst rel L2 {repaired.get('rel_l2_before', 0):.3g} -> "
            f"{repaired.get('rel_l2_after', 0):.3g}, {repaired.get('trials')} trials: {', '.join(repaired['nodes'][:8])}")
    if report_dir is not None:
        draw_pictures(report, refs, entry, cache, pipe.adapter, metadata, Path(report_dir))
    return report


def ground_truth_of_entry(report, entry, pipe, links, cache, gates, metadata, labels, made=None) -> None:
    """``verify --data``: the FP32 PyTorch model, every ONNX artifact that ran and the engine where it runs,
    scored against the labels; each candidate's drop against the reference gated (``gt.*_drop``)."""
    photo_shape = tuple(entry.manifest["profiles"][0][pipe.adapter.input_name]["opt"])
    hw = _network_hw(pipe.adapter, metadata, photo_shape)
    gt = GroundTruth(pipe, labels, metadata, hw)
    report.ground_truth = {**gt.describe(), "notes": gt.notes}
    versions = {**model_versions(pipe.adapter), "onnxruntime": onnxruntime_version()}
    paths = {f"onnx-{link['stage']}": (link, cache.lookup(link["kind"], link["key"]).entry)
             for link in links if "kind" in link}
    for art in report.artifacts:
        if not art.ran:
            continue
        if art.kind == "onnx" and art.name in paths and paths[art.name][1] is not None:
            link, found = paths[art.name]
            path = found.file("model.onnx")
            accepts = onnx_accepts_hw(path)
            with onnx_candidate(path) as runner:
                result = gt.score(art.name, f"onnx:{link['sha256']}", runner.infer_feed, accepts, versions)
        elif art.kind == "engine":
            accepts = engine_accepts_hw(entry.manifest, pipe.adapter.input_name)
            engine = Artifact.engine(entry.file("engine.plan"), entry.manifest, pipe.adapter.input_name)
            with verifier(ENGINE)(engine, io="host") as runner:
                result = gt.score("engine", f"engine:{entry.key}", runner.infer_feed, accepts,
                                  {**versions, **(entry.manifest.get("versions") or {})})
        else:
            continue
        art.size_bytes = (path.stat().st_size if art.kind == "onnx" else entry.file("engine.plan").stat().st_size)
        gt.judge(art, gt.reference(accepts), result, gates, art.precision)
        art.ground_truth["identity"] = f"onnx:{link['sha256']}" if art.kind == "onnx" else f"engine:{entry.key}"
        if art.kind == "onnx":
            key = labels_verdict(cache, art, link["sha256"], gt, pipe.subject)
            if made is not None:
                made.add(key)


def labels_verdict(cache, art, graph: str, gt, subject: str) -> None:
    """The verdict on a graph judged against labels, stored by the graph's content beside its parity verdicts: a
    graph that fails the labels' gate is known as failed wherever it lies (``deploy``, ``cache ls``),
    as one that fails parity is. Kept by the labels it was judged on: the latest judgement on them replaces the last
    (a verify with other limits judges again)."""
    parts = {"stage": "verdict", "version": VERDICT_VERSION, "name": art.name, "precision": art.precision,
             "graph": graph, "labels": gt.digest, "network_hw": list(gt.hw), "at": "verify --data"}

    def produce(tmp: Path) -> dict:
        return {"report": art.state()}

    entry, _ = cache.get_or_create("verdict", parts, produce, force=True, subject=subject)
    return entry.key


def _network_hw(adapter, metadata: dict, opt_shape) -> tuple[int, int]:
    """The size frames are letterboxed to, as the runtime takes it: a graph's export size where it takes any
    H x W (YOLO), else the profile's (the reference photographs' size)."""
    exported = metadata.get("export_shape")
    if exported and getattr(adapter, "export_at_profile_size", False):
        return tuple(int(v) for v in exported.split("x")[2:4])
    return tuple(int(v) for v in opt_shape[2:4])


def note_calibration(report, calibrated_on: str | None) -> None:
    """A quantized graph calibrated on the embedded photographs that fails: say what it was calibrated on
    and what to do. Calibration ranges come from what calibration sees; photographs of street scenes
    are not the activations of a model trained on other images (measured in families/ultralytics/yolo.py)."""
    if not calibrated_on or not calibrated_on.startswith(CalibrationData(None).describe().split(" (")[0]):
        return
    for art in report.artifacts:
        if art.precision in PRECISIONS and PRECISIONS[art.precision].calibrated and art.ran and not art.passed:
            art.notes.append(f"calibrated on the {calibrated_on}, not on images of what the model sees: "
                             "calibrate on a folder of them (--calib-data DIR)")


def onnx_candidate(path: Path):
    """The runner verify checks an ONNX candidate on: the registry's verifier of ONNX graphs (ONNX Runtime
    on the CPU, whose results do not depend on the machine). Use as a context manager; ``infer_feed``."""
    return verifier(ONNX)(Artifact.onnx(path))


def verify_engine(entry, pipe, refs, gates, metadata, precision, checked=()):
    """The engine itself, where it can run here; else said skipped, and why."""
    m = entry.manifest
    backend = verifier(ENGINE)
    engine = Artifact.engine(entry.file("engine.plan"), m, pipe.adapter.input_name)
    reason = backend.why_not(engine)
    if reason is not None:
        if checked:
            instead = f"its source graph{'s' if len(checked) > 1 else ''} {', '.join(checked)} checked instead"
        else:
            instead = "and none of its source graphs could be checked either"
        return skipped("engine", "engine", precision, f"{reason}; {instead}")
    with backend(engine, io="host") as runner:
        with reporting.stage("verify engine") as s:
            art = check_candidate("engine", "engine", precision, runner.infer_feed, refs, gates, pipe.adapter, metadata,
                                  accepts_hw=engine_accepts_hw(m, pipe.adapter.input_name))
            s.status = art.status
    return art


def verify_onnx_file(path: Path, reference, model, data, overrides, cache, spec=None, *, task_required: bool = True,
                     precision: str | None = None, labels=None):
    """Any ONNX against its PyTorch model: an enginekit-written ONNX names its model and weights.

    A graph is checked at the precision its metadata records; ``precision`` (``--precision``) names
    it for a graph that records none, and is refused where it contradicts the recorded one."""
    onnx_model = load_model(path)  # missing, a folder, a FIFO or not ONNX: one line
    metadata = onnx_metadata(path)
    # enginekit writes "precision" into FP16 and quantized graphs; its FP32 exports record none
    recorded = metadata.get("precision") or ("fp32" if metadata.get("enginekit_version") else None)
    if precision is not None and recorded is not None and precision != recorded:
        raise UsageError(f"{path.name} is an {recorded} graph (its metadata says so), not {precision}: "
                         f"drop --precision, or give the {precision} graph")
    request = onnx_model_request(path, metadata, model, reference, spec)
    adapter = request.adapter
    dims = input_dims(onnx_model)
    outs = output_names(onnx_model)
    if list(dims) != [adapter.input_name] or list(outs) != list(adapter.output_names):
        raise UsageError(
            f"{path.name} (inputs {', '.join(dims)}; outputs {', '.join(outs)}) does not match {adapter.variant} "
            f"(input {adapter.input_name}; outputs {', '.join(adapter.output_names)})"
        )
    shape = [d if isinstance(d, int) and d > 0 else None for d in dims[adapter.input_name]]
    # the size a graph of dynamic H/W was exported at, where its family letterboxes frames to it (YOLO's export_shape;
    # others record the size they were traced at, which says nothing of the size they run at)
    recorded_shape = str(metadata.get("export_shape", "")) if getattr(adapter, "export_at_profile_size", False) else ""
    default = tuple(int(v) for v in recorded_shape.split("x")) if re.fullmatch(r"\d+(x\d+){3}", recorded_shape) \
        else adapter.default_input
    opt = tuple(s if s is not None else default[i] for i, s in enumerate(shape))
    opt = (1, *opt[1:])
    profile = {adapter.input_name: {"min": list(opt), "opt": list(opt), "max": list(opt)}}
    pipe = Stages(request, cache)
    refs = get_references(pipe, [profile], data)
    precision = recorded or precision or "fp32"
    report = VerifyReport(adapter.variant, None, precision, refs.key, refs.status, skipped_images=refs.skipped_images)
    try:
        gates = Gates(adapter, overrides, task_required=task_required, labelled=labels is not None)
        with onnx_candidate(path) as runner:
            art = check_candidate(path.name, "onnx", precision, runner.infer_feed, refs, gates, adapter, metadata,
                                  accepts_hw=onnx_accepts_hw(path))
    except (KeyError, ValueError) as exc:
        raise UsageError(f"{path.name} does not compute {adapter.variant}'s outputs: {exc}") from exc
    report.artifacts.append(art)
    if labels is not None and art.ran:
        gt = GroundTruth(pipe, labels, metadata, _network_hw(adapter, metadata, opt))
        report.ground_truth = {**gt.describe(), "notes": gt.notes}
        accepts = onnx_accepts_hw(path)
        identity = f"onnx:{sha256_file(path)}"
        with onnx_candidate(path) as runner:
            result = gt.score(path.name, identity, runner.infer_feed, accepts,
                              {**model_versions(adapter), "onnxruntime": onnxruntime_version()})
        art.size_bytes = path.stat().st_size
        gt.judge(art, gt.reference(accepts), result, gates, precision)
        art.ground_truth["identity"] = identity
        labels_verdict(cache, art, identity.split(":", 1)[1], gt, pipe.subject)
    return report


def onnx_model_request(path: Path, metadata: dict, model, reference, spec):
    """The model an ONNX file is compared against: --model/--weights/--random-init, else its metadata.

    Refused in one line when the given weights are not the ones its metadata records."""
    weights = Path(reference) if reference is not None else (spec.weights if spec is not None else None)
    name = model or metadata.get("model")
    if model is None and weights is not None and model_in_file(weights) is not None:
        name = str(weights)  # an Ultralytics checkpoint holds its model: the file is the reference, no name needed
    if not name:
        raise UsageError(f"{path.name} does not say which model it is: pass --model NAME (yolo12n, depth, ...)")
    random_init = bool(spec is not None and spec.random_init)
    seed = spec.seed if spec is not None else 0

    recorded = metadata.get("weights", "")
    nms = metadata.get("nms") == "True"  # a graph ending in NMS is compared with the same model in the same NMS
    # the declaration the graph records (a user's --task, --outputs...), then the request's own on top
    declared = {**recorded_declaration(metadata), **(spec.declared if spec is not None else {})}
    if weights is None and not random_init:  # reproducible: the same seeded architecture, or the hub's weights
        request = ModelRequest.recorded(name, recorded, nms=nms, declared=declared)
        if request is None:
            known = f" (it was exported from weights {recorded[:23]})" if recorded else ""
            raise UsageError(f"verify of {path.name} needs its PyTorch weights: pass --weights CHECKPOINT or "
                             f"--random-init{known}")
    else:
        request = ModelRequest(name, weights, random_init, seed, nms=nms, declared=declared)
    if recorded and model in (None, metadata.get("model")):
        if not request.matches(recorded):
            given = f"--weights {weights.name}" if weights is not None else (
                f"--random-init --seed {seed}" if random_init else "hub weights")
            raise UsageError(f"{given} ({request.weights_identity[:23]}) is not what {path.name} was exported from "
                             f"({recorded[:23]})")
    return request


def onnx_metadata(path: Path) -> dict[str, str]:
    import onnx

    try:
        return graph_metadata(get_metadata(onnx.load(str(path), load_external_data=False)))
    except UsageError as exc:
        raise UsageError(f"{path.name}: {exc}") from exc
