"""The GPUs of this machine, through NVML (nvidia-ml-py), without importing torch or CUDA.

``gpus()`` lists every GPU CUDA would see (``CUDA_VISIBLE_DEVICES`` applied, in its order);
``gpu_info()`` is the first of them, the one an engine build or run uses. No driver, no NVML
library, or no GPU: an empty list and None, never an exception.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from enginekit.errors import CapabilityError, UsageError


@dataclass(frozen=True)
class GpuInfo:
    """One GPU: marketing name and compute capability ("8.9"); index and memory for reports."""

    name: str
    compute_capability: str
    index: int = field(default=0, compare=False)  # NVML's index (before CUDA_VISIBLE_DEVICES)
    memory_bytes: int | None = field(default=None, compare=False)
    uuid: str | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, str]:
        # What manifests and cache keys record: the name and compute capability only.
        return {"name": self.name, "compute_capability": self.compute_capability}

    def __str__(self) -> str:
        return f"{self.name} ({self.compute_capability})"


def _visible(devices: list[GpuInfo]) -> list[GpuInfo]:
    """Apply ``CUDA_VISIBLE_DEVICES`` (indices or UUID prefixes) as CUDA does: in its order,
    up to the first entry that names no GPU."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return devices
    chosen: list[GpuInfo] = []
    for item in (part.strip() for part in value.split(",")):
        if item.isdigit():
            match = [d for d in devices if d.index == int(item)]
        elif item and not item.startswith("-"):
            match = [d for d in devices if d.uuid and d.uuid.lower().startswith(item.lower())]
            match = match if len(match) == 1 else []
        else:
            match = []
        if not match or match[0].index in {c.index for c in chosen}:
            break  # CUDA stops at the first invalid entry
        chosen.append(match[0])
    return chosen


def _nvml_devices() -> list[GpuInfo]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, driver/library mismatch
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            try:
                memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except pynvml.NVMLError:
                memory = None
            found.append(GpuInfo(
                name=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                compute_capability=f"{major}.{minor}",
                index=index,
                memory_bytes=memory,
                uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            ))
        return found
    except Exception:  # noqa: BLE001 - a GPU that fell off the bus mid-query: report none
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


@functools.lru_cache(maxsize=1)
def gpus() -> tuple[GpuInfo, ...]:
    """Every GPU CUDA would see, in CUDA_VISIBLE_DEVICES order; empty without a GPU or driver."""
    return tuple(_visible(_nvml_devices()))


def gpu_info() -> GpuInfo | None:
    """The GPU CUDA would use (the first visible one); None if there is none."""
    found = gpus()
    return found[0] if found else None


gpu_info.cache_clear = gpus.cache_clear  # type: ignore[attr-defined]  # callers reset both as one


def check_device(device: str | None, what: str = "--device") -> None:
    """A ``--device`` as asked for: cpu, cuda or cuda:N (``UsageError`` otherwise), and a CUDA device only where
    this machine has a GPU (``CapabilityError``, exit 3: asked for, never the CPU instead)."""
    import re

    if device is None:
        return
    if not re.fullmatch(r"cpu|cuda(:[0-9]{1,3})?", device):
        raise UsageError(f"{what} {device!r}: expected cpu, cuda or cuda:N")
    if device.startswith("cuda") and gpu_info() is None:
        raise CapabilityError(f"{what} {device}: this machine has no GPU that CUDA can use (`enginekit doctor` "
                              "says why); leave it out, or give cpu")


def process_memory(pid: int | None = None) -> int | None:
    """Bytes of GPU memory process ``pid`` (default: this one) holds on the GPUs CUDA sees, through NVML;
    None where NVML, a driver or a GPU is missing, or the driver does not say."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    pid = os.getpid() if pid is None else pid
    total, found = 0, False
    try:
        for gpu in gpus():
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    total += int(proc.usedGpuMemory)
                    found = True
    except Exception:  # noqa: BLE001 - a driver that does not report per-process memory
        return None
    return total if found else 0
