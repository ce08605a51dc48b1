"""enginekit verify: the parity gate against the PyTorch reference (CI gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (declares_a_model, ImagesOpt, RecheckOpt, PANEL_BUILD, PANEL_GATES, PANEL_IMAGES, PANEL_MODEL, PANEL_REPORTS, ImgszOpt, ProfileOpt, builds_an_engine, engine_request, ENGINE_OPTIONS,
                                  NmsOpt, failure_summary, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt,
                                  SeedOpt, TrustOpt, WeightsOpt,
                                  handles_errors, quiet_third_party)


def register(app: typer.Typer) -> None:
    @app.command("verify")
    @handles_errors
    @declares_a_model
    @builds_an_engine
    def verify_cmd(
        target: Annotated[Optional[str], typer.Argument(help="Nothing (every cached engine), a cache key, a model, an ONNX or engine file.", show_default=False)] = None,
        reference: Annotated[Optional[Path], typer.Option("--reference", rich_help_panel=PANEL_MODEL, help="ONNX/engine file: its PyTorch checkpoint.")] = None,
        model: Annotated[Optional[str], typer.Option("--model", rich_help_panel=PANEL_MODEL, help="ONNX file: the model it is, if it does not say.")] = None,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        nms: NmsOpt = False,
        profile: ProfileOpt = None,
        imgsz: ImgszOpt = None,
        precision: Annotated[Optional[str], typer.Option("--precision", rich_help_panel=PANEL_BUILD, help="fp32, fp16, int8, fp8 or a list (fp16,int8).")] = None,
        repair: Annotated[bool, typer.Option("--repair", rich_help_panel=PANEL_BUILD, help="The engine build --repair made.")] = False,
        images: ImagesOpt = None,
        image_count: Annotated[Optional[int], typer.Option("--image-count", rich_help_panel=PANEL_IMAGES, help="How many (default 4; 16 with --data).")] = None,
        data: Annotated[Optional[Path], typer.Option("--data", rich_help_panel=PANEL_IMAGES, help="Labels: dataset YAML or folder; mAP/mIoU, as yolo val.")] = None,
        data_limit: Annotated[Optional[int], typer.Option("--data-limit", rich_help_panel=PANEL_IMAGES, help="--data: score this many images (default all).")] = None,
        data_split: Annotated[Optional[str], typer.Option("--data-split", rich_help_panel=PANEL_IMAGES, help="--data: the split (default val).")] = None,
        tol: Annotated[Optional[list[str]], typer.Option("--tol", rich_help_panel=PANEL_GATES, help="A limit: rel_l2=1e-3, fp16.map50=0.9 (repeatable).")] = None,
        task_required: Annotated[bool, typer.Option("--task-required/--task-optional", rich_help_panel=PANEL_GATES, help="Optional: nothing to compare is said, not failed.")] = True,
        require_engine: Annotated[bool, typer.Option("--require-engine", rich_help_panel=PANEL_GATES, help="Fail (exit 3) if the engine cannot run here.")] = False,
        allow_unverifiable: Annotated[bool, typer.Option("--allow-unverifiable", rich_help_panel=PANEL_GATES, help="List engines with no model to check; pass.")] = False,
        recheck: RecheckOpt = False,
        report: Annotated[Optional[Path], typer.Option("--report", rich_help_panel=PANEL_REPORTS, help="Folder: report.json, summary.md, junit.xml, PNGs.")] = None,
        junit: Annotated[Optional[Path], typer.Option("--junit", rich_help_panel=PANEL_REPORTS, help="JUnit XML file (a test case per check).")] = None,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        engine: dict = {},
        declared: dict = None,
    ) -> None:
        """Check engines and the ONNX graphs they came from against the PyTorch model.

        Per output part: errors, cosine, PSNR; per task: detections, masks, keypoints or depth against the reference's; with --data: mAP or mIoU against labels, as yolo val. A build flag finds (or builds) the engine `build` would. Exit 0 pass, 1 a gate failed, 2 bad input, 3 a capability missing. docs/verify-ci.md says more.

        Examples:

          enginekit verify

          enginekit verify yolo12n --random-init --precision fp16

          enginekit verify best.pt --data data.yaml --precision fp16,int8

          enginekit verify model.onnx --reference best.pt --report out/
        """
        from enginekit import api
        from enginekit.errors import ParityError, UsageError

        quiet_third_party()
        if target is not None and target.endswith((".yaml", ".yml")):  # a recipe: every cell in it
            from enginekit.cli.recipes import given_flags
            from enginekit.flows.recipes import verify_recipe

            flags = given_flags({**locals(), **engine})
            for key in ("report", "junit", "reference", "model"):
                flags.pop(key, None)
            outcomes = verify_recipe(target, flags, report_dir=report, junit=junit)
        else:
            from enginekit.requests import VerifyRequest, _target_kind

            kind = _target_kind(target, reference)
            ignored = [flag for flag, given in (
                ("--precision", precision is not None and kind in ("all", "key")),
                ("--profile", bool(profile) and kind != "model"),
                ("--imgsz", imgsz is not None and kind != "model"),
                *((f"--{name.replace('_', '-')}", engine[name] not in (default, None, []) and kind != "model")
                  for name, _, default, _ in ENGINE_OPTIONS),
                ("--repair", repair and kind != "model"),
                ("--nms", nms and kind != "model"),
                ("--weights", weights is not None and kind in ("all", "key")),
                ("--random-init", random_init and kind in ("all", "key")),
                ("--seed", seed != 0 and kind in ("all", "key")),
            ) if given]
            if ignored:
                what = {"all": "every cached engine (no target)", "key": f"a cache entry ({target})",
                        "onnx": f"an ONNX file ({target})", "engine": f"an engine file ({target})"}[kind]
                raise UsageError(f"{', '.join(ignored)} appl{'ies' if len(ignored) == 1 else 'y'} to verify of a model "
                                 f"name; {what} is checked as it was made: drop {'it' if len(ignored) == 1 else 'them'}")
            build_options = {"profiles": profile or [], "imgsz": imgsz, "weights": weights, "random_init": random_init, "seed": seed,
                             "declared": declared}
            if kind == "model":
                build_options.update(**engine_request(engine), repair=repair, tolerances=(tol or []) if repair else [],
                                     nms=nms)
            request = VerifyRequest(target=target, precision=precision, images=images, image_count=image_count,
                                    data=data, data_limit=data_limit, data_split=data_split,
                                    report_dir=report, junit=junit, tolerances=tol or [], reference=reference,
                                    model=model, require_engine=require_engine, task_required=task_required,
                                    allow_unverifiable=allow_unverifiable, recheck=recheck, build_options=build_options)
            outcomes = [api.verify(request)]
        for outcome in outcomes:
            _render(outcome)
            excused = sum(1 for r in outcome.reports if r.excused)
            if excused and outcome.passed:
                from enginekit.cli.render import console

                console.print(f"{outcome.checked} engine(s) checked; {excused} listed as not checked "
                              "(built from an ONNX file, no PyTorch model to compare against: --allow-unverifiable)")
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
