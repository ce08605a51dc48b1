"""Polygraphy's TensorRT backend, bound to the TensorRT enginekit uses, with TensorRT's log in the reporter.

Polygraphy decides between TensorRT and TensorRT-RTX when each of its modules is imported:
``polygraphy.config.USE_TENSORRT_RTX`` (read from ``POLYGRAPHY_USE_TENSORRT_RTX`` when ``polygraphy``
is first imported) chooses what ``polygraphy.mod.trt_importer.lazy_import_trt()`` returns, and the
modules of ``polygraphy.backend.trt`` (loaders, config, runner, util), ``polygraphy.backend.tensorrt_rtx``
and ``polygraphy.datatype.tensorrt`` keep that lazy module in a global named ``trt``. Setting the
environment variable after ``import polygraphy`` (enginekit's references import it early) changes
nothing, and one process may build with TensorRT and run a TensorRT-RTX engine. ``bind(flavour)``
therefore sets the flag and gives every such global a lazy module of the chosen backend again.

TensorRT logs through one ``ILogger`` per module and process (it warns when builders get different
ones); ``trt_logger(module)`` is that logger, and Polygraphy's loaders and runners use it too
(``polygraphy.backend.trt.util.TRT_LOGGER``). Its warnings go to ``enginekit.reporting`` as warnings,
its errors are kept to explain the step that failed (the one-line error says it), and the rest is
dropped: API users never see raw log lines. Polygraphy's own logger is kept quiet while enginekit
drives it (``quiet_polygraphy``): its failures reach enginekit as ``PolygraphyException``.

Only ``enginekit.trt`` imports this module: Polygraphy's TensorRT backend imports tensorrt.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from enginekit import reporting
from enginekit.errors import CapabilityError

if TYPE_CHECKING:
    from enginekit.trt.flavours import Flavour

RTX_MODULE = "tensorrt_rtx"  # Polygraphy's USE_TENSORRT_RTX selects this module
_MAX_MESSAGE = 400
_KEPT = 100  # errors kept, warnings remembered (a logger outlives every build)


def tidy_message(message: str) -> str:
    """A TensorRT log message without source locations, on one line, not too long."""
    text = " ".join(message.split())
    text = re.sub(r"^[\w:]+: Error Code \d+: [\w ]+? \((.*)\)$", r"\1", text)
    text = re.sub(r"\[[\w.]+:\d+: \w+\] ", "", text)
    text = re.sub(r" In \w+ at /\S+", "", text)
    text = re.sub(r"^Assertion failed: [^:]*: ", "", text)
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


@functools.lru_cache(maxsize=None)
def trt_logger(module: ModuleType) -> Any:
    """The one TensorRT logger of ``module`` (tensorrt or tensorrt_rtx) in this process.

    Warnings are reported (once per message while ``capturing``) to the reporter current when the
    capture began, else to the current one; errors are kept in ``errors`` until the next capture.
    """
    label = "TensorRT-RTX" if module.__name__.split(".")[0] == RTX_MODULE else "TensorRT"
    severity = module.ILogger.Severity

    class ReportingLogger(module.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            module.ILogger.__init__(self)
            self.errors: list[str] = []
            self.reporter: reporting.Reporter | None = None
            self.warned: set[str] = set()

        def log(self, level: Any, msg: str) -> None:
            try:  # TensorRT calls this from C++: it must not raise
                if int(level) <= int(severity.ERROR):
                    if len(self.errors) < _KEPT:  # the first ones explain a failure
                        self.errors.append(msg)
                elif int(level) == int(severity.WARNING):
                    text = tidy_message(msg)
                    if text not in self.warned:
                        if len(self.warned) >= _KEPT:
                            self.warned.clear()
                        self.warned.add(text)
                        (self.reporter or reporting.current()).warning(f"{label}: {text}")
            except Exception:  # noqa: BLE001
                pass

    return ReportingLogger()


@contextlib.contextmanager
def capturing(logger: Any) -> Iterator[Any]:
    """Collect the logger's errors afresh and send its warnings to the reporter current now.

    TensorRT may log from threads of its own, where the current reporter is nobody's: the
    reporter is taken here, in the caller's thread.
    """
    previous = logger.reporter
    logger.errors.clear()
    logger.warned.clear()
    logger.reporter = reporting.current()
    try:
        yield logger
    finally:
        logger.reporter = previous


@contextlib.contextmanager
def quiet_polygraphy() -> Iterator[None]:
    """Polygraphy's logger says nothing inside the block (its failures still raise)."""
    from polygraphy.logger import G_LOGGER

    with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
        yield


_bound: dict[str, ModuleType] = {}


def bind(flavour: "Flavour") -> ModuleType:
    """Point Polygraphy's TensorRT backend at ``backend``'s module; returns ``polygraphy.backend.trt``.

    Idempotent and cheap once bound; rebinding to the other module (TensorRT <-> TensorRT-RTX) in
    one process gives each Polygraphy module a new lazy module of the chosen one.
    """
    from polygraphy import config
    from polygraphy.mod import trt_importer

    config.USE_TENSORRT_RTX = flavour.traits.module == RTX_MODULE
    if _bound.get("module") is not flavour.module:
        for name, module in list(sys.modules.items()):
            held = getattr(module, "trt", None) if name.startswith("polygraphy.") else None
            if type(held).__name__ == "LazyModule":
                module.trt = trt_importer.lazy_import_trt()
    with quiet_polygraphy():
        import polygraphy.backend.trt as poly_trt
        from polygraphy.backend.trt import util as trt_util

        trt_util.TRT_LOGGER = trt_logger(flavour.module)
        bound_version = str(poly_trt.loader.trt.__version__)
    if bound_version != flavour.version:
        raise CapabilityError(f"polygraphy uses TensorRT {bound_version}, not {flavour.label}: "
                              "build and run with one TensorRT per process")
    _bound["module"] = flavour.module
    return poly_trt
