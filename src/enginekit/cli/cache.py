"""enginekit cache: list, inspect, locate and clean cached artifacts and engines; push to and pull
from the team store."""

from __future__ import annotations

from enginekit.fsutil import json_text
from typing import Annotated, Optional

import typer

from enginekit.cli.common import RemoteOpt, RemoteReadOnlyOpt, handles_errors
from enginekit.errors import UsageError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]


def register(app: typer.Typer) -> None:
    cache_app = typer.Typer(help="Inspect and clean the local cache ($ENGINEKIT_CACHE, else ~/.cache/enginekit); "
                                 "push to and pull from the team store ($ENGINEKIT_REMOTE).",
                            no_args_is_help=True)
    app.add_typer(cache_app, name="cache")

    @cache_app.command("ls")
    @handles_errors
    def ls_cmd(
        kind: Annotated[Optional[str], typer.Option("--kind", help="Only this kind (engine, onnx-export, ...).")] = None,
        as_json: JsonOpt = False,
        verify: Annotated[bool, typer.Option("--verify", help="Check every file's sha256 (reads every byte; by default sizes only).")] = False,
        remote_list: Annotated[bool, typer.Option("--remote", help="List the team store's entries instead: --remote URL, or --remote alone for $ENGINEKIT_REMOTE.")] = False,
        url: Annotated[Optional[str], typer.Argument(metavar="[URL]", help="With --remote: the store (s3://BUCKET/PREFIX or file:///PATH).", show_default=False)] = None,
        store: Annotated[Optional[str], typer.Option("--store", hidden=True, help="Old spelling of --remote URL.")] = None,
    ) -> None:
        """List entries, most recently used first, with validity and parity. Listing is no use: it
        changes no entry's last-used time.

        Example: [bold]enginekit cache ls --kind engine[/]
        """
        store = _store_url(remote_list, url, store)
        if remote_list:
            if verify:
                raise UsageError("--verify checks the local entries' files; the store's are checked (sha256) when "
                                 "pulled: drop --verify, or `enginekit cache pull KEY`")
            return _ls_remote(kind, as_json, store)
        from enginekit.cache import Cache

        cache = Cache(remote=None)
        rows = [info for info in cache.ls(verify=verify) if not kind or info.kind == kind]
        if as_json:
            typer.echo(json_text({"root": str(cache.root),
                                   "entries": [{**info.to_json(), "parity_passed": info.parity} for info in rows]},
                                  indent=2))
            return
        from rich.table import Table

        from enginekit.cli.render import out

        table = Table(title=f"cache {cache.root}")
        for col in ("key", "kind", "subject", "size", "last used", "state", "parity"):
            table.add_column(col)
        for info in rows:
            shown = info.kind == "engine" or info.kind.startswith("onnx-")  # a graph: its verdicts, by its content
            parity = {True: "[green]pass[/]", False: "[red]fail[/]"}.get(info.parity, "-") if shown and info.valid else ""
            state = ("[green]valid[/]" if info.verified else "[green]complete[/]") if info.valid else f"[red]corrupt[/] ({info.reason})"
            table.add_row(info.key[:12], info.kind, info.subject or "", _size(info.size),
                          info.last_used.strftime("%Y-%m-%d %H:%M"), state, parity)
        out.print(table)

    @cache_app.command("show")
    @handles_errors
    def show_cmd(
        key: Annotated[str, typer.Argument(help="A key or a unique prefix (6+ characters).")],
        as_json: Annotated[bool, typer.Option("--json", help="Accepted for symmetry: the manifest is JSON either way.")] = False,
    ) -> None:
        """Print an entry's manifest (JSON)."""
        from enginekit.cache import Cache

        typer.echo(json_text(Cache(remote=None).resolve(key).manifest, indent=2, sort_keys=True))

    @cache_app.command("path")
    @handles_errors
    def path_cmd(key: Annotated[str, typer.Argument(help="A key or a unique prefix.")]) -> None:
        """Print the path of an entry's main file (engine.plan, model.onnx, ...)."""
        from enginekit.cache import Cache

        entry = Cache(remote=None).resolve(key)
        files = list(entry.manifest.get("files", {}))
        main = next((f for f in ("engine.plan", "model.onnx", "calibration.cache") if f in files), None)
        typer.echo(str(entry.file(main) if main else entry.path))

    @cache_app.command("gc")
    @handles_errors
    def gc_cmd(
        max_size: Annotated[Optional[str], typer.Option("--max-size", help="Keep the cache under this size, e.g. 20G.")] = None,
        max_age: Annotated[Optional[str], typer.Option("--max-age", help="Remove entries unused (in the store: published) for this long, e.g. 30d.")] = None,
        remote_gc: Annotated[bool, typer.Option("--remote", help="Clean the team store instead (--remote URL, or alone for $ENGINEKIT_REMOTE): entries by publication time, then the objects no entry names.")] = False,
        url: Annotated[Optional[str], typer.Argument(metavar="[URL]", help="With --remote: the store (s3://BUCKET/PREFIX or file:///PATH).", show_default=False)] = None,
        store: Annotated[Optional[str], typer.Option("--store", hidden=True, help="Old spelling of --remote URL.")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    ) -> None:
        """Remove least recently used entries; never one in use by a running build."""
        from enginekit.cache import Cache
        from enginekit.units import parse_age, parse_size
        from enginekit.cli.render import console

        # "" is a value given (and refused by the parsers), not an option left out
        size = parse_size(max_size) if max_size is not None else None
        age = parse_age(max_age) if max_age is not None else None
        store = _store_url(remote_gc, url, store)
        if remote_gc:
            return _gc_remote(size, age, dry_run, store)
        removed = Cache(remote=None).gc(size, age, dry_run=dry_run)
        console.print(f"{'would remove' if dry_run else 'removed'} {len(removed)} entries")

    @cache_app.command("purge")
    @handles_errors
    def purge_cmd() -> None:
        """Remove every entry (entries in use are kept)."""
        from enginekit.cache import Cache
        from enginekit.cli.render import console

        removed = Cache(remote=None).purge()
        console.print(f"removed {len(removed)} entries")

    @cache_app.command("push")
    @handles_errors
    def push_cmd(
        keys: Annotated[Optional[list[str]], typer.Argument(help="Keys or unique prefixes (an engine brings the entries it came from).")] = None,
        push_all: Annotated[bool, typer.Option("--all", help="Every complete entry of the local cache.")] = False,
        remote: RemoteOpt = None,
    ) -> None:
        """Publish local entries to the team store: files first (by sha256), the manifest last.
        Engines whose parity gate failed stay local.

        Example: [bold]ENGINEKIT_REMOTE=s3://team-engines/enginekit enginekit cache push --all[/]
        """
        from enginekit.cache import Cache
        from enginekit.cli.render import console
        from enginekit.flows.store import push

        if keys and push_all:
            raise UsageError("cache push: name entries or pass --all, not both")
        cache = Cache()
        result = push(cache, keys or [], everything=push_all)
        console.print(f"pushed {len(result['pushed'])} entries to {cache.remote.url} "
                      f"({len(result['present'])} already there"
                      + (f", {len(result['refused'])} failed engines kept local" if result["refused"] else "") + ")")

    @cache_app.command("pull")
    @handles_errors
    def pull_cmd(
        target: Annotated[str, typer.Argument(help="A key (6+ hex digits) in the store, or a recipe .yaml: the engines of every cell that serve this machine.")],
        remote: RemoteOpt = None,
    ) -> None:
        """Fetch entries from the team store into the local cache, every file checked against its sha256.
        Prints the path of each engine (or main file) pulled.

        A recipe resolves by identity: model, weights, precision and profiles, plus this machine's GPU (or
        target set) and TensorRT version; the builder's library versions may differ.

        Example: [bold]enginekit cache pull recipes/yolo12n.yaml[/]
        """
        from enginekit.cache import Cache
        from enginekit.cli.render import emit
        from enginekit.flows.store import pull_key, pull_recipe

        cache = Cache()
        if target.endswith((".yaml", ".yml")):
            entries = pull_recipe(cache, target)
        else:
            entries = pull_key(cache, target)[:1]
        for entry in entries:
            files = list(entry.manifest.get("files", {}))
            main = next((f for f in ("engine.plan", "model.onnx", "calibration.cache") if f in files), None)
            emit(str(entry.file(main) if main else entry.path))


def _store_url(remote: bool, url: Optional[str], store: Optional[str]) -> Optional[str]:
    """The store ``cache ls/gc --remote [URL]`` acts on (None: $ENGINEKIT_REMOTE), as ``--remote URL`` means on every
    verb. ``--store URL`` (the old spelling) still works, with a notice; a URL without ``--remote`` is refused (without
    it the local cache is listed or cleaned)."""
    given = url if url is not None else store
    if given is not None and not remote:
        raise UsageError(f"{'--store ' if url is None else ''}{given}: a store URL goes with --remote (--remote {given}); "
                         "without it the local cache is listed or cleaned")
    if store is not None:
        if url is not None:
            raise UsageError(f"--store {store} and {url}: name the store once (--remote URL)")
        from enginekit.cli.render import console

        console.print(f"[yellow]notice:[/] --store is now written --remote {store} (the old spelling goes in a later "
                      "release)", highlight=False)
    return given


def _remote_of(store: Optional[str]):
    from enginekit.cache import Cache
    from enginekit.store.settings import using

    with using(store):
        remote = Cache().remote
    if remote is None:
        raise UsageError("no store configured: set ENGINEKIT_REMOTE=s3://BUCKET/PREFIX or pass --store URL")
    return remote


def _ls_remote(kind: Optional[str], as_json: bool, store: Optional[str]) -> None:
    remote = _remote_of(store)
    rows = [r for r in remote.entries() if not kind or r.kind == kind]
    rows.sort(key=lambda r: str(r.info.modified or ""), reverse=True)
    if as_json:
        typer.echo(json_text({"store": remote.url, "entries": [r.to_json() for r in rows]}, indent=2))
        return
    from rich.table import Table

    from enginekit.cli.render import out
    from enginekit.store.identity import describe_hardware

    table = Table(title=f"store {remote.url}")
    for col in ("key", "kind", "subject", "size", "published", "engine for", "parity"):
        table.add_column(col)
    for row in rows:
        data = row.to_json()
        hw = describe_hardware(data["hardware"]) if "hardware" in data else ""
        parity = {True: "[green]pass[/]", False: "[red]fail[/]"}.get(data.get("parity_passed"), "-") if row.kind == "engine" else ""
        table.add_row(row.key[:12], row.kind, data["subject"] or ("[red]unreadable manifest[/]" if row.manifest is None else ""),
                      _size(row.size), (data["published"] or "")[:16].replace("T", " "), hw, parity)
    out.print(table)


def _gc_remote(size: Optional[int], age: Optional[float], dry_run: bool, store: Optional[str]) -> None:
    from enginekit.cli.render import console

    remote = _remote_of(store)
    if not dry_run and not remote.settings.writable:
        from enginekit.errors import UsageError

        raise UsageError(f"the store {remote.url} is read-only here (ENGINEKIT_REMOTE_MODE=read): use --dry-run")
    plan = remote.gc(age, size, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for row in plan.entries:
        console.print(f"  {verb} {row.kind}/{row.key[:12]} {(row.manifest or {}).get('subject') or ''} {_size(row.size)}",
                      markup=False)
    console.print(f"{verb} {len(plan.entries)} entries and {len(plan.blobs)} objects ({_size(plan.freed)}) from "
                  f"{remote.url}; {plan.kept} entries kept", markup=False)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
