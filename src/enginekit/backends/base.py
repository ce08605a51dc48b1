"""The backend protocol: one small class per way of running a model, modelled on Polygraphy's BaseRunner.

A backend says what it runs (an ONNX graph, an engine plan, a PyTorch module: ``runs``), where
(``runs_on``), what it needs, and, asked through ``check``, whether it runs here and why not in one
line. An instance is a runner over one artifact: ``activate()`` loads its library and makes the
session, ``infer(x)`` takes a batch (numpy on the CPU, a torch tensor on a GPU) and returns the
outputs by name, ``deactivate()`` lets go. ``timed`` prepares the repeated inference ``bench``
measures; ``doctor_rows`` are its lines in ``enginekit doctor``. ``variants`` name the ways bench
times it (torch at FP32, FP16, FP16 in a CUDA graph).

Nothing here imports numpy, onnxruntime, torch or tensorrt at import time: ``enginekit --help``
lists the backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from enginekit.errors import UsageError

#: what a backend runs
ONNX = "onnx"  # an ONNX graph
ENGINE = "engine"  # a TensorRT engine plan with its manifest
MODULE = "module"  # a PyTorch module, already loaded
#: ``check``'s ``gpu`` argument: ask enginekit.gpu
DETECT = "detect"
#: each kind, in a sentence
KIND_WORDS = {ONNX: "an ONNX file", ENGINE: "an engine plan", MODULE: "a PyTorch module", "model": "a model name"}


@dataclass
class SessionInfo:
    """What pre- and postprocessing need to know about a session."""

    backend: str
    device: str  # "cpu" or "cuda:N"
    input_name: str
    output_names: tuple[str, ...]
    input_shape: tuple  # ints, or None where dynamic
    input_dtype: Any = None  # numpy dtype of the input; None: float32
    max_batch: int | None = None
    #: per profile: {"min": [...], "max": [...]} of the input (TensorRT); empty: any shape
    profiles: list[dict] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def fixed_hw(self) -> tuple[int, int] | None:
        """The one H x W the session takes: the graph's fixed size, or the one size all engine profiles fix."""
        if len(self.input_shape) < 4:
            return None
        h, w = self.input_shape[2], self.input_shape[3]
        if isinstance(h, int) and isinstance(w, int):
            return (h, w)
        sizes = {tuple(p[self.input_name][k][2:4]) for p in self.profiles for k in ("min", "max")}
        return tuple(sizes.pop()) if len(sizes) == 1 else None

    def accepts_hw(self, hw: tuple[int, int]) -> bool:
        """Whether the session takes an input of H x W ``hw`` (any batch it takes): a dynamic graph any, an
        engine what one of its profiles covers, a static graph its own size."""
        if self.profiles:
            return any(all(p[self.input_name]["min"][i] <= hw[i - 2] <= p[self.input_name]["max"][i] for i in (2, 3))
                       for p in self.profiles)
        if len(self.input_shape) < 4:
            return False
        return all(d is None or d == v for d, v in zip(self.input_shape[2:4], hw))


@dataclass(frozen=True)
class Artifact:
    """What a backend runs: a file (ONNX graph, engine plan and its manifest) or a loaded module."""

    kind: str  # ONNX | ENGINE | MODULE
    path: Path | None = None
    manifest: Mapping[str, Any] = field(default_factory=dict)
    module: Any = None
    input_name: str | None = None  # the model's input (engines and modules; an ONNX graph says it itself)
    output_names: tuple[str, ...] = ()
    input_shape: tuple = ()  # a module's input: ints, or None where any size goes

    @classmethod
    def onnx(cls, path) -> "Artifact":
        return cls(ONNX, Path(path))

    @classmethod
    def engine(cls, path, manifest: Mapping[str, Any], input_name: str) -> "Artifact":
        return cls(ENGINE, Path(path), manifest, input_name=input_name)

    @classmethod
    def of_module(cls, module, input_name: str, output_names, input_shape) -> "Artifact":
        return cls(MODULE, module=module, input_name=input_name, output_names=tuple(output_names),
                   input_shape=tuple(input_shape))


@dataclass(frozen=True)
class Verdict:
    """Whether a backend runs here, and why (or why not) in one line."""

    ok: bool
    reason: str


def static(dims) -> tuple:
    """A shape's dimensions: ints where fixed, None where dynamic."""
    return tuple(d if isinstance(d, int) and d > 0 else None for d in dims)


def cuda_index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


def detect_gpu(gpu=DETECT):
    """``gpu`` as given, or this machine's (``enginekit.gpu``) for ``DETECT``."""
    if gpu == DETECT:
        from enginekit.gpu import gpu_info

        return gpu_info()
    return gpu


def doctor_row(name: str, version: str | None, can_build: bool | None, can_run: bool, reason: str) -> dict[str, Any]:
    """One line of doctor's backends table."""
    return {"name": name, "installed": version is not None, "version": version, "can_build": can_build,
            "can_run": can_run, "reason": reason}


class Backend:
    """One way to run a model. Subclasses set the class attributes and implement ``check``,
    ``_activate`` and ``infer``; the rest has defaults that fit a backend running on the CPU."""

    #: what ``--backend`` names it; also ``SessionInfo.backend`` and ``predictor.backend``
    name: ClassVar[str]
    #: for messages: "ONNX Runtime on the CPU"
    label: ClassVar[str] = ""
    #: the artifact kinds it runs: ONNX, ENGINE, MODULE
    runs: ClassVar[tuple[str, ...]] = ()
    #: "cpu", "gpu" (needs one), or "any" (the CPU, or a GPU where one is)
    runs_on: ClassVar[str] = "cpu"
    #: what it needs, one line (doctor, help)
    needs: ClassVar[str] = ""
    #: the precisions it runs of a model name (a module at, or the graph exported at); None: the artifact's
    precisions: ClassVar[tuple[str, ...] | None] = None
    #: ``load(backend="auto")`` tries backends by rank, lowest first; None: only when asked for
    auto_rank: ClassVar[int | None] = None
    #: bench ``--backend`` words that take every variant of every backend declaring them
    shorthands: ClassVar[tuple[str, ...]] = ()
    #: the distributions whose versions a report records
    distributions: ClassVar[tuple[str, ...]] = ()
    #: the artifact kinds verify runs on this backend (the candidates' executor)
    verifies: ClassVar[tuple[str, ...]] = ()

    # -- what it is, and whether it runs here ---------------------------------------------------------
    @classmethod
    def variants(cls) -> dict[str, dict[str, Any]]:
        """The ways bench times it, by row name: options passed to the runner. Default: itself."""
        return {cls.name: {}}

    @classmethod
    def check(cls, artifact: Artifact | None = None, *, device: str | None = None, gpu=DETECT,
              **options) -> Verdict:
        """Whether it runs here (``artifact``: that one; ``options``: a variant's), and why in one line."""
        raise NotImplementedError

    @classmethod
    def why_not(cls, artifact: Artifact | None = None, **kwargs) -> str | None:
        verdict = cls.check(artifact, **kwargs)
        return None if verdict.ok else verdict.reason

    @classmethod
    def refuses(cls, target) -> str | None:
        """Why it cannot run ``target`` when asked for (a runtime Target: ``kind`` "model", ONNX or ENGINE,
        ``label``, ``path``, ``model``, ``metadata``); None: it can. A model name can become any artifact
        (the API layer exports or builds it)."""
        if target.kind == "model" or target.kind in cls.runs:
            return None
        runs = " or ".join(KIND_WORDS[k].split(" ", 1)[1] + "s" for k in cls.runs)
        return f"{target.label} is {KIND_WORDS[target.kind]}: the {cls.name} backend runs {runs}"

    @classmethod
    def default_device(cls, requested: str | None) -> str:
        """``--device`` when given, else where it runs: a GPU backend on cuda:0; "any" where a GPU works."""
        if requested:
            return requested
        if cls.runs_on == "gpu":
            return "cuda:0"
        if cls.runs_on == "any" and detect_gpu() is not None and cls.check(device="cuda:0").ok:
            return "cuda:0"
        return "cpu"

    @classmethod
    def build_options(cls, **options) -> dict[str, Any]:
        """What a build of its engines takes from a variant's options (BuildRequest fields)."""
        return {}

    # -- doctor -------------------------------------------------------------------------------------
    @classmethod
    def inventory(cls, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Facts doctor's inventory gathers for it (impure), beside those ``known`` already; its rows are
        judged from them by ``doctor_rows``. Default: its own ``check`` and version."""
        verdict = cls.check()
        return {"backends_here": {cls.name: {"version": cls.version(), "can_run": verdict.ok,
                                             "reason": verdict.reason}}}

    @classmethod
    def doctor_rows(cls, inv: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Its lines in doctor's backends table: a pure function of the inventory."""
        facts = (inv.get("backends_here") or {}).get(cls.name)
        if facts is None:
            return [doctor_row(cls.name, None, None, False, "not checked")]
        return [doctor_row(cls.name, facts["version"], None, facts["can_run"], facts["reason"])]

    @classmethod
    def version(cls) -> str | None:
        """The installed version of its first distribution (None: not installed)."""
        from importlib import metadata

        for name in cls.distributions:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    # -- the runner ---------------------------------------------------------------------------------
    info: SessionInfo
    stream: Any = None  # the torch.cuda.Stream its work is queued on (GPU backends)

    def __init__(self, artifact: Artifact, *, device: str | None = None, **options):
        if artifact.kind not in self.runs:
            raise UsageError(f"the {self.name} backend runs {', '.join(self.runs)} artifacts, not {artifact.kind}")
        self.artifact = artifact
        self.device = self.default_device(device)  # "cpu" or "cuda:N"
        self.options = options
        self.is_active = False

    @classmethod
    def open(cls, artifact, *, device: str | None = None, **options) -> "Backend":
        """An active runner over ``artifact`` (a path is taken as an ONNX graph)."""
        if not isinstance(artifact, Artifact):
            artifact = Artifact.onnx(artifact)
        runner = cls(artifact, device=device, **options)
        runner.activate()
        return runner

    def activate(self) -> None:
        """Load the library and make the session; ``self.info`` says what it takes and gives."""
        if not self.is_active:
            self._activate()
            self.is_active = True

    def _activate(self) -> None:
        raise NotImplementedError

    def infer(self, x) -> dict:
        """One batch -> the outputs by name (numpy in, numpy out; a CUDA tensor in, CUDA tensors out)."""
        raise NotImplementedError

    @property
    def capture_runs(self) -> int:
        """Runs of each input shape, on the thread that will serve it, before a run may share the GPU with
        other threads' work (a backend that captures a CUDA graph on a later run, in a mode that any other
        thread's CUDA call spoils). 0: none needed."""
        return 0

    def infer_feed(self, feed: Mapping[str, Any]) -> dict:
        """Polygraphy's shape of a runner: inputs by name -> numpy outputs by name (verify's candidates)."""
        import numpy as np

        out = self.infer(feed[self.info.input_name])
        return {k: v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v) for k, v in out.items()}

    def deactivate(self) -> None:
        self.is_active = False

    def infer_fixed(self, x) -> dict:
        """``infer`` of an input that is the same tensor at every call of its shape, rewritten in place between calls
        (a captured graph's output, read before it is rewritten on the same stream): a session that copies its input
        into a buffer of its own (a captured graph's) may read ``x`` where it is instead. Default: ``infer``."""
        return self.infer(x)

    #: where a session can run its network inside a caller's CUDA graph (``runtime.step_graph``): a method ``(x)`` ->
    #: a function of no arguments giving the outputs by name as device work only (``x``: a CUDA tensor that stays
    #: where it is), or None for that input; None here: this session runs otherwise (a library's session)
    forward_in_graph = None

    def __call__(self, x) -> dict:
        return self.infer(x)

    def __enter__(self) -> "Backend":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # -- bench ----------------------------------------------------------------------------------------
    def timed(self, batch, *, include_copies: bool = False, threads: int | None = None):
        """The repeated inference bench times (``timing.Runner``): by default ``infer`` on the batch."""
        from enginekit.backends.timing import COPIES_EXCLUDED, COPIES_INCLUDED, COPIES_NOT_APPLICABLE, Runner

        self.activate()
        if not self.info.on_gpu:
            return Runner(lambda: self.infer(batch), "cpu", COPIES_NOT_APPLICABLE, close=self.deactivate)
        import torch

        on_device = torch.from_numpy(batch).to(self.info.device)

        def run():
            if include_copies:
                for v in self.infer(torch.from_numpy(batch).to(self.info.device)).values():
                    v.cpu()
            else:
                self.infer(on_device)

        return Runner(run, self.info.device, COPIES_INCLUDED if include_copies else COPIES_EXCLUDED,
                      stream=self.stream, close=self.deactivate)
