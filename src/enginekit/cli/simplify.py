"""enginekit simplify: any ONNX file, simplified and proven equal on ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import handles_errors, quiet_third_party


def register(app: typer.Typer) -> None:
    @app.command("simplify")
    @handles_errors
    def simplify_cmd(
        model: Annotated[Path, typer.Argument(help="ONNX file to simplify.")],
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Default: <model>.sim.onnx")] = None,
        tool: Annotated[str, typer.Option("--tool", help="onnxsim or onnxslim.")] = "onnxsim",
        input: Annotated[Optional[str], typer.Option("--input", "-i", help="Shape to check at, for graphs with symbolic H/W.")] = None,
    ) -> None:
        """Simplify an ONNX graph and check both compute the same (random inputs, two shapes).

        Example: [bold]enginekit simplify model.onnx -o model.sim.onnx[/]
        """
        from enginekit.stages.simplify import simplify_onnx
        from enginekit.shapes import format_shape, parse_shape
        from enginekit.cli.render import console, emit

        quiet_third_party()
        shapes = None
        if input is not None:
            s = parse_shape(input, what="--input")
            shapes = [(1, *s[1:]), (2, *s[1:])]
        dest = output or model.with_suffix(".sim.onnx")
        from enginekit.fsutil import check_output_path

        check_output_path(dest, "--output")
        from enginekit.flows.graphs import adapter_from_onnx

        adapter, _ = adapter_from_onnx(model) if model.is_file() else (None, None)
        report = simplify_onnx(model, dest, tool=tool, check_shapes=shapes,
                               align=adapter.parity_outputs if adapter is not None else None)
        console.print(
            f"  {report.tool}: {report.nodes_before} -> {report.nodes_after} nodes; equal at "
            f"{', '.join(format_shape(s) for s in report.checked_shapes)} (rel L2 {report.max_rel_l2:.1e})"
        )
        emit(str(dest))
