"""Every verb, every option, bad values: one ``error:`` line, the documented exit code, no
traceback, and nothing new in the cache.

Property tests (Hypothesis) run the CLI in this process (``typer``'s ``CliRunner``): a fresh
process per example would spend its time importing torch. Each generated value is bad for its
option by construction, so a run that does work instead of refusing is a failure too (it
shows up as a new cache entry, an exit code of 0, or a timeout).

Named regression tests keep the concrete cases of the issue that asked for this; a case not
fixed yet is marked ``xfail(strict=True)`` and loses the mark when it is.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from enginekit.backends import registry  # noqa: E402

EXAMPLES = int(os.environ.get("ENGINEKIT_PROPERTY_EXAMPLES", "15"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples every run: a red run can be rerun
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each example may load a model
    suppress_health_check=list(HealthCheck),
)


# --------------------------------------------------------------------------- running the CLI


class Run:
    def __init__(self, args: list[str], code: int, stdout: str, stderr: str, exception: BaseException | None):
        self.args, self.code, self.stdout, self.stderr, self.exception = args, code, stdout, stderr, exception

    def __repr__(self) -> str:
        return f"enginekit {' '.join(map(repr, self.args))} -> {self.code}\n{self.stderr[-3000:]}"


# A refusal takes seconds; a run that blocks on a FIFO or expands a YAML bomb never ends. The alarm
# turns such a run into a failure (its exception is the run's) instead of a suite that hangs.
HANG_SECONDS = int(os.environ.get("ENGINEKIT_PROPERTY_HANG", "300"))


class Hung(Exception):
    """The run did not end within HANG_SECONDS."""


@contextlib.contextmanager
def bounded(seconds: int = HANG_SECONDS):
    """SIGALRM after ``seconds`` raises ``Hung`` where the run is (a blocked ``open`` of a FIFO is
    interrupted too); the main thread only, where signals are delivered."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise Hung(f"no answer within {seconds}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Run:
    """``enginekit ARGS`` in this process, as ``main()`` runs it, within HANG_SECONDS."""
    from typer.testing import CliRunner

    from enginekit.cli import app

    runner = CliRunner()
    with bounded():
        result = runner.invoke(app, args, env={"COLUMNS": "200", **(env or {})}, catch_exceptions=True)
    exception = result.exception if not isinstance(result.exception, SystemExit) else None
    return Run(args, result.exit_code, result.stdout, result.stderr, exception)


def entries(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {
        f"{kind.name}/{entry.name}"
        for kind in root.iterdir()
        if kind.is_dir() and not kind.name.startswith(".")
        for entry in kind.iterdir()
    }


def assert_refused(run: Run, codes: tuple[int, ...] = (2,)) -> str:
    """One ``error:`` line, an expected exit code, no traceback."""
    assert run.exception is None, f"{run!r}\nraised {type(run.exception).__name__}: {run.exception}"
    assert "Traceback" not in run.stderr, repr(run)
    assert run.code in codes, repr(run)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, repr(run)
    assert len(lines) == 1, repr(run)  # nothing but the one line
    return errors[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Paths the strategies draw from: a directory, a regular file, an ONNX file, a cache."""
    root = tmp_path_factory.mktemp("props")
    regular = root / "regular.txt"
    regular.write_text("not what was asked for\n")
    onnx = root / "tiny.onnx"
    _tiny_onnx(onnx)
    (root / "empty-dir").mkdir()
    image = root / "bus.jpg"
    import ultralytics

    image.write_bytes((Path(ultralytics.__file__).parent / "assets" / "bus.jpg").read_bytes())
    # special files: FIFOs nobody writes to (a read blocks forever), a YAML alias bomb, a deep YAML
    specials = root / "special"
    specials.mkdir()
    for name in ("model.onnx", "weights.pt", "frame.jpg", "recipe.yaml", "calib.npy"):
        os.mkfifo(specials / name)
    (root / "bomb.yaml").write_text(anchor_bomb())
    (root / "bombs").mkdir()
    (root / "bombs" / "bomb.yaml").write_text(anchor_bomb())
    (root / "deep.yaml").write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    return {"root": root, "image": image, "regular": regular, "onnx": onnx, "dir": root / "empty-dir",
            "cache": root / "cache", "fifo": specials}


def anchor_bomb() -> str:
    """A 'billion laughs' YAML document of 342 bytes: 9 levels of 9 aliases, 9**9 values expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 32, 32])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


# --------------------------------------------------------------------------- bad values

_SHAPE_OK = re.compile(r"^[0-9]+(x[0-9]+)*$")
printable = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=24)
junk = printable.filter(lambda s: not _SHAPE_OK.match(s.strip()) and not _is_number(s))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def huge_int() -> st.SearchStrategy[str]:
    return st.integers(min_value=2**63, max_value=10**40).map(str)


def not_int() -> st.SearchStrategy[str]:
    return st.one_of(junk, st.sampled_from(["1.5", "nan", "inf", "1e3", "0x10", ""]))


def bad_shape(rank_ok: bool = True) -> st.SearchStrategy[str]:
    huge = st.integers(min_value=2**31, max_value=10**30)
    return st.one_of(
        junk,
        huge.map(lambda n: f"{n}x3x320x320"),
        st.integers(min_value=20000, max_value=2**31 - 1).map(lambda n: f"{n}x3x320x320"),
        st.integers(min_value=60000, max_value=2**31 - 1).map(lambda n: f"1x3x{n}x{n}"),
        st.sampled_from(["0x3x320x320", "1x0x320x320", "1x3x320", "1x4x320x320", "1x3x321x321",
                         "1x3x320x320x1", "x", "1xx3", "-1x3x320x320", "1x3x320x320:", "a:b:c:d"]),
    )


def bad_positive_int() -> st.SearchStrategy[str]:
    return st.one_of(st.integers(max_value=0).map(str), huge_int(), not_int())


def bad_float() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(["nan", "NaN", "inf", "-inf", "-1", "-1e-9", "0"]),
                     st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False).map(repr), junk)


def bad_choice(valid: set[str]) -> st.SearchStrategy[str]:
    return printable.filter(lambda s: s.strip().lower() not in valid)


def bad_out_path(world) -> st.SearchStrategy[str]:
    return st.sampled_from([str(world["dir"]), "/proc/enginekit-x.out", "/sys/enginekit-x.out",
                            str(world["regular"] / "under-a-file.out"), "/proc/self/enginekit/x.out"])


def special_file(world) -> st.SearchStrategy[str]:
    """Inputs that are no regular file: FIFOs (a read blocks forever) and devices (endless)."""
    return st.sampled_from([*(str(p) for p in sorted(world["fifo"].iterdir())), "/dev/zero", "/dev/urandom"])


def bad_in_file(world) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([str(world["dir"]), str(world["root"] / "missing.bin"), "/etc/passwd",
                                      str(world["regular"]), "/proc/self/status", "/dev/null"]),
                     special_file(world))


def bad_in_dir(world) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([str(world["root"] / "missing-dir"), str(world["regular"]), "/proc/self",
                                      str(world["dir"])]), special_file(world))


def bad_onnx(world) -> st.SearchStrategy[str]:
    """Where an ONNX file is the target: none, a folder, a text file, a FIFO named .onnx, a device."""
    return st.one_of(st.sampled_from([str(world["root"] / "missing.onnx"), str(world["regular"]), str(world["dir"])]),
                     special_file(world).filter(lambda p: not p.endswith((".yaml", ".pt", ".jpg", ".npy"))))


def bad_recipe(world) -> st.SearchStrategy[str]:
    """A recipe that is a YAML alias bomb, nested 5000 deep, a FIFO, a device, a folder of bombs."""
    return st.sampled_from([str(world["root"] / "bomb.yaml"), str(world["root"] / "deep.yaml"),
                            str(world["fifo"] / "recipe.yaml"), str(world["root"] / "bombs")])


def bad_tol() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["bogus=1", "rel_l2=-1", "rel_l2=nan", "rel_l2=inf", "rel_l2", "=", "rel_l2=",
                         "cosine=2", "cosine=-0.5", "rel_l2=abc"]),
        st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["rel_l2", "cosine"]), bad_float()),
    )


def bad_size() -> st.SearchStrategy[str]:
    return st.one_of(junk, st.sampled_from(["-1G", "1Q", "G", "1.5.2G", "0x10", "nanG", "1e999G"]))


def bad_age() -> st.SearchStrategy[str]:
    return st.one_of(junk, st.sampled_from(["-1d", "30", "d", "1y", "nan d", "1e999d"]))


def bad_regex() -> st.SearchStrategy[str]:
    return st.sampled_from(["(", "[", "*", "a{2,1}", "(?P<", "\\"])


def bad_cc() -> st.SearchStrategy[str]:
    return st.one_of(junk, st.sampled_from(["9.0", "99.9", "8.6,abc", "-1", "", ",", "8.6,9.0"]))


def bad_batches() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["0", "-1", "100000", "1,0", "a,b", "", ",", "1,,2", "99999999999999999999"]),
        junk,
    )


# --------------------------------------------------------------------------- the verbs


def verbs(world) -> dict[str, tuple[list[str], dict[str, st.SearchStrategy[str]]]]:
    """verb -> (a valid command line, {option: strategy of bad values})."""
    out = str(world["root"] / "out")
    return {
        "export": (
            ["export", "yolo12n", "--random-init", "-o", f"{out}.onnx"],
            {
                "--input": bad_shape(),
                "--output": bad_out_path(world),
                "--weights": bad_in_file(world),
                "--seed": st.one_of(st.integers(max_value=-1).map(str), huge_int(), not_int()),
                "--opset": st.one_of(st.integers(max_value=6).map(str), st.integers(min_value=30).map(str),
                                     not_int()),
                "--simplifier": bad_choice({"onnxsim", "onnxslim"}),
                "--images": bad_in_dir(world),
                "--rel-l2": bad_float(),
                "--report": bad_out_path(world),
            },
        ),
        "build": (
            ["build", str(world["onnx"]), "--no-verify", "-o", f"{out}.plan"],
            {
                "--profile": bad_shape(),
                "--precision": bad_choice({"fp32", "fp16", "int8", "fp8"}),
                "--backend": bad_choice({"auto", "tensorrt", "tensorrt-rtx"}),
                "--target-cc": bad_cc(),
                "--workspace": bad_size(),
                "--opt-level": st.one_of(st.integers(max_value=-1).map(str), st.integers(min_value=6).map(str),
                                         not_int()),
                "--calib-data": bad_in_file(world),
                "--calib-count": bad_positive_int(),
                "--calib-method": bad_choice({"max", "entropy", "percentile", "minmax", "awq_clip", "rtn_dq"}),
                "--exclude": bad_regex(),
                "--seed": st.one_of(st.integers(max_value=-1).map(str), huge_int(), not_int()),
                "--tol": bad_tol(),
                "--output": bad_out_path(world),
                "ONNX": bad_onnx(world),
            },
        ),
        "verify": (
            ["verify", str(world["onnx"]), "--model", "yolo12n"],
            {
                "--precision": bad_choice({"fp32", "fp16", "int8", "fp8"}),
                "--profile": bad_shape(),
                "--images": bad_in_dir(world),
                "--image-count": bad_positive_int(),
                "--report": bad_out_path(world),
                "--junit": bad_out_path(world),
                "--tol": bad_tol(),
                "--reference": bad_in_file(world),
                "--model": bad_choice(set()).filter(lambda s: not s.strip().lower().startswith(("yolo", "depth"))),
                "--seed": st.one_of(st.integers(max_value=-1).map(str), huge_int(), not_int()),
                "ONNX": bad_onnx(world),
            },
        ),
        "simplify": (
            ["simplify", str(world["onnx"]), "-o", f"{out}.sim.onnx"],
            {
                "--output": bad_out_path(world),
                "--tool": bad_choice({"onnxsim", "onnxslim"}),
                "--input": bad_shape(),
                "ONNX": bad_onnx(world),
            },
        ),
        "cache": (
            ["cache", "gc"],
            {
                "--max-size": bad_size(),
                "--max-age": bad_age(),
            },
        ),
        "bench": (
            ["bench", "yolo12n", "--random-init", "--backend", "onnxruntime", "--iters", "1", "--warmup", "0"],
            {
                "--batch": bad_batches(),
                "--input": bad_shape(),
                "--precision": bad_choice({"fp32", "fp16"}),
                "--backend": bad_choice(set(registry.shorthands()) | set(registry.variants())).filter(
                    lambda s: "," not in s),
                "--warmup": st.one_of(st.integers(max_value=-1).map(str), huge_int(), not_int()),
                "--iters": bad_positive_int(),
                "--threads": st.one_of(st.integers(max_value=-1).map(str), huge_int(), not_int()),
                "--plot": st.one_of(bad_out_path(world), st.just(str(world["root"] / "plot.out"))),
                "--weights": bad_in_file(world),
            },
        ),
        "recipes": (
            ["recipes", "show"],
            {
                "RECIPE": st.one_of(junk.filter(lambda s: s.strip() and not s.startswith("-")),
                                    st.just(str(world["regular"])), st.just(str(world["dir"])),
                                    bad_recipe(world).filter(lambda p: not p.endswith("bombs"))),
            },
        ),
        "matrix": (
            ["matrix"],
            {
                "--format": bad_choice({"github", "json"}),
                "PATHS": st.one_of(st.sampled_from([str(world["regular"]), str(world["root"] / "missing.yaml"),
                                                    "/proc/self"]), bad_recipe(world)),
            },
        ),
        "predict": (
            ["predict", "yolo12n", str(world["image"]), "--random-init", "--backend", "onnxruntime-cpu"],
            {
                "--save": st.sampled_from([str(world["regular"]), "/proc/enginekit-x", "/sys/enginekit-x",
                                           str(world["regular"] / "under-a-file")]),
                "--backend": bad_choice(set(registry.choices())),
                "--precision": bad_choice({"fp32", "fp16", "int8", "fp8"}),
                "--weights": bad_in_file(world),
                "--seed": st.one_of(st.integers(max_value=-1).map(str), huge_int(), not_int()),
                "--conf": st.one_of(bad_float(), st.sampled_from(["1.5", "2"])),
                "--iou": st.one_of(bad_float(), st.sampled_from(["1.5", "2"])),
                "--max-frames": bad_positive_int(),
                "--device": st.sampled_from(["gpu", "cuda:x", "cuda:-1", "tpu", "cuda:99999999999999999999"]),
                "SOURCE": st.one_of(st.sampled_from([str(world["root"] / "missing.jpg"), str(world["regular"]),
                                                     str(world["dir"]), "99"]), special_file(world)),
            },
        ),
        "models": (["models"], {"EXTRA": junk.filter(lambda s: s.strip() and not s.startswith("-")),
                                "--bogus": st.just("")}),
        "doctor": (["doctor"], {"EXTRA": junk.filter(lambda s: s.strip() and not s.startswith("-")),
                                "--bogus": st.just("")}),
    }


def command(base: list[str], option: str, value: str) -> list[str]:
    if option == "SOURCE":  # predict's second positional argument, in place
        return [*base[:2], value, *base[3:]]
    if option == "ONNX":  # the ONNX file a verb is given, in place
        return [value if arg.endswith("tiny.onnx") else arg for arg in base]
    if option.isupper():  # a positional argument
        return [*base, value]
    if option == "--bogus":
        return [*base, option]
    # ``--opt=value`` keeps a value starting with '-' from reading as an option; a repeated
    # option's last value wins, so the base's own value is overridden.
    return [*base, f"{option}={value}"]


def _check_verb(world, verb: str, data) -> None:
    base, options = verbs(world)[verb]
    option = data.draw(st.sampled_from(sorted(options)), label="option")
    value = data.draw(options[option].filter(lambda v: "\x00" not in v), label="value")
    env = {"ENGINEKIT_CACHE": str(world["cache"])}
    before = entries(world["cache"])
    run = invoke(command(base, option, value), env=env)
    assert_refused(run)
    assert entries(world["cache"]) == before, f"{run!r}\nnew cache entries"


@pytest.mark.parametrize(
    "verb",
    [
        "export",
        "build",
        "verify",
        "simplify",
        "cache",
        "bench",
        "recipes",
        "matrix",
        "models",
        "doctor",
        "predict",
    ],
)
@PROPERTY
@given(data=st.data())
def test_bad_values_give_one_line(world, verb, data):
    _check_verb(world, verb, data)


# --------------------------------------------------------------------------- named regressions


def _one_line(args: list[str], world, code: int = 2, *needles: str, env: dict | None = None) -> str:
    before = entries(world["cache"])
    run = invoke(args, env={"ENGINEKIT_CACHE": str(world["cache"]), **(env or {})})
    line = assert_refused(run, (code,))
    for needle in needles:
        assert needle in line, line
    assert entries(world["cache"]) == before, "a refused run left cache entries"
    return line


def test_regression_input_int32_overflow(world):
    _one_line(["export", "yolo12n", "--random-init", "--input", "99999999999999999999x3x320x320"], world, 2,
              "99999999999999999999", "int32")


def test_regression_input_batch_beyond_memory(world):
    _one_line(["export", "yolo12n", "--random-init", "--input", "100000x3x320x320"], world, 2, "100000x3x320x320")


def test_regression_input_sides_beyond_memory(world):
    _one_line(["export", "yolo12n", "--random-init", "--input", "1x3x100000x100000"], world, 2, "1x3x100000x100000")


def test_regression_build_profile_int32_overflow(world):
    _one_line(["build", str(world["onnx"]), "--no-verify", "-p", "99999999999999999999x3x32x32"], world, 2,
              "99999999999999999999")


def test_regression_bench_batch_beyond_memory(world):
    _one_line(["bench", "yolo12n", "--random-init", "-b", "100000", "--backend", "onnxruntime"], world, 2, "100000")


def test_regression_export_output_under_proc(world):
    _one_line(["export", "yolo12n", "--random-init", "-o", "/proc/x.onnx"], world, 2, "/proc/x.onnx")


def test_regression_export_output_is_a_directory(world):
    _one_line(["export", "yolo12n", "--random-init", "-o", str(world["dir"])], world, 2, str(world["dir"]))


def test_regression_export_report_unwritable_leaves_no_onnx(world):
    out = world["root"] / "left-behind.onnx"
    _one_line(["export", "yolo12n", "--random-init", "-o", str(out), "--report", "/proc/r.json"], world, 2,
              "/proc/r.json")
    assert not out.exists()


@pytest.mark.parametrize("option", ["--report", "--junit"])
def test_regression_verify_outputs_unwritable(world, option):
    _one_line(["verify", str(world["onnx"]), "--model", "yolo12n", option, "/proc/x.out"], world, 2, "/proc/x.out")


@pytest.mark.parametrize("path", ["/proc/x.png", "{dir}", "{root}/plot.out"])
def test_regression_bench_plot_unwritable(world, path):
    path = path.format(dir=world["dir"], root=world["root"])
    _one_line(["bench", "yolo12n", "--random-init", "--backend", "onnxruntime", "--plot", path], world, 2, path)


def test_regression_weights_etc_passwd(world):
    _one_line(["export", "yolo12n", "-w", "/etc/passwd"], world, 2, "/etc/passwd")


def test_regression_depth_state_dict_to_yolo(world):
    import torch

    path = world["root"] / "depth_anything_v2_vits.pth"
    torch.save({"pretrained.blocks.0.attn.qkv.weight": torch.zeros(3, 3)}, path)
    _one_line(["export", "yolo12n", "-w", str(path)], world, 2, str(path))


def test_regression_crafted_pickle_runs_no_code(world):
    marker = world["root"] / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    import torch

    path = world["root"] / "evil.pt"
    torch.save({"model": Payload()}, path)
    _one_line(["export", "yolo12n", "-w", str(path)], world, 2, str(path), "--trust-checkpoint")
    assert not marker.exists()


@pytest.mark.parametrize("opset", ["3", "99"])
def test_regression_opset_out_of_range(world, opset):
    _one_line(["export", "yolo12n", "--random-init", "--opset", opset], world, 2, "--opset")


@pytest.mark.parametrize("seed", ["-5", "99999999999999999999999"])
def test_regression_seed_out_of_range_caches_nothing(world, seed):
    _one_line(["export", "yolo12n", "--random-init", f"--seed={seed}"], world, 2, "--seed")


@pytest.mark.parametrize("verb", ["ls", "gc", "purge"])
@pytest.mark.parametrize("where", ["regular", "proc", "sys"])
def test_regression_cache_location_unusable(world, verb, where):
    root = {"regular": str(world["regular"]), "proc": "/proc/enginekit-cache", "sys": "/sys/enginekit-cache"}[where]
    run = invoke(["cache", verb], env={"ENGINEKIT_CACHE": root})
    line = assert_refused(run)
    assert root in line and "ENGINEKIT_CACHE" in line


@pytest.mark.parametrize("where", ["regular", "proc"])
def test_regression_cache_location_unusable_at_export(world, where):
    root = {"regular": str(world["regular"]), "proc": "/proc/enginekit-cache"}[where]
    run = invoke(["export", "yolo12n", "--random-init", "-o", str(world["root"] / "c.onnx")],
                 env={"ENGINEKIT_CACHE": root})
    line = assert_refused(run)
    assert root in line


def test_regression_doctor_reports_unusable_cache(world):
    import json

    run = invoke(["doctor", "--json"], env={"ENGINEKIT_CACHE": str(world["regular"])})
    data = json.loads(run.stdout)
    assert "not a directory" in data["cache"]["problem"]
    assert any("cannot use the cache" in w for w in data["warnings"])


def test_regression_deep_yaml(world):
    path = world["root"] / "deep.yaml"
    path.write_text("[" * 100000)
    _one_line(["recipes", "show", str(path)], world, 2, str(path))


@pytest.mark.parametrize("args", [["export", "yolo12n", "--bogus"], ["build", "x.onnx", "--opt-level", "abc"],
                                  ["models", "extra"]])
def test_regression_parser_errors_are_one_line(world, args):
    _one_line(args, world, 2)


def test_regression_profile_is_echoed_verbatim(world):
    line = _one_line(["build", str(world["onnx"]), "--no-verify", "-p", "a:b:c:d"], world, 2)
    assert "a:b:c:d" in line


def test_regression_verify_image_count_zero_names_image_count(world):
    _one_line(["verify", str(world["onnx"]), "--model", "yolo12n", "--image-count", "0"], world, 2, "--image-count")


@pytest.mark.parametrize(
    "args",
    [
        ["export", "yolo12n", "--random-init", "--rel-l2", "nan"],
        ["build", "yolo12n", "--random-init", "--tol", "bogus=1"],
        ["build", "yolo12n", "--random-init", "--tol", "rel_l2=-1"],
        ["build", "{onnx}", "--no-verify", "--tol", "bogus=1"],
        ["build", "{onnx}", "--no-verify", "--tol", "rel_l2=-1"],
        ["verify", "{onnx}", "--model", "yolo12n", "--tol", "rel_l2=-1"],
    ],
    ids=["export-rel-l2-nan", "build-model-tol-bogus", "build-model-tol-negative", "build-onnx-tol-bogus",
         "build-onnx-tol-negative", "verify-onnx-tol-negative"],
)
def test_regression_bad_tolerances(world, args):
    _one_line([a.format(onnx=world["onnx"]) for a in args], world, 2)


def test_property_helpers_generate_bad_values_only():
    """The strategies themselves: no generated shape parses and fits."""
    from enginekit.errors import UsageError
    from enginekit.shapes import InputConstraint, parse_shape

    constraint = InputConstraint("images", 3, 32, "yolo12n")

    @settings(max_examples=200, deadline=None, database=None)
    @given(bad_shape())
    def check(text):
        with pytest.raises(UsageError):
            constraint.check(parse_shape(text, what="--input"), what="--input")

    @settings(max_examples=200, deadline=None, database=None)
    @given(bad_float())
    def check_float(text):
        try:
            value = float(text)
        except ValueError:
            return  # not a number at all
        assert not (math.isfinite(value) and value > 0), text  # NaN, infinities, zero and below only

    check()
    check_float()


# --------------------------------------------------------------------------- nested JSON, signals, a full disk

FEW = settings(PROPERTY, max_examples=min(EXAMPLES, 4))  # each example here is a process or a mount


def _entry_with_manifest(root: Path, text: str) -> str:
    """A cache at ``root`` with one engine entry whose manifest.json is ``text``; its key."""
    from enginekit.cache import Cache

    def produce(folder: Path) -> None:
        (folder / "engine.plan").write_bytes(b"not a plan")

    entry, _ = Cache(root, remote=None).get_or_create("engine", {"nested": text[:16], "n": len(text)}, produce)
    (entry.path / "manifest.json").write_text(text)
    return entry.key


@FEW
@given(data=st.data())
def test_a_nested_manifest_is_a_corrupt_entry_whatever_reads_it(world, tmp_path_factory, data):
    """A manifest.json nested past the decoder's recursion limit: every verb that reads the entry
    calls it corrupt in one line (verify fails the gate that names it), none raises RecursionError."""
    depth = data.draw(st.integers(min_value=1100, max_value=200_000), label="depth")
    opener, closer = data.draw(st.sampled_from([("[", "]"), ('{"a":', "}")]), label="nesting")
    text = opener * depth + ("null" if opener != "[" else "") + closer * depth
    root = tmp_path_factory.mktemp("nested") / "cache"
    key = _entry_with_manifest(root, text)
    verb = data.draw(st.sampled_from([["cache", "ls"], ["cache", "ls", "--json"], ["cache", "show", key[:12]],
                                      ["cache", "path", key[:12]], ["verify", key[:12]],
                                      ["predict", key[:12], str(world["image"])], ["cache", "gc", "--dry-run"]]),
                     label="verb")
    run = invoke(verb, env={"ENGINEKIT_CACHE": str(root)})
    if verb[1] in ("ls", "gc"):
        assert run.exception is None and run.code == 0 and "Traceback" not in run.stderr, repr(run)
    else:
        line = assert_refused(run, (1, 2) if verb[0] == "verify" else (2,))
        assert key[:12] in line or "no cache entry" in line, line


def _sigterm_commands(world, out: Path) -> dict[str, list[str]]:
    return {
        "export": ["export", "yolo12n", "--random-init", "--input", "1x3x64x64", "-o", str(out / "m.onnx")],
        "build": ["build", str(world["onnx"]), "-p", "1x3x32x32", "-o", str(out / "m.plan")],
        "simplify": ["simplify", str(world["onnx"]), "-o", str(out / "m.sim.onnx")],
        "predict": ["predict", "yolo12n", str(world["image"]), "--random-init", "--backend", "onnxruntime-cpu",
                    "--save", str(out / "pred")],
    }


@FEW
@given(data=st.data())
def test_sigterm_during_a_verb_cleans_up(world, tmp_path_factory, data):
    """SIGTERM at a random moment of a verb: exit 143 (or the signal's own -15 before the verb has
    started; 0 if it had finished), no traceback, and no output or temporary file half-written."""
    work = tmp_path_factory.mktemp("sigterm")
    out, cache = work / "out", work / "cache"
    out.mkdir()
    verb = data.draw(st.sampled_from(sorted(_sigterm_commands(world, out))), label="verb")
    delay = data.draw(st.floats(min_value=0.2, max_value=12.0), label="delay")
    proc = subprocess.Popen([sys.executable, "-m", "enginekit", *_sigterm_commands(world, out)[verb]],
                            env=dict(os.environ, ENGINEKIT_CACHE=str(cache), COLUMNS="200"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{verb}: still running {HANG_SECONDS}s after SIGTERM")
    assert proc.returncode in (0, 143, -signal.SIGTERM), (verb, delay, proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    assert not (cache / ".tmp").is_dir() or list((cache / ".tmp").iterdir()) == [], (verb, delay)
    half = [p.name for p in out.rglob("*") if p.name.startswith(".")]
    assert half == [], (verb, delay, half)  # no temporary file or folder beside an output
    if proc.returncode != 0:  # a signal after the output was published (exit 143 in teardown) leaves it whole
        for made in out.iterdir():
            if made.suffix == ".onnx":
                import onnx

                onnx.load(str(made))
            elif made.is_dir():
                assert (made / "results.json").is_file(), (verb, delay, list(made.iterdir()))
            else:
                assert made.stat().st_size > 0, (verb, delay, made)


@pytest.fixture
def small_disks(tmp_path):
    """Mount tmpfs folders of a given size (needs root; skipped with the reason elsewhere)."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        path = tmp_path / f"disk{len(mounts)}"
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip() or done.returncode}")
        mounts.append(path)
        return path

    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a full disk cannot be made")
    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="module")
def medium_onnx(world) -> Path:
    """A 64-channel convolution (148 KiB of weights): more than a small disk holds."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64, 16, 16])
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "medium", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = world["root"] / "medium.onnx"
    onnx.save(model, str(path))
    return path


DISK_VERBS = {  # what each verb writes to the small disk (``{disk}``), and the output a finished run leaves
    "build-into-cache": (["build", "{onnx}", "-p", "1x64x16x16", "--no-verify"], None),
    "simplify-o": (["simplify", "{onnx}", "-o", "{disk}/m.sim.onnx"], "m.sim.onnx"),
    "build-o": (["build", "{onnx}", "-p", "1x64x16x16", "--no-verify", "-o", "{disk}/m.plan"], "m.plan"),
    "predict-save": (["predict", "yolo12n", "{image}", "--random-init", "--backend", "onnxruntime-cpu",
                      "--save", "{disk}/pred"], "pred/results.json"),
}


@pytest.mark.parametrize("verb", sorted(DISK_VERBS))
@settings(PROPERTY, max_examples=3)
@given(size=st.sampled_from(["16k", "64k", "160k"]))
def test_a_full_disk_under_a_verb_is_one_line(world, small_disks, medium_onnx, verb, size):
    """A disk that fills at some size under the cache, ``-o`` or ``--save``: one ``error:`` line and
    exit 2 with nothing left behind, or (where it all fits) exit 0 with whole outputs. 16 KiB holds
    none of these outputs (the graph alone is 148 KiB; bus.jpg drawn over is more), so that size
    must be refused."""
    disk = small_disks(size)
    template, output = DISK_VERBS[verb]
    args = [a.format(onnx=medium_onnx, disk=disk, image=world["image"]) for a in template]
    # predict uses the suite's cache (yolo12n's random-init graph is exported once for every test)
    cache = {"build-into-cache": disk / "cache", "predict-save": os.environ["ENGINEKIT_CACHE"]}.get(verb, world["cache"])
    env = {"ENGINEKIT_CACHE": str(cache)}
    run = invoke(args, env=env)
    left = sorted(p.relative_to(disk).as_posix() for p in disk.rglob("*")
                  if p.is_file() and ".locks" not in p.relative_to(disk).parts)
    if size != "16k" and run.code == 0 and run.exception is None:
        assert all(not Path(name).name.startswith(".") for name in left), left
        assert output is None or (disk / output).stat().st_size > 0, left
        return
    # the disk fills once work has begun: stage lines may precede the one error line
    assert run.exception is None and "Traceback" not in run.stderr and run.code == 2, repr(run)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left" in errors[0], repr(run)
    assert left == [], left
