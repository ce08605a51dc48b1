"""Repair orchestration: make a failing fp16/int8 graph pass its gate by moving as few nodes
as needed back to high precision (the search itself is ``compare.repair``).

The nodes found are stored (kind "repair", keyed by source graph, precision and tolerance), so
the next ``--repair`` build starts from them without searching again.
"""

from __future__ import annotations

from enginekit import reporting


class TrialGraph:
    """A repair trial's graph, outside the cache (an artifact-like ``path``)."""

    def __init__(self, path):
        self.path = path
        self.stage = "int8-trial"


def repair(pipe, chain, precision, shape, overrides, data, calib_method, exclude):
    """(repaired artifact, record for the manifest) for ``chain[-1]``, made from ``chain[-2]``.

    Every trial is gated as verify gates: per output part parity AND the task metrics (the
    detections at the operating point, mAP) on photographs, with the user's ``--tol``.
    INT8 trials remove the Q/DQ pairs around the chosen nodes from the one quantized graph (an
    ONNX edit, no ModelOpt run); the result is then quantized by ModelOpt with those nodes
    excluded (from the calibration cache) and checked again.
    """
    import tempfile
    import time
    from pathlib import Path

    import onnx

    from enginekit.cache import key_for
    from enginekit.calibration import CalibrationData
    from enginekit.compare import repair as rp
    from enginekit.compare.gate import Gates
    from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs
    from enginekit.images import load_images

    source = chain[-2]
    gates = Gates(pipe.adapter, overrides)
    folder = Path(data.source) if getattr(data, "source", None) is not None and Path(data.source).is_dir() else None
    memory_parts = {"search": "sensitivity/2" if precision == "int8" else "reverse-topological/2", "source": source.sha256, "precision": precision,
                    "gates": {"parity": {p.name: gates.parity(precision, p.name).to_json()
                                         for p in pipe.adapter.output_parts({})},
                              "task": gates.task(precision), "options": gates.options(precision)},
                    "photos": data.digest(pipe.adapter, shape) if folder else "embedded",
                    "method": calib_method if precision == "int8" else None, "exclude": sorted(exclude)}

    refs = ReferenceCache(pipe.adapter, pipe.loaded)
    cases = parity_inputs(pipe.adapter, shape, load_images(folder, limit=4), photos=4)

    def check(artifact):
        result = check_onnx(refs, artifact.path, cases, precision, gates=gates)
        return result.passed, result.comparison.worst_rel_l2, result

    def make(nodes: list[str]):
        patterns = rp.exact_patterns(nodes)
        if precision == "fp16":
            return pipe.fp16(source, shape, CalibrationData(None, count=2), keep_fp32_nodes=patterns)
        return pipe.int8(source, shape, data, method=calib_method, exclude=exclude + patterns)

    memory = pipe.cache.lookup("repair", key_for(memory_parts))
    if memory.entry is not None:
        nodes = memory.entry.manifest["nodes"]
        reporting.note(f"repair: starting from {len(nodes)} node(s) found earlier (entry {memory.entry.key[:10]})")
        artifact = make(nodes)
        if check(artifact)[0]:
            return artifact, {**memory.entry.manifest["result"], "reused": True}
    passed, worst, first = check(chain[-1])
    # INT8: every node the quantizer gave Q/DQ inputs (Conv, and Add/Concat/... between them)
    names = rp.quantized_nodes(chain[-1].path) if precision == "int8" else rp.candidate_nodes(source.path, precision)
    if passed:
        return chain[-1], {"nodes": [], "moved": 0, "candidates": len(names), "rel_l2_before": worst,
                           "rel_l2_after": worst, "trials": 1, "task_before": first.task, "task_after": first.task}
    with reporting.stage(f"repair {precision}: rank {len(names)} nodes") as s:
        feed = cases[0].feed
        ranking = rp.per_node_error(source.path, chain[-1].path, feed, names)
        s.detail = "by the error each adds" if ranking else "from the output backwards"

    tmp = Path(tempfile.mkdtemp(prefix="enginekit-repair-"))
    quantized = onnx.load(str(chain[-1].path)) if precision == "int8" else None
    original = onnx.load(str(source.path)) if precision == "int8" else None
    seconds: list[float] = []

    def trial(nodes: list[str]):
        start = time.perf_counter()
        if precision == "int8":
            path = tmp / f"trial-{len(seconds)}.onnx"
            onnx.save(rp.strip_qdq(quantized, original, nodes), str(path))
            art = TrialGraph(path)
        else:
            art = make(nodes)
        seconds.append(time.perf_counter() - start)
        ok, err, _ = check(art)
        return art, ok, err

    try:
        with reporting.stage(f"repair {precision}: search") as s:
            if precision == "int8":
                result = rp.search(trial, names, ranking, max_trials=40)
            else:  # FP16: from the output backwards (a ranked set leaves FP16 casts between FP32 nodes)
                result = rp.repair(make, lambda art: check(art)[:2], names, ranking)
            s.detail = f"{len(result.nodes)} of {len(names)} node(s) in {result.trials} trials"
        final = result.artifact
        if precision == "int8" and result.nodes:
            final = store_stripped(pipe, chain[-1], result.nodes, exclude, rp, quantized, original)
        ok, after, last = check(final)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    high = "FP32" if precision == "fp16" else "high precision"
    reporting.note(f"repair: {len(result.nodes)} of {len(names)} quantizable node(s) "
                   f"({100 * len(result.nodes) / max(len(names), 1):.1f}%) kept in {high}; worst rel L2 "
                   f"{result.before:.2e} -> {after:.2e}; gate {'passes' if ok else 'still fails'}: "
                   + ", ".join(result.nodes[:8]) + (" ..." if len(result.nodes) > 8 else ""))
    record = {**result.to_json(), "candidates": len(names), "share": round(len(result.nodes) / max(len(names), 1), 4),
              "rel_l2_after": after, "passed": ok, "task_before": first.task, "task_after": last.task,
              "failures_before": first.failures(), "failures_after": last.failures(),
              "trial_seconds": round(sum(seconds) / len(seconds), 3) if seconds else None,
              "trial": "Q/DQ removed around the nodes (ONNX edit)" if precision == "int8" else "AutoCast"}
    if ok:
        pipe.cache.get_or_create("repair", memory_parts, lambda t: {"nodes": result.nodes, "result": record},
                                 subject=pipe.subject)
    else:
        reporting.warning(f"repair: the gate still fails after keeping {len(result.nodes)} node(s) in {high}: "
                          + "; ".join(last.failures()[:3]))
    return final, record


def store_stripped(pipe, quantized_artifact, nodes, exclude, rp, quantized, original):
    """The INT8 graph with ``nodes`` back in FP32 (Q/DQ removed), as a cache entry (stage
    "int8-repair", keyed by the INT8 graph and the nodes): the very graph the search checked.
    (ModelOpt with the same nodes excluded makes another graph: it still quantizes their
    neighbours' inputs; measured on the trained detector, rel L2 0.054 against 0.046.)"""
    import onnx

    parts = {"stage": "int8-repair", "input": quantized_artifact.sha256, "nodes": sorted(nodes),
             "edit": "strip_qdq/1"}
    excluded = list(quantized_artifact.manifest.get("exclude", exclude))

    def produce(tmp):
        onnx.save(rp.strip_qdq(quantized, original, nodes), str(tmp / "model.onnx"))
        return {"exclude": excluded, "repaired_nodes": sorted(nodes), "method": quantized_artifact.manifest.get("method"),
                "calibration_source": quantized_artifact.manifest.get("calibration_source")}

    return pipe.stage("int8-repair", parts, produce, f"int8 repair ({len(nodes)} node(s) back in FP32)")
