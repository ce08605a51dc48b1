"""Every option of the verbs that make a request comes from one field of that request (``enginekit.requests``):
the field is the one declaration the CLI, the Python API's keywords and (for build and verify) the recipe keys
share. An option no field takes, or a field named here that does not exist, fails with its command and name."""

from __future__ import annotations

import pytest
import typer
from typer._click.core import Context
from typer.core import TyperGroup

from enginekit import requests as rq
from enginekit.families.torch_models.spec import FLAGS

#: options that set how the command runs, not what it makes: the team store (``--remote``), trusting a pickle,
#: how the result is shown or where a copy goes
RUN_SETTINGS = {"trust_checkpoint", "remote", "remote_read_only"}
DECLARATION = {*FLAGS, "bgr"} - {"channels"}  # --task ... --classes: the request's ``declared``

#: (command, request, {option parameter: field it sets, where the names differ}, {options that are the command's own})
VERBS = [
    ("export", rq.ExportRequest, {"imgsz": "input"}, {"report"}),
    ("build", rq.BuildRequest,
     {"profile": "profiles", "imgsz": "profiles", "no_verify": "verify", "tol": "tolerances", "trt": "flavour",
      "backend": "flavour"},
     {"output", "ultralytics_metadata"}),
    ("verify", rq.VerifyRequest,
     {"profile": "build.profiles", "imgsz": "build.profiles", "tol": "tolerances",
      "trt": "build.flavour", "backend": "build.flavour", "report": "report_dir",
      **{name: f"build.{name}" for name in ("weights", "random_init", "seed", "nms", "repair", "target_cc",
                                                    "workspace", "opt_level", "calib_data", "calib_count",
                                                    "calib_method", "calib_cache", "exclude")},
      **{name: "build.declared" for name in DECLARATION}},
     set()),
    ("tune", rq.TuneRequest, {"backend": "backends", "precision": "precisions", "input": "inputs", "batch": "batches",
                              "budget": "budget_minutes"}, {"as_json"}),
    ("deploy triton", rq.DeployRequest, {"profile": "profiles"}, set()),
    ("predict", rq.PredictRequest, {}, {"as_json", "verbose"}),
]


def command(path: str):
    from enginekit.cli import app

    cmd = typer.main.get_command(app)
    ctx = Context(cmd, info_name="enginekit")
    for part in path.split():
        assert isinstance(cmd, TyperGroup)
        cmd = cmd.get_command(ctx, part)
        ctx = Context(cmd, parent=ctx, info_name=part)
    return [p.name for p in cmd.get_params(ctx) if p.name != "help" and p.param_type_name == "option"]


def field_of(request: type, path: str) -> bool:
    head, _, rest = path.partition(".")
    if head not in request.model_fields:
        return False
    return not rest or (head == "build" and rest in rq.BuildRequest.model_fields)  # verify: the build it finds


@pytest.mark.parametrize("verb, request_type, renamed, own", VERBS, ids=[v[0] for v in VERBS])
def test_every_option_is_one_field_of_its_request(verb, request_type, renamed, own):
    problems = []
    options = command(verb)
    for name in options:
        if name in RUN_SETTINGS or name in own:
            continue
        target = renamed.get(name, "declared" if name in DECLARATION else name)
        if not field_of(request_type, target):
            problems.append(f"{verb} --{name.replace('_', '-')}: no field {target!r} of {request_type.__name__}")
    problems += [f"{verb}: {name} is listed here and is no option of it"
                 for name in {*renamed, *own} if name not in options]
    assert not problems, "\n".join(problems)


def test_the_table_itself_can_fail():
    """The check above compares something: an option the request lacks is found."""
    assert not field_of(rq.BuildRequest, "no_such_field")
    assert not field_of(rq.VerifyRequest, "build.no_such_field")
    assert field_of(rq.VerifyRequest, "build.flavour") and field_of(rq.BuildRequest, "calib_count")
