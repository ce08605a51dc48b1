"""The verify flow: engines and every ONNX artifact they came from, against the PyTorch reference.

Which engines (all cached, a key, a model name built or found, or an ONNX file with its
checkpoint) -> stored references -> each ONNX artifact on ONNX Runtime and the engine where it
can run -> gates -> pictures and reports (JSON, markdown, JUnit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit import precisions, reporting
from enginekit.errors import UsageError
from enginekit.requests import CALIBRATION_OPTIONS, VerifyRequest
from enginekit.verification.checks import (CorruptEntry, UnverifiableEntry, verify_corrupt, verify_entry,
                                           verify_onnx_file)
from enginekit.verification.references import engine_accepts_hw
from enginekit.backends import Artifact, ENGINE, verifier
from enginekit.cache import Cache
from enginekit.calibration import CalibrationData
from enginekit.errors import CapabilityError
from enginekit.flows.graphs import graph_chain
from enginekit.flows.store import publish_verdicts
from enginekit.latencies import latency_of
from enginekit.model import ModelRequest
from enginekit.pipeline import Stages
from enginekit.runtime.loader import ultralytics_engine_target
from enginekit.verification.gate import Gates, VerifyReport, check_candidate
from enginekit.verification.labels import LabelRequest
from enginekit.verification.ladder import precision_ladder
from enginekit.verification.references import get_references
from enginekit.verification.report import write_json, write_junit, write_markdown


@dataclass
class VerifyOutcome:
    reports: list  # compare.gate.VerifyReport
    files: dict[str, Path] = field(default_factory=dict)
    events: list = field(default_factory=list)  # reporting.Event, what the run reported
    #: with --data: one row per precision and artifact against the labels (``verification.ladder``)
    ladder: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every engine checked passed, and at least one was; engines the user allowed to go unchecked
        (``--allow-unverifiable``) are listed and count for nothing either way: where they are all there is, the
        run passes, saying it checked none (``checked``)."""
        checked = [r for r in self.reports if not getattr(r, "excused", False)]
        if not checked:
            return bool(self.reports)
        return all(r.passed for r in checked)

    @property
    def checked(self) -> int:
        """Engines that were checked (not those the user allowed to go unchecked)."""
        return sum(1 for r in self.reports if not getattr(r, "excused", False))

    @property
    def engine_ran(self) -> bool:
        return all(r.engine_ran for r in self.reports)


#: photographs the parity and task gates run on: embedded or ``--images`` ones, or (with ``--data`` and no
#: ``--images``) the labelled split's, spread evenly: enough of a user's images for the task gates' share rules
IMAGE_COUNT = 4
FP32_IMAGE_COUNT = 4
LABELLED_IMAGE_COUNT = 16


def run_verify(request: VerifyRequest, cache=None) -> VerifyOutcome:
    r = request
    cache = cache or Cache()
    overrides = r.tolerances
    if r.images is None and r.data is not None:  # the gates judge on the user's own labelled images
        data = CalibrationData(Path(r.data), count=r.image_count or LABELLED_IMAGE_COUNT, split=r.data_split or "val",
                               labelled=True)
    else:
        reduced = any(precisions.get(b.precision).reduced for b in r.build_requests) if r.kind == "model" else True
        data = CalibrationData(Path(r.images) if r.images else None,
                               count=r.image_count or (IMAGE_COUNT if reduced else FP32_IMAGE_COUNT))
    data.image_paths  # noqa: B018 - refuse a missing or empty folder before any work

    labels = None
    if r.data is not None:
        labels = LabelRequest(Path(r.data), r.data_split or "val", r.data_limit)
        labels.check()  # a dataset without images in that split is refused before any work
    if r.kind == "onnx":
        reports = [verify_onnx_file(Path(r.target), r.reference, r.model, data, overrides, cache, spec=r.build,
                                    precision=r.precision,
                                    task_required=r.task_required, labels=labels)]
    elif r.kind == "engine":
        reports = [verify_engine_file(Path(r.target), r.reference, data, overrides, cache, spec=r.build,
                                      task_required=r.task_required)]
    else:
        found = entries_to_verify(r, cache)
        reports = [verify_corrupt(e) if isinstance(e, (CorruptEntry, UnverifiableEntry)) else
                   verify_entry(e, data, overrides, cache, r.report_dir, given=given, task_required=r.task_required,
                                labels=labels, recheck=r.recheck)
                   for e, given in found]

        publish_verdicts(cache, found, reports)
    outcome = VerifyOutcome(reports)
    if labels is not None:
        outcome.ladder = precision_ladder(reports, lambda identity: latency_of(identity, cache))
    write_reports(outcome, r.report_dir, r.junit)
    if r.require_engine and not outcome.engine_ran:
        reasons = {a.reason for rep in reports for a in rep.artifacts if a.kind == "engine" and not a.ran}
        raise CapabilityError("--require-engine: the engine could not run here: " + "; ".join(sorted(reasons)))
    return outcome


def entries_to_verify(request: VerifyRequest, cache) -> list[tuple]:
    """The engine entries a request names, each with the model to compare against when the request
    brings one: every cached engine, a key, or a model name's build (found by its recipe)."""
    if request.kind == "all":
        rows = [i for i in cache.ls() if i.kind == "engine"]
        entries, corrupt = [], []
        for row in rows:
            found = cache.lookup(row.kind, row.key)  # a corrupt entry is removed here, and said so below
            if found.status == "corrupt":
                corrupt.append(CorruptEntry(row.kind, row.key, row.subject, found.reason or "corrupt"))
            elif found.entry is not None and found.entry.manifest.get("model_request"):
                entries.append(found.entry)
            elif found.entry is not None:  # built from an ONNX file: no PyTorch model recorded to compare against
                corrupt.append(UnverifiableEntry(row.kind, row.key, row.subject, request.allow_unverifiable))
        if not entries and not corrupt:
            raise UsageError("no engines in the cache to verify: build one first (enginekit build MODEL)")
        return [(e, None) for e in entries + corrupt]
    if request.kind == "key":
        return [(_resolve_engine(request.target, cache), None)]

    found = []
    for build in request.build_requests:  # one engine per precision asked for
        existing = built_before(build, cache)
        subject = build.model_request.subject
        if existing:  # what `build` made (the user's calibration, profiles, repair) is what is judged
            said = "; ".join(f"{e.key[:12]} ({describe_engine(e)})" for e in existing)
            reporting.note(f"verify {subject} {build.precision}: judging the {len(existing)} engine(s) the cache "
                           f"holds for it: {said}; building none")
            found += [(e, None) for e in existing]
            continue
        # verify judges every graph of the chain itself (its images, its gates, its report) and the engine where
        # `build` made one; it builds none (an engine comes from `build`, which refuses a graph that failed)
        g = graph_chain(build.replace(verify=False), cache, by_identity=False)
        qat = g.precision_key.get("method") == precisions.QAT_METHOD  # its trained ranges: nothing calibrates
        if precisions.get(build.precision).calibrated and not build.calib_data and not build.calib_cache and not qat:
            reporting.note(f"verify {subject} {build.precision}: calibrating its graph on the embedded photographs "
                           "(--calib-data DIR calibrates on images of what the model sees)")
        engine = g.engine()
        if engine is None:
            reporting.note(f"verify {subject} {build.precision}: no engine of it in the cache: judging its graphs, "
                           f"building none (enginekit build {build.target} makes one from a graph that passes)")
            engine = GraphsOnly(g, build)
        # The same engine may have been built from an exported ONNX file (same content, same key):
        # this request's model and chain of artifacts are what it is compared against.
        found.append((engine, (build.model_request, g.chain)))
    return found


@dataclass
class GraphsOnly:
    """A chain of graphs with no engine built from it (what ``verify`` judges where ``build`` made none): read
    where an engine entry would be, with no key and no plan."""

    chain: object  # flows.graphs.GraphChain
    build: object  # the BuildRequest

    key = None

    @property
    def subject(self) -> str:
        return self.chain.pipe.subject

    @property
    def manifest(self) -> dict:
        return {"precision": {"mode": self.build.precision, **(self.chain.precision_key or {})},
                "profiles": [p.to_json() for p in self.chain.bound],
                "model_request": self.build.model_request.to_json(),
                "chain": [a.to_json() for a in self.chain.chain]}


def built_before(build, cache) -> list:
    """The engines the cache holds for ``build``'s model (its weights' identity, NMS or not) at its precision, where
    the verify request says nothing of how to build one (no profile, no calibration flag, no repair, no --force):
    then what the user built is judged, not a new engine made with the defaults. [] otherwise."""
    default_count = type(build).model_fields["calib_count"].get_default(call_default_factory=True)
    if any(getattr(build, k) for k in ("profiles", "repair", "force", *CALIBRATION_OPTIONS)) or \
            build.calib_count != default_count:
        return []
    model = build.model_request
    return cache.engines_of(model.weights_identity, build.precision, nms=model.nms)


def describe_engine(entry) -> str:
    """One phrase of what an engine is: its precision, profiles, and for a calibrated one what it was calibrated on."""
    m = entry.manifest
    precision = m.get("precision") or {}
    shapes = ", ".join("x".join(map(str, rng.get("opt", []))) for p in m.get("profiles") or [] for rng in p.values()
                       if isinstance(rng, dict))
    parts = [f"{precision.get('mode', '?')} at {shapes or '?'}"]
    if precision.get("calibration"):
        parts.append(f"calibrated on {precision['calibration']}" + (f", {precision['method']}"
                                                                      if precision.get("method") else ""))
    repaired = precision.get("repaired_nodes")
    if repaired:  # a list of node names; a count where an older or edited manifest kept one
        parts.append(f"{len(repaired) if isinstance(repaired, (list, tuple)) else repaired} node(s) repaired")
    return "; ".join(parts)


def _resolve_engine(target: str, cache):
    """The engine entry a key prefix names; a corrupt one comes back as a CorruptEntry."""
    prefix = target.strip().lower()
    matches = [(i.kind, i.key) for i in cache.ls(verify=False) if i.key.startswith(prefix)]
    if len(matches) == 1:
        kind, key = matches[0]
        found = cache.lookup(kind, key)
        if found.status == "corrupt":
            return CorruptEntry(kind, key, None, found.reason or "corrupt")
    entry = cache.resolve(target)  # the one-line refusals: short, unknown, ambiguous
    if entry.kind != "engine":
        raise UsageError(f"cache entry {target} is a {entry.kind}, not an engine")
    return entry


def verify_engine_file(path: Path, reference, data, overrides, cache, spec=None, *, task_required: bool = True):
    """An engine file as Ultralytics writes it (its header names the model, its size and batch) against its PyTorch
    checkpoint (``--weights``/``--reference``): the engine is the only candidate, so where it cannot run here the
    verdict is that (exit 3), not a pass."""
    if not path.is_file():
        raise UsageError(f"engine file not found: {path}")
    target = ultralytics_engine_target(path)
    if target is None:
        raise UsageError(f"{path.name} is a bare plan: verify enginekit's engines by cache key or model name (their "
                         "manifest says what they are), an Ultralytics engine file by its header")
    weights = Path(reference) if reference is not None else (spec.weights if spec is not None else None)
    if weights is None:
        raise UsageError(f"verify of {path.name} needs its PyTorch weights: pass --weights CHECKPOINT")
    request = ModelRequest(target.model, weights)
    adapter = request.adapter
    precision = target.precision or "fp32"
    engine = Artifact.engine(path, target.manifest, adapter.input_name)
    backend = verifier(ENGINE)
    reason = backend.why_not(engine)
    if reason is not None:
        raise CapabilityError(f"{path.name} ({target.model}, read from its header) cannot run here: {reason}")
    pipe = Stages(request, cache)
    refs = get_references(pipe, target.manifest["profiles"], data)
    report = VerifyReport(adapter.variant, None, precision, refs.key, refs.status, skipped_images=refs.skipped_images)
    gates = Gates(adapter, overrides, task_required=task_required)
    with backend(engine, io="host") as runner:
        report.artifacts.append(check_candidate(path.name, "engine", precision, runner.infer_feed, refs, gates, adapter,
                                                target.metadata, accepts_hw=engine_accepts_hw(target.manifest,
                                                                                              adapter.input_name)))
    return report


def write_reports(outcome: VerifyOutcome, report_dir: Path | None, junit: Path | None) -> None:
    if report_dir is not None:
        folder = Path(report_dir)
        outcome.files["json"] = write_json(outcome.reports, folder / "report.json", outcome.ladder)
        outcome.files["markdown"] = write_markdown(outcome.reports, folder / "summary.md", outcome.ladder)
        outcome.files["junit"] = write_junit(outcome.reports, Path(junit) if junit else folder / "junit.xml")
    elif junit is not None:
        outcome.files["junit"] = write_junit(outcome.reports, Path(junit))
