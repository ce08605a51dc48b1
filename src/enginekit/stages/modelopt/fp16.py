"""AutoCast (FP16), the same graph in less time: ``autocast()`` swaps in, for the length of one call, faster versions of the parts of ModelOpt's AutoCast where its time goes (its reference run's range statistics in the graph, its cast clean-up), each giving what the original gives.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.stages.modelopt.versions import MODELOPT_SERIES, _in_series, installed, missing_internal, swapped


_AUTOCAST_LOCK = threading.Lock()  # the AutoCast swap: one conversion at a time


AUTOCAST_INTERNALS = (
    ("modelopt.onnx.autocast.referencerunner", "ReferenceRunner"),
    ("modelopt.onnx.autocast.referencerunner", "TensorStats"),
    ("modelopt.onnx.autocast.precisionconverter", "PrecisionConverter"),
)


_FLOAT_TYPES = (1, 11)  # onnx.TensorProto.FLOAT, DOUBLE: what ORT's CPU reductions take here


_PROTOBUF_LIMIT = 2**31 - 2**24  # leave room below protobuf's 2 GB for the added nodes


SHORTCUTS_ENV = "ENGINEKIT_MODELOPT_SHORTCUTS"  # "0": ModelOpt's own way throughout (to compare, or to rule out)


def shortcuts_allowed() -> bool:
    """False when ``$ENGINEKIT_MODELOPT_SHORTCUTS`` is 0 (or off/false/no)."""
    return os.environ.get(SHORTCUTS_ENV, "").strip().lower() not in ("0", "off", "false", "no")


@dataclass
class AutocastRun:
    """What ``autocast()`` did: how AutoCast's reference ranges were obtained."""

    shortcuts: bool
    reference: list[str] = field(default_factory=list)  # "statistics" or "modelopt: <why>", per run


@functools.lru_cache(maxsize=1)
def _autocast_problem() -> str | None:
    """Why the AutoCast shortcuts do not apply to what is installed; None when they do."""
    versions = installed()
    if not _in_series(versions.get("nvidia-modelopt"), MODELOPT_SERIES):
        return f"written for nvidia-modelopt {' or '.join(MODELOPT_SERIES)}, not {versions.get('nvidia-modelopt')}"
    missing = missing_internal(AUTOCAST_INTERNALS)
    if missing is not None:
        return missing
    from modelopt.onnx.autocast.precisionconverter import PrecisionConverter
    from modelopt.onnx.autocast.referencerunner import ReferenceRunner

    from modelopt.onnx import utils as onnx_utils

    for owner, name in ((ReferenceRunner, "run"), (ReferenceRunner, "_load_inputs"),
                        (PrecisionConverter, "_cleanup_no_consumer_nodes"), (onnx_utils, "remove_redundant_casts"),
                        (onnx_utils, "_is_same_type_cast"), (onnx_utils, "get_cast_to_type"),
                        (onnx_utils, "_convert_constant_values"), (onnx_utils, "_build_tensor_type_map")):
        if not callable(vars(owner).get(name)):
            return f"{getattr(owner, '__name__', owner)}.{name} is missing"
    return None


@contextlib.contextmanager
def autocast(shortcuts: bool = True) -> Iterator[AutocastRun]:
    """The context AutoCast runs in: its control-flow fix always, its shortcuts when asked.

    With ``shortcuts``, on the ModelOpt release they were written for: the reference ranges come
    from ``range_statistics`` (falling back to ModelOpt's own run whenever it does not apply) and
    the dead-cast sweep after conversion is linear instead of quadratic. The converted graph is
    the one ModelOpt's own path writes (tests/test_fp16_autocast.py compares them byte for byte).
    """
    run = AutocastRun(shortcuts=bool(shortcuts) and shortcuts_allowed() and _autocast_problem() is None)
    try:
        from modelopt.onnx.autocast.precisionconverter import PrecisionConverter
        from modelopt.onnx.autocast.referencerunner import ReferenceRunner
    except ImportError:
        yield run
        return
    patches: list[tuple[object, str, Callable]] = []  # (class or module, attribute, replacement)
    subgraph = getattr(PrecisionConverter, "_convert_subgraph_precision", None)
    if subgraph is not None:
        patches.append((PrecisionConverter, "_convert_subgraph_precision", _stable_subgraph(subgraph)))
    if run.shortcuts:
        from modelopt.onnx import utils as onnx_utils

        patches.append((ReferenceRunner, "run", _reference_run(ReferenceRunner.run, run)))
        patches.append((PrecisionConverter, "_cleanup_no_consumer_nodes", _cleanup_no_consumer_nodes))
        patches.append((onnx_utils, "remove_redundant_casts", _remove_redundant_casts))
    with swapped(patches, _AUTOCAST_LOCK):
        yield run


def _stable_subgraph(original: Callable) -> Callable:
    """Let AutoCast convert graphs holding a Loop or If (graphs ending in NMS hold one per image).

    AutoCast 0.47 keys its decision for each node of a control-flow body by ``id(node)``, over
    several passes of ``for node in subgraph.node``; protobuf makes a new Python object for a node
    each time the last one is dropped, so a later pass misses (``KeyError``). Holding every body
    node for the length of the call keeps one object, and so one id, per node.
    """

    def convert(self, subgraph, *args, **kwargs):
        alive = list(subgraph.node)  # noqa: F841 - held, not read
        return original(self, subgraph, *args, **kwargs)

    return convert


def _cleanup_no_consumer_nodes(self) -> None:
    """``PrecisionConverter._cleanup_no_consumer_nodes`` of 0.47, with the consumers looked up once.

    The original asks ``get_consumer_nodes`` (a scan of every node) for every output of every
    node: quadratic, ~7 s on Depth-Anything-V2. Same rule: a node goes when none of its outputs
    is a graph output or an input of a node of the main graph (inputs of control-flow bodies do
    not count, as there), all decided before any is removed.
    """
    network_outputs = {o.name for o in self.model.graph.output}
    consumed = {name for node in self.model.graph.node for name in node.input}
    doomed = [node for node in self.model.graph.node
              if not any(out in network_outputs or out in consumed for out in node.output)]
    for node in doomed:
        self.model.graph.node.remove(node)


class _Wiring:
    """Which main-graph nodes read and write each tensor, kept current as names are rewired.

    ``consumers(name)`` and ``producers(name)`` answer as ModelOpt's ``get_consumer_nodes`` and
    ``get_producer_nodes`` do (graph order, each node once) without scanning the graph.
    """

    def __init__(self, graph) -> None:
        self.nodes = list(graph.node)  # wrappers stay valid: no node is added or removed meanwhile
        self.position = {id(node): i for i, node in enumerate(self.nodes)}
        self.readers: dict[str, set[int]] = {}
        self.writers: dict[str, set[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.input:
                self.readers.setdefault(name, set()).add(i)
            for name in node.output:
                self.writers.setdefault(name, set()).add(i)

    def consumers(self, name: str) -> list:
        return [self.nodes[i] for i in sorted(self.readers.get(name, ()))]

    def producers(self, name: str) -> list:
        return [self.nodes[i] for i in sorted(self.writers.get(name, ()))]

    def set_input(self, node, slot: int, name: str) -> None:
        self._rename(node, node.input, slot, name, self.readers)

    def set_output(self, node, slot: int, name: str) -> None:
        self._rename(node, node.output, slot, name, self.writers)

    def _rename(self, node, names, slot: int, name: str, index: dict[str, set[int]]) -> None:
        i, old = self.position[id(node)], names[slot]
        names[slot] = name
        if old not in names:
            index[old].discard(i)
        index.setdefault(name, set()).add(i)


def _remove_redundant_casts(onnx_model):
    """``modelopt.onnx.utils.remove_redundant_casts`` of 0.47 on an index of who reads what.

    The original scans the whole graph for consumers and producers several times per Cast (about
    2 s on Depth-Anything-V2). Same steps in the same order: same-type casts, then sequential
    casts, then Constant->Cast folds are bypassed as met (bypassed casts stay in the graph, and so
    among the readers and writers, until all are removed at the end, as there).
    """
    import onnx
    from modelopt.onnx import utils as onnx_utils

    type_map = onnx_utils._build_tensor_type_map(onnx_model)
    wiring = _Wiring(onnx_model.graph)
    outputs = {o.name for o in onnx_model.graph.output}
    tensor = onnx.TensorProto
    order = [tensor.DOUBLE, tensor.FLOAT, tensor.FLOAT16, tensor.BFLOAT16]  # widest first, as there
    doomed = []
    for node in wiring.nodes:
        if node.op_type != "Cast":
            continue
        if onnx_utils._is_same_type_cast(onnx_model, node, type_map) or _sequential_cast(node, wiring, order):
            doomed.append(node)
            _bypass_cast(node, wiring, outputs)
            continue
        producers = wiring.producers(node.input[0])
        if len(producers) == 1 and producers[0].op_type == "Constant" \
                and len(wiring.consumers(producers[0].output[0])) == 1:
            doomed.append(node)
            onnx_utils._convert_constant_values(onnx_model, producers[0], node)
            _bypass_cast(node, wiring, outputs)
    for node in doomed:
        onnx_model.graph.node.remove(node)
    return onnx_model


def _sequential_cast(node, wiring: _Wiring, order: list[int]) -> bool:
    """ModelOpt's ``_is_sequential_cast``: the only Cast reading this one's output widens no further."""
    from modelopt.onnx.utils import get_cast_to_type

    casts = [n for n in wiring.consumers(node.output[0]) if n.op_type == "Cast"]
    if len(casts) != 1:
        return False
    first, second = get_cast_to_type(node), get_cast_to_type(casts[0])
    return first in order and second in order and order.index(first) <= order.index(second)


def _bypass_cast(node, wiring: _Wiring, outputs: set[str]) -> None:
    """ModelOpt's ``_bypass_cast_node``, rewiring through ``wiring``."""
    assert len(node.input) == 1 and len(node.output) == 1
    source, target = node.input[0], node.output[0]
    if target in outputs:  # keep the graph output's name: the producer writes it directly
        for producer in wiring.producers(source):
            for slot, name in enumerate(producer.output):
                if name == source:
                    wiring.set_output(producer, slot, target)
                    readers = wiring.consumers(name)
                    if len(readers) > 1:
                        for reader in readers:
                            for k, read in enumerate(reader.input):
                                if read == name:
                                    wiring.set_input(reader, k, target)
    else:
        for reader in wiring.consumers(target):
            for k, read in enumerate(reader.input):
                if read == target:
                    wiring.set_input(reader, k, source)


def _reference_run(original: Callable, record: AutocastRun) -> Callable:
    def run(self, inputs=None):
        why = _statistics_refused(self, inputs)
        if why is None:
            try:
                stats = range_statistics(self.model, self._load_inputs(inputs), self.providers)
            except Exception as exc:  # noqa: BLE001 - ModelOpt's own run is the reference
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            else:
                record.reference.append("statistics")
                return stats
        record.reference.append(f"modelopt: {why}")
        return original(self, inputs)

    return run


def _statistics_refused(runner, inputs) -> str | None:
    """Why ``range_statistics`` would not reproduce this ReferenceRunner's run; None when it does."""
    if not isinstance(inputs, str):
        return "random inputs (Polygraphy makes them)"
    if list(runner.providers) != ["CPUExecutionProvider"]:
        return f"providers {runner.providers}"
    model = runner.model
    if any(node.domain not in ("", "ai.onnx") for node in model.graph.node):
        return "custom or contrib operators"
    if any(init.data_location == 1 for init in model.graph.initializer):  # TensorProto.EXTERNAL
        return "external data"
    if model.ByteSize() > _PROTOBUF_LIMIT:
        return "model too large for one protobuf"
    return None


def marked_tensor_names(model) -> list[str]:
    """The tensors ``ModifyOutputs(MARK_ALL)`` of Polygraphy makes outputs (``all_tensor_names``):
    every named output of a main-graph node but a Constant's, once, in graph order."""
    names = dict.fromkeys(out for node in model.graph.node if node.op_type != "Constant" for out in node.output if out)
    return list(names)


def range_statistics(model, batches: Sequence[dict[str, np.ndarray]], providers: Sequence) -> dict:
    """What ``ReferenceRunner.run`` returns for ``batches``: a ``TensorStats`` per tensor, same figures.

    ModelOpt's run makes every tensor a graph output (``ModifyOutputs(MARK_ALL)``) and runs the
    graph on ONNX Runtime with Polygraphy's session options. Here ONNX Runtime optimizes that very
    graph in the same way and writes the optimized graph out, so its kernels are the ones ModelOpt's
    run executes (fusions included: which happen depends on what is a graph output). That graph
    then runs unoptimized with each float tensor reduced in place (ReduceMax, ReduceMin, ReduceSum
    and Shape) instead of returned, so nothing is copied out. Max and min are exact; the sum tells
    whether a tensor holds NaN (ONNX Runtime's max and min may skip NaN, numpy's do not), and a
    batch whose sum is not finite is fetched whole and measured as ModelOpt measures it. Tensors
    of other types (shapes, indices, masks: small) are fetched whole.
    """
    import copy
    import tempfile

    import onnx
    import onnxruntime as ort
    from modelopt.onnx.autocast.referencerunner import TensorStats

    names = marked_tensor_names(model)
    marked = copy.deepcopy(model)
    del marked.graph.value_info[:]  # as ModelOpt's clear_stale_value_info does (no plugins here)
    del marked.graph.output[:]
    marked.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)

    def options(level=None):
        opts = ort.SessionOptions()
        threads = len(os.sched_getaffinity(0))  # Polygraphy's SessionFromOnnx
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads
        if level is not None:
            opts.graph_optimization_level = level
        return opts

    with tempfile.TemporaryDirectory(prefix="enginekit-autocast-") as tmp:
        opts = options()
        opts.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        opts.log_severity_level = 3  # its note that NCHWc layouts are machine-specific: this one only
        # This session only optimizes and writes the graph; packing weights for kernels that never run
        # is wasted (~1 s on Depth-Anything-V2) and changes nothing in the written graph.
        opts.add_session_config_entry("session.disable_prepacking", "1")
        ort.InferenceSession(marked.SerializeToString(), opts, providers=list(providers))
        del marked
        optimized = onnx.load(opts.optimized_model_filepath)

    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in (*optimized.graph.value_info, *model.graph.value_info, *model.graph.input,
                        *model.graph.output) if vi.type.HasField("tensor_type")}
    produced = {out for node in optimized.graph.node for out in node.output}
    reduced = [n for n in names if types.get(n) in _FLOAT_TYPES and n in produced]
    inputs = {i.name for i in optimized.graph.input} - {i.name for i in optimized.graph.initializer}

    def session(fetch: set[str]):
        plan = _reducing_graph(optimized, reduced, fetch, inputs)
        opts = options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        # Each reduction as soon as its tensor is made (node order breaks ties), so tensors are freed as
        # in a plain run; ONNX Runtime's default order runs them late, holding every tensor (6.7 GB
        # instead of 2.3 GB at peak on Depth-Anything-V2 at 518x518). The order changes no kernel.
        opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        return ort.InferenceSession(plan.graph.SerializeToString(), opts, providers=list(providers)), plan

    fetched = set(names).difference(reduced)
    sess, plan = session(fetched)
    per_batch: list[dict] = []
    suspects: set[str] = set()
    for feed in batches:
        values = dict(zip(plan.outputs, sess.run(plan.outputs, dict(feed))))
        figures = {name: _figures(np.asarray(array)) for name, array in feed.items()}
        measured = {}
        for name in names:
            if name in fetched:
                measured[name] = _figures(values[name])
            elif name in plan.reduced:
                high, low, total, shape = (values[f"{name}{suffix}"] for suffix in _SUFFIXES)
                if not np.isfinite(total):
                    suspects.add(name)
                measured[name] = _reduced_figures(low, high, tuple(int(d) for d in shape))
        for name, source in plan.derived.items():  # in graph order: a source comes first
            shape = tuple(int(d) for d in values[f"{name}::shape"])
            known = measured.get(source) or figures[source]
            if source in suspects:
                suspects.add(name)
            measured[name] = (0, 0, 0, shape) if not int(np.prod(shape, dtype=np.int64)) else (*known[:3], shape)
        figures.update((name, measured[name]) for name in names)
        per_batch.append(figures)
    if suspects:  # NaN or infinity somewhere: those tensors measured whole, batch by batch
        sess, plan = session(fetched | suspects)
        for feed, figures in zip(batches, per_batch):
            values = dict(zip(plan.outputs, sess.run(plan.outputs, dict(feed))))
            for name in suspects:
                figures[name] = _figures(values[name])
    return _aggregate(per_batch, TensorStats)


_SUFFIXES = ("::max", "::min", "::sum", "::shape")


# Operators whose output holds exactly their first input's values, rearranged: its max, min and
# NaN are its input's, so only its shape is read.
_REARRANGING = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


@dataclass
class _Plan:
    graph: object  # onnx.ModelProto
    outputs: list[str]
    reduced: set[str]  # measured by reductions
    derived: dict[str, str]  # tensor -> the tensor (or graph input) whose values it rearranges


def _reducing_graph(optimized, reduced: Sequence[str], fetch: set[str], inputs: set[str]) -> _Plan:
    """``optimized`` measuring ``reduced`` (less ``fetch``) in place and returning ``fetch`` whole."""
    import copy

    import onnx

    graph = copy.deepcopy(optimized)
    taken = {n for node in graph.graph.node for n in (*node.input, *node.output)}
    taken |= {i.name for i in graph.graph.initializer} | inputs
    todo = {n for n in reduced if n not in fetch}
    plan = _Plan(graph, [], set(), {})
    known = set(inputs)  # tensors whose figures are had by the time a node runs
    nodes = []
    for node in graph.graph.node:
        nodes.append(node)
        for out in node.output:
            if out not in todo:
                continue
            todo.discard(out)
            known.add(out)
            if node.op_type in _REARRANGING and node.domain in ("", "ai.onnx") and node.input[0] in known \
                    and node.input[0] not in fetch:
                plan.derived[out] = node.input[0]
                ops = (("Shape", "::shape"),)
            else:
                plan.reduced.add(out)
                ops = tuple(zip(("ReduceMax", "ReduceMin", "ReduceSum", "Shape"), _SUFFIXES))
            for op, suffix in ops:
                name = f"{out}{suffix}"
                if name in taken:
                    raise ValueError(f"tensor name {name!r} already taken")
                attrs = {} if op == "Shape" else {"keepdims": 0}
                nodes.append(onnx.helper.make_node(op, [out], [name], name=name, **attrs))
                plan.outputs.append(name)
    if todo:  # reduced names come from the optimized graph's node outputs
        raise ValueError(f"{len(todo)} tensors not produced by the optimized graph (first: {sorted(todo)[0]!r})")
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    plan.outputs += sorted(fetch)
    del graph.graph.output[:]
    graph.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in plan.outputs)
    return plan


def _figures(data: np.ndarray) -> tuple:
    """(absmax, min, max, shape) of one batch, as ModelOpt's _aggregate_tensor_stats computes them."""
    if data.size == 0:
        return 0, 0, 0, data.shape
    return np.max(np.abs(data)), np.min(data), np.max(data), data.shape


def _reduced_figures(low: np.ndarray, high: np.ndarray, shape: tuple[int, ...]) -> tuple:
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return 0, 0, 0, shape
    low, high = low[()], high[()]  # 0-d arrays -> numpy scalars of the tensor's type
    return max(np.abs(low), np.abs(high)), low, high, shape


def _aggregate(per_batch: list[dict], TensorStats) -> dict:
    """ModelOpt's multi-batch aggregation (Python max/min, so a NaN batch is skipped as there).

    For a single batch ModelOpt hands the classifier raw arrays; its rules read from them what
    a ``TensorStats`` of that batch's own figures holds (absmax NaN where the tensor holds NaN).
    """
    from collections import OrderedDict

    aggregated = OrderedDict()
    if len(per_batch) == 1:  # the batch's own figures, NaN included, as the rules read them off the arrays
        for name, (absmax, low, high, shape) in per_batch[0].items():
            aggregated[name] = TensorStats(absmax=absmax, min_val=low, max_val=high, shape=shape)
        return aggregated
    for name in per_batch[0]:
        absmax, low, high, shape = -np.inf, np.inf, -np.inf, None
        for figures in per_batch:
            if name not in figures:
                continue
            b_abs, b_low, b_high, b_shape = figures[name]
            shape = b_shape if shape is None else shape
            absmax, low, high = max(absmax, b_abs), min(low, b_low), max(high, b_high)
        if shape is not None:
            aggregated[name] = TensorStats(absmax=absmax, min_val=low, max_val=high, shape=shape)
    return aggregated
