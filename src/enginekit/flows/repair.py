"""Repair orchestration: make a failing fp16/int8 graph pass its gate by moving as few nodes
as needed back to high precision (the search itself is ``compare.repair``).

The nodes found are stored (kind "repair", keyed by source graph, precision and tolerance), so
the next ``--repair`` build starts from them without searching again.
"""

from __future__ import annotations

from enginekit import reporting


def repair(pipe, chain, precision, shape, overrides, data, calib_method, exclude):
    """(repaired artifact, record for the manifest) for ``chain[-1]``, made from ``chain[-2]``."""
    from enginekit.cache import key_for
    from enginekit.calibration import CalibrationData
    from enginekit.compare import repair as rp
    from enginekit.compare.gate import Gates
    from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs
    from enginekit.images import load_images

    source = chain[-2]
    tol = Gates(pipe.adapter, overrides).parity(precision)
    memory_parts = {"search": "reverse-topological/1", "source": source.sha256, "precision": precision,
                    "tolerance": tol.to_json(),
                    "method": calib_method if precision == "int8" else None, "exclude": sorted(exclude)}

    def try_nodes(nodes: list[str]):
        patterns = rp.exact_patterns(nodes)
        if precision == "fp16":
            return pipe.fp16(source, shape, CalibrationData(None, count=2), keep_fp32_nodes=patterns)
        return pipe.int8(source, shape, data, method=calib_method, exclude=exclude + patterns)

    refs = ReferenceCache(pipe.adapter, pipe.loaded)
    cases = parity_inputs(pipe.adapter, shape, load_images(None, limit=2))

    def check(artifact):
        result = check_onnx(refs, artifact.path, cases, precision, tol)
        worst = max(w["rel_l2"] for w in result.worst().values())
        return result.passed, worst

    memory = pipe.cache.lookup("repair", key_for(memory_parts))
    if memory.entry is not None:
        nodes = memory.entry.manifest["nodes"]
        reporting.note(f"repair: starting from {len(nodes)} node(s) found earlier (entry {memory.entry.key[:10]})")
        artifact = try_nodes(nodes)
        ok, _ = check(artifact)
        if ok:
            return artifact, {**memory.entry.manifest["result"], "reused": True}
    passed, worst = check(chain[-1])
    if passed:
        return chain[-1], {"nodes": [], "moved": 0, "rel_l2_before": worst, "rel_l2_after": worst, "trials": 1}
    names = rp.candidate_nodes(source.path, precision)
    with reporting.stage(f"repair {precision}: rank {len(names)} nodes") as s:
        feed = {pipe.adapter.input_name: cases[0].array}
        ranking = rp.per_node_error(source.path, chain[-1].path, feed, names)
        s.detail = "with per-node error" if ranking else "without per-node error"
    with reporting.stage(f"repair {precision}: search") as s:
        result = rp.repair(try_nodes, check, names, ranking)
        s.detail = f"{len(result.nodes)} node(s) moved in {result.trials} trials"
    reporting.note(f"repair: rel L2 {result.before:.2e} -> {result.after:.2e} (limit {tol.rel_l2:.0e}) by keeping "
                   f"{len(result.nodes)} node(s) in {'FP32' if precision == 'fp16' else 'high precision'}: "
                   + ", ".join(result.nodes[:8]) + (" ..." if len(result.nodes) > 8 else ""))
    record = result.to_json()
    pipe.cache.get_or_create("repair", memory_parts, lambda tmp: {"nodes": result.nodes, "result": record},
                             subject=pipe.subject)
    return result.artifact, record
