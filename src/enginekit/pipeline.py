"""The pipeline's stages as cached functions from files to a file.

    model + weights --export--> ONNX fp32 --simplify--> ONNX --fp16 / int8--> ONNX --build--> plan

Each stage's result is a cache entry keyed by everything that determines it (never a path or
a time), so a second run with the same inputs does no work and loads no model: the keys of the
first stages need only names, hashes and versions.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from pathlib import Path

import numpy as np

from enginekit._version import __version__
from enginekit.calibration import CalibrationData
from enginekit.cache import Cache, Entry
from enginekit.hashing import key_for, sha256_file
from enginekit.errors import UsageError
from enginekit.fsutil import json_text
from enginekit.families import ModelAdapter
from enginekit.families.types import LoadedModel
from enginekit.model import ModelRequest
from enginekit.shapes import Shape, format_shape
from enginekit import reporting
from enginekit.compare.repair import strip_qdq
from enginekit.fsutil import atomic_copy
from enginekit.onnx.graph import holds_fp16, input_dims, is_toposorted, load_model, save_model, upcast_fp16
from enginekit.stages.export import export_onnx
from enginekit.stages.fp16 import convert_fp16
from enginekit.stages.fp8 import quantize_fp8
from enginekit.stages.int8 import CALIBRATION_METHODS, quantize_int8
from enginekit.stages.int8_layout import LAYOUT_FILE
from enginekit.stages.simplify import simplify_onnx
from enginekit.trt.builder import build_engine
from enginekit.trt.flavours import gpu_info, resolve_targets
from enginekit.trt.timing import kept_timing_cache

ONNX_FILE = "model.onnx"
CALIB_FILE = "calibration.cache"
PLAN_FILE = "engine.plan"


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def model_versions(adapter) -> dict[str, str]:
    """Versions of the code that builds a family's PyTorch model (and so its outputs)."""
    return {"enginekit": __version__, "torch": package_version("torch"),
            adapter.framework: package_version(adapter.framework)}


def onnxruntime_version() -> str:
    """ONNX Runtime runs ModelOpt's calibration and AutoCast's reference: its version shapes their graphs."""
    gpu = package_version("onnxruntime-gpu")
    return gpu if gpu != "absent" else package_version("onnxruntime")


def quantizer_versions() -> dict[str, str]:
    return {"nvidia-modelopt": package_version("nvidia-modelopt"), "onnxruntime": onnxruntime_version()}


class CacheLayouts:
    """Q/DQ layouts of INT8 graphs (``stages.int8.LayoutStore``) kept in the cache, kind ``int8-layout``:
    the next INT8 graph of the same FP32 graph and settings from another calibration cache (or after the
    INT8 entry went) is rebuilt from it without ModelOpt."""

    KIND = "int8-layout"

    def __init__(self, cache: Cache, subject: str | None = None) -> None:
        self.cache, self.subject = cache, subject

    def find(self, parts: dict) -> tuple[Path, dict] | None:
        found = self.cache.lookup(self.KIND, key_for(parts))
        return (found.entry.file(LAYOUT_FILE), found.entry.manifest) if found.entry is not None else None

    def keep(self, parts: dict, write) -> None:
        self.cache.get_or_create(self.KIND, parts, write, subject=self.subject)


@dataclass
class Artifact:
    """A stage's output: the file inside its cache entry (or a user's file), and how it was obtained."""

    stage: str
    entry: Entry | None
    status: str  # hit | miss | corrupt | forced | given
    external: Path | None = None

    @classmethod
    def given(cls, path: Path) -> "Artifact":
        """A user's ONNX file entering the pipeline as is."""
        if not path.is_file():
            raise UsageError(f"ONNX file not found: {path}")
        return cls("input", None, "given", path)

    @property
    def path(self) -> Path:
        return self.external if self.external is not None else self.entry.file(ONNX_FILE)

    @cached_property
    def sha256(self) -> str:
        if self.entry is None:
            return sha256_file(self.path)
        return self.entry.manifest["files"][ONNX_FILE]["sha256"]

    @property
    def manifest(self) -> dict:
        return self.entry.manifest if self.entry is not None else {}

    def to_json(self) -> dict:
        if self.entry is None:
            return {"stage": self.stage, "path": str(self.path), "sha256": self.sha256}
        return {"stage": self.stage, "kind": self.entry.kind, "key": self.entry.key, "sha256": self.sha256}


def repair_record_problem(manifest: dict) -> str | None:
    """Why a stored repair record is not what a repair search writes (``Stages.remember_repair``): its nodes a list of
    node names, its result a dict that lists the same nodes, counts as counts; None where it is."""
    nodes, result = manifest.get("nodes"), manifest.get("result")
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        return f"nodes is {type(nodes).__name__}, not a list of node names"
    if not isinstance(result, dict):
        return f"result is {type(result).__name__}, not a record"
    if "nodes" in result and result["nodes"] != nodes:
        return f"its result's nodes ({str(result.get('nodes'))[:40]}) are not its nodes"
    for name in ("trials", "candidates", "moved"):
        value = result.get(name)
        if name in result and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            return f"result.{name} is {value!r}, not a count"
    if not isinstance(result.get("judged_on", ""), str):
        return "result.judged_on is not a description"
    return None


class Stages:
    """Runs the stages for one model request, loading the model only when a stage misses.

    ``request`` may be None for a user's ONNX file: then only the precision and engine stages
    run, with ``adapter`` (from the file's metadata, when enginekit wrote it) or none.
    """

    def __init__(self, request: ModelRequest | None, cache: Cache | None = None, *, force: bool = False,
                 quiet: bool = False, adapter: ModelAdapter | None = None, subject: str | None = None):
        self.request = request
        self.adapter = request.adapter if request is not None else adapter
        self.subject = request.subject if request is not None else subject
        self.cache = cache or Cache()
        self.force = force
        self.quiet = quiet  # kept for callers; what is shown is the current reporter's business

    @cached_property
    def loaded(self) -> LoadedModel:
        with reporting.stage(f"load {Path(str(self.request.name)).name}") as s:
            model = self.adapter.load(self.request.weights, random_init=self.request.random_init,
                                      seed=self.request.seed)
            s.detail = model.weights.identity[:40]
        return model

    # -- stages --------------------------------------------------------------------------
    def stage(self, stage: str, parts: dict, produce, label: str) -> Artifact:
        """One cached stage: ``produce(tmp)`` writes ``tmp/model.onnx`` (and returns manifest fields) on a
        miss; the entry is keyed by ``parts`` under kind ``onnx-<stage>``."""
        with reporting.stage(label) as s:
            entry, status = self.cache.get_or_create(f"onnx-{stage}", parts, timed(produce), force=self.force,
                                                     subject=self.subject)
            s.status = status
        return Artifact(stage, entry, status)

    def given(self, path: Path, *, widen: bool = False) -> Artifact:
        """A user's ONNX file entering the pipeline: as it is, or a cache entry keyed by the file's content that
        TensorRT and ModelOpt take: where its nodes are out of order (Ultralytics' CPU FP16 export appends its input
        casts after their readers: ONNX Runtime runs it, the others want the nodes in order), sorted; with ``widen``
        (a graph to quantize) where it computes in FP16 (``half=True``), in FP32 again (``onnx.graph.upcast_fp16``)."""
        import onnx

        artifact = Artifact.given(path)
        graph = onnx.load(str(path), load_external_data=False).graph
        sort, wide = not is_toposorted(graph), widen and holds_fp16(graph)
        if not sort and not wide:
            return artifact

        def produce(tmp: Path) -> dict:
            model = load_model(path)  # sorts what the checker finds out of order
            if wide:
                upcast_fp16(model)
            save_model(model, tmp / ONNX_FILE)
            return {"sorted": sort, "widened": wide}

        what = " and ".join(w for w, on in (("sort its nodes", sort), ("FP16 to FP32", wide)) if on)
        return self.stage("given", {"stage": "given", "input": artifact.sha256, "sort": sort, "widen": wide}, produce,
                          f"{path.name}: {what}")

    def export_parts(self, shape: Shape, opset: int) -> dict:
        parts = {
            "stage": "export",
            "model": self.adapter.key_model(self.request.weights is not None and not self.request.random_init),
            "weights": self.request.weights_identity,
            "shape": format_shape(self.adapter.trace_shape(shape)),
            "opset": opset,
            "versions": model_versions(self.adapter),
        }
        identity = self.adapter.identity()  # a user module's source, declared outputs and preprocessing
        if identity:
            parts["identity"] = identity
        if parts["model"] != self.adapter.variant:
            # the content keys a checkpoint's stages; what its graph records of how it was asked for (the name it is
            # called by, whether known from the file alone) is part of the graph's bytes, so of its key too: the
            # graph of `export best.pt` and that of `export yolov8n -w best.pt` differ in their metadata
            parts["recorded"] = {"name": self.adapter.variant,
                                 "from_file": getattr(self.adapter, "facts", None) is not None}
        if self.adapter.nms is not None:  # a graph ending in NMS is another graph (absent: the keys of before)
            parts["nms"] = self.adapter.nms.to_json()
        # which axes stay symbolic: a YOLO graph takes any H x W since export keys held them (batch only before)
        parts["dynamic_axes"] = {name: sorted(axes) for name, axes in self.adapter.dynamic_axes.items()}
        return parts

    def export(self, shape: Shape, opset: int) -> Artifact:
        self.adapter.constraint.check(shape, what="--input")

        def produce(tmp: Path) -> dict:
            export_onnx(self.adapter, self.loaded, self.adapter.trace_shape(shape), tmp / ONNX_FILE, opset=opset)
            return {"weights": self.loaded.weights.identity}

        return self.stage("export", self.export_parts(shape, opset), produce, "export")

    def simplify(self, source: Artifact, shape: Shape, tool: str = "onnxsim") -> Artifact:
        shapes = self.check_shapes(self.adapter.trace_shape(shape) if self.adapter else shape)
        parts = {"stage": "simplify", "input": source.sha256, "tool": tool, "tool_version": package_version(tool),
                 "checked": [format_shape(s) for s in shapes]}

        def produce(tmp: Path) -> dict:
            report = simplify_onnx(source.path, tmp / ONNX_FILE, tool=tool, check_shapes=shapes,
                                   align=self.adapter.parity_outputs if self.adapter else None,
                                   own_export=self.adapter is not None and source.stage == "export")
            return {"nodes_before": report.nodes_before, "nodes_after": report.nodes_after,
                    "max_rel_l2": report.max_rel_l2}

        return self.stage("simplify", parts, produce, f"simplify ({tool})")

    def fp16(self, source: Artifact, shape: Shape, data: CalibrationData | None = None,
             keep_fp32_nodes: list[str] | None = None) -> Artifact:
        """AutoCast to FP16; its reference run sees real photographs at ``shape``."""
        data = data or CalibrationData(None, count=2)
        family_keep = self.adapter.fp16_keep_fp32 if self.adapter else ()
        keep = sorted(set(family_keep) | set(keep_fp32_nodes or []))
        # A graph of no known family gets AutoCast's own random reference inputs (static shapes only).
        reference = data.digest(self.adapter, shape) if self.adapter else None
        parts = {"stage": "fp16", "input": source.sha256, "versions": quantizer_versions(),
                 "keep_fp32": keep, "reference_data": reference}

        def produce(tmp: Path) -> dict:
            calib = None
            if self.adapter is not None:
                calib = tmp / "autocast_inputs.npz"
                np.savez(calib, **{self.adapter.input_name: data.batch(self.adapter, shape)})
            share = convert_fp16(source.path, tmp / ONNX_FILE, keep_fp32_nodes=keep, calibration=calib)
            if calib is not None:
                calib.unlink()
            return {"initializer_dtype_share": share, "keep_fp32": keep}

        return self.stage("fp16", parts, produce, "fp16 (ModelOpt AutoCast)")

    def int8(self, source: Artifact, shape: Shape, data: CalibrationData, *, method: str,
             exclude: list[str] | None = None, calibration_cache: Path | None = None) -> Artifact:
        """Explicit Q/DQ INT8 through ModelOpt, calibrated at ``shape`` (the profile's opt).

        Calibration ranges are kept as a TensorRT-style calibration cache, itself a cache entry
        keyed by (ONNX, calibration set, method): a later INT8 build of the same graph and data
        (other excludes, say) quantizes from it without calibrating. ``calibration_cache`` is a
        user's file: read when it exists, else written after calibrating.
        """
        if method not in CALIBRATION_METHODS:
            raise UsageError(f"unknown calibration method {method!r}: choose {', '.join(CALIBRATION_METHODS)}")
        excludes = sorted(set(self.adapter.int8_exclude if self.adapter else ()) | set(exclude or []))
        user_cache = calibration_cache if calibration_cache is not None and calibration_cache.is_file() else None
        calibration = self._calibration_key(source, data, shape, method, user_cache)
        calib_parts = {"stage": "calibration", "input": source.sha256, "method": method, **calibration,
                       "versions": quantizer_versions()}
        parts = {"stage": "int8", "input": source.sha256, "method": method, "exclude": excludes,
                 "calibration": calibration, "versions": quantizer_versions()}
        input_name = self.adapter.input_name if self.adapter else None

        def produce(tmp: Path) -> dict:
            found = user_cache or self._calibration_entry(calib_parts)
            report = quantize_int8(
                source.path, tmp / ONNX_FILE,
                None if found is not None else self._calibration_batch(data, shape),
                input_name or _single_input(source.path),
                method=method, exclude_nodes=excludes, calibration_cache=found, input_shape=shape,
                write_cache=tmp / CALIB_FILE if found is None else None, layouts=CacheLayouts(self.cache, self.subject),
            )
            if found is None:
                self._store_calibration(calib_parts, tmp / CALIB_FILE)
            else:
                shutil.copyfile(found, tmp / CALIB_FILE)
            return {"calibrated": report.calibrated, "qdq_nodes": report.n_qdq_nodes, "exclude": excludes,
                    "method": method, "calibration_seconds": round(report.seconds, 3),
                    "calibration_data": "user cache" if "cache" in calibration else data.describe(),
                    "calibration_source": "user cache" if "cache" in calibration else (
                        "calibration cache" if found else data.describe()),
                    "qdq_layout": report.layout}

        artifact = self.stage("int8", parts, produce, f"int8 ({method})")
        if artifact.status not in ("hit", "pulled"):
            how = "calibrated" if artifact.manifest.get("calibrated") else "from calibration cache (no calibration)"
            if artifact.manifest.get("qdq_layout") == "kept":
                how += ", Q/DQ layout kept (no ModelOpt)"
            reporting.note(f"calibration: {how}; {artifact.manifest.get('qdq_nodes')} Q/DQ pairs", level=1)
        if calibration_cache is not None and user_cache is None:  # the user's file, also on a cache hit
            ranges = artifact.entry.file(CALIB_FILE)
            copy_file_atomic(ranges if ranges.is_file() else self._calibration_entry(calib_parts), calibration_cache)
        return artifact

    def _calibration_key(self, source: Artifact, data: CalibrationData, shape: Shape, method: str,
                         user_cache: Path | None) -> dict:
        """What INT8 is calibrated from, for the keys: the calibration data; or a user's calibration
        cache file, unless it holds exactly the ranges this data gave (the file an earlier run with
        ``--calib-cache`` wrote): then the same key as that run, so an identical build hits."""
        try:
            by_data = {"data": self._data_digest(data, shape)}
        except UsageError:
            if user_cache is None:
                raise
            return {"cache": sha256_file(user_cache)}
        if user_cache is None:
            return by_data
        parts = {"stage": "calibration", "input": source.sha256, "method": method, **by_data,
                 "versions": quantizer_versions()}
        known = self.cache.lookup("calibration", key_for(parts))
        user_sha = sha256_file(user_cache)
        if known.entry is not None and known.entry.manifest["files"].get(CALIB_FILE, {}).get("sha256") == user_sha:
            return by_data
        return {"cache": user_sha}

    def fp8(self, source: Artifact, shape: Shape, data: CalibrationData, *, exclude: list[str] | None = None) -> Artifact:
        """FP8 E4M3 Q/DQ through ModelOpt (max calibration at ``shape``), family excludes as INT8's."""
        excludes = sorted(set(self.adapter.int8_exclude if self.adapter else ()) | set(exclude or []))
        parts = {"stage": "fp8", "input": source.sha256, "method": "max", "exclude": excludes,
                 "calibration": {"data": self._data_digest(data, shape)}, "versions": quantizer_versions()}
        input_name = self.adapter.input_name if self.adapter else None

        def produce(tmp: Path) -> dict:
            n = quantize_fp8(source.path, tmp / ONNX_FILE, self._calibration_batch(data, shape),
                             input_name or _single_input(source.path), exclude_nodes=excludes)
            return {"qdq_nodes": n, "exclude": excludes, "method": "max", "calibration_source": data.describe(),
                    "calibration_data": data.describe()}

        return self.stage("fp8", parts, produce, "fp8 (ModelOpt Q/DQ, max)")

    # -- repair (flows/repair.py searches; these keep what it found) -----------------------
    def repaired(self, quantized: Artifact, source: Artifact, nodes: list[str], exclude: list[str]) -> Artifact:
        """The INT8 graph ``quantized`` with ``nodes`` back in FP32: the Q/DQ pairs around them removed
        (``compare.repair.strip_qdq``, weights from ``source``, the graph before quantization), the very
        graph a repair search checked. Kind ``onnx-int8-repair``, keyed by the INT8 graph and the nodes.
        (ModelOpt with the same nodes excluded makes another graph: it still quantizes their neighbours'
        inputs; measured on the trained detector, rel L2 0.054 against 0.046.)"""
        parts = {"stage": "int8-repair", "input": quantized.sha256, "nodes": sorted(nodes), "edit": "strip_qdq/1"}

        def produce(tmp: Path) -> dict:
            import onnx

            graph = strip_qdq(onnx.load(str(quantized.path)), onnx.load(str(source.path)), nodes)
            onnx.save(graph, str(tmp / ONNX_FILE))
            return {"exclude": list(quantized.manifest.get("exclude", exclude)), "repaired_nodes": sorted(nodes),
                    "method": quantized.manifest.get("method"),
                    "calibration_source": quantized.manifest.get("calibration_source")}

        return self.stage("int8-repair", parts, produce, f"int8 repair ({len(nodes)} node(s) back in FP32)")

    def recalled_repair(self, search: dict) -> Entry | None:
        """What an earlier repair search described by ``search`` found (kind ``repair``), if it passed. A stored
        record that does not parse as one (edited, written by another version) is corrupt: said in a warning and
        not used; the search runs again and its result replaces the record."""
        entry = self.cache.lookup("repair", key_for(search)).entry
        if entry is None:
            return None
        problem = repair_record_problem(entry.manifest)
        if problem is not None:
            reporting.warning(f"repair: the stored repair {entry.key[:10]} is corrupt ({problem}): not used, "
                              "measuring again")
            self._corrupt_repairs = {*getattr(self, "_corrupt_repairs", ()), entry.key}
            return None
        return entry

    def remember_repair(self, search: dict, nodes: list[str], record: dict) -> None:
        """Keep the nodes a passing repair search found, for the next search described alike (replacing a corrupt
        record of the same search)."""
        replace = key_for(search) in getattr(self, "_corrupt_repairs", ())
        self.cache.get_or_create("repair", search, lambda _tmp: {"nodes": nodes, "result": record},
                                 subject=self.subject, force=replace)

    def _data_digest(self, data: CalibrationData, shape: Shape) -> str:
        if self.adapter is None and not data.is_array:
            raise UsageError("this ONNX file names no model family enginekit knows: pass --calib-data as a .npy/.npz "
                             "of preprocessed inputs")
        return data.digest(self.adapter, shape) if self.adapter else sha256_file(data.source)

    def _calibration_batch(self, data: CalibrationData, shape: Shape) -> np.ndarray:
        with reporting.stage(f"calibration data {format_shape(shape[1:])}") as s:
            batch = data.batch(self.adapter, shape)
            s.detail = f"{batch.shape[0]} inputs" + (f", {len(data.skipped)} skipped" if data.skipped else "")
        found = len(data.used_paths) if not data.is_array else len(batch)
        if found < data.count:  # a folder of 2 when 8 were asked: say so (views of them may fill the count)
            views = batch.shape[0] - found
            reporting.warning(f"calibrating on {found} input(s) from {data.describe()}, fewer than the {data.count} "
                              f"asked for (--calib-count)" + (f"; {views} more made from them (flips, crops, mosaics)"
                                                             if views > 0 else ""))
        return batch

    def _calibration_entry(self, parts: dict) -> Path | None:
        found = self.cache.lookup("calibration", key_for(parts))
        return found.entry.file(CALIB_FILE) if found.entry is not None else None

    def _store_calibration(self, parts: dict, cache_file: Path) -> None:
        def produce(tmp: Path) -> dict:
            shutil.copyfile(cache_file, tmp / CALIB_FILE)
            return {}

        self.cache.get_or_create("calibration", parts, produce, subject=self.subject)

    def engine(self, source: Artifact, profiles: list, flavour, options, precision: dict,
               verify=None, chain: list[Artifact] | None = None, extra: dict | None = None) -> tuple[Entry, str]:
        """Build (or find) the engine of ``source``: cache entry with engine.plan, manifest, parity.json.

        ``verify(onnx_path) -> dict`` computes the parity summary of the exact graph the engine
        is built from; it runs only when the engine is built.
        """
        gpu = gpu_info()
        targets = resolve_targets(flavour, options.target_cc, gpu)
        parts = engine_key_parts(source.sha256, precision, profiles, flavour, targets, gpu, options)

        def produce(tmp: Path) -> dict:
            with reporting.stage(f"build ({flavour.label})") as s:
                # TensorRT 10/11: the timing cache kept for this GPU (an entry of its own), read and updated
                with kept_timing_cache(self.cache, flavour, gpu) as timing_cache:
                    result = build_engine(source.path, profiles, flavour, options, timing_cache=timing_cache)
                (tmp / PLAN_FILE).write_bytes(result.plan)
                s.detail = f"{len(result.plan) / 2**20:.1f} MiB for {', '.join(result.targets) or result.gpu}"
            parity = verify(source.path) if verify is not None else {"checked": False, "reason": "no reference model"}
            (tmp / "parity.json").write_text(json_text(parity, indent=2, sort_keys=True))  # strict JSON: NaN is null
            return {
                **result.to_json(),
                "source_onnx": {"sha256": source.sha256, "stage": source.stage},
                "precision": precision,
                "versions": {name: package_version(name) for name in
                             ("enginekit", "torch", "onnx", "onnxruntime-gpu", "nvidia-modelopt", "tensorrt", "tensorrt-rtx")},
                "parity": {"passed": parity.get("passed"), "summary": parity.get("summary")},
                # what verify needs to rebuild the reference and find every ONNX artifact
                "model_request": self.request.to_json() if self.request is not None else None,
                "chain": [a.to_json() for a in (chain or [source])],
                **(extra or {}),
            }

        with reporting.stage("engine") as s:
            entry, status = self.cache.get_or_create("engine", parts, timed(produce), force=self.force,
                                                     subject=self.subject)
            s.status = status
        return entry, status

    def find_engine(self, source: Artifact, profiles: list, flavour, options, precision: dict) -> Entry | None:
        """The cached engine ``engine`` would build or find for these arguments, or None: looked up, never built."""
        gpu = gpu_info()
        targets = resolve_targets(flavour, options.target_cc, gpu)
        parts = engine_key_parts(source.sha256, precision, profiles, flavour, targets, gpu, options)
        return self.cache.lookup("engine", key_for(parts)).entry

    def check_shapes(self, shape: Shape) -> list[Shape]:
        """Shapes a simplified graph is proven equal at: batch 1 and 2, and for dynamic H/W models the
        batch-2 run at a second, non-square size (two runs cover both batches and both sizes; a third
        cost deeplabv3_resnet50 a tenth of its simplify)."""
        n, c, h, w = shape
        if 2 in self.adapter.dynamic_axes.get(self.adapter.input_name, {}):
            m = self.adapter.constraint.spatial_multiple
            return [(1, c, h, w), (2, c, h + m, max(m, w - m))]
        return [(1, c, h, w), (2, c, h, w)]

    def onnx_chain(self, shape: Shape, *, opset: int, fp16: bool = False, simplifier: str = "onnxsim",
                   reference_data: CalibrationData | None = None) -> list[Artifact]:
        """export -> simplify (-> fp16): every artifact, last one the result."""
        chain = [self.export(shape, opset)]
        chain.append(self.simplify(chain[-1], shape, simplifier))
        if fp16:
            chain.append(self.fp16(chain[-1], shape, reference_data))
        return chain


def timed(produce):
    """Record how long a stage took in its manifest ("seconds"), for benchmarks and reports."""
    import time

    def run(tmp: Path) -> dict:
        start = time.perf_counter()
        extra = produce(tmp) or {}
        return {**extra, "seconds": round(time.perf_counter() - start, 3)}

    return run


def engine_key_parts(onnx_sha: str, precision: dict, profiles: list, flavour, targets, gpu, options) -> dict:
    """The engine cache key: everything that determines the plan (the README's "How it works")."""
    target = {"compute_capabilities": list(targets)} if flavour.traits.supports_compute_capability_targets else {
        "gpu": gpu.name if gpu else None, "compute_capability": gpu.compute_capability if gpu else None}
    return {
        "onnx": onnx_sha,
        "precision": precision,
        "profiles": [p.to_json() for p in profiles],
        "backend": {"name": flavour.name, "version": flavour.version},
        "target": target,
        "options": options.to_json(),
    }


def copy_file_atomic(src: Path, dest: Path) -> Path:
    """Copy with a temp file and a rename: a reader never sees half a file."""
    return atomic_copy(src, dest)


def copy_out(artifact: Artifact, dest: Path) -> Path:
    """Copy an artifact out of the cache atomically."""
    return copy_file_atomic(artifact.path, dest)


def _single_input(onnx_path: Path) -> str:
    names = list(input_dims(load_model(onnx_path)))
    if len(names) != 1:
        raise UsageError(f"INT8 calibration feeds one input; {onnx_path.name} has {len(names)}")
    return names[0]

