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
    chain = pipe.onnx_chain(shape, opset=opset, fp16=fp16, simplifier=simplifier, images=photos)
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
