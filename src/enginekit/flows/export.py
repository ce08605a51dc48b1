"""The export flow: PyTorch -> simplified ONNX (and FP16), parity-checked, then copied out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit import reporting
from enginekit.requests import ExportRequest
from enginekit._version import __version__
from enginekit.calibration import CalibrationData
from enginekit.compare.comparison import Gates
from enginekit.compare.parity import ParityResult, ReferenceCache, check_onnx, parity_inputs
from enginekit.errors import UsageError
from enginekit.fsutil import check_output_path
from enginekit.hashing import sha256_file
from enginekit.images import images_of, load_images
from enginekit.onnx.graph import get_metadata, load_model
from enginekit.pipeline import Stages, copy_out, model_versions, onnxruntime_version
from enginekit.precisions import is_qat
from enginekit.shapes import format_shape, parse_shape


@dataclass
class ExportResult:
    model: str
    output: Path | None
    artifacts: list  # pipeline.Artifact, in pipeline order
    parity: list  # compare.parity.ParityResult, one per checked graph
    fp16_share: float | None = None
    extra: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # reporting.Event, what the run reported

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


def run_export(request: ExportRequest, cache=None) -> ExportResult:
    """Export, simplify (and FP16), check parity; nothing is written to ``output`` when a gate fails."""
    from dataclasses import replace

    r = request
    model = r.model_request
    adapter = model.adapter
    shape = parse_shape(r.input, what="--input") if r.input else adapter.default_input
    adapter.constraint.check(shape, what="--input", shown=f"--imgsz {r.imgsz_given}" if r.imgsz_given else None)
    images = Path(r.images) if r.images else None
    photos = EXPORT_PHOTOS if r.fp16 else FP32_PHOTOS  # a reduced precision's share gates need the evidence
    photo_paths = images_of(images, limit=photos)  # which photographs: decoded only where a verdict is made
    suffix = (".nms" if r.nms else "") + (".fp16.onnx" if r.fp16 else ".onnx")
    stem = model.checkpoint.stem if model.checkpoint is not None else adapter.output_stem  # best.pt -> best.onnx
    dest = Path(r.output) if r.output else Path.cwd() / f"{stem}{suffix}"
    check_output_path(dest, "--output")  # before any work: a run that cannot write its result does none

    pipe = Stages(model, cache, force=r.force)
    chain = pipe.onnx_chain(shape, opset=r.opset, fp16=r.fp16, simplifier=r.simplifier,
                            reference_data=CalibrationData(images, count=2))
    simplified, final = chain[1], chain[-1]
    qat = is_qat(get_metadata(load_model(simplified.path)))
    if qat and r.fp16:
        raise UsageError(f"{model.checkpoint.name if model.checkpoint else adapter.variant} was trained "
                         "quantization-aware (Ultralytics quantize=8): its graph is INT8 with the trained ranges, not "
                         "FP16 (export it without --fp16)")
    if qat:
        reporting.note(f"{adapter.variant}: trained quantization-aware (QAT): its graph is INT8, the trained ranges as "
                       "Q/DQ; judged against its quantized PyTorch forward with the INT8 gates")

    refs = ReferenceCache(adapter, lambda: pipe.loaded)  # the model loads only if a verdict is made
    made: dict = {}

    def cases():
        if "cases" not in made:
            made["cases"] = parity_inputs(adapter, shape, load_images(images, limit=photos), photos=photos, seed=r.seed)
        return made["cases"]

    results = []
    checks = [(simplified, "int8" if qat else "fp32")] + ([(final, "fp16")] if r.fp16 else [])
    for artifact, precision in checks:
        tol = adapter.tolerance(precision)
        if r.rel_l2 is not None and artifact is final:
            tol = replace(tol, rel_l2=r.rel_l2)
        parts = verdict_parts(pipe, artifact, precision, tol, shape, photo_paths, r.seed)

        def produce(tmp, artifact=artifact, precision=precision, tol=tol) -> dict:
            result = check_onnx(refs, artifact.path, cases(), precision, tol)
            result.artifact = f"{adapter.variant}.{artifact.stage}"
            return {"result": result.state(), "passed": result.passed}

        with reporting.stage(f"parity {precision}") as s:
            entry, status = pipe.cache.get_or_create("parity", parts, produce, force=r.force or r.recheck,
                                                     subject=pipe.subject)
            result = ParityResult.from_state(entry.manifest["result"])
            s.status = result.status
            if status == "hit":
                s.detail = f"stored verdict {entry.key[:12]} (--recheck checks again)"
        results.append(result)

    share = None
    if r.fp16:
        share = final.entry.manifest.get("initializer_dtype_share", {}).get("FLOAT16", 0.0)
    outcome = ExportResult(adapter.variant, None, chain, results, share)
    if outcome.passed:
        outcome.output = copy_out(final, dest)
    return outcome


#: part of every stored parity verdict's key: bump when the comparison's figures or gates change meaning
VERDICT_VERSION = 2
#: photographs export's verdict runs on (each at the square and at its own rectangle); the share gates' evidence
#: minimum says where they give too few detections
EXPORT_PHOTOS = 2
FP32_PHOTOS = 2


def verdict_parts(pipe, artifact, precision: str, tolerance, shape, photos: list[Path], seed: int) -> dict:
    """What a parity verdict judged, as its key: the graph's content, the model it is compared with (its weights'
    identity, NMS, declaration), the inputs (the photographs' content, the shape, the seed), the limits, and the
    code that computes and compares (enginekit, ONNX Runtime, the model's framework). Never a path or a time."""
    adapter = pipe.adapter
    gates = Gates(adapter)
    parts = {"stage": "parity", "version": VERDICT_VERSION, "graph": artifact.sha256, "precision": precision,
             "model": adapter.variant, "weights": pipe.request.weights_identity,
             "inputs": {"photos": [sha256_file(p) for p in photos], "shape": format_shape(shape), "seed": seed},
             "tolerance": tolerance.to_json(),
             "limits": {p.name: gates.parity(precision, p.name).to_json() for p in adapter.output_parts({})},
             "task_gates": {k: list(v) for k, v in gates.task(precision).items()},
             "versions": {"enginekit": __version__, "onnxruntime": onnxruntime_version(), **model_versions(adapter)}}
    if adapter.nms is not None:
        parts["nms"] = adapter.nms.to_json()
    identity = adapter.identity()
    if identity:
        parts["identity"] = identity
    return parts
