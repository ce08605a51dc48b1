"""TensorRT timing caches kept in the cache: one entry per (backend and version, GPU), reused by every
build on that GPU.

TensorRT 10 and 11 time kernels on the GPU they build on and keep the timings in a timing cache; a
build that starts from earlier builds' timings skips timing what they timed (one cut a build from
108.6 s to 9.4 s: microsoft/onnxruntime PR 14767). TensorRT-RTX keeps none (its timing-cache calls
are no-ops): ``kept_timing_cache`` yields None for it and stores nothing.

The entry (kind ``timing-cache``, file ``timing.cache``) is keyed by the backend's name and version
and the GPU's name and compute capability: TensorRT refuses another version's cache, and another
GPU's timings are not this one's. A build works on a private copy, which Polygraphy loads
(``CreateConfig(load_timing_cache=)``) and saves with the new timings merged in
(``EngineBytesFromNetwork(save_timing_cache=)``); the copy then replaces the entry. Two builds on one
GPU at once start from the same entry: the second to finish merges the first one's timings into its
copy (under the entry's lock) before replacing it, so neither's are lost.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from enginekit import reporting
from enginekit.cache import Cache
from enginekit.hashing import key_for, sha256_file
from enginekit.fsutil import atomic_write_bytes
from enginekit.trt.flavours import Flavour, GpuInfo
from enginekit.trt.binding import capturing, trt_logger

KIND = "timing-cache"
FILE = "timing.cache"

Merge = Callable[[Flavour, Path, Path], bool]


def timing_cache_parts(flavour: Flavour, gpu: GpuInfo) -> dict:
    """The key of the timing cache kept for builds with ``flavour`` on ``gpu``."""
    return {"backend": {"name": flavour.name, "version": flavour.version}, "gpu": gpu.to_json()}


def merge_timing_caches(flavour: Flavour, into: Path, other: Path) -> bool:
    """Combine the timing cache ``other`` into the one at ``into`` (rewritten); False if TensorRT refused.

    Polygraphy merges only into the file a build saves to; this merges two builds' copies.
    """
    trt = flavour.module
    logger = trt_logger(trt)
    with capturing(logger):
        config = trt.Builder(logger).create_builder_config()
        merged = config.create_timing_cache(into.read_bytes())
        theirs = config.create_timing_cache(other.read_bytes())
        if merged is None or theirs is None or not merged.combine(theirs, False):
            return False
        atomic_write_bytes(into, bytes(memoryview(merged.serialize())))
    return True


@contextlib.contextmanager
def kept_timing_cache(cache: Cache, flavour: Flavour, gpu: GpuInfo | None,
                      merge: Merge = merge_timing_caches) -> Iterator[Path | None]:
    """A private copy of the timing cache kept for (``flavour``, ``gpu``), for one build to read and rewrite.

    The path does not exist when nothing is kept yet. When the block ends without an exception,
    what the build wrote replaces the entry. None (and nothing stored) where the backend keeps no
    timing cache or there is no GPU.
    """
    if not flavour.traits.has_timing_cache or gpu is None:
        yield None
        return
    parts = timing_cache_parts(flavour, gpu)
    key = key_for(parts)
    with tempfile.TemporaryDirectory(prefix="enginekit-timing-") as folder:
        work = Path(folder) / FILE
        with cache.lock(KIND, key):  # a replacement in progress moves the old file away
            found = cache.lookup(KIND, key)
            if found.entry is not None:
                shutil.copyfile(found.entry.file(FILE), work)
        loaded = found.entry.manifest["files"][FILE]["sha256"] if found.entry is not None else None
        reporting.note(f"timing cache for {gpu}: " + (f"entry {key[:10]}" if loaded else "none kept yet"), level=1)
        yield work
        if work.is_file() and work.stat().st_size:
            _publish(cache, parts, key, work, loaded, flavour, gpu, merge)


def _publish(cache: Cache, parts: dict, key: str, work: Path, loaded: str | None, flavour: Flavour,
             gpu: GpuInfo, merge: Merge) -> None:
    """Replace the entry with ``work``, first merging in what another build published meanwhile."""
    with cache.lock(KIND, key):
        current = cache.lookup(KIND, key)
        theirs = current.entry.manifest["files"][FILE]["sha256"] if current.entry is not None else None
        if theirs is not None and theirs != loaded and not merge(flavour, work, current.entry.file(FILE)):
            reporting.warning(f"timing cache for {gpu}: another build's new timings could not be merged; "
                              "this build's replace them")
        if sha256_file(work) == theirs:
            return

        def produce(tmp: Path) -> dict:
            shutil.copyfile(work, tmp / FILE)
            return {"bytes": work.stat().st_size}

        cache.get_or_create(KIND, parts, produce, force=True, subject=f"{flavour.label} on {gpu}")
    reporting.note(f"timing cache for {gpu}: kept ({work.stat().st_size / 1024:.0f} KiB)", level=1)
