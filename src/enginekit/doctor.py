"""What this machine has, what it can build and run, and which combinations are known to break.

``inventory()`` gathers facts (package versions, GPU, cache, and what each registered backend
asks for: torch's CUDA build, ONNX Runtime's providers, TensorRT's modules); everything after it
is a pure function of that dict, so each check can be tried against a made-up machine:

    inv = inventory()
    capabilities(inv)   # each backend's rows (enginekit.backends): installed? can build? can run? why
    warnings(inv)       # known bad combinations, one line each
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from enginekit._version import __version__
from enginekit.backends import backends
from enginekit.cache import Cache
from enginekit.errors import EnginekitError
from enginekit.gpu import gpu_info, gpus
from enginekit.store.settings import current
from enginekit.trt.flavours import RTX_COMPUTE_CAPABILITIES


#: distributions whose versions matter to enginekit (metadata only: nothing is imported)
PACKAGES = (
    "torch", "torchvision", "ultralytics", "transformers", "onnx", "onnxsim", "onnxslim", "onnxruntime",
    "onnxruntime-gpu", "nvidia-modelopt", "polygraphy", "tensorrt", "tensorrt-cu12", "tensorrt-cu13",
    "tensorrt-rtx", "tensorrt-rtx-cu13-libs", "tensorrt-rtx-cu13-bindings", "matplotlib",
)
#: distributions of one TensorRT-RTX install that must share a version
RTX_DISTRIBUTIONS = ("tensorrt-rtx", "tensorrt-rtx-cu13-libs", "tensorrt-rtx-cu13-bindings")


# --- facts (impure) --------------------------------------------------------------------


def inventory() -> dict[str, Any]:
    """Everything the checks look at, as plain JSON-ready data."""
    inv: dict[str, Any] = {
        "enginekit": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {name: _dist_version(name) for name in PACKAGES},
        "gpu": _gpu(),  # the one builds and runs use
        "gpus": _gpus(),  # every GPU CUDA sees, with memory
    }
    for backend in backends():  # torch_cuda, onnxruntime_providers (+ _status), tensorrt_modules, ...
        for key, value in backend.inventory(inv).items():
            if isinstance(value, dict) and isinstance(inv.get(key), dict):
                inv[key] = {**inv[key], **value}
            else:
                inv[key] = value
    inv["cache"] = _cache_facts()
    inv["store"] = _store_facts()
    return inv


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _gpu() -> dict[str, str] | None:
    gpu = gpu_info()
    return gpu.to_json() if gpu is not None else None


def _gpus() -> list[dict[str, Any]]:
    return [{**g.to_json(), "index": g.index, "memory_bytes": g.memory_bytes} for g in gpus()]


def _cache_facts() -> dict[str, Any]:
    cache = Cache()
    root = cache.root
    problem = cache.location_problem()
    if problem is not None:  # a regular file, under /proc or /sys, or not writable: nothing to walk
        return {"root": str(root), "exists": False, "size_bytes": 0, "entries": 0, "writable": False,
                "problem": problem}
    size, entries = 0, 0
    if root.is_dir():
        for path, dirs, files in os.walk(root):
            size += sum(_file_size(Path(path) / f) for f in files)
            if Path(path).parent.parent == root and not Path(path).parent.name.startswith("."):
                entries += 1
    writable = os.access(root if root.exists() else _existing_parent(root), os.W_OK)
    return {"root": str(root), "exists": root.is_dir(), "size_bytes": size, "entries": entries,
            "writable": writable, "problem": None}


def _store_facts() -> dict[str, Any]:
    """The team store (ENGINEKIT_REMOTE): its URL, mode, and whether it answers (bucket and
    credentials checked; nothing is written)."""
    try:
        settings = current()
    except EnginekitError as exc:
        return {"url": os.environ.get("ENGINEKIT_REMOTE"), "mode": None, "reachable": False, "problem": str(exc)}
    if settings is None:
        return {"url": None, "mode": None, "reachable": None, "problem": None}
    facts = {"url": settings.url, "mode": settings.mode, "timeout_s": settings.timeout, "endpoint": None,
             "reachable": False, "problem": None}
    try:
        from enginekit.store.tier import open_store

        store = open_store(settings)
        facts["endpoint"] = getattr(store, "endpoint", None)
        store.check()
        facts["reachable"] = True
    except EnginekitError as exc:
        facts["problem"] = str(exc)
    except ImportError as exc:
        facts["problem"] = f"cannot import {exc.name or 'the store client'}: pip install boto3"
    return facts


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# --- judgements (pure) -----------------------------------------------------------------


def _major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _cc_tuple(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def capabilities(inv: dict[str, Any]) -> list[dict[str, Any]]:
    """Each registered backend's rows (torch, ONNX Runtime's providers, each TensorRT of the traits table)."""
    return [row for backend in backends() for row in backend.doctor_rows(inv)]


def warnings(inv: dict[str, Any]) -> list[str]:
    """Known bad combinations on this machine, one line each."""
    found: list[str] = []
    for check in (_warn_onnxruntime_twice, _warn_rtx_gpu, _warn_old_tensorrt, _warn_rtx_versions,
                  _warn_torch_cpu_build, _warn_cache, _warn_missing_model_libraries, _warn_store):
        found.extend(check(inv))
    return found


def _warn_onnxruntime_twice(inv: dict[str, Any]) -> list[str]:
    p = inv["packages"]
    if p.get("onnxruntime") and p.get("onnxruntime-gpu"):
        return [f"onnxruntime {p['onnxruntime']} and onnxruntime-gpu {p['onnxruntime-gpu']} are both installed "
                "into one folder (nvidia-modelopt[onnx] pulls in onnxruntime-gpu): whichever came last owns the "
                "files; uninstall both, then install one"]
    return []


def _warn_rtx_gpu(inv: dict[str, Any]) -> list[str]:
    gpu = inv.get("gpu")
    rtx = inv.get("tensorrt_modules", {}).get("tensorrt-rtx", {})
    if gpu is None or rtx.get("version") is None or gpu["compute_capability"] in RTX_COMPUTE_CAPABILITIES:
        return []
    hint = "install TensorRT proper (pip install tensorrt-cu13) to run engines here"
    if _cc_tuple(gpu["compute_capability"])[0] == 9:
        hint = "TensorRT-RTX has no Hopper (9.0) target; " + hint
    return [f"TensorRT-RTX cannot run engines on this GPU, {gpu['name']} (compute {gpu['compute_capability']}): "
            f"{hint}; RTX still builds here for other GPUs (--target-cc)"]


def _warn_old_tensorrt(inv: dict[str, Any]) -> list[str]:
    version = inv.get("tensorrt_modules", {}).get("tensorrt", {}).get("version")
    major = _major(version)
    if major is not None and major < 10:
        return [f"TensorRT {version} is too old: enginekit builds strongly typed networks with TensorRT 10 or "
                "newer (pip install tensorrt-cu13)"]
    return []


def _warn_rtx_versions(inv: dict[str, Any]) -> list[str]:
    p = inv["packages"]
    versions = {name: p.get(name) for name in RTX_DISTRIBUTIONS if p.get(name)}
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"{n} {v}" for n, v in versions.items())
        return [f"TensorRT-RTX distributions disagree ({listed}): install one version of all three"]
    return []


def _warn_torch_cpu_build(inv: dict[str, Any]) -> list[str]:
    if inv.get("gpu") and inv["packages"].get("torch") and inv.get("torch_cuda") is None:
        return [f"this machine has a GPU ({inv['gpu']['name']}), but torch is a CPU-only build: "
                "torch references and bench rows run on the CPU"]
    return []


def _warn_cache(inv: dict[str, Any]) -> list[str]:
    cache = inv.get("cache", {})
    if cache.get("problem"):
        return [f"cannot use the cache at {cache['root']}: {cache['problem']}; set ENGINEKIT_CACHE to a writable folder"]
    if cache and not cache.get("writable", True):
        return [f"the cache {cache['root']} is not writable: set ENGINEKIT_CACHE to a folder you can write"]
    return []


def _warn_store(inv: dict[str, Any]) -> list[str]:
    store = inv.get("store") or {}
    if store.get("problem"):
        return [f"{store['problem']}: builds and loads go on with the local cache only"]
    return []


def _warn_missing_model_libraries(inv: dict[str, Any]) -> list[str]:
    p = inv["packages"]
    missing = [f"{lib} (for {what})" for lib, what in (("ultralytics", "YOLO"), ("transformers", "Depth-Anything-V2"),
                                                        ("onnx", "every export"))
               if not p.get(lib)]
    return [f"not installed: {', '.join(missing)}"] if missing else []


def report(inv: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole doctor report: facts, capabilities and warnings."""
    inv = inventory() if inv is None else inv
    return {**inv, "backends": capabilities(inv), "warnings": warnings(inv)}
