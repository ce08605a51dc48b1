"""Python API: the same verbs as the CLI, returning results instead of printing them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from enginekit.errors import UsageError


@dataclass
class ExportResult:
    model: str
    output: Path | None
    artifacts: list  # pipeline.Artifact, in pipeline order
    parity: list  # compare.parity.ParityResult, one per checked graph
    fp16_share: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.parity)

    def failures(self) -> list[str]:
        return [f"{r.artifact} ({r.precision}) {m}" for r in self.parity for m in r.failures()]

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "output": str(self.output) if self.output else None,
            "passed": self.passed,
            "fp16_initializer_share": self.fp16_share,
            "artifacts": [{"stage": a.stage, "sha256": a.sha256, "cache": a.status} for a in self.artifacts],
            "parity": [r.to_json() for r in self.parity],
        }


def export(
    model: str,
    *,
    input: str | None = None,
    fp16: bool = False,
    output: Path | None = None,
    weights: Path | None = None,
    random_init: bool = False,
    seed: int = 0,
    opset: int = 18,
    simplifier: str = "onnxsim",
    images: Path | None = None,
    rel_l2: float | None = None,
    force: bool = False,
    cache=None,
    quiet: bool = False,
) -> ExportResult:
    """Export ``model`` to simplified ONNX (and FP16), check parity, copy the result to ``output``.

    Nothing is written to ``output`` when the parity gate fails.
    """
    from dataclasses import replace

    from enginekit.calibration import CalibrationData
    from enginekit.images import load_images
    from enginekit.pipeline import ModelRequest, Pipeline, copy_out
    from enginekit.shapes import parse_shape
    from enginekit.ui import step
    from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs

    request = ModelRequest(model, Path(weights) if weights else None, random_init, seed)
    adapter = request.adapter
    shape = parse_shape(input, what="--input") if input else adapter.default_input
    adapter.constraint.check(shape, what="--input")
    if simplifier not in ("onnxsim", "onnxslim"):
        raise UsageError(f"unknown simplifier {simplifier!r}: choose onnxsim or onnxslim")
    photos = load_images(Path(images) if images else None, limit=4)

    pipe = Pipeline(request, cache, force=force, quiet=quiet)
    reference_data = CalibrationData(Path(images) if images else None, count=2)
    chain = pipe.onnx_chain(shape, opset=opset, fp16=fp16, simplifier=simplifier, reference_data=reference_data)
    simplified, final = chain[1], chain[-1]

    refs = ReferenceCache(adapter, pipe.loaded)
    cases = parity_inputs(adapter, shape, photos, seed=seed)
    results = []
    checks = [(simplified, "fp32")] + ([(final, "fp16")] if fp16 else [])
    for artifact, precision in checks:
        with step(f"parity {precision}", quiet=quiet) as s:
            tol = adapter.tolerance(precision)
            if rel_l2 is not None and artifact is final:
                tol = replace(tol, rel_l2=rel_l2)
            r = check_onnx(refs, artifact.path, cases, precision, tol)
            r.artifact = f"{adapter.variant}.{artifact.stage}"
            s.status = "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        results.append(r)

    share = None
    if fp16:
        share = final.entry.manifest.get("initializer_dtype_share", {}).get("FLOAT16", 0.0)
    result = ExportResult(adapter.variant, None, chain, results, share)
    if result.passed:
        suffix = ".fp16.onnx" if fp16 else ".onnx"
        dest = Path(output) if output else Path.cwd() / f"{adapter.variant}{suffix}"
        result.output = copy_out(final, dest)
    return result


PRECISIONS = ("fp32", "fp16", "int8", "fp8")


@dataclass
class BuildOutcome:
    engine: Path
    entry: object  # cache.Entry
    status: str
    artifacts: list
    explanations: list[tuple[str, str]] = field(default_factory=list)

    @property
    def manifest(self) -> dict:
        return self.entry.manifest


def build(
    target: str,
    *,
    profiles: list[str] | tuple[str, ...] = (),
    precision: str = "fp32",
    backend: str = "auto",
    target_cc: str | None = None,
    workspace: str | None = None,
    opt_level: int | None = None,
    calib_data: Path | None = None,
    calib_count: int = 8,
    calib_method: str = "entropy",
    calib_cache: Path | None = None,
    exclude: list[str] | tuple[str, ...] = (),
    weights: Path | None = None,
    random_init: bool = False,
    seed: int = 0,
    opset: int = 18,
    force: bool = False,
    explain: bool = False,
    verify: bool = True,
    repair: bool = False,
    tolerances: list[str] | tuple[str, ...] = (),
    cache=None,
    quiet: bool = False,
) -> BuildOutcome:
    """A model name or an ONNX file -> a cached engine (export, simplify, precision, build).

    Every flag is validated before any heavy work; a cache hit loads no model and no ONNX.
    """
    from enginekit.cache import Cache, parse_size
    from enginekit.calibration import CalibrationData
    from enginekit.pipeline import Artifact, ModelRequest, Pipeline
    from enginekit.shapes import parse_profile
    from enginekit.trt.backends import resolve_backend, resolve_targets
    from enginekit.trt.builder import BuildOptions

    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose {', '.join(PRECISIONS)}")
    parsed = [parse_profile(p) for p in profiles]
    be = resolve_backend(backend)
    options = BuildOptions(
        workspace_bytes=parse_size(workspace) if workspace else None,
        optimization_level=opt_level,
        target_cc=tuple(t.strip() for t in target_cc.split(",") if t.strip()) if target_cc else None,
    )
    from enginekit.trt.backends import gpu_info

    targets = resolve_targets(be, options.target_cc, gpu_info())  # refuse bad --target-cc before any work
    if precision == "fp8":
        from enginekit.trt.backends import fp8_unsupported

        lacking = fp8_unsupported(targets) if targets else ["this machine (no GPU)"]
        if lacking:
            raise UsageError(f"fp8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                             f"{', '.join(lacking)} lack it: build for --target-cc 8.9,12.0 (TensorRT-RTX)")
    is_file = target.endswith(".onnx") or Path(target).is_file()
    if repair and (is_file or precision not in ("fp16", "int8")):
        raise UsageError("--repair works on fp16 and int8 builds of a model name (it needs the PyTorch reference)")
    from enginekit.compare.gate import parse_overrides

    overrides = parse_overrides(list(tolerances))
    data = CalibrationData(Path(calib_data) if calib_data else None, count=calib_count)
    if precision in ("int8", "fp8") and not data.is_array and not (calib_cache and Path(calib_cache).is_file()):
        data.image_paths  # noqa: B018 - refuse a missing or empty image folder before any work
    cache = cache or Cache()

    if is_file:
        source_path = Path(target)
        adapter, subject = _adapter_from_onnx(source_path)
        pipe = Pipeline(None, cache, force=force, quiet=quiet, adapter=adapter, subject=subject)
        bound, opt_shape = _bind_profiles_to_onnx(parsed, source_path, adapter)
        chain = [Artifact.given(source_path)]
    else:
        request = ModelRequest(target, Path(weights) if weights else None, random_init, seed)
        adapter = request.adapter
        pipe = Pipeline(request, cache, force=force, quiet=quiet)
        bound, opt_shape, export_shape = _bind_profiles_to_model(parsed, adapter)
        if explain:
            _explain_stage(pipe, "onnx-export", pipe.export_parts(export_shape, opset))
        chain = [pipe.export(export_shape, opset)]
        chain.append(pipe.simplify(chain[-1], export_shape))

    recipe: dict = {"mode": precision}
    if precision == "fp16":
        chain.append(pipe.fp16(chain[-1], opt_shape, CalibrationData(None, count=2)))
    elif precision == "int8":
        chain.append(pipe.int8(chain[-1], opt_shape, data, method=calib_method, exclude=list(exclude),
                               calibration_cache=Path(calib_cache) if calib_cache else None))
        recipe.update({"method": calib_method, "exclude": chain[-1].manifest.get("exclude", []),
                       "calibration": chain[-1].manifest.get("calibration_source")})
    elif precision == "fp8":
        chain.append(pipe.fp8(chain[-1], opt_shape, data, exclude=list(exclude)))
        recipe.update({"method": "max", "exclude": chain[-1].manifest.get("exclude", []),
                       "calibration": chain[-1].manifest.get("calibration_source")})
    repair_record = None
    if repair:
        repaired, repair_record = _repair(pipe, chain, precision, opt_shape, overrides, data, calib_method,
                                          list(exclude), quiet)
        chain[-1] = repaired
        if precision == "int8":
            recipe["exclude"] = repaired.manifest.get("exclude", [])
    source = chain[-1]

    verify_fn = None
    if verify and not is_file:
        verify_fn = _engine_source_parity(pipe, precision, opt_shape)
    if explain:
        from enginekit.pipeline import engine_key_parts
        from enginekit.trt.backends import gpu_info

        gpu = gpu_info()
        parts = engine_key_parts(source.sha256, recipe, bound, be, resolve_targets(be, options.target_cc, gpu),
                                 gpu, options)
        _explain_stage(pipe, "engine", parts)
    if repair_record is not None:
        recipe["repaired_nodes"] = repair_record["nodes"]
    entry, status = pipe.engine(source, bound, be, options, recipe, verify_fn, chain,
                                extra={"repair": repair_record} if repair_record is not None else None)
    return BuildOutcome(entry.file("engine.plan"), entry, status, chain)


def _repair(pipe, chain, precision, shape, overrides, data, calib_method, exclude, quiet):
    """Make the reduced-precision graph pass its gate by moving as few nodes as needed.

    The nodes found are stored (kind "repair", keyed by source graph, precision and tolerance)
    so the next ``--repair`` build starts from them without searching again.
    """
    from enginekit.cache import key_for
    from enginekit.calibration import CalibrationData
    from enginekit.images import load_images
    from enginekit.ui import console, step
    from enginekit.compare import repair as rp
    from enginekit.compare.gate import Gates
    from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs

    source = chain[-2]
    tol = Gates(pipe.adapter, overrides).parity(precision)
    memory_parts = {"search": "reverse-topological/1", "source": source.sha256, "precision": precision,
                    "tolerance": tol.to_json(),
                    "method": calib_method if precision == "int8" else None, "exclude": sorted(exclude)}

    def try_nodes(nodes: list[str]):
        patterns = rp.exact_patterns(nodes)
        if precision == "fp16":
            return pipe.fp16(source, shape, CalibrationData(None, count=2), keep_fp32_nodes=patterns)
        return pipe.int8(source, shape, data, method=calib_method, exclude=exclude + patterns)

    refs = ReferenceCache(pipe.adapter, pipe.loaded)
    cases = parity_inputs(pipe.adapter, shape, load_images(None, limit=2))

    def check(artifact):
        result = check_onnx(refs, artifact.path, cases, precision, tol)
        worst = max(w["rel_l2"] for w in result.worst().values())
        return result.passed, worst

    memory = pipe.cache.lookup("repair", key_for(memory_parts))
    if memory.entry is not None:
        nodes = memory.entry.manifest["nodes"]
        console.print(f"  repair: starting from {len(nodes)} node(s) found earlier (entry {memory.entry.key[:10]})")
        artifact = try_nodes(nodes)
        ok, after = check(artifact)
        if ok:
            return artifact, {**memory.entry.manifest["result"], "reused": True}
    passed, worst = check(chain[-1])
    if passed:
        return chain[-1], {"nodes": [], "moved": 0, "rel_l2_before": worst, "rel_l2_after": worst, "trials": 1}
    names = rp.candidate_nodes(source.path, precision)
    with step(f"repair {precision}: rank {len(names)} nodes", quiet=quiet) as s:
        feed = {pipe.adapter.input_name: cases[0].array}
        ranking = rp.per_node_error(source.path, chain[-1].path, feed, names)
        s.detail = "with per-node error" if ranking else "without per-node error"
    with step(f"repair {precision}: search", quiet=quiet) as s:
        result = rp.repair(try_nodes, check, names, ranking)
        s.detail = f"{len(result.nodes)} node(s) moved in {result.trials} trials"
    console.print(f"  repair: rel L2 {result.before:.2e} -> {result.after:.2e} (limit {tol.rel_l2:.0e}) by keeping "
                  f"{len(result.nodes)} node(s) in {'FP32' if precision == 'fp16' else 'high precision'}: "
                  + ", ".join(result.nodes[:8]) + (" ..." if len(result.nodes) > 8 else ""))
    record = result.to_json()
    pipe.cache.get_or_create("repair", memory_parts, lambda tmp: {"nodes": result.nodes, "result": record},
                             subject=pipe.subject)
    return result.artifact, record


def _explain_stage(pipe, kind: str, parts: dict) -> None:
    from enginekit.ui import console

    console.print(f"  explain {kind}: {pipe.cache.explain(kind, parts, subject=pipe.subject)}")


def _adapter_from_onnx(path: Path):
    """The family adapter named in an enginekit-written ONNX's metadata, else None."""
    from enginekit.onnx.graph import get_metadata, load_model

    meta = get_metadata(load_model(path))
    name = meta.get("model")
    if name:
        from enginekit.families import resolve

        try:
            return resolve(name), name
        except UsageError:
            pass
    return None, path.stem


def _bind_profiles_to_onnx(parsed, path: Path, adapter):
    from enginekit.onnx.graph import input_dims, load_model
    from enginekit.shapes import check_against_onnx_input, parse_profile

    dims = input_dims(load_model(path))
    if not parsed:
        if any(not isinstance(d, int) for ds in dims.values() for d in ds):
            raise UsageError(f"{path.name} has dynamic inputs: give --profile min:opt:max (or NxCxHxW)")
        parsed = [parse_profile(",".join(f"{n}={'x'.join(map(str, d))}" for n, d in dims.items()))]
    bound = [p.bind(list(dims)) for p in parsed]
    for profile in bound:
        for name, rng in profile.inputs.items():
            check_against_onnx_input(name, rng, dims[name])
            if adapter is not None and name == adapter.input_name:
                adapter.constraint.check_range(rng, what="profile")
    first = bound[0].inputs[next(iter(bound[0].inputs))]
    return bound, first.opt


def _bind_profiles_to_model(parsed, adapter):
    """Profiles for a model name: defaults, family constraints, and the shape to export at."""
    from enginekit.shapes import InputRange, Profile

    if not parsed:
        s = adapter.default_input
        parsed = [Profile({None: InputRange(s, s, s)})]
    bound = [p.bind([adapter.input_name]) for p in parsed]
    ranges = [p.inputs[adapter.input_name] for p in bound]
    for rng in ranges:
        adapter.constraint.check_range(rng, what="profile")
    dynamic_hw = 2 in adapter.dynamic_axes.get(adapter.input_name, {})
    if dynamic_hw:
        export_shape = adapter.default_input
    else:
        sides = {s[2:] for r in ranges for s in (r.min, r.opt, r.max)}
        if len(sides) != 1:
            raise UsageError(
                f"{adapter.variant} exports with fixed H/W: every profile shape must share one H x W "
                f"(got {', '.join('x'.join(map(str, s)) for s in sorted(sides))})"
            )
        (hw,) = sides
        export_shape = (1, adapter.default_input[1], *hw)
    return bound, ranges[0].opt, export_shape


def _engine_source_parity(pipe, precision: str, shape):
    """Parity of the graph an engine is built from, against PyTorch, for its manifest."""

    def check(onnx_path: Path) -> dict:
        from enginekit.images import load_images
        from enginekit.ui import step
        from enginekit.compare.parity import ReferenceCache, check_onnx, parity_inputs

        with step(f"parity {precision} (ONNX Runtime)", quiet=pipe.quiet) as s:
            refs = ReferenceCache(pipe.adapter, pipe.loaded)
            cases = parity_inputs(pipe.adapter, shape, load_images(None, limit=2))
            try:
                result = check_onnx(refs, onnx_path, cases, precision)
            except Exception as exc:  # noqa: BLE001 - ORT refuses some graphs (FP8 Q/DQ around Transpose)
                reason = f"ONNX Runtime cannot run this graph: {str(exc).splitlines()[0][:200]}"
                s.status = "[yellow]not checked[/]"
                return {"checked": False, "candidate": "onnxruntime-cpu", "passed": None, "reason": reason}
            s.status = "[green]pass[/]" if result.passed else "[red]FAIL[/]"
        summary = {name: {k: round(v, 8) for k, v in w.items()} for name, w in result.worst().items()}
        return {"checked": True, "candidate": "onnxruntime-cpu", "passed": result.passed,
                "failures": result.failures(), "summary": summary, "report": result.to_json()}

    return check


@dataclass
class VerifyOutcome:
    reports: list  # compare.gate.VerifyReport
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.reports) and all(r.passed for r in self.reports)

    @property
    def engine_ran(self) -> bool:
        return all(r.engine_ran for r in self.reports)


def verify(
    target: str | None = None,
    *,
    precision: str | None = None,
    images: Path | None = None,
    image_count: int = 4,
    report_dir: Path | None = None,
    junit: Path | None = None,
    tolerances: list[str] | tuple[str, ...] = (),
    reference: Path | None = None,
    model: str | None = None,
    require_engine: bool = False,
    build_options: dict | None = None,
    cache=None,
    quiet: bool = False,
) -> VerifyOutcome:
    """Check engines and their ONNX artifacts against the PyTorch reference.

    ``target``: None (every engine in the cache), a cache key (prefix), a model name (built or
    found with ``build_options``), or an ONNX file with ``reference`` (its PyTorch checkpoint).
    """
    from enginekit.cache import Cache
    from enginekit.calibration import CalibrationData
    from enginekit.compare.gate import parse_overrides

    cache = cache or Cache()
    overrides = parse_overrides(list(tolerances))
    data = CalibrationData(Path(images) if images else None, count=image_count)
    data.image_paths  # noqa: B018 - refuse a missing or empty folder before any work

    if target is not None and (target.endswith(".onnx") or reference is not None):
        reports = [_verify_onnx_file(Path(target), reference, model, data, overrides, cache, quiet)]
    else:
        entries = _entries_to_verify(target, precision, build_options or {}, cache, quiet)
        reports = [_verify_entry(e, data, overrides, cache, quiet, report_dir) for e in entries]
    outcome = VerifyOutcome(reports)
    _write_reports(outcome, report_dir, junit)
    if require_engine and not outcome.engine_ran:
        from enginekit.errors import CapabilityError

        reasons = {a.reason for r in reports for a in r.artifacts if a.kind == "engine" and not a.ran}
        raise CapabilityError("--require-engine: the engine could not run here: " + "; ".join(sorted(reasons)))
    return outcome


def _entries_to_verify(target, precision, build_options, cache, quiet) -> list:
    import re

    if target is None:
        entries = [cache.lookup(i.kind, i.key).entry for i in cache.ls() if i.kind == "engine" and i.valid]
        entries = [e for e in entries if e is not None and e.manifest.get("model_request")]
        if not entries:
            raise UsageError("no engines in the cache to verify: build one first (enginekit build MODEL)")
        return entries
    if re.fullmatch(r"[0-9a-f]{6,64}", target):
        entry = cache.resolve(target)
        if entry.kind != "engine":
            raise UsageError(f"cache entry {target} is a {entry.kind}, not an engine")
        return [entry]
    outcome = build(target, precision=precision or "fp32", cache=cache, quiet=quiet, **build_options)
    return [outcome.entry]


def _verify_entry(entry, data, overrides, cache, quiet, report_dir):
    from enginekit.pipeline import ModelRequest, Pipeline
    from enginekit.compare.gate import (STAGE_PRECISION, Gates, VerifyReport, check_candidate, onnx_runner, skipped,
                                       unrunnable)
    from enginekit.verification.references import get_references

    m = entry.manifest
    if not m.get("model_request"):
        raise UsageError(f"engine {entry.key[:12]} was built from an ONNX file with no PyTorch model to compare "
                         "against: verify that file with --reference CHECKPOINT")
    request = ModelRequest.from_json(m["model_request"])
    pipe = Pipeline(request, cache, quiet=quiet)
    precision = m["precision"]["mode"]
    refs = get_references(pipe, m["profiles"], data)
    gates = Gates(pipe.adapter, overrides)
    report = VerifyReport(pipe.subject, entry.key, precision, refs.key, refs.status, skipped_images=refs.skipped_images)
    metadata: dict[str, str] = {}
    for link in m.get("chain", []):
        name = f"onnx-{link['stage']}"
        found = cache.lookup(link["kind"], link["key"]) if "kind" in link else None
        stage_precision = STAGE_PRECISION.get(link["stage"]) or precision
        if found is None or found.entry is None:
            report.artifacts.append(skipped(name, "onnx", stage_precision, "not in the cache any more (removed by gc?)"))
            continue
        path = found.entry.file("model.onnx")
        if not metadata:
            metadata = _onnx_metadata(path)
        with _step(f"verify {name}", quiet) as s:
            try:
                art = check_candidate(name, "onnx", stage_precision, onnx_runner(path), refs, gates, pipe.adapter,
                                      metadata)
            except Exception as exc:  # noqa: BLE001 - ORT refuses FP8 Q/DQ graphs: say so, and fail
                art = unrunnable(name, "onnx", stage_precision,
                                 f"ONNX Runtime cannot run it ({str(exc).splitlines()[0][:160]})")
            s.status = "[green]pass[/]" if art.passed else "[red]FAIL[/]"
        report.artifacts.append(art)
    report.artifacts.append(_verify_engine(entry, pipe, refs, gates, metadata, precision, quiet))
    if report_dir is not None:
        _pictures(report, refs, entry, cache, pipe.adapter, metadata, Path(report_dir))
    return report


def _verify_engine(entry, pipe, refs, gates, metadata, precision, quiet):
    from enginekit.trt.backends import resolve_backend
    from enginekit.trt.builder import can_run_here
    from enginekit.compare.gate import check_candidate, skipped

    m = entry.manifest
    family = "tensorrt-rtx" if m["backend"] == "tensorrt-rtx" else "tensorrt"
    try:
        backend = resolve_backend(family)
    except Exception:  # noqa: BLE001 - not installed: can_run_here says so
        backend = None
    ok, reason = can_run_here(backend, m)
    if not ok:
        return skipped("engine", "engine", precision, f"{reason}; its source graph was checked instead")
    from enginekit.trt.runner import engine_runner

    with engine_runner(entry.file("engine.plan"), backend, m["profiles"], pipe.adapter.input_name) as run:
        with _step("verify engine", quiet) as s:
            art = check_candidate("engine", "engine", precision, run, refs, gates, pipe.adapter, metadata)
            s.status = "[green]pass[/]" if art.passed else "[red]FAIL[/]"
    return art


def _verify_onnx_file(path, reference, model, data, overrides, cache, quiet):
    """Any ONNX against its PyTorch checkpoint (enginekit-written ONNX names its family)."""
    from enginekit.onnx.graph import input_dims, load_model, output_names
    from enginekit.pipeline import ModelRequest, Pipeline
    from enginekit.compare.gate import Gates, VerifyReport, check_candidate, onnx_runner
    from enginekit.verification.references import get_references

    if reference is None:
        raise UsageError("verify of an ONNX file needs --reference CHECKPOINT (its PyTorch weights)")
    onnx_model = load_model(path)
    metadata = _onnx_metadata(path)
    name = model or metadata.get("model")
    if not name:
        raise UsageError(f"{path.name} does not say which model it is: pass --model NAME (yolo12n, depth, ...)")
    request = ModelRequest(name, Path(reference), False, 0)
    adapter = request.adapter
    dims = input_dims(onnx_model)
    outs = output_names(onnx_model)
    if list(dims) != [adapter.input_name] or list(outs) != list(adapter.output_names):
        raise UsageError(
            f"{path.name} (inputs {', '.join(dims)}; outputs {', '.join(outs)}) does not match {adapter.variant} "
            f"(input {adapter.input_name}; outputs {', '.join(adapter.output_names)})"
        )
    shape = [d if isinstance(d, int) and d > 0 else None for d in dims[adapter.input_name]]
    default = adapter.default_input
    opt = tuple(s if s is not None else default[i] for i, s in enumerate(shape))
    opt = (1, *opt[1:])
    profile = {adapter.input_name: {"min": list(opt), "opt": list(opt), "max": list(opt)}}
    pipe = Pipeline(request, cache, quiet=quiet)
    refs = get_references(pipe, [profile], data)
    precision = metadata.get("precision", "fp32")
    report = VerifyReport(adapter.variant, None, precision, refs.key, refs.status, skipped_images=refs.skipped_images)
    try:
        art = check_candidate(path.name, "onnx", precision, onnx_runner(path), refs, Gates(adapter, overrides),
                              adapter, metadata)
    except (KeyError, ValueError) as exc:
        raise UsageError(f"{path.name} does not compute {adapter.variant}'s outputs: {exc}") from None
    report.artifacts.append(art)
    return report


def _onnx_metadata(path: Path) -> dict[str, str]:
    import onnx

    from enginekit.onnx.graph import get_metadata

    return get_metadata(onnx.load(str(path), load_external_data=False))


def _step(label: str, quiet: bool):
    from enginekit.ui import step

    return step(label, quiet=quiet)


def _pictures(report, refs, entry, cache, adapter, metadata, folder: Path) -> None:
    """One picture per checked artifact on the first photograph."""
    from enginekit.compare.gate import onnx_runner
    from enginekit.verification.pictures import depth_error_heatmap, detection_overlay

    photo = next((c for c in refs.cases if c.kind == "photo"), None)
    if photo is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    by_name = {f"onnx-{link['stage']}": link for link in entry.manifest.get("chain", []) if "kind" in link}
    for art in report.artifacts:
        if not art.ran or art.kind != "onnx" or art.name not in by_name:
            continue
        link = by_name[art.name]
        got = onnx_runner(cache.lookup(link["kind"], link["key"]).entry.file("model.onnx"))(photo.feed)
        stem = f"{report.subject}-{report.precision}-{art.name}"
        if adapter.family == "yolo":
            path = detection_overlay(photo.feed[adapter.input_name][0], photo.outputs["output0"], got["output0"],
                                     folder / f"{stem}-detections.png", end2end=metadata.get("end2end") == "True")
        else:
            path = depth_error_heatmap(photo.outputs["depth"], got["depth"], folder / f"{stem}-depth-error.png")
        art.pictures.append(str(path))


def _write_reports(outcome: VerifyOutcome, report_dir: Path | None, junit: Path | None) -> None:
    from enginekit.verification.report import write_json, write_junit, write_markdown

    if report_dir is not None:
        folder = Path(report_dir)
        outcome.files["json"] = write_json(outcome.reports, folder / "report.json")
        outcome.files["markdown"] = write_markdown(outcome.reports, folder / "summary.md")
        outcome.files["junit"] = write_junit(outcome.reports, Path(junit) if junit else folder / "junit.xml")
    elif junit is not None:
        outcome.files["junit"] = write_junit(outcome.reports, Path(junit))
