"""A stand-in for nvidia-ml-py with two GPUs (tests/test_cli_json.py puts this folder first on PYTHONPATH)."""
_GPUS = [("NVIDIA H100 80GB HBM3", (9, 0), "GPU-aaaa1111", 85899345920), ("NVIDIA L4", (8, 9), "GPU-bbbb2222", 24152899584)]


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_GPUS)


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return _GPUS[handle][0]


def nvmlDeviceGetCudaComputeCapability(handle):
    return _GPUS[handle][1]


def nvmlDeviceGetUUID(handle):
    return _GPUS[handle][2]


def nvmlDeviceGetMemoryInfo(handle):
    return type("Memory", (), {"total": _GPUS[handle][3]})()
