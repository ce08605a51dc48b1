"""``enginekit deploy triton``: a Triton Inference Server model repository for one model.

The network is the cache's verified artifact: the parity-checked ONNX export (``onnxruntime``, ``python``) or
the engine built and verified from it (``tensorrt``). The repository (``serving.triton``: ``NAME-net`` with
the network, ``NAME`` with the family's pre- and postprocessing, a README) is a cache entry of its own
(kind ``triton-repo``, keyed by the artifact and every option), so a second deploy of the same thing writes
nothing new and the entry travels through the team store like any other. It is then copied into
``--repo``: each model folder replaced whole (only one deploy wrote), never half-written.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from enginekit import reporting
from enginekit.errors import CapabilityError, ParityError, UsageError
from enginekit.precisions import names as precision_names
from enginekit.requests import DeployRequest
from enginekit import backends
from enginekit._version import __version__
from enginekit.backends.base import ONNX
from enginekit.cache import Cache
from enginekit.flows import run
from enginekit.flows.build import run_build
from enginekit.verification.record import record_of
from enginekit.flows.load import _dynamic_hw, _input_shape, _recipe_runtime, export_onnx
from enginekit.flows.verify import run_verify
from enginekit.fsutil import check_output_path, json_text
from enginekit.hashing import sha256_file
from enginekit.recipes import load_recipe
from enginekit.requests import BuildRequest, VerifyRequest, image_size
from enginekit.runtime.loader import open_plan, plan_load, predictor_record
from enginekit.serving import triton
from enginekit.serving.triton import OUTPUTS, RECORD, parse_config
from enginekit.trt.flavours import resolve_flavour

KIND = "triton-repo"
VERSION = 1  # bump when what a repository holds changes meaning


@dataclass
class DeployOutcome:
    repo: Path
    name: str
    models: list[str]  # the model folders written: NAME, NAME-net
    platform: str
    verified: str  # what was checked of the network, in words ("" with --allow-unverified and nothing checked)
    entry: object  # cache.Entry of the repository
    status: str  # the entry's: hit, miss, pulled...
    events: list = field(default_factory=list)


def run_deploy(request: DeployRequest, cache=None) -> DeployOutcome:
    cache = cache or Cache()
    repo = _check_repo(request.repo)
    if request.python_env is not None:  # the Python models' environment: checked before anything is written
        check_python_env(request.python_env)
    input_size = None
    if request.imgsz is not None:
        h, w = image_size(request.imgsz, "--imgsz")
        input_size = h if h == w else (h, w)
    _, recipe_size, _ = _recipe_runtime(request.target, "auto", input_size, {})
    input_size = input_size if input_size is not None else recipe_size
    preferred = request.preferred or _recipe_batches(request.target, request.max_batch)
    if request.platform == "tensorrt":
        _check_tensorrt_for_triton()
    graph_precision = request.precision if request.platform != "tensorrt" else "fp32"
    graphs = precision_names(exported=True)
    if graph_precision not in graphs:
        raise UsageError(f"--precision {request.precision}: --platform {request.platform} serves "
                         f"{' or '.join(graphs)} graphs; {request.precision} is an engine precision (--platform tensorrt)")

    host = backends.verifier(ONNX).name  # the graph opened on the host: its I/O and processing read from it
    p = plan_load(request.target, graph_precision, host, weights=request.weights,
                  random_init=request.random_init, seed=request.seed, conf=request.conf, iou=request.iou, cache=cache,
                  declared=dict(request.declared) or None)
    verified = ""
    if p.missing is not None:
        shape = _input_shape(p.adapter, input_size)
        with reporting.stage(f"export {p.target.model} ({graph_precision})"):
            p = p.with_onnx(export_onnx(p, cache, True, shape if not _dynamic_hw(p.adapter) else None))
        verified = f"{graph_precision} graph: parity with PyTorch passed at export"
    else:  # its stored verdicts, found by its content wherever it lies (the file export or build wrote); a cache
        # entry whose parity passed is verified unless a verify against labels failed it since
        passed_parity = bool((p.target.manifest.get("parity") or {}).get("passed"))
        record = record_of(cache or Cache(), sha256_file(Path(p.target.path)))  # every check it has had
        if record.failed and not request.allow_unverified:
            raise ParityError(f"{request.target}: this graph failed a check ({record.failure_line()}): fix it "
                              "(enginekit build --repair) or pass --allow-unverified")
        if passed_parity:
            verified = f"{p.target.precision or graph_precision} graph: parity passed (cache entry)"
        elif record.verdict == "pass":
            last = [c for c in record.checks if c.passed][-1]
            verified = (f"{p.target.precision or graph_precision} graph: parity passed ({last.at} verdict "
                        f"{last.key[:12]}, found by the file's content)")
    predictor = open_plan(p, conf=request.conf, iou=request.iou, input_size=input_size, cache=cache)
    onnx_path = Path(p.target.path)
    net_file, profiles, max_batch = onnx_path, None, request.max_batch
    inputs, outputs = triton.graph_io(onnx_path)
    if request.platform == "tensorrt":
        net_file, profiles, verified = _engine(request, p, inputs[0], cache)
        inputs = triton.with_profile(inputs, profiles)
        max_batch = min(max_batch, triton.profile_max_batch(profiles, inputs[0].name) or max_batch)
    if not verified and not request.allow_unverified:
        raise UsageError(f"{request.target}: no stored verdict judged a graph of this content (an ONNX file "
                         "enginekit did not export or build here, or one changed since): verify it (enginekit verify "
                         f"{request.target} --reference CHECKPOINT), deploy a model name or recipe, or pass "
                         "--allow-unverified")
    batched = bool(inputs) and inputs[0].dims[:1] == (-1,)
    serving = triton.Serving(max_batch if batched else 0, preferred, request.queue_delay_us, request.instances,
                             # ONNX Runtime's backend runs on the GPU where the server has one, else on the CPU;
                             # a TensorRT plan needs the GPU; the Python backend runs on the CPU
                             {"python": "KIND_CPU", "tensorrt": "KIND_GPU"}.get(request.platform, "KIND_AUTO"))
    name = request.name or _model_name(predictor.model)
    env = str(request.python_env.resolve() if request.python_env else Path(sys.prefix))
    record = predictor_record(p, predictor, conf=request.conf, iou=request.iou, input_size=input_size,
                              max_batch=serving.max_batch or None, profiles=profiles)
    record["net"] = f"{name}-net"
    kind = triton.result_kind(predictor)

    texts = {f"{name}-net/config.pbtxt": triton.net_config(f"{name}-net", request.platform, inputs, outputs,
                                                           serving, env),
             f"{name}/config.pbtxt": triton.front_config(name, kind, serving, env),
             f"{name}/README.md": readme(name, request.platform, kind, serving, env, verified)}
    for path, text in texts.items():
        if path.endswith(".pbtxt"):
            _check_config(text)
    parts = {"stage": "triton", "version": VERSION, "net": sha256_file(net_file), "platform": request.platform,
             "texts": texts, "record": record, "enginekit": _version()}

    def produce(tmp: Path) -> dict:
        _write_models(tmp, name, request.platform, net_file, texts, record, verified)
        return {"name": name, "platform": request.platform, "verified": verified}

    with reporting.stage(f"triton repository for {name}"):
        entry, status = cache.get_or_create(KIND, parts, produce, subject=f"{name} ({request.platform})")
    models = [name, f"{name}-net"]
    _install(entry.path, repo, models)
    return DeployOutcome(repo, name, models, request.platform, verified, entry, status)


def _version() -> str:
    return __version__


def _model_name(variant: str) -> str:
    import re

    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", variant).strip("-.") or "model"
    return name[:100]


def _recipe_batches(target: str, max_batch: int) -> list[int]:
    """A recipe's ``runtime.batch`` (what ``tune`` measured) as the preferred batch size, where it has one."""
    if not str(target).endswith((".yaml", ".yml")):
        return []

    runtime = load_recipe(str(target)).runtime
    batch = getattr(runtime, "batch", None) if runtime is not None else None
    return [batch] if batch and 1 < batch <= max_batch else []


def _check_repo(repo: Path) -> Path:
    repo = Path(repo)
    if repo.exists() and not repo.is_dir():
        raise UsageError(f"--repo {repo}: is not a folder (a Triton model repository is one)")
    if not repo.exists():
        check_output_path(repo, "--repo", folder=True)
    return repo.resolve()


#: Python versions Triton's Python backend has stubs for (nvidia-pytriton ships these; Triton's images one of them)
STUB_PYTHONS = ((3, 8), (3, 9), (3, 10), (3, 11), (3, 12), (3, 13))


def check_python_env(env: Path) -> None:
    """``--python-env``: a Python environment (a folder with ``bin/python``) whose Python has a backend stub and
    that holds enginekit, which the repository's Python models import; one line where it is not."""
    import subprocess

    env = Path(env)
    what = f"--python-env {env}"
    if not env.exists():
        raise UsageError(f"{what}: not found (the Python environment the repository's Python models run in)")
    if not env.is_dir():
        raise UsageError(f"{what}: is a file, not a Python environment (a folder with bin/python)")
    python = next((env / "bin" / n for n in ("python3", "python") if (env / "bin" / n).is_file()), None)
    if python is None:
        raise UsageError(f"{what}: holds no bin/python, so it is not a Python environment")
    probe = ("import sys, importlib.util as u; "
             "print(sys.version_info[0], sys.version_info[1], u.find_spec('enginekit') is not None)")
    try:
        proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
        major, minor, has = proc.stdout.split()
        version = (int(major), int(minor))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise UsageError(f"{what}: its bin/python does not run ({str(exc)[:80] or 'no answer'})") from exc
    if version not in STUB_PYTHONS:
        raise UsageError(f"{what}: Python {major}.{minor}, for which Triton's Python backend has no stub "
                         f"(it has {', '.join('%d.%d' % v for v in STUB_PYTHONS)})")
    if has != "True":
        raise UsageError(f"{what}: does not hold enginekit, which the repository's Python models import "
                         f"(install it there: {python} -m pip install enginekit)")


def _check_tensorrt_for_triton() -> None:
    """Triton's TensorRT backend loads engines of TensorRT proper (not TensorRT-RTX's plans): refused before
    any work where TensorRT is not installed."""
    try:
        resolve_flavour("tensorrt")
    except CapabilityError as exc:
        raise CapabilityError(f"--platform tensorrt: Triton's TensorRT backend loads TensorRT engines, and {exc} "
                              "(TensorRT-RTX plans are not loaded by it); or serve the graph: --platform "
                              "onnxruntime") from exc


def _engine(request: DeployRequest, p, net_input, cache):
    """(engine plan, its profiles, what verify checked) for ``p``'s model, built and verified through the
    cache; an engine whose verify did not pass is refused unless ``--allow-unverified``."""
    profiles = list(request.profiles)
    if not profiles:
        chw = [d for d in net_input.dims[1:]]
        if -1 in chw:
            raise UsageError(f"{request.target}: its graph takes any H x W: give --profile MIN:OPT:MAX")
        shape = "x".join(map(str, chw))
        profiles = [f"1x{shape}:{request.max_batch}x{shape}:{request.max_batch}x{shape}"]
    t = p.target
    build = BuildRequest(target=request.target, precision=request.precision, profiles=profiles, flavour="tensorrt",
                         weights=request.weights, random_init=request.random_init, seed=request.seed,
                         declared=dict(request.declared))
    outcome = run(run_build, build, cache, quiet=True)
    verdict = run(run_verify, VerifyRequest(target=outcome.entry.key), cache, quiet=True)
    report = verdict.reports[0] if getattr(verdict, "reports", None) else None
    passed = bool(report is not None and report.passed)
    if not passed and not request.allow_unverified:
        raise ParityError(f"engine {outcome.entry.key[:12]} of {t.model}: verify did not pass; fix it "
                          "(enginekit verify) or pass --allow-unverified")
    ran = bool(getattr(report, "engine_ran", False))
    checked = (f"{request.precision} engine: verify passed" + ("" if ran else " (graphs checked; the engine did not run "
                                                                 "on the deploying machine)")) if passed else ""
    return Path(outcome.engine), outcome.manifest.get("profiles") or _profile_dicts(profiles, net_input.name), checked


def _profile_dicts(profiles: list[str], input_name: str) -> list[dict]:
    out = []
    for text in profiles:
        shapes = [[int(v) for v in part.split("x")] for part in text.split(":")]
        out.append({input_name: {"min": shapes[0], "opt": shapes[len(shapes) // 2], "max": shapes[-1]}})
    return out


def _write_models(folder: Path, name: str, platform: str, net_file: Path, texts: dict, record: dict,
                  verified: str) -> None:
    import json

    net, front = folder / f"{name}-net", folder / name
    for model in (net, front):
        (model / "1").mkdir(parents=True)
    for path, text in texts.items():
        (folder / path).write_text(text)
    shutil.copyfile(net_file, net / "1" / triton.NET_FILE[platform])
    if platform == "python":
        (net / "1" / "model.py").write_text(triton.model_py("NetModel", f"{name}-net: the network on ONNX Runtime"))
    marker = {"written_by": "enginekit deploy triton", "enginekit": _version(), "model": name, "verified": verified}
    (front / "1" / "model.py").write_text(triton.model_py("PipelineModel", f"{name}: pre- and postprocessing"))
    (front / "1" / triton.RECORD).write_text(json.dumps(record, indent=2))
    for model in (net, front):
        (model / triton.RECORD).write_text(json_text(marker, indent=2))


def _check_config(text: str) -> None:
    """What was written, read back as Triton reads it (where tritonclient is installed)."""
    import importlib.util

    if importlib.util.find_spec("tritonclient") is None:
        return

    parse_config(text)


def _install(entry: Path, repo: Path, models: list[str]) -> None:
    """The entry's model folders into ``repo``, each replaced whole; a folder deploy did not write is refused
    before anything is copied. The repository's README lists every model deploy wrote there."""
    for m in models:
        dest = repo / m
        if dest.exists() and not (dest / RECORD).is_file():
            raise UsageError(f"--repo {repo}: {m}/ exists and was not written by enginekit deploy: remove it or "
                             "give another --name")
    repo.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".enginekit-deploy-", dir=repo))
    try:
        for m in models:
            shutil.copytree(entry / m, staging / m)
        for m in models:
            dest = repo / m
            old = staging / f"{m}.old"
            if dest.exists():
                os.replace(dest, old)
            os.replace(staging / m, dest)
        readme_file = repo / "README.md"
        if not os.path.lexists(readme_file) or _written_by_deploy(readme_file):
            (staging / "README.md").write_text(repository_readme(repo))
            os.replace(staging / "README.md", readme_file)
        else:  # the user's own: never replaced (each model's README is in its folder)
            reporting.note(f"--repo {repo}: README.md is not enginekit's: left as it is (each model's README is in "
                           "its folder)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: the first line of the README.md deploy writes at a repository's top: what it may replace
README_MARK = "<!-- written by enginekit deploy triton: replaced by the next deploy -->"
_OLD_README = "# Triton model repository (models written by enginekit deploy triton)"


def _written_by_deploy(path: Path) -> bool:
    """Whether a repository's README.md is deploy's own (its mark, or the heading earlier releases wrote)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
    except OSError:
        return False
    return first in (README_MARK, _OLD_README)


def repository_readme(repo: Path) -> str:
    """The repository's README: every model ``deploy`` wrote there (its marker), each with its own README."""
    import json

    lines = []
    for folder in sorted(p for p in repo.iterdir() if (p / RECORD).is_file() and (p / "README.md").is_file()):
        try:
            marker = json.loads((folder / RECORD).read_text())
        except (OSError, ValueError):
            continue
        check = marker.get("verified") or "NOT VERIFIED (--allow-unverified)"
        lines.append(f"- `{folder.name}` and `{folder.name}-net`: [{folder.name}/README.md]({folder.name}/README.md); {check}")
    return (f"{README_MARK}\n# Triton model repository (models written by enginekit deploy triton)\n\n" +
            "\n".join(lines) +
            "\n\nStart the server on this folder: `tritonserver --model-repository=$PWD`. Other models here are "
            "not enginekit's and are left as they are.\n")


def readme(name: str, platform: str, kind: str, serving, env: str, verified: str) -> str:
    tensors = ", ".join(n for n, _, _ in OUTPUTS.get(kind, ()))
    check = (f"Verified: {verified}." if verified else
             "NOT VERIFIED: written with --allow-unverified; nothing checked this network against PyTorch.")
    major, minor = sys.version_info[:2]
    return f"""# {name}: a Triton model written by enginekit deploy triton

{check}

## Models

- `{name}`: send one image per request, get what `enginekit predict` finds. Inputs (one of them):
  `IMAGE` (uint8, shape [1, H, W, 3], BGR as OpenCV reads it) or `ENCODED` (a JPEG/PNG file's bytes as
  uint8, shape [1, N]). Outputs: `RESULT` (the JSON record `enginekit predict --json` writes for a frame,
  class names included, as UTF-8 in uint8){", " + tensors if tensors else ""}, each with the batch dim 1.
  Every tensor is numeric: the Python backend's BYTES tensors depend on the NumPy its stub was built with.
  A Python-backend model: the family's preprocessing, one call of `{name}-net` per batch the server forms
  (up to {max(1, serving.max_batch)} requests), the family's postprocessing.
- `{name}-net`: the network ({platform}), max_batch_size {serving.max_batch}, dynamic batching
  {"preferred " + str(serving.preferred) if serving.preferred else "without preferred sizes"},
  {serving.instances} instance(s).

The Python models run in `{env}` (the config's `EXECUTION_ENV_PATH`), which must hold enginekit; the
server's Python backend stub must be built for Python {major}.{minor}.

## Start the server

    tritonserver --model-repository=$PWD/..   # the repository: the folder above this one

    curl -s localhost:8000/v2/models/{name}/ready -o /dev/null -w '%{{http_code}}\\n'   # 200 when ready

## Ask it

With curl: a binary request (the JSON header, then the file's bytes):

    SIZE=$(stat -c%s bus.jpg)
    JSON='{{"inputs":[{{"name":"ENCODED","shape":[1,'$SIZE'],"datatype":"UINT8","parameters":{{"binary_data_size":'$SIZE'}}}}],"outputs":[{{"name":"RESULT","parameters":{{"binary_data":false}}}}]}}'
    {{ printf '%s' "$JSON"; cat bus.jpg; }} > request.bin
    curl -s localhost:8000/v2/models/{name}/infer -H 'Content-Type: application/octet-stream' \\
      -H "Inference-Header-Content-Length: ${{#JSON}}" --data-binary @request.bin \\
      | python3 -c 'import json, sys; print(bytes(json.load(sys.stdin)["outputs"][0]["data"]).decode())'

Or with tritonclient (`pip install tritonclient[http]`):

    import json, numpy as np, tritonclient.http as http
    client = http.InferenceServerClient("localhost:8000")
    data = np.frombuffer(open("bus.jpg", "rb").read(), np.uint8)[None]
    image = http.InferInput("ENCODED", data.shape, "UINT8"); image.set_data_from_numpy(data)
    result = client.infer("{name}", [image])
    print(json.loads(result.as_numpy("RESULT")[0].tobytes()))
"""
