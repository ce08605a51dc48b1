"""The reporting interface and the requests: what the library says, and what it refuses."""

from __future__ import annotations

import io
import re

import pytest


def test_collector_keeps_events_and_passes_them_on():
    from enginekit import reporting

    outer = reporting.Collector()
    with reporting.using(outer):
        with reporting.collecting() as inner:  # an API call while someone listens
            with reporting.stage("export") as s:
                s.status, s.detail = "miss", "3 nodes"
            reporting.note("calibration: 8 inputs", level=1)
            reporting.warning("parity failed")
            with reporting.progress("timing", total=3) as p:
                p.advance(2)
                p.advance()
            reporting.result("plan", "/x/engine.plan")
        with reporting.collecting(quiet=True) as silent:
            with reporting.stage("engine") as s:
                s.status = "hit"
    assert [(e.kind, e.label, e.status) for e in inner.of("stage")] == [("stage", "export", "miss")]
    assert inner.warnings == ["parity failed"] and inner.results == {"plan": "/x/engine.plan"}
    assert inner.of("progress")[0].detail == "3/3"
    assert [e.label for e in outer.events] == [e.label for e in inner.events]  # passed on
    assert [e.label for e in silent.events] == ["engine"] and "engine" not in [e.label for e in outer.events]
    assert reporting.current() is reporting.NULL  # nothing stays installed


def test_a_failing_stage_is_reported_as_failed():
    from enginekit import reporting

    with reporting.using(reporting.Collector()) as c, pytest.raises(RuntimeError):
        with reporting.stage("build"):
            raise RuntimeError("builder crashed")
    (event,) = c.events
    assert (event.label, event.status) == ("build", "error") and event.seconds >= 0


def test_rich_renderer_keeps_the_terminal_look():
    from rich.console import Console

    from enginekit import reporting
    from enginekit.cli.render import RichReporter

    buffer = io.StringIO()
    with reporting.using(RichReporter(Console(file=buffer, width=120, color_system=None))):
        with reporting.stage("simplify (onnxsim)") as s:
            s.status = "hit"
        with reporting.stage("parity fp16") as s:
            s.status = "fail"
        with reporting.stage("build (TensorRT-RTX)") as s:
            s.detail = "12.1 MiB"
        reporting.note("calibration: calibrated; 90 Q/DQ pairs", level=1)
        with pytest.raises(ValueError), reporting.stage("engine"):
            raise ValueError("no")
    lines = buffer.getvalue().splitlines()
    assert re.fullmatch(r"  ✓ simplify \(onnxsim\) {10} +\d+\.\d\ds  cached", lines[0]), lines[0]
    assert lines[1].endswith("s  FAIL") and lines[2].endswith("s    12.1 MiB")
    assert lines[3] == "    calibration: calibrated; 90 Q/DQ pairs"
    assert len(lines) == 4  # a stage that raised draws no check mark


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"precision": "int4"}, "unknown precision 'int4'"),
        ({"flavour": "trt"}, "unknown TensorRT flavour 'trt'"),
        ({"backend": "trt"}, "unknown TensorRT flavour 'trt'"),  # flavour's old name
        ({"calib_count": 0}, "--calib-count"),
        ({"seed": 2**32}, "--seed"),
        ({"seed": -1}, "--seed"),
        ({"opt_level": 9}, "--opt-level"),
        ({"calib_method": "magic"}, "unknown calibration method 'magic'"),
        ({"tolerances": ["rel_l2=nan"]}, "not a positive finite number"),
        ({"tolerances": ["rel_l2=0"]}, "not a positive finite number"),
        ({"tolerances": ["fp16.rell2=1e-3"]}, "unknown tolerance 'rell2'"),
        ({"tolerances": ["int4.rel_l2=1e-3"]}, "unknown precision 'int4'"),
        ({"tolerances": ["rel_l2"]}, "malformed --tol"),
        ({"tolerances": ["cosine=2"]}, "--tol cosine: 2 is not a number in (0, 1]"),
        ({"tolerances": ["fp16.recall=1.5"]}, "--tol fp16.recall: 1.5 is not a number in [0, 1]"),
        ({"tolerances": ["conf=0"]}, "--tol conf: 0 is not a number in (0, 1]"),
        ({"tolerances": ["scores.map50=0.5"]}, "a part takes a parity limit"),
        ({"tolerances": ["fp16.a.b.rel_l2=0.1"]}, "expected [precision.][part.]NAME"),
        ({"profiles": ["1x3xHxW"]}, "malformed"),
        ({"exclude": ["(unclosed"]}, "bad regex"),
        ({"workspace": "lots"}, "malformed size"),
        ({"weights": "a.pt", "random_init": True}, "exclude each other"),
        ({"repair": True}, "--repair works on fp16 and int8"),
        ({"precsion": "fp16"}, "unknown option 'precsion'"),
    ],
)
def test_bad_build_options_are_one_line_usage_errors(options, needle):
    from enginekit.errors import UsageError
    from enginekit.requests import BuildRequest

    with pytest.raises(UsageError) as err:
        BuildRequest(target="yolo12n", **options)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_api_takes_a_request_or_named_options_not_both():
    from enginekit import api
    from enginekit.errors import UsageError
    from enginekit.requests import BuildRequest, VerifyRequest

    with pytest.raises(UsageError, match="not both"):
        api.build(BuildRequest(target="yolo12n"), precision="fp16")
    with pytest.raises(UsageError, match="--image-count"):
        api.verify("yolo12n", image_count=0)
    request = VerifyRequest(target="yolo12n", precision="int8", build_options={"random_init": True})
    assert request.kind == "model"
    assert request.build_request == BuildRequest(target="yolo12n", precision="int8", random_init=True)
    assert VerifyRequest(target="abcdef12").kind == "key" and VerifyRequest().kind == "all"
    with pytest.raises(UsageError, match="does not match its build request"):
        VerifyRequest(target="yolo12n", precision="fp16", build=request.build)
    assert VerifyRequest(target="m.onnx", reference="m.pt").kind == "onnx"
