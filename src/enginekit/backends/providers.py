"""Which ONNX Runtime execution providers LOAD here, not just which are compiled in.

A provider is a shared library beside onnxruntime (``libonnxruntime_providers_cuda.so``...)
that links CUDA, cuDNN or TensorRT libraries of one major version. It is listed by
``get_available_providers()`` even when those libraries are missing; only loading it tells.
Without a GPU the library is still loaded (that finds missing CUDA libraries); a session is
only started on the provider where a GPU exists, since asking for it elsewhere prints a loud error.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from enginekit.errors import CapabilityError

_LIBRARIES = {
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
    "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so",
}


@dataclass(frozen=True)
class ProviderStatus:
    name: str
    compiled: bool  # listed by get_available_providers()
    loads: bool | None  # None: not tried (no GPU to start a session on, or not compiled in)
    detail: str

    def to_json(self) -> dict:
        return {"name": self.name, "compiled": self.compiled, "loads": self.loads, "detail": self.detail}


def _preload(ort) -> str | None:
    """Load the CUDA/cuDNN libraries from the nvidia-* wheels (ORT >= 1.21); a note if that failed."""
    fn = getattr(ort, "preload_dlls", None)
    if fn is None:
        return None
    try:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            fn()
    except Exception as exc:  # noqa: BLE001
        return f"preload_dlls failed: {str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
    _preload_from_other_site(ort)
    return None


def _preload_from_other_site(ort) -> None:
    """preload_dlls looks for the nvidia-* wheels beside onnxruntime only; an onnxruntime installed
    elsewhere (``pip install --target``) finds them where Python imports ``nvidia`` from."""
    import importlib.util

    paths = getattr(ort, "_get_nvidia_dll_paths", None)
    spec = importlib.util.find_spec("nvidia")
    if paths is None or spec is None or not spec.submodule_search_locations:
        return
    own = Path(ort.__file__).resolve().parent.parent
    for root in spec.submodule_search_locations:
        site = Path(root).resolve().parent
        if site == own:
            continue
        try:
            relative = paths(False, True, True)
        except TypeError:
            return
        for rel in relative:
            lib = site.joinpath(*rel)
            if lib.is_file():
                try:
                    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass


def _missing_library(message: str) -> str:
    m = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", message)
    return f"needs {m.group(1)}, which is not installed" if m else message.splitlines()[0][:200]


def library_loads(ort, provider: str) -> tuple[bool, str]:
    """dlopen the provider's library (after its shared helper): True, or the missing library."""
    capi = Path(ort.__file__).parent / "capi"
    lib = capi / _LIBRARIES[provider]
    if not lib.exists():
        return False, f"{lib.name} is not in this onnxruntime build"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return False, _missing_library(str(exc))
    return True, f"{lib.name} and the libraries it links load"


def _tiny_model():
    """Identity over a 1x4 float tensor, at an IR version every ORT reads."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _session_starts(ort, provider: str) -> tuple[bool, str]:
    import numpy as np

    from enginekit.onnx.runtime import CPU, session

    try:
        sess = session(_tiny_model(), providers=[provider, CPU], log_level=4)
        if provider not in sess.get_providers():
            return False, "the session fell back to the CPU"
        sess.run(None, {"x": np.ones((1, 4), np.float32)})
    except Exception as exc:  # noqa: BLE001
        return False, _missing_library(str(exc))
    return True, "a session ran on it"


def _has_gpu() -> bool:
    from enginekit.gpu import gpu_info

    return gpu_info() is not None


def onnxruntime_providers(*, gpu: bool | None = None) -> list[ProviderStatus]:
    """Every provider of the installed onnxruntime: compiled in, and whether it loads here.

    For ``doctor``. CPU always loads; CUDA/TensorRT: their library is loaded (that needs no GPU),
    then, where a GPU exists, a one-node session is run on them.
    """
    try:
        import onnxruntime as ort
    except Exception as exc:  # noqa: BLE001
        return [ProviderStatus("onnxruntime", False, False, f"not importable: {str(exc).splitlines()[0][:160]}")]
    gpu = _has_gpu() if gpu is None else gpu
    compiled = list(ort.get_available_providers())
    note = _preload(ort) if any(p in compiled for p in _LIBRARIES) else None
    out = []
    for name in compiled:
        if name == "CPUExecutionProvider":
            out.append(ProviderStatus(name, True, True, f"onnxruntime {ort.__version__}"))
            continue
        if name not in _LIBRARIES:
            out.append(ProviderStatus(name, True, None, "not checked"))
            continue
        ok, detail = library_loads(ort, name)
        if not ok and not gpu and "libcuda.so.1" in detail:  # everything else loaded; the driver needs a GPU
            out.append(ProviderStatus(name, True, None, "its CUDA libraries load; the NVIDIA driver (libcuda.so.1) "
                                                        "is absent: no GPU here"))
            continue
        if ok and gpu:
            ok, detail = _session_starts(ort, name)
        elif ok:
            detail += "; no GPU here to start a session on"
        if note and not ok:
            detail += f" ({note})"
        out.append(ProviderStatus(name, True, ok if (gpu or not ok) else None, detail))
    return out


@lru_cache(maxsize=1)
def require_cuda_provider():
    """onnxruntime, with its CUDA provider loaded and able to run; CapabilityError saying why not."""
    try:
        import onnxruntime as ort
    except Exception as exc:  # noqa: BLE001
        raise CapabilityError(f"onnxruntime is not importable: {str(exc).splitlines()[0][:160]}") from exc
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise CapabilityError(f"onnxruntime {ort.__version__} has no CUDA provider: install onnxruntime-gpu")
    if not _has_gpu():
        raise CapabilityError("ONNX Runtime's CUDA provider needs an NVIDIA GPU, and this machine has none")
    ort.set_default_logger_severity(3)  # its plugin-EP lookup warns on every CUDA session otherwise
    _preload(ort)
    ok, detail = library_loads(ort, "CUDAExecutionProvider")
    if ok:
        ok, detail = _session_starts(ort, "CUDAExecutionProvider")
    if not ok:
        raise CapabilityError(f"onnxruntime {ort.__version__}'s CUDA provider does not load: {detail} "
                              "(onnxruntime-gpu 1.31 links the CUDA 13 libraries that torch brings)")
    return ort
