"""enginekit verify: the parity gate against the PyTorch reference (CI gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (BgrOpt, ClassesOpt, DynamicOpt, MeanOpt, OutputsOpt, ResizeOpt, SizeOpt, StdOpt, TaskOpt,
                                  declared_of, NmsOpt, failure_summary, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt,
                                  SeedOpt, TrustOpt, WeightsOpt,
                                  handles_errors, quiet_third_party)


def register(app: typer.Typer) -> None:
    @app.command("verify")
    @handles_errors
    def verify_cmd(
        target: Annotated[Optional[str], typer.Argument(help="Nothing (every cached engine), a cache key, a model name, or an ONNX file.")] = None,
        precision: Annotated[Optional[str], typer.Option("--precision", help="With a model name: fp32, fp16, int8 or fp8, or a list (fp16,int8): one engine each.")] = None,
        profile: Annotated[Optional[list[str]], typer.Option("--profile", "-p", help="With a model name: the engine's profiles.")] = None,
        images: Annotated[Optional[Path], typer.Option("--images", help="Folder of photographs (default: embedded).")] = None,
        image_count: Annotated[Optional[int], typer.Option("--image-count", help="Photographs the gates run on (default 4; with --data and no --images, 16 of the labelled split, spread evenly).")] = None,
        data: Annotated[Optional[Path], typer.Option("--data", help="Labels: an Ultralytics dataset YAML (its val split) or a folder of images with YOLO labels (semantic models: or class-index mask PNGs in masks/<split>/); the FP32 PyTorch model and every graph (and the engine where it runs) are scored against them (Ultralytics' validator metrics; mIoU for semantic models), and each drop against the FP32 model is gated (--tol gt.map50_95_drop=0.01, gt.miou_drop=0.01).")] = None,
        data_limit: Annotated[Optional[int], typer.Option("--data-limit", help="With --data: score this many images of the split, spread evenly (default: all).")] = None,
        data_split: Annotated[Optional[str], typer.Option("--data-split", help="With --data: the dataset's split to score (val, test, train; default val).")] = None,
        report: Annotated[Optional[Path], typer.Option("--report", help="Folder for report.json, summary.md, junit.xml and PNGs.")] = None,
        junit: Annotated[Optional[Path], typer.Option("--junit", help="JUnit XML path (one test case per artifact x check).")] = None,
        tol: Annotated[Optional[list[str]], typer.Option("--tol", help="Override a tolerance: rel_l2=1e-3, fp16.map50=0.9 (repeatable).")] = None,
        reference: Annotated[Optional[Path], typer.Option("--reference", help="With an ONNX file: its PyTorch checkpoint.")] = None,
        model: Annotated[Optional[str], typer.Option("--model", help="With an ONNX file that does not name its model (or a hand-exported one: torchvision:NAME, file.py:factory...).")] = None,
        require_engine: Annotated[bool, typer.Option("--require-engine", help="Fail (exit 3) if the engine cannot run here (GPU CI).")] = False,
        task_required: Annotated[bool, typer.Option("--task-required/--task-optional", help="--task-optional: where the reference has nothing to compare (random-weight detectors find nothing on the photographs, and an output part that is the same for every input cannot fail its parity), say so instead of failing.")] = True,
        allow_unverifiable: Annotated[bool, typer.Option("--allow-unverifiable", help="No target (every cached engine): list an engine built from an ONNX file, with no PyTorch model to compare against, as not checked instead of failing.")] = False,
        backend: Annotated[str, typer.Option("--backend", help="With a model name: as build's (auto, tensorrt, tensorrt-rtx).")] = "auto",
        target_cc: Annotated[Optional[str], typer.Option("--target-cc", help="With a model name: as build's.")] = None,
        workspace: Annotated[Optional[str], typer.Option("--workspace", help="With a model name: as build's.")] = None,
        opt_level: Annotated[Optional[int], typer.Option("--opt-level", help="With a model name: as build's.")] = None,
        calib_data: Annotated[Optional[Path], typer.Option("--calib-data", help="With a model name, INT8: as build's.")] = None,
        calib_count: Annotated[int, typer.Option("--calib-count", help="With a model name, INT8: as build's.")] = 8,
        calib_method: Annotated[Optional[str], typer.Option("--calib-method", help="With a model name, INT8: as build's.")] = None,
        calib_cache: Annotated[Optional[Path], typer.Option("--calib-cache", help="With a model name, INT8: as build's.")] = None,
        exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="With a model name, INT8: as build's (repeatable).")] = None,
        repair: Annotated[bool, typer.Option("--repair", help="With a model name: the engine build --repair made (its --tol too).")] = False,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        nms: NmsOpt = False,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        task: TaskOpt = None,
        outputs: OutputsOpt = None,
        size: SizeOpt = None,
        dynamic: DynamicOpt = None,
        mean: MeanOpt = None,
        std: StdOpt = None,
        resize: ResizeOpt = None,
        bgr: BgrOpt = False,
        classes: ClassesOpt = None,
    ) -> None:
        """Check engines and every ONNX artifact they came from against the PyTorch model.

        Per output: max/median/p99 abs and rel error, cosine, PSNR; per task: detections (precision,
        recall, mAP50 against the reference) or depth (AbsRel, delta<1.25). Exit 0 pass, 1 a gate
        failed, 2 bad input, 3 --require-engine and no engine could run.

        Examples:

          enginekit verify

          enginekit verify yolo12n --random-init --precision fp16

          enginekit verify KEY --images data/val --report out/ --junit out/verify.xml

          enginekit verify model.onnx --weights model.pt

          enginekit verify yolov8s --weights best.pt --data data.yaml --precision fp16,int8

        Every build flag that changes the engine is accepted, so `verify MODEL` with the flags of a
        `build` finds (or builds) that same engine.
        """
        from enginekit import api
        from enginekit.errors import ParityError, UsageError

        quiet_third_party()
        if target is not None and target.endswith((".yaml", ".yml")):  # a recipe: every cell in it
            from enginekit.cli.recipes import given_flags
            from enginekit.flows.recipes import verify_recipe

            flags = given_flags(locals())
            for key in ("report", "junit", "reference", "model", "allow_unverifiable"):
                flags.pop(key, None)
            outcomes = verify_recipe(target, flags, report_dir=report, junit=junit)
        else:
            from enginekit.requests import VerifyRequest, _target_kind

            kind = _target_kind(target, reference)
            ignored = [flag for flag, given in (
                ("--precision", precision is not None and kind in ("all", "key")),
                ("--profile", bool(profile) and kind != "model"),
                ("--backend", backend != "auto" and kind != "model"),
                ("--target-cc", target_cc is not None and kind != "model"),
                ("--workspace", workspace is not None and kind != "model"),
                ("--opt-level", opt_level is not None and kind != "model"),
                ("--calib-data", calib_data is not None and kind != "model"),
                ("--calib-count", calib_count != 8 and kind != "model"),
                ("--calib-method", calib_method is not None and kind != "model"),
                ("--calib-cache", calib_cache is not None and kind != "model"),
                ("--exclude", bool(exclude) and kind != "model"),
                ("--repair", repair and kind != "model"),
                ("--nms", nms and kind != "model"),
                ("--weights", weights is not None and kind in ("all", "key")),
                ("--random-init", random_init and kind in ("all", "key")),
                ("--seed", seed != 0 and kind in ("all", "key")),
            ) if given]
            if ignored:
                what = {"all": "every cached engine (no target)", "key": f"a cache entry ({target})",
                        "onnx": f"an ONNX file ({target})"}[kind]
                raise UsageError(f"{', '.join(ignored)} appl{'ies' if len(ignored) == 1 else 'y'} to verify of a model "
                                 f"name; {what} is checked as it was made: drop {'it' if len(ignored) == 1 else 'them'}")
            build_options = {"profiles": profile or [], "weights": weights, "random_init": random_init, "seed": seed,
                             "declared": declared_of(locals())}
            if kind == "model":
                build_options.update(backend=backend, target_cc=target_cc, workspace=workspace, opt_level=opt_level,
                                     calib_data=calib_data, calib_count=calib_count, calib_method=calib_method,
                                     calib_cache=calib_cache, exclude=exclude or [], repair=repair,
                                     tolerances=(tol or []) if repair else [], nms=nms)
            request = VerifyRequest(target=target, precision=precision, images=images, image_count=image_count,
                                    data=data, data_limit=data_limit, data_split=data_split,
                                    report_dir=report, junit=junit, tolerances=tol or [], reference=reference,
                                    model=model, require_engine=require_engine, task_required=task_required,
                                    allow_unverifiable=allow_unverifiable, build_options=build_options)
            outcomes = [api.verify(request)]
        for outcome in outcomes:
            _render(outcome)
        if not all(o.passed for o in outcomes):
            failed = [str(c) for o in outcomes for r in o.reports if not r.excused for c in r.failures()]
            if not failed:
                reasons = [a.reason for o in outcomes for r in o.reports for a in r.artifacts if a.reason]
                raise ParityError("no engine could be checked: " + "; ".join(dict.fromkeys(reasons))[:400])
            raise ParityError(f"{len(failed)} check(s) failed: {failure_summary(failed)}")


def _render(outcome) -> None:
    from enginekit.cli.render import verify_table
    from enginekit.cli.render import console

    for r in outcome.reports:
        verify_table(r)
        for note in dict.fromkeys(n for a in r.artifacts for n in a.notes):
            console.print(f"  [yellow]note:[/] {note}")
        if r.skipped_images:
            console.print(f"  [yellow]skipped images:[/] {'; '.join(r.skipped_images)}")
    if outcome.ladder:
        from enginekit.cli.render import ladder_table

        ladder_table(outcome)
    for kind, path in outcome.files.items():
        console.print(f"  {kind}: {path}")
