"""QVG's cache policy from the command line: ``-M qvg.…`` options reach the cache, rows say
which K rule and layout applied, and bad values are one-line usage errors (installed ``jbkv``)."""

from __future__ import annotations

import json

import pytest

from tests.installed import run_jbkv, run_refusal
from tests.quant.conftest import SMALLEST

pytestmark = pytest.mark.slow


def test_quantize_eval_pre_and_post_rope_rows(quick_eval):
    rows = quick_eval(
        "--quantizers",
        "qvg",
        "--bits",
        "2",
        "--group-sizes",
        "64",
        "--corrections",
        "taylor",
        "-M",
        "qvg.layout=pre-rope",
    )
    assert list(rows) == ["reference", "int2-qvg-g64-prerope-taylor"]
    row = rows["int2-qvg-g64-prerope-taylor"]
    assert row["label"] == "INT2 qvg g64 K≤L/64 pre-RoPE +taylor"
    assert row["effective_bits"] == pytest.approx(2 + 8 / 64 + 8 / 64 + 16 * 4 / 256)


def test_quantize_eval_span_of_two_chunks_counts_the_waiting_chunk(quick_eval):
    """Two chunks (the embedded model commits both): with N = 2 the first waits, 16-bit, until
    the second completes its span, so the peak is one 16-bit chunk — half of the reference's
    two — not the quantized span (per chunk it would be ≈ 0.15 of it)."""
    rows = quick_eval(
        "--quantizers", "qvg", "--bits", "2", "--group-sizes", "64", "-M", "qvg.span_chunks=2"
    )
    row = rows["int2-qvg-g64-n2"]
    assert row["label"] == "INT2 qvg g64 K≤L/64 N2"
    assert row["kv_ratio"] == pytest.approx(0.5)
    # held after commit 1: one chunk waiting; after commit 2: both quantized -> 2 of 3
    assert row["compressed_share"] == pytest.approx(2 / 3)
    assert row["compression_mark"] == "compressed 66.6%"


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ("qvg.layout=sideways", "qvg.layout must be one of post-rope, pre-rope"),
        ("qvg.span_chunks=0", "qvg.span_chunks must be an integer in 1..4096"),
    ],
)
def test_bad_policy_options_are_usage_errors(tmp_path, option, match):
    first = option == "qvg.layout=sideways"  # through the installed jbkv too
    args = ("quantize-eval", "--quantizers", "qvg", "-M", option, "--out", tmp_path)
    result = run_refusal(*args, installed=first)
    assert result.returncode == 2, result.stderr
    assert match in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_spans_with_a_pruner_are_a_usage_error(tmp_path):
    result = run_jbkv(
        "quantize-eval",
        "--quantizers",
        "qvg",
        "--pruners",
        "forcing-kv",
        "-M",
        "qvg.span_chunks=2",
        "--out",
        tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "not implemented for pruned caches" in result.stderr
    assert not any(tmp_path.iterdir())


def test_a_model_without_pre_rope_support_refuses_pre_rope_keys():
    from jbkv_cli.kvcache import KVSpec, layer_caches
    from jbkv_cli.models.contract import VideoModelBase, resolve_spec
    from jbkv_cli.utils.errors import UsageError

    class Other(VideoModelBase):  # a model adapter that keeps the default ``pre_rope``
        name = "magi1"

    spec = KVSpec.build("qvg", 2, 64, layout="pre-rope")
    with pytest.raises(UsageError, match="cannot cache keys before RoPE"):
        resolve_spec(Other(), spec)
    assert resolve_spec(Other(), KVSpec.build("qvg", 2, 64)).key_layout == "post-rope"
    with pytest.raises(ValueError, match="caches keys before RoPE"):
        layer_caches(spec, None, model="magi1", layers=1, kv_heads=1, frame_tokens=4)


def test_a_span_that_never_fills_is_a_no_op_said_everywhere(tmp_path):
    """Two chunks, spans of 4: QVG compresses nothing. The installed ``quantize-eval`` warns on
    stderr (one line, before it generates), marks the row in the table, ``table.md``, the HTML
    page and the JSON, and the gate fails it; rtn's row, all of it compressed, has no mark."""
    out = tmp_path / "runs"
    argv = ["quantize-eval", "--quantizers", "rtn,qvg", "--bits", "2"]
    argv += ["--corrections", "none", "-M", "qvg.span_chunks=4", *SMALLEST]
    argv += ["--out", str(out), "--json", str(tmp_path / "r.json")]
    result = run_jbkv(*argv)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "compress nothing" in line]
    assert warned == [
        "warning: INT2 qvg g64 K≤L/64 N4 on tiny will compress nothing: its first span of 4 "
        "chunk(s) is compressed at commit 4, the video commits at most 2; its row will be "
        "marked no-op"
    ]
    assert result.stderr.index(warned[0]) < result.stderr.index("videos generated")
    rows = {r["variant"]: r for r in json.loads((tmp_path / "r.json").read_text())["rows"]}
    noop, rtn = rows["int2-qvg-g64-n4"], rows["int2-rtn-g32"]
    assert (noop["compressed_share"], noop["compression_mark"]) == (
        0.0,
        "no-op: nothing compressed",
    )
    assert (rtn["compressed_share"], rtn["compression_mark"]) == (1.0, None)
    assert rows["reference"]["compressed_share"] is None
    labelled = "INT2 qvg g64 K≤L/64 N4 [no-op: nothing compressed]"
    assert labelled in result.stdout and "INT2 rtn g32 [" not in result.stdout
    report = out / "tiny" / "report"
    assert labelled in (report / "table.md").read_text()
    assert '<tr class="noop" data-variant="int2-qvg-g64-n4">' in (report / "index.html").read_text()
    gate = run_jbkv("report", out / "tiny", "--baseline", tmp_path / "r.json", timeout=300)
    assert gate.returncode == 1
    assert "int2-qvg-g64-n4: no-op: nothing compressed" in gate.stderr
