"""Precision repair: when an FP16 or INT8 graph fails its gate, find a small set of nodes whose
return to FP32 (or exclusion from quantization) makes it pass.

``search`` (used by ``--repair``) ranks candidates by the error each adds, wherever they are, and
prunes what the gate does not need; INT8 trials are ``strip_qdq`` edits of the one quantized graph.
``repair`` below is the earlier search from the output backwards.

The search walks the graph from the output backwards (reverse topological order: rounding
near the output reaches it undamped; measured on Depth-Anything-V2, keeping its last 16 nodes
in FP32 cut the error 5x, its first 64 changed nothing); each chosen node's measured
contribution is reported (error a node adds on ONNX Runtime). It grows the
set 1, 2, 4, ... nodes until the gate passes, then bisects. Every trial is an ordinary cached
stage, so a repeated repair costs only its parity checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.compare.metrics import statistic
from enginekit.errors import ParityError
from enginekit.onnx import runtime

# INT8 moves only what ModelOpt quantizes; FP16 may move any node (a Cast or Concat left in
# FP16 between two FP32 nodes still rounds).
QUANTIZABLE_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
EXACT_OPS = {"Shape", "Constant", "ConstantOfShape", "Identity"}  # no values to round


@dataclass
class RepairResult:
    nodes: list[str]
    trials: int
    before: float
    after: float
    artifact: object  # pipeline.Artifact that passes
    ranking: str  # how candidates were ordered
    history: list[tuple[int, float, bool]] = field(default_factory=list)  # (k, rel_l2, passed)
    node_error: dict[str, float] = field(default_factory=dict)  # error each chosen node adds

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "moved": len(self.nodes), "trials": self.trials, "ranking": self.ranking,
                "rel_l2_before": self.before, "rel_l2_after": self.after,
                "history": [{"nodes": k, "rel_l2": e, "passed": p} for k, e, p in self.history],
                "node_error": self.node_error}


def candidate_nodes(onnx_path: Path, precision: str) -> list[str]:
    """Names of the nodes a repair may move, in topological order."""
    import onnx

    nodes = onnx.load(str(onnx_path)).graph.node
    if precision == "int8":
        return [n.name for n in nodes if n.op_type in QUANTIZABLE_OPS and n.name]
    return [n.name for n in nodes if n.op_type not in EXACT_OPS and n.name]


def quantized_nodes(qdq_path: Path) -> list[str]:
    """Nodes of a Q/DQ graph that read a DequantizeLinear output (what the quantizer made INT8:
    convolutions, and the Add/Concat/MaxPool/Resize between them), in topological order."""
    import onnx

    nodes = onnx.load(str(qdq_path)).graph.node
    dq_out = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    skip = EXACT_OPS | {"QuantizeLinear", "DequantizeLinear"}
    return [n.name for n in nodes if n.name and n.op_type not in skip and any(i in dq_out for i in n.input)]


def per_node_error(fp32_path: Path, reduced_path: Path, feed: dict[str, np.ndarray], names: list[str]) -> dict[str, float] | None:
    """Error each node adds: rel error of its output minus the worst of its inputs' (None if unmeasurable)."""
    import onnx

    def expose(path: Path) -> tuple[dict[str, np.ndarray], onnx.ModelProto]:
        model = onnx.load(str(path))
        have = {o.name for o in model.graph.output}
        for node in model.graph.node:
            for out in node.output:
                if out and out not in have:
                    model.graph.output.append(onnx.ValueInfoProto(name=out))
                    have.add(out)
        sess = runtime.session_from_model(model)
        return runtime.run(sess, feed), model

    try:
        ref, model = expose(fp32_path)
        got, _ = expose(reduced_path)
    except Exception:  # noqa: BLE001 - graphs whose intermediates ORT cannot expose: fall back
        return None

    def err(tensor: str) -> float:
        if tensor not in ref or tensor not in got or ref[tensor].dtype.kind != "f" or ref[tensor].shape != got[tensor].shape:
            return 0.0
        return statistic("rel_l2", ref[tensor], got[tensor])

    wanted = set(names)
    added: dict[str, float] = {}
    for node in model.graph.node:
        if node.name in wanted:
            out_err = max((err(o) for o in node.output if o), default=0.0)
            in_err = max((err(i) for i in node.input if i), default=0.0)
            added[node.name] = out_err - in_err
    return added


def used_share(checks) -> float:
    """How much of what the gates allow a graph uses, summed over its checks (each 1.0 at its limit): a parity
    check ``value <= limit`` uses value / limit, a ``value >= limit`` check (cosine, recall) uses
    (1 - value) / (1 - limit). Smooth where single detections flip a task check, so it ranks small changes."""
    total = 0.0
    for c in checks:
        if c.condition or not np.isfinite(c.value):
            continue
        if c.op == "<=" and c.limit > 0:
            total += c.value / c.limit
        elif c.op == ">=" and c.limit < 1:
            total += max(1.0 - c.value, 0.0) / (1.0 - c.limit)
    return total


def measured_effect(quantized, source, names: list[str], score, *, on_node=None) -> dict[str, float]:
    """Each node's measured effect on the gates: ``score(model)`` (lower is better: ``used_share`` of its
    checks) of the quantized graph, minus that of the graph with that one node's Q/DQ inputs removed
    (``strip_qdq``): what keeping that node alone in high precision takes away. Weights and activations
    alike, any node the quantizer gave Q/DQ inputs (Conv, Add, Concat, Resize, MaxPool...): the cause of a
    loss is found where it reaches the gated outputs, not where a node's own output moves most."""
    base = score(quantized)
    effect = {}
    for i, name in enumerate(names):
        effect[name] = base - score(strip_qdq(quantized, source, [name]))
        if on_node is not None:
            on_node(i + 1)
    return effect


def repair(try_nodes, check, names: list[str], ranking: dict[str, float] | None, *, max_trials: int = 16) -> RepairResult:
    """The fewest of ``names`` (taken from the output backwards) that make the gate pass.

    ``try_nodes(nodes) -> artifact`` makes the graph with ``nodes`` kept in high precision;
    ``check(artifact) -> (passed, rel_l2)``. ``ranking`` (error each node adds) is reported.
    """
    # Skipping nodes that add no measurable error looked cheaper but fails: it leaves casts to
    # FP16 between FP32 nodes. The per-node figures are kept for the report instead.
    order = list(reversed(names))
    history: list[tuple[int, float, bool]] = []
    artifacts: dict[int, tuple[object, float]] = {}

    def trial(k: int) -> bool:
        art = try_nodes(order[:k])
        ok, err = check(art)
        history.append((k, err, ok))
        artifacts[k] = (art, err)
        return ok

    if trial(0):
        art, err = artifacts[0]
        return RepairResult([], 1, err, err, art, "reverse topological order", history)
    lo, hi, k = 0, None, 1  # lo fails; hi passes
    while k < len(order) and len(history) < max_trials:  # grow 1, 2, 4, ... until a pass
        if trial(k):
            hi = k
            break
        lo, k = k, k * 2
    if hi is None:
        if not trial(len(order)):
            raise ParityError(f"repair failed: even with all {len(order)} candidate nodes moved, "
                              f"rel L2 is {history[-1][1]:.2e}")
        hi = len(order)
    while hi - lo > 1 and len(history) < max_trials:  # then bisect between the two
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if trial(mid) else (mid, hi)
    art, after = artifacts[hi]
    result = RepairResult(order[:hi], len(history), history[0][1], after, art, "reverse topological order", history)
    if ranking:
        result.node_error = {n: ranking.get(n, 0.0) for n in result.nodes}
    return result


def strip_qdq(quantized, source, nodes) -> "onnx.ModelProto":
    """The Q/DQ graph ``quantized`` with ``nodes`` computing in FP32 again: a pure ONNX edit.

    Each input of a named node that comes through a DequantizeLinear is wired back to what was
    quantized: an activation to the QuantizeLinear's input, a weight to the FP32 initializer of
    ``source`` (the graph before quantization, same node names). Q/DQ pairs no longer used are
    dropped. Takes well under a second, where a ModelOpt quantization takes seconds to minutes:
    a repair trial is this edit and one ONNX Runtime run.
    """
    import copy

    model = copy.deepcopy(quantized)
    graph = model.graph
    wanted = set(nodes)
    rewire = _Rewire(graph, source)
    for node in graph.node:
        if node.name in wanted:
            rewire(node, node.name)
    _drop_unused(graph)
    return model


class _Rewire:
    """Wires a node of a Q/DQ graph to what its DequantizeLinear inputs dequantize: an activation to the
    QuantizeLinear's input, a weight to the FP32 initializer of ``source`` (adding it to the graph)."""

    def __init__(self, graph, source):
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.src_nodes = {n.name: n for n in source.graph.node}
        self.src_inits = {i.name: i for i in source.graph.initializer}
        self.have_inits = {i.name for i in graph.initializer}

    def __call__(self, node, name: str) -> int:
        """Rewire ``node`` (named ``name`` in the source graph); the number of inputs rewired."""
        original = self.src_nodes.get(name)
        changed = 0
        for i, tensor in enumerate(node.input):
            dq = self.producer.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = self.producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[i] = q.input[0]
                changed += 1
            elif original is not None and i < len(original.input) and original.input[i] in self.src_inits:
                weight = original.input[i]
                if weight not in self.have_inits:
                    self.graph.initializer.append(self.src_inits[weight])
                    self.have_inits.add(weight)
                node.input[i] = weight
                changed += 1
        return changed


#: suffix of the high-precision twin a node gets for ``own_error``
_TWIN = "/enginekit_fp32_twin"


def own_error(quantized, source, names: list[str], feeds) -> dict[str, float]:
    """Each node's own rounding, in one ONNX Runtime session: the rel L2 between its output in the Q/DQ graph and
    the output of a twin that reads the same activations before their QuantizeLinear and the FP32 weights, summed
    over ``feeds`` (each an input dict). Every node of ``names`` gets its twin in the one graph, so one run per feed
    measures all of them (``measured_effect`` takes one run per node and feed). What it cannot see: how much of a
    node's rounding reaches the gated outputs (``screened_effect`` measures that for the nodes this ranks first)."""
    import copy

    import onnx


    model = copy.deepcopy(quantized)
    graph = model.graph
    rewire = _Rewire(graph, source)
    wanted = set(names)
    twins, pairs = [], {}
    for node in list(graph.node):
        if node.name not in wanted or not node.output or not node.output[0]:
            continue
        twin = copy.deepcopy(node)
        if not rewire(twin, node.name):
            continue
        twin.name = node.name + _TWIN
        twin.output[:] = [o + _TWIN if o else "" for o in node.output]
        twins.append(twin)
        pairs[node.name] = (node.output[0], twin.output[0])
    graph.node.extend(twins)  # each twin reads only tensors made before it: still in topological order
    have = {o.name for o in graph.output}
    for pair in pairs.values():
        for tensor in pair:
            if tensor not in have:
                graph.output.append(onnx.ValueInfoProto(name=tensor))
                have.add(tensor)
    sess = runtime.session_from_model(model)
    wanted_out = sorted({t for pair in pairs.values() for t in pair})
    diff = dict.fromkeys(pairs, 0.0)
    norm = dict.fromkeys(pairs, 0.0)
    for feed in feeds:
        got = dict(zip(wanted_out, sess.run(wanted_out, feed)))
        for name, (out, ref) in pairs.items():
            a, b = np.asarray(got[out], np.float64), np.asarray(got[ref], np.float64)
            if a.shape != b.shape or a.dtype.kind != "f":
                continue
            diff[name] += float(np.square(a - b).sum())
            norm[name] += float(np.square(b).sum())
    return {n: float(np.sqrt(diff[n] / norm[n])) if norm[n] > 0 else 0.0 for n in pairs}


def screened_effect(quantized, source, names: list[str], score, feeds, *, measure: int, on_node=None
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """``measured_effect`` for the ``measure`` nodes whose own rounding (``own_error``) is largest, the rest ranked
    after them by their own rounding alone (a positive figure below the least measured one, so the search can still
    reach them): (ranking, the measured effects). One run per feed ranks every node; ``measure`` full evaluations decide the
    order of those that may matter."""
    own = own_error(quantized, source, names, feeds)
    screened = sorted(names, key=lambda n: -own.get(n, 0.0))
    top = screened[:measure]
    effect = measured_effect(quantized, source, top, score, on_node=on_node)
    floor = min([v for v in effect.values() if v > 0], default=1e-6)
    rest = [n for n in screened[measure:] if own.get(n, 0.0) > 0]
    worst = max((own[n] for n in rest), default=1.0) or 1.0
    ranking = dict(effect)
    for n in rest:  # below every measured node with an effect, in the order of their own rounding
        ranking[n] = 0.5 * floor * own[n] / worst
    return ranking, effect


def _drop_unused(graph) -> None:
    """Remove nodes (and initializers) whose outputs nothing reads, repeatedly."""
    keep_outputs = {o.name for o in graph.output}
    while True:
        used = keep_outputs | {i for n in graph.node for i in n.input}
        dead = [n for n in graph.node if n.output and not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    used = {i for n in graph.node for i in n.input} | keep_outputs
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


#: the shares of the measured loss the search's first trials cover, in order (``search``)
COVER = (0.5, 0.75, 0.9, 0.97, 1.0)


def cover_steps(order: list[str], ranking: dict[str, float], cover=COVER) -> list[int]:
    """How many of ``order`` (by measured effect, largest first) the search tries first: the fewest that carry each
    share of ``cover`` of the positive measured effect. Where two nodes carry 90% of the loss: 1, 2, then more."""
    effects = [max(ranking.get(n, 0.0), 0.0) for n in order]
    total = sum(effects)
    positive = sum(1 for e in effects if e > 0)
    if total <= 0:
        return []
    steps, running, k = [], 0.0, 0
    for share in cover:
        while k < positive and running < share * total - 1e-12:
            running += effects[k]
            k += 1
        if k and (not steps or k > steps[-1]):
            steps.append(k)
    return steps


#: the share of the measured loss that makes a node a cause the search keeps (``search``)
CAUSE = 0.1


def cause_nodes(order: list[str], ranking: dict[str, float], share: float = CAUSE) -> list[str]:
    """The leading nodes of ``order`` (largest measured effect first) each carrying ``share`` or more of the positive
    measured effect of all of them."""
    total = sum(max(ranking.get(n, 0.0), 0.0) for n in order)
    if total <= 0:
        return []
    out = []
    for n in order:
        if ranking.get(n, 0.0) < share * total:
            break
        out.append(n)
    return out


def search(trial, names: list[str], ranking: dict[str, float] | None, *, max_trials: int = 24,
           budget: int | None = None) -> "RepairResult":
    """A small set of ``names`` that makes the gate pass, from the measured causes.

    ``trial(nodes) -> (artifact, passed, rel_l2)`` makes and checks the graph with ``nodes`` in high precision.
    With ``ranking`` (``measured_effect``: what keeping each node alone takes off the gates' figures), nodes are
    kept in order of their measured share: the first trials keep the fewest that carry 50%, 75%, 90%, 97% and all
    of the loss (``cover_steps``), so where two nodes carry 90% the answer is found in two or three trials; the
    smallest passing count is bisected against the last failing one, then each chosen node is dropped in turn
    where the gate passes without it (least effect first), so the set holds only what the gate needs. A node whose
    measured share is ``CAUSE`` or more of the whole is a cause: the causes are kept together from the first trial
    and never dropped (a gate that passes on the judging images without one of them passes by a few detections,
    and the images after them find the loss again: a yolov8s at 640 whose two culprits carried 50% and 45% passed
    its 16 judging images with the first alone and failed 16 others, recall 0.935). Without a ranking: from the
    output backwards, grown 1, 2, 4, ..., bisected, pruned. ``budget``: most nodes allowed.
    """
    if ranking:
        order = sorted(names, key=lambda n: (-ranking.get(n, 0.0), -names.index(n)))
        how = "measured share of the loss (largest first), by the shares it covers, bisected, then pruned"
    else:
        order = list(reversed(names))
        how = "reverse topological order, grown then bisected, then pruned"
    history: list[tuple[int, float, bool]] = []
    made: dict[tuple, tuple[object, float, bool]] = {}

    def run(nodes: list[str]) -> bool:
        key = tuple(sorted(nodes))
        if key not in made:
            art, ok, err = trial(list(nodes))
            made[key] = (art, err, ok)
            history.append((len(nodes), err, ok))
        return made[key][2]

    if run([]):
        art, err, _ = made[()]
        return RepairResult([], 1, err, err, art, how, history)
    limit = len(order) if budget is None else min(budget, len(order))
    if ranking:  # nodes whose measured effect is none or harmful come only in the all-nodes trial
        limit = min(limit, sum(1 for n in names if ranking.get(n, 0.0) > 0))
        steps = [k for k in cover_steps(order, ranking) if k <= limit]
    else:
        steps, k = [], 1
        while k <= limit:
            steps.append(k)
            k = k * 2 if k * 2 <= limit or k == limit else limit
    causes = len(cause_nodes(order, ranking)) if ranking else 0
    causes = min(causes, limit)
    if causes:  # the causes first, together; the steps past them
        steps = [causes, *(k for k in steps if k > causes)]
    lo, hi = 0, None
    for k in steps:
        if len(history) >= max_trials:
            break
        if run(order[:k]):
            hi = k
            break
        lo = k
    if hi is None:
        if limit == len(order) or not run(order):
            last = history[-1][1]
            raise ParityError(f"repair failed: even with {max(lo, limit)} of {len(order)} candidate nodes in high "
                              f"precision the gate fails (worst rel L2 {last:.2e})")
        hi = len(order)
    lo = max(lo, causes)  # never fewer than the causes
    while hi - lo > 1 and len(history) < max_trials:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if run(order[:mid]) else (mid, hi)
    chosen = list(order[:hi])
    kept = set(order[:causes])
    for node in list(reversed(chosen)):  # least effect first; the causes stay
        if len(chosen) <= 1 or len(history) >= max_trials:
            break
        if node in kept:
            continue
        fewer = [n for n in chosen if n != node]
        if run(fewer):
            chosen = fewer
    art, after, _ = made[tuple(sorted(chosen))]
    result = RepairResult(chosen, len(history), history[0][1], after, art, how, history)
    if ranking:
        result.node_error = {n: ranking.get(n, 0.0) for n in chosen}
    return result


def exact_patterns(names: list[str]) -> list[str]:
    """Node names as anchored regexes (AutoCast and ModelOpt take patterns)."""
    return [f"^{re.escape(n)}$" for n in names]
