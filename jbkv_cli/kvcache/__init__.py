"""The chunk cache, above :mod:`jbkv_cli.quant` (how a chunk is stored) and
:mod:`jbkv_cli.attention` (how it is read): :class:`KVSpec` says what a variant does,
:class:`ChunkKVCache` does it for one layer, :func:`layer_caches` builds a model's stack."""

from jbkv_cli.kvcache.cache import ChunkKVCache
from jbkv_cli.kvcache.layers import HeadLayout, layer_caches
from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.kvcache.spec import FULL_PRECISION, REFERENCE_ID, KVSpec

__all__ = [
    "FULL_PRECISION",
    "REFERENCE_ID",
    "ChunkKVCache",
    "HeadLayout",
    "KVSpec",
    "KeyRope",
    "layer_caches",
]
