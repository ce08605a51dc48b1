"""Per-output error statistics of a candidate against a reference."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class OutputStats:
    name: str
    max_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    median_rel: float
    p99_rel: float
    rel_l2: float
    cosine: float
    psnr: float
    finite: bool

    def to_json(self) -> dict:
        return {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in asdict(self).items()}


def output_stats(name: str, reference: np.ndarray, candidate: np.ndarray) -> OutputStats:
    ref = np.asarray(reference, dtype=np.float64).ravel()
    got = np.asarray(candidate, dtype=np.float64).ravel()
    if ref.shape != got.shape:
        raise ValueError(f"output {name}: shapes differ ({reference.shape} vs {candidate.shape})")
    finite = bool(np.isfinite(got).all())
    diff = np.abs(got - ref)
    # relative error per element, floored so near-zero references do not explode it
    scale = max(float(np.abs(ref).max()), 1e-12)
    rel = diff / np.maximum(np.abs(ref), 1e-3 * scale)
    ref_norm = float(np.linalg.norm(ref))
    got_norm = float(np.linalg.norm(got))
    cos = float(ref @ got / (ref_norm * got_norm)) if ref_norm > 0 and got_norm > 0 else float(ref_norm == got_norm)
    mse = float(np.mean(diff**2))
    peak = float(np.abs(ref).max())
    psnr = float("inf") if mse == 0 else 10 * np.log10(max(peak, 1e-12) ** 2 / mse)
    if not finite:
        return OutputStats(name, float("inf"), float("inf"), float("inf"), float("inf"), float("inf"),
                           float("inf"), float("inf"), 0.0, 0.0, False)
    return OutputStats(
        name=name,
        max_abs=float(diff.max()),
        median_abs=float(np.median(diff)),
        p99_abs=float(np.percentile(diff, 99)),
        max_rel=float(rel.max()),
        median_rel=float(np.median(rel)),
        p99_rel=float(np.percentile(rel, 99)),
        rel_l2=float(np.linalg.norm(got - ref) / max(ref_norm, 1e-12)),
        cosine=cos,
        psnr=float(psnr),
        finite=True,
    )
