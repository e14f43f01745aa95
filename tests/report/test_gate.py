"""The regression gate passes only when it compared something real (jbkv_cli/report/gate.py)."""

from __future__ import annotations

import copy
import json
import math

import pytest

from jbkv_cli.report.gate import check_baseline, load_baseline, parse_tolerances
from jbkv_cli.utils.errors import JbkvError, UsageError

VIDEOS = [["a red circle", 0], ["a red circle", 1], ["a blue square", 0], ["a blue square", 1]]


def _metric(mean: float, n: int = 4) -> dict:
    return {"mean": mean, "se": 0.1, "n": n}


def _row(vid: str, psnr: float | None, dps: float | None = 0.01) -> dict:
    ref = vid == "reference"
    return {
        "variant": vid,
        "psnr": None if ref else _metric(psnr),
        "ssim": None if ref else _metric(0.9),
        "lpips": None,
        "delta_ps": None if ref or dps is None else _metric(dps),
        "videos": 4,
    }


RESULT = {
    "model": "tiny",
    "settings": {"num_chunks": 8, "steps": 4, "device": "cpu"},
    "videos": VIDEOS,
    "rows": [_row("reference", None), _row("int4-rtn-g32", 50.0), _row("int2-rtn-g32", 36.0, 0.05)],
}
TOL = parse_tolerances(None)


def _changed(**edits) -> dict:
    data = copy.deepcopy(RESULT)
    data.update(edits)
    return data


def test_identical_result_passes_and_says_what_it_compared():
    gate = check_baseline(RESULT, RESULT, TOL)
    assert gate.passed, gate.problems
    assert gate.summary() == "2 variants × 4 videos, psnr/ssim/delta_ps"


@pytest.mark.parametrize(
    ("baseline", "needle"),
    [
        (_changed(rows=[]), "no quantized variant"),
        (_changed(rows=[_row("reference", None)]), "no quantized variant"),
        (_changed(model="magi1"), "model 'tiny', baseline 'magi1'"),
        (_changed(settings={"num_chunks": 4, "steps": 4, "device": "cpu"}), "num_chunks 8"),
        (_changed(videos=VIDEOS[:3]), "videos not in the baseline"),
        (_changed(videos=[*VIDEOS, ["a green circle", 0]]), "videos missing"),
        (_changed(rows=[*RESULT["rows"], _row("int3-rtn-g32", 40.0)]), "variants missing"),
        (_changed(rows=RESULT["rows"][:2]), "variants not in the baseline: int2-rtn-g32"),
        (
            _changed(
                rows=[_row("reference", None), _row("int4-rtn-g32", 51.0), _row("int2-rtn-g32", 37)]
            ),
            "int4-rtn-g32: psnr 50.0000 vs baseline 51.0000",
        ),
        (
            _changed(rows=[*RESULT["rows"][:2], _row("int2-rtn-g32", 36.0, 0.03)]),
            "|ΔP_S| 0.0500 vs baseline 0.0300",
        ),
    ],
)
def test_gate_fails_naming_what_differs(baseline, needle):
    gate = check_baseline(RESULT, baseline, TOL)
    assert not gate.passed
    assert any(needle in p for p in gate.problems), gate.problems


def test_incomplete_variant_fails():
    current = copy.deepcopy(RESULT)
    current["rows"][2]["videos"] = 3
    current["rows"][2]["psnr"]["n"] = 3
    gate = check_baseline(current, RESULT, TOL)
    assert gate.problems == ["int2-rtn-g32: 3 of 4 videos generated, 3 scored"]


def test_counts_are_against_the_baseline_never_more_of_fewer():
    """Issue 22: with one reference record deleted the gate said ``2 of 1 videos generated``
    (it counted against the run's reference videos). Counts are against the baseline's."""
    current = copy.deepcopy(RESULT)
    current["videos"] = VIDEOS[1:]
    current["rows"][0]["videos"] = 3
    gate = check_baseline(current, RESULT, TOL)
    assert "reference: 3 of 4 videos generated" in gate.problems, gate.problems
    assert not [p for p in gate.problems if "of 3" in p], gate.problems  # variants: 4 of 4
    more = copy.deepcopy(RESULT)
    more["rows"][1]["videos"] = 5
    gate = check_baseline(more, RESULT, TOL)
    assert gate.problems == ["int4-rtn-g32: 5 videos generated, 4 scored, the baseline has 4"]


def test_a_variant_with_no_comparable_metric_fails():
    empty = _changed(
        rows=[
            _row("reference", None),
            {**_row("int4-rtn-g32", 1.0), "psnr": None, "ssim": None, "delta_ps": None},
        ]
    )
    current = _changed(rows=[_row("reference", None), _row("int4-rtn-g32", 50.0)])
    gate = check_baseline(current, empty, TOL)
    assert any("no metric to compare" in p for p in gate.problems)


def test_lpips_missing_in_the_run_but_present_in_the_baseline_fails():
    baseline = copy.deepcopy(RESULT)
    baseline["rows"][1]["lpips"] = _metric(0.01)
    gate = check_baseline(RESULT, baseline, TOL)
    assert gate.problems == ["int4-rtn-g32: lpips missing (baseline 0.0100)"]


def _shares(result: dict, **rows: dict) -> dict:
    """``result`` with fields set on rows by variant (underscores for dashes)."""
    data = copy.deepcopy(result)
    for row in data["rows"]:
        row.update(rows.get(row["variant"].replace("-", "_"), {}))
    return data


def test_a_no_op_variant_fails_even_against_a_baseline_with_the_same_no_op():
    """A variant whose method compressed none of what its caches held, or whose pruner dropped
    nothing, fails the gate by its mark: its row would read as compression that did not
    happen (kvcache/coverage.py)."""
    noop = _shares(RESULT, int2_rtn_g32={"quantizer": "qvg", "compressed_share": 0.0})
    gate = check_baseline(noop, noop, TOL)
    assert gate.problems == [
        "int2-rtn-g32: no-op: nothing compressed: its row would read as compression that did "
        "not happen"
    ]
    unpruned = _shares(
        RESULT,
        int4_rtn_g32={"quantizer": "rtn", "compressed_share": 1.0},
        int2_rtn_g32={"pruner": "forcing-kv", "pruned_share": 0.0, "compressed_share": 1.0},
    )
    assert [p.split(":")[:2] for p in check_baseline(unpruned, unpruned, TOL).problems] == [
        ["int2-rtn-g32", " no-op"]
    ]
    bias_only = _shares(RESULT, int2_rtn_g32={"bias_only": True, "compressed_share": None})
    assert check_baseline(bias_only, bias_only, TOL).passed  # exact by design: not a no-op


def test_compressing_less_of_the_cache_than_the_baseline_fails():
    full = _shares(RESULT, int2_rtn_g32={"quantizer": "kivi", "compressed_share": 0.75})
    less = _shares(RESULT, int2_rtn_g32={"quantizer": "kivi", "compressed_share": 0.5})
    assert check_baseline(full, full, TOL).passed
    assert check_baseline(less, full, TOL).problems == [
        "int2-rtn-g32: compressed 50% of what it held, baseline 75%"
    ]
    assert check_baseline(full, less, TOL).passed  # more than the baseline: fine
    assert check_baseline(less, RESULT, TOL).passed  # a baseline made before it was recorded


def test_within_tolerance_passes():
    better_baseline = _changed(
        rows=[
            _row("reference", None),
            _row("int4-rtn-g32", 50.4),
            _row("int2-rtn-g32", 36.3, 0.045),
        ]
    )
    assert check_baseline(RESULT, better_baseline, TOL).passed


@pytest.mark.parametrize("text", ["psnr=nan", "psnr=inf", "ssim=-0.1", "psnr", "foo=1", "psnr=x"])
def test_bad_tolerances_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_tolerances(text)


def test_tolerances_parse():
    tol = parse_tolerances("psnr=1.5, delta_ps=0")
    assert tol["psnr"] == 1.5 and tol["delta_ps"] == 0 and math.isclose(tol["ssim"], 0.01)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[]", "not a JSON object"),
        ('{"rows": []}', "no 'model'"),
        ('{"model": "tiny", "settings": {}, "rows": []}', "no 'videos'"),
        ('{"model": "tiny", "settings": {}, "videos": [["a", "0"]], "rows": []}', "no 'videos'"),
        ('{"model": "tiny", "settings": {}, "videos": [], "rows": [3]}', "no 'rows'"),
        (
            '{"model": "tiny", "settings": {}, "videos": [], "rows": [{"videos": 1}]}',
            "no 'variant'",
        ),
        (
            '{"model": "t", "settings": {}, "videos": [], "rows": [{"variant": "x", "videos": 1, "psnr": 3}]}',
            "psnr is not",
        ),
        (
            '{"model": "t", "settings": {}, "videos": [], "rows": [{"variant": "x", "videos": 1, "psnr": {"mean": NaN}}]}',
            "psnr is not",
        ),
        ('{"model": "tiny",', "cannot read baseline"),
        (b"\xff\xfe\x00", "cannot read baseline"),
    ],
)
def test_malformed_baselines_are_one_line_errors(tmp_path, content, needle):
    path = tmp_path / "b.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(JbkvError) as info:
        load_baseline(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_valid_baseline_loads(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(RESULT))
    assert load_baseline(path) == RESULT
