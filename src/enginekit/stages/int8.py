"""INT8 at the ONNX level: explicit Q/DQ nodes through ModelOpt, for strongly typed builds.

TensorRT 11 has no INT8 calibrator: what runs in INT8 is written into the graph as
QuantizeLinear/DequantizeLinear pairs whose scales come from calibration on ONNX Runtime
(``modelopt.onnx.quantization.quantize``).

Calibration ranges are kept as a TensorRT-style calibration cache (a header line, then
``tensor: <float32 scale as big-endian hex>``, scale = amax / 127). Quantizing from such a cache
does not calibrate again and writes the very bytes the calibrating run wrote. ModelOpt's own
``calibration_cache_path`` cannot give that: it still runs its calibrator (on random data when
none is given) and only overwrites the Q/DQ scales afterwards. So both runs here hand ModelOpt's
quantizer the same activation ranges, rebuilt from the float32 scales: the calibrating run turns
the calibrator's ranges into scales first, the cached run reads them from the file.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from enginekit import reporting
from enginekit.errors import UsageError
from enginekit.fsutil import atomic_write_text, read_text
from enginekit.precisions import names as precision_names
from enginekit.stages import int8_layout
from enginekit.stages.modelopt import (
    calibration_eps,
    calibrator_factory,
    check,
    installed,
    ort_int8_scale,
    quantize_shortcuts,
    shortcuts_allowed,
    symmetric_ranges,
    tensors_to_calibrate,
)
from enginekit.onnx.graph import get_metadata, input_dims, load_model, save_model, set_metadata
from enginekit.hashing import sha256_file
from enginekit.stages.fp16 import quiet_modelopt

# What ModelOpt calibrates INT8 with: histogram entropy (TensorRT's EntropyCalibration2 idea)
# or the absolute maximum. ModelOpt's own default is entropy.
CALIBRATION_METHODS = ("entropy", "max")
DEFAULT_METHOD = "entropy"
# Precision of what stays out of INT8. fp16 lets ModelOpt cast it to FP16 without the real-range
# checks of the FP16 stage (AutoCast keeps overflow-prone ops FP32 there): opt in per model.
HIGH_PRECISIONS = precision_names(quantized=False)

# TensorRT's calibrator names, as its caches' headers spell them.
_ALGORITHMS = {"entropy": "EntropyCalibration2", "max": "MinMaxCalibration"}
# The header's version field follows TensorRT 10's caches (major*10000 + minor*100 + patch).
# TensorRT 11 reads no cache, and ModelOpt's reader and this module's skip the field.
CACHE_TRT_VERSION = 100000
_HEADER = re.compile(r"^TRT-\d+-(?P<algorithm>\w+)$")
CALIBRATION_CACHE_LIMIT = 64 * 2**20  # a line per tensor: a few hundred kB for the largest graphs
_ENTRY = re.compile(r"^(?P<name>.+): (?P<hex>[0-9a-fA-F]{8})$")


@dataclass
class Int8Report:
    calibrated: bool  # False when the scales came from a calibration cache
    method: str
    n_qdq_nodes: int  # QuantizeLinear nodes in the output graph
    n_excluded: int  # graph nodes matched by the exclude patterns
    seconds: float
    cache_written: Path | None
    layout: str = "modelopt"  # "kept": rebuilt from a kept Q/DQ layout (no ModelOpt); "modelopt": ModelOpt's pass


# -- calibration cache files ---------------------------------------------------------------


def cache_header(method: str) -> str:
    """``TRT-100000-EntropyCalibration2`` and the like."""
    return f"TRT-{CACHE_TRT_VERSION}-{_ALGORITHMS[method]}"


def write_calibration_cache(path: Path, scales: dict[str, float], header: str) -> Path:
    """Write ``scales`` as a TensorRT calibration cache, atomically, tensors sorted by name."""
    path = Path(path)
    if "\n" in header or not header.startswith("TRT-"):
        raise ValueError(f"a calibration cache header is one line starting with TRT-, not {header!r}")
    lines = [header]
    for name in sorted(scales):
        if "\n" in name:
            raise ValueError(f"tensor name with a line break: {name!r}")
        lines.append(f"{name}: {struct.pack('>f', scales[name]).hex()}")
    return atomic_write_text(path, "\n".join(lines) + "\n")


def read_calibration_cache(path: Path) -> dict[str, float]:
    """Tensor name -> float32 scale from a TensorRT calibration cache; UsageError if unusable."""
    return _read_cache(Path(path))[1]


def _read_cache(path: Path) -> tuple[str, dict[str, float]]:
    """(calibrator name from the header, scales); every defect is a one-line UsageError."""
    if not path.exists():
        raise UsageError(f"calibration cache not found: {path}")
    try:
        lines = read_text(path, limit=CALIBRATION_CACHE_LIMIT, what="calibration cache").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
        raise UsageError(f"cannot read calibration cache {path}: {reason}") from exc
    header = _HEADER.match(lines[0].strip()) if lines else None
    if header is None:
        example = cache_header("entropy")
        raise UsageError(f"{path} is not a calibration cache: its first line should read like {example}")
    scales = {}
    for number, line in enumerate(lines[1:], start=2):
        if line.strip():
            name, scale = _parse_entry(line.rstrip("\r"), path, number)
            scales[name] = scale
    if not scales:
        raise UsageError(f"calibration cache {path} holds no tensor scales")
    return header["algorithm"], scales


def _parse_entry(line: str, path: Path, number: int) -> tuple[str, float]:
    entry = _ENTRY.match(line)
    if entry is None:
        raise UsageError(f"calibration cache {path}, line {number}: expected 'tensor: <8 hex digits>', "
                         f"got {line[:60]!r}")
    scale = struct.unpack(">f", bytes.fromhex(entry["hex"]))[0]
    if not (math.isfinite(scale) and scale > 0):
        raise UsageError(f"calibration cache {path}, line {number}: the scale of {entry['name']!r} is {scale}")
    return entry["name"], scale


# -- scales <-> activation ranges -------------------------------------------------------------


def _scale_of_range(tensor_data) -> float:
    """Calibrated range -> the scale ORT will write for it (amax / 127, the cache's unit)."""
    # MinMax gives 1-element arrays, entropy scalars: one per-tensor range either way.
    low, high = (np.asarray(v, np.float32).reshape(-1) for v in tensor_data.range_value)
    if np.isnan(low).any() or np.isnan(high).any():
        low, high = np.float32([0.0]), np.float32([448.0])  # what ModelOpt's range adjustment does
    return float(ort_int8_scale(max(np.abs(low).max(), np.abs(high).max())))


def _amax_for_scale(scale: float) -> np.float32:
    """A float32 amax from which ORT computes exactly ``scale`` (so the graph holds the cache's value)."""
    target = np.float32(scale)
    guess = np.float32(np.float64(target) * 127.0)
    for amax in (guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(0))):
        if ort_int8_scale(amax) == target:
            return amax
    return guess


def _ranges_from_scales(scales: dict[str, float]):
    """The activation ranges both runs hand the quantizer, in name order for identical graphs."""
    return symmetric_ranges({name: _amax_for_scale(scales[name]) for name in sorted(scales)})


# -- where the ranges come from: a calibrator, or a cache -------------------------------------


class _Calibrating:
    """Runs ModelOpt's calibrator and keeps the scales its ranges imply."""

    def __init__(self) -> None:
        self.scales: dict[str, float] = {}
        self.calibrated = False

    def calibrator(self, make_real: Callable, *args, **kwargs):
        return _RecordingCalibrator(make_real(*args, **kwargs), self)


class _RecordingCalibrator:
    def __init__(self, real, owner: _Calibrating) -> None:
        self.real, self.owner = real, owner

    def collect_data(self, reader) -> None:
        self.real.collect_data(reader)
        self.owner.calibrated = True

    def compute_data(self):
        ranges = self.real.compute_data()
        self.owner.scales = {name: _scale_of_range(ranges.data[name]) for name in ranges.data}
        return _ranges_from_scales(self.owner.scales)


class _FromCache:
    """Serves a cache's scales: no calibrator, no augmented model, no calibration session."""

    calibrated = False

    def __init__(self, cache: dict[str, float], path: Path) -> None:
        self.cache, self.path = cache, path
        self.scales: dict[str, float] = {}

    def calibrator(self, make_real: Callable, model, op_types_to_calibrate=None, **kwargs):
        # ModelOpt passes the nodes to quantize where ORT's factory takes op types.
        needed = tensors_to_calibrate(Path(model), op_types_to_calibrate or [])
        missing = sorted(needed - self.cache.keys())
        if missing:
            raise UsageError(
                f"calibration cache {self.path} lacks {len(missing)} of the {len(needed)} tensors this graph "
                f"quantizes (first: {missing[0]!r}): it was made for another graph or other exclusions"
            )
        # Only what a calibrator would have measured: a calibrating run hands over exactly this set.
        self.scales = {name: self.cache[name] for name in needed}
        return _FixedCalibrator(self.scales)


class _FixedCalibrator:
    def __init__(self, scales: dict[str, float]) -> None:
        self.scales = scales

    def collect_data(self, reader) -> None:
        """Nothing to run: the ranges are known."""

    def compute_data(self):
        return _ranges_from_scales(self.scales)


# -- inputs -----------------------------------------------------------------------------------


def _check_choices(method: str, high_precision: str) -> None:
    if method not in CALIBRATION_METHODS:
        raise UsageError(f"unknown calibration method {method!r}: choose {', '.join(CALIBRATION_METHODS)}")
    if high_precision not in HIGH_PRECISIONS:
        raise UsageError(f"unknown high precision {high_precision!r}: choose {', '.join(HIGH_PRECISIONS)}")


def _compile_patterns(patterns: Sequence[str]) -> list[re.Pattern]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise UsageError(f"bad exclude pattern {pattern!r}: {exc}") from exc
    return compiled


def _excluded_nodes(model, patterns: list[re.Pattern]) -> list[str]:
    """Node names matched from their start, as ModelOpt's nodes_to_exclude matches them."""
    return [n.name for n in model.graph.node if any(p.match(n.name) for p in patterns)]


def _input_dims(model, input_name: str, src: Path) -> list[int | str]:
    dims = input_dims(model)
    if input_name not in dims:
        raise UsageError(f"{src} has no input {input_name!r} (inputs: {', '.join(dims) or 'none'})")
    if len(dims) != 1:
        raise UsageError(f"INT8 calibration feeds one input; {src} has {len(dims)}: {', '.join(dims)}")
    return dims[input_name]


def _step_batch(dims: list[int | str]) -> int:
    """Images per calibration step: the graph's fixed batch, else one (as ModelOpt splits data)."""
    return dims[0] if isinstance(dims[0], int) and dims[0] > 0 else 1


def _check_calibration(calibration, dims: list[int | str], input_name: str) -> np.ndarray:
    if not isinstance(calibration, np.ndarray) or calibration.ndim != len(dims):
        got = getattr(calibration, "shape", type(calibration).__name__)
        raise UsageError(f"calibration data for {input_name!r} must be a {len(dims)}-d array, got {got}")
    for axis, (want, have) in enumerate(zip(dims, calibration.shape)):
        if axis and isinstance(want, int) and want > 0 and want != have:
            raise UsageError(f"calibration data has shape {calibration.shape}; {input_name!r} takes {dims}")
    step = _step_batch(dims)
    if calibration.shape[0] == 0 or calibration.shape[0] % step:
        raise UsageError(f"{calibration.shape[0]} calibration inputs do not fill batches of {step}")
    batch = np.ascontiguousarray(calibration, dtype=np.float32)
    if not np.isfinite(batch).all():
        raise UsageError("calibration data holds NaN or infinite values")
    return batch


def _probe_shape(dims, model, calibration, input_shape, src: Path) -> tuple[int, ...]:
    """Shape of one calibration step. ModelOpt runs the graph once at it to learn MatMul and
    attention sizes, which decide Q/DQ placement: a cached run must see the calibrating run's."""
    step = _step_batch(dims)
    if calibration is not None:
        return (step, *calibration.shape[1:])
    if input_shape is not None:
        return (step, *[int(d) for d in input_shape[1:]])
    if all(isinstance(d, int) and d > 0 for d in dims[1:]):
        return (step, *dims[1:])
    exported = get_metadata(model).get("export_shape")  # enginekit writes it on its own graphs
    if exported:
        return (step, *[int(d) for d in exported.split("x")[1:]])
    raise UsageError(f"{src} has dynamic input dims {dims}: pass the calibration shape (input_shape) with the cache")


# -- kept Q/DQ layouts (int8_layout) -----------------------------------------------------------

# What enginekit asks of ModelOpt's INT8 pass besides the per-call arguments: part of a layout's key,
# so that changing any of them (here or in _run_modelopt) can never reuse a layout made before.
MODELOPT_SETTINGS = {"quantize_mode": "int8", "passes": ["concat_elimination"], "per_channel": True,
                     "op_types_to_quantize": None, "op_types_to_exclude": None}


class LayoutStore(Protocol):
    """Where Q/DQ layouts are kept (the pipeline keeps them in the engine cache, kind ``int8-layout``).

    ``parts`` describes everything that decides the layout (``layout_parts``): equal parts, same layout.
    """

    def find(self, parts: dict) -> tuple[Path, dict] | None:
        """(the layout file, its description) kept for ``parts``, or None."""

    def keep(self, parts: dict, write: Callable[[Path], dict]) -> None:
        """Keep the layout ``write(folder)`` writes as ``folder/layout.onnx`` (returning its description)."""


def layout_parts(src: Path, input_name: str, method: str, exclude: Sequence[str], high_precision: str,
                 probe: Sequence[int]) -> dict:
    """Everything that decides where ModelOpt puts Q/DQ nodes in ``src`` and the weights' scales:
    the graph's bytes, the input, the calibration method and shape (ModelOpt sizes MatMuls and
    attention at it), exclusions, high precision, the settings enginekit passes, the execution
    providers it calibrates on, and the versions of ModelOpt, ONNX Runtime and onnx."""
    from importlib import metadata

    return {"stage": "int8-layout", "format": int8_layout.LAYOUT_FORMAT, "input": sha256_file(src),
            "input_name": input_name, "method": method, "exclude": list(exclude), "high_precision": high_precision,
            "calibration_shape": [int(d) for d in probe], "modelopt": MODELOPT_SETTINGS,
            "calibration_eps": calibration_eps(), "versions": {**installed(), "onnx": metadata.version("onnx")}}


def graph_scale(cache_scale: float) -> float:
    """The activation scale ModelOpt's graph holds for a calibration cache's scale (see _ranges_from_scales)."""
    return float(ort_int8_scale(_amax_for_scale(cache_scale)))


def _from_layout(found: tuple[Path, dict], model, scales: dict[str, float], cache_path: Path):
    """(the INT8 graph, the scales it used) from a kept layout and a cache; None when the layout is unusable."""
    info = int8_layout.LayoutInfo.from_json(found[1])
    if info is None:
        return None
    missing = sorted(set(info.calibrated) - scales.keys())
    if missing:
        raise UsageError(
            f"calibration cache {cache_path} lacks {len(missing)} of the {len(info.calibrated)} tensors this graph "
            f"quantizes (first: {missing[0]!r}): it was made for another graph or other exclusions"
        )
    needed = {name: scales[name] for name in info.calibrated}  # what ModelOpt's cached run hands over
    try:
        return int8_layout.apply(int8_layout.load(found[0]), info, model, needed, graph_scale), needed
    except (OSError, ValueError, KeyError):
        return None


def _keep_layout(layouts: LayoutStore, parts: dict, quantized, model, scales: dict[str, float]) -> None:
    described = int8_layout.describe(quantized, model, scales, graph_scale)
    if described is None:
        return
    layout, info = described

    def write(folder: Path) -> dict:
        int8_layout.save(layout, folder / int8_layout.LAYOUT_FILE)
        return info.to_json()

    layouts.keep(parts, write)


# -- the quantization ---------------------------------------------------------------------------


def quantize_int8(
    src: Path,
    out: Path,
    calibration: np.ndarray | None,
    input_name: str,
    *,
    method: str = DEFAULT_METHOD,
    exclude_nodes: Sequence[str] = (),
    calibration_cache: Path | None = None,
    write_cache: Path | None = None,
    input_shape: Sequence[int] | None = None,
    high_precision: str = "fp32",
    shortcuts: bool = True,
    layouts: LayoutStore | None = None,
) -> Int8Report:
    """Quantize ``src`` to INT8 with explicit Q/DQ nodes and write it to ``out``.

    ``calibration``: N x C x H x W float32, preprocessed as the model expects. With
    ``calibration_cache`` (a cache an earlier run wrote) nothing is calibrated, ``calibration``
    may be None, and ``out`` gets the bytes the calibrating run wrote for the same ``src`` and
    settings. For a graph with dynamic H/W, that needs the calibration shape: from
    ``calibration``, ``input_shape``, or the graph's own ``export_shape`` metadata.
    ``exclude_nodes``: regular expressions matched at the start of node names; those nodes stay
    out of INT8. ``write_cache``: where to write the calibration cache. ``shortcuts``: ModelOpt's
    pass with stages.modelopt's faster, same-result helpers (False: exactly as ModelOpt runs it).
    ``layouts``: where Q/DQ layouts are kept. With a calibration cache and a layout kept for the
    same graph and settings, the graph is rebuilt from it (ModelOpt's graph for that cache, without
    importing ModelOpt; not with ``shortcuts`` off); every ModelOpt pass keeps its layout there.
    """
    start = time.perf_counter()
    src, out = Path(src), Path(out)
    _check_choices(method, high_precision)
    patterns = _compile_patterns(exclude_nodes)
    cache = _cache_for(Path(calibration_cache), method) if calibration_cache is not None else None
    if cache is None and calibration is None:
        raise UsageError("INT8 needs calibration data or a calibration cache")
    reuse = layouts is not None and cache is not None and shortcuts and shortcuts_allowed()
    if not reuse:
        check()  # the ModelOpt / ONNX Runtime internals used below, before any work

    model = load_model(src)
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        raise UsageError(f"{src} already has Q/DQ nodes: quantize the FP32 graph")
    dims = _input_dims(model, input_name, src)
    batch = _check_calibration(calibration, dims, input_name) if calibration is not None else None
    probe = _probe_shape(dims, model, batch, input_shape, src)
    parts = layout_parts(src, input_name, method, exclude_nodes, high_precision, probe) if layouts else None
    found = layouts.find(parts) if reuse else None
    rebuilt = _from_layout(found, model, cache, Path(calibration_cache)) if found is not None else None
    if rebuilt is not None:  # the graph ModelOpt writes from this cache, without ModelOpt
        quantized, scales = rebuilt
        calibrated = False
    else:
        check()
        source = _FromCache(cache, Path(calibration_cache)) if cache is not None else _Calibrating()
        # A cached run feeds zeros: ModelOpt's shape probes need an input, and only its shape counts.
        feed = batch if cache is None else np.zeros(probe, np.float32)
        quantized = _run_modelopt(src, feed, input_name, method, list(exclude_nodes), high_precision, source,
                                  shortcuts)
        calibrated, scales = source.calibrated, source.scales
    n_qdq = sum(n.op_type == "QuantizeLinear" for n in quantized.graph.node)
    if n_qdq == 0 or not scales:
        raise UsageError(f"nothing in {src} was quantized: the exclude patterns and ModelOpt's rules leave no node")
    if layouts is not None and rebuilt is None:
        _keep_layout(layouts, parts, quantized, model, scales)
    _finish(quantized, model, method, exclude_nodes, probe, out)
    if write_cache is not None:
        write_calibration_cache(Path(write_cache), scales, cache_header(method))
    return Int8Report(
        calibrated=calibrated,
        method=method,
        n_qdq_nodes=n_qdq,
        n_excluded=len(_excluded_nodes(model, patterns)),
        seconds=time.perf_counter() - start,
        cache_written=Path(write_cache) if write_cache is not None else None,
        layout="kept" if rebuilt is not None else "modelopt",
    )


def _cache_for(path: Path, method: str) -> dict[str, float]:
    """A cache's scales, refused when another calibrator made them (the graph would claim ``method``)."""
    algorithm, scales = _read_cache(path)
    made_by = {v: k for k, v in _ALGORITHMS.items()}.get(algorithm)
    if made_by is not None and made_by != method:
        raise UsageError(f"calibration cache {path} was made by {made_by} calibration, not {method}")
    return scales


def _run_modelopt(src: Path, feed: np.ndarray, input_name: str, method: str, exclude: list[str],
                  high_precision: str, source, shortcuts: bool = True):
    """ModelOpt's INT8 pass in a scratch folder (it writes intermediate files beside its input)."""
    import onnx
    from modelopt.onnx.quantization import quantize
    from modelopt.onnx.quantization.calib_utils import CalibrationDataProvider

    quiet_modelopt()
    with tempfile.TemporaryDirectory(prefix="enginekit-int8-") as tmp:
        work, result = Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx"
        shutil.copyfile(src, work)
        reader = CalibrationDataProvider(str(work), {input_name: feed})
        # ORT's histogram calibrator prints its bin counts to stdout, ModelOpt's progress bars go
        # to stderr: neither belongs in enginekit's output; enginekit's own count of the inputs it ran does
        with reporting.progress(f"calibrate ({method})", len(feed)) as counted, \
                calibrator_factory(source.calibrator), quantize_shortcuts(shortcuts, output=result), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            reader = _Counted(reader, counted)
            quantize(
                str(work),
                quantize_mode="int8",
                calibration_method=method,
                calibration_data_reader=reader,
                calibration_eps=calibration_eps(),
                nodes_to_exclude=exclude or None,
                high_precision_dtype=high_precision,
                output_path=str(result),
                log_level="ERROR",
            )
        return onnx.load(str(result))


def _Counted(reader, progress):
    """``reader`` (a calibration data reader) counting what the calibrator reads into ``progress`` (``calibrate
    12/64``); a second pass over the inputs (a histogram method) counts on, the total grown to match."""
    from onnxruntime.quantization import CalibrationDataReader

    class Counted(CalibrationDataReader):
        def get_next(self):
            item = reader.get_next()
            if item is not None:
                if progress.done >= progress.total:
                    progress.total += progress.total
                progress.advance()
            return item

        def rewind(self):
            return reader.rewind()

        def __getattr__(self, name):  # everything else the calibrator asks of its reader
            return getattr(reader, name)

    return Counted()


def _finish(quantized, original, method: str, exclude: Sequence[str], probe: tuple[int, ...], out: Path) -> None:
    """Metadata of the source plus what INT8 did; shape annotations dropped; saved atomically."""
    # ModelOpt's value_info annotations are what made ONNX Runtime reject AutoCast's YOLO graph;
    # every consumer re-infers shapes anyway.
    del quantized.graph.value_info[:]
    del quantized.metadata_props[:]
    meta = get_metadata(original)
    meta.update({
        "precision": "int8",
        "int8_method": method,
        "int8_calibration_shape": "x".join(str(d) for d in probe),
    })
    if exclude:
        meta["int8_exclude"] = ",".join(exclude)
    set_metadata(quantized, meta)
    save_model(quantized, out)
