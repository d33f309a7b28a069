"""Write docs/cli.md, the CLI reference, from the click commands themselves.

usage: python docs/gen_cli.py [--check]

Every command, argument and option comes from `autotune.cli`, so the reference cannot miss
one; `tests/test_docs.py` fails when docs/cli.md differs from what this prints
(`--check` does the same here).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

from autotune.cli import COMMAND_EXIT_NOTES, COMMAND_EXITS, EXIT_STATUSES, main

OUT = Path(__file__).resolve().parent / "cli.md"
HEADER = """# CLI reference

Every `autotune` command, argument and option. Generated from the commands themselves by
`python docs/gen_cli.py`; `tests/test_docs.py` checks that this page is current. Every
command also takes `--help`. Every command exits as [the one table below](#exit-status) says
(each error's line and its fix: [troubleshooting.md](troubleshooting.md)). Settings and their
`AUTOTUNE_*` variables: [guide.md](guide.md#settings).
"""


def exit_table() -> str:
    """The exit-status contract, from the table the commands exit by (autotune.cli.EXIT_STATUSES),
    and the causes each command can meet (COMMAND_EXITS; tests/test_exit_codes.py tests each)."""
    rows = [f"| {status.code} | {status.cause} | {table_cell(status.meaning)} |" for status in EXIT_STATUSES]
    per_command = [f"| `autotune{' ' + path if path else ''}` | {exit_list(path)} |" for path in COMMAND_EXITS]
    return ("## Exit status\n\nThe same cause gives the same code, whichever command meets it:\n\n"
            "| code | cause | what it means |\n| --- | --- | --- |\n" + "\n".join(rows) +
            "\n\nWhat each command can meet (`autotune run` exits with its script's status otherwise):\n\n"
            "| command | exit status |\n| --- | --- |\n" + "\n".join(per_command))


def exit_list(path: str) -> str:
    codes = [f"{status.code} {status.cause}" for status in COMMAND_EXITS.get(path, ())]
    return ", ".join(codes + ([COMMAND_EXIT_NOTES[path]] if path in COMMAND_EXIT_NOTES else []))


def commands(group: click.Group, ctx: click.Context) -> list[tuple[click.Context, click.Command]]:
    """(context, command) for the group and every command under it, depth first, in order of definition."""
    found: list[tuple[click.Context, click.Command]] = [(ctx, group)]
    for name, command in group.commands.items():
        sub = click.Context(command, info_name=name, parent=ctx)
        if isinstance(command, click.Group):
            found += commands(command, sub)
        else:
            found.append((sub, command))
    return found


def help_markdown(text: str) -> str:
    """A docstring as Markdown: plain paragraphs as they are, click's unwrapped (\\b)
    paragraphs as code blocks (their first line, "Example:" and the like, as a label)."""
    out: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            lines = lines[1:]
            label = lines[0].strip() if lines and lines[0].strip().endswith(":") else None
            body = inspect.cleandoc("\n".join(lines[1:] if label else lines))
            out.append((f"{label}\n\n" if label else "") + f"```bash\n{body}\n```")
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def table_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section(ctx: click.Context, command: click.Command) -> str:
    path = ctx.command_path
    parts = [f"## {path}", f"```\n{path} {' '.join(command.collect_usage_pieces(ctx))}\n```"]
    if command.help:
        parts.append(help_markdown(command.help))
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or "--help" in getattr(param, "opts", ()):  # arguments are in the usage line; --help is everywhere
            continue
        rows.append(f"| `{table_cell(record[0])}` | {table_cell(record[1])} |")
    if rows:
        parts.append("| option | what |\n| --- | --- |\n" + "\n".join(rows))
    command_key = path.removeprefix("autotune").strip()
    if command_key in COMMAND_EXITS:
        parts.append(f"Exit status ([the table](#exit-status)): {exit_list(command_key)}.")
    if isinstance(command, click.Group):
        listed = [f"- [`{path} {name}`](#{_anchor(f'{path} {name}')}): {sub.get_short_help_str(limit=120)}"
                  for name, sub in command.commands.items()]
        parts.append("Commands:\n\n" + "\n".join(listed))
    return "\n\n".join(parts)


def _anchor(heading: str) -> str:
    return heading.lower().replace(" ", "-")


def reference() -> str:
    root = click.Context(main, info_name="autotune")
    sections = [section(ctx, command) for ctx, command in commands(main, root)]
    return HEADER + "\n" + "\n\n".join([*sections, exit_table()]) + "\n"


if __name__ == "__main__":
    text = reference()
    if "--check" in sys.argv[1:]:
        current = OUT.read_text() if OUT.exists() else ""
        sys.exit(0 if current == text else f"{OUT} is out of date: run python docs/gen_cli.py")
    OUT.write_text(text)
    print(f"wrote {OUT}")
