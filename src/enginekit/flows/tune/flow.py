"""``enginekit tune``: the search over every model alone, then their pipelines, on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from enginekit import reporting
from enginekit.errors import UsageError
from enginekit.families import resolve
from enginekit.flows.tune.measure import Measurer
from enginekit.flows.tune.recipe import write_recipes
from enginekit.flows.tune.search import Budget, Candidate, Targets, _num, nearest, search_all
from enginekit.flows.tune.searchspace import space
from enginekit.gpu import gpu_info
from enginekit.images import DEFAULT_VIDEO_HW, write_video
from enginekit.runtime.sources import open_source


# -- the flow ----------------------------------------------------------------------------------------------
@dataclass
class TuneOutcome:
    targets: Targets
    candidates: list[Candidate]
    chosen: Optional[Candidate]
    source: str
    machine: dict
    recipes: list[Path] = field(default_factory=list)
    events: list = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.chosen is not None

    def best_line(self) -> str:
        """One line when nothing meets: the targets and the best figures reached."""
        best = nearest(self.candidates, self.targets)
        if best is None:
            why = "; ".join(sorted({f"{c.verdict}: {c.reason}" for c in self.candidates if c.reason}))[:300]
            return f"no candidate meets {self.targets.describe()}: none could be timed ({why or 'nothing to try'})"
        m = best.measured
        return (f"no candidate meets {self.targets.describe()}: the best reached p50 {_num(m.p50_ms)} ms, "
                f"p95 {_num(m.p95_ms)} ms, p99 {_num(m.p99_ms)} ms, {_num(m.fps)} frames/s ({best.label()})")

    def to_json(self) -> dict[str, Any]:
        return {"targets": {k: v for k, v in self.targets.__dict__.items() if v is not None},
                "source": self.source, "machine": self.machine,
                "candidates": [c.to_json() for c in self.candidates],
                "chosen": self.chosen.to_json() if self.chosen else None,
                "recipes": [str(p) for p in self.recipes]}


def run_tune(request, cache=None) -> TuneOutcome:
    import tempfile

    targets = Targets(request.p50, request.p95, request.p99, request.fps)
    per_model = [space(request, i) for i in range(len(request.models))]  # bad flags refused before any work
    _check_every(request)
    budget = Budget(request.budget_minutes)
    with tempfile.TemporaryDirectory(prefix="enginekit-tune-") as tmp:
        if request.source is not None:
            open_source(request.source, max_frames=1)  # a source that does not open: one line, now
            source, described = Path(request.source) if not request.source.isdigit() else request.source, request.source
        else:
            frames = (request.frames + 1) * request.frames_per_step
            with reporting.stage("video") as st:
                source = write_video(Path(tmp) / "tune.mp4", frames, DEFAULT_VIDEO_HW)
                st.detail = f"{DEFAULT_VIDEO_HW[1]}x{DEFAULT_VIDEO_HW[0]}, {frames} frames from the embedded photographs"
            described = f"a {DEFAULT_VIDEO_HW[1]}x{DEFAULT_VIDEO_HW[0]} MPEG-4 video made from the embedded photographs"
        measurer = Measurer(request, source, cache, images=_check_frames(request.source, Path(tmp) / "check"))
        count = sum(len(c) for c in per_model)
        reporting.note(f"{count} candidate(s) for {', '.join(request.models)}; targets {targets.describe()}"
                       + (f"; budget {request.budget_minutes:g} min" if request.budget_minutes else ""))

        def announce(c: Candidate) -> None:
            m = c.measured
            figures = f"p50 {_num(m.p50_ms)}, p95 {_num(m.p95_ms)}, p99 {_num(m.p99_ms)} ms, {_num(m.fps)} frames/s" \
                if m.timed else ""
            reporting.note(f"{c.label()}: {c.verdict}{': ' + c.reason if c.reason else ''}"
                           + (f" ({figures})" if figures and c.verdict == "meets" else ""))

        considered, chosen = search_all(per_model, measurer.one, measurer.many, targets, budget,
                                        request.frames_per_step, on_measured=announce)
    outcome = TuneOutcome(targets, considered, chosen, described, _machine())
    if chosen is not None and request.write_recipe is not None:
        outcome.recipes = write_recipes(request, chosen, targets, outcome.machine)
    return outcome


#: frames of the user's source that verify checks each candidate on (the gates then see what the model will see)
CHECK_FRAMES = 4


def _check_frames(source: str | None, folder: Path) -> Path | None:
    """Up to ``CHECK_FRAMES`` frames of a video or folder the user tunes on, spread over its first 100, written to
    ``folder`` for verify's ``images``; None for the default video (made from the embedded photographs verify
    checks on anyway) and for a camera (its frames are not there to read twice)."""
    if source is None or source.isdigit():
        return None
    import cv2

    frames = [image for _, image in open_source(source, max_frames=100)]
    chosen = frames[::max(1, len(frames) // CHECK_FRAMES)][:CHECK_FRAMES]
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(chosen):
        cv2.imwrite(str(folder / f"frame{i}.png"), image)
    reporting.note(f"verify checks each candidate on {len(chosen)} frame(s) of {source}", level=1)
    return folder


def _check_every(request) -> None:
    known = {}
    for name in request.models:
        adapter = resolve(name, request.declared)
        for alias in (name, adapter.variant, adapter.family):
            known.setdefault(alias, name)
    for key, n in request.every.items():
        if key not in known:
            raise UsageError(f"--every {key}={n}: no such model here (models: {', '.join(request.models)})")


def _machine() -> dict:
    import platform

    gpu = gpu_info()
    import os

    return {"gpu": str(gpu) if gpu else None, "cpu": (platform.machine() or "").replace("_", "-"),
            "cpu_count": os.cpu_count()}
