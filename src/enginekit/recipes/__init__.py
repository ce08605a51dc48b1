"""Recipe files -> validated objects: which model, which shapes, precisions and targets to build.

A recipe is a YAML file (schema: ``schema.Recipe``). Loading it (``load_recipe``) validates everything a build
would refuse later, before any work starts, and names the file, line and key of the first
problem in one line::

    recipes/x.yaml:7: unknown key 'precisons' (did you mean precisions?)

Every ``enginekit build`` flag has a recipe key; flags given on the command line override the
file. Nothing here imports torch, onnx or tensorrt: validating a recipe is cheap.

By concept: ``schema`` (the sections, cells), ``yamlfile`` (YAML with line numbers, one-line errors), ``checks``
(what a schema cannot express), ``basics`` (how a check names its key; target sets), ``catalogue`` (shipped and local recipes,
loading).
"""

from __future__ import annotations

from enginekit.recipes.catalogue import (RecipeRef, collect_recipe_files, display_path, find_recipe, list_recipes,
                                         load_recipe, local_dir, recipe_files, shipped_dir)
from enginekit.recipes.basics import DEFAULT_TARGETS, parse_target_set
from enginekit.recipes.schema import (CALIBRATION_OPTIONS, RECIPE_SUFFIXES, VERIFY_ONLY, Builder, Calibration, Cell,
                                      ModelSection, Recipe, RuntimeSection, Verification)

__all__ = ["CALIBRATION_OPTIONS", "DEFAULT_TARGETS", "RECIPE_SUFFIXES", "VERIFY_ONLY", "Builder", "Calibration", "Cell",
           "ModelSection", "Recipe", "RecipeRef", "RuntimeSection", "Verification", "collect_recipe_files",
           "display_path", "find_recipe", "list_recipes", "load_recipe", "local_dir", "parse_target_set",
           "recipe_files", "shipped_dir"]
