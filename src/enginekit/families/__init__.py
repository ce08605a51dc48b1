"""Model families: a name on the command line -> the adapter of its family.

Families join the registry by declaring themselves (``families.registry.register``); this
package only re-exports. Importing it stays cheap (adapters import torch, ultralytics or
transformers inside their methods).
"""

from __future__ import annotations

from enginekit.families.base import LoadedModel, ModelAdapter, Tolerance
from enginekit.families.registry import FamilyInfo, families, register, registered, resolve

__all__ = ["FamilyInfo", "LoadedModel", "ModelAdapter", "Tolerance", "families", "register", "registered", "resolve"]
