"""The measured bias (``jbkv_cli/attention/partition.py``) and where it is recorded: per observed
call and layer in the recorder, mean ± SE per variant in the rows, the table and the page."""

from __future__ import annotations

import math

import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.attention.correction import taylor_bias
from jbkv_cli.attention.partition import log_partition_shift, partition_summary
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.kvcache.layers import layer_caches
from jbkv_cli.quant import quantize_kv
from jbkv_cli.report.results import ResultRow, Stat
from jbkv_cli.report.table import table_cells


def test_shift_and_prediction_by_hand():
    s_ref = torch.tensor([[0.0, 1.0, 2.0]])
    s_hat = torch.tensor([[0.5, 1.0, 2.5]])
    added = torch.tensor([[-0.5, 0.0, -0.5]])  # exactly what the stored keys added
    shift, predicted = log_partition_shift(s_hat, s_ref, added)
    lse = lambda x: math.log(sum(math.exp(v) for v in x))  # noqa: E731
    assert abs(float(shift) - (lse([0.5, 1.0, 2.5]) - lse([0, 1, 2]))) < 1e-6
    assert torch.allclose(predicted, shift)  # a correction that undoes it predicts it all
    shift0, none = log_partition_shift(s_hat, s_ref)
    assert torch.equal(shift0, shift) and float(none) == 0.0
    drop = torch.tensor([[0.0, float("-inf"), 0.0]])  # a pruned token counts in neither
    kept, _ = log_partition_shift(s_hat, s_ref, dropped=drop)
    assert abs(float(kept) - (lse([0.5, 2.5]) - lse([0, 2]))) < 1e-6


def test_summary_means_and_ratio():
    got = partition_summary([(0, 0.2, 0.1), (1, 0.4, 0.5)])
    assert abs(got["lp_shift"] - 0.3) < 1e-12 and abs(got["lp_predicted"] - 0.3) < 1e-12
    assert abs(got["lp_left"]) < 1e-12 and abs(got["lp_ratio"] - 1.0) < 1e-12
    assert partition_summary([])["lp_ratio"] is None
    assert partition_summary([(0, 0.0, 0.1)])["lp_ratio"] is None  # no shift: no ratio


def test_recorder_keeps_each_call_with_its_layer_and_the_active_prediction():
    g = torch.Generator().manual_seed(0)
    spec = KVSpec.build("rtn", 2, correction="taylor")
    rec = AttentionRecorder(max_queries=16, every=1)
    caches = layer_caches(spec, None, model="t", layers=3, kv_heads=1, frame_tokens=4, observer=rec)
    k, v = torch.randn(1, 1, 64, 32, generator=g), torch.randn(1, 1, 64, 32, generator=g)
    q = torch.randn(1, 1, 16, 32, generator=g) * 2
    for cache in caches:
        cache.commit(k, v)
        cache.attend(q, k[..., :16, :], v[..., :16, :], 0.25)
    assert [layer for layer, _, _ in rec.partition] == [0, 1, 2]
    stored = quantize_kv(k, 2, 32)
    s_hat = 0.25 * q @ stored.dequantize().transpose(-1, -2)
    shift, predicted = log_partition_shift(
        s_hat, 0.25 * q @ k.transpose(-1, -2), -taylor_bias(q, stored.step, 0.25)
    )
    _, got_shift, got_predicted = rec.partition[0]
    assert abs(got_shift - float(shift.mean())) < 1e-5
    assert abs(got_predicted - float(predicted.mean())) < 1e-5 and got_predicted > 0
    summary = rec.summary()
    assert abs(summary["lp_left"] - (summary["lp_shift"] - summary["lp_predicted"])) < 1e-9


def test_the_table_shows_the_measured_shift_and_the_ratio():
    base = dict(quantizer="rtn", bits=2, group_size=32, effective_bits=2.75, keys=True)
    row = ResultRow(
        variant="int2-rtn-g32-taylor",
        label="INT2 rtn g32 +taylor",
        corrected=True,
        correction="taylor",
        values=True,
        bias_only=False,
        lp_shift=Stat(0.5341, 0.01, 10),
        lp_ratio=Stat(0.81, 0.02, 10),
        **base,
    )
    cols, cells, _ = table_cells([row])
    shown = dict(zip(cols, cells[0], strict=True))
    assert shown["Δlog Z"] == "+0.5341 ± 0.0100" and shown["pred/Δ"] == "+0.81"
    assert ResultRow.from_dict(row.to_dict()) == row


def test_the_html_page_has_the_measured_bias_per_variant():
    """The page's "measured bias" table: Δlog Z, predicted, left (mean ± SE) and the ratio per
    variant that recorded them; a variant without (the reference) is not listed."""
    from jbkv_cli.report.html import _partition

    base = dict(quantizer="rtn", bits=2, group_size=32, effective_bits=2.75, keys=True)
    row = ResultRow(
        variant="int2-rtn-g32-signed",
        label="INT2 rtn g32 +signed",
        corrected=True,
        correction="signed",
        values=True,
        bias_only=False,
        lp_shift=Stat(0.5341, 0.01, 10),
        lp_predicted=Stat(0.5, 0.02, 10),
        lp_left=Stat(0.0341, 0.003, 10),
        lp_ratio=Stat(0.94, 0.02, 10),
        **base,
    )
    ref = ResultRow(variant="reference", label="16-bit reference", corrected=False,
                    correction="none", values=True, bias_only=False, **base)  # fmt: skip
    page = _partition([ref, row])
    assert 'id="partition"' in page and page.count("<tr>") == 2  # header + one variant
    for cell in ("+0.5341 ± 0.0100", "+0.5000 ± 0.0200", "+0.0341 ± 0.0030", "+0.94 ± 0.02"):
        assert f"<td>{cell}</td>" in page
    assert "reference" not in page and _partition([ref]) == ""
