"""The README and docs/ stay navigable: every relative link and image exists (anchors included),
the README stays short, and its command table lists every registered command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jbkv_cli.cli.app import app

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


def _first_table(text: str) -> str:
    """The first Markdown table of ``text`` (its consecutive ``|`` lines)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_every_registered_model_is_in_the_model_table():
    from jbkv_cli.models.registry import MODELS

    table = _first_table((ROOT / "docs" / "models.md").read_text(encoding="utf-8"))
    listed = set(re.findall(r"^\| [^|]+ \| `([a-z0-9-]+)", table, re.M))
    assert set(MODELS) <= listed, f"missing from docs/models.md's table: {set(MODELS) - listed}"


def test_each_table_lives_in_one_place():
    """The model table (a `--model` column) and the working-memory table (`working BF16`) are
    in docs/models.md and docs/report.md only; the README and other pages link to them."""
    homes = {"| `--model` |": "models.md", "| working BF16 |": "report.md"}
    for header, home in homes.items():
        pages = [p.name for p in PAGES if header in p.read_text(encoding="utf-8")]
        assert pages == [home], (header, pages)


def _prose(page: Path) -> str:
    """A page's text with its lines joined, so a fact wrapped over two lines still matches."""
    return " ".join(page.read_text(encoding="utf-8").split())


# Each fact below is stated on its home page only; every other page links to that page's anchor.
# A fact is found by what states it (a number beside its meaning), not by its exact wording.
FACTS = {
    "the correction's formula (docs/corrections.md)": (
        "corrections.md",
        "#the-correction",
        re.compile(r"τ²\s*/\s*24|τ\^2\s*/\s*24|tau\^?2\s*/\s*24", re.I),
    ),
    "the exit codes (docs/reliability.md)": (
        "reliability.md",
        "#exit-codes-and-messages",
        re.compile(
            r"usage errors (?:exit )?2\b|known failures (?:exit )?1\b|ctrl-c (?:exits )?130"
            r"|sigterm (?:exits )?143|sighup (?:exits )?129",
            re.I,
        ),
    ),
}


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_each_fact_is_stated_on_one_page(fact):
    """The formula of ``b`` and the exit codes are stated once in the docs (code docstrings may
    state the formula they implement: this is about the pages)."""
    home, _, pattern = FACTS[fact]
    stated = [p.name for p in PAGES if pattern.search(_prose(p))]
    assert stated == [home], f"{fact} is stated on {stated}; state it on {home} only and link"


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_the_readme_links_to_each_facts_home(fact):
    home, anchor, _ = FACTS[fact]
    assert f"docs/{home}{anchor}" in (ROOT / "README.md").read_text(encoding="utf-8"), fact


def test_the_fact_patterns_find_what_they_look_for():
    """The patterns above match the wordings they must catch (else the checks could not fail)."""
    formula = FACTS["the correction's formula (docs/corrections.md)"][2]
    codes = FACTS["the exit codes (docs/reliability.md)"][2]
    assert formula.search("b_i = (τ²/24) Σ_j Δ_ij² ‖q_j‖²")
    assert formula.search("(τ^2/24)")
    assert not formula.search("k' = [k̂, −τΔ²/24]")  # the fused kernel's key column: not b
    for text in (
        "Usage errors exit 2, known failures 1",
        "usage errors 2",
        "Ctrl-C 130, SIGTERM 143, SIGHUP 129",
        "Ctrl-C exits 130",
    ):
        assert codes.search(text), text
    assert not codes.search("a one-line usage error (exit 2)")  # one case's code: allowed


def test_commands_page_names_every_method_correction_and_figure():
    from jbkv_cli.cli.options import CLI_CORRECTIONS
    from jbkv_cli.quant import METHODS
    from jbkv_cli.report.html import FIGURES

    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    generate = text.split("- **`generate`**", 1)[1].split("\n- **", 1)[0]
    assert not [m for m in METHODS if f"`{m}`" not in generate], "a method missing in generate"
    for c in CLI_CORRECTIONS[1:]:
        assert re.search(rf"--correction [\w|-]*\b{re.escape(c)}\b", generate), c
        assert re.search(rf"--corrections none[\w,\[\]-]*\b{re.escape(c)}\b", text), c
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    assert f"{words[len(FIGURES)]} PNGs" in text
    assert all(f"`{name}`" in text for name, _ in FIGURES)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"{words[len(FIGURES)]}\nfigures" in readme or f"{words[len(FIGURES)]} figures" in readme


def test_no_page_or_docstring_points_at_a_design_document_the_repository_lacks():
    files = [*PAGES, *ROOT.glob("jbkv_cli/**/*.py"), *ROOT.glob("tests/**/*.py")]
    stale = ("design" + ".md", "proposed" + " layout")  # split: this file is scanned too
    bad = [
        (f.relative_to(ROOT), s)
        for f in files
        for s in stale
        if s in f.read_text(encoding="utf-8").lower()
    ]
    assert not bad, bad


def test_the_bias_share_is_not_called_a_bound():
    """The share of the keys' attention error the predicted bias reproduces does not bound what a
    correction removes (measured: ``tests/attention/test_bias_share.py``); no page says so."""
    files = [*PAGES, *ROOT.glob("jbkv_cli/**/*.py")]
    claims = ("at most recover", "hope to recover", "bounds what any")
    bad = [(f.name, c) for f in files for c in claims if c in f.read_text(encoding="utf-8")]
    assert not bad, bad


def test_the_readme_says_the_worked_examples_last_digits_depend_on_the_cpu():
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "last digits of these numbers depend on the CPU" in text
