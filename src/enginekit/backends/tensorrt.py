"""TensorRT: an engine plan (TensorRT 10/11 or TensorRT-RTX), through ``enginekit.trt``.

Which TensorRT runs an engine here is ``enginekit.trt.session.engine_runs_here``'s answer; this
module never imports tensorrt. Two ways to run a plan: on the GPU with device buffers
(``trt.session.EngineSession``, the runtime's; ``io="device"``), or numpy in and out through
Polygraphy's TrtRunner (``trt.runner``, verify's; ``io="host"``). bench times ``tensorrt`` (whichever
TensorRT a build takes here) and ``tensorrt-rtx``.
"""

from __future__ import annotations

from typing import Any, Mapping

from enginekit.backends.base import (DETECT, ENGINE, KIND_WORDS, ONNX, Artifact, Backend, SessionInfo, Verdict,
                                    doctor_row, static)


class TensorRT(Backend):
    """A cached engine plan. Options: ``io`` ("device": torch CUDA tensors, the runtime's; "host": numpy
    through Polygraphy, verify's), ``stream``; bench: ``family`` (the TensorRT a build takes)."""

    name = "tensorrt"
    label = "TensorRT"
    runs = (ENGINE,)
    runs_on = "gpu"
    needs = "TensorRT 10/11 or TensorRT-RTX, and a GPU the engine was built for"
    auto_rank = 0
    verifies = (ENGINE,)
    distributions = ("tensorrt", "tensorrt-rtx")

    @classmethod
    def variants(cls) -> dict[str, dict[str, Any]]:
        return {cls.name: {"family": "auto"}, "tensorrt-rtx": {"family": "tensorrt-rtx"}}

    @classmethod
    def check(cls, artifact: Artifact | None = None, *, device: str | None = None, gpu=DETECT,
              family: str = "auto", **options) -> Verdict:
        """The engine ``artifact`` is; without one, the engine a build with ``family`` would make here."""
        from enginekit.trt.session import engine_runs_here

        verdict = engine_runs_here(artifact.manifest if artifact is not None else None, flavour=family, gpu=gpu)
        return Verdict(verdict.ok, verdict.reason)

    @classmethod
    def refuses(cls, target) -> str | None:
        if target.kind == ONNX:
            return f"build an engine from {target.label} first (enginekit build {target.path}), then load the engine"
        if target.kind == "model" or target.kind in cls.runs:
            return None
        return f"{target.label} is {KIND_WORDS[target.kind]}: the {cls.name} backend runs engine plans"

    @classmethod
    def build_options(cls, family: str = "auto", **options) -> dict[str, Any]:
        return {"flavour": family}

    # -- the runner ---------------------------------------------------------------------------------
    def _installed(self):
        """The installed TensorRT that runs this plan here; CapabilityError saying why not."""
        from enginekit.trt.session import check_runs_here

        return check_runs_here(self.artifact.manifest)

    def _activate(self) -> None:
        import numpy as np

        a = self.artifact
        if self.options.get("io", "device") == "host":
            from enginekit.trt.runner import engine_runner

            self._opened = engine_runner(a.path, self._installed(), list(a.manifest["profiles"]), a.input_name)
            self._run = self._opened.__enter__()
            self.info = SessionInfo(self.name, self.device, a.input_name, (), (), np.float32)
            return
        from enginekit.trt.session import EngineSession

        self.engine = EngineSession(a.path, dict(a.manifest), a.input_name, device=self.device,
                                    stream=self.options.get("stream"))
        self.stream = self.engine.stream
        self.info = SessionInfo(self.name, self.device, a.input_name, self.engine.output_names,
                                static(self.engine.input_shape), np.float32, self.engine.max_batch,
                                self.engine.profiles)

    def infer(self, x):
        if getattr(self, "_run", None) is not None:
            return self._run({self.info.input_name: x})
        return self.engine(x)

    def infer_feed(self, feed):
        if getattr(self, "_run", None) is not None:
            return self._run(dict(feed))
        return super().infer_feed(feed)

    def deactivate(self) -> None:
        opened, self._opened, self._run = getattr(self, "_opened", None), None, None
        if opened is not None:
            opened.__exit__(None, None, None)
        super().deactivate()

    def timed(self, batch, *, include_copies: bool = False, threads: int | None = None):
        """A static-shape engine through Polygraphy's TrtRunner (trt/runner.py), synchronized per run."""
        from enginekit.backends.timing import COPIES_EXCLUDED, COPIES_INCLUDED, Runner
        from enginekit.gpu import gpu_info
        from enginekit.trt.runner import repeat_runner

        installed = self._installed()
        opened = repeat_runner(self.artifact.path, installed, {self.artifact.input_name: batch},
                               include_copies=include_copies)
        run = opened.__enter__()
        copies = COPIES_INCLUDED if include_copies else COPIES_EXCLUDED
        return Runner(run, str(gpu_info() or "cuda"), copies, detail=f"{installed.label}; static shape; polygraphy "
                      "TrtRunner", timer="perf_counter", close=lambda: opened.__exit__(None, None, None))

    # -- doctor -------------------------------------------------------------------------------------
    @classmethod
    def inventory(cls, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
        from enginekit.trt.session import installed_modules

        return {"tensorrt_modules": installed_modules()}

    @classmethod
    def doctor_rows(cls, inv: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One row per TensorRT of the traits table: can it build here, can its engines run here."""
        from enginekit.trt.flavours import TRAITS

        return [_traits_row(row, inv) for row in TRAITS.values()]


def _major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _traits_row(row, inv: Mapping[str, Any]) -> dict[str, Any]:
    """Can this traits row build and run here? TensorRT needs the GPU for both; RTX only to run."""
    from enginekit.gpu import GpuInfo
    from enginekit.trt.session import runs_on

    module = inv.get("tensorrt_modules", {}).get(row.family, {})
    version = module.get("version")
    if version is None:
        why = f"{row.module}: {module.get('error') or 'not installed'}; {row.pip_install}"
        return doctor_row(row.name, None, False, False, why)
    if _major(version) not in row.majors:
        majors = "/".join(map(str, row.majors))
        return doctor_row(row.name, None, False, False, f"{row.label} {version} is installed; this row is {majors}.x")
    gpu = inv.get("gpu")
    can_build = gpu is not None or not row.needs_gpu_to_build
    can_run, run_reason = runs_on(row, GpuInfo(gpu["name"], gpu["compute_capability"]) if gpu else None)
    build_reason = ("builds ahead of time for chosen compute capabilities" if not row.needs_gpu_to_build
                    else "builds on this GPU" if gpu else "building needs a GPU")
    return doctor_row(row.name, version, can_build, can_run, f"{build_reason}; {run_reason}")

