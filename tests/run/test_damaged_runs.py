"""Damaged run files: what every reader does with them, and what a resumed run makes again.

Policy (``jbkv_cli/run/directory.py``): a damaged manifest, ``variant.json`` or ``vbench.json`` stops the
command (exit 1, one line naming the file and the field); a damaged video record makes that
video unfinished and a damaged score makes it unscored, each with one warning naming the file
and the field, and a resumed run (or ``report --score``) makes or scores it again.

- Hypothesis (derandomized: the same examples on every run) damages one file of a finished run
  at a time, bytes or one field at a time set to a hostile value, and reads the run as every
  command does (table, JSON, drift, HTML page, the list of pairs to score, the gate): never
  anything but a one-line error or warnings naming the damaged file.
- The cases of the issue through the installed ``jbkv``: ``"psnr": "x"``, ``1e308``,
  ``"frames": "abc"``, on ``report`` (every format), ``report --score`` and a resumed
  ``quantize-eval``, which makes and scores again what was damaged and writes its report.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jbkv_cli.report.drift import drift_series
from jbkv_cli.report.gate import check_baseline, parse_tolerances
from jbkv_cli.report.html import render_page
from jbkv_cli.report.table import build_rows, to_json
from jbkv_cli.run import directory as runs_module
from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.experiment import Scoring
from jbkv_cli.utils.errors import JbkvError
from tests.installed import run_in_process, run_jbkv, run_refusal

pytestmark = pytest.mark.slow

NAME = "a red circle moves right on a dark background-0"  # a video of conftest's tiny_run
INT2 = "int2-rtn-g32"
LEGACY = "int4-rtn-g32"  # its scores are moved into one file, as older runs kept them
VBENCH = {
    "settings": {"mode": "long_custom_input"},
    "variants": {
        INT2: {
            "dimensions": {"temporal_flickering": {"score": 0.97, "se": 0.01, "n_videos": 2}},
            "totals": {"quality": 0.8, "quality_se": None, "semantic": None, "total": None},
        }
    },
}
TARGETS = (
    "manifest.json",
    "videos/reference/variant.json",
    f"videos/reference/{NAME}.json",
    f"videos/{INT2}/{NAME}.json",
    f"metrics/fidelity/{INT2}/{NAME}.json",
    f"metrics/fidelity/{LEGACY}.json",
    f"metrics/prompt/{INT2}/{NAME}.json",
    f"metrics/floor/reference/{NAME}.json",  # written by ``sample`` (tiny_run has one seed)
    "metrics/vbench.json",
)


def _with_legacy_scores(run: Path) -> None:
    """Turn one variant's per-video score files into the single file older runs wrote."""
    folder = run / "metrics" / "fidelity" / LEGACY
    if not folder.is_dir():  # a run made before per-video files: it has the old file already
        return
    scores = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    (run / "metrics" / "fidelity" / f"{LEGACY}.json").write_text(json.dumps(scores, indent=2))
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def sample(tiny_run, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """A copy of the finished tiny run with a legacy score file and a VBench result, and the
    gate baseline made from it intact."""
    run = tmp_path_factory.mktemp("damaged") / "tiny"
    shutil.copytree(tiny_run, run)
    _with_legacy_scores(run)
    (run / "metrics" / "vbench.json").write_text(json.dumps(VBENCH))
    floor = json.loads((run / "metrics" / "fidelity" / INT2 / f"{NAME}.json").read_text())
    (run / "metrics" / "floor" / "reference").mkdir(parents=True)
    floor_entry = {**floor, "against": NAME}  # a floor's shape (its values do not matter here)
    (run / "metrics" / "floor" / "reference" / f"{NAME}.json").write_text(json.dumps(floor_entry))
    opened = RunDir.open(run)
    return run, to_json(opened, build_rows(opened))


def _read_everything(run: Path, baseline: dict[str, Any]) -> None:
    """What report (every format), the HTML page, resume planning and the gate read."""
    opened = RunDir.open(run)
    rows = build_rows(opened)
    data = to_json(opened, rows)
    drift_series(opened, rows)
    render_page(opened, data, run / "report")
    Scoring(opened, lpips=False).missing()
    check_baseline(data, baseline, parse_tolerances(None))


HOSTILE = st.sampled_from(
    [
        *("x", "", "abc", 1e308, -1e308, float("nan"), float("inf"), 10**400, 2**70),
        *(-5, 0, 3.5, True, None, [], {}, [1e308], ["a"], {"a": 1}, [0, 0, 0, 0]),
    ]
)
BYTES = st.tuples(
    st.integers(min_value=0, max_value=4000),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _leaves(data: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Key paths into ``data`` (dict keys and the first list item), at most 4 deep."""
    out = [prefix] if prefix else []
    if depth >= 4:
        return out
    if isinstance(data, dict):
        for key in list(data)[:30]:
            out += _leaves(data[key], (*prefix, key), depth + 1)
    elif isinstance(data, list) and data:
        out += _leaves(data[0], (*prefix, 0), depth + 1)
    return out


def _set(data: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _damaged_bytes(original: bytes, damage: tuple, pick: int, value: Any) -> bytes:
    kind, (cut, flips) = damage
    if kind == "field":
        data = json.loads(original)
        paths = _leaves(data)
        return json.dumps(_set(data, paths[pick % len(paths)], value)).encode()
    out = bytearray(original[: max(0, len(original) - cut % (len(original) + 1))])
    for pos, byte in flips:
        if out:
            out[pos % len(out)] ^= byte or 1
    return bytes(out)


@pytest.mark.parametrize("target", TARGETS)
def test_an_int_beyond_a_floats_range_in_any_field_is_named(sample, target):
    """Every field of every run file, one at a time, set to 10**400 (json parses it as an int;
    math.isfinite raises OverflowError on it): never an exception other than one-line JbkvError.
    The fuzz below found this once; this sweep makes it a fixed case."""
    run, baseline = sample
    path = run / target
    original = path.read_bytes()
    data = json.loads(original)
    real_warn = runs_module.warn
    runs_module.warn = lambda message: None
    try:
        for leaf in _leaves(data):
            path.write_bytes(json.dumps(_set(data, leaf, 10**400)).encode())
            try:
                _read_everything(run, baseline)
            except JbkvError as exc:
                assert "\n" not in str(exc) and str(path) in str(exc), (leaf, str(exc))
    finally:
        runs_module.warn = real_warn
        path.write_bytes(original)


@FUZZ
@given(
    target=st.sampled_from(TARGETS),
    damage=st.tuples(st.sampled_from(["field", "field", "bytes"]), BYTES),
    pick=st.integers(0, 10**6),
    value=HOSTILE,
)
def test_every_reader_on_a_damaged_run_file(sample, target, damage, pick, value):
    run, baseline = sample
    path = run / target
    assume(path.is_file())  # every target exists in a run of this version
    original = path.read_bytes()
    warnings: list[str] = []
    real_warn = getattr(runs_module, "warn", None)  # (a version that warned about nothing)
    runs_module.warn = warnings.append
    try:
        path.write_bytes(_damaged_bytes(original, damage, pick, value))
        try:
            _read_everything(run, baseline)
        except JbkvError as exc:
            message = str(exc)
            assert "\n" not in message and str(path) in message, message
        for w in warnings:
            assert "\n" not in w and str(path) in w, w
    finally:
        runs_module.warn = real_warn
        path.write_bytes(original)
        shutil.rmtree(run / "report", ignore_errors=True)


# --- through the installed jbkv ------------------------------------------------------------------


_jbkv = run_jbkv


def _messages(stderr: str, kind: str) -> list[str]:
    """``kind:`` lines of stderr, each with the lines Rich wrapped it onto joined back."""
    out: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(f"{kind}:"):
            out.append(line)
        elif out and line and not line.split(":", 1)[0].isalpha():
            out[-1] += line
    return [m for m in out if m.startswith(f"{kind}:")]


def _edit(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


@pytest.fixture
def copied(tiny_run, tmp_path) -> Path:
    run = tmp_path / "out" / "tiny"
    shutil.copytree(tiny_run, run)
    return run


DAMAGE = [
    ("score", {"psnr": "x"}, "'psnr' is not a number in [0, 100] (got 'x')"),
    ("score", {"psnr": 1e308}, "'psnr' is not a number in [0, 100] (got 1e+308)"),
    ("score", {"psnr_per_chunk": "abc"}, "'psnr_per_chunk' is not a list of numbers"),
    ("prompt", {"valid_per_chunk": "abc"}, "'valid_per_chunk' is not a list of true/false"),
    ("prompt", {"valid_per_chunk": [1, 0]}, "'valid_per_chunk' is not a list of true/false"),
    ("prompt", {"chunk_frames": 0}, "'chunk_frames' is not an integer in [1, "),
    ("prompt", {"check_version": 0}, "'check_version' is not an integer in [1, "),
    ("record", {"frames": "abc"}, "'frames' is not a list of 4 frame dimensions (got 'abc')"),
    ("record", {"kv_cache_bytes": 1e308}, "'kv_cache_bytes' is not a byte count"),
    ("record", {"delta_ps_samples": [1e308]}, "'delta_ps_samples' is not a list of numbers"),
]


def _damaged_file(run: Path, which: str) -> Path:
    if which in ("score", "prompt"):
        kind = "fidelity" if which == "score" else "prompt"
        return run / "metrics" / kind / INT2 / f"{NAME}.json"
    return run / "videos" / INT2 / f"{NAME}.json"


@pytest.mark.parametrize(("which", "fields", "needle"), DAMAGE)
def test_report_names_the_damaged_file_and_field_in_every_format(copied, which, fields, needle):
    path = _damaged_file(copied, which)
    _edit(path, **fields)
    # each file kind's first case in every format (a format reads the files it needs once:
    # one warning each), the other fields' checks in one; the same app in this process, the
    # first case's table installed too
    first = next(f for w, f, _ in DAMAGE if w == which) == fields
    formats = ("json", "table", "html", "csv", "md") if first else ("json",)
    for fmt in formats:
        installed = fmt == "table" and fields == DAMAGE[0][1]
        r = run_refusal("report", copied, "--format", fmt, cwd=copied.parent, installed=installed)
        assert r.returncode == 0, (fmt, r.stderr)
        assert "Traceback" not in r.stderr and "Error:" not in r.stderr, r.stderr
        damaged = [w for w in _messages(r.stderr, "warning") if str(path) in w]
        assert len(damaged) == 1 and needle in damaged[0], (fmt, r.stderr)
        expected = "not finished" if which == "record" else "scored again"
        assert expected in damaged[0]
        if fmt == "json":
            data = json.loads(r.stdout)
    row = next(r for r in data["rows"] if r["variant"] == INT2)
    assert row["videos"] == (1 if which == "record" else 2)
    # the damaged score, or the unfinished video's, is left out; a damaged prompt check leaves
    # the scores and drops the video from the still-valid fraction
    assert row["psnr"]["n"] == (2 if which == "prompt" else 1)
    if which == "prompt":
        horizon = next(v for v in data["horizon"]["variants"] if v["variant"] == INT2)
        assert horizon["still_valid"][0]["n"] == 1


def test_a_fifo_in_place_of_a_record_or_a_score_is_named_not_read(copied):
    """A FIFO blocks a reader that opens it; jbkv reads only regular files (jsonio)."""
    import os

    for path in (_damaged_file(copied, "record"), _damaged_file(copied, "score")):
        path.unlink()
        os.mkfifo(path)
    r = run_jbkv("report", copied, cwd=copied)
    assert r.returncode == 0, r.stderr
    warned = [w for w in _messages(r.stderr, "warning") if "not a regular file (a FIFO)" in w]
    assert len(warned) == 2, r.stderr


def test_report_score_scores_a_damaged_entry_again(copied):
    path = _damaged_file(copied, "score")
    good = json.loads(path.read_text())
    _edit(path, psnr="x")
    r = run_in_process(
        "report", copied, "--score", "--no-lpips", "--format", "json", cwd=copied.parent
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(path.read_text()) == good
    again = run_in_process("report", copied, cwd=copied.parent)
    assert again.returncode == 0 and not [
        w for w in _messages(again.stderr, "warning") if str(path) in w
    ]


def test_a_resumed_quantize_eval_remakes_and_rescores_what_was_damaged(copied, tiny_run):
    """The issue's end-of-run failure: ``quantize-eval`` resumed on a run with a damaged score
    and a damaged record remakes that video, scores both again and writes its report."""
    record = _damaged_file(copied, "record")
    other = copied / "metrics" / "fidelity" / "int4-rtn-g32" / f"{NAME}.json"
    good_record, good_score = json.loads(record.read_text()), json.loads(other.read_text())
    _edit(record, frames="abc")
    _edit(other, psnr=1e308)
    prompts = copied.parent.parent / "p.txt"
    made = json.loads((copied / "manifest.json").read_text())["prompts"]
    prompts.write_text("\n".join(made) + "\n")
    args = ["quantize-eval", "--prompts", prompts, "--seeds", "0", "--bits", "2,4"]
    args += ["--quantizers", "rtn", "--corrections", "none,taylor", "--no-lpips", "--no-plots"]
    r = _jbkv(*args, "--out", copied.parent, "--json", copied.parent / "r.json", cwd=copied.parent)
    assert r.returncode == 0, r.stderr
    assert "1 videos generated, 9 already done" in r.stderr
    remade = json.loads(record.read_text())
    timing = {"seconds", "diagnostics_seconds"}
    assert {k: v for k, v in remade.items() if k not in timing} == {
        k: v for k, v in good_record.items() if k not in timing
    }
    assert json.loads(other.read_text()) == good_score
    rows = json.loads((copied.parent / "r.json").read_text())["rows"]
    assert all(row["videos"] == 2 for row in rows)
    assert all(row["psnr"]["n"] == 2 for row in rows if row["variant"] != "reference")
    assert (copied / "report" / "index.html").is_file()


@pytest.mark.parametrize(
    ("target", "fields", "needle"),
    [
        ("manifest.json", {"seeds": ["x"]}, "'seeds' is not a list of non-negative integers"),
        ("videos/reference/variant.json", {"bits": "x"}, "is not a jbkv variant"),
        (
            "metrics/vbench.json",
            {"variants": {INT2: {"dimensions": {"d": {"score": "x"}}}}},
            f"variants.{INT2}.dimensions.d: 'score' is not a number",
        ),
        (
            "metrics/vbench.json",
            {"variants": {INT2: {"dimensions": {"d": {"per_clip": {"v-0": [0.9, "x"]}}}}}},
            f"variants.{INT2}.dimensions.d: 'per_clip.v-0' is not a list of numbers or nulls",
        ),
    ],
)
def test_a_damaged_run_level_file_is_one_error_naming_it(copied, target, fields, needle):
    path = copied / target
    if not path.exists():
        path.write_text("{}")
    _edit(path, **fields)
    first = target == "manifest.json"  # through the installed jbkv too
    r = run_refusal("report", copied, cwd=copied.parent, installed=first)
    errors = _messages(r.stderr, "error")
    assert r.returncode == 1 and len(errors) == 1, r.stderr
    assert str(path) in errors[0] and needle in errors[0], errors


def test_gate_counts_against_the_baseline_after_a_reference_record_is_deleted(copied, tmp_path):
    baseline = tmp_path / "b.json"
    made = run_in_process("report", copied, "--format", "json", cwd=tmp_path)
    baseline.write_text(made.stdout)
    (copied / "videos" / "reference" / f"{NAME}.json").unlink()
    r = run_refusal("report", copied, "--baseline", baseline, cwd=tmp_path, installed=True)
    assert r.returncode == 1, r.stderr
    gate = _messages(r.stderr, "gate")
    assert "gate: reference: 1 of 2 videos generated" in gate, gate
    assert not [g for g in gate if "2 of 1" in g], gate
