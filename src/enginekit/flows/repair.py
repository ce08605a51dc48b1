"""Repair orchestration: make a failing fp16/int8 graph pass its gate by moving as few nodes
as needed back to high precision (the search itself is ``compare.repair``).

The nodes found are kept by the pipeline (``Stages.remember_repair``: keyed by source graph, precision
and gates), so the next ``--repair`` build starts from them without searching again; an INT8 result
is the pipeline's ``Stages.repaired`` stage.
"""

from __future__ import annotations

from enginekit import reporting
from enginekit.errors import UsageError
from enginekit.calibration import CalibrationData
from enginekit.compare import repair as rp
from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs
from enginekit.errors import ParityError
from enginekit.images import load_images
from enginekit.verification.gate import Gates


# Photographs each repair trial is judged on (the calibration folder's images it did not calibrate on, else the
# embedded ones): on most detectors enough detections for a share gate's interval to clear its limit (72 for the
# 5% rule, compare.comparison.Gates.fewest_to_pass).
REPAIR_PHOTOS = 16
# Of those, the ones each node's effect is measured on (one ONNX Runtime session per quantized node): all of them.
# On 4, a detector whose loss sits in two early layers (tests/test_one_verdict.py, at 160 px: few detections per
# image) ranked them 40th and later and the search ran out of trials; on 8 it took 15 trials; on 16, 5.
RANK_PHOTOS = 16
# Of the quantized nodes, ranked first by their own rounding (one ONNX Runtime run per photograph ranks all of them:
# compare.repair.own_error), the ones whose effect on the gates is measured (one full evaluation each); the rest
# follow in the order of their own rounding. benchmarks/int8_screen.py holds the screen against every node measured.
MEASURE = 12


def _enough_evidence(gates, precision: str, task: dict, folder) -> None:
    """A repair searches for the nodes the task gates need: on too few reference detections one flip
    decides every trial, so it refuses (ParityError, as a failed gate) and says what would do."""
    minimum = gates.fewest_to_pass(precision)
    found = task.get("decided_reference", task.get("reference_detections", task.get("compared")))
    if not minimum or found is None or found >= minimum:
        return
    where = f"{REPAIR_PHOTOS} images of {folder}" if folder else "the embedded photographs"
    raise ParityError(f"repair cannot judge the task gates: {found:g} reference detections on {where}, fewer than "
                      f"the {minimum} on which a share's 95% interval can clear its limit; calibrate on a folder of "
                      "images of what the model sees (--calib-data DIR), which repair is judged on too")


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
    ONNX edit, no ModelOpt run); the graph the search settles on is kept as it was checked
    (``Stages.repaired``) and checked again.
    """
    import tempfile
    import time
    from pathlib import Path

    import onnx

    source = chain[-2]
    gates = Gates(pipe.adapter, overrides)
    folder = Path(data.source) if getattr(data, "source", None) is not None and Path(data.source).is_dir() else None
    # what the search is (its memory's key): the pipeline keys it, the flow only describes it
    search = {"search": "screened-effect/2" if precision == "int8" else "reverse-topological/2",
              "source": source.sha256, "precision": precision,
              "gates": {"parity": {p.name: gates.parity(precision, p.name).to_json()
                                   for p in pipe.adapter.output_parts({})},
                        "task": gates.task(precision), "options": gates.options(precision)},
              "photos": data.digest(pipe.adapter, shape) if folder else "embedded",
              "method": calib_method if precision == "int8" else None, "exclude": sorted(exclude)}
    if precision == "int8":  # another screen may rank, and keep, other nodes
        search["measure"] = MEASURE

    refs = ReferenceCache(pipe.adapter, pipe.loaded)
    photos, judged = judged_on(folder, data)
    cases = parity_inputs(pipe.adapter, shape, photos, photos=REPAIR_PHOTOS, rect=False)  # trials: full size

    def check(artifact):
        result = check_onnx(refs, artifact.path, cases, precision, gates=gates)
        return result.passed, result.comparison.worst_rel_l2, result

    def make(nodes: list[str]):
        patterns = rp.exact_patterns(nodes)
        if precision == "fp16":
            return pipe.fp16(source, shape, CalibrationData(None, count=2), keep_fp32_nodes=patterns)
        return pipe.int8(source, shape, data, method=calib_method, exclude=exclude + patterns)

    memory = pipe.recalled_repair(search)
    if memory is not None:  # a repair is an artifact: the same graph, judged as it was, no measuring, no search
        nodes = memory.manifest["nodes"]
        artifact = pipe.repaired(chain[-1], source, nodes, exclude) if precision == "int8" and nodes else make(nodes)
        ok, _, result = check(artifact)
        if ok:
            reporting.note(f"repair: the stored repair {memory.key[:10]} ({len(nodes)} node(s) in high precision, "
                           f"judged on {memory.manifest['result'].get('judged_on', judged)}): no measuring, no search")
            return artifact, {**memory.manifest["result"], "reused": memory.key}, result
    passed, worst, first = check(chain[-1])
    _enough_evidence(gates, precision, first.task, folder)
    if not passed and precision == "int8":
        _reachable(pipe, source, shape, refs, cases, gates, precision, judged)
    # INT8: every node the quantizer gave Q/DQ inputs (Conv, and Add/Concat/... between them)
    names = rp.quantized_nodes(chain[-1].path) if precision == "int8" else rp.candidate_nodes(source.path, precision)
    if passed:
        return chain[-1], {"nodes": [], "moved": 0, "candidates": len(names), "rel_l2_before": worst,
                           "rel_l2_after": worst, "trials": 1, "task_before": first.task, "task_after": first.task,
                           "passed": True, "failures_before": [], "failures_after": [], "judged_on": judged}, first
    tmp = Path(tempfile.mkdtemp(prefix="enginekit-repair-"))
    quantized = onnx.load(str(chain[-1].path)) if precision == "int8" else None
    original = onnx.load(str(source.path)) if precision == "int8" else None
    causes: list[dict] = []
    if precision == "int8":  # each quantized node's own effect on the gates, measured: the cause first
        rank_cases = [c for c in cases if c.kind == "photo"][:RANK_PHOTOS] or cases[:RANK_PHOTOS]
        base = rp.used_share(first.comparison.checks)

        def score(model) -> float:
            path = tmp / "rank.onnx"
            onnx.save(model, str(path))
            # a ranking, not a verdict: no bootstrap intervals (100 mAP replicates per node)
            return rp.used_share(check_onnx(refs, path, rank_cases, precision, gates=gates,
                                            intervals=False).comparison.checks)

        measure = min(MEASURE, len(names))
        with reporting.progress(f"repair int8: rank {len(names)} quantized nodes by their own rounding, measure "
                                f"the first {measure}", total=measure) as bar:
            ranking, measured = rp.screened_effect(quantized, original, names, score, [c.feed for c in rank_cases],
                                            measure=measure, on_node=lambda k: bar.advance())
        causes = effect_table(measured, score(quantized), base)
        if causes:
            reporting.note("repair int8: the loss comes from " + ", ".join(
                f"{c['node']} ({100 * c['effect'] / max(c['of'], 1e-12):.0f}%)" for c in causes[:5])
                + f" (share of the gates' figures on {len(rank_cases)} photograph(s) each removes alone; {measure} of "
                f"{len(names)} nodes measured, those whose own rounding is largest)")
    else:
        with reporting.stage(f"repair {precision}: rank {len(names)} nodes") as s:
            ranking = rp.per_node_error(source.path, chain[-1].path, cases[0].feed, names)
            s.detail = "by the error each adds" if ranking else "from the output backwards"
    seconds: list[float] = []

    # each trial says which it is: a repair takes minutes, and its stage lines look alike
    max_trials = 24 if precision == "int8" else 17  # search's limit; repair's 16 and the all-nodes trial
    high = "FP32" if precision == "fp16" else "high precision"
    trials = [0]

    def say_trial(nodes: list[str]) -> None:
        trials[0] += 1
        reporting.note(f"repair {precision}: trial {trials[0]} of at most {max_trials}: "
                       f"{len(nodes)} of {len(names)} node(s) in {high}")

    def trial(nodes: list[str]):
        say_trial(nodes)
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
                result = rp.search(trial, names, ranking, max_trials=max_trials)
            else:  # FP16: from the output backwards (a ranked set leaves FP16 casts between FP32 nodes)
                def make_counted(nodes: list[str]):
                    say_trial(nodes)
                    return make(nodes)

                result = rp.repair(make_counted, lambda art: check(art)[:2], names, ranking)
            s.detail = f"{len(result.nodes)} of {len(names)} node(s) in {result.trials} trials"
        final = result.artifact
        if precision == "int8" and result.nodes:
            final = pipe.repaired(chain[-1], source, result.nodes, exclude)
        ok, after, last = check(final)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    shares = {c["node"]: c["effect"] / max(c["of"], 1e-12) for c in causes}
    kept = ", ".join(f"{n} ({100 * shares[n]:.0f}%)" if n in shares else n for n in result.nodes[:8])
    reporting.note(f"repair: {len(result.nodes)} of {len(names)} quantizable node(s) "
                   f"({100 * len(result.nodes) / max(len(names), 1):.1f}%) kept in {high} in {result.trials} "
                   f"trial(s); worst rel L2 {result.before:.2e} -> {after:.2e}; judged on {judged}; gate "
                   f"{'passes' if ok else 'still fails'}: " + kept + (" ..." if len(result.nodes) > 8 else ""))
    record = {**result.to_json(), "candidates": len(names), "share": round(len(result.nodes) / max(len(names), 1), 4),
              "rel_l2_after": after, "passed": ok, "task_before": first.task, "task_after": last.task,
              "failures_before": first.failures(), "failures_after": last.failures(),
              "trial_seconds": round(sum(seconds) / len(seconds), 3) if seconds else None,
              "trial": "Q/DQ removed around the nodes (ONNX edit)" if precision == "int8" else "AutoCast",
              "judged_on": judged, "causes": causes}
    if precision == "int8" and record["share"] > LITTLE_GAIN:
        record["int8_gain"] = little_gain(pipe, source, shape, refs, cases, gates, precision, judged, record)
    if ok:
        pipe.remember_repair(search, result.nodes, record)
    else:
        reporting.warning(f"repair: the gate still fails after keeping {len(result.nodes)} node(s) in {high}: "
                          + "; ".join(last.failures()[:3]))
    return final, record, last


#: the share of the quantized nodes kept in high precision past which an INT8 repair says INT8 gains little here
LITTLE_GAIN = 0.25


def little_gain(pipe, source, shape, refs, cases, gates, precision: str, judged: str, record: dict) -> dict:
    """Where passing keeps more than a quarter of the quantized nodes in high precision, little of INT8's speed is left:
    said plainly (a warning), beside what the FP16 graph of the same model gives on the same images and gates."""
    fp16 = check_onnx(refs, pipe.fp16(source, shape, CalibrationData(None, count=2)).path, cases, precision,
                      gates=gates)
    said = ("passes these gates" if fp16.passed else f"fails them too ({fp16.failures()[0]})")
    reporting.warning(f"repair int8: {record['moved']} of {record['candidates']} quantized nodes "
                      f"({100 * record['share']:.0f}%) kept in high precision: INT8 gains little here; the FP16 graph "
                      f"of the same model (no calibration) {said} on {judged} (--precision fp16)")
    return {"share": record["share"], "fp16_passed": fp16.passed, "fp16_failures": fp16.failures()[:3],
            "fp16_worst_rel_l2": fp16.comparison.worst_rel_l2}


def _reachable(pipe, source, shape, refs, cases, gates, precision: str, judged: str) -> None:
    """Stop (ParityError, one line) where a gate asks for more than the FP16 graph of the same model reaches on the
    same images: no set of nodes kept in high precision can pass it (one flip among few detections is a share's
    whole step), so repair says so instead of keeping nodes to chase it."""
    fp16 = pipe.fp16(source, shape, CalibrationData(None, count=2))
    floor = check_onnx(refs, fp16.path, cases, precision, gates=gates)
    if floor.passed:
        return
    raise ParityError(f"repair {precision}: {floor.failures()[0]} even for the FP16 graph on {judged} (the reachable "
                      "floor): no set of nodes in high precision can pass that limit; judge on more images "
                      f"(--calib-data with more than --calib-count images) or set a limit the FP16 graph meets (--tol)")



def judged_on(folder, data, limit: int = REPAIR_PHOTOS):
    """The photographs a calibrated graph is judged on (build's verdict, repair's trials): the calibration folder's
    images the graph was not calibrated on (as verify judges it), else the embedded photographs; never the
    calibration images themselves unless the folder holds no others (said, as a warning, with how many it needs)."""
    if folder is None:
        return load_images(None, limit=limit), "the embedded photographs"
    calibrated = list(getattr(data, "image_paths", []) or [])
    try:
        photos = load_images(folder, limit=limit, leave_out=calibrated)
        return photos, f"{len(photos.images)} image(s) of {folder} it was not calibrated on"
    except UsageError:
        reporting.warning(f"every image of {folder} was calibrated on: the graph is judged on them (a verify on other "
                          f"images may disagree); give at least {len(calibrated) + 8} images (--calib-count "
                          f"{len(calibrated)} to calibrate, the rest to judge on)")
        photos = load_images(folder, limit=limit)
        return photos, f"{len(photos.images)} image(s) of {folder} it was calibrated on"


def effect_table(ranking: dict[str, float], quantized: float, full: float, top: int = 10) -> list[dict]:
    """The nodes whose quantization costs the gates most, as measured: per node, the share of what the
    gates allow (summed over checks) that keeping it alone in high precision takes away, on the ranking
    photographs (``quantized``: the INT8 graph's own figure there; ``full``: on every trial photograph)."""
    ranked = sorted(ranking.items(), key=lambda kv: -kv[1])[:top]
    return [{"node": name, "effect": round(value, 5), "of": round(quantized, 5)} for name, value in ranked if value > 0]
