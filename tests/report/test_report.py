"""jbkv_cli/report/table.py: the token-selection shift (QuantWM's Table 4 diagnostic) reaches the JSON
rows, the Rich table and the HTML page for every compared method's variant."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.report.table import LAYOUTS, build_rows, rich_table
from jbkv_cli.run.directory import RunDir

SHIFT = "top-1 shift ↓"
METHODS = ("rtn", "quarot", "kivi", "qvg", "quantwm")


class _Cells(HTMLParser):
    """The ``#variants`` table of the page: its header and, per ``data-variant``, its cells."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[str] = []
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self._cell: list[str] | None = None
        self._in_th = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-variant" in a:
            self._row = a["data-variant"]
            self.rows[self._row] = []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "th":
            self._in_th = True
            self.head.append("")

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None and self._row is not None:
            self.rows[self._row].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "th":
            self._in_th = False
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        elif self._in_th:
            self.head[-1] += data


def test_token_shift_for_every_variant_in_json_rich_table_and_html(tmp_path: Path):
    args = ["quantize-eval", "--quantizers", ",".join(METHODS), "--bits", "2"]
    args += ["--corrections", "none", "--num-chunks", "2", "--steps", "1", "--no-lpips"]
    args += ["--no-plots", "--prompt", "a red circle moves right on a dark background"]
    args += ["--out", str(tmp_path), "--json", str(tmp_path / "r.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output

    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    quantized = [r for r in rows if r["bits"] < 16]
    assert sorted(r["quantizer"] for r in quantized) == sorted(METHODS)
    for r in rows:
        if r["bits"] == 16:
            assert r["token_shift"] is None, "the reference has no shift against itself"
        else:  # INT2 moves some top-1 tokens of the embedded model, and never every one
            assert 0.0 < r["token_shift"]["mean"] < 1.0, r["variant"]

    run = RunDir.open(next(p.parent for p in tmp_path.rglob("manifest.json")))
    by_variant = {r["variant"]: r for r in quantized}
    console = Console(width=400, record=True, color_system=None)
    console.print(rich_table(build_rows(run), "t", LAYOUTS[0]))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if SHIFT in line)
    col = [c.strip() for c in re.split(r"[┃│]", header)].index(SHIFT)
    for vid, r in by_variant.items():  # the table names rows by label
        line = next(line for line in lines if f"│ {r['label']} " in line)
        cells = [c.strip() for c in re.split(r"[┃│]", line)]
        assert float(cells[col].split("±")[0]) == round(r["token_shift"]["mean"], 4), vid

    page = _Cells()
    page.feed(next(tmp_path.rglob("report/index.html")).read_text())
    col = page.head.index(SHIFT)
    for vid, r in by_variant.items():
        assert float(page.rows[vid][col].split("±")[0]) == round(r["token_shift"]["mean"], 4)
    assert [cells[col] for vid, cells in page.rows.items() if vid not in by_variant] == ["—"]
