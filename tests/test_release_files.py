"""Files from every Ultralytics release since 8.0, made by those releases (the corpus: ``tests/release_files.py``).

With the pinned Ultralytics loading each file: ``enginekit.load(F)`` and ``enginekit predict F`` give what
``YOLO(F).predict`` gives on non-square frames (boxes IoU >= 0.99, same classes, masks IoU >= 0.95, keypoints within
2 px, top-1 for classify) on ONNX Runtime and torch; ``enginekit export F`` passes its parity gates; where
``YOLO(F).predict`` itself fails, one line and exit 3, nothing cached. Older pickles (``getattr(Detect, 'forward')``)
load; anything else a pickle calls or names stays refused, naming it and the way on. A YOLO26 head runs the branch
its own switch selects, whatever its YAML says.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error
from release_files import RELEASES, corpus
from user_files_check import compare_file

PHOTO = "bus.jpg"


@pytest.fixture(scope="module")
def files():
    return corpus()


@pytest.fixture(scope="module")
def by_name(files):
    return {f.name: f for f in files}


def _photo() -> Path:
    import ultralytics

    return Path(ultralytics.__file__).parent / "assets" / PHOTO


def test_the_corpus_holds_every_release_and_task_as_it_wrote_them(files):
    """Each release's trainer wrote its checkpoints (its version recorded in them, EMA stripped into a half-precision
    model as it strips) and its exporter its ONNX files; the 8.0 and 8.1 segment, pose and obb heads hold the unbound
    ``Detect.forward`` that protocol 2 pickles through ``getattr``."""
    import torch

    pinned = {f.release for f in files} - set(RELEASES)
    assert len(pinned) == 1, pinned
    tasks = {"detect", "segment", "pose", "obb", "classify"}
    for release in (*RELEASES, *pinned):
        have = {(f.task, f.kind) for f in files if f.release == release and not f.unrunnable}
        want = {(t, k) for t in tasks - ({"obb"} if release.startswith("8.0") else set()) for k in ("checkpoint", "onnx")}
        assert want <= have, (release, sorted(want - have))
    for f in files:
        if f.kind != "checkpoint" or f.release not in RELEASES:
            continue
        ckpt = torch.load(str(f.path), map_location="cpu", weights_only=False)
        assert ckpt["version"] == f.release and ckpt.get("ema") is None and ckpt.get("optimizer") is None, f.name
        assert next(ckpt["model"].parameters()).dtype == torch.float16 and ckpt["train_args"]["epochs"] >= 1, f.name
        unsafe = _globals_of(f.path)
        old_head = f.release.startswith(("8.0.", "8.1.")) and f.task in ("segment", "pose", "obb")
        assert ("builtins.getattr" in unsafe) == old_head, (f.name, sorted(unsafe))


def _globals_of(path) -> set[str]:
    """Every global the file names: torch lists only those not registered as safe, and enginekit's loads in this
    process (an earlier test's) register what the files they read named."""
    import torch

    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        return set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    finally:
        torch.serialization.add_safe_globals(registered)


def test_every_release_file_predicts_as_ultralytics_does(files, tmp_path, cache):
    """For every file Ultralytics runs: ``enginekit.load(F)`` finds what ``YOLO(F).predict`` finds on two photographs
    and a frame of shapes, none square: every ONNX file on ONNX Runtime, every checkpoint on torch, and the 8.1
    checkpoints (the heads that pickle ``getattr``) and YOLO26's exported and run on ONNX Runtime as well (every
    checkpoint's export is gated by the test below). The comparison compares something: hundreds of instances over
    the corpus, and some in every release's every instance task."""
    failures, found = [], {}
    for f in files:
        if f.unrunnable:
            continue
        both = f.release.startswith("8.1.") or "yolo26" in f.name
        backends = (("onnxruntime-cpu", "torch") if both else ("torch",)) if f.kind == "checkpoint" \
            else ("onnxruntime-cpu",)
        for backend in backends:
            result = compare_file(f.path, f.task, tmp_path, backend=backend, cache=cache)
            found[(f.release, f.task)] = found.get((f.release, f.task), 0) + result.instances
            if not result.same:
                failures.append(f"{f.name} on {backend} ({f.how}): {result.detail}")
    assert not failures, failures
    assert sum(found.values()) >= 400, found
    assert all(n > 0 for n in found.values()), found


def test_export_of_every_release_checkpoint_passes_its_parity_gates(files, cache, tmp_path):
    from enginekit import api

    for f in files:
        if f.kind != "checkpoint" or f.unrunnable:
            continue
        result = api.export(str(f.path), output=tmp_path / f"{f.path.stem}.onnx", cache=cache, quiet=True)
        assert result.passed, (f.name, result.failures())


def test_the_cli_runs_an_old_segment_and_pose_pickle(by_name, run_cli, tmp_path):
    """An 8.1 segmenter and pose model (their heads pickle ``getattr(Detect, 'forward')``): ``export`` exits 0 with
    parity passing and ``predict`` gives what ``YOLO(F).predict`` gives (the property test above, on the same files)."""
    shutil.copy(_photo(), tmp_path / PHOTO)
    for task in ("segment", "pose"):
        name = f"8.1.47-{task}.pt"
        shutil.copy(by_name[name].path, tmp_path / name)
        exported = run_cli("export", name, cwd=tmp_path)
        assert exported.code == 0, exported.stderr
        assert (tmp_path / f"8.1.47-{task}.onnx").is_file()
        predicted = run_cli("predict", name, PHOTO, "--json", "--conf", "0.1", cwd=tmp_path)
        assert predicted.code == 0, predicted.stderr
        assert json.loads(predicted.stdout)


class _System:
    """A pickle that calls ``os.system`` when unpickled."""

    def __reduce__(self):
        return os.system, ("echo pwned",)


class _PrivateGetattr:
    """A pickle that reaches a private attribute of an allowed class through ``getattr``."""

    def __reduce__(self):
        from ultralytics.nn.modules.head import Detect

        return getattr, (Detect, "__init__")


@pytest.mark.parametrize("payload,named", [(_System, "system"), (_PrivateGetattr, "getattr(Detect, '__init__')")])
def test_what_a_pickle_must_not_do_stays_refused_naming_it_and_the_way_on(by_name, run_cli, tmp_path, payload, named):
    """An old segmenter with an ``os.system`` call (or a ``getattr`` of a private attribute) beside its model: refused
    before anything runs, in one line naming the file, what it calls and ``--trust-checkpoint``; nothing cached."""
    import torch

    ckpt = torch.load(str(by_name["8.1.47-segment.pt"].path), map_location="cpu", weights_only=False)
    ckpt["extra"] = payload()
    torch.save(ckpt, str(tmp_path / "evil.pt"))
    cache = tmp_path / "cache"
    result = run_cli("export", "evil.pt", cwd=tmp_path, env={"ENGINEKIT_CACHE": str(cache)})
    line = assert_one_line_error(result, 2, "refused to load", "evil.pt", named, "--trust-checkpoint")
    assert "not a PyTorch checkpoint" not in line and "pwned" not in result.stdout + result.stderr
    assert not list(cache.rglob("manifest.json")) and not (tmp_path / "evil.onnx").exists()


def test_a_file_ultralytics_loads_but_cannot_run_is_refused_in_one_line_exit_3(by_name, run_cli, tmp_path):
    """A fork's file (its attention layers lack ``qkv``): ``YOLO(F).predict`` itself fails (the premise); every verb
    refuses it in one line, exit 3, naming the layer and the missing attribute, before any export or cache entry."""
    from ultralytics import YOLO

    fork = next(f for f in by_name.values() if f.unrunnable)
    with pytest.raises(AttributeError, match="qkv"):
        YOLO(str(fork.path)).predict(str(_photo()), verbose=False)
    shutil.copy(fork.path, tmp_path / "helmet.pt")
    shutil.copy(_photo(), tmp_path / PHOTO)
    cache = tmp_path / "cache"
    for args in (["predict", "helmet.pt", PHOTO], ["export", "helmet.pt"], ["build", "helmet.pt"]):
        result = run_cli(*args, cwd=tmp_path, env={"ENGINEKIT_CACHE": str(cache)})
        assert_one_line_error(result, 3, "cannot run the layers of helmet.pt", "AAttn has no attribute qkv",
                              "fork or a newer release")
    assert not list(cache.rglob("*.onnx")) and not list(cache.rglob("manifest.json"))
    assert not (tmp_path / "helmet.onnx").exists()


def _graph(path: Path) -> tuple[dict, list]:
    """(the graph's metadata, its first output's shape on one 160x160 input, run on ONNX Runtime)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path), load_external_data=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.zeros((1, 3, 160, 160), np.float32)}
    shape = list(session.run(None, feed)[0].shape)
    return {p.key: p.value for p in model.metadata_props}, shape


def test_a_yolo26_head_runs_the_branch_ultralytics_predict_runs(by_name, cache, tmp_path):
    """A YOLO26 as trained (YAML ``end2end: True``, both branches, its head's own switch off) and the same file with the
    switch on: ``YOLO(F).predict`` runs both one-to-many with NMS (its predictor selects the branch by ``nms``, None by
    default, not by the switch), and ``nms=False`` runs the one-to-one branch, which finds other boxes (so the property
    test above tells the branches apart). enginekit's graph of either file is the one-to-many output (B, 4 + nc,
    anchors), its FP32 parity passes, and ``--nms`` puts Ultralytics' NMS after that branch."""
    from ultralytics import YOLO

    from enginekit import api

    off = next(f for f in by_name.values() if f.name.endswith("yolo26-as-trained.pt"))
    on = next(f for f in by_name.values() if f.name.endswith("yolo26-end2end.pt"))
    frames = [str(_photo()), str(_photo().with_name("zidane.jpg"))]
    shapes_frame = tmp_path / "shapes.jpg"
    _shapes_frame(shapes_frame)
    frames.append(str(shapes_frame))

    def boxes(f, **kw):
        return [r.boxes.xyxy.numpy() for r in YOLO(str(f.path)).predict(frames, conf=0.1, verbose=False, **kw)]

    default_off, default_on, one_to_one = boxes(off), boxes(on), boxes(off, nms=False)
    assert sum(len(b) for b in default_off) >= 3, "the trained yolo26 finds nothing: the comparison compares nothing"
    assert all(a.shape == b.shape and np.allclose(a, b) for a, b in zip(default_off, default_on))
    assert any(a.shape != b.shape or not np.allclose(a, b, atol=0.5) for a, b in zip(default_off, one_to_one))
    for f in (off, on):
        result = api.export(str(f.path), output=tmp_path / f"{f.path.stem}.onnx", cache=cache, quiet=True)
        assert result.passed, (f.name, result.failures())
        meta, shape = _graph(tmp_path / f"{f.path.stem}.onnx")
        assert meta["end2end"] == "False" and shape[1] == 4 + 3, (meta.get("end2end"), shape)
    nms = api.export(str(off.path), output=tmp_path / "nms.onnx", cache=cache, quiet=True, nms=True)
    assert nms.passed, nms.failures()
    assert _graph(tmp_path / "nms.onnx")[1][1:] == [300, 6]


def _shapes_frame(path: Path) -> None:
    """A 480x640 frame of the shapes the corpus' detectors were trained on."""
    from user_files_check import frames

    frame = frames(path.parent, "detect")[-1]
    path.write_bytes(Path(frame).read_bytes())
