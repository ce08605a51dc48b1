"""bench --e2e: per-frame rows through the runtime (decode, preprocess, infer, postprocess) beside the
network-only rows, the two-model pipeline row, and the errors that stop it before any work."""

from __future__ import annotations

import json

import pytest

from conftest import assert_one_line_error

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
FAST = ("--random-init", "--input", "224x224", "--backend", "onnxruntime-cpu", "--warmup", "1", "--iters", "3")


def _check_e2e_row(row: dict, network_p50: float) -> None:
    assert row["status"] == "ok" and row["device"] == "cpu" and row["runtime"] == "onnxruntime-cpu", row
    lat = row["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"], lat
    assert row["throughput_fps"] > 0 and row["iters"] == 3
    # the ratio is the end-to-end p50 over the network-only row's p50 at batch 1, on the same backend
    assert row["network_p50_ms"] == pytest.approx(network_p50)
    assert row["ratio_e2e_over_network"] == pytest.approx(lat["p50"] / network_p50, rel=1e-2)
    # each frame's time holds its infer stage (decode, preprocess and postprocess besides): the ratio of their
    # means cannot be below 1 on any machine; how far above is the benchmark's figure, not a test's
    assert row["ratio_e2e_over_infer"] >= 1


def _stage_sum(stages: dict) -> float:
    return sum(v if isinstance(v, float) else sum(v.values()) for v in stages.values())


def _check_stages_fit_the_frame(row: dict) -> None:
    """The stages are timed inside each frame: every one took some time and their means add up to no more
    than the mean frame (rounding aside). How much of the frame they cover depends on the machine's load."""
    stages = [v for s in row["stages_ms"].values() for v in ((s,) if isinstance(s, float) else s.values())]
    assert all(v > 0 for v in stages), row["stages_ms"]
    assert _stage_sum(row["stages_ms"]) <= row["latency_ms"]["mean"] + 1e-3 * len(stages), row


def test_bench_e2e_two_models_rows_stages_and_pipeline(run_cli):
    result = run_cli("bench", "yolo12n,depth", *FAST, "--e2e", "--json", env=NO_GPU)
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    networks = {m["model"]: m for m in report["models"]}
    assert set(networks) == {"yolo12n", "depth-anything-v2-small"}
    net_p50 = {name: next(r["latency_ms"]["p50"] for r in m["results"] if r["backend"] == "onnxruntime-cpu"
                          and r["batch"] == 1) for name, m in networks.items()}
    e2e = report["end_to_end"]
    assert e2e["image"]["name"] and len(e2e["image"]["hw"]) == 2
    rows = {(tuple(r["models"]), r["kind"]): r for r in e2e["results"]}
    for model in networks:
        row = rows[((model,), "model")]
        _check_e2e_row(row, net_p50[model])
        assert set(row["stages_ms"]) == {"decode", "preprocess", "infer", "postprocess"}
        assert row["input_hw"] == {model: [224, 224]}
        _check_stages_fit_the_frame(row)
    pipe = rows[(("yolo12n", "depth-anything-v2-small"), "pipeline")]
    _check_e2e_row(pipe, sum(net_p50.values()))
    assert set(pipe["stages_ms"]) == {"decode", "yolo12n", "depth-anything-v2-small"}
    assert set(pipe["stages_ms"]["yolo12n"]) == {"preprocess", "infer", "postprocess"}
    _check_stages_fit_the_frame(pipe)


def test_bench_e2e_one_model_table_and_json(run_cli):
    result = run_cli("bench", "yolo12n", *FAST, "--e2e", env=NO_GPU)
    assert result.code == 0, result.stderr
    assert "end to end per frame" in result.stdout and "e2e/net" in result.stdout
    result = run_cli("bench", "yolo12n", *FAST, "--e2e", "--json", env=NO_GPU)
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["model"] == "yolo12n" and report["results"]  # the network report, as without --e2e
    (row,) = report["end_to_end"]["results"]
    assert row["kind"] == "model" and row["ratio_e2e_over_network"] > 0


def test_bench_without_e2e_has_no_end_to_end(run_cli):
    result = run_cli("bench", "yolo12n", *FAST, "--json", env=NO_GPU)
    assert result.code == 0, result.stderr
    assert "end_to_end" not in json.loads(result.stdout)


def test_bench_e2e_bad_model_or_image_is_one_error_line(run_cli, tmp_path):
    result = run_cli("bench", "yolo12n,nosuchmodel", "--random-init", "--e2e")
    assert_one_line_error(result, 2, "nosuchmodel")
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    result = run_cli("bench", "yolo12n", "--random-init", "--e2e", "--image", "broken.jpg")
    assert_one_line_error(result, 2, "not a readable image")
    result = run_cli("bench", "yolo12n", "--random-init", "--e2e", "--image", "missing.jpg")
    assert_one_line_error(result, 2, "image not found")
    result = run_cli("bench", "yolo12n", "--random-init", "--image", "broken.jpg")
    assert_one_line_error(result, 2, "add --e2e")
    result = run_cli("bench", "yolo12n,depth", "--random-init", "--plot", "x.png")
    assert_one_line_error(result, 2, "--plot takes one model")
