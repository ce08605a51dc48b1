"""bench plot: latency and throughput against batch size (matplotlib, imported on use)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from enginekit.errors import CapabilityError
from enginekit.fsutil import atomic_path


def plot(report, path: Path) -> Path:
    """Latency (p50, bars to p99) and throughput against batch size, one line per backend."""
    try:
        import matplotlib
    except ImportError as cause:
        raise CapabilityError("--plot needs matplotlib: pip install matplotlib") from cause
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (lat_ax, tput_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for backend in dict.fromkeys(r.backend for r in report.measured):
        rows = sorted((r for r in report.measured if r.backend == backend), key=lambda r: r.batch)
        batches = [r.batch for r in rows]
        p50 = np.array([r.latency_ms["p50"] for r in rows])
        p99 = np.array([r.latency_ms["p99"] for r in rows])
        lat_ax.errorbar(batches, p50, yerr=[np.zeros_like(p50), p99 - p50], marker="o", capsize=3, label=backend)
        tput_ax.plot(batches, [r.throughput_ips for r in rows], marker="o", label=backend)
    plan = report.plan
    shape = "x".join(map(str, plan.image_shape))
    lat_ax.set(xlabel="batch", ylabel="latency ms (p50, bar to p99)", title=f"{plan.adapter.variant} {shape}")
    tput_ax.set(xlabel="batch", ylabel="images / s", title="throughput")
    for ax in (lat_ax, tput_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(plan.settings.batches, [str(b) for b in plan.settings.batches])
        ax.grid(True, alpha=0.3)
    lat_ax.set_yscale("log")  # backends differ by orders of magnitude
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    lat_ax.yaxis.set_major_formatter(plain)
    lat_ax.yaxis.set_minor_formatter(plain)
    lat_ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
