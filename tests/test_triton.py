"""`enginekit deploy triton`: the repository it writes, read as Triton reads it, and served by a real Triton.

The server is the ``tritonserver`` nvidia-pytriton ships (Python backend only, no GPU): end to end the network
runs on ``--platform python`` (enginekit's ONNX Runtime session inside the server); the ``onnxruntime_onnx``
and ``tensorrt_plan`` configs are checked against Triton's model-config protobuf. What the server answers is
compared with ``enginekit predict`` on the same images: a random-weight yolo12n on the photographs, and the
suite's trained detector on generated non-square images (scores that spread, so a wrong letterbox or box
scaling shows).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error
from trained_tasks import trained_task_model
from triton_server import Server, triton_home

tritonclient = pytest.importorskip("tritonclient.http")


def _photo(name: str) -> Path:
    import ultralytics

    return Path(ultralytics.__file__).parent / "assets" / name


def _iou(a, b) -> float:
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _matched(served: list[dict], predicted: list[dict]) -> tuple[int, float]:
    """(detections of ``predicted`` with a same-class partner in ``served`` at IoU >= 0.99, the lowest IoU of
    the pairs), each served detection used once, best score first."""
    free = list(served)
    worst, hits = 1.0, 0
    for d in sorted(predicted, key=lambda d: -d["score"]):
        same = [(s, _iou(s["box"], d["box"])) for s in free if s["class_id"] == d["class_id"]]
        if not same:
            continue
        s, iou = max(same, key=lambda p: p[1])
        if iou >= 0.99:
            hits += 1
            worst = min(worst, iou)
            free.remove(s)
    return hits, worst


# -- the configs, as Triton's protobuf reads them (no server) ------------------------------------------
def test_configs_read_as_triton_model_configs():
    from enginekit.serving import triton

    inputs = [triton.TensorSpec("images", "TYPE_FP32", (-1, 3, -1, -1))]
    outputs = [triton.TensorSpec("output0", "TYPE_FP32", (-1, 84, -1))]
    serving = triton.Serving(max_batch=8, preferred=[4, 8], queue_delay_us=500, instances=2)
    ort = triton.parse_config(triton.net_config("m-net", "onnxruntime", inputs, outputs, serving))
    assert ort.platform == "onnxruntime_onnx" and ort.max_batch_size == 8
    assert list(ort.input[0].dims) == [3, -1, -1] and list(ort.output[0].dims) == [84, -1]  # batch dim left out
    assert list(ort.dynamic_batching.preferred_batch_size) == [4, 8]
    assert ort.dynamic_batching.max_queue_delay_microseconds == 500
    assert ort.instance_group[0].count == 2 and ort.instance_group[0].kind == ort.instance_group[0].KIND_GPU

    profiles = [{"images": {"min": [1, 3, 640, 640], "opt": [4, 3, 640, 640], "max": [8, 3, 640, 640]}}]
    fixed = triton.with_profile(inputs, profiles)
    assert fixed[0].dims == (-1, 3, 640, 640)  # the engine fixes H x W; the batch stays dynamic
    assert triton.profile_max_batch(profiles, "images") == 8
    plan = triton.parse_config(triton.net_config("m-net", "tensorrt", fixed, outputs, serving))
    assert plan.platform == "tensorrt_plan" and list(plan.input[0].dims) == [3, 640, 640]

    unbatched = triton.parse_config(triton.net_config(
        "m-net", "onnxruntime", [triton.TensorSpec("x", "TYPE_FP16", (1, 3, 64, 64))], outputs,
        triton.Serving(max_batch=0)))
    assert unbatched.max_batch_size == 0 and list(unbatched.input[0].dims) == [1, 3, 64, 64]
    assert not unbatched.HasField("dynamic_batching")

    front = triton.parse_config(triton.front_config("m", "segments", serving, "/env"))
    assert front.backend == "python" and front.max_batch_size == 8
    assert [i.name for i in front.input] == ["IMAGE", "ENCODED"] and all(i.optional for i in front.input)
    assert [o.name for o in front.output] == ["RESULT", "BOXES", "SCORES", "CLASSES", "MASKS"]
    assert front.parameters["EXECUTION_ENV_PATH"].string_value == "/env"
    assert front.instance_group[0].kind == front.instance_group[0].KIND_CPU
    with pytest.raises(ValueError, match="not a Triton model config"):  # the check reads, it does not nod
        triton.parse_config('name: "m"\nmax_batch_size: "eight"\n')


def test_result_tensors_follow_the_results():
    from enginekit.results import Detections, SemanticMap
    from enginekit.serving.triton import OUTPUTS, result_tensors

    det = Detections(np.array([[1, 2, 30, 40]], np.float32), np.array([0.9], np.float32), np.array([2]), ["bus"],
                     (48, 64))
    t = result_tensors(det)
    assert set(t) == {"RESULT", *(n for n, _, _ in OUTPUTS["detections"])}
    record = json.loads(t["RESULT"].tobytes())
    assert record["detections"][0]["name"] == "bus" and record["image_shape"] == [48, 64]
    assert t["BOXES"].shape == (1, 4) and t["CLASSES"].tolist() == [2]
    sem = SemanticMap(np.array([[0, 1], [1, 1]]), {0: "sky", 1: "road"}, (2, 2))
    assert result_tensors(sem)["CLASS_MAP"].tolist() == [[0, 1], [1, 1]]


# -- the verb ---------------------------------------------------------------------------------------
def test_deploy_writes_a_checked_repository_once(run_cli, tmp_path):
    repo = tmp_path / "models"
    first = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(repo), "--preferred", "4")
    assert first.code == 0, first.stderr
    assert first.stdout.strip() == str(repo.resolve())
    net = (repo / "yolo12n-net" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in net and "preferred_batch_size: [ 4 ]" in net
    assert "kind: KIND_AUTO" in net  # loads on a server with no GPU too (the GPU where it has one)
    assert (repo / "yolo12n-net" / "1" / "model.onnx").stat().st_size > 1_000_000
    assert "Verified: fp32 graph: parity with PyTorch passed at export" in (repo / "yolo12n" / "README.md").read_text()
    assert "`yolo12n` and `yolo12n-net`" in (repo / "README.md").read_text()
    record = json.loads((repo / "yolo12n" / "1" / "enginekit.json").read_text())
    assert record["net"] == "yolo12n-net" and record["info"]["input_name"] == "images"
    assert "(miss)" in first.stderr

    again = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(repo), "--preferred", "4")
    assert again.code == 0 and "(hit)" in again.stderr, again.stderr
    assert (repo / "yolo12n-net" / "config.pbtxt").read_text() == net
    assert not [p for p in repo.iterdir() if p.name.startswith(".enginekit-deploy")]  # no staging left

    other = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(repo), "--max-batch", "2")
    assert other.code == 0 and "(miss)" in other.stderr  # another option, another entry
    assert "max_batch_size: 2" in (repo / "yolo12n-net" / "config.pbtxt").read_text()


def test_the_repository_travels_through_the_team_store(run_cli, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    url = f"file://{store}"
    # --instances 3: options no other test deploys, so the entry is made (and pushed) here
    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(tmp_path / "a"), "--instances", "3",
                "--remote", url)
    assert r.code == 0, r.stderr
    key = r.stderr.split("repository entry ")[1].split()[0]
    listed = run_cli("cache", "ls", "--remote", url, "--json")
    assert listed.code == 0 and any(e["kind"] == "triton-repo" and e["key"].startswith(key)
                                    for e in json.loads(listed.stdout)["entries"]), listed.stdout
    other = tmp_path / "other-cache"
    pulled = run_cli("cache", "pull", key, "--remote", url, env={"ENGINEKIT_CACHE": str(other)})
    assert pulled.code == 0, pulled.stderr
    (entry,) = (other / "triton-repo").iterdir()
    for model in ("yolo12n", "yolo12n-net"):
        assert (entry / model / "config.pbtxt").read_text() == (tmp_path / "a" / model / "config.pbtxt").read_text()
    assert (entry / "yolo12n-net" / "1" / "model.onnx").read_bytes() == \
        (tmp_path / "a" / "yolo12n-net" / "1" / "model.onnx").read_bytes()


def test_deploy_refusals(run_cli, tmp_path):
    repo = tmp_path / "models"
    (repo / "yolo12n").mkdir(parents=True)
    (repo / "yolo12n" / "config.pbtxt").write_text('name: "yolo12n"\n')  # someone's own model
    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(repo))
    assert_one_line_error(r, 2, "yolo12n/ exists and was not written by enginekit deploy")
    assert (repo / "yolo12n" / "config.pbtxt").read_text() == 'name: "yolo12n"\n'
    assert not (repo / "yolo12n-net").exists()

    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(tmp_path / "r2"), "--preferred", "16")
    assert_one_line_error(r, 2, "--preferred 16", "--max-batch 8")
    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(tmp_path / "r2"), "--platform", "tvm")
    assert_one_line_error(r, 2, "--platform", "onnxruntime")
    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(tmp_path / "r2"), "--precision", "int8")
    assert_one_line_error(r, 2, "int8", "--platform tensorrt")
    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(tmp_path / "r2"), "--name", "../x")
    assert_one_line_error(r, 2, "--name")
    assert not (tmp_path / "r2").exists()


def test_a_declared_torch_model_serves_its_task(run_cli, tmp_path):
    """--classes/--size reach the export as they do for export itself; the front model answers the task's
    tensors (a class map), read from what the model returns."""
    repo = tmp_path / "m"
    r = run_cli("deploy", "triton", "torchvision:lraspp_mobilenet_v3_large", "--random-init", "--classes", "3",
                "--size", "64x64", "--name", "seg", "--repo", str(repo))
    assert r.code == 0, r.stderr
    front = (repo / "seg" / "config.pbtxt").read_text()
    assert 'name: "CLASS_MAP"' in front and 'name: "BOXES"' not in front
    record = json.loads((repo / "seg" / "1" / "enginekit.json").read_text())
    assert json.loads(record["metadata"]["declaration"])["classes"] == 3


def test_predict_takes_a_declaration_for_one_model(run_cli):
    r = run_cli("predict", "yolo12n,depth", str(_photo("bus.jpg")), "--random-init", "--classes", "4")
    assert_one_line_error(r, 2, "--classes declare one model")


def test_tensorrt_platform_needs_tensorrt_proper(run_cli, tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here: the engine is built (checked where it runs)")
    r = run_cli("deploy", "triton", "yolo12n", "--random-init", "--repo", str(tmp_path / "m"), "--platform",
                "tensorrt")
    assert_one_line_error(r, 3, "--platform tensorrt", "TensorRT", "--platform onnxruntime")
    assert not (tmp_path / "m").exists()


def test_an_onnx_file_nothing_checked_needs_allow_unverified(run_cli, tmp_path, yolo_export):
    import shutil

    graph = tmp_path / "mine.onnx"
    shutil.copyfile([a.path for a in yolo_export.artifacts if str(a.path).endswith(".onnx")][0], graph)
    r = run_cli("deploy", "triton", str(graph), "--repo", str(tmp_path / "m"))
    assert_one_line_error(r, 2, "--allow-unverified")
    r = run_cli("deploy", "triton", str(graph), "--repo", str(tmp_path / "m"), "--allow-unverified")
    assert r.code == 0, r.stderr
    assert "NOT VERIFIED" in (tmp_path / "m" / "yolo12n" / "README.md").read_text()  # the model the graph records
    assert "NOT VERIFIED" in (tmp_path / "m" / "README.md").read_text()


# -- a real server --------------------------------------------------------------------------------------
def _shapes_images(folder: Path) -> list[Path]:
    """Two generated shape images, non-square (a frame and a portrait), as PNG."""
    import cv2
    from trained_detector import DATA, draw_image

    rng = np.random.default_rng(20_261_127)
    paths = []
    for i, (h, w) in enumerate(((360, 640), (600, 420))):
        img, _ = draw_image(rng, h, w, (4, 8), DATA["side_px"])
        paths.append(folder / f"shapes_{h}x{w}.png")
        cv2.imwrite(str(paths[-1]), img[..., ::-1])
    return paths


@pytest.fixture(scope="module")
def served(tmp_path_factory, trained_detector):
    """One repository (yolo12n random, the trained detector as ``shapes``; --platform python) on a running
    server; yields (server, repo, {model: predict's records by image}, images)."""
    if triton_home() is None:
        pytest.skip("nvidia-pytriton (the tritonserver binary) is not installed")
    from enginekit import api

    work = tmp_path_factory.mktemp("triton")
    repo = work / "models"
    api.deploy("yolo12n", repo=repo, random_init=True, platform="python", max_batch=8, quiet=True)
    api.deploy("yolov8n", repo=repo, weights=trained_detector.weights, name="shapes", platform="python",
               max_batch=8, quiet=True)
    segmenter = trained_task_model("segment")
    api.deploy("yolo11n-seg", repo=repo, weights=segmenter, name="seg", platform="python", imgsz="160", quiet=True)
    api.deploy("depth", repo=repo, random_init=True, name="depth", platform="python", imgsz="266", quiet=True)
    shapes = _shapes_images(work)
    photos = [_photo("bus.jpg"), _photo("zidane.jpg")]
    seg_images = _segment_images(work)
    expected = {}
    for model, name, images, opts in (
            ("yolo12n", "yolo12n", photos, {"random_init": True, "weights": []}),
            ("shapes", "yolov8n", shapes, {"random_init": False, "weights": [trained_detector.weights]}),
            ("seg", "yolo11n-seg", seg_images, {"random_init": False, "weights": [segmenter], "imgsz": "160"}),
            ("depth", "depth", [_photo("zidane.jpg")], {"random_init": True, "weights": [], "imgsz": "266"})):
        outcome = api.predict(name, [str(p) for p in images], backend="onnxruntime-cpu", quiet=True, **opts)
        records = {}
        for frame in outcome.document["frames"]:
            (record,) = frame["results"].values()
            records[Path(frame["source"]).name] = record if model in ("seg", "depth") else record["detections"]
        expected[model] = records
    server = Server(repo, work).start()
    try:
        yield server, repo, expected, {"yolo12n": photos, "shapes": shapes, "seg": seg_images,
                                       "depth": [_photo("zidane.jpg")]}
    finally:
        server.stop()


def _segment_images(folder: Path, count: int = 4) -> list[Path]:
    """Held-out images of the trained segmenter's shapes, each cut to 106x160 (non-square): the test takes the one it
    finds most on (a lightly trained segmenter's, which depends on the machine that trained it)."""
    import cv2
    from trained_tasks import held_out_images

    source = sorted(p for p in Path(held_out_images(folder / "seg-held-out", "segment", count=count)).rglob("*")
                    if p.suffix in (".png", ".jpg"))
    paths = []
    for i, image in enumerate(cv2.imread(str(s)) for s in source):
        paths.append(folder / f"seg_{i}_106x160.png")
        cv2.imwrite(str(paths[-1]), image[: image.shape[0] * 2 // 3])
    return paths


def _client(server):
    return tritonclient.InferenceServerClient(server.url, connection_timeout=120, network_timeout=300)


def _ask(client, model: str, path: Path, encoded: bool = True):
    import cv2

    if encoded:
        data = np.frombuffer(path.read_bytes(), np.uint8)[None]
        tensor = tritonclient.InferInput("ENCODED", data.shape, "UINT8")
    else:
        data = cv2.imread(str(path))[None]
        tensor = tritonclient.InferInput("IMAGE", data.shape, "UINT8")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor])


def test_server_answers_as_predict(served):
    server, repo, expected, images = served
    client = _client(server)
    for model in ("yolo12n", "yolo12n-net", "shapes", "shapes-net"):
        assert client.is_model_ready(model), model
    for model in ("yolo12n", "shapes"):
        paths = images[model]
        for i, path in enumerate(paths):
            result = _ask(client, model, path, encoded=i % 2 == 0)
            record = json.loads(result.as_numpy("RESULT")[0].tobytes())
            want = expected[model][path.name]
            assert len(want) >= 1, f"{model} finds nothing on {path.name}: the comparison would compare nothing"
            if model == "shapes":  # the trained detector's scores spread: a wrong box would show
                assert len({round(d["score"], 2) for d in want}) > 1
            got = record["detections"]
            assert len(got) == len(want), (model, path.name, len(got), len(want))
            hits, worst = _matched(got, want)
            assert hits == len(want), (model, path.name, hits, len(want), worst)
            boxes, classes = result.as_numpy("BOXES")[0], result.as_numpy("CLASSES")[0]
            assert boxes.shape == (len(got), 4)
            assert classes.tolist() == [d["class_id"] for d in got]
            assert record["image_shape"] == list(__import__("cv2").imread(str(path)).shape[:2])


def test_masks_and_depth_maps_answer_as_predict(served):
    import cv2

    server, _, expected, images = served
    client = _client(server)
    # the image the lightly trained segmenter finds most on (which one depends on the machine it was trained on)
    path = max(images["seg"], key=lambda p: len(expected["seg"][p.name]["detections"]))
    h, w = cv2.imread(str(path)).shape[:2]
    result = _ask(client, "seg", path)
    got = json.loads(result.as_numpy("RESULT")[0].tobytes())["detections"]
    want = expected["seg"][path.name]["detections"]
    assert len(want) >= 1 and len(got) == len(want), (len(got), len(want))
    assert _matched(got, want)[0] == len(want)
    masks = result.as_numpy("MASKS")[0]
    assert masks.shape == (len(want), h, w)  # at the image's own size, not the network's
    areas = sorted(int(m.sum()) for m in masks)
    assert areas == sorted(d["mask"]["area"] for d in want) and min(areas) > 0

    path = images["depth"][0]
    result = _ask(client, "depth", path, encoded=False)
    depth = result.as_numpy("DEPTH")[0]
    assert depth.shape == cv2.imread(str(path)).shape[:2]
    want = expected["depth"][path.name]["depth"]
    assert want["max"] > want["min"]  # a map that varies, or the comparison compares nothing
    for key, value in (("min", depth.min()), ("max", depth.max()), ("mean", depth.mean())):
        assert abs(float(value) - want[key]) <= 1e-4 * max(1.0, abs(want[key])), (key, float(value), want[key])


def test_concurrent_clients_are_batched(served):
    server, _, expected, images = served
    path = images["shapes"][0]
    errors, results = [], []

    def one_client():
        try:
            client = _client(server)
            for _ in range(3):
                results.append(json.loads(_ask(client, "shapes", path).as_numpy("RESULT")[0].tobytes()))
        except Exception as exc:  # noqa: BLE001 - shown below
            errors.append(exc)

    threads = [threading.Thread(target=one_client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(results) == 24 and all(len(r["detections"]) == len(expected["shapes"][path.name]) for r in results)
    stats = _client(server).get_inference_statistics("shapes-net")["model_stats"][0]["batch_stats"]
    sizes = {int(s["batch_size"]): int(s["compute_infer"]["count"]) for s in stats}
    assert max(sizes) > 1, sizes  # the network ran batches of several clients' images


def test_malformed_requests_get_errors_and_the_model_keeps_serving(served):
    from tritonclient.utils import InferenceServerException

    server, _, expected, images = served
    client = _client(server)

    def send(name: str, data: np.ndarray, dtype: str):
        tensor = tritonclient.InferInput(name, data.shape, dtype)
        tensor.set_data_from_numpy(data)
        return client.infer("shapes", [tensor])

    cases = [("IMAGE", np.zeros((1, 8, 8, 3), np.float32), "FP32", "data-type"),  # wrong dtype: Triton refuses
             ("IMAGE", np.zeros((1, 0, 8, 3), np.uint8), "UINT8", "HxWx3"),  # empty image
             ("IMAGE", np.zeros((1, 8, 8), np.uint8), "UINT8", ""),  # wrong rank
             ("ENCODED", np.frombuffer(b"not an image", np.uint8)[None].copy(), "UINT8", "does not read as an image"),
             ("IMAGE", np.zeros((1, 8, 8, 4), np.uint8), "UINT8", "")]  # four channels
    for name, data, dtype, needle in cases:
        with pytest.raises(InferenceServerException) as caught:
            send(name, data, dtype)
        assert needle in str(caught.value), (name, data.shape, str(caught.value))
    path = images["shapes"][0]
    record = json.loads(_ask(client, "shapes", path).as_numpy("RESULT")[0].tobytes())
    assert len(record["detections"]) == len(expected["shapes"][path.name])
    assert server.proc.poll() is None


def test_server_restarts_on_the_same_repository(served):
    server, repo, expected, images = served
    server.stop()
    server.start()  # a new process on the same repository (the fixture stops it at the end)
    path = images["shapes"][1]
    record = json.loads(_ask(_client(server), "shapes", path, encoded=False).as_numpy("RESULT")[0].tobytes())
    assert _matched(record["detections"], expected["shapes"][path.name])[0] == len(expected["shapes"][path.name])


def _serving_steps() -> str:
    """The bash block of docs/serving.md that the docs say the suite runs as written."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    block = re.search(r"<!-- serving-steps: [^>]*-->\s*```bash\n(.*?)```\s*<!-- /serving-steps -->", text, re.S)
    assert block, "docs/serving.md has no serving-steps block"
    return block.group(1)


def test_the_serving_steps_of_the_docs_answer_like_predict_json(tmp_path, trained_detector):
    """docs/serving.md's steps, run as written (bash, in a folder with best.pt and bus.jpg, the suite's Python first
    on the PATH, a free port): the server they start answers with the record ``enginekit predict best.pt bus.jpg
    --json`` writes (found, the detections, timings)."""
    import os
    import shutil
    import subprocess
    import sys

    from triton_server import _free_port

    if triton_home() is None:
        pytest.skip("nvidia-pytriton (the tritonserver binary) is not installed")
    shutil.copy(trained_detector.weights, tmp_path / "best.pt")
    shutil.copy(_photo("bus.jpg"), tmp_path / "bus.jpg")
    env = dict(os.environ, PORT=str(_free_port()), PATH=f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1")
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + _serving_steps()
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900, start_new_session=True)
    log_file = tmp_path / "tritonserver.log"
    log = log_file.read_text(errors="replace")[-3000:] if log_file.exists() else ""
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:], log)
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    predicted = subprocess.run([sys.executable, "-m", "enginekit", "predict", "best.pt", "bus.jpg", "--json"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert predicted.returncode == 0, predicted.stderr
    record = json.loads(predicted.stdout)
    want = next(iter(record["frames"][0]["results"].values())) if "frames" in record else record
    assert served["found"] == want["found"] and {"preprocess_ms", "infer_ms"} <= set(served["timings"]), served
    assert len(served["detections"]) == len(want["detections"]) >= 1
    hits, worst = _matched(served["detections"], want["detections"])
    assert hits == len(want["detections"]), (hits, worst)
