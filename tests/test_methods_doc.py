"""docs/methods.md and the methods' docstrings say what each method runs as: every registered
method has its measured rows, every model a stated QVG cache policy, and QuantWM's Table 5
baseline is named for what it is (issue 34, item 4)."""

from __future__ import annotations

import re
from pathlib import Path

from jbkv_cli.models.registry import MODELS
from jbkv_cli.quant import quantwm, qvg, qvg_policy
from jbkv_cli.quant.qvg_policy import integration
from jbkv_cli.quant.registry import METHODS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text(encoding="utf-8")


def _section(heading: str) -> str:
    return DOC.split(heading, 1)[1].split("\n#", 1)[0]


def test_the_measured_table_has_both_widths_of_every_registered_method():
    table = _section("## The quantizers, measured on the embedded model")
    rows = re.findall(r"^\| ([a-z-]+) g\d+ \| (\d) \|", table, re.M)
    for name in METHODS:
        assert {b for n, b in rows if n == name} == {"2", "4"}, name


def test_every_model_has_a_stated_qvg_policy():
    """Every model but the embedded one (per chunk, nothing to fill in) has an entry in
    qvg_policy.INTEGRATIONS, and the per-model table of docs/methods.md names every model."""
    table = DOC.split("**Defaults per model.**", 1)[1].split("\n\n", 2)[1]
    for name in MODELS:
        assert f"`{name}`" in table, name
        if name != "tiny":
            assert integration(name) is not None, name
    for text in (qvg.__doc__, qvg_policy.__doc__):
        assert "HY-WorldPlay" in text and "Matrix-Game-2.0" in text


def test_table_5s_baseline_is_qvg_at_g64_and_quantwm_base_jbkvs_control():
    for text in (quantwm.__doc__, _section("### Ablations (Table 5)")):
        flat = " ".join(text.split())
        assert "literal Table 5 baseline is QVG as its code runs it" in flat
        assert "g = 64" in flat and "jbkv's own control" in flat
        assert "that baseline row" not in flat and "not Table 5's first row" not in flat
