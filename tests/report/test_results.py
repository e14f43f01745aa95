"""jbkv_cli/report/results.py: what a row says about the compression it did (kvcache/coverage.py)."""

from __future__ import annotations

import pytest

from jbkv_cli.report.results import ResultRow, percent

BASE = dict(
    variant="int2-qvg-g64",
    label="INT2 qvg g64",
    quantizer="qvg",
    bits=2,
    group_size=64,
    effective_bits=2.6,
    corrected=False,
    correction="none",
    keys=True,
    values=True,
    bias_only=False,
    videos=1,
)


@pytest.mark.parametrize(
    ("share", "mark"),
    [
        (1.0, None),
        (None, None),  # not recorded (a run made before jbkv recorded it)
        (0.0, "no-op: nothing compressed"),
        (0.625, "compressed 62.5%"),
        (2 / 3, "compressed 66.6%"),
        (0.99996, "compressed 99.9%"),  # never rounded up to a full cache
        (0.0004, "compressed <0.1%"),  # never rounded down to a no-op
    ],
)
def test_a_row_marks_what_it_did_not_compress(share, mark):
    row = ResultRow(**BASE, compressed_share=share)
    assert row.compression_mark == mark
    assert row.no_op == (share == 0.0)
    data = row.to_dict()
    assert data["compression_mark"] == mark and data["compressed_share"] == share
    assert ResultRow.from_dict(data) == row


def test_pruners_and_ablations():
    unpruned = ResultRow(**BASE, compressed_share=1.0, pruner="forcing-kv", pruned_share=0.0)
    assert unpruned.no_op and unpruned.compression_mark == "no-op: nothing pruned"
    pruned = ResultRow(**BASE, compressed_share=0.5, pruner="forcing-kv", pruned_share=0.4)
    assert not pruned.no_op and pruned.compression_mark == "compressed 50%"
    bias_only = ResultRow(**(BASE | {"bias_only": True}), compressed_share=0.0)
    assert not bias_only.no_op and bias_only.compression_mark is None  # exact by design
    for bad in (-0.1, 1.5, "all", float("nan")):
        assert ResultRow.from_dict({**BASE, "compressed_share": bad}).compressed_share is None


def test_percent():
    assert [percent(x) for x in (0.0, 0.5, 1.0, 0.1234)] == ["0%", "50%", "100%", "12.3%"]


def test_the_csv_names_each_variant_s_widths():
    import csv
    import io

    from jbkv_cli.report.table import to_csv

    rows = [
        ResultRow(**BASE),
        ResultRow(**(BASE | {"variant": "kint4-qvg-g64-vint2-qvg-g64", "bits": 4}), value_bits=2),
        ResultRow(
            **(BASE | {"variant": "qvg-g64-K2V2@0-1+K2V1@2-"}), layer_bits="K2V2@0-1+K2V1@2-"
        ),
    ]
    table = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert [(r["bits"], r["value_bits"], r["layer_bits"]) for r in table] == [
        ("2", "", ""),
        ("4", "2", ""),
        ("2", "", "K2V2@0-1+K2V1@2-"),
    ]
