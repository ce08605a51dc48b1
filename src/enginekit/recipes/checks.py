"""Checks a schema cannot express (``schema.Recipe`` runs them on itself, once valid; ``recipe`` is one): the model resolves, profiles fit it, calibration, targets and tolerances apply.
"""

from __future__ import annotations

from enginekit.errors import UsageError
from enginekit.families import resolve
from enginekit.families.torch_models.spec import FLAGS, ModelSpec
from enginekit.model import check_weights_choice
from enginekit.recipes.basics import DEFAULT_TARGETS, Loc, _Problem, parse_target_set
from enginekit.shapes import bind_to_model, parse_profile
from enginekit.trt.flavours import TRAITS, require_fp8


def _check(recipe) -> None:
    """Everything a build would refuse later: model, shapes, targets, files, tolerances."""
    adapter = _check_model(recipe)
    _check_profiles(recipe, adapter)
    _check_calibration(recipe)
    _check_targets(recipe)
    _check_verification(recipe, adapter)
    _check_runtime(recipe, adapter)


def _check_runtime(recipe, adapter) -> None:
    """``runtime.input`` is an input the model takes (a YOLO's sides are multiples of its stride)."""
    size = recipe.runtime.input_size() if recipe.runtime is not None else None
    if size is not None:
        shape = (1, int(adapter.default_input[1]), *size)
        _expect(("runtime", "input"), lambda: adapter.constraint.check(shape, what="size"))


def _expect(loc: Loc, fn, *args):
    """Run a check from elsewhere in enginekit; its UsageError becomes a problem at ``loc``."""
    try:
        return fn(*args)
    except UsageError as exc:
        raise _Problem(loc, str(exc)) from exc


def _check_model(recipe):
    m = recipe.model

    for key in FLAGS:  # each declaration key on its own line first
        if getattr(m, key) is not None:
            _expect(("model", key), ModelSpec.of, {key: getattr(m, key)})
    declared = _expect(("model",), m.declared)
    adapter = _expect(("model", "variant"), resolve, recipe.variant, declared)
    if m.family is not None and m.family != adapter.family:
        raise _Problem(("model", "family"), f"{m.variant} is a {adapter.family} model, not {m.family}")

    _expect(("model", "weights"), lambda: check_weights_choice(m.weights, m.random_init,
                                                               names=("weights", "random_init: true")))
    _expect(("model", "weights"), recipe.model_request)  # the weights file exists
    if recipe.input is not None and recipe.input != adapter.input_name:
        raise _Problem(("input",), f"{adapter.variant}'s input is '{adapter.input_name}', not '{recipe.input}'")
    return adapter


def _check_profiles(recipe, adapter) -> None:
    parsed = []
    for i, text in enumerate(recipe.profiles):
        profile = _expect(("profiles", i), parse_profile, text)
        bound = _expect(("profiles", i), profile.bind, [adapter.input_name])
        rng = bound.inputs[adapter.input_name]
        _expect(("profiles", i), lambda: adapter.constraint.check_range(rng, what="profile"))
        parsed.append(profile)
    _expect(("profiles",), bind_to_model, parsed, adapter)  # e.g. one H x W for YOLO


def _check_calibration(recipe) -> None:
    c = recipe.calibration
    if c.data is not None and not recipe._file(c.data).exists():
        raise _Problem(("calibration", "data"), f"calibration data not found: {recipe._file(c.data)}")


def _check_targets(recipe) -> None:
    rtx = TRAITS["tensorrt-rtx"]
    if not recipe.targets:
        raise _Problem(("targets",), f"names no target set: write '{DEFAULT_TARGETS}' or like 8.6,8.9,12.0")
    seen = []
    for i, text in enumerate(recipe.targets):
        targets = _expect(("targets", i), parse_target_set, text)
        if targets in seen:
            raise _Problem(("targets", i), f"target set {text} is listed twice")
        seen.append(targets)
        if targets is None:
            continue
        if recipe.trt != "tensorrt-rtx":
            raise _Problem(("targets", i), f"compute capability targets ({text}) need trt: tensorrt-rtx; "
                                           f"TensorRT builds only for the GPU it runs on ('{DEFAULT_TARGETS}')")
        unsupported = [t for t in targets if t not in rtx.compute_capabilities]
        if unsupported:
            raise _Problem(("targets", i), f"{rtx.label} cannot target compute capability "
                                           f"{', '.join(unsupported)}; supported: {', '.join(rtx.compute_capabilities)}")
    if "fp8" in recipe.precisions:
        for i, text in enumerate(recipe.targets):
            try:
                require_fp8(parse_target_set(text), subject="precision fp8", no_targets="the default targets",
                            fix="write targets like '8.9,12.0'")
            except UsageError as exc:
                raise _Problem(("targets", i), str(exc)) from exc


def _check_verification(recipe, adapter) -> None:
    v = recipe.verification
    if v.images is not None and not recipe._file(v.images).exists():
        raise _Problem(("verification", "images"), f"images not found: {recipe._file(v.images)}")
    if v.data is not None and not recipe._file(v.data).exists():
        raise _Problem(("verification", "data"), f"dataset not found: {recipe._file(v.data)}")
    gates = getattr(adapter, "task_gates", {})
    known = sorted({metric for per_precision in gates.values() for metric in per_precision})
    for precision, spec in v.tolerances.items():
        for metric in spec.task:
            if metric not in known:
                raise _Problem(("verification", "tolerances", precision, "task", metric),
                               f"unknown task metric {metric!r} for {adapter.family}: "
                               f"choose {', '.join(known) or 'none (no task gates)'}")
    _expect(("verification", "tolerances"), recipe.gates)  # every part named is one of the family's
