"""User text is printed as typed: never read as Rich markup, never reordered by a bidi control.

Rich reads ``[...]`` as markup and ``:name:`` as an emoji code; a prompt, a path or an option
value holding ``[/]`` used to crash jbkv with a 40-line ``MarkupError`` (after all the work, in
``quantize-eval``'s summary line) and ``[bold]x`` printed as ``x``. A U+202E (RIGHT-TO-LEFT
OVERRIDE) in a prompt reversed the rest of its line: on the terminal it is now shown as
``\\u202e``; in the HTML page every user text sits in its own ``<bdi>``. The CLI cases run the
installed ``jbkv`` in subprocesses (exit code and stderr are the point), concurrently.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from html import escape
from io import StringIO
from pathlib import Path

import pytest
import torch
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.cli.commands import experiment as experiment_cmd
from jbkv_cli.cli.commands.fidelity import results_table
from jbkv_cli.metrics.fidelity import compare_dirs
from jbkv_cli.report.html import render_page
from jbkv_cli.report.results import ResultRow
from jbkv_cli.report.table import build_rows, rich_table, to_json, vbench_table
from jbkv_cli.run.directory import RunDir
from jbkv_cli.utils import console
from jbkv_cli.utils.console import PlainConsole, plain, visible
from jbkv_cli.utils.video import write_video_lossless
from tests.installed import run_jbkv

pytestmark = pytest.mark.slow

PROMPT = "a red circle moves right on a dark background"
TINY_EVAL = ["quantize-eval", "--prompt", PROMPT, "--seeds", "0", "--bits", "2"]
TINY_EVAL += ["--quantizers", "rtn", "--corrections", "none", "--num-chunks", "2", "--steps", "1"]
TINY_EVAL += ["--no-lpips", "--no-plots"]
MARKUP = ["[/]", "[bold]x", "[/x]", "x[/]", "[red]a[/red] :cat: [link=x]y"]
RLO = "\u202e"


def jbkv(*args: object, cwd: Path, env: dict[str, str] | None = None):
    return run_jbkv(*args, cwd=cwd, env={"COLUMNS": "200", **(env or {})})


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The single ``error: …`` line of a refused command (no traceback, nothing else)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- the console helpers ------------------------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, StringIO]:
    """``console``'s three consoles writing into buffers (80 columns: wrapping would show)."""
    buffers = {}
    for name in ("out", "err", "_errors"):
        buffers[name] = StringIO()
        monkeypatch.setattr(console, name, PlainConsole(file=buffers[name], width=80))
    return buffers


@pytest.mark.parametrize("text", MARKUP)
def test_every_console_helper_prints_markup_literally(captured, text):
    console.warn(text)
    console.error(text)
    console.out.print(text)
    console.err.print(text, plain(text, "bold"))
    assert captured["err"].getvalue() == f"warning: {text}\n{text} {text}\n"
    assert captured["_errors"].getvalue() == f"error: {text}\n"
    assert captured["out"].getvalue() == f"{text}\n"


def test_warnings_and_errors_stay_one_line(captured):
    long = "a/very/long/path " * 20
    console.warn(long)
    console.error(long)
    assert captured["err"].getvalue().count("\n") == 1
    assert captured["_errors"].getvalue().count("\n") == 1


def test_bidi_controls_are_shown_not_obeyed(captured):
    text = f"{RLO}abc · seed 0 \u2066x\u2069"
    assert visible(text) == "\\u202eabc · seed 0 \\u2066x\\u2069"
    assert visible("שלום abc \u200f") == "שלום abc \u200f"  # letters and marks are left alone
    console.warn(text)
    console.error(text)
    console.out.print(text)
    table = Table(title=text)
    table.add_column(text)
    table.add_row(text)
    console.out.print(table)
    for buffer in captured.values():
        assert RLO not in buffer.getvalue() and "\\u202eabc" in buffer.getvalue()


def _result_row(label: str) -> ResultRow:
    return ResultRow.from_dict(
        {"variant": label, "label": label, "quantizer": label, "bits": 16, "videos": 1}
    )


@pytest.mark.parametrize("text", MARKUP[:3])
def test_tables_hold_user_text_literally_on_any_console(text, tmp_path):
    """The builders make ``Text`` cells, so even a plain Rich console (markup on) shows them."""
    cons = Console(file=StringIO(), width=200, force_terminal=False)
    cons.print(rich_table([_result_row(text)], f"title {text}"))
    cons.print(vbench_table([(text, {"dimensions": {}, "quality": 0.5})]))
    ref, test = tmp_path / "ref", tmp_path / "test"
    video = torch.zeros(2, 16, 16, 3, dtype=torch.uint8)
    for folder in (ref, test):
        write_video_lossless(folder / f"{text}.mkv", video, 8)
    cons.print(results_table(compare_dirs(ref, test, lpips=False)))
    printed = cons.file.getvalue()
    assert f"title {text}" in printed
    assert printed.count(text) >= 4, printed  # title, variant, scheme, VBench row, video


# --- the CLI, through the installed jbkv ---------------------------------------------------------


REFUSED = [
    (("generate", "--seeds", "[/]"), 2, "bad --seeds '[/]'"),
    (("generate", "--quantizer", "[/x]"), 2, "got '[/x]'"),
    (("generate", "--correction", "[bold]x"), 2, "got '[bold]x'"),
    (("report", "x[/]"), 1, "x[/] is not a jbkv run directory"),
    (("fidelity", "[/]", "[/]"), 1, "[/]"),
    (("weights", "fetch", "[/]"), 2, "'[/]'"),
    (("report", ".", "--format", "[b]x"), 2, "'[b]x' is not one of 'table'"),
]


def test_refusals_print_the_user_text_as_typed(tmp_path):
    """One ``error:`` line holding the text as typed, the right exit code, nothing created."""
    env = {"HOME": str(tmp_path / "home")}
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: jbkv(*c[0], cwd=tmp_path, env=env), REFUSED))
    for (args, code, fragment), r in zip(REFUSED, results, strict=True):
        line = one_error_line(r)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert fragment in line, (args, line)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def markup_run(tmp_path_factory) -> Path:
    """One real tiny quantize-eval into ``q[/]`` (1 prompt, 1 seed, INT2 RTN; about 5 s)."""
    cwd = tmp_path_factory.mktemp("markup")
    result = jbkv(*TINY_EVAL, "--out", "q[/]", "--json", "r[/].json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (cwd / "stderr.txt").write_text(result.stderr)
    (cwd / "stdout.txt").write_text(result.stdout)
    return cwd


def test_quantize_eval_into_a_folder_named_with_markup(markup_run):
    stderr = (markup_run / "stderr.txt").read_text()
    assert "Traceback" not in stderr and "MarkupError" not in stderr
    summary = [line for line in stderr.splitlines() if "videos generated" in line]
    assert len(summary) == 1 and summary[0].endswith("run: q[/]/tiny"), stderr
    assert "page: q[/]/tiny/report/index.html" in stderr and "wrote r[/].json" in stderr
    report = markup_run / "q[/]" / "tiny" / "report"
    for name in ("results.json", "table.md", "index.html"):
        assert (report / name).is_file(), name
    assert json.loads((markup_run / "r[/].json").read_text())["model"] == "tiny"
    assert "INT2 rtn g32" in (markup_run / "stdout.txt").read_text()


def test_report_titles_the_table_with_the_literal_path(markup_run):
    r = jbkv("report", "q[/]/tiny", cwd=markup_run)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "tiny · q[/]/tiny" in r.stdout


def test_the_report_is_written_before_anything_is_printed(tmp_path, monkeypatch):
    """A failure while printing (here: the summary line and the table raise) loses nothing:
    RUN/report and --json are on disk first."""

    def fail(*_args, **_kwargs):
        raise RuntimeError("printing failed")

    monkeypatch.setattr(experiment_cmd, "_summary_line", fail)
    monkeypatch.setattr("jbkv_cli.report.table.print_table", fail)  # imported when printing
    out = tmp_path / "run"
    args = [*TINY_EVAL, "--out", str(out), "--json", str(tmp_path / "r.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "printing failed" in result.output, result.output
    for name in ("results.json", "table.md", "index.html"):
        assert (out / "tiny" / "report" / name).is_file(), name
    assert (tmp_path / "r.json").is_file()


def test_fidelity_table_shows_file_names_as_typed(tmp_path):
    """Video names are file names (user text): markup and a U+202E come out literally."""
    video = torch.zeros(2, 16, 16, 3, dtype=torch.uint8)
    names = ["[bold]x", f"a{RLO}b · c"]
    for folder in ("ref", "test"):
        for name in names:
            write_video_lossless(tmp_path / folder / f"{name}.mkv", video, 8)
    r = jbkv("fidelity", "ref", "test", "--no-lpips", "--json", "[/].json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[bold]x" in r.stdout and "a\\u202eb · c" in r.stdout, r.stdout
    assert RLO not in r.stdout + r.stderr
    assert (tmp_path / "[/].json").is_file()


@pytest.fixture
def short_dir():
    """A folder with a short path (removed after the test): tmp_path's length varies."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="jbkv-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_weights_fetch_and_status_of_an_entry_with_markup(tmp_path, local_server, short_dir):
    torch_home = short_dir  # the status table folds a long path (its width is capped)
    payload = b"weights for a test\n" * 1000
    (local_server.root / "w.bin").write_bytes(payload)
    entry = {
        "name": "w",
        "group": "lpips",
        "used_by": "a [bold]test[/]",
        "url": f"{local_server.url}/w.bin",
        "root": "torch_hub",
        "path": "checkpoints/[b]w[/b].bin",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "hash_source": "[red]test",
    }
    manifest = tmp_path / "manifest.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JBKV_", "TORCH_"))}
    env = base | {
        "HOME": str(tmp_path / "home"),
        "TORCH_HOME": str(torch_home),
        "JBKV_WEIGHTS_MANIFEST": str(manifest),
    }
    # a name with markup is refused by the manifest check, printed as typed
    manifest.write_text(json.dumps({"files": [entry | {"name": "[bold]w[/]"}]}))
    refused = run_jbkv("weights", "fetch", "[bold]w[/]", environ=env)
    lines = refused.stderr.splitlines()
    assert refused.returncode == 1 and len(lines) == 1, refused.stderr
    assert "name '[bold]w[/]'" in lines[0], refused.stderr
    # markup in a destination path and in the texts beside it is printed as typed
    manifest.write_text(json.dumps({"files": [entry]}))
    fetched = run_jbkv("weights", "fetch", "w", environ=env)
    assert fetched.returncode == 0, fetched.stderr
    done = [line for line in fetched.stderr.splitlines() if line.startswith("w: ")]
    assert len(done) == 1 and done[0].endswith("[b]w[/b].bin (sha256 checked)"), fetched.stderr
    status = run_jbkv("weights", "status", environ=env, columns=1000)
    assert status.returncode == 0 and "[b]w[/b].bin" in status.stdout, status.stderr


# --- the HTML page ------------------------------------------------------------------------------


def _with_prompt(run_dir: Path, old: str, new: str) -> None:
    """Rename ``old``'s videos, records and scores in ``run_dir`` to prompt ``new``."""
    manifest = run_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    data["prompts"] = [new if p == old else p for p in data["prompts"]]
    data["model"] = f"tiny{RLO}model"
    manifest.write_text(json.dumps(data))
    for path in sorted((run_dir / "videos").glob(f"*/{old}-*")):
        target = path.with_name(new + path.name[len(old) :])
        path.rename(target)
        if target.suffix == ".json":
            record = json.loads(target.read_text())
            record["prompt"] = new
            target.write_text(json.dumps(record))
    for path in (run_dir / "metrics").rglob("*.json"):
        text = path.read_text()
        path.write_text(text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
        if path.name.startswith(old):  # a video's own score file is named after it
            path.rename(path.with_name(new + path.name[len(old) :]))


@pytest.fixture(scope="module")
def bidi_page(markup_run, tmp_path_factory) -> tuple[Path, str]:
    """The page of a run whose prompt, model and folder hold U+202E."""
    prompt = f"{RLO}evil prompt"
    run_dir = tmp_path_factory.mktemp("bidi") / f"run{RLO}x"
    shutil.copytree(markup_run / "q[/]" / "tiny", run_dir)
    _with_prompt(run_dir, PROMPT, prompt)
    run = RunDir.open(run_dir)
    page = render_page(run, to_json(run, build_rows(run)), run_dir / "report")
    (run_dir / "report" / "index.html").write_text(page)
    return run_dir / "report" / "index.html", prompt


def test_page_isolates_the_prompt_from_the_seed(bidi_page):
    path, prompt = bidi_page
    page = path.read_text()
    assert f"<h3><bdi>{escape(prompt)}</bdi> · seed 0</h3>" in page
    outside = re.sub(r"<bdi>.*?</bdi>", "", page, flags=re.S)
    title = re.search(r"<title>(.*?)</title>", outside).group(1)
    assert title == f"jbkv report · \u2068tiny{RLO}model\u2069"  # no element in a <title>
    assert RLO not in outside.replace(title, "")  # every other one lies inside a <bdi>
    assert page.count(RLO) >= 4  # h1, run folder, the prompt's heading, the title


def _html_tests():
    """tests/report/test_html_report.py, for its DevTools driver (tests are not a package)."""
    path = Path(__file__).parents[1] / "report" / "test_html_report.py"
    spec = importlib.util.spec_from_file_location("_jbkv_html_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chromium() -> str | None:
    return os.environ.get("JBKV_CHROMIUM") or shutil.which("chromium")


# The left and right edges of the glyphs of ``needle`` in the first video row's heading.
EXTENT = """(needle => {
  const walker = document.createTreeWalker(document.querySelector('.sync-group h3'), 4);
  for (let node; (node = walker.nextNode()); ) {
    const i = node.textContent.indexOf(needle);
    if (i < 0) continue;
    const range = document.createRange();
    range.setStart(node, i);
    range.setEnd(node, i + needle.length);
    const box = range.getBoundingClientRect();
    return [box.left, box.right];
  }
  return null;
})"""


@pytest.mark.skipif(_chromium() is None, reason="no chromium executable (`make browser`)")
def test_chromium_draws_the_seed_right_of_the_prompt(bidi_page, tmp_path):
    """In a real browser `` · seed 0`` follows the prompt (reversed by its own U+202E); without
    the isolation the override reverses it too and it is drawn left of the prompt."""
    path, _ = bidi_page
    profile = Path(tempfile.mkdtemp(prefix="jbkv-chromium-", dir=tmp_path))
    browser = _html_tests().Chromium(_chromium(), profile)
    try:
        browser.open(path.as_uri())
        prompt = browser.js(f"{EXTENT}('evil prompt')")
        seed = browser.js(f"{EXTENT}(' · seed 0')")
    finally:
        browser.close()
    assert prompt and seed, (prompt, seed)
    assert prompt[0] < prompt[1] <= seed[0] + 0.5 < seed[1], (prompt, seed)
