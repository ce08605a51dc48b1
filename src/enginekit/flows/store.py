"""The team store in the flows: deploy by identity, publication once gates passed, push and pull.

    resolve_engine     identity + this machine's hardware -> an engine (local, then the store),
                       with one line saying which and why; on a miss, what the store has instead
    publish_build      after a build whose gates did not fail: its chain of entries, the engine, its index
    publish_verdicts   after verify: the report, and the verdict in the engine's index record
    push / pull_key / pull_recipe    the ``enginekit cache push|pull`` verbs
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from enginekit import reporting
from enginekit.errors import CapabilityError, UsageError
from enginekit.gpu import gpu_info
from enginekit.hashing import key_for
from enginekit.pipeline import Stages
from enginekit.recipes import load_recipe
from enginekit.shapes import bind_to_model, parse_profile
from enginekit.store.identity import (Wanted, hardware_of, identity_of, make_identity, rank, serves, summary_of_others, why_chosen)
from enginekit.store.tier import manifest_name
from enginekit.trt.flavours import resolve_flavour, resolve_targets
from enginekit.verification.record import engine_record, record_of


@dataclass
class Resolution:
    entry: object | None  # cache.Entry
    reason: str  # which entry and why, or (a miss) what there is instead
    identity: dict | None = None
    status: str = "hit"  # hit (the local cache) | pulled (from the store)


def engine_by_identity(cache, pipe, request, bound, flavour, targets, export_parts: dict) -> Resolution | None:
    """For ``build``: on a client that reads the store (``ENGINEKIT_REMOTE_MODE=read``, a deploy
    machine), a request a deploy machine makes (``by_identity_applies``) whose first stage this
    machine has not made is served by identity (other library versions than the builder's never
    compute its keys). A writer (CI) builds with its own toolchain, key by key, so what it pushes is
    what its versions make. None where identity does not apply; else the resolution, said in one
    line (``--explain`` or not): the entry and why, or what there is instead."""
    remote = cache.remote
    if remote is None or remote.settings.writable or not by_identity_applies(request):
        return None
    if cache.has("onnx-export", key_for(export_parts)):
        return None  # this machine builds: its own chain decides, key by key
    resolution = resolve_engine(cache, identity_for(pipe, request, bound), wanted_here(flavour, targets))
    if resolution.entry is not None:
        reporting.note(("explain engine: " if request.explain else "") + resolution.reason)
    else:
        reporting.note(("explain engine: " if request.explain else "") + resolution.reason + ": building it here")
    return resolution


def identity_for(pipe, request, bound: list) -> dict:
    return make_identity(pipe.subject, pipe.request.weights_identity, request.precision,
                         [p.to_json() for p in bound], bool(request.nms))


def wanted_here(flavour, targets) -> "object":
    gpu = gpu_info()
    return Wanted(flavour.name, str(flavour.version), tuple(targets), str(gpu) if gpu else None)


def by_identity_applies(request) -> bool:
    """A request that names only what a deploy machine names (model, weights, precision, profiles,
    backend, targets) may be served by identity; explicit quantization or builder settings, repair
    or --force build what they ask for."""
    r = request
    return not (r.is_file or r.force or r.repair or r.calib_data or r.calib_cache or r.calib_method or r.exclude
                or r.workspace or r.opt_level is not None or r.tolerances)


def _local_records(cache, identity: dict) -> list[dict]:
    out = []
    for entry in cache.entries("engine"):
        m = entry.manifest
        if identity_of(m) == identity:
            out.append({"kind": "engine", "key": entry.key, "identity": identity, "hardware": hardware_of(m),
                        "verdict": {"parity": (m.get("parity") or {}).get("passed")},
                        "provenance": m.get("versions") or {}, "published": m.get("created")})
    return out


def resolve_engine(cache, identity: dict, wanted) -> Resolution:
    """The engine that serves ``identity`` on this hardware: from the local cache, else pulled from
    the store (every file's sha256 checked). A miss says which hardware the store has engines for."""
    local = _local_records(cache, identity)
    for record in sorted((r for r in local if serves(r, wanted) is None), key=rank):
        found = cache.lookup("engine", record["key"], remote=False)
        if found.entry is not None:
            return Resolution(found.entry, why_chosen(record, wanted, "local cache"), identity, "hit")
    remote = cache.remote
    records = []
    if remote is not None:
        records = remote.quietly(remote.index_records, identity) or []
        for record in sorted((r for r in records if serves(r, wanted) is None), key=rank):
            found = cache.lookup("engine", record["key"])
            if found.entry is not None:
                return Resolution(found.entry, why_chosen(record, wanted, f"store {remote.url}"), identity,
                                  "pulled" if found.status == "pulled" else "hit")
    seen = {r["key"]: r for r in local + records}
    what = f"{identity['model']} {identity['precision']} ({identity['weights'][:23]}, {len(identity['profiles'])} profile(s))"
    if seen:
        why = "; ".join(sorted({f"{serves(r, wanted)}" for r in seen.values()}))
        reason = (f"no engine of {what} serves {wanted.describe()}: the cache and store have it for "
                  f"{summary_of_others(list(seen.values()))} ({why})")
    elif remote is not None:
        reason = f"the store {remote.url} has no engine of {what}"
    else:
        reason = f"no engine of {what} in the cache"
    return Resolution(None, reason, identity)


def publish_build(cache, chain: list, entry) -> None:
    """Push a build's entries (its chain, the engine, the engine's index record) where a store is
    configured for writing, unless the engine's parity gate failed. Never fails the build."""
    remote = cache.remote
    if remote is None or not remote.writable:
        return
    parity = (entry.manifest.get("parity") or {}).get("passed")
    if parity is False:
        reporting.note(f"not pushed to {remote.url}: the engine's graph failed its parity gate", level=1)
        return
    entries = [a.entry for a in chain if getattr(a, "entry", None) is not None]
    if cache.publish(entries, engine=entry):
        reporting.note(f"pushed engine {entry.key[:12]} to {remote.url}", level=1)


def publish_verdicts(cache, found: list, reports: list) -> None:
    """After verify: each engine's report goes to the store, and its index record carries the verdict
    (an engine that failed is then passed over by deploy machines). A failing engine the store does
    not have is not pushed; a passing one is, with its chain."""
    remote = cache.remote
    if remote is None or not remote.writable:
        return

    gpu = gpu_info()
    for (entry, _), report in zip(found, reports):
        manifest = getattr(entry, "manifest", None)
        if not manifest or getattr(entry, "kind", None) != "engine":
            continue
        if not report.passed and not remote.quietly(remote.store.head, manifest_name("engine", entry.key)):
            continue
        name = remote.quietly(remote.write_report, entry.key, report.to_json(), writing=True)
        unchecked = [a.name for a in report.artifacts if a.ran and a.passed and not a.checked]
        verdict = {"verify": {"passed": report.passed, "engine_ran": report.engine_ran,
                              "not_checked": unchecked,  # parts whose reference is the same for every input
                              "gpu": str(gpu) if gpu and report.engine_ran else None,
                              "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "report": name}}
        if report.passed:
            links = [cache.lookup(link["kind"], link["key"], remote=False).entry
                     for link in manifest.get("chain", []) if "kind" in link]
            cache.publish([e for e in links if e is not None], engine=entry, verdict=verdict)
        else:
            remote.quietly(remote.write_index, manifest, verdict, writing=True)


# -- the cache verbs ----------------------------------------------------------------------------------
def push(cache, keys: list[str], *, everything: bool = False) -> dict:
    """``cache push KEY... | --all``: entries (an engine with the entries it came from) to the store.
    Engines whose parity gate failed are not pushed (said so). Raises ``StoreError``."""
    cache.require_remote(write=True)
    if everything:
        entries = [cache.lookup(i.kind, i.key, remote=False).entry for i in cache.ls() if i.valid]
    else:
        if not keys:
            raise UsageError("cache push: name entries (KEY ...) or pass --all")
        entries = [cache.resolve(k) for k in keys]
    ordered, seen = [], set()
    for entry in entries:
        if entry is None:
            continue
        if entry.kind == "engine":  # what it came from first, so verify works where it lands
            for link in entry.manifest.get("chain", []):
                if "kind" in link and (link["kind"], link["key"]) not in seen:
                    found = cache.lookup(link["kind"], link["key"], remote=False)
                    if found.entry is not None:
                        ordered.append(found.entry)
                        seen.add((link["kind"], link["key"]))
        if (entry.kind, entry.key) not in seen:
            ordered.append(entry)
            seen.add((entry.kind, entry.key))
    result = {"pushed": [], "present": [], "refused": []}
    for entry in ordered:
        failed = failed_check(cache, entry)
        if failed:  # an engine or graph whose record holds a failed check stays local
            result["refused"].append(entry.key)
            reporting.warning(f"{entry.kind} {entry.key[:12]} failed a check ({failed}): not pushed")
            continue
        with reporting.stage(f"push {entry.kind}/{entry.key[:12]}") as s:
            done = cache.push(entry)
            s.status = "pushed" if done else "in the store"
        result["pushed" if done else "present"].append(entry.key)
    return result


def failed_check(cache, entry) -> str:
    """The failed check an entry's record holds (an engine's: its source graph's and its own; a graph's: its own), in
    one phrase; "" where none failed."""
    if entry.kind == "engine":
        return engine_record(cache, entry.manifest).failure_line()
    graph = ((entry.manifest.get("files") or {}).get("model.onnx") or {}).get("sha256")
    return record_of(cache, graph).failure_line() if entry.kind.startswith("onnx-") and graph else ""


def pull_key(cache, prefix: str) -> list:
    """``cache pull KEY``: the store's entry whose key starts with ``prefix`` (6+ hex digits), and for
    an engine the entries it came from. Raises ``UsageError`` for an unknown or ambiguous prefix."""
    import re

    remote = cache.require_remote(write=False)
    text = prefix.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{6,64}", text):
        raise UsageError(f"malformed cache key {prefix!r}: give at least 6 hex digits")
    matches = [(r.kind, r.key) for r in remote.entries(manifests=False) if r.key.startswith(text)]
    if not matches:
        raise UsageError(f"the store {remote.url} has no entry with a key starting with {text!r}")
    if len({key for _, key in matches}) > 1:
        listed = ", ".join(f"{k}/{key[:12]}" for k, key in matches[:5])
        raise UsageError(f"cache key prefix {text!r} is ambiguous in the store: matches {listed}")
    kind, key = matches[0]
    pulled = []
    with reporting.stage(f"pull {kind}/{key[:12]}") as s:
        entry, s.status = cache.pull(kind, key)
    pulled.append(entry)
    if kind == "engine":
        for link in entry.manifest.get("chain", []):
            if "kind" in link:
                found = cache.lookup(link["kind"], link["key"])
                if found.entry is not None:
                    pulled.append(found.entry)
    return pulled


def pull_recipe(cache, path: str, overrides: dict | None = None) -> list:
    """``cache pull RECIPE``: every cell's engine that serves this machine, found by identity in the
    store. Raises ``CapabilityError`` naming what the store has when a cell has none."""
    cache.require_remote(write=False)
    recipe = load_recipe(path)
    found = []
    for cell in recipe.cells(overrides):
        request = recipe.build_request(cell, overrides)
        flavour = resolve_flavour(request.flavour)
        targets = resolve_targets(flavour, request.target_ccs, gpu_info())
        pipe = Stages(request.model_request, cache)
        bound, _, _ = bind_to_model([parse_profile(p) for p in request.profiles], pipe.adapter)
        identity = identity_for(pipe, request, bound)
        with reporting.stage(f"pull {recipe.name} {cell.precision} {cell.targets_label}") as s:
            resolution = resolve_engine(cache, identity, wanted_here(flavour, targets))
            s.status = resolution.status if resolution.entry is not None else "miss"
        if resolution.entry is None:
            raise CapabilityError(resolution.reason)
        reporting.note(resolution.reason, level=1)
        found.append(resolution.entry)
    return found
