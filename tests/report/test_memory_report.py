"""The three memory numbers and the bias share, from the tiny run's records to the rows, the
JSON, the tables, the HTML page (sections and heatmap) and the gate."""

from __future__ import annotations

import copy

import pytest

from jbkv_cli.report.gate import check_baseline, parse_tolerances
from jbkv_cli.report.html import render_page
from jbkv_cli.report.table import build_rows, to_json, to_markdown
from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.schema import record_problem


@pytest.fixture(scope="module")
def result(tiny_run):
    run = RunDir.open(tiny_run)
    rows = build_rows(run)
    return run, rows, to_json(run, rows)


def test_rows_carry_stored_working_and_peak_bytes(result):
    _, rows, _ = result
    ref = next(r for r in rows if r.is_reference)
    assert ref.working_ratio == 1.0 and ref.bias_share is None
    for r in rows:
        assert r.kv_working_bytes > 0
        assert r.cuda_peak_bytes is None and r.cuda_resident_bytes is None  # no CUDA here
    int2 = [r for r in rows if r.bits == 2]
    # a read holds the dequantized window: above what the INT2 cache stores
    assert int2 and all(r.kv_working_bytes > 2 * r.kv_cache_bytes for r in int2)
    taylor = next(r for r in int2 if r.correction == "taylor")
    plain = next(r for r in int2 if r.correction == "none")
    assert taylor.kv_working_bytes > plain.kv_working_bytes  # the augmented channels


def test_records_count_reads_per_attention_path(result):
    """Each record says which path its reads took: on this CPU the rule's ``fused`` for every
    corrected read over quantized keys, ``plain`` for the rest."""
    run, rows, _ = result
    for r in rows:
        for record in run.records(r.variant):
            working = record["working_bytes"]
            paths = working["paths"]
            assert sum(paths.values()) == working["reads"] > 0
            assert set(paths) <= {"plain", "fused"}
            assert (paths.get("fused", 0) > 0) == (r.correction == "taylor"), (r.variant, paths)


def test_bias_share_per_variant_layer_and_head(result):
    _, rows, data = result
    for r in rows:
        if r.is_reference:
            continue
        assert 0 < r.bias_share.mean < 1.5 and r.bias_share.n == r.videos
        assert -1 < r.bias_explained.mean < 1
        layers = r.bias_share_by_layer
        assert layers and all(len(e["heads"]) > 0 for e in layers.values())
        # what the variant's correction removes of the keys' attention error, measured on the
        # same calls: none without a correction
        if r.corrected:
            assert -1 < r.correction_removed.mean < 1 and r.correction_removed.n == r.videos
            assert r.attn_err_corrected.mean > 0
            assert all(e["removed"] is not None for e in layers.values())
        else:
            assert r.correction_removed is None and r.attn_err_corrected is None
            assert all(e["removed"] is None for e in layers.values())
    run, _, _ = result
    record = run.records(next(r.variant for r in rows if r.bits == 2))[0]
    # each denoising step and the refresh pass of a chunk is a read since the layer's commit
    steps = {cell[1] for cell in record["attention_error"]["cells"]}
    assert steps == set(range(5))  # the embedded model: 4 Euler steps + the refresh pass
    json_rows = {row["variant"]: row for row in data["rows"]}
    assert all(
        "kv_working_bytes" in row and "bias_share_by_layer" in row for row in json_rows.values()
    )


def test_table_html_and_heatmap_show_them(result, tiny_run):
    run, rows, data = result
    table = to_markdown(rows)
    head = table.splitlines()[0]
    assert all(c in head for c in ("work MB", "peak MB", "bias share", "removed"))
    page = render_page(run, data, tiny_run / "report")
    assert "<h2>Memory</h2>" in page and "Where the attention error comes from" in page
    assert '<th scope="col">removed</th>' in page and "not a bound" in page
    assert (tiny_run / "report" / "attention_error.png").is_file()
    assert '<img src="attention_error.png"' in page


def test_gate_compares_working_bytes_relative(result):
    _, _, data = result
    tol = parse_tolerances(None)
    assert check_baseline(data, data, tol).passed
    current = copy.deepcopy(data)
    row = next(r for r in current["rows"] if r["variant"] != "reference")
    base = row["kv_working_bytes"]
    row["kv_working_bytes"] = int(base * 1.04)
    assert check_baseline(current, data, tol).passed  # 4 % more: within 5 %
    row["kv_working_bytes"] = int(base * 1.10)
    problems = check_baseline(current, data, tol).problems
    assert len(problems) == 1 and "kv_working_bytes" in problems[0]
    old = copy.deepcopy(data)  # a baseline made before working bytes were recorded
    for r in old["rows"]:
        r["kv_working_bytes"] = None
    assert check_baseline(current, old, tol).passed


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("working_bytes", {"read": -1}, "working_bytes.read"),
        ("working_bytes", {"read": 1, "paths": {"fused": -2}}, "working_bytes.paths"),
        ("working_bytes", {"read": 1, "paths": ["fused"]}, "working_bytes.paths"),
        ("cuda_memory", {"peak_bytes": 1.5}, "cuda_memory.peak_bytes"),
        ("attention_error", {"layers": [[0, 1.0, 1.0, 4, [1.0], [], 0.0]]}, "error.layers"),
        ("attention_error", {"layers": [], "cells": [[0, 0, 0, 0.0, 1.0, 1.0, 0.0]]}, "cells"),
        ("attention_error", {"layers": [[0, 1.0, 1.0, 4, [1.0], [1.0], 0.0, -1.0]]}, "layers"),
    ],
)
def test_damaged_memory_fields_are_named(field, value, named):
    record = {"prompt": "p", "seed": 0, "index": 0, "kv_cache_bytes": 1, "seconds": 1.0}
    assert record_problem(record) is None
    paths = {"working_bytes": {"read": 1, "paths": {"fused": 3, "plain": 1}}}
    assert record_problem(record | paths) is None  # and records from before paths, above
    for e_corr in ([], [None], [0.5]):  # records before E_corr, uncorrected, corrected
        layers = [[0, 1.0, 1.0, 4, [1.0], [1.0], 0.0, *e_corr]]
        assert record_problem(record | {"attention_error": {"layers": layers, "cells": []}}) is None
    assert named in record_problem(record | {field: value})
