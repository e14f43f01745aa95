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
- **HY-WorldPlay** (``scripts/HY-WorldPlay/run_qvg.sh``: K = 256, 2 iterations, B = 64, 1
  stage, 12 chunks, on HY-WorldPlay's Wan pipeline, WorldPlay-5B):
  ``experiments/HY-WorldPlay/wan/inference/pipeline_wan_w_mem_relative_rope.py:1164–1169`` —
  ``QUANT_FACTOR = 2``; before chunk ``c`` with ``c ≥ 2`` and ``c % 2 == 0`` the tokens of
  chunks ``[c−2, c)`` are quantized together (one codebook), after that chunk's cache pass;
  the cache is append-only (``models/dits/arwan_w_action_w_mem_relative_rope.py:178–184``
  writes only the new frames' keys, after RoPE, l.122). Its HunyuanVideo-1.5 pipeline (the 8B
  model jbkv runs) quantizes no KV cache.
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
- ``hy-worldplay`` (WorldPlay-8B): the HY-WorldPlay integration's rule, N = 2, post-RoPE keys,
  applied to jbkv's memory caches, whose commits are one per chunk (the memory pass). They
  differ from upstream's append-only cache: the 8B model's memory is rebuilt from clean latents
  every chunk and each cache holds one commit (window 1), so memory commits 1, 3, 5, … are
  quantized (one codebook over that commit and the one before it, held whole) and commits 0,
  2, 4, … are read 16-bit — as upstream's rule leaves a rebuilt cache exact on odd chunks. The
  rows' compressed share says how much was quantized.
- ``matrix-game-2`` (Matrix-Game-2.0, no QVG script): per chunk, jbkv's choice, stated as ``N1``: each finished
  chunk quantized alone at its commit, post-RoPE. Its caches hold one finished chunk (local
  attention 6 frames = the current chunk and one more; GTA: one frame), so LingBot-v2's
  keep-recent guard would evict every chunk the moment it is quantized and spans of N ≥ 2
  would leave every other chunk 16-bit: only per-chunk quantization lets attention read a
  quantized cache.
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
HY_WORLDPLAY = Integration(
    2,
    0,
    0,
    "post-rope",
    "QVG@0601468f experiments/HY-WorldPlay/wan/inference/pipeline_wan_w_mem_relative_rope.py"
    ":1164-1169, wan/models/dits/arwan_w_action_w_mem_relative_rope.py:178-184",
)
PER_CHUNK_CHOICE = Integration(
    1, 0, None, "post-rope", "jbkv's choice: per chunk (its caches hold one finished chunk)"
)
INTEGRATIONS: dict[str, Integration] = {
    "self-forcing": SELF_FORCING,
    "hy-worldplay": HY_WORLDPLAY,
    "matrix-game-2": PER_CHUNK_CHOICE,
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
