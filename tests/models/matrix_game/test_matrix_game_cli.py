"""``-m matrix-game-2`` through the installed ``jbkv``: tiny-random generate with an INT2
corrected cache (action caches quantized, their bytes reported apart), quantize-eval, and
every bad input (actions file, image, length past the rotary table, released configs) as one
line on stderr, exit 2, with nothing created."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JBKV = str(Path(sys.executable).with_name("jbkv"))
TINY = ["-m", "matrix-game-2", "-o", "config=tiny-random"]


def jbkv(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "160", "OMP_NUM_THREADS": "1"}
    env.pop("JBKV_DEBUG", None)
    return subprocess.run(
        [JBKV, *map(str, args)], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
    )


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


def test_matrix_game_quantize_eval_table_lists_the_cache_split(tmp_path, inputs):
    inputs(tmp_path)
    r = jbkv("quantize-eval", *TINY, "-o", "quantize_actions=false", "--cases", cases(tmp_path),
             "--quantizers", "rtn", "--bits", "2", "--corrections", "none,taylor", "--no-lpips",
             "--no-plots", "--json", "rows.json", "--out", "qe", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    text = json.dumps(rows)
    assert "INT2 rtn g32 +taylor" in text and "kv_bytes_by_cache" in text
    assert "INT2 rtn g32 +taylor: KV" in r.stdout and "mouse" in r.stdout


def one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]


BAD = [
    # (case row, actions file text or None to keep the good one, extra options, needle);
    # the file format's other rules are checked in-process (test_matrix_game_actions.py)
    ("1.png,a room,a.json", '{"keyboard": [[1, 0, 0, 0]]}', [], "has 1 rows; the video has 33"),
    ("1.png,a room,a.json", None, ["-o", "num_chunks=400"], "past the rotary table"),
    ("1.png,a room,a.json", None, ["-o", "config=universal"], "config=universal needs"),
]


@pytest.mark.parametrize(("row", "actions", "extra", "needle"), BAD)
def test_matrix_game_bad_inputs_are_one_line_usage_errors(
    tmp_path, inputs, row, actions, extra, needle
):
    inputs(tmp_path)
    if actions is not None:
        (tmp_path / "a.json").write_text(actions)
    r = jbkv("generate", *TINY, *extra, "--cases", cases(tmp_path, row), "--out", "run",
             cwd=tmp_path)  # fmt: skip
    one_line_error(r, needle)
    assert not (tmp_path / "run").exists()
