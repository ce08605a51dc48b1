"""Checkpoints and ONNX files as every Ultralytics release since 8.0 writes them, made by those releases themselves.

Users' files come from every release since 8.0 (January 2023), not from the one installed: older pickles (releases 8.0
to 8.3 keep ``self.detect = Detect.forward`` on their Segment and Pose heads, which pickle protocol 2 stores as
``getattr(Detect, 'forward')``), other head layouts, other exporters. For each release below, installed beside the
pinned one with ``pip install --no-deps --target DIR ultralytics==X`` (cached), a child process running that release
alone builds each task's model from that release's own YAML, starts it from the suite's trained weights (so that its
scores spread: transferred by layer name and shape), fine-tunes it one epoch with that release's trainer, and keeps
the ``best.pt`` that trainer writes (its pickle protocol, EMA, half precision, ``train_args``, stripped as it strips),
then exports it with that release's exporter at its defaults (``YOLO(best.pt).export(format="onnx")``).

- 8.0.200, 8.1.47, 8.2.100: yolov8n, yolov8n-seg, yolov8n-pose, yolov8n-obb (8.1 and later), yolov8n-cls;
- 8.3.40: yolo11n and its tasks (C3k2, C2PSA attention), started from the suite's trained yolo11n task models;
- the pinned 8.4: the suite's own trainer files (the detector and the task models) and their exports; a yolo26n the
  pinned trainer trained (``yolo26-as-trained.pt``: its YAML says ``end2end: True``, its head holds both branches and
  its own end-to-end switch is off, as trained) and the same file with the switch on (``yolo26-end2end.pt``):
  ``YOLO(F).predict`` runs both one-to-many with NMS (its predictor selects the branch by its ``nms`` argument, not by
  the switch; ``nms=False`` runs the one-to-one branch, which gives other boxes); and a fork's file (``fork-aattn.pt``: a yolo12n whose attention layers hold ``qk`` where
  Ultralytics' hold ``qkv``, as a YOLOv12 fork's do: Ultralytics loads it and cannot run it).

Older trainers import what the pinned release does not (``py-cpuinfo``; ``pandas`` for their results table): both go
into a folder of their own beside the releases; their validators call ``np.trapz``, which NumPy 2 renamed (aliased in
their process); their exporters ran torch's TorchScript exporter, as torch's default was then (``dynamo=False``). Those trainers read their own checkpoints back with ``torch.load``'s
old default (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in their process only: the files are the suite's).

    python tests/release_files.py       # make (or find) the corpus and list it
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

VERSION = 1
#: the releases the corpus is made with (one of each minor series before the pinned 8.4), and what each builds
RELEASES = {"8.0.200": "yolov8n", "8.1.47": "yolov8n", "8.2.100": "yolov8n", "8.3.40": "yolo11n"}
#: what older trainers import that the pinned release does not
EXTRAS = ("py-cpuinfo==9.0.0", "pandas==3.1.1")
SUFFIXES = {"detect": "", "segment": "-seg", "pose": "-pose", "obb": "-obb", "classify": "-cls"}
FINE_TUNE = {"epochs": 1, "batch": 16, "seed": 0, "deterministic": True, "optimizer": "AdamW", "lr0": 0.0005,
             "warmup_epochs": 0, "mosaic": 0.0, "hsv_h": 0.0, "fliplr": 0.0, "amp": False}
#: the classifier's head starts from nothing (no detector has one): a few more epochs at a higher rate
FINE_TUNE_CLS = {**FINE_TUNE, "epochs": 3, "lr0": 0.002}
IMGSZ = {"classify": 96}  # else 160, the suite's training size
#: the datasets fine-tuning reads (drawn once by the pinned side: the shapes of tests/trained_tasks.py)
DATA = {"train_images": 32, "val_images": 4, "size": 160, "objects": (1, 4), "side_px": (28, 70), "seed": 5}
DATA_CLS = {"train_images": 48, "val_images": 12, "size": 96, "objects": (1, 1), "side_px": (30, 70), "seed": 5}
#: yolo26n trained by the pinned trainer from its YAML on the detector's shapes
YOLO26_TRAIN = {"imgsz": 160, "epochs": 30, "batch": 16, "seed": 0, "deterministic": True, "optimizer": "AdamW",
                "lr0": 0.004, "warmup_epochs": 1, "mosaic": 0.0, "hsv_h": 0.0, "fliplr": 0.5, "amp": False}
YOLO26_DATA = {"train_images": 128, "val_images": 8, "size": 160, "objects": (1, 5), "side_px": (18, 64), "seed": 3}


@dataclass(frozen=True)
class ReleaseFile:
    path: Path
    release: str  # "8.0.200", ..., "8.4.x" (the pinned one)
    task: str
    kind: str  # "checkpoint" or "onnx"
    how: str
    #: where Ultralytics itself cannot run the file: what its predict raised (the corpus records it)
    unrunnable: bool = False

    @property
    def name(self) -> str:
        return self.path.name


def releases_root() -> Path:
    from trained_detector import cache_root

    return cache_root() / "ultralytics-releases"


def release_dir(version: str) -> Path:
    """``ultralytics==version`` installed alone into a folder (cached), for a child process's ``PYTHONPATH``."""
    return _installed(f"ultralytics-{version}", [f"ultralytics=={version}"])


def extras_dir() -> Path:
    return _installed("extras-" + hashlib.sha256(" ".join(EXTRAS).encode()).hexdigest()[:8], list(EXTRAS))


def _installed(name: str, requirements: list[str]) -> Path:
    from filelock import FileLock

    root = releases_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    with FileLock(str(target) + ".lock"):
        if not (target / ".installed").exists():
            work = target.with_name(target.name + f".tmp{os.getpid()}")
            shutil.rmtree(work, ignore_errors=True)
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                                   "--disable-pip-version-check", "--target", str(work), *requirements],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"pip install --target {' '.join(requirements)} failed:\n{proc.stderr[-2000:]}")
            (work / ".installed").write_text(" ".join(requirements))
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
    return target


def sources() -> dict[str, str]:
    """The suite's trained checkpoints the corpus starts from, by task (training them first where missing)."""
    from trained_detector import trained_detector
    from trained_tasks import trained_task_model

    found = {"detect": str(trained_detector().weights)}
    found.update({task: str(trained_task_model(task)) for task in ("segment", "pose", "obb", "classify")})
    return found


def cache_key(made_from: dict[str, str]) -> str:
    import torch
    import ultralytics

    digests = {task: hashlib.sha256(Path(path).read_bytes()).hexdigest() for task, path in made_from.items()}
    parts = {"version": VERSION, "releases": RELEASES, "extras": EXTRAS, "fine_tune": FINE_TUNE,
             "fine_tune_cls": FINE_TUNE_CLS, "data": DATA, "data_cls": DATA_CLS, "yolo26": YOLO26_TRAIN,
             "yolo26_data": YOLO26_DATA, "sources": digests, "ultralytics": ultralytics.__version__,
             "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def corpus(root: Path | None = None) -> list[ReleaseFile]:
    """Every file of the corpus, making it first (once, under a lock) where it is missing."""
    from filelock import FileLock
    from trained_detector import cache_root

    made_from = sources()
    entry = (root or cache_root()) / f"release-files-{cache_key(made_from)}"
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if not (entry / "corpus.json").exists():
            _make(entry, made_from)
    return [ReleaseFile(entry / f["file"], f["release"], f["task"], f["kind"], f["how"], f.get("unrunnable", False))
            for f in json.loads((entry / "corpus.json").read_text())]


def _child(work: Path, args: list[str], *, release: str | None = None) -> None:
    """This file run as a child with ``args``: under ``release`` alone (its folder and the extras first on the path,
    the pinned Ultralytics behind them), else under the pinned one."""
    env = dict(os.environ, YOLO_OFFLINE="1", YOLO_VERBOSE="False", YOLO_CONFIG_DIR=str(work / f"config-{release}"))
    if release is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(release_dir(release)), str(extras_dir())])
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # that trainer reads back its own checkpoints
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env, cwd=str(work),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"making the release corpus ({release or 'pinned'}) failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")


def _make(entry: Path, made_from: dict[str, str]) -> None:
    work = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _child(work, ["--prepare", str(work), json.dumps(made_from)])
        made: list[dict] = []
        for release in RELEASES:
            _child(work, ["--release", str(work), release], release=release)
            made += json.loads((work / f"made-{release}.json").read_text())
        _child(work, ["--pinned", str(work), json.dumps(made_from)])
        made += json.loads((work / "made-pinned.json").read_text())
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    for scratch in ("runs", "datasets", "config", "start", *(f"config-{r}" for r in (*RELEASES, None))):
        shutil.rmtree(work / scratch, ignore_errors=True)
    for leftover in work.glob("made-*.json"):
        leftover.unlink()
    (work / "corpus.json").write_text(json.dumps(made, indent=1))
    shutil.rmtree(entry, ignore_errors=True)
    work.rename(entry)


# ------------------------------------------------------------------------------------------ the pinned side


def _prepare(work: Path, made_from: dict) -> None:
    """Datasets for fine-tuning (drawn by the suite's own code) and the trained weights as plain state dicts, which
    any release's torch.load reads (a pickle of the pinned release's classes would not unpickle under another)."""
    import torch
    from trained_detector import write_dataset as write_detect_dataset
    from trained_tasks import write_classify_dataset, write_dataset

    data = work / "datasets"
    write_detect_dataset(data / "detect", DATA)  # the detector's own shapes (its class order)
    for task in ("segment", "pose", "obb"):
        write_dataset(data / task, task, DATA)
    write_classify_dataset(data / "classify", DATA_CLS)
    start = work / "start"
    start.mkdir(exist_ok=True)
    for task, path in made_from.items():
        ckpt = torch.load(path, map_location="cpu", weights_only=False)  # the suite's own file
        model = (ckpt.get("ema") or ckpt["model"]).float()
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, start / f"{task}.pt")


def _pinned(work: Path, made_from: dict) -> None:
    """The pinned release's own files: the suite's trainer files and their exports, a yolo26n as trained and with its
    end-to-end switch on, and a fork's file."""
    import ultralytics
    import ultralytics.data.utils as data_utils
    from ultralytics import YOLO

    import torch
    from trained_detector import write_dataset as write_detect_dataset

    data_utils.check_font = lambda *a, **k: None
    release = f"{ultralytics.__version__}"
    made: list[dict] = []

    def keep(path: Path, task: str, how: str, **more) -> None:
        made.append({"file": path.name, "release": release, "task": task, "kind": "checkpoint", "how": how, **more})

    for task, path in made_from.items():
        dest = work / f"{release}-{task}.pt"
        shutil.copy2(path, dest)
        keep(dest, task, "the suite's trained model, as this release's trainer wrote it")

    yaml_path = write_detect_dataset(work / "datasets" / "yolo26", YOLO26_DATA)
    model = YOLO("yolo26n.yaml")
    model.train(data=str(yaml_path), device="cpu", workers=0, plots=False, val=False, project=str(work / "runs"),
                name="yolo26", exist_ok=True, verbose=False, **YOLO26_TRAIN)
    weights = work / "runs" / "yolo26" / "weights"
    best = weights / "best.pt" if (weights / "best.pt").exists() else weights / "last.pt"
    as_trained = work / f"{release}-yolo26-as-trained.pt"
    shutil.copy2(best, as_trained)
    ckpt = torch.load(str(as_trained), map_location="cpu", weights_only=False)
    head = (ckpt.get("ema") or ckpt["model"]).model[-1]
    if head.end2end or getattr(head, "one2one_cv2", None) is None:
        raise RuntimeError("the yolo26n as trained was expected to have its one-to-one branch, unselected")
    keep(as_trained, "detect", "yolo26n trained by this release: YAML end2end: True, the head's own switch off")
    head.end2end = True
    on = work / f"{release}-yolo26-end2end.pt"
    torch.save(ckpt, str(on))
    keep(on, "detect", "the same yolo26n with its head's end-to-end switch on")

    fork = YOLO("yolo12n.yaml").model
    for module in fork.modules():
        if type(module).__name__ == "AAttn":
            module.qk = module.qkv  # a YOLOv12 fork's attention: the projections under other names
            del module.qkv
    fork.names = {0: "helmet", 1: "head"}
    path = work / f"{release}-fork-aattn.pt"
    torch.save({"model": fork.half(), "train_args": {"imgsz": 160}}, str(path))
    keep(path, "detect", "a YOLOv12 fork's file: AAttn layers with qk where Ultralytics' have qkv", unrunnable=True)

    for item in [m for m in made if not m.get("unrunnable")]:
        made.append(_export(work / item["file"], item))
    (work / "made-pinned.json").write_text(json.dumps(made, indent=1))


def _export(path: Path, item: dict) -> dict:
    from ultralytics import YOLO

    out = Path(YOLO(str(path)).export(format="onnx", verbose=False))
    dest = path.with_suffix(".onnx")
    out.rename(dest)
    return {"file": dest.name, "release": item["release"], "task": item["task"], "kind": "onnx",
            "how": f"YOLO({path.name}).export(format='onnx') by {item['release']}"}


# ------------------------------------------------------------------------------------------ a release's side


def _release(work: Path, version: str) -> None:
    """Under ``version`` alone: each task's model built from its YAML, started from the trained weights, fine-tuned one
    epoch by this release's trainer, its best.pt kept and exported by this release."""
    import numpy as np
    import torch

    # NumPy 2 removed what the older validators' mAP calls (their trainers validate the last epoch); the files they
    # save do not depend on it
    for old, new in (("trapz", "trapezoid"), ("in1d", "isin")):
        if not hasattr(np, old):
            setattr(np, old, getattr(np, new))
    # their exporters ran torch.onnx.export's TorchScript exporter, torch's default then (2.9 made dynamo the default)
    export = torch.onnx.export

    def torchscript_export(*args, **kwargs):
        kwargs.setdefault("dynamo", False)
        return export(*args, **kwargs)

    torch.onnx.export = torchscript_export
    import ultralytics
    from ultralytics import YOLO
    from ultralytics.nn import tasks as nn_tasks

    assert ultralytics.__version__ == version, (ultralytics.__version__, version)
    try:
        import ultralytics.data.utils as data_utils

        data_utils.check_font = lambda *a, **k: None
    except (ImportError, AttributeError):
        pass
    base = RELEASES[version]
    classes = {"detect": nn_tasks.DetectionModel, "segment": nn_tasks.SegmentationModel,
               "pose": nn_tasks.PoseModel, "classify": nn_tasks.ClassificationModel}
    if hasattr(nn_tasks, "OBBModel"):
        classes["obb"] = nn_tasks.OBBModel
    made: list[dict] = []
    for task, cls in classes.items():
        arch = f"{base}{SUFFIXES[task]}"
        kwargs = {"nc": 3, "verbose": False}
        if task == "pose":
            kwargs["data_kpt_shape"] = (3, 3)
        model = cls(f"{arch}.yaml", **kwargs)
        # the trained weights, by layer name and shape: a yolo11 release starts from the suite's yolo11n task model,
        # a yolov8 release from the trained yolov8n detector (every v8 task shares its backbone, neck and box head)
        source = task if base.startswith("yolo11") and task != "detect" else "detect"
        if base.startswith("yolo11") and task == "detect":
            source = "segment"
        trained = torch.load(str(work / "start" / f"{source}.pt"), map_location="cpu")
        own = model.state_dict()
        taken = {k: v for k, v in trained.items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(taken, strict=False)
        start = work / "start" / f"{version}-{task}.pt"
        torch.save({"model": model, "train_args": {"task": task}}, str(start))  # older loaders take the task here
        data = work / "datasets" / task
        data_arg = str(data) if task == "classify" else str(data / "shapes.yaml")
        settings = FINE_TUNE_CLS if task == "classify" else FINE_TUNE
        name = f"{version}-{task}"
        YOLO(str(start), task=task).train(data=data_arg, imgsz=IMGSZ.get(task, 160), device="cpu", workers=0,
                                          plots=False, val=False, project=str(work / "runs"), name=name,
                                          exist_ok=True, verbose=False, **settings)
        weights = work / "runs" / name / "weights"
        best = weights / "best.pt" if (weights / "best.pt").exists() else weights / "last.pt"
        dest = work / f"{name}.pt"
        shutil.copy2(best, dest)
        item = {"file": dest.name, "release": version, "task": task, "kind": "checkpoint",
                "how": f"{arch} fine-tuned by {version}'s trainer ({len(taken)} of {len(own)} tensors from the "
                       f"suite's trained {source} model)"}
        made += [item, _export(dest, item)]
    (work / f"made-{version}.json").write_text(json.dumps(made, indent=1))


def _check() -> int:
    """The corpus table: every file, on ONNX Runtime (and torch for checkpoints), one line each: the same as
    ``YOLO(file).predict`` (instances compared, worst IoU), or refused and why (the figures the notes quote)."""
    import tempfile

    from user_files_check import compare_file

    folder = Path(tempfile.mkdtemp(prefix="release-files-check-"))
    bad = 0
    print(f"{'release':8s} {'task':9s} {'file':34s} {'backend':16s} verdict")
    for f in corpus():
        for backend in ("onnxruntime-cpu", "torch") if f.kind == "checkpoint" else ("onnxruntime-cpu",):
            try:
                c = compare_file(f.path, f.task, folder, backend=backend)
                line = (f"same: {c.instances} instances on {c.frames} frames, worst IoU {c.worst_iou:.4f}" if c.same
                        else f"DIFFERENT: {c.detail}")
                bad += not c.same and not f.unrunnable
            except Exception as exc:  # noqa: BLE001 - listed: a refusal is a line of the table
                line = f"refused ({type(exc).__name__}, exit {getattr(exc, 'exit_code', '?')}): {str(exc)[:150]}"
                bad += not f.unrunnable
            print(f"{f.release:8s} {f.task:9s} {f.name:34s} {backend:16s} {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--prepare":
        _prepare(Path(sys.argv[2]), json.loads(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--release":
        _release(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "--pinned":
        _pinned(Path(sys.argv[2]), json.loads(sys.argv[3]))
    elif sys.argv[1:] == ["--check"]:
        raise SystemExit(_check())
    else:
        for f in corpus():
            print(f"{f.path}  {f.release:8s} {f.task:9s} {f.kind:10s} {f.how}")
