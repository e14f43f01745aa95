"""docs/plan.md's table of every model's plan is ``benchmarks/plans.py``'s: its rows are the
script's format, from its committed JSON, and it covers every registered model (no plan is run
here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plans.py"
RESULTS = ROOT / "benchmarks" / "results" / "plans.json"


def _script():
    spec = importlib.util.spec_from_file_location("jbkv_plans_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _between_markers(script) -> str:
    text = (ROOT / "docs" / "plan.md").read_text(encoding="utf-8")
    return text.split(script.BEGIN, 1)[1].split(script.END, 1)[0]


def test_the_cells():
    script = _script()
    assert script.cell(False, 12, 3) == "no"
    assert script.cell(True, 12, 3) == "≤12 ch · 36 fr"
    assert script.cell(True, 12, None) == "≤12 ch"
    assert script.cell(True, None, 3) == "fits"


def test_a_row_from_a_plans_json():
    script = _script()
    variant = {
        "variant": "RTN INT2 g32",
        "peak": {"total": 3 * 2**30},
        "fits": {"24GiB": True, "80GiB": False},
        "longest_chunks": {"24GiB": 40, "80GiB": 0},
    }
    row = script.row("m", variant, 3, ["24GiB", "80GiB"])
    assert row == "| m | RTN INT2 g32 | 3.00 | ≤40 ch · 120 fr | no |"


def test_the_docs_table_is_the_scripts_json():
    """The committed JSON (``benchmarks/results/plans.json``, kept in git) is the table's."""
    from jbkv_cli.models.registry import MODELS

    script = _script()
    document = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert script.table(document) in _between_markers(script)
    assert {p["model"] for p in document["plans"]} == set(MODELS)
    assert all(len(p["variants"]) == len(script.specs()) for p in document["plans"])
