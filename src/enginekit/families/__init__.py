"""Model families: a name on the command line -> the adapter of its family.

What a family provides is declared in ``families.interface`` (by job: registration, export, evaluation,
runtime); evaluation and runtime processing by task, for any family, in ``families.evaluation`` and
``families.processing``. Families join the registry by declaring themselves (``families.registry.register``);
this package only re-exports. Importing it stays cheap (adapters import torch, ultralytics or
transformers inside their methods).
"""

from __future__ import annotations

from enginekit.families.base import LoadedModel, ModelAdapter, Tolerance
from enginekit.families.interface import Evaluation, Export, Processor, Registration, Runtime
from enginekit.families.registry import FamilyInfo, families, register, registered, resolve

__all__ = ["Evaluation", "Export", "FamilyInfo", "LoadedModel", "ModelAdapter", "Processor", "Registration",
           "Runtime", "Tolerance", "families", "register", "registered", "resolve"]
