"""What a cache held and stored compressed (``jbkv_cli/kvcache/coverage.py``): the count the
caches report under ``counting()``, the prediction from token counts alone (held to the count),
and the no-op cases the issue names (a span that never fills, a residual covering the cache, a
keep-recent guard evicting before quantizing, a pruner that keeps everything)."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.kvcache.coverage import Coverage, counting, noop_reason, predict
from jbkv_cli.prune import ForcingKVHistory
from jbkv_cli.prune import ForcingKVHistoryLayer as ForcingKVLayer
from jbkv_cli.quant.qvg import QVG

D = 64


def _commit_all(spec: KVSpec, commits: int, window: int | None, tokens: int) -> Coverage:
    cache = ChunkKVCache(spec, window)
    with counting() as held:
        for i in range(commits):
            g = torch.Generator().manual_seed(i)
            k, v = (torch.randn(1, 2, tokens, D, generator=g) for _ in range(2))
            cache.commit(k, v)
    return held


# (method, options, commits, window, tokens, sink chunks, compressed share)
CASES = [
    ("rtn", {}, 4, 2, 16, 0, 1.0),
    ("rtn", {}, 4, 2, 16, 1, (0 + 1 + 2 + 2) / (1 + 2 + 3 + 3)),  # sink exact, window of 2
    ("qvg", {"span_chunks": 8}, 7, None, 16, 0, 0.0),  # Self-Forcing's N = 8, 7 chunks
    ("qvg", {"span_chunks": 8}, 9, None, 16, 0, (8 + 8) / 45),  # the first span, at commit 8
    ("qvg", {"span_chunks": 2}, 5, 1, 16, 0, 2 / 5),  # HY-WorldPlay's N = 2, window 1
    # LingBot-v2's guards in a window of one finished chunk: quantized, then evicted at once
    ("qvg", {"span_chunks": 1, "keep_recent_chunks": 1, "sink_keep_chunks": 1}, 5, 1, 16, 0, 0.0),
    ("qvg", {"span_chunks": 1, "keep_recent_chunks": 1}, 4, 2, 16, 0, (0 + 1 + 1 + 1) / 7),
    ("kivi", {"residual": 128}, 4, 2, 64, 0, 0.0),  # the residual covers the whole window
    ("kivi", {"residual": 64}, 4, 3, 64, 0, (0 + 1 + 2 + 2) / (1 + 2 + 3 + 3)),
]


@pytest.mark.parametrize(
    ("name", "options", "commits", "window", "tokens", "sinks", "share"), CASES
)
def test_measured_share_is_the_predicted_one(name, options, commits, window, tokens, sinks, share):
    """Each case's compressed share is stated, counted from the stored tensors of a real cache,
    and predicted from the counts alone: all three agree (integer ratios: exact)."""
    spec = KVSpec.build(name, 2, 32 if name == "kivi" else 64, sink_chunks=sinks, **options)
    held = _commit_all(spec, commits, window, tokens)
    assert held.compressed / held.held == pytest.approx(share, abs=1e-12)
    assert predict(spec.key, commits, window, tokens, sinks) == pytest.approx(share, abs=1e-12)
    assert (noop_reason(spec.key, commits, window, tokens, sinks) is None) == (share > 0)
    assert held.unpruned == held.kept == 0


def test_counts_are_token_rows_of_the_stored_sides():
    """2 KV heads × 16 tokens × keys and values per held chunk; the keys-only ablation counts
    the keys alone; the bias-only ablation and the reference count nothing."""
    held = _commit_all(KVSpec.build("rtn", 2), 2, None, 16)
    assert (held.held, held.compressed) == (2 * 16 * 2 * (1 + 2), 2 * 16 * 2 * (1 + 2))
    keys = _commit_all(KVSpec.build("rtn", 2, values=False), 2, None, 16)
    assert keys.held == keys.compressed == 2 * 16 * (1 + 2)
    for spec in (KVSpec(), KVSpec.build("rtn", 2, bias_only=True)):
        assert _commit_all(spec, 2, None, 16).empty


@pytest.mark.parametrize(("kinds", "retention"), [(("dynamic", "dynamic"), 1.0), (None, 0.25)])
def test_a_pruner_that_keeps_everything_counts_as_such(kinds, retention):
    """Rows before and after pruning: a pruner keeping every token (retention 1 on dynamic
    heads) keeps every row; one that prunes keeps fewer. Kept tokens are stored by rtn."""
    layer = ForcingKVLayer(
        kinds or ("static", "dynamic"), 8, anchor_frames=1, segments=4, retention=retention
    )
    cache = ChunkKVCache(KVSpec.build("rtn", 2, pruner=ForcingKVHistory()), 2, pruning=layer)
    with counting() as held:
        for i in range(3):
            g = torch.Generator().manual_seed(i)
            cache.commit(*(torch.randn(1, 2, 16, D, generator=g) for _ in range(2)))
    assert held.unpruned == 2 * 16 * (1 + 2 + 2)
    assert (held.kept == held.unpruned) == (kinds is not None)
    assert held.held == held.compressed == 2 * held.kept


def test_predictions_for_the_models_upstream_policies():
    """QVG as each model runs it (qvg_policy.py) in its default geometry."""
    sf = QVG(2).for_model("self-forcing", 4680)
    why = noop_reason(sf, 6, 6, 4680)  # 7 chunks: 6 commits
    assert (
        why == "its first span of 8 chunk(s) is compressed at commit 8, the video commits at most 6"
    )
    assert predict(sf, 8, None, 4680) == pytest.approx(8 / 36)
    hy = QVG(2).for_model("hy-worldplay")
    assert predict(hy, 4, 1, 100) == pytest.approx(2 / 4)  # commits 1 and 3
    mg = QVG(2).for_model("matrix-game-2:universal", 2640)
    assert predict(mg, 49, 1, 2640) == 1.0
    lingbot = QVG(2, span_chunks=1, keep_recent_chunks=1, sink_keep_chunks=1)
    assert "leave the 1-chunk window" in noop_reason(lingbot, 49, 1, 2640)
