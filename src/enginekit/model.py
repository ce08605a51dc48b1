"""Which model, with which weights: the one identity of a model.

Requests (``--weights``/``--random-init``/``--seed``/``--nms``), recipes (``model:``), the
pipeline (every stage's key) and the runtime (``load``'s target) all name a model with a
:class:`ModelRequest`. It is enough to key every stage without loading the model: its
``weights_identity`` is a file's digest, or the seeded architecture of random weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from enginekit.hashing import sha256_file
from enginekit.errors import UsageError
from enginekit.families import ModelAdapter, resolve
from enginekit.families.base import folder_sha256
from enginekit import reporting
from enginekit.families.registry import model_in_file
from enginekit.fsutil import refuse_special_file


_SAID: set[str] = set()


def check_weights_choice(weights: Any, random_init: bool, *, names: tuple[str, str] = ("--weights", "--random-init")) -> None:
    """Weights from a file and random weights exclude each other (``names``: how the user wrote them)."""
    if weights is not None and random_init:
        raise UsageError(f"{names[0]} and {names[1]} exclude each other")


def check_weights_path(weights: Path, adapter: ModelAdapter, what: str = "weights") -> None:
    """A weights path that exists and is what the family reads: a regular file, or a folder where the
    family loads model folders (``ModelAdapter.weights_folders``). A FIFO or a device is refused
    before anything opens it (a read could block forever)."""
    if not weights.exists():
        raise UsageError(f"{what} file not found: {weights}")
    refuse_special_file(weights, what)
    if weights.is_dir() and not getattr(adapter, "weights_folders", False):
        raise UsageError(f"{what} {weights} is a folder: {adapter.variant} loads a checkpoint file ({adapter.family})")


@dataclass
class ModelRequest:
    """A model name, its weights (a file or folder; None: the family's published weights unless
    ``random_init``), the seed of random weights, whether NMS ends its graph, and what the user declares
    of the model (``declared``: ``--task``, ``--outputs``, preprocessing; families that take it).

    Made, the name is resolved to its family (``adapter``) and the weights file is checked: a bad
    one is a one-line UsageError before any work."""

    name: str
    weights: Optional[Path] = None
    random_init: bool = False
    seed: int = 0
    nms: bool = False  # NMS in the graph (``--nms``): the family's with_nms adapter
    declared: dict = field(default_factory=dict)  # ModelSpec fields the user set (JSON-ready)
    adapter: ModelAdapter = field(init=False, repr=False, compare=False)
    #: the checkpoint the model was named by (``export best.pt``): its name is the outputs' (best.onnx)
    checkpoint: Optional[Path] = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.weights is not None:
            self.weights = Path(self.weights)
        check_weights_choice(self.weights, self.random_init)
        self._from_checkpoint()
        self.declared = dict(self.declared or {})
        self.adapter = resolve(self.name, self.declared)
        self.adapter.check_source()
        if self.nms:
            self.adapter = self.adapter.with_nms()
        if self.weights is not None:
            check_weights_path(self.weights, self.adapter)
            if not self.random_init:
                self.adapter.check_weights(self.weights)

    def _from_checkpoint(self) -> None:
        """``best.pt`` alone (``yolo export model=best.pt``'s habit): an Ultralytics checkpoint holds its model (its
        module) and is its weights; no name needed. The name stays the file's path (``resolve`` reads it again)."""
        found = model_in_file(self.name)
        if found is None:
            return  # a name, a TorchScript program or a state dict
        path = Path(str(self.name)).expanduser()
        same = self.weights is not None and Path(self.weights).expanduser().resolve() == path.resolve()
        if (self.weights is not None and not same) or self.random_init:
            raise UsageError(f"{path.name} is an Ultralytics checkpoint: it is the model and its weights; drop "
                             f"{'--weights' if self.weights is not None else '--random-init'} (or name the model)")
        self.weights, self.checkpoint = path, path
        said = f"{path.name}: {found.describe_model()}"
        if said not in _SAID:  # once a process: a verb makes several requests of one file
            _SAID.add(said)
            reporting.note(said)

    @classmethod
    def recorded(cls, name: str, identity: str, *, nms: bool = False,
                 declared: dict | None = None) -> Optional["ModelRequest"]:
        """The model a recorded weights identity (an exported graph's metadata) names where it can be
        made again without a file: seeded random weights, the family's published ones, or those that come
        with the model's source. None: a file."""
        if identity.startswith("random:"):
            return cls(name, None, True, int(identity.rpartition("@")[2] or 0), nms, declared or {})
        if identity.startswith(("hub:", "source:")):
            return cls(name, None, False, 0, nms, declared or {})
        return None

    @cached_property
    def weights_identity(self) -> str:
        if self.random_init:
            tag = f"+{self.adapter.random_init_tag}" if self.adapter.random_init_tag else ""
            return f"random:{self.adapter.variant}{tag}@{self.seed}"
        if self.weights is not None:
            if self.weights.is_dir():
                return f"sha256:{folder_sha256(self.weights)}"
            return f"sha256:{sha256_file(self.weights)}"
        own = self.adapter.own_weights_identity(self.seed)  # weights that come with the source
        if own is not None:
            return own
        # a hub name: the content of the file it resolves to (downloaded if need be), not the name
        return f"sha256:{sha256_file(self.adapter.hub_weights())}"

    def matches(self, recorded: str) -> bool:
        """Whether a recorded weights identity (an exported graph's metadata) is what this request loads."""
        if recorded.startswith("random:"):
            return self.random_init and recorded.rpartition("@")[2] == str(self.seed)
        if recorded.startswith("hub:"):
            return self.weights is None and not self.random_init
        if recorded.startswith("source:") and (self.weights is not None or self.random_init):
            return False
        return self.weights_identity == recorded

    @property
    def subject(self) -> str:
        return self.adapter.variant

    def to_json(self) -> dict:
        """How to load this model again (paths are fine here: this is no cache key)."""
        data = {"name": self.adapter.portable_name if self.name != self.adapter.variant else self.name, "weights": str(self.weights.resolve()) if self.weights else None,
                "random_init": self.random_init, "seed": self.seed, "identity": self.weights_identity}
        if self.nms:
            data["nms"] = True
        if self.declared:
            data["declared"] = dict(self.declared)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "ModelRequest":
        weights = Path(data["weights"]) if data.get("weights") else None
        return cls(data["name"], weights, bool(data.get("random_init")), int(data.get("seed", 0)),
                   bool(data.get("nms")), dict(data.get("declared") or {}))

