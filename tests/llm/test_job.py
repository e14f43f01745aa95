"""``jbkv_cli.llm.job``: the llm-prefill request checked whole before anything exists, then run
(no Typer; the command's own cases are ``test_cli_llm.py``). On a tiny random Llama."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from jbkv_cli.llm.data import Bin
from jbkv_cli.llm.job import PrefillRequest, non_finite, prefill, prepare, slug
from jbkv_cli.llm.tiny.corpus import eval_document
from jbkv_cli.llm.tiny.tokenizer import build_tokenizer
from jbkv_cli.run.experiment import build_matrix
from jbkv_cli.utils.errors import JbkvError, UsageError
from tests.llm.conftest import tiny_lm

SPECS = tuple(build_matrix([2], ["rtn"], ["none", "taylor"], [32]))


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """A tiny random Llama folder (max 512 positions) and a JSONL file of five documents."""
    root = tmp_path_factory.mktemp("llm-job")
    tiny_lm("llama").save_pretrained(root / "llama")
    build_tokenizer().save_pretrained(root / "llama")
    data = root / "docs.jsonl"
    data.write_text(
        "".join(json.dumps({"text": eval_document(3, i, 300)}) + "\n" for i in range(5))
    )
    return {"model": root / "llama", "data": data}


def _request(assets, tmp_path: Path, **changes) -> PrefillRequest:
    request = PrefillRequest(
        specs=SPECS,
        model=str(assets["model"]),
        data=str(assets["data"]),
        bins=(Bin(64, 128),),
        chunk_sizes=(16,),
        examples=2,
        out=tmp_path / "run",
        json_path=tmp_path / "result.json",
        plots=False,
        device="cpu",
    )
    return replace(request, **changes)


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"backend": "dense"}, UsageError, "--backend must be one of fused, flex, reference"),
        ({"dtype": "int8"}, UsageError, "--dtype must be auto"),
        ({"examples": 0}, UsageError, "--examples"),
        ({"data": " "}, UsageError, "--data is empty"),
        ({"data": "synthetic"}, UsageError, "embedded LM"),
        ({"specs": ()}, UsageError, "no KV-cache variant"),
        # found only once the model is loaded: the positions it has, the heads it stores
        ({"bins": (Bin(400, 500),), "chunk_sizes": (64,)}, UsageError, "positions"),
        ({"specs": tuple(build_matrix([2], ["rtn"], ["none"], [48]))}, UsageError, "rtn"),
        # and the longest documents: none is long enough
        ({"bins": (Bin(300, 400),), "chunk_sizes": (100,)}, JbkvError, "long enough"),
    ],
)
def test_a_refused_request_creates_nothing(assets, tmp_path, changes, error, match):
    request = _request(assets, tmp_path, **changes)
    with pytest.raises(error, match=match):
        prepare(request)
    assert list(tmp_path.iterdir()) == [], "a refused request created files"


def test_the_json_path_is_checked_before_the_run_exists(assets, tmp_path):
    request = _request(assets, tmp_path, json_path=tmp_path / "run" / "result.json")
    with pytest.raises(UsageError, match="inside the run directory"):
        prepare(request)
    assert list(tmp_path.iterdir()) == []


def test_a_run_is_written_whole_and_other_settings_leave_it_as_it_was(assets, tmp_path):
    """``prefill`` writes the run, its report and ``--json`` (the report's result); a second
    request with another seed is refused by the run folder, and nothing in it changes."""
    request = _request(assets, tmp_path)
    result = prefill(request)
    assert result.jobs.scored == 3 * 2 and result.jobs.skipped == 0  # 3 variants x 2 examples
    assert result.rows and result.written[-1] == request.json_path
    report = json.loads((request.out / "report" / "results.json").read_text())
    assert json.loads(request.json_path.read_text()) == report
    before = _tree(tmp_path)
    other = replace(request, seed=1, json_path=tmp_path / "other.json")
    with pytest.raises(UsageError, match="seed"):
        prepare(other)
    assert _tree(tmp_path) == before, "a refused request changed the run or wrote its json"
    again = prefill(request)  # the same request resumes: nothing left to score
    assert (again.jobs.scored, again.jobs.skipped) == (0, 6)


def test_names_and_configs():
    assert slug("/models/Qwen2.5-0.5B/") == "Qwen2.5-0.5B"
    assert slug("owner/name") == "name" and slug("...") == "model"
    assert non_finite({"a": [1.0, {"b": float("nan")}]})[0] == "a.1.b"
    assert non_finite({"a": 1.0, "b": [2, "x"]}) is None
