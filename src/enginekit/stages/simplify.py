"""Graph simplification (onnxsim by default, onnxslim selectable), proven equal on ONNX Runtime
(by the one comparison, ``compare.comparison.compare``)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator
from pathlib import Path

import numpy as np

from enginekit.compare.comparison import Case, Comparison, Gates, GraphOutputs, compare
from enginekit.compare.parts import Tolerance
from enginekit.errors import ParityError, UsageError
from enginekit.onnx import runtime
from enginekit.onnx.graph import input_dims, load_model, save_model
from enginekit.shapes import Shape, format_shape
from enginekit.errors import first_line

TOOLS = ("onnxsim", "onnxslim")


@dataclass
class SimplifyReport:
    tool: str
    nodes_before: int
    nodes_after: int
    checked_shapes: list[Shape]
    max_rel_l2: float


Align = Callable[[dict, dict, dict], tuple[dict, dict]]


def simplify_onnx(src: Path, out: Path, *, tool: str = "onnxsim", check_shapes: list[Shape] | None = None,
                  rel_l2_limit: float = 1e-5, align: Align | None = None, own_export: bool = False) -> SimplifyReport:
    """Simplify ``src`` into ``out`` and check both compute the same on random inputs.

    ``align``: the family's ``parity_outputs`` (outputs of the two graphs, the graph's metadata ->
    the rows to compare side by side), for outputs whose rows near-equal scores may reorder.
    ``own_export``: ``src`` is enginekit's own export, so ``onnx.checker`` is skipped (ONNX Runtime
    loads it right after; a user's file is checked). The source's one ONNX Runtime session serves both
    that load check and the comparison."""
    if tool not in TOOLS:
        raise UsageError(f"unknown simplifier {tool!r}: choose {' or '.join(TOOLS)}")
    model = load_model(src, check=not own_export)
    shapes = check_shapes or default_check_shapes(model)
    fixed = check_shapes_at(model, ())
    if len(fixed) == 1:  # a static batch: every check runs at it
        shapes = list(dict.fromkeys((fixed[0][0], *shape[1:]) for shape in shapes))
    before = len(model.graph.node)
    source = _ort_session(src, "the graph")  # what ONNX Runtime cannot load cannot be proven equal after simplifying
    if tool == "onnxsim":
        import onnxsim

        with native_output_silenced():  # onnxsim's C++ core prints a warning per skipped node
            simplified, ok = onnxsim.simplify(model, check_n=0)
        if not ok:
            raise UsageError(f"onnxsim could not simplify {src}")
    else:
        import onnxslim

        simplified = onnxslim.slim(model)
    # Metadata is ours; keep it whatever the tool does with it.
    del simplified.metadata_props[:]
    simplified.metadata_props.extend(model.metadata_props)
    tmp = out.with_name(f".{out.name}.check")
    save_model(simplified, tmp)
    try:
        found = compare_graphs(source, tmp, shapes, align=align, rel_l2=rel_l2_limit,
                               metadata={p.key: p.value for p in model.metadata_props})
        worst = found.worst_rel_l2
        if not found.passed:
            raise ParityError(f"simplified graph differs from the original: rel L2 {worst:.2e} > {rel_l2_limit:.0e}")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return SimplifyReport(tool, before, len(simplified.graph.node), shapes, worst)


@contextmanager
def native_output_silenced() -> Iterator[None]:
    """Send what native code writes to stdout/stderr to /dev/null for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def default_check_shapes(model) -> list[Shape]:
    """The shapes the single image input is checked at: batch 1 and 2 where the batch is symbolic,
    else the graph's own (static) shape."""
    dims = input_dims(model)
    if len(dims) != 1:
        raise UsageError("simplify checks single-input graphs; this one has " + ", ".join(dims))
    (name, d), = dims.items()
    if not d:
        raise UsageError(f"input {name!r} has no declared shape: pass --input NxCxHxW to say which shape to check")
    if any(not isinstance(x, int) or x <= 0 for x in d[1:]):
        raise UsageError(
            f"input {name!r} has symbolic dims {d}: pass --input NxCxHxW to say which shape to check"
        )
    return check_shapes_at(model, tuple(d[1:]))


def check_shapes_at(model, sides: tuple[int, ...]) -> list[Shape]:
    """Batch 1 and 2 at ``sides`` (C, H, W ...), or only the batch the graph declares where it is fixed
    (a static-shape graph runs at its own batch, nothing else)."""
    dims = list(input_dims(model).values())
    batch = dims[0][0] if len(dims) == 1 and dims[0] else None
    if isinstance(batch, int) and batch > 0:
        return [(batch, *sides)]
    return [(1, *sides), (2, *sides)]


def _ort_session(path: Path, what: str):
    """A CPU session of ``path``; a graph ONNX Runtime cannot load (an opset it does not know, an
    operator no one registered) is a one-line UsageError naming ``what``."""
    try:
        return runtime.session(path)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
        if not type(exc).__module__.startswith("onnxruntime"):
            raise

        message = first_line(exc, 300).split(" failed:", 1)[-1].strip()
        raise UsageError(f"ONNX Runtime cannot load {what} {path.name}: {message}") from exc


def compare_graphs(a, b: Path, shapes: list[Shape], seed: int = 0, *, align: Align | None = None,
                   metadata: dict[str, str] | None = None, rel_l2: float = 1e-5) -> Comparison:
    """Graph ``b`` against graph ``a`` (a path, or a session over it) on random inputs at ``shapes``: every
    output whole (paired by ``align`` first, where given), each within ``rel_l2`` and finite, by the one
    comparison."""
    sa = _ort_session(a, "the graph") if isinstance(a, (str, Path)) else a
    sb = _ort_session(b, "the simplified graph")
    (name,) = [i.name for i in sa.get_inputs()]

    def run(session, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return runtime.run(session, feed)
        except Exception as exc:  # noqa: BLE001
            shape = format_shape(feed[name].shape)
            raise UsageError(f"cannot run the graph at {shape}: {str(exc).splitlines()[0][:200]}") from exc

    cases = []
    for i, shape in enumerate(shapes):
        feed = {name: np.random.default_rng(seed + i).random(shape, dtype=np.float32)}
        cases.append(Case(f"random {format_shape(shape)}", "random", feed, run(sa, feed)))
    outputs = GraphOutputs(tuple(o.name for o in sa.get_outputs()), Tolerance(rel_l2=rel_l2, cosine=None), align)
    return compare(lambda feed: run(sb, feed), cases, adapter=outputs, gates=Gates(outputs), precision="fp32",
                   metadata=metadata or {}, name=b.name, require_task=False)
