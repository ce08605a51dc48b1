"""What this machine has, what it can build and run, and which combinations are known to break.

``inventory()`` gathers facts (package versions, GPU, ONNX Runtime providers, TensorRT
modules, cache); everything after it is a pure function of that dict, so each check can be
tried against a made-up machine:

    inv = inventory()
    capabilities(inv)   # one row per backend: installed? can build? can run? why
    warnings(inv)       # known bad combinations, one line each
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from enginekit.errors import first_line

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
    from enginekit import __version__

    return {
        "enginekit": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {name: _dist_version(name) for name in PACKAGES},
        "torch_cuda": _torch_cuda_version(),
        "gpu": _gpu(),  # the one builds and runs use
        "gpus": _gpus(),  # every GPU CUDA sees, with memory
        "onnxruntime_providers": _onnxruntime_providers(),  # compiled in
        "onnxruntime_provider_status": _onnxruntime_provider_status(),  # and whether each one loads here
        "tensorrt_modules": _tensorrt_modules(),
        "cache": _cache_facts(),
        "store": _store_facts(),
    }


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_cuda_version() -> str | None:
    """The CUDA version torch was built for, read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        match = re.search(r"^cuda(?:: \S+)? = '([^']+)'", version_file.read_text(), re.MULTILINE)
    except OSError:
        return None
    return match.group(1) if match else None


def _gpu() -> dict[str, str] | None:
    from enginekit.gpu import gpu_info

    gpu = gpu_info()
    return gpu.to_json() if gpu is not None else None


def _gpus() -> list[dict[str, Any]]:
    from enginekit.gpu import gpus

    return [{**g.to_json(), "index": g.index, "memory_bytes": g.memory_bytes} for g in gpus()]


def _onnxruntime_providers() -> list[str] | None:
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    try:
        import onnxruntime as ort

        return list(ort.get_available_providers())
    except Exception:  # noqa: BLE001 - a broken install is reported as no providers
        return []


def _onnxruntime_provider_status() -> list[dict[str, Any]]:
    """Each compiled-in provider, and whether its libraries load (and a session starts, on a GPU)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return []
    from enginekit.runtime.providers import onnxruntime_providers

    return [status.to_json() for status in onnxruntime_providers()]


def _tensorrt_modules() -> dict[str, dict[str, Any]]:
    """For each TensorRT family: does its module import, and at which version."""
    from enginekit.trt.backends import TRAITS

    modules: dict[str, dict[str, Any]] = {}
    for row in TRAITS.values():
        if row.family in modules:
            continue
        modules[row.family] = _import_version(row.module)
    return modules


def _import_version(module_name: str) -> dict[str, Any]:
    if importlib.util.find_spec(module_name) is None:
        return {"module": module_name, "version": None, "error": "not installed"}
    try:
        module = __import__(module_name)
    except Exception as exc:  # noqa: BLE001 - the wheel is there, its libraries are not
        return {"module": module_name, "version": None, "error": first_line(exc, 200)}
    return {"module": module_name, "version": str(getattr(module, "__version__", "0")), "error": None}


def _cache_facts() -> dict[str, Any]:
    from enginekit.cache import Cache

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
    from enginekit.errors import EnginekitError
    from enginekit.store.settings import current

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
    """One row per backend: torch, ONNX Runtime providers, and each TensorRT row of the traits table."""
    return [*_torch_rows(inv), *_onnxruntime_rows(inv), *_tensorrt_rows(inv)]


def _row(name: str, version: str | None, can_build: bool | None, can_run: bool, reason: str) -> dict[str, Any]:
    return {"name": name, "installed": version is not None, "version": version, "can_build": can_build,
            "can_run": can_run, "reason": reason}


def _torch_rows(inv: dict[str, Any]) -> list[dict[str, Any]]:
    version = inv["packages"].get("torch")
    gpu, cuda = inv.get("gpu"), inv.get("torch_cuda")
    cpu_reason = "eager PyTorch on the CPU" if version else "torch is not installed"
    cpu = _row("torch-cpu", version, None, version is not None, cpu_reason)
    if version is None:
        reason = "torch is not installed"
    elif cuda is None:
        reason = "torch is a CPU-only build"
    elif gpu is None:
        reason = f"torch is built for CUDA {cuda}, but this machine has no GPU"
    else:
        reason = f"torch CUDA {cuda} on {gpu['name']}"
    gpu_row = _row("torch-cuda", version, None, bool(version and cuda and gpu), reason)
    return [cpu, gpu_row]


def _onnxruntime_rows(inv: dict[str, Any]) -> list[dict[str, Any]]:
    providers = inv.get("onnxruntime_providers")
    packages = inv["packages"]
    version = packages.get("onnxruntime-gpu") or packages.get("onnxruntime")
    if providers is None:
        version = None
    cpu_ok = bool(providers) and "CPUExecutionProvider" in providers
    cpu = _row("onnxruntime-cpu", version, None, cpu_ok,
               "CPU provider" if cpu_ok else "onnxruntime is not installed (or does not load)")
    has_cuda = bool(providers) and "CUDAExecutionProvider" in providers
    status = {s["name"]: s for s in inv.get("onnxruntime_provider_status") or []}.get("CUDAExecutionProvider")
    loads = status is None or status["loads"] is not False  # not checked (older inventories): trust the list
    if not has_cuda:
        reason = "no CUDA provider: pip install onnxruntime-gpu"
    elif not loads:
        reason = f"CUDA provider compiled in but it does not load: {status['detail']}"
    elif inv.get("gpu") is None:
        detail = f" ({status['detail']})" if status else ""
        reason = f"CUDA provider installed, but this machine has no GPU{detail}"
    else:
        reason = f"CUDA provider on {inv['gpu']['name']}"
    return [cpu, _row("onnxruntime-cuda", version, None, has_cuda and loads and inv.get("gpu") is not None, reason)]


def _tensorrt_rows(inv: dict[str, Any]) -> list[dict[str, Any]]:
    from enginekit.trt.backends import TRAITS

    return [_tensorrt_row(row, inv) for row in TRAITS.values()]


def _tensorrt_row(row, inv: dict[str, Any]) -> dict[str, Any]:
    """Can this traits row build and run here? TensorRT needs the GPU for both; RTX only to run."""
    module = inv.get("tensorrt_modules", {}).get(row.family, {})
    version = module.get("version")
    if version is None:
        why = f"{row.module}: {module.get('error') or 'not installed'}; {row.pip_install}"
        return _row(row.name, None, False, False, why)
    if _major(version) not in row.majors:
        majors = "/".join(map(str, row.majors))
        return _row(row.name, None, False, False, f"{row.label} {version} is installed; this row is {majors}.x")
    gpu = inv.get("gpu")
    can_build = gpu is not None or not row.needs_gpu_to_build
    if gpu is None:
        run_reason = "this machine has no GPU"
        can_run = False
    elif row.supports_compute_capability_targets and gpu["compute_capability"] not in row.compute_capabilities:
        can_run = False
        run_reason = (f"{row.label} cannot run engines on compute capability {gpu['compute_capability']} "
                      f"(targets: {', '.join(row.compute_capabilities)})")
    else:
        can_run = True
        run_reason = f"runs on {gpu['name']} ({gpu['compute_capability']})"
    build_reason = ("builds ahead of time for chosen compute capabilities" if not row.needs_gpu_to_build
                    else "builds on this GPU" if gpu else "building needs a GPU")
    return _row(row.name, version, can_build, can_run, f"{build_reason}; {run_reason}")


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
    from enginekit.trt.backends import RTX_COMPUTE_CAPABILITIES

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
