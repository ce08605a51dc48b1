"""Every option of the verbs that make a request comes from one field of that request (``enginekit.requests``):
the field is the one declaration the CLI, the Python API's keywords and (for build and verify) the recipe keys
share. An option no field takes, or a field named here that does not exist, fails with its command and name."""

from __future__ import annotations

import pytest
import typer
from typer._click.core import Context
from typer.core import TyperGroup

from enginekit import options as opts
from enginekit import requests as rq
from enginekit.families.torch_models.spec import FLAGS

#: options that set how the command runs, not what it makes: the team store (``--remote``), trusting a pickle,
#: how the result is shown or where a copy goes
RUN_SETTINGS = {"trust_checkpoint", "remote", "remote_read_only"}
DECLARED = {*FLAGS, "bgr"} - {"channels"}  # --task ... --classes: the request's ``declared``

#: (command, request, {option parameter: field it sets, where the names differ}, {options that are the command's own})
VERBS = [
    ("export", rq.ExportRequest, {"imgsz": "input"}, {"report"}),
    ("build", rq.BuildRequest,
     {"profile": "profiles", "imgsz": "profiles", "no_verify": "verify", "tol": "tolerances", "trt": "flavour",
      "backend": "flavour"},
     {"output", "ultralytics_metadata", "as_json"}),
    ("verify", rq.VerifyRequest,
     {"profile": "build.profiles", "imgsz": "build.profiles", "tol": "tolerances",
      "trt": "build.flavour", "backend": "build.flavour", "report": "report_dir",
      **{name: f"build.{name}" for name in ("weights", "random_init", "seed", "nms", "repair", "target_cc",
                                                    "workspace", "opt_level", "calib_data", "calib_count",
                                                    "calib_method", "calib_cache", "exclude")},
      **{name: "build.declared" for name in DECLARED}},
     set()),
    ("tune", rq.TuneRequest, {"backend": "backends", "precision": "precisions", "input": "inputs", "batch": "batches",
                              "budget": "budget_minutes"}, {"as_json"}),
    ("deploy triton", rq.DeployRequest, {"profile": "profiles"}, set()),
    ("predict", rq.PredictRequest, {}, {"as_json", "verbose"}),
    ("bench", rq.BenchRequest, {"batch": "batches", "backend": "backends", "imgsz": "input", "plot_path": "plot"},
     {"as_json"}),
]


def params(path: str) -> dict:
    """The options of command ``path`` (``"deploy triton"``), by parameter name."""
    from enginekit.cli import app

    cmd = typer.main.get_command(app)
    ctx = Context(cmd, info_name="enginekit")
    for part in path.split():
        assert isinstance(cmd, TyperGroup)
        cmd = cmd.get_command(ctx, part)
        ctx = Context(cmd, parent=ctx, info_name=part)
    return {p.name: p for p in cmd.get_params(ctx) if p.name != "help" and p.param_type_name == "option"}


def command(path: str) -> list[str]:
    return list(params(path))


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
        target = renamed.get(name, "declared" if name in DECLARED else name)
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


# -- one declaration: options.py's Option is the flag, the help line, the request field and the recipe key ----------
SHARED = [("build", o) for o in (*opts.BY_FIELD.values(),) if o.field != "opset"] + [
    ("verify", o) for o in opts.BY_FIELD.values() if o.field != "opset"] + [("export", opts.OPSET)]


@pytest.mark.parametrize("verb, option", SHARED, ids=[f"{v}-{o.flag}" for v, o in SHARED])
def test_a_shared_option_is_its_declaration_on_the_command_line(verb, option):
    """The flag, its help line and panel come from the Option; the request's field has its default."""
    param = params(verb)[option.parameter]
    assert tuple(param.opts) + tuple(param.secondary_opts) == option.flags
    assert param.help == option.help
    assert param.rich_help_panel == option.panel
    request = {"build": rq.BuildRequest, "verify": rq.BuildRequest, "export": rq.ExportRequest}[verb]
    assert request.model_fields[option.field].default == option.default


#: a value other than the default for each option a recipe key holds, as written in the recipe and as the request has it
HELD_VALUES = {"random_init": (True, True), "seed": (7, 7), "opset": (17, 17),
               "profiles": (["1x3x320x320"], ["1x3x320x320"]), "flavour": ("tensorrt-rtx", "tensorrt-rtx"),
               "workspace": ("2G", "2G"), "opt_level": (2, 2), "calib_data": ("imgs", "imgs"), "calib_count": (3, 3),
               "calib_method": ("max", "max"), "calib_cache": ("c.cache", "c.cache"),
               "exclude": (["/model.22/.*"], ["/model.22/.*"])}


def test_every_option_a_recipe_holds_reaches_the_build_request(tmp_path):
    """Each option with a recipe key (options.py) goes from that key into BuildRequest's field, with no mapping
    written by hand: a key the schema lacks, or a value that does not arrive, fails naming the option."""
    import yaml

    from enginekit.recipes import load_recipe
    from enginekit.recipes.schema import HELD

    held = {o.field for o in HELD}
    assert held == set(HELD_VALUES) | {"weights"}, held  # weights: below, with random_init off
    (tmp_path / "imgs").mkdir()
    data: dict = {"model": {"variant": "yolo12n"}, "precisions": ["int8"]}
    for option in HELD:
        if option.field in HELD_VALUES:
            node = data
            for key in option.recipe[:-1]:
                node = node.setdefault(key, {})
            node[option.recipe[-1]] = HELD_VALUES[option.field][0]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    request = load_recipe(path).build_request("int8")
    for field, (_, expected) in HELD_VALUES.items():
        got = getattr(request, field)
        if opts.BY_FIELD[field].is_path:  # a path in a recipe is relative to its file
            assert got == tmp_path / expected, field
        else:
            assert got == expected, field


@pytest.mark.parametrize("field, recipe_text, bad", [
    ("opt_level", "builder:\n  opt_level: 9\n", 9),
    ("workspace", "builder:\n  workspace: '0'\n", "0"),
    ("calib_method", "calibration:\n  method: magic\n", "magic"),
    ("exclude", "calibration:\n  exclude: ['(']\n", ["("]),
    ("seed", "model: {variant: yolo12n, random_init: true, seed: -1}\n", -1),
    ("opset", "model: {variant: yolo12n, random_init: true, opset: 99}\n", 99),
    ("flavour", "trt: trt\n", "trt"),
])
def test_a_bad_value_is_refused_alike_by_the_request_and_the_recipe(tmp_path, field, recipe_text, bad):
    """One check per option: the request names the flag, the recipe file, line and key, and the message after that
    is the same."""
    from enginekit.errors import UsageError
    from enginekit.recipes import load_recipe

    option = opts.BY_FIELD[field]
    with pytest.raises(UsageError) as by_request:
        rq.BuildRequest(target="yolo12n", random_init=True, precision="int8", **{field: bad})
    text = str(by_request.value)
    assert text.startswith(f"{option.flag}: "), text
    path = tmp_path / "r.yaml"
    model = "" if recipe_text.startswith("model:") else "model: {variant: yolo12n, random_init: true}\n"
    path.write_text(model + "precisions: [int8]\n" + recipe_text)
    with pytest.raises(UsageError) as by_recipe:
        load_recipe(path)
    key = ".".join(option.recipe)
    said = str(by_recipe.value)
    assert f": {key}" in said, said
    assert said.endswith(text.partition(": ")[2]), (said, text)


@pytest.mark.parametrize("verb", ["export", "build", "verify", "tune", "predict", "deploy triton"])
def test_the_declaration_is_options_py_on_every_command_that_takes_it(verb):
    """--task ... --classes: each Option's flag, help and panel on every command that takes the declaration; the
    Options are the declaration's names (families.torch_models.spec) and a recipe's model: keys."""
    from enginekit.options import DECLARATION
    from enginekit.recipes.schema import ModelSection

    assert {o.field for o in DECLARATION} == DECLARED
    found = params(verb)
    for option in DECLARATION:
        param = found[option.parameter]
        assert (tuple(param.opts), param.help, param.rich_help_panel) == (option.flags, option.help, option.panel)
        assert option.recipe is None or option.recipe[1] in ModelSection.model_fields, option

