"""Shape and optimization-profile strings -> validated shapes.

Grammar (one ``--profile`` value is one TensorRT optimization profile):

    1x3x640x640                          static: min = opt = max
    1x3x640x640:8x3x640x640:16x3x640x640 min:opt:max
    images=1x3x640x640:...,mask=1x1x..   several named inputs, comma separated

Nothing here imports onnx or torch: the CLI validates flags before any heavy work.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from enginekit.errors import UsageError

Shape = tuple[int, ...]

# ASCII digits only: ``\d`` would also take other scripts' digits, which int() accepts.
_SHAPE_RE = re.compile(r"^[0-9]+(x[0-9]+)*$")

#: Largest dimension TensorRT and ONNX Runtime index with (int32).
INT32_MAX = 2**31 - 1
#: Most dimensions a shape may have (TensorRT's limit).
MAX_RANK = 8
#: Largest single tensor (bytes) enginekit allocates for one input unless told otherwise.
DEFAULT_MAX_TENSOR_BYTES = 16 * 2**30
MAX_TENSOR_BYTES_ENV = "ENGINEKIT_MAX_TENSOR_BYTES"


def parse_shape(text: str, *, what: str = "shape", itemsize: int = 4) -> Shape:
    """``"1x3x640x640"`` -> ``(1, 3, 640, 640)``; every dim a positive integer that fits int32,
    and one tensor of the shape (``itemsize`` bytes an element) fits in memory."""
    text = str(text).strip()
    shown = text if len(text) <= 80 else text[:77] + "..."
    if not _SHAPE_RE.match(text):
        raise UsageError(
            f"malformed {what} {shown!r}: expected positive integers joined by 'x', like 1x3x640x640"
        )
    tokens = text.split("x")
    if len(tokens) > MAX_RANK:
        raise UsageError(f"malformed {what} {shown!r}: {len(tokens)} dimensions, at most {MAX_RANK}")
    for token in tokens:
        # Compare as text first: int() refuses numbers of more than 4300 digits.
        if len(token.lstrip("0")) > 10 or int(token) > INT32_MAX:
            big = token if len(token) <= 24 else token[:21] + "..."
            raise UsageError(
                f"{what} {shown}: dimension {big} is larger than {INT32_MAX} (the int32 limit of "
                "TensorRT and ONNX Runtime)"
            )
    dims = tuple(int(d) for d in tokens)
    if any(d <= 0 for d in dims):
        raise UsageError(f"malformed {what} {text!r}: every dimension must be positive")
    check_tensor_memory(dims, what=what, itemsize=itemsize)
    return dims


def max_tensor_bytes() -> int:
    """The largest single input tensor enginekit allocates: ``ENGINEKIT_MAX_TENSOR_BYTES`` (bytes)
    if set, else 16 GiB; and never more than the memory available now, where that is known."""
    limit = DEFAULT_MAX_TENSOR_BYTES
    raw = os.environ.get(MAX_TENSOR_BYTES_ENV, "").strip()
    if raw:
        try:
            limit = int(raw)
        except ValueError as cause:
            raise UsageError(f"{MAX_TENSOR_BYTES_ENV}={raw!r} is not a number of bytes") from cause
    available = available_memory()
    if available is not None:
        limit = min(limit, available)
    return limit


def available_memory() -> int | None:
    """Bytes of memory available to allocate now (psutil, else /proc/meminfo), or None."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil is optional
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_tensor_memory(shape: Shape, *, what: str = "shape", itemsize: int = 4) -> int:
    """Refuse (``UsageError``, one line naming the value) a shape whose one tensor of
    ``itemsize``-byte elements would not fit; return its size in bytes otherwise.

    An estimate made before allocating anything: the real run needs this and more (the model's
    activations), so a shape refused here could never have run.
    """
    nbytes = math.prod(shape) * itemsize
    limit = max_tensor_bytes()
    if nbytes > limit:
        raise UsageError(
            f"{what} {format_shape(shape)} needs {_gib(nbytes)} for one float{itemsize * 8} tensor, "
            f"more than the {_gib(limit)} enginekit may allocate here (available memory, or "
            f"{MAX_TENSOR_BYTES_ENV})"
        )
    return nbytes


def check_batch(batch: int, sample_shape: Shape, *, what: str = "--batch", itemsize: int = 4) -> None:
    """A batch size against int32 and memory: ``batch`` copies of one ``sample_shape`` (CHW)."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise UsageError(f"{what} {batch!r}: expected a positive integer")
    if batch > INT32_MAX:
        raise UsageError(f"{what} {batch}: larger than {INT32_MAX} (the int32 limit)")
    check_tensor_memory((batch, *sample_shape), what=what, itemsize=itemsize)


def format_shape(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


@dataclass(frozen=True)
class InputRange:
    """min/opt/max shapes of one input within one optimization profile."""

    min: Shape
    opt: Shape
    max: Shape

    @property
    def is_static(self) -> bool:
        return self.min == self.opt == self.max

    def shapes(self) -> dict[str, Shape]:
        return {"min": self.min, "opt": self.opt, "max": self.max}

    def __str__(self) -> str:
        if self.is_static:
            return format_shape(self.opt)
        return ":".join(format_shape(s) for s in (self.min, self.opt, self.max))


@dataclass(frozen=True)
class Profile:
    """One optimization profile: an input name (None = the model's only input) -> range."""

    inputs: dict[str | None, InputRange] = field(default_factory=dict)

    def to_json(self) -> dict[str, dict[str, list[int]]]:
        return {
            str(name): {k: list(v) for k, v in rng.shapes().items()}
            for name, rng in self.inputs.items()
        }

    def __str__(self) -> str:
        return ",".join(
            (f"{name}={rng}" if name is not None else str(rng)) for name, rng in self.inputs.items()
        )

    def bind(self, input_names: list[str]) -> "Profile":
        """Give an unnamed range the model's single input name; refuse unknown names."""
        bound: dict[str | None, InputRange] = {}
        for name, rng in self.inputs.items():
            if name is None:
                if len(input_names) != 1:
                    raise UsageError(
                        f"profile {self} names no input, but the model has {len(input_names)} inputs "
                        f"({', '.join(input_names)}): write name=min:opt:max for each"
                    )
                name = input_names[0]
            if name not in input_names:
                raise UsageError(
                    f"profile names input {name!r}, but the model's inputs are {', '.join(input_names)}"
                )
            bound[name] = rng
        missing = [n for n in input_names if n not in bound]
        if missing:
            raise UsageError(f"profile {self} gives no shape for input(s) {', '.join(missing)}")
        return Profile(bound)


def parse_range(text: str) -> InputRange:
    parts = text.strip().split(":")
    if len(parts) == 1:
        s = parse_shape(parts[0], what="profile shape")
        return InputRange(s, s, s)
    if len(parts) != 3:
        raise UsageError(
            f"malformed profile {text!r}: expected one shape (1x3x640x640) or min:opt:max"
        )
    mn, opt, mx = (parse_shape(p, what="profile shape") for p in parts)
    if not (len(mn) == len(opt) == len(mx)):
        raise UsageError(f"malformed profile {text!r}: min, opt and max have different ranks")
    for i, (a, b, c) in enumerate(zip(mn, opt, mx)):
        if not (a <= b <= c):
            raise UsageError(
                f"malformed profile {text!r}: dimension {i} must satisfy min <= opt <= max ({a}, {b}, {c})"
            )
    return InputRange(mn, opt, mx)


def parse_profile(text: str) -> Profile:
    """Parse one ``--profile`` value."""
    text = text.strip()
    if not text:
        raise UsageError("empty profile: expected a shape like 1x3x640x640 or min:opt:max")
    inputs: dict[str | None, InputRange] = {}
    for chunk in text.split(","):
        name: str | None = None
        if "=" in chunk:
            name, chunk = chunk.split("=", 1)
            name = name.strip()
            if not name:
                raise UsageError(f"malformed profile {text!r}: empty input name before '='")
        if name in inputs:
            raise UsageError(f"malformed profile {text!r}: input {name or '(unnamed)'} given twice")
        inputs[name] = parse_range(chunk)
    if None in inputs and len(inputs) > 1:
        raise UsageError(f"malformed profile {text!r}: with several inputs, name each one (name=shape)")
    return Profile(inputs)


def nearest_multiples(value: int, multiple: int) -> tuple[int, int]:
    lower = max(multiple, (value // multiple) * multiple)
    upper = lower if value % multiple == 0 else lower + multiple
    if lower == value:
        return value, value
    return lower, upper


@dataclass(frozen=True)
class InputConstraint:
    """What a model family requires of its image input (NCHW)."""

    name: str
    channels: int
    spatial_multiple: int  # every H/W must be a multiple of this (14 for DINOv2 patches)
    model_label: str  # for messages

    def check(self, shape: Shape, *, what: str = "input", shown: str | None = None) -> None:
        """``shown``: how the user gave the size (``--imgsz 1080x1920``), which messages name in place of
        ``what`` and the shape."""
        said = shown or f"{what} {format_shape(shape)}"
        if len(shape) != 4:
            raise UsageError(
                f"{what} {format_shape(shape)} has rank {len(shape)}; {self.model_label} takes NxCxHxW"
            )
        if shape[1] != self.channels:
            raise UsageError(
                f"{what} {format_shape(shape)} has {shape[1]} channels; {self.model_label} takes {self.channels}"
            )
        for side in shape[2:]:
            if side % self.spatial_multiple:
                lo, hi = nearest_multiples(side, self.spatial_multiple)
                raise UsageError(
                    f"{said}: {side} is not a multiple of {self.spatial_multiple} "
                    f"for {self.model_label} (nearest: {lo} or {hi})"
                )

    def check_range(self, rng: InputRange, *, what: str = "profile") -> None:
        for s in (rng.min, rng.opt, rng.max):
            self.check(s, what=what)


def check_against_onnx_input(
    name: str, rng: InputRange, onnx_dims: list[int | str | None]
) -> None:
    """Rank and fixed dims of a profile must agree with the ONNX input declaration."""
    if len(rng.opt) != len(onnx_dims):
        raise UsageError(
            f"profile {rng} for input {name!r} has rank {len(rng.opt)}, the ONNX input has rank {len(onnx_dims)}"
        )
    for i, dim in enumerate(onnx_dims):
        if isinstance(dim, int) and dim > 0:
            for label, s in rng.shapes().items():
                if s[i] != dim:
                    raise UsageError(
                        f"profile {rng} for input {name!r}: {label} dimension {i} is {s[i]}, "
                        f"but the ONNX fixes it at {dim}"
                    )


# --------------------------------------------------------------------------- binding profiles


def bind_to_model(parsed: list[Profile], adapter) -> tuple[list[Profile], Shape, Shape]:
    """Profiles for a model name: defaults, the family's constraints, and the shape to export at.

    Returns (bound profiles, the first profile's opt shape, the export shape). ``adapter`` is the
    family's (``families.resolve``): its input name, default input, constraint and dynamic axes.
    """
    if not parsed:
        s = adapter.default_input
        parsed = [Profile({None: InputRange(s, s, s)})]
    bound = [p.bind([adapter.input_name]) for p in parsed]
    ranges = [p.inputs[adapter.input_name] for p in bound]
    for rng in ranges:
        adapter.constraint.check_range(rng, what="profile")
    if 2 in adapter.dynamic_axes.get(adapter.input_name, {}):  # dynamic H/W
        opt = ranges[0].opt
        export_shape = (1, *opt[1:]) if getattr(adapter, "export_at_profile_size", False) else adapter.default_input
    else:
        sides = {s[2:] for r in ranges for s in (r.min, r.opt, r.max)}
        if len(sides) != 1:
            raise UsageError(
                f"{adapter.variant} exports with fixed H/W: every profile shape must share one H x W "
                f"(got {', '.join('x'.join(map(str, s)) for s in sorted(sides))})"
            )
        (hw,) = sides
        export_shape = (1, adapter.default_input[1], *hw)
    return bound, ranges[0].opt, export_shape


def bind_to_inputs(parsed: list[Profile], dims: dict[str, list], adapter,
                   file_name: str) -> tuple[list[Profile], Shape]:
    """Profiles for an ONNX file whose inputs are ``dims`` (name -> dims, from the graph).

    Returns (bound profiles, the first input's opt shape of the first profile).
    """
    if not parsed:
        if any(not isinstance(d, int) for ds in dims.values() for d in ds):
            raise UsageError(f"{file_name} has dynamic inputs: give --profile min:opt:max (or NxCxHxW)")
        parsed = [parse_profile(",".join(f"{n}={'x'.join(map(str, d))}" for n, d in dims.items()))]
    bound = [p.bind(list(dims)) for p in parsed]
    for profile in bound:
        for name, rng in profile.inputs.items():
            check_against_onnx_input(name, rng, dims[name])
            if adapter is not None and name == adapter.input_name:
                adapter.constraint.check_range(rng, what="profile")
    first = bound[0].inputs[next(iter(bound[0].inputs))]
    return bound, first.opt
