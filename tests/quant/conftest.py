"""Shared by the method tests: one ``quantize-eval`` on the embedded model at its smallest."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app

SMALLEST = [
    "--num-chunks",
    "2",
    "--steps",
    "1",
    "--prompt",
    "a red circle moves right on a dark background",
    "--no-lpips",
    "--no-plots",
]


@pytest.fixture
def quick_eval(tmp_path: Path) -> Callable[..., dict[str, dict[str, Any]]]:
    """``quick_eval(*options)``: ``quantize-eval`` with ``options`` on 2 chunks × 1 step × one
    prompt into ``tmp_path``; asserts exit 0 and returns the JSON rows by variant, in order."""

    def run(*options: str) -> dict[str, dict[str, Any]]:
        out = ["--out", str(tmp_path), "--json", str(tmp_path / "r.json")]
        result = CliRunner().invoke(app, ["quantize-eval", *options, *SMALLEST, *out])
        assert result.exit_code == 0, result.output
        rows = json.loads((tmp_path / "r.json").read_text())["rows"]
        return {r["variant"]: r for r in rows}

    return run
