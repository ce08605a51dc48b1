"""bench on the CPU (torch and ONNX Runtime), its skips and exit codes; doctor's report and checks."""

from __future__ import annotations

import json

import pytest

from conftest import assert_one_line_error
from enginekit import bench, doctor
from enginekit.errors import UsageError

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # the same answers on a machine that has one


# --- bench -----------------------------------------------------------------------------


def test_bench_cpu_writes_percentiles_and_skips_what_cannot_run(run_cli, tmp_path):
    result = run_cli("bench", "yolo12n", "--random-init", "--input", "1x3x256x256", "--batch", "1,2",
                     "--warmup", "1", "--iters", "4", "--backend", "torch,onnxruntime-cpu,tensorrt",
                     "--json", "--plot", "out.png", env=NO_GPU)
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (tmp_path / "out.png").read_bytes()[:4] == b"\x89PNG"
    assert report["model"] == "yolo12n" and report["input"]["image_shape"] == [3, 256, 256]
    rows = {(r["backend"], r["batch"]): r for r in report["results"]}
    for backend in ("torch-fp32", "onnxruntime-cpu"):
        for batch in (1, 2):
            row = rows[(backend, batch)]
            lat = row["latency_ms"]
            assert row["status"] == "ok" and row["device"] == "cpu", row
            assert set(lat) >= {"p50", "p90", "p95", "p99", "mean"}
            assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
            assert row["throughput_ips"] > 0 and row["iters"] == 4
            assert row["host_device_copies"] == "not applicable" and row["timer"] == "perf_counter"
    for backend in ("torch-fp16", "torch-fp16-cudagraph"):
        row = rows[(backend, 1)]
        assert row["status"] == "skipped" and "CUDA GPU" in row["reason"] and row["latency_ms"] is None
    trt = rows[("tensorrt", 1)]
    assert trt["status"] == "skipped" and "no GPU" in trt["reason"] and trt["latency_ms"] is None


def test_bench_unknown_backend_is_usage_error(run_cli):
    result = run_cli("bench", "yolo12n", "--random-init", "--backend", "torch,tensorflow")
    assert_one_line_error(result, 2, "unknown backend 'tensorflow'")


def test_bench_exits_3_when_nothing_can_run(run_cli, tmp_path):
    result = run_cli("bench", "yolo12n", "--random-init", "--input", "256x256", "--backend",
                     "tensorrt,torch-fp16", "--json", env=NO_GPU)
    assert_one_line_error(result, 3, "no backend could run here")
    rows = json.loads(result.stdout)["results"]
    assert rows and all(r["status"] == "skipped" and r["reason"] for r in rows)


def test_api_bench_returns_what_bench_json_prints():
    """enginekit.api.bench takes a BenchRequest's names and returns the rows `bench --json` prints, at a
    non-square input; what the request cannot take is one UsageError before any model loads."""
    from enginekit import api

    outcome = api.bench("yolo12n", random_init=True, input="96x160", batches=[2, 1], backends="torch-fp32",
                        warmup=0, iters=3, quiet=True)
    assert outcome.measured and outcome.settings[0].batches == (1, 2)
    rows = {(r.backend, r.batch): r for r in outcome.reports[0].rows}
    assert set(rows) == {("torch-fp32", 1), ("torch-fp32", 2)} and all(r.status == "ok" for r in rows.values())
    document = json.loads(json.dumps(outcome.to_json()))  # what `bench --json` prints (the CLI's test above)
    assert document["model"] == "yolo12n" and document["input"]["image_shape"] == [3, 96, 160]
    assert [(r["backend"], r["batch"], r["status"]) for r in document["results"]] == \
        [("torch-fp32", 1, "ok"), ("torch-fp32", 2, "ok")]
    assert all(0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] and r["iters"] == 3 for r in document["results"])
    for bad, needle in ((dict(models="yolo12n,depth", plot="p.png"), "--plot takes one model"),
                        (dict(models="yolo12n", image="bus.jpg"), "add --e2e"),
                        (dict(models="yolo12n", every=["depth=3"]), "add --stream"),
                        (dict(models="yolo12n", imgsz=320, input="320x320"), "give one"),
                        (dict(models="yolo12n", backends="torch,tensorflow"), "unknown backend 'tensorflow'"),
                        (dict(models="yolo12n", batches="1,x"), "malformed --batch"),
                        (dict(models="no-such-model"), "no-such-model")):
        with pytest.raises(UsageError, match=needle):
            api.bench(**bad, random_init=True)


def test_bench_flags_are_checked_before_work():
    assert bench.parse_backends("onnxruntime,torch-fp32") == ["torch-fp32", "onnxruntime-cpu", "onnxruntime-cuda"]
    assert bench.parse_batches("16,1,8,1") == [1, 8, 16]
    assert bench.parse_image_shape("518x518") == ((3, 518, 518), None)
    assert bench.parse_image_shape("8x3x640x640") == ((3, 640, 640), 8)
    for bad in (lambda: bench.parse_backends("tensorflow"), lambda: bench.parse_batches("1,x"),
                lambda: bench.parse_batches("0"), lambda: bench.BenchSettings("yolo12n", precision="int4"),
                lambda: bench.BenchSettings("yolo12n", iters=1)):
        with pytest.raises(UsageError):
            bad()


def test_latency_stats():
    stats = bench.latency_stats(list(range(1, 101)))
    assert stats["p50"] == pytest.approx(50.5) and stats["p99"] == pytest.approx(99.01)
    assert stats["mean"] == pytest.approx(50.5) and stats["min"] == 1 and stats["max"] == 100
    assert bench.throughput(8, 4.0) == 2000.0


# --- doctor ----------------------------------------------------------------------------


def clean_inventory(**changes) -> dict:
    """A machine with nothing wrong: TensorRT 10 and an RTX 4090, one onnxruntime."""
    inv = {
        "enginekit": "0.1.0",
        "python": "3.12.0",
        "platform": "Linux x86_64",
        "packages": {name: None for name in doctor.PACKAGES},
        "torch_cuda": "13.0",
        "gpu": {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9"},
        "onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
        "tensorrt_modules": {
            "tensorrt": {"module": "tensorrt", "version": "10.13.0", "error": None},
            "tensorrt-rtx": {"module": "tensorrt_rtx", "version": None, "error": "not installed"},
        },
        "cache": {"root": "/tmp/c", "exists": True, "size_bytes": 0, "entries": 0, "writable": True},
    }
    inv["packages"].update({"torch": "2.11.0", "ultralytics": "8.4.0", "transformers": "5.0.0", "onnx": "1.21.0",
                            "onnxruntime-gpu": "1.24.4", "tensorrt": "10.13.0"})
    inv.update(changes)
    return inv


def backend_row(inv: dict, name: str) -> dict:
    return next(r for r in doctor.capabilities(inv) if r["name"] == name)


def test_doctor_json_says_rtx_builds_but_cannot_run_without_gpu(run_cli):
    result = run_cli("doctor", "--json", env=NO_GPU)
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["gpu"] is None and "root" in report["cache"] and isinstance(report["warnings"], list)
    rows = {r["name"]: r for r in report["backends"]}
    assert rows["torch-cpu"]["can_run"] and rows["onnxruntime-cpu"]["can_run"]
    assert not rows["torch-cuda"]["can_run"] and not rows["tensorrt-10"]["can_build"]
    if not rows["tensorrt-rtx"]["installed"]:
        pytest.skip("the TensorRT-RTX wheels are not installed")
    assert rows["tensorrt-rtx"]["can_build"] is True and rows["tensorrt-rtx"]["can_run"] is False
    assert "no GPU" in rows["tensorrt-rtx"]["reason"]


def test_doctor_table_exits_0(run_cli):
    result = run_cli("doctor", env=NO_GPU)
    assert result.code == 0, result.stderr
    assert "tensorrt-rtx" in result.stdout and "cache:" in result.stdout


def test_doctor_clean_machine_has_no_warnings():
    inv = clean_inventory()
    assert doctor.warnings(inv) == []
    row = backend_row(inv, "tensorrt-10")
    assert row["can_build"] and row["can_run"]
    assert not backend_row(inv, "tensorrt-11")["installed"]
    assert backend_row(inv, "onnxruntime-cuda")["can_run"]


def test_doctor_warns_on_known_bad_combinations():
    both = clean_inventory()
    both["packages"]["onnxruntime"] = "1.24.4"
    assert any("onnxruntime-gpu" in w and "both" in w for w in doctor.warnings(both))

    hopper = clean_inventory(gpu={"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"})
    hopper["tensorrt_modules"]["tensorrt-rtx"] = {"module": "tensorrt_rtx", "version": "1.7.1", "error": None}
    assert any("TensorRT-RTX" in w and "9.0" in w for w in doctor.warnings(hopper))
    rtx = backend_row(hopper, "tensorrt-rtx")
    assert rtx["can_build"] and not rtx["can_run"] and "9.0" in rtx["reason"]

    old = clean_inventory()
    old["tensorrt_modules"]["tensorrt"]["version"] = "8.6.1"
    assert any("8.6.1 is too old" in w for w in doctor.warnings(old))
    assert not backend_row(old, "tensorrt-10")["installed"]

    cpu_torch = clean_inventory(torch_cuda=None)
    assert any("CPU-only build" in w for w in doctor.warnings(cpu_torch))


def test_doctor_without_gpu_builds_only_with_rtx():
    inv = clean_inventory(gpu=None)
    inv["tensorrt_modules"]["tensorrt-rtx"] = {"module": "tensorrt_rtx", "version": "1.7.1", "error": None}
    assert backend_row(inv, "tensorrt-rtx")["can_build"] and not backend_row(inv, "tensorrt-rtx")["can_run"]
    assert not backend_row(inv, "tensorrt-10")["can_build"]
    assert not backend_row(inv, "onnxruntime-cuda")["can_run"]


# --- engines, planned on a machine that reports a GPU it does not have --------------------


@pytest.fixture
def pretend_gpu(monkeypatch):
    """Make enginekit believe this machine has the given GPU (nothing runs on it here)."""
    import enginekit.gpu
    from enginekit.gpu import GpuInfo

    pytest.importorskip("tensorrt_rtx", reason="the TensorRT-RTX wheels are not installed")

    def pretend(name: str, cc: str) -> GpuInfo:
        gpu = GpuInfo(name, cc)
        monkeypatch.setattr(enginekit.gpu, "gpus", lambda: (gpu,))  # what every gpu_info() call asks
        return gpu

    return pretend


def engine_plan(cache, backends=("tensorrt-rtx",)):
    settings = bench.BenchSettings("yolo12n", batches=(1,), image_shape=(3, 128, 128), backends=backends,
                                   random_init=True, warmup=0, iters=2)
    return bench.prepare(settings, cache=cache, quiet=True)


def test_bench_builds_a_static_engine_for_a_gpu_rtx_can_run_on(pretend_gpu, cache):
    pretend_gpu("NVIDIA GeForce RTX 4090", "8.9")
    (item,) = engine_plan(cache).items
    assert item.skip is None and item.failure is None and not item.engine_skips
    manifest = json.loads((item.engines[1].parent / "manifest.json").read_text())
    assert manifest["targets"] == ["8.9"] and manifest["profiles"][0]["images"]["max"] == [1, 3, 128, 128]


def test_bench_skips_rtx_on_hopper_with_the_reason_before_building(pretend_gpu, cache):
    pretend_gpu("NVIDIA H100 80GB HBM3", "9.0")
    (item,) = engine_plan(cache).items
    assert item.skip is not None and "9.0" in item.skip and not item.engines
