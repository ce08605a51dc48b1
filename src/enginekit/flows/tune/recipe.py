"""The choice written as recipes: what builds each setting, with how to run it (``runtime:``) and what was measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from enginekit.families import resolve
from enginekit.flows.tune.search import Candidate, Measured, Setting, Targets, _num
from enginekit.recipes import load_recipe


# -- recipes -----------------------------------------------------------------------------------------------
def recipe_of(request, setting: Setting, measured: Measured, targets: Targets, machine: dict) -> dict:
    """The recipe that builds what ``setting`` runs, with how to run it (``runtime:``) and what was measured."""
    index = request.models.index(setting.model)
    model = request.model_request(index)
    adapter = resolve(setting.model, request.declared)
    shape = f"3x{setting.input[0]}x{setting.input[1]}"
    profile = f"1x{shape}" if setting.batch == 1 else f"1x{shape}:{setting.batch}x{shape}:{setting.batch}x{shape}"
    where = machine.get("gpu") or f"a {machine.get('cpu_count')}-core {machine.get('cpu') or ''} CPU machine".replace("  ", " ")
    section: dict[str, Any] = {"variant": adapter.variant}
    if model.weights is not None:
        section["weights"] = str(Path(model.weights).resolve())
    else:
        section["random_init"] = bool(model.random_init)
    if model.seed:
        section["seed"] = model.seed
    section.update(model.declared)  # --task, --classes...: the recipe's model: section declares the same
    recipe: dict[str, Any] = {
        "description": (f"enginekit tune: {setting.label()}, for {targets.describe()}; measured on {where}: p50 "
                        f"{_num(measured.p50_ms)} ms, p95 {_num(measured.p95_ms)} ms, p99 {_num(measured.p99_ms)} ms, "
                        f"{_num(measured.fps)} frames/s"),
        "model": section,
        "profiles": [profile],
        "precisions": [setting.precision],
        "trt": "auto",  # the TensorRT that builds: TensorRT where it runs, else TensorRT-RTX
        "runtime": {"backend": setting.backend, "input": setting.size, "batch": setting.batch,
                    "frames_per_step": request.frames_per_step,
                    "every": _cadence_of(request, setting.model)},
    }
    if model.random_init:
        recipe["verification"] = {"task_required": False}  # random weights: nothing for the task gates to compare
    return recipe


def _cadence_of(request, model: str) -> int:
    adapter = resolve(model, request.declared)
    for key, n in request.every.items():
        if key in (model, adapter.variant, adapter.family):
            return n
    return 1


def write_recipes(request, chosen: Candidate, targets: Targets, machine: dict) -> list[Path]:
    """One recipe per model (``--write-recipe FILE.yaml`` for one model; a folder: ``<model>.yaml`` each),
    checked by the recipe loader before it is kept."""
    import yaml

    target = Path(request.write_recipe)
    single = target.suffix.lower() in (".yaml", ".yml")
    written = []
    for s in chosen.settings:
        path = target if single else target / f"{resolve(s.model, request.declared).variant}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = recipe_of(request, s, chosen.measured, targets, machine)
        tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
        tmp.write_text("# written by enginekit tune; `enginekit build` and `make nightly` take it as it is\n"
                       + yaml.safe_dump(data, sort_keys=False, width=120))
        try:
            load_recipe(str(tmp))
        except Exception:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        written.append(path)
    return written
