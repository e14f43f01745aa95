"""The README and docs/ stay navigable: every relative link and image exists (anchors included),
the README stays short, and its command table lists every registered command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jbkv_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_exists(page):
    bad = []
    for target in _links(page):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            bad.append(target)
    assert not bad, f"{page.name}: broken links {bad}"


def test_every_referenced_docs_image_exists():
    for page in PAGES:
        for name in re.findall(r"docs/([\w.-]+\.png)", page.read_text(encoding="utf-8")):
            assert (ROOT / "docs" / name).is_file(), (page.name, name)


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines (at most 300: details go to docs/)"


def test_the_readme_command_table_lists_every_registered_command():
    import typer.main

    group = typer.main.get_command(app)
    registered = set(group.commands)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `jbkv ([a-z-]+)", table, re.M))
    assert registered <= listed, f"missing from the README's command table: {registered - listed}"
    assert listed <= registered, f"listed but not registered: {listed - registered}"


def test_every_benchmark_script_is_described_in_docs_benchmarks():
    described = (ROOT / "docs" / "benchmarks.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts and not [s for s in scripts if f"`{s}`" not in described]
