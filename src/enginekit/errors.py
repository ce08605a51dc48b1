"""Errors that map to enginekit's documented exit codes.

0 ok; 1 a parity gate failed; 2 bad usage or input; 3 a capability is missing
(no GPU, no TensorRT) that the user asked for explicitly.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PARITY = 1
EXIT_USAGE = 2
EXIT_CAPABILITY = 3


class EnginekitError(Exception):
    """An expected failure: printed as one line, never as a traceback."""

    exit_code = EXIT_USAGE


class UsageError(EnginekitError):
    """Bad usage or input: a malformed flag, a missing or corrupt file."""

    exit_code = EXIT_USAGE


class CapabilityError(EnginekitError):
    """Something explicitly asked for cannot be done on this machine."""

    exit_code = EXIT_CAPABILITY


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where the CLI catches it: everything that cleans up on
    Ctrl-C (temporary folders, locks) cleans up on it too; the CLI then exits 143 (128 + 15)."""

    exit_code = 143


class ModelFailed(EnginekitError):
    """A model raised while running on a frame (its backend refused the input, ran out of memory...): one line
    naming the model and the frame, the backend's own exception kept as ``__cause__``. Exit 2: the input
    (a size the graph cannot take, a corrupt graph) is what a user changes."""

    exit_code = EXIT_USAGE

    def __init__(self, model: str, error: BaseException, frames: list[str] | tuple[str, ...] = (), step: int | None = None):
        self.model, self.error, self.frames, self.step = model, error, list(frames), step
        where = f" on {', '.join(self.frames[:3])}{' ...' if len(self.frames) > 3 else ''}" if self.frames else ""
        super().__init__(f"{model} failed{where}: {type(error).__name__}: {first_line(error, 300)}")


class ParityError(EnginekitError):
    """A candidate does not compute what its reference computes."""

    exit_code = EXIT_PARITY


class TargetMissed(EnginekitError):
    """``enginekit tune``: no candidate meets the targets (a gate, like parity: exit 1)."""

    exit_code = EXIT_PARITY


def first_line(error: BaseException | str, limit: int | None = None) -> str:
    """The first non-empty line of an exception's (or a message's) text, for one-line errors.

    An exception with no text gives its type's name; ``limit`` cuts long lines.
    """
    text = str(error).strip()
    line = text.splitlines()[0].strip() if text else (
        type(error).__name__ if isinstance(error, BaseException) else "")
    return line[:limit] if limit is not None else line
