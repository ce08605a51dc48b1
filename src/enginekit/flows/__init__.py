"""Orchestration: what a verb does, stage by stage, for one request.

    export.py   PyTorch -> simplified ONNX (and FP16), parity-checked, copied out
    build.py    a model name or an ONNX file -> a cached engine (profiles, precision, explain)
    repair.py   a failing fp16/int8 graph -> the fewest nodes moved back to high precision
    verify.py   engines and their ONNX artifacts against the PyTorch reference; pictures, reports
    recipes.py  every (precision, target set) of a recipe: build, verify, CI matrix
    load.py     enginekit.load: a model name exported or built as its backend needs, then the runtime loads it
    predict.py  enginekit predict: sources -> predictors -> overlays + results.json

Each flow takes a request (``enginekit.requests``) and a cache, reports through
``enginekit.reporting`` and returns a result object; ``enginekit.api`` is the facade over them.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from enginekit import reporting
from enginekit.cache import holding_entries

R = TypeVar("R")


def run(flow: Callable[..., R], request, cache=None, *, quiet: bool = False) -> R:
    """Run ``flow(request, cache)`` with its reports collected into the result's ``events``
    (and passed on to whoever listens, unless ``quiet``)."""
    with reporting.collecting(quiet) as collector, holding_entries():  # gc keeps what the run uses
        result = flow(request, cache)
    result.events = collector.events
    return result
