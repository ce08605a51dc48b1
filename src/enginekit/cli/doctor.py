"""enginekit doctor: versions, GPU, what can build and run here, cache, known bad combinations."""

from __future__ import annotations

from enginekit.fsutil import json_text
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    ) -> None:
        """Report this machine: versions, GPU, what builds and runs here, cache, known bad combinations.

        Versions of torch, onnx, onnxruntime, TensorRT and TensorRT-RTX; the GPU's name and compute
        capability; for each backend whether it can build and run here, and why; the cache's location
        and size. Always exits 0.

        Examples:

          enginekit doctor

          enginekit doctor --json > doctor.json
        """
        from enginekit.doctor import report

        try:
            data = report()
        except Exception as exc:  # noqa: BLE001 - a doctor reports, it does not fail
            data = {"error": f"{type(exc).__name__}: {exc}", "warnings": [f"doctor could not finish: {exc}"]}
        if as_json:
            typer.echo(json_text(data, indent=2))
            return
        _render(data)


def _render(data: dict) -> None:
    from rich import box
    from rich.table import Table

    from enginekit.cli.render import out

    if "error" in data:
        out.print(f"[yellow]warning:[/] {data['warnings'][0]}")
        return
    gpu = data["gpu"]
    out.print(f"enginekit {data['enginekit']}  python {data['python']}  {data['platform']}")
    others = data.get("gpus", [])[1:]
    out.print(f"GPU: {gpu['name']} (compute {gpu['compute_capability']})" if gpu else "GPU: none found")
    for other in others:
        out.print(f"     also {other['name']} (compute {other['compute_capability']})")
    versions = Table(title="packages", title_justify="left", box=box.SIMPLE_HEAD)
    versions.add_column("package")
    versions.add_column("version")
    for name, version in data["packages"].items():
        if version is not None:
            versions.add_row(name, version)
    out.print(versions)
    out.print(_backends_table(data["backends"]))
    cache = data["cache"]
    out.print(f"cache: {cache['root']}  {cache['entries']} entries, {cache['size_bytes'] / 2**20:.1f} MiB"
              + (f" (unusable: {cache['problem']})" if cache.get("problem") else
                 "" if cache["exists"] else " (not created yet)"))
    store = data.get("store") or {}
    if store.get("url"):
        state = "[green]answers[/]" if store.get("reachable") else "[red]not usable (see the warning)[/]"
        via = f" via {store['endpoint']}" if store.get("endpoint") else ""
        out.print(f"store: {store['url']}{via}  mode {store.get('mode') or '?'}  {state}")
    else:
        out.print("store: none (set ENGINEKIT_REMOTE=s3://BUCKET/PREFIX to share engines)")
    for line in data["warnings"]:
        out.print(f"[yellow]warning:[/] {line}")
    if not data["warnings"]:
        out.print("[green]no known bad combination found[/]")


def _backends_table(rows: list[dict]):
    from rich import box
    from rich.table import Table

    table = Table(title="backends", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("backend", "version", "build", "run", "why"):
        table.add_column(col, no_wrap=col != "why")
    for row in rows:
        build = "-" if row["can_build"] is None else _yes_no(row["can_build"])
        table.add_row(row["name"], row["version"] or "-", build, _yes_no(row["can_run"]), row["reason"])
    return table


def _yes_no(value: bool) -> str:
    return "[green]yes[/]" if value else "[red]no[/]"
