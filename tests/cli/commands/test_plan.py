"""``jbkv plan`` through the installed ``jbkv``: a plan of the embedded model with ``--json``
(its schema), and each usage error one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from tests.installed import run_jbkv, run_refusal

pytestmark = pytest.mark.slow  # installed jbkv subprocesses (docs/testing.md)

TINY = [
    "plan",
    "--bits",
    "2",
    "--quantizers",
    "rtn",
    "--corrections",
    "taylor",
    "--num-chunks",
    "2",
]


def test_a_plan_with_budgets_and_json(tmp_path):
    out = tmp_path / "plan.json"
    done = run_jbkv(*TINY, "--gpu-memory", "4090,1GiB", "--json", out, columns=200, check=True)
    assert "16-bit reference" in done.stdout and "INT2 rtn g32 +taylor" in done.stdout
    assert "4090" in done.stdout and f"wrote {out}" in done.stderr
    doc = json.loads(out.read_text())
    assert doc["format"] == "jbkv-plan/1" and doc["unit"] == "bytes"
    (plan,) = doc["plans"]
    assert plan["model"] == "tiny" and plan["settings"]["device"] == "cuda"
    assert plan["budgets"] == {"4090": 24 * 2**30, "1GiB": 2**30}
    assert [v["variant"] for v in plan["variants"]] == ["16-bit reference", "INT2 rtn g32 +taylor"]
    for v in plan["variants"]:
        peak = v["peak"]
        parts = sum(peak["weights"].values()) + peak["cache"] + peak["attention"]
        assert peak["total"] == parts + peak["activations"]
        assert [p["phase"] for p in v["phases"]] == ["setup", "chunk 1", "chunk 2", "decode"]
        assert set(v["fits"]) == {"4090", "1GiB"} and set(v["longest_chunks"]) == {"4090", "1GiB"}
        assert v["growth"]["chunks"] == [2, 3]
        assert v["kv_cache_bytes"] > 0 and v["stored_cache_bytes"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-memory", "80"], "--gpu-memory must be a size with a unit"),
        (["--gpu-memory", "H1000"], "--gpu-memory must be a size with a unit"),
        (["--device", "cpu"], "jbkv plan plans a CUDA device; leave out --device"),
        (["-o", "device=cuda"], "jbkv plan plans a CUDA device; leave out -o device"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--bits", "5"], "bits"),
        (["--bits", "K2V2@0-9+K1V1"], "on tiny: layer range 0-9 is outside the model's layers 0-3"),
        (["--image", "missing.png"], "--image goes with --prompt"),
        (["--prompt", "a purple hexagon"], "tiny"),
        (["-o", "num_chunks=0"], "num_chunks"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, message):
    out = tmp_path / "plan.json"
    first = args == ["--gpu-memory", "80"]  # through the installed jbkv too
    done = run_refusal("plan", *args, "--json", out, cwd=tmp_path, installed=first)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not out.exists()


def test_json_onto_a_folder_or_an_input_is_refused(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moves right on a dark background\n")
    for target in (tmp_path, prompts):
        done = run_refusal(
            *TINY, "--prompts", prompts, "--json", target, cwd=tmp_path, installed=target == prompts
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert prompts.read_text() == "a red circle moves right on a dark background\n"
