"""The documentation cannot drift: the CLI reference lists every command and option, every
setting is documented, links resolve, and the README stays a short user's guide."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

import click
import pytest

from autotune.cli import main
from autotune.settings import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_BYTES = 15 * 1024
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _gen_cli():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(markdown: str) -> dict[str, str]:
    """Level-2 sections by heading."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.M)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2])}


def test_the_cli_reference_lists_every_command_and_option() -> None:
    sections = _sections((DOCS / "cli.md").read_text())
    gen_cli = _gen_cli()
    missing = []
    for ctx, command in gen_cli.commands(main, click.Context(main, info_name="autotune")):
        body = sections.get(ctx.command_path)
        if body is None:
            missing.append(ctx.command_path)
            continue
        for param in command.get_params(ctx):
            # The help option by what it is: click 8.5 names it _click_default_help, 8.4 help.
            if isinstance(param, click.Option) and param is not command.get_help_option(ctx):
                missing += [f"{ctx.command_path} {flag}" for flag in (*param.opts, *param.secondary_opts)
                            if f"`{flag}" not in body and f" {flag}" not in body]
    assert missing == [], "docs/cli.md is out of date: run python docs/gen_cli.py"


def test_every_setting_has_its_variable_in_the_guide() -> None:
    guide = (DOCS / "guide.md").read_text()
    undocumented = [ENV_PREFIX + f.name.upper() for f in fields(Settings) if f"`{ENV_PREFIX}{f.name.upper()}`" not in guide]
    assert undocumented == [], "add these to docs/guide.md#settings"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(target)
    assert broken == []


def test_the_readme_is_a_short_guide_without_a_lab_notebook() -> None:
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail to docs/"
    for page in PAGES:
        history = re.findall(r"\bruns? \d+|\bcommit [0-9a-f]{7,40}\b", page.read_text())
        assert history == [], f"{page.name} cites run numbers or commits; results live in docs/results.md"
