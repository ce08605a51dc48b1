"""Reference inputs and PyTorch outputs, computed once and stored in polygraphy's JSON formats.

A user can replay them: ``polygraphy run model.onnx --onnxrt --load-inputs inputs.json
--load-outputs outputs.json``. They are a cache entry keyed by (weights, input set): a second
verify runs no PyTorch forward pass and does not even load the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from enginekit.calibration import CalibrationData
from enginekit.compare.comparison import Case
from enginekit.shapes import format_shape
from enginekit import reporting
from enginekit.backends.base import SessionInfo, static
from enginekit.onnx.graph import input_dims, load_model
from enginekit.pipeline import model_versions

INPUTS_FILE = "inputs.json"
OUTPUTS_FILE = "outputs.json"
LABELS_FILE = "labels.json"
RUNNER_NAME = "pytorch"


class References:
    """The reference cases of a stored entry, read from its files when first used: a verify whose verdicts are all
    stored (``verification.checks.stored_check``) needs only the key and reads none of them."""

    def __init__(self, cases: list[Case] | None, key: str, status: str, skipped_images: list[str],
                 folder: Path | None = None):
        self._cases, self._folder = cases, folder
        self.key = key
        self.status = status  # cache status: hit | miss | ...
        self.skipped_images = skipped_images

    @property
    def cases(self) -> list[Case]:
        if self._cases is None:
            self._cases = _load(self._folder)
        return self._cases

    def cases_for(self, accepts_hw=None) -> list[Case]:
        """The cases a candidate is checked on: each photograph letterboxed as the candidate's runtime would
        (at its own rectangle where the candidate takes that shape, ``accepts_hw(hw)``; else at the full
        size), and every random input. ``accepts_hw`` None: the full-size photographs."""
        rect = {c.label.split(" @", 1)[0]: c for c in self.cases if c.letterbox == "rect"}
        out = []
        for c in self.cases:
            if c.letterbox == "rect":
                continue
            r = rect.get(c.label) if c.kind == "photo" else None
            if r is not None and accepts_hw is not None and accepts_hw(tuple(r.feed[next(iter(r.feed))].shape[2:])):
                out.append(r)
            else:
                out.append(c)
        return out


def reference_shapes(profiles: list[dict], input_name: str) -> tuple[tuple, list[tuple]]:
    """(photo shape: the first profile's opt at batch 1, distinct min/opt/max shapes of all profiles)."""
    shapes: list[tuple] = []
    for profile in profiles:
        rng = profile[input_name]
        for k in ("min", "opt", "max"):
            s = tuple(rng[k])
            if s not in shapes:
                shapes.append(s)
    opt = tuple(profiles[0][input_name]["opt"])
    return (1, *opt[1:]), shapes


def quiet_polygraphy() -> None:
    """polygraphy logs each save and load at INFO; enginekit reports its own steps."""
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR


def get_references(pipe, profiles: list[dict], images: CalibrationData, seed: int = 0) -> References:
    """Stored references for the pipeline's model over photographs and profile shapes."""
    quiet_polygraphy()

    adapter = pipe.adapter
    photo_shape, random_shapes = reference_shapes(profiles, adapter.input_name)
    parts = {
        "stage": "reference",
        "layout": 2,  # the manifest names the outputs: a stored verdict's verify reads no reference file
        "model": adapter.key_model(pipe.request.weights is not None and not pipe.request.random_init),
        "weights": pipe.request.weights_identity,
        "photos": images.digest(adapter, photo_shape),
        "random": [format_shape(s) for s in random_shapes],
        "seed": seed,
        # the code that builds the model and computes its outputs: enginekit (random init, the
        # wrappers), torch, and the family's framework (ultralytics or transformers)
        "versions": model_versions(adapter),
    }
    if adapter.nms is not None:  # the kept boxes of the model wrapped in NMS
        parts["nms"] = adapter.nms.to_json()
    if adapter.letterboxes_rect():  # each photograph at its rectangle too
        parts["letterbox"] = "rect/1"
    identity = adapter.identity()  # a user module's source, declared outputs and preprocessing
    if identity:
        parts["identity"] = identity

    def produce(tmp: Path) -> dict:
        cases = _compute(pipe, images, photo_shape, random_shapes, seed)
        _save(tmp, cases)
        return {"cases": len(cases), "skipped_images": images.skipped, "outputs": list(cases[0].outputs) if cases else []}

    with reporting.stage("references (PyTorch)") as s:
        entry, status = pipe.cache.get_or_create("reference", parts, produce, subject=pipe.subject)
        s.status = status
    outputs = entry.manifest.get("outputs")
    refs = References(None, entry.key, status, entry.manifest.get("skipped_images", []), entry.path)
    if outputs is None and refs.cases:  # an entry from before the manifest named them
        outputs = list(refs.cases[0].outputs)
    if outputs:  # stored: the model was not loaded, and a family that finds its outputs by loading learns them here
        adapter.adopt_outputs(tuple(outputs))
    return refs


def _compute(pipe, images: CalibrationData, photo_shape, random_shapes, seed) -> list[Case]:
    adapter = pipe.adapter
    cases: list[Case] = []
    hw = tuple(photo_shape[2:])
    if images.is_array:
        photos = images.batch(adapter, photo_shape)
        cases.extend(_case(pipe, f"photo {images.source.name}[{i}]", "photo", photos[i:i + 1]) for i in range(len(photos)))
    for img, path in zip([] if images.is_array else images.read(), images.used_paths):
        cases.append(_case(pipe, f"photo {path.name}", "photo", adapter.preprocess(img, hw)))
        rect = adapter.rect_hw(img.shape[:2], hw)
        if rect is not None and tuple(rect) != hw:  # as YOLO's .pt predict: the photograph's own rectangle
            cases.append(_case(pipe, f"photo {path.name} @{rect[0]}x{rect[1]}", "photo",
                               adapter.preprocess_rect(img, hw), letterbox="rect"))
    for j, shape in enumerate(random_shapes):
        cases.append(_case(pipe, f"random {format_shape(shape)}", "random", adapter.random_inputs(shape, seed + j)))
    return cases


def _case(pipe, label: str, kind: str, array: np.ndarray, letterbox: str = "") -> Case:
    feed = {pipe.adapter.input_name: np.ascontiguousarray(array, dtype=np.float32)}
    return Case(label, kind, feed, pipe.adapter.reference(pipe.loaded, feed[pipe.adapter.input_name]), letterbox)


def _save(folder: Path, cases: list[Case]) -> None:
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.json import save_json

    save_json([c.feed for c in cases], str(folder / INPUTS_FILE))
    results = RunResults()
    results.append((RUNNER_NAME, [IterationResult(c.outputs, runner_name=RUNNER_NAME) for c in cases]))
    results.save(str(folder / OUTPUTS_FILE))
    (folder / LABELS_FILE).write_text(json.dumps([{"label": c.label, "kind": c.kind, "letterbox": c.letterbox}
                                                  for c in cases]))


def _load(folder: Path) -> list[Case]:
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    feeds = load_json(str(folder / INPUTS_FILE))
    results = RunResults.load(str(folder / OUTPUTS_FILE))
    (_, iterations), = results.items()
    labels = json.loads((folder / LABELS_FILE).read_text())
    return [Case(l["label"], l["kind"], dict(f), {k: np.asarray(v) for k, v in it.items()}, l.get("letterbox", ""))
            for l, f, it in zip(labels, feeds, iterations)]


def onnx_accepts_hw(path: Path):
    """Which input H x W an ONNX graph takes (a graph of dynamic H/W: any), as its runtime's session says."""
    dims = input_dims(load_model(path))
    name, shape = next(iter(dims.items()))
    return SessionInfo("onnx", "cpu", name, (), static(shape)).accepts_hw


def engine_accepts_hw(manifest: dict, input_name: str):
    """Which input H x W an engine takes: what one of its profiles covers."""
    return SessionInfo("engine", "", input_name, (), (None, None, None, None),
                       profiles=list(manifest.get("profiles") or [])).accepts_hw
