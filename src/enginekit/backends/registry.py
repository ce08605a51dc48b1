"""Every backend enginekit runs models on, in the order bench reports them: one line each.

A new backend is a module (a ``Backend`` subclass, see ``base.py``) and a line in ``BACKENDS`` (or,
from outside the package, ``register(MyBackend)``). ``load``/``predict`` offer it by name (``auto``
tries backends by ``auto_rank``), bench times its variants, verify runs candidates on the backend
that ``verifies`` their kind, and doctor lists its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from enginekit.backends.base import DETECT, Backend, Verdict
from enginekit.backends.ort import OnnxRuntimeCpu, OnnxRuntimeCuda
from enginekit.backends.pytorch import Torch
from enginekit.backends.tensorrt import TensorRT
from enginekit.errors import UsageError

BACKENDS: list[type[Backend]] = [
    Torch,
    OnnxRuntimeCpu,
    OnnxRuntimeCuda,
    TensorRT,
]
#: ``load(backend=AUTO)``: the best backend that runs here
AUTO = "auto"
#: what bench times when ``--backend`` is not given
BENCH_DEFAULT = "torch,onnxruntime"


@dataclass(frozen=True)
class Variant:
    """One way bench times a backend (a row name): the backend and the options it runs with."""

    name: str
    backend: type[Backend]
    options: Mapping[str, Any]

    @property
    def precision(self) -> str | None:
        """The precision the variant itself runs at (torch's rows); None: the graphs' and engines'."""
        return self.options.get("precision")

    def check(self, gpu=DETECT) -> Verdict:
        return self.backend.check(gpu=gpu, **self.options)


def backends() -> list[type[Backend]]:
    return list(BACKENDS)


def names() -> list[str]:
    return [b.name for b in BACKENDS]


def choices() -> list[str]:
    """What ``load``'s and ``predict``'s ``--backend`` accept."""
    return [AUTO, *names()]


def get(name: str) -> type[Backend]:
    for b in BACKENDS:
        if b.name == name:
            return b
    raise UsageError(f"unknown backend {name!r}: choose one of {', '.join(choices())}")


def register(backend: type[Backend]) -> type[Backend]:
    """Add ``backend`` (replacing one of the same name); usable as a class decorator."""
    clash = [v for v in backend.variants() if v in variants() and variants()[v].backend.name != backend.name]
    if clash:
        raise ValueError(f"{backend.name}'s variant {clash[0]} is another backend's")
    for i, b in enumerate(BACKENDS):
        if b.name == backend.name:
            BACKENDS[i] = backend
            return backend
    BACKENDS.append(backend)
    return backend


def unregister(name: str) -> None:
    BACKENDS[:] = [b for b in BACKENDS if b.name != name]


def auto_order() -> list[type[Backend]]:
    """The backends ``auto`` tries, best first."""
    return sorted((b for b in BACKENDS if b.auto_rank is not None), key=lambda b: b.auto_rank)


def running(kind: str) -> list[type[Backend]]:
    """The backends that run artifacts of ``kind`` (ONNX, ENGINE, MODULE), best first for ``auto``."""
    ranked = auto_order()
    return [b for b in ranked + [b for b in BACKENDS if b not in ranked] if kind in b.runs]


def verifier(kind: str) -> type[Backend]:
    """The backend verify runs candidates of ``kind`` on."""
    for b in BACKENDS:
        if kind in b.verifies:
            return b
    raise UsageError(f"no backend verifies {kind} artifacts")


def variants() -> dict[str, Variant]:
    """Every variant bench can time, in report order."""
    return {name: Variant(name, b, options) for b in BACKENDS for name, options in b.variants().items()}


def shorthands() -> dict[str, tuple[str, ...]]:
    """bench ``--backend`` words that stand for several variants: a backend's name where it has several
    variants none of which bears it (torch), and the words backends declare (onnxruntime, ort)."""
    found: dict[str, list[str]] = {}
    for b in BACKENDS:
        own = list(b.variants())
        words = ([b.name] if b.name not in own else []) + list(b.shorthands)
        for word in words:
            found.setdefault(word, []).extend(v for v in own if v not in found.get(word, []))
    return {word: tuple(v) for word, v in found.items()}


def distributions() -> tuple[str, ...]:
    """The distributions whose versions a report records, once each."""
    return tuple(dict.fromkeys(d for b in BACKENDS for d in b.distributions))


def runner_names() -> list[str]:
    """Every runner (a backend's variant, ``enginekit.backends``), in the order rows are reported."""
    return list(variants())


def parse_backends(text: str) -> list[str]:
    """``"torch,onnxruntime-cpu"`` -> runner names in report order; UsageError for unknown names.

    A word is a runner (torch-fp16, onnxruntime-cpu, tensorrt-rtx...) or stands for several
    (torch: its three; onnxruntime or ort: both ONNX Runtime runners).
    """
    runners, words = runner_names(), shorthands()
    chosen: set[str] = set()
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        if item in words:
            chosen.update(words[item])
        elif item in runners:
            chosen.add(item)
        else:
            known = ", ".join(list(words) + runners)
            raise UsageError(f"unknown backend {item!r}: choose from {known}")
    if not chosen:
        raise UsageError(f"--backend names no backend: try {BENCH_DEFAULT}")
    return [name for name in runners if name in chosen]
