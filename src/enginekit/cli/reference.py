"""The command reference (docs/cli.md), written from the commands' own declarations: what ``--help`` says.

    python -m enginekit.cli.reference > docs/cli.md

tests/test_docs.py fails when docs/cli.md is not what this writes.
"""

from __future__ import annotations

import inspect
import re

EXIT_CODES = """| code | meaning |
| --- | --- |
| 0 | ok |
| 1 | a gate failed (parity, task, labels; `tune`: no candidate meets the targets) |
| 2 | bad usage or input: one `error:` line saying what, nothing half-written left |
| 3 | a capability asked for is missing (no GPU, TensorRT not installed, a store that refuses or does not answer) |
| 130 / 143 | interrupted (Ctrl-C) / terminated (SIGTERM): temporary files removed |"""


_MARKUP = re.compile(r"\[/?(bold|dim|italic|green|red|yellow|cyan)?[a-z ]*\]")


def _text(help_text: str | None) -> str:
    return _MARKUP.sub("", " ".join(inspect.cleandoc(help_text or "").split())) if help_text else ""


def _is_argument(param) -> bool:
    return getattr(param, "param_type_name", "") == "argument"


def _paragraphs(doc: str | None) -> list[str]:
    """A command's docstring as markdown: paragraphs joined, examples as one code block."""
    text = _MARKUP.sub("", inspect.cleandoc(doc or ""))
    out, examples = [], []
    for block in text.split("\n\n"):
        stripped = block.strip()
        if not stripped:
            continue
        if stripped.startswith("enginekit ") or (examples and stripped.startswith("enginekit")):
            examples.append(stripped)
        elif stripped.rstrip(":") == "Examples":
            continue
        else:
            out.append(" ".join(stripped.split()))
    if examples:
        out.append("```\n" + "\n".join(examples) + "\n```")
    return out


def _option_rows(command) -> list[str]:
    rows = []
    for param in command.params:
        if _is_argument(param) or getattr(param, "hidden", False):
            continue
        names = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
        panel = getattr(param, "rich_help_panel", None) or ""
        default = param.default if not callable(param.default) else None
        shown = "" if default in (None, False, (), []) or param.is_flag else f"`{default}`"
        rows.append(f"| {names} | {panel} | {_text(param.help)} | {shown} |")
    return rows


def _command(path: str, command) -> list[str]:
    arguments = " ".join(p.name.upper() if p.required else f"[{p.name.upper()}]"
                         for p in command.params if _is_argument(p))
    out = [f"## {path}", f"`{path} [OPTIONS] {arguments}`".replace("  ", " ").replace(" `", "`"), *_paragraphs(command.help)]
    for p in command.params:
        if _is_argument(p) and getattr(p, "help", None):
            out.append(f"- `{p.name.upper()}`: {_text(p.help)}")
    rows = _option_rows(command)
    if rows:
        out += ["| option | panel | what | default |\n| --- | --- | --- | --- |\n" + "\n".join(rows)]
    return out


def reference() -> str:
    import typer

    from enginekit.cli import app

    group = typer.main.get_command(app)
    out = ["# Command reference",
           "Written from the commands' own declarations (`python -m enginekit.cli.reference`): what `enginekit VERB "
           "--help` says, in one place. Every verb prints what it made on stdout and what it did on stderr.",
           "## Exit codes", EXIT_CODES]
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (cache, recipes)
            out += [f"## enginekit {name}", *_paragraphs(command.help)]
            for sub, subcommand in command.commands.items():
                out += _command(f"enginekit {name} {sub}", subcommand)
        else:
            out += _command(f"enginekit {name}", command)
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(reference())
