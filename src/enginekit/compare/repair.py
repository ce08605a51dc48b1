"""Precision repair: when an FP16 or INT8 graph fails its gate, find a small set of nodes whose
return to FP32 (or exclusion from quantization) makes it pass.

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

from enginekit.errors import ParityError

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


def per_node_error(fp32_path: Path, reduced_path: Path, feed: dict[str, np.ndarray], names: list[str]) -> dict[str, float] | None:
    """Error each node adds: rel error of its output minus the worst of its inputs' (None if unmeasurable)."""
    import onnx

    from enginekit.onnx import runtime

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
        if tensor not in ref or tensor not in got or ref[tensor].dtype.kind != "f":
            return 0.0
        a, b = ref[tensor].astype(np.float64), got[tensor].astype(np.float64)
        if a.shape != b.shape:
            return 0.0
        return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-12))

    wanted = set(names)
    added: dict[str, float] = {}
    for node in model.graph.node:
        if node.name in wanted:
            out_err = max((err(o) for o in node.output if o), default=0.0)
            in_err = max((err(i) for i in node.input if i), default=0.0)
            added[node.name] = out_err - in_err
    return added


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


def exact_patterns(names: list[str]) -> list[str]:
    """Node names as anchored regexes (AutoCast and ModelOpt take patterns)."""
    return [f"^{re.escape(n)}$" for n in names]
