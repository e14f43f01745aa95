"""``-m matrix-game-2`` on the command line: tiny-random generate with an INT2 corrected cache
(action caches quantized, their bytes reported apart) and bad inputs (one line on stderr,
exit 2, nothing created) through the installed ``jbkv`` in a subprocess; quantize-eval and
profile-heads --cases, where the exit code is not the point, through Typer's CliRunner (the
diffusers import is paid once)."""

import json
import os
import subprocess
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from tests.installed import run_jbkv, run_refusal

pytestmark = pytest.mark.slow

TINY = ["-m", "matrix-game-2", "-o", "config=tiny-random"]


jbkv = partial(run_jbkv, columns=160, env={"OMP_NUM_THREADS": "1"})
refused = partial(run_refusal, columns=160, env={"OMP_NUM_THREADS": "1"})


def cases(folder: Path, row: str = "1.png,a red room,a.json") -> Path:
    path = folder / "cases.csv"
    path.write_text(f"image,prompt,pose\n{row}\n")
    return path


def test_matrix_game_generate_int2_reports_action_cache_bytes(tmp_path, inputs):
    inputs(tmp_path)
    r = jbkv("generate", *TINY, "--cases", cases(tmp_path), "--bits", "2", "--correct",
             "--out", "run", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    videos = tmp_path / "run" / "videos"
    ref = json.loads((videos / "reference" / "1-a-0.json").read_text())
    q = json.loads((videos / "int2-rtn-g32-taylor" / "1-a-0.json").read_text())
    assert q["frames"][:3] == [33, 32, 32]
    rs, qs = ref["info"]["kv_cache_bytes_by_cache"], q["info"]["kv_cache_bytes_by_cache"]
    assert set(qs) == {"main", "mouse", "keyboard"}
    assert all(0 < qs[k] < rs[k] for k in qs)
    assert q["kv_cache_bytes"] == sum(qs.values())


def invoke(*args: object, cwd: Path):
    before = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(before)


def test_matrix_game_quantize_eval_table_lists_the_cache_split(tmp_path, inputs):
    inputs(tmp_path)
    r = invoke("quantize-eval", *TINY, "-o", "quantize_actions=false", "--cases", cases(tmp_path),
               "--quantizers", "rtn", "--bits", "2", "--corrections", "none,taylor",
               "--no-lpips", "--no-plots", "--json", "rows.json", "--out", "qe", cwd=tmp_path)  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "rows.json").read_text())
    split = {row["label"]: row["kv_bytes_by_cache"] for row in rows["rows"]}
    ref, q = split["FP32"], split["INT2 rtn g32 +taylor"]
    assert q["mouse"] == ref["mouse"] and q["keyboard"] == ref["keyboard"]  # kept 16-bit
    assert q["main"] < ref["main"]
    assert "INT2 rtn g32 +taylor: KV" in r.output and "mouse" in r.output


def one_line_error(r: subprocess.CompletedProcess, needle: str, code: int = 2) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]


BAD = [
    # (case row, actions text or None to keep the good one, extra options, exit code, needle);
    # the file format's other rules and the length limit are checked in-process
    # (test_matrix_game_actions.py: check_cases / check_options, what every command calls)
    ("1.png,a room,a.json", '{"keyboard": [[1, 0, 0, 0]]}', [], 2, "has 1 rows; the video has 33"),
    # the bounded JSON reader (a RecursionError and a ValueError escaped json.loads)
    ("1.png,a room,a.json", "[" * 100_000 + "]" * 100_000, [], 2, "nested too deeply"),
    ("1.png,a room,a.json", '{"keyboard": [[' + "9" * 5000 + "]]}", [], 2, "too many digits"),
    (
        "1.png,a room,a.json",
        None,
        ["-o", "config=universal", "-o", "num_chunks=3", "-o", "weights=nowhere"],
        1,
        "Matrix-Game-2.0 weights not found in nowhere",
    ),
]


@pytest.mark.parametrize(("row", "actions", "extra", "code", "needle"), BAD)
def test_matrix_game_bad_inputs_are_one_line_errors(
    tmp_path, inputs, row, actions, extra, code, needle
):
    inputs(tmp_path)
    if actions is not None:
        (tmp_path / "a.json").write_text(actions)
    first = BAD.index((row, actions, extra, code, needle)) == 0  # the installed jbkv too
    r = refused("generate", *TINY, *extra, "--cases", cases(tmp_path, row), "--out", "run",
                cwd=tmp_path, installed=first)  # fmt: skip
    one_line_error(r, needle, code)
    assert not (tmp_path / "run").exists()


def test_matrix_game_profile_heads_reads_cases(tmp_path, inputs):
    """profile-heads --cases: the heads profiled on an image + actions case, the profile's
    command line naming the case file (what forcing-kv then reads)."""
    inputs(tmp_path)
    r = invoke("profile-heads", *TINY, "--cases", cases(tmp_path), "--out", "prof.json",
               cwd=tmp_path)  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "prof.json").read_text())
    assert doc["model"] == "matrix-game-2" and "--cases" in doc["command"]
    assert len(doc["layers"]) == 2 and doc["calls"] > 0
    assert sum(doc["counts"].values()) == 4  # 2 blocks x 2 heads, each static or dynamic
