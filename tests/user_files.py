"""Files as users have them: checkpoints made the way they arise in practice, and the ONNX files Ultralytics
exports from them at its defaults. The suite makes them once and caches them (``$ENGINEKIT_TEST_DATA``).

A checkpoint's YAML varies with how it was made, and none of these carry the metadata the suite's own files do:

- ``trained.pt``: the suite's trained detector, a trainer run from ``yolov8n.yaml`` (``yaml_file`` recorded);
- ``people.pt``: fine-tuned for one epoch by Ultralytics' trainer from a ``best.pt`` whose YAML records no
  ``yaml_file`` (as releases before 8.1 wrote, and as fine-tuning from such a file keeps): the trainer's own output;
- ``legacy.pt``: that checkpoint with its YAML as releases before ``scales`` wrote it (``depth_multiple`` /
  ``width_multiple``, no ``scales``, no ``scale``, no ``yaml_file``);
- ``ppe-detector-v3.pt``: a team's copy of ``yolov8.yaml`` under its own name (``guess_model_scale`` finds no scale in
  that name, so the trainer built it at the first scale and recorded ``scale: ''``);
- ``p2.pt``: a trainer run from ``yolov8n-p2.yaml`` (four output strides, 4 to 32), started from the trained
  detector's backbone; no name enginekit builds;
- ``seg.pt``, ``pose.pt``, ``obb.pt``, ``cls.pt``: the suite's trained task models with no ``yaml_file`` (the
  segmenter also without ``scale``: ``scales`` alone, which Ultralytics reads as the first scale).

Each is exported by ``YOLO(file).export(format="onnx")`` at Ultralytics' defaults (640, static), and with
``dynamic=True``, ``half=True`` and ``nms=True`` (not for the classifier), with the description Ultralytics writes
("Ultralytics people model trained on ...").

    python tests/user_files.py       # make (or find) the corpus and list it
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
FINE_TUNE = {"imgsz": 160, "epochs": 1, "batch": 16, "seed": 1, "deterministic": True, "optimizer": "AdamW",
             "lr0": 0.001, "warmup_epochs": 0, "mosaic": 0.0, "hsv_h": 0.0, "fliplr": 0.5, "amp": False}
P2_TRAIN = {**FINE_TUNE, "epochs": 2, "lr0": 0.004, "warmup_epochs": 1}
#: the YAML of yolov8n as releases before ``scales`` wrote it
LEGACY = {"depth_multiple": 0.33, "width_multiple": 0.25, "max_channels": 1024}
#: Ultralytics' ONNX exports of each checkpoint: file suffix -> export arguments (its defaults otherwise)
EXPORTS = {"static": {}, "dynamic": {"dynamic": True}, "half": {"half": True}, "nms": {"nms": True}}
TASK_FILES = {"segment": "seg", "pose": "pose", "obb": "obb", "classify": "cls"}


@dataclass(frozen=True)
class UserFile:
    path: Path
    task: str
    kind: str  # "checkpoint" or the export ("static", "dynamic", "half", "nms")
    how: str  # how it was made

    @property
    def name(self) -> str:
        return self.path.name


def sources() -> dict[str, str]:
    """The trained checkpoints the corpus is made from (training them first where missing), by task."""
    from trained_detector import trained_detector
    from trained_tasks import trained_task_model

    found = {"detect": str(trained_detector().weights)}
    found.update({task: str(trained_task_model(task)) for task in TASK_FILES})
    return found


def cache_key(made_from: dict[str, str]) -> str:
    """Everything the corpus is made from: its settings, the versions, and the trained checkpoints' content (a model
    trained again on another machine is another model)."""
    import torch
    import ultralytics

    digests = {task: hashlib.sha256(Path(path).read_bytes()).hexdigest() for task, path in made_from.items()}
    parts = {"version": VERSION, "fine_tune": FINE_TUNE, "p2": P2_TRAIN, "legacy": LEGACY, "exports": EXPORTS,
             "sources": digests, "ultralytics": ultralytics.__version__, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def corpus(root: Path | None = None) -> list[UserFile]:
    """Every file of the corpus, making it first (once, under a lock) where it is missing."""
    from filelock import FileLock
    from trained_detector import cache_root

    made_from = sources()
    entry = (root or cache_root()) / f"user-files-{cache_key(made_from)}"
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if not (entry / "corpus.json").exists():
            _make(entry, made_from)
    return [UserFile(entry / f["file"], f["task"], f["kind"], f["how"])
            for f in json.loads((entry / "corpus.json").read_text())]


def checkpoints(files: list[UserFile]) -> list[UserFile]:
    return [f for f in files if f.kind == "checkpoint"]


def _make(entry: Path, made_from: dict[str, str]) -> None:
    """The corpus, made in a child process (the trainer and exporter change process-wide state) into a temp folder
    renamed into place."""
    work = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ, YOLO_OFFLINE="1", YOLO_VERBOSE="False", YOLO_CONFIG_DIR=str(work / "config"))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--make-into", str(work),
                           json.dumps(made_from)], env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not (work / "corpus.json").exists():
        raise RuntimeError(f"making the user-file corpus failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    for scratch in ("runs", "dataset", "config"):
        shutil.rmtree(work / scratch, ignore_errors=True)
    shutil.rmtree(entry, ignore_errors=True)
    work.rename(entry)


def _rewrite_yaml(src: Path, dest: Path, edit) -> None:
    """``src`` saved as ``dest`` with ``edit(yaml_dict)`` applied to its model's (and EMA's) YAML; everything else as
    the trainer wrote it."""
    import torch

    ckpt = torch.load(str(src), map_location="cpu", weights_only=False)  # the suite's own file
    for key in ("model", "ema"):
        model = ckpt.get(key)
        if model is not None and isinstance(getattr(model, "yaml", None), dict):
            edit(model.yaml)
    torch.save(ckpt, str(dest))


def _train(work: Path, start, data_yaml: Path, name: str, settings: dict) -> Path:
    from ultralytics import YOLO

    model = YOLO(str(start)) if isinstance(start, Path) else start
    model.train(data=str(data_yaml), device="cpu", workers=0, plots=False, val=False, project=str(work / "runs"),
                name=name, exist_ok=True, verbose=False, **settings)
    weights = work / "runs" / name / "weights"
    return weights / "best.pt" if (weights / "best.pt").exists() else weights / "last.pt"


def _make_child(work: Path, sources: dict) -> None:
    import ultralytics.data.utils as data_utils
    from ultralytics import YOLO
    from trained_detector import write_dataset

    data_utils.check_font = lambda *a, **k: None  # plots are off; offline the font fetch only waits
    data_yaml = write_dataset(work / "dataset")
    made: list[dict] = []

    def keep(path: Path, task: str, how: str) -> None:
        made.append({"file": path.name, "task": task, "kind": "checkpoint", "how": how})

    trained = work / "trained.pt"
    shutil.copy2(sources["detect"], trained)
    keep(trained, "detect", "a trainer run from yolov8n.yaml")

    no_file = work / "best-no-yaml-file.pt"
    _rewrite_yaml(trained, no_file, lambda y: y.pop("yaml_file", None))
    people = work / "people.pt"
    shutil.copy2(_train(work, no_file, data_yaml, "fine-tune", FINE_TUNE), people)
    no_file.unlink()
    keep(people, "detect", "fine-tuned by the trainer from a best.pt with no yaml_file")

    def legacy(y: dict) -> None:
        for key in ("scales", "scale", "yaml_file"):
            y.pop(key, None)
        y.update(LEGACY)

    _rewrite_yaml(people, work / "legacy.pt", legacy)
    keep(work / "legacy.pt", "detect", "depth_multiple/width_multiple, no scales, scale or yaml_file")

    _rewrite_yaml(trained, work / "ppe-detector-v3.pt", lambda y: y.update(yaml_file="ppe-detector-v3.yaml", scale=""))
    keep(work / "ppe-detector-v3.pt", "detect", "a team's copy of yolov8.yaml (ppe-detector-v3.yaml, no scale)")

    p2 = YOLO("yolov8n-p2.yaml").load(str(trained))
    shutil.copy2(_train(work, p2, data_yaml, "p2", P2_TRAIN), work / "p2.pt")
    keep(work / "p2.pt", "detect", "a trainer run from yolov8n-p2.yaml (strides 4-32)")

    for task, stem in TASK_FILES.items():
        dest = work / f"{stem}.pt"
        drop = ("yaml_file", "scale") if task == "segment" else ("yaml_file",)
        _rewrite_yaml(Path(sources[task]), dest, lambda y, drop=drop: [y.pop(k, None) for k in drop])
        keep(dest, task, "no " + " and no ".join(drop))

    for item in list(made):
        path = work / item["file"]
        for kind, args in EXPORTS.items():
            if kind == "nms" and item["task"] == "classify":
                continue
            out = Path(YOLO(str(path)).export(format="onnx", verbose=False, **args))
            dest = path.with_name(f"{path.stem}.{kind}.onnx")
            out.rename(dest)
            made.append({"file": dest.name, "task": item["task"], "kind": kind,
                         "how": f"YOLO({path.name}).export(format='onnx'{''.join(f', {k}={v}' for k, v in args.items())})"})
    (work / "corpus.json").write_text(json.dumps(made, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--make-into":
        _make_child(Path(sys.argv[2]), json.loads(sys.argv[3]))
    else:
        for f in corpus():
            print(f"{f.path}  {f.task:9s} {f.kind:10s} {f.how}")
