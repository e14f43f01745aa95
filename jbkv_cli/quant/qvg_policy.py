"""QuantVideoGen's cache policy as its integrations run it, per jbkv model.

Read at ``svg-project/Quant-VideoGen@0601468f`` (``QVG`` = that repository):

- **Self-Forcing** (``scripts/Self-Forcing/run_qvg.sh``: K = 256, 2 k-means iterations, B = 64,
  1 stage, ``local_attn_size = num_output_frames = 180``, i.e. no eviction):
  ``experiments/Self-Forcing/pipeline/causal_inference.py:341–354`` — ``QUANT_FACTOR = 8``;
  before chunk ``c`` with ``c ≥ 8`` and ``c % 8 == 0`` the chunks ``[c−8, c)`` are quantized
  together (one codebook), the chunks of an unfinished span stay BF16.
  ``experiments/Self-Forcing/wan/modules/causal_model.py:272–313`` (``attn_kv_cache_prerope``,
  called at l.352): the key is written *before* RoPE (l.296), and every read rotates all cached
  keys (l.301–306, ``causal_rope_apply_long_input``: chunk ``j`` at frames ``j·f``, l.82–101).
- **HY-WorldPlay**: ``experiments/HY-WorldPlay/wan/inference/pipeline_wan_w_mem_relative_rope.py
  :1164–1169`` — ``QUANT_FACTOR = 2``, post-RoPE keys. jbkv has no HY-WorldPlay adapter.
- **LingBot-v2** (``scripts/LingBot-v2/run_qvg.sh``: ``quant_factor=1``,
  ``keep_recent_chunks=1``, ``sink_keep_chunks=1``; ``experiments/LingBot-v2/README.md``
  recommends both guards): ``experiments/LingBot-v2/wan/image2video.py:692–755`` — before chunk
  ``c`` with ``c ≥ qf + keep_recent`` and ``(c − keep_recent) % qf == 0`` the chunks
  ``[c − qf − keep_recent, c − keep_recent)`` are quantized, clamped to what is still in the
  window; a span is split at the sink boundary (the sink part its own span); the first
  ``sink_keep`` chunks (at most the sink) stay BF16. Keys are cached post-RoPE
  (``wan/modules/model_causal.py:156–157, 178``).
- Eviction (``quant_videogen/kv_cache.py:224–258``, ``evict_range``): a quantized span is
  dropped only when every chunk it covers has left the window; until then it is held whole.

jbkv's models (:data:`INTEGRATIONS`, looked up as ``model:config`` then ``model``):

- ``self-forcing`` (its ``self-forcing-dmd`` and ``tiny-random`` configs): the Self-Forcing
  integration, N = 8, pre-RoPE keys. With jbkv's default 7 chunks no span fills (the first
  quantization is before chunk 8), so the cache stays 16-bit and counts as such: upstream's
  script generates 60 chunks with no eviction; run ``num_chunks ≥ 9`` (and ``window ≥ 8``
  to hold a whole span) to see QVG compress.
- ``self-forcing:longlive``, ``skyreels-v2``, ``magi1``, ``rolling-forcing`` have no QVG script. They get
  LingBot-v2's policy (per chunk, keep the newest chunk and the first sink chunk BF16,
  post-RoPE): it is upstream's newest integration and the one written for a streaming model
  with a sliding window and a sink, as these are; N = 8 would quantize nothing in their default
  windows (LongLive: 2 chunks, SkyReels-V2: 5, MAGI-1: what its KV ranges need).
- ``tiny`` (the embedded model) keeps jbkv's per-chunk behaviour (nothing to fill in): every
  chunk quantized at its commit, post-RoPE keys, K capped at L/64.

Pruned variants are stored per chunk (the cache cannot yet prune a span): nothing is filled in.
"""

from __future__ import annotations

from dataclasses import dataclass

UNCAPPED_TOKENS_PER_CENTROID = 16  # K is used as asked where a span gives each ≥ 16 tokens
DEFAULT_TOKENS_PER_CENTROID = 64  # else K_eff = min(K, L // 64)
LAYOUTS = ("post-rope", "pre-rope")


@dataclass(frozen=True)
class Integration:
    """How one upstream integration runs QVG's cache: span, guards, key layout, where read."""

    span_chunks: int
    keep_recent_chunks: int
    sink_keep_chunks: int | None
    key_layout: str
    source: str


SELF_FORCING = Integration(
    8,
    0,
    0,
    "pre-rope",
    "QVG@0601468f experiments/Self-Forcing/pipeline/causal_inference.py:341-354, "
    "wan/modules/causal_model.py:272-313",
)
LINGBOT_V2 = Integration(
    1,
    1,
    1,
    "post-rope",
    "QVG@0601468f scripts/LingBot-v2/run_qvg.sh, experiments/LingBot-v2/wan/image2video.py:692-755",
)
INTEGRATIONS: dict[str, Integration] = {
    "self-forcing": SELF_FORCING,
    "self-forcing:longlive": LINGBOT_V2,
    "skyreels-v2": LINGBOT_V2,
    "magi1": LINGBOT_V2,
    "rolling-forcing": LINGBOT_V2,
}


def integration(model: str) -> Integration | None:
    """The integration jbkv follows for ``model`` (``name`` or ``name:config``), or None."""
    if model in INTEGRATIONS:
        return INTEGRATIONS[model]
    return INTEGRATIONS.get(model.split(":", 1)[0])


def effective_centroids(k: int, tokens: int, tokens_per_centroid: int | None) -> int:
    """``K_eff`` for a span of ``tokens`` tokens: ``tokens_per_centroid`` None is the rule —
    ``K`` where ``tokens ≥ 16·K`` (each centroid gets ≥ 16 tokens: upstream's regime, e.g.
    Self-Forcing's 8 × 4,680 tokens for K = 256), else ``min(K, tokens // 64)`` (where K = 256
    would give every token of a small chunk its own centroid); an int is that cap (0: none).
    At least 1, at most ``tokens``."""
    if tokens_per_centroid is None:
        uncapped = tokens >= UNCAPPED_TOKENS_PER_CENTROID * k
        tokens_per_centroid = 0 if uncapped else DEFAULT_TOKENS_PER_CENTROID
    cap = tokens if tokens_per_centroid == 0 else tokens // tokens_per_centroid
    return max(1, min(k, cap, tokens))


def resolved_cap(k: int, span_tokens: int) -> int:
    """The cap the rule picks for spans of ``span_tokens`` tokens: 0 (K uncapped) or 64."""
    uncapped = span_tokens >= UNCAPPED_TOKENS_PER_CENTROID * k
    return 0 if uncapped else DEFAULT_TOKENS_PER_CENTROID
