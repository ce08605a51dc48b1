"""Deploy by identity: which engine serves "this model, these weights, this precision, these profiles"
on "this GPU with this TensorRT", whatever library versions built it.

An engine's cache key holds everything that determined its bytes, the versions of torch and
Ultralytics included, so a deploy machine with other versions never computes the CI's key. It
names instead what it wants to run:

    identity  = model (variant), weights (content sha256, or random:ARCH@SEED), NMS in the graph,
                precision, optimization profiles
    hardware  = backend (tensorrt / tensorrt-rtx) and its exact version (plans carry a version tag),
                and the compute capabilities the engine must run on (this GPU's, or the portable
                set a GPU-less machine asks for)

Each published engine gets a small index object ``index/<sha256(identity)>/<key>.json`` (written
after its manifest) holding its identity, hardware and verdict; resolution lists one prefix.
Build provenance (library versions, time) stays in the manifest and is shown, never required.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def identity_hash(identity: dict) -> str:
    return hashlib.sha256(_canonical(identity).encode("utf-8")).hexdigest()


def make_identity(model: str, weights: str, precision: str, profiles: list, nms: bool = False) -> dict:
    return {"model": model, "weights": weights, "nms": bool(nms), "precision": precision, "profiles": profiles}


def identity_of(manifest: dict) -> dict | None:
    """An engine manifest's identity, or None when it does not name its model and weights (an
    engine built from an ONNX file of unknown origin)."""
    request = manifest.get("model_request") or {}
    source = manifest.get("source_model") or {}
    weights = request.get("identity") or source.get("weights")
    model = manifest.get("subject") if request else source.get("name")
    precision = (manifest.get("precision") or {}).get("mode")
    if not (model and weights and precision) or manifest.get("profiles") is None:
        return None
    return make_identity(model, weights, precision, manifest["profiles"], bool(request.get("nms")))


def hardware_of(manifest: dict) -> dict:
    gpu = manifest.get("gpu") or None
    targets = list(manifest.get("targets") or ([gpu["compute_capability"]] if gpu else []))
    return {"backend": manifest.get("backend"), "version": manifest.get("backend_version"), "targets": targets,
            "gpu": gpu.get("name") if gpu else None}


def describe_hardware(hw: dict) -> str:
    """``tensorrt-rtx 1.7.1 for 7.5,8.0,8.6`` / ``tensorrt-10 10.13 on NVIDIA H100 (9.0)``."""
    where = f"on {hw['gpu']} ({','.join(hw['targets'])})" if hw.get("gpu") else f"for {','.join(hw['targets']) or '?'}"
    return f"{hw.get('backend')} {hw.get('version')} {where}"


@dataclass(frozen=True)
class Wanted:
    """What this machine can run: its backend row and version, and the compute capabilities the
    engine must cover (this GPU's, an explicit --target-cc, or the portable set with no GPU)."""

    backend: str
    version: str
    targets: tuple[str, ...]
    gpu: str | None = None

    def describe(self) -> str:
        where = f"{self.gpu}" if self.gpu else f"targets {','.join(self.targets) or 'none'}"
        return f"{self.backend} {self.version}, {where}"


def serves(record: dict, wanted: Wanted) -> str | None:
    """None when the indexed engine runs here, else why not (a few words)."""
    hw = record.get("hardware") or {}
    if hw.get("backend") != wanted.backend:
        return f"built with {hw.get('backend')}"
    if str(hw.get("version")) != wanted.version:
        return f"built with {hw.get('backend')} {hw.get('version')}"
    have = set(hw.get("targets") or [])
    if not wanted.targets or not set(wanted.targets) <= have:
        return f"built for {','.join(sorted(have)) or 'no target'}"
    verdict = record.get("verdict") or {}
    if verdict.get("parity") is False:
        return "failed its parity gate"
    if (verdict.get("verify") or {}).get("passed") is False:
        return "failed verify"
    return None


def rank(record: dict) -> tuple:
    """Better first: verified with the engine run, then the closest target set, then newest."""
    verdict = record.get("verdict") or {}
    verify = verdict.get("verify") or {}
    targets = (record.get("hardware") or {}).get("targets") or []
    return (not (verify.get("passed") and verify.get("engine_ran")), not verify.get("passed"),
            len(targets), _neg_time(record.get("published", "")))


def _neg_time(text: str) -> str:
    # newest first under an ascending sort: invert the characters of an ISO time
    return "".join(chr(0x10FFFF - ord(c)) for c in text)


def why_chosen(record: dict, wanted: Wanted, where: str) -> str:
    """One line: which entry and why it serves this machine."""
    hw = record.get("hardware") or {}
    verdict = record.get("verdict") or {}
    verify = verdict.get("verify") or {}
    versions = record.get("provenance") or {}
    built = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("enginekit", "torch", "ultralytics",
                                                                          "transformers") and v != "absent")
    if verify.get("passed"):
        check = "verify passed" + (f" running the engine on {verify.get('gpu')}" if verify.get("engine_ran") else
                                   " (graphs checked, engine not run)")
    elif verdict.get("parity"):
        check = "parity passed at build"
    else:
        check = "parity not checked"
    return (f"engine {record['key'][:12]} from the {where}, found by identity: {describe_hardware(hw)} serves "
            f"{wanted.describe()}; {check}; built {str(record.get('published', '?'))[:10]}"
            + (f" with {built}" if built else ""))


def summary_of_others(records: list[dict]) -> str:
    """The hardware a set of index records covers, in one line (for a miss)."""
    seen = sorted({describe_hardware(r.get("hardware") or {}) for r in records})
    return "; ".join(seen) if seen else "none"
