"""enginekit tune: the settings that meet a frame budget on this machine, found by search.

A candidate is one setting per model: a runtime backend, a precision, an input size and a batch (frames
per inference call). Each is built through the cache (``enginekit.load``), verified (the verify flow;
a candidate that fails its gates is out, with the reason) and timed end to end through the runtime's
streaming pipeline (decode, preprocess, infer, postprocess; ``enginekit.runtime.stream``).

The search, per model, then (several models) over the pipelines of the settings that each met the
targets alone (a frame of them all is at least as slow as its slowest model alone):

- a model's candidates go in order of expected cost (``expected_cost``: the input's area, the
  precision's cost on the backend, the backend's, the inference calls per step), cheapest first;
  pipelines go most accurate first, then cheapest;
- a candidate is left out (pruned) once a measured one that costs no more (the same backend and
  batch, an input no larger in either side and, on a GPU, a precision no costlier) already misses a
  speed target; and once a candidate that meets every target is more accurate than it (it cannot be
  chosen; not for a model searched alone ahead of its pipelines, where a less accurate setting may
  pair better);
- the budget: no candidate starts once the time spent, plus the longest candidate so far, passes it.

The choice: a candidate that meets every target and passed verify (or could not be checked), with the
best accuracy (``accuracy_key``: not quantized over quantized, then the larger input, then the higher
precision), then the most frames per second. Timing per candidate: one step in flight (nothing
queued before a step: its latency as a stream that keeps up sees it) gives p50/p95/p99 and frames/s;
where an --fps target is not met so, a second run with two steps in flight (stages overlapped) gives
the frames/s. ``search`` is the pure part (a measurer passed in); ``run_tune`` measures for real.

By concept: ``search`` (settings, candidates, targets, the budget, the pure search), ``searchspace`` (what can run here),
``measure`` (built, verified and streamed for real), ``flow`` (``run_tune``), ``recipe`` (the choice as recipes).
"""

from __future__ import annotations

from enginekit.flows.tune.flow import TuneOutcome, run_tune
from enginekit.flows.tune.measure import Measurer
from enginekit.flows.tune.recipe import recipe_of, write_recipes
from enginekit.flows.tune.search import (ACCURACY_OK, Budget, Candidate, Measured, Setting, Targets, accuracy_key,
                                         choose, costs_no_more, expected_cost, nearest, pipelines, search, search_all)
from enginekit.flows.tune.searchspace import default_backends, space

__all__ = ["ACCURACY_OK", "Budget", "Candidate", "Measured", "Measurer", "Setting", "Targets", "TuneOutcome",
           "accuracy_key", "choose", "costs_no_more", "default_backends", "expected_cost", "nearest", "pipelines",
           "recipe_of", "run_tune", "search", "search_all", "space", "write_recipes"]
