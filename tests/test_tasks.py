"""Every Ultralytics task: the registry, each family's outputs by meaning and task metrics, bad input.

Task metric tests build each task's outputs by hand (so what changes is known exactly) and run
them through the one comparison path (``compare.comparison.compare``) with the family's own
parts and gates: identical outputs pass, a perturbation of the task's own channels fails the
task gate, and outputs with nothing to compare fail rather than pass. The graph tests export
real models (small inputs) and perturb the exported graph.
"""

from __future__ import annotations

import numpy as np
import pytest

from enginekit.compare.comparison import Case, Gates, compare
from enginekit.errors import UsageError
from enginekit.families import families, resolve

from conftest import assert_one_line_error

NAMES2 = str({0: "a", 1: "b"})


def _logit(p):
    return float(np.log(p) - np.log(1 - p))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cases_of(outputs: dict[str, np.ndarray], kind: str = "photo") -> list[Case]:
    n = len(next(iter(outputs.values())))
    return [Case(f"{kind} {i}", kind, {"images": np.full((1,), i, dtype=np.float32)},
                       {k: v[i:i + 1] for k, v in outputs.items()}) for i in range(n)]


def run_with(outputs: dict[str, np.ndarray]):
    def run(feed):
        i = int(feed["images"][0])
        return {k: v[i:i + 1] for k, v in outputs.items()}

    return run


def gate(name: str, reference: dict, candidate: dict, metadata: dict, precision: str = "fp16", **overrides):
    """The gates on hand-built outputs of a few instances (8): the share gates' intervals (tests/test_gates.py) are
    set aside for the point figures (min_detections 0), and the measured band near the operating point for the
    plain rule (conf_margin 0), unless a test sets them."""
    adapter = resolve(name)
    if any(m in ("recall", "precision") for per in adapter.task_gates.values() for m in per):
        overrides = {"min_detections": 0, "conf_margin": 0, **overrides}
    return compare(run_with(candidate), cases_of(reference), adapter=adapter, gates=Gates(adapter, overrides),
                   precision=precision, metadata=metadata, name=name)


def task_check(result, metric: str):
    return next(c for c in result.checks if c.name == f"task {metric}")


# -- registry -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, family, task", [
    ("yolo12n", "yolo", "detect"), ("yolo26n", "yolo", "detect"), ("yolo11n-seg", "yolo-seg", "segment"),
    ("yolo26s-pose", "yolo-pose", "pose"), ("yolo11n-obb", "yolo-obb", "obb"), ("yolo11n-cls", "yolo-cls", "classify"),
    ("yolo26n-sem", "yolo-sem", "semantic"), ("yolo26n-depth", "yolo-depth", "depth"),
    ("yolov8m-seg", "yolo-seg", "segment"), ("yolov9c-seg", "yolo-seg", "segment"), ("YOLO11N-POSE", "yolo-pose", "pose"),
    ("depth", "depth-anything-v2", "depth"),
])
def test_registry_resolves_every_task(name, family, task):
    adapter = resolve(name)
    assert (adapter.family, adapter.task) == (family, task)
    assert adapter.variant == name.lower() or name == "depth"


def test_every_family_describes_itself_with_its_task():
    rows = {f.family: f for f in families()}
    assert {"yolo", "yolo-seg", "yolo-pose", "yolo-obb", "yolo-cls", "yolo-sem", "yolo-depth",
            "depth-anything-v2"} <= set(rows)
    assert rows["yolo-seg"].task == "segment" and "yolo11{n,s,m,l,x}-seg" in rows["yolo-seg"].variants
    assert rows["yolo-sem"].variants == ["yolo26{n,s,m,l,x}-sem"]  # only yolo26 has a semantic head


@pytest.mark.parametrize("name, needle", [
    ("yolo11n-foo", "yolo11n has no task '-foo'"),
    ("yolo11n-sem", "yolo11n has no task '-sem'"),  # semantic heads exist for yolo26 only
    ("rtdetr-q", "expected a name like"),
    ("yolo", "expected a name like"),
])
def test_unknown_names_are_one_line_usage_errors(name, needle):
    with pytest.raises(UsageError) as err:
        resolve(name)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cli_unknown_task_exits_2(run_cli):
    result = run_cli("export", "yolo11n-foo", "--random-init")
    assert_one_line_error(result, 2, "yolo11n has no task '-foo'", "yolo11n-seg")


def test_cli_models_lists_every_task(run_cli):
    result = run_cli("models")
    assert result.code == 0, result.stderr
    for needle in ("segment", "pose", "obb", "classify", "semantic", "yolo11{n,s,m,l,x}-seg", "yolo26{n,s,m,l,x}-depth"):
        assert needle in result.stdout, needle


# -- task metrics on hand-built outputs ------------------------------------------------------------------
def instance_output(extra_rows: int, *, batch: int = 2, anchors: int = 120, nc: int = 2, seed: int = 0,
                    box=lambda k: (20 + 40 * k, 30 + 20 * k, 30, 24)):
    """(B, 4 + nc + extra, A): four objects (three anchors each, scores 0.5..0.9) among low-score anchors."""
    rng = np.random.default_rng(seed)
    out = np.zeros((batch, 4 + nc + extra_rows, anchors), dtype=np.float32)
    out[:, 0:2] = rng.uniform(10, 150, (batch, 2, anchors))
    out[:, 2:4] = rng.uniform(4, 12, (batch, 2, anchors))
    out[:, 4:4 + nc] = _sigmoid(rng.normal(-8, 1, (batch, nc, anchors)))
    for b in range(batch):
        for k in range(4):
            a = slice(3 * k, 3 * k + 3)
            out[b, 0:4, a] = np.array(box(k), dtype=np.float32)[:, None] + rng.normal(0, 0.5, (4, 3))
            out[b, 4 + k % nc, a] = _sigmoid(_logit(0.5 + 0.1 * k) - np.array([0.0, 0.8, 1.5]))
    return out


def seg_outputs(batch: int = 2, nm: int = 4):
    """Prototypes: channel q is +1 on quadrant q of a 160 px image (40 px prototypes), -1 elsewhere;
    object k sits in quadrant k and its coefficients pick channel k."""
    out = instance_output(nm, batch=batch, box=lambda k: (40 + 80 * (k % 2), 40 + 80 * (k // 2), 50, 40))
    proto = -np.ones((batch, nm, 40, 40), dtype=np.float32)
    for q in range(nm):
        proto[:, q, 20 * (q // 2):20 * (q // 2) + 20, 20 * (q % 2):20 * (q % 2) + 20] = 1.0
    proto *= (1.0 + 0.25 * np.arange(batch, dtype=np.float32))[:, None, None, None]  # each image its own (same masks)
    coeff = out[:, 6:]
    coeff[:] = 0.0
    for k in range(4):
        coeff[:, k, 3 * k:3 * k + 3] = 1.0
    coeff *= (1.0 + 0.5 * np.arange(batch, dtype=np.float32))[:, None, None]
    return {"output0": out, "output1": proto}


SEG_META = {"names": NAMES2, "end2end": "False"}


def test_segment_declares_boxes_scores_coefficients_prototypes():
    parts = {p.name: p for p in resolve("yolo11n-seg").output_parts(SEG_META)}
    assert list(parts) == ["boxes", "scores", "mask_coefficients", "prototypes"]
    ref = seg_outputs()
    assert parts["scores"].take(ref).shape == (2, 2, 120) and parts["mask_coefficients"].take(ref).shape == (2, 4, 120)


def test_segment_gate_passes_identical_and_fails_on_moved_masks():
    ref = seg_outputs()
    same = gate("yolo11n-seg", ref, {k: v.copy() for k, v in ref.items()}, SEG_META)
    assert same.passed, same.failures()
    assert same.task["compared"] == 8 and same.task["mask_map50"] > 0.99 and same.task["recall"] == 1.0
    moved = {k: v.copy() for k, v in ref.items()}
    moved["output1"] = np.roll(moved["output1"], 15, axis=3)  # prototypes 60 px to the right: masks leave their boxes
    bad = gate("yolo11n-seg", ref, moved, SEG_META, **{"prototypes.rel_l2": 10.0, "prototypes.cosine": 1e-6})
    assert not task_check(bad, "mask_map50").passed, bad.task
    assert all(c.passed for c in bad.checks if c.name.startswith("parity")), bad.failures()  # only the task gate saw it


def test_segment_masks_of_real_size_match_themselves():
    """Masks of objects that fill a 640 px input (tens of thousands of pixels at the prototypes' 160 px):
    identical outputs match one to one with mask IoU 1. (Ultralytics binarizes masks to uint8, whose
    matmul in mask_iou counted the intersection modulo 256: a 610-pixel mask's IoU with itself was 0.09.)"""
    nm = 4
    out = instance_output(nm, box=lambda k: (160 + 320 * (k % 2), 160 + 320 * (k // 2), 300, 280))
    proto = -np.ones((2, nm, 160, 160), dtype=np.float32)
    for q in range(nm):
        proto[:, q, 80 * (q // 2):80 * (q // 2) + 80, 80 * (q % 2):80 * (q % 2) + 80] = 1.0
    out[:, 6:] = 0.0
    for k in range(4):
        out[:, 6 + k, 3 * k:3 * k + 3] = 1.0
    ref = {"output0": out, "output1": proto}
    found = resolve("yolo11n-seg").task_metrics(ref, {k: v.copy() for k, v in ref.items()}, SEG_META)
    assert found["compared"] == 8 and found["recall"] == 1.0 and found["precision"] == 1.0
    assert found["mask_similarity_mean"] == 1.0 and found["mask_map50_95"] > 0.99, found


def test_segment_end2end_rows():
    """yolo26-seg: (B, max_det, 6 + nm) rows of x1 y1 x2 y2 score class coefficients."""
    ref = seg_outputs()
    out0 = ref["output0"]
    rows = np.zeros((2, 300, 6 + 4), dtype=np.float32)
    scores = out0[:, 4:6].max(1)
    for b in range(2):
        order = np.argsort(-scores[b])[:300]
        xywh = out0[b, :4, order]
        rows[b, :len(order), 0:2] = xywh[:, :2] - xywh[:, 2:] / 2
        rows[b, :len(order), 2:4] = xywh[:, :2] + xywh[:, 2:] / 2
        rows[b, :len(order), 4] = scores[b, order]
        rows[b, :len(order), 5] = out0[b, 4:6, order].argmax(1)
        rows[b, :len(order), 6:] = out0[b, 6:, order]
    ref2 = {"output0": rows, "output1": ref["output1"]}
    meta = {**SEG_META, "end2end": "True"}
    assert [p.name for p in resolve("yolo26n-seg").output_parts(meta)] == ["boxes", "scores", "classes",
                                                                           "mask_coefficients", "prototypes"]
    # one2one heads keep every anchor's row: only the top-scored anchor of an object would survive training,
    # here the three anchors of an object all do, so precision counts duplicates; recall and masks hold
    result = gate("yolo26n-seg", ref2, {k: v.copy() for k, v in ref2.items()}, meta)
    assert result.task["recall"] == 1.0 and result.task["mask_map50"] > 0.99


def test_segment_with_nothing_to_compare_fails():
    ref = seg_outputs()
    ref["output0"][:, 4:6] = 1e-4  # nothing above 0.25
    result = gate("yolo11n-seg", ref, {k: v.copy() for k, v in ref.items()}, SEG_META)
    assert not result.passed
    assert any("nothing to compare" in c.name for c in result.checks), result.failures()


def pose_outputs():
    out = instance_output(17 * 3)
    rng = np.random.default_rng(1)
    for b in range(2):
        for k in range(4):
            cx, cy, w, h = out[b, 0:4, 3 * k]
            kx = cx + rng.uniform(-w / 2, w / 2, 17)
            ky = cy + rng.uniform(-h / 2, h / 2, 17)
            for a in range(3 * k, 3 * k + 3):
                out[b, 6::3, a], out[b, 7::3, a], out[b, 8::3, a] = kx, ky, 0.9
    return {"output0": out}


def test_pose_gate_passes_identical_and_fails_on_moved_keypoints():
    meta = {"names": NAMES2, "end2end": "False", "kpt_shape": "[17, 3]"}
    ref = pose_outputs()
    assert [p.name for p in resolve("yolo11n-pose").output_parts(meta)] == ["boxes", "scores", "keypoints"]
    same = gate("yolo11n-pose", ref, {"output0": ref["output0"].copy()}, meta)
    assert same.passed, same.failures()
    assert same.task["pose_map50"] > 0.99 and same.task["pose_similarity_mean"] > 0.99
    moved = ref["output0"].copy()
    moved[:, 6::3] += 6.0  # every keypoint 6 px to the right: boxes and scores untouched
    bad = gate("yolo11n-pose", ref, {"output0": moved}, meta, **{"keypoints.rel_l2": 10.0, "keypoints.cosine": 1e-6})
    assert not task_check(bad, "pose_map50").passed and not task_check(bad, "recall").passed, bad.task
    assert bad.task["box_map50"] > 0.99  # the boxes still agree: only keypoints moved


def test_obb_gate_passes_identical_and_fails_on_turned_boxes():
    meta = {"names": NAMES2, "end2end": "False"}
    out = instance_output(1, box=lambda k: (30 + 35 * k, 80, 40, 10))  # long thin boxes
    out[:, 6] = (0.3 + 0.05 * np.arange(len(out), dtype=np.float32))[:, None]  # each image its own angle
    ref = {"output0": out}
    same = gate("yolo11n-obb", ref, {"output0": out.copy()}, meta)
    assert same.passed, same.failures()
    assert same.task["map50"] > 0.99
    turned = out.copy()
    turned[:, 6] += 0.9  # 52 degrees
    bad = gate("yolo11n-obb", ref, {"output0": turned}, meta, **{"angle.rel_l2": 10.0, "angle.cosine": 1e-6})
    assert not task_check(bad, "map50").passed, bad.task


def test_obb_conf_margin_turns_threshold_flips_into_kept_instances():
    """An instance the candidate scores 0.01 under the operating point is lost by the plain rule and a
    threshold flip within a margin of 0.02; 0.04 under it, it is lost either way."""
    meta = {"names": NAMES2, "end2end": "False"}
    out = instance_output(1, box=lambda k: (30 + 35 * k, 80, 40, 10))
    out[:, 6] = (0.3 + 0.05 * np.arange(len(out), dtype=np.float32))[:, None]  # each image its own angle
    ref = {"output0": out}
    assert np.allclose(out[:, 4, 0], 0.5)  # object 0's best anchor; its others score 0.31 and 0.18
    conf = 0.49
    under = out.copy()
    under[:, 4, 0] = 0.48
    plain = gate("yolo11n-obb", ref, {"output0": under}, meta, conf=conf, **{"scores.max_abs": 1.0})
    assert not task_check(plain, "recall").passed and plain.task["recall"] == 0.75, plain.task  # 6 of 8
    assert "threshold_flips" not in plain.task
    flipped = gate("yolo11n-obb", ref, {"output0": under}, meta, conf=conf, conf_margin=0.02, **{"scores.max_abs": 1.0})
    assert flipped.passed, (flipped.failures(), flipped.task)
    assert flipped.task["recall"] == 1.0 and flipped.task["threshold_flips"] == 2 and flipped.task["map50"] > 0.99
    further = under.copy()
    further[:, 4, 0] = 0.45
    lost = gate("yolo11n-obb", ref, {"output0": further}, meta, conf=conf, conf_margin=0.02, **{"scores.max_abs": 1.0})
    assert not task_check(lost, "recall").passed and lost.task["recall"] == 0.75, lost.task


def test_classify_gate_passes_identical_and_fails_on_swapped_top1():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1, (4, 10))
    logits[np.arange(4), [1, 3, 5, 7]] += 4
    probs = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
    meta = {"names": str({i: str(i) for i in range(10)}), "end2end": "False"}
    same = gate("yolo11n-cls", {"output0": probs}, {"output0": probs.copy()}, meta)
    assert same.passed, same.failures()
    assert same.task["top1_agreement"] == 1.0 and same.task["top5_overlap"] == 1.0
    swapped = probs.copy()
    for i, top in enumerate([1, 3, 5]):  # three of four images change their top-1 (to class 0)
        swapped[i, [top, 0]] = swapped[i, [0, top]]
    bad = gate("yolo11n-cls", {"output0": probs}, {"output0": swapped}, meta, rel_l2=10.0, cosine=1e-6)
    assert not task_check(bad, "top1_agreement").passed and bad.task["top1_agreement"] == 0.25


def test_classify_uniform_reference_has_nothing_to_compare():
    flat = np.full((2, 1000), 1e-3, dtype=np.float32) + np.random.default_rng(0).normal(0, 1e-9, (2, 1000)).astype(
        np.float32)
    result = gate("yolo11n-cls", {"output0": flat}, {"output0": flat.copy()}, {"names": "{}", "end2end": "False"})
    assert not result.passed and result.task["compared"] == 0


def test_semantic_gate_passes_identical_and_fails_on_a_grown_class():
    logits = np.zeros((2, 3, 64, 64), dtype=np.float32)
    logits[:, 0, :, :32] = 3  # left half class 0, right half class 1, a square of class 2
    logits[:, 1, :, 32:] = 3
    logits[:, 2, 20:40, 20:40] = 6
    logits[1] *= 1.5  # each image its own logits (the same classes): a reference that depends on its input
    same = gate("yolo26n-sem", {"output0": logits}, {"output0": logits.copy()}, {"names": "{}", "end2end": "False"})
    assert same.passed, same.failures()
    assert same.task["miou"] == 1.0 and same.task["reference_classes"] == 3
    grown = logits.copy()
    grown[:, 2, 10:50, 10:50] = 6  # class 2 takes 4x its area
    bad = gate("yolo26n-sem", {"output0": logits}, {"output0": grown}, {"names": "{}", "end2end": "False"},
               rel_l2=10.0, cosine=1e-6)
    assert not task_check(bad, "miou").passed, bad.task


def test_semantic_single_class_reference_has_nothing_to_compare():
    logits = np.zeros((2, 3, 16, 16), dtype=np.float32)
    logits[:, 1] = 1.0
    result = gate("yolo26n-sem", {"output0": logits}, {"output0": logits.copy()}, {"names": "{}", "end2end": "False"})
    assert not result.passed and result.task["compared"] == 0


def test_yolo_depth_gate_fails_on_flattened_depth_and_on_constant_reference():
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    depth = (1.0 + xx / 8 + yy / 16)[None, None].repeat(2, 0)
    depth[1] *= 1.3  # each image its own depth: a reference that depends on its input
    same = gate("yolo26n-depth", {"output0": depth}, {"output0": depth.copy()}, {"end2end": "False"})
    assert same.passed, same.failures()
    flat = depth.copy()
    flat[..., :, 16:] = flat[..., :, 16:16 + 1]  # right half loses its gradient
    bad = gate("yolo26n-depth", {"output0": depth}, {"output0": flat}, {"end2end": "False"}, rel_l2=10.0, cosine=1e-6)
    assert not task_check(bad, "abs_rel").passed, bad.task
    const = np.full((2, 1, 8, 8), 1.2, dtype=np.float32)
    nothing = gate("yolo26n-depth", {"output0": const}, {"output0": const.copy()}, {"end2end": "False"})
    assert not nothing.passed and nothing.task["compared"] == 0


def test_rtdetr_gate_passes_identical_and_fails_on_lost_queries():
    """RT-DETR's export: the top 300 of (cx, cy, w, h in 0..1, score, class)."""
    rng = np.random.default_rng(0)
    out = np.zeros((2, 300, 6), dtype=np.float32)
    out[:, :, :4] = rng.uniform(0.05, 0.2, (2, 300, 4))
    out[:, :, 4] = np.sort(rng.uniform(0, 0.05, (2, 300)), axis=1)[:, ::-1]
    out[:, :, 5] = rng.integers(0, 2, (2, 300))
    for k in range(4):  # the four objects come first, by descending score
        out[:, k] = [0.15 + 0.2 * k, 0.5, 0.12, 0.2, 0.9 - 0.1 * k, k % 2]
    same = gate("rtdetr-l", {"output0": out}, {"output0": out.copy()}, {"end2end": "True"})
    assert same.passed, same.failures()
    assert same.task["compared"] == 8 and same.task["map50"] > 0.99
    lost = out.copy()
    lost[:, 3, 4] = 0.1  # the weakest object drops under 0.25 in every image
    bad = gate("rtdetr-l", {"output0": out}, {"output0": lost}, {"end2end": "True"},
               **{"scores.rel_l2": 10.0, "scores.cosine": 1e-6, "scores.max_abs": 1.0})
    assert not task_check(bad, "recall").passed and bad.task["recall"] == 0.75
    # the weakest object just over the operating point and just under it: a threshold flip with a margin, a loss
    # without; a score that falls from 0.6 to just under it is lost whatever the margin
    near = out.copy()
    near[:, 3, 4] = 0.26
    flipped = out.copy()
    flipped[:, 3, 4] = 0.24
    loose = {"scores.rel_l2": 10.0, "scores.cosine": 1e-6, "scores.max_abs": 1.0}
    assert gate("rtdetr-l", {"output0": near}, {"output0": flipped}, {"end2end": "True"}, **loose).task["recall"] == 0.75
    margin = gate("rtdetr-l", {"output0": near}, {"output0": flipped}, {"end2end": "True"}, conf_margin=0.02, **loose)
    assert task_check(margin, "recall").passed and margin.task["threshold_flips"] == 2
    fell = gate("rtdetr-l", {"output0": out}, {"output0": flipped}, {"end2end": "True"}, conf_margin=0.02, **loose)
    assert not task_check(fell, "recall").passed and fell.task["recall"] == 0.75 and fell.task["threshold_flips"] == 0


def test_decoded_instances_are_scored_against_labels_as_well():
    """Decoding (outputs -> instances in the input's pixels) is the family's, the metrics compare instances
    with instances: labels (score 1) can be the reference side. Four labelled objects per image, found by the
    detector's outputs; the same labels 40 px away are not."""
    from enginekit.compare.instances import CONF_MAP, Instances, box_iou, instance_metrics

    adapter = resolve("yolo12n")
    out = instance_output(0)  # (2, 4 + 2, 120): four objects, their best anchor scores 0.5 .. 0.8
    meta = {"names": NAMES2, "end2end": "False"}
    found = adapter.decode({"output0": out}, meta, 0.25)
    ranked = adapter.decode({"output0": out}, meta, CONF_MAP)
    centres = np.array([(20 + 40 * k, 30 + 20 * k) for k in range(4)], np.float32)
    corners = np.concatenate([centres - (15, 12), centres + (15, 12)], 1)

    def labels(shift):
        return [Instances(corners + shift, np.ones(4, np.float32), np.arange(4) % 2) for _ in range(2)]

    right = instance_metrics(labels(0), found, ranked, box_iou, conf=0.25)
    assert right["compared"] == 8 and right["recall"] == 1.0 and right["map50"] > 0.99
    wrong = instance_metrics(labels(40), found, ranked, box_iou, conf=0.25)
    assert wrong["recall"] == 0.0 and wrong["map50"] == 0.0


# -- checkpoints of another task ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seg_checkpoint(tmp_path_factory):
    """A random yolo11n-seg checkpoint in Ultralytics' format (its model says task 'segment')."""
    adapter = resolve("yolo11n-seg")
    loaded = adapter.load(None, random_init=True, seed=0)
    path = tmp_path_factory.mktemp("ckpt") / "seg.pt"
    adapter.save_checkpoint(loaded, path)
    return path


def test_cli_checkpoint_of_another_task_exits_2(run_cli, seg_checkpoint):
    result = run_cli("export", "yolo11n", "--weights", str(seg_checkpoint), "--input", "1x3x160x160")
    assert_one_line_error(result, 2, "is a segment model", "yolo11n is a detect model", "yolo11n-seg")


def test_checkpoint_of_the_right_task_loads(seg_checkpoint):
    loaded = resolve("yolo11n-seg").load(seg_checkpoint, random_init=False, seed=0)
    assert loaded.metadata["task"] == "segment" and loaded.metadata["head"] == "Segment"


# -- trained models: exported graphs pass, perturbed graphs fail --------------------------------------------
def perturb_graph(src, dst, node_pattern: str, change) -> list[str]:
    """Apply ``change(array)`` to the weights and bias of every node whose name matches ``node_pattern``."""
    import re

    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    touched = []
    for node in model.graph.node:
        if re.match(node_pattern, node.name):
            for name in node.input[1:]:
                if name in inits:
                    array = change(numpy_helper.to_array(inits[name]).copy())
                    inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
            touched.append(node.name)
    onnx.save(model, str(dst))
    assert touched, f"no node matches {node_pattern}"
    return touched


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    from trained_tasks import held_out_images

    root = tmp_path_factory.mktemp("held-out")
    return {task: held_out_images(root / task, task, count=8) for task in ("segment", "pose", "obb", "classify")}


def _trained_comparison(task: str, name: str, folder, tmp_path, perturb: tuple[str, object] | None, conf: float):
    """Export the trained model at 160 px, compare the FP32 graph (or a perturbed copy) on held-out images."""
    from trained_tasks import trained_task_model

    from enginekit.images import load_images
    from enginekit.onnx import runtime
    from enginekit.stages.export import export_onnx

    adapter = resolve(name)
    loaded = adapter.load(trained_task_model(task), random_init=False, seed=0)
    hw = (96, 96) if task == "classify" else (160, 160)
    onnx_path = export_onnx(adapter, loaded, (1, 3, *hw), tmp_path / f"{name}.onnx")
    if perturb is not None:
        perturb_graph(onnx_path, onnx_path, *perturb)
    sess = runtime.session(onnx_path)
    cases = []
    for i, image in enumerate(load_images(folder).images):
        feed = {adapter.input_name: adapter.preprocess(image, hw)}
        cases.append(Case(f"photo {i}", "photo", feed, adapter.reference(loaded, feed[adapter.input_name])))
    overrides = {"conf": conf} if "conf" in adapter.task_options else {}
    return compare(lambda feed: runtime.run(sess, feed), cases, adapter=adapter, gates=Gates(adapter, overrides),
                   precision="fp32", metadata=loaded.metadata, name=name)


def _negate_weights(a):
    return -a if a.ndim > 1 else a


def _shift_bias(a):
    return a + 1.0 if a.ndim == 1 else a


# task -> (name, the task metric gated, (node, change) of the perturbed graph, operating confidence: the
# small pose and obb models score their shapes lower than 0.25 after 12 epochs)
TRAINED = {
    # mask prototypes: the last convolution's weights negated
    "segment": ("yolo11n-seg", "mask_map50", (r"/model\.\d+/proto/cv3/", _negate_weights), 0.25),
    # keypoint branch: its last convolution's bias + 1 (every keypoint 2 strides off)
    "pose": ("yolo11n-pose", "pose_map50", (r"/model\.\d+/cv4\.\d/cv4\.\d\.2/", _shift_bias), 0.1),
    # the shapes' rotated boxes are near square, which no angle change alters much: the box branch's weights
    # negated (a shift of its bias would not do: box sides are a softmax over bins)
    "obb": ("yolo11n-obb", "map50", (r"/model\.\d+/cv2\.\d/cv2\.\d\.2/", _negate_weights), 0.1),
    # the classifier's weights negated
    "classify": ("yolo11n-cls", "top1_agreement", (r"/model\.\d+/linear/", _negate_weights), None),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TRAINED))
def test_trained_task_graph_passes_and_its_perturbed_graph_fails(task, held_out, tmp_path):
    name, metric, perturbation, conf = TRAINED[task]
    good = _trained_comparison(task, name, held_out[task], tmp_path, None, conf)
    assert good.passed, (good.failures(), good.task)
    assert good.task["compared"] >= 4 and good.task[metric] > 0.98, good.task
    bad = _trained_comparison(task, name, held_out[task], tmp_path, perturbation, conf)
    failed = {c.name for c in bad.checks if not c.passed}
    assert f"task {metric}" in failed, (bad.task, failed)


# -- every head exports as Ultralytics' exporter sets it up ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name, shapes, end2end", [
    # both branches: its one-to-many one, as YOLO(pt).predict runs it at its default (nms=None): 4 + 80 channels
    # over the anchors of 128 x 128 (16 x 16 + 8 x 8 + 4 x 4)
    ("yolo26n", {"output0": (2, 84, 336)}, "False"),
    ("yolo26n-sem", {"output0": (2, 19, 128, 128)}, "False"),  # logits at the input's size
    ("yolo26n-depth", {"output0": (2, 1, 128, 128)}, "False"),
])
def test_heads_export_in_export_mode(name, shapes, end2end, tmp_path):
    from enginekit.onnx import runtime
    from enginekit.stages.export import export_onnx

    adapter = resolve(name)
    loaded = adapter.load(None, random_init=True, seed=0)
    assert loaded.metadata["end2end"] == end2end
    path = export_onnx(adapter, loaded, (1, 3, 128, 128), tmp_path / f"{name}.onnx")
    batch = adapter.random_inputs((2, 3, 128, 128), 0)
    got = runtime.run(runtime.session(path), {adapter.input_name: batch})
    ref = adapter.reference(loaded, batch)
    assert {k: v.shape for k, v in got.items()} == shapes == {k: v.shape for k, v in ref.items()}
    if end2end == "False":  # dense outputs: the graph computes what PyTorch does
        for part in adapter.output_parts(loaded.metadata):
            r, g = part.take(ref), part.take(got)
            assert np.abs(r - g).max() <= 1e-4 * max(1.0, float(np.abs(r).max())), part.name
