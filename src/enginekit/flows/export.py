"""The export flow: PyTorch -> simplified ONNX (and FP16), parity-checked, then copied out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit import reporting
from enginekit.requests import ExportRequest


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

    from enginekit.calibration import CalibrationData
    from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs
    from enginekit.images import load_images
    from enginekit.fsutil import check_output_path
    from enginekit.pipeline import Stages, copy_out
    from enginekit.shapes import parse_shape

    r = request
    model = r.model_request
    adapter = model.adapter
    shape = parse_shape(r.input, what="--input") if r.input else adapter.default_input
    adapter.constraint.check(shape, what="--input")
    images = Path(r.images) if r.images else None
    photos = load_images(images, limit=4)
    suffix = (".nms" if r.nms else "") + (".fp16.onnx" if r.fp16 else ".onnx")
    stem = model.checkpoint.stem if model.checkpoint is not None else adapter.output_stem  # best.pt -> best.onnx
    dest = Path(r.output) if r.output else Path.cwd() / f"{stem}{suffix}"
    check_output_path(dest, "--output")  # before any work: a run that cannot write its result does none

    pipe = Stages(model, cache, force=r.force)
    chain = pipe.onnx_chain(shape, opset=r.opset, fp16=r.fp16, simplifier=r.simplifier,
                            reference_data=CalibrationData(images, count=2))
    simplified, final = chain[1], chain[-1]

    refs = ReferenceCache(adapter, pipe.loaded)
    cases = parity_inputs(adapter, shape, photos, seed=r.seed)
    results = []
    checks = [(simplified, "fp32")] + ([(final, "fp16")] if r.fp16 else [])
    for artifact, precision in checks:
        with reporting.stage(f"parity {precision}") as s:
            tol = adapter.tolerance(precision)
            if r.rel_l2 is not None and artifact is final:
                tol = replace(tol, rel_l2=r.rel_l2)
            result = check_onnx(refs, artifact.path, cases, precision, tol)
            result.artifact = f"{adapter.variant}.{artifact.stage}"
            s.status = result.status
        results.append(result)

    share = None
    if r.fp16:
        share = final.entry.manifest.get("initializer_dtype_share", {}).get("FLOAT16", 0.0)
    outcome = ExportResult(adapter.variant, None, chain, results, share)
    if outcome.passed:
        outcome.output = copy_out(final, dest)
    return outcome
