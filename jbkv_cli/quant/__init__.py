"""KV-cache compression: quantizers (``none``, ``rtn``, ``quarot``), specs and the chunk cache."""

from jbkv_cli.quant.quantizers import QUANTIZERS, quantize_kv
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.spec import FULL_PRECISION, KVSpec
from jbkv_cli.quant.tensor import QuantizedTensor

__all__ = [
    "FULL_PRECISION",
    "QUANTIZERS",
    "ChunkKVCache",
    "KVSpec",
    "QuantizedTensor",
    "RandomHadamard",
    "quantize_kv",
]


def __getattr__(name: str):
    # The cache builds on jbkv_cli.attention, which builds on this package: import it lazily.
    if name == "ChunkKVCache":
        from jbkv_cli.quant.cache import ChunkKVCache

        return ChunkKVCache
    raise AttributeError(name)
