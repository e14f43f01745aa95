"""jbkv: KV-cache quantization and Jensen-bias correction for chunk-wise AR video diffusion.

The stable Python API::

    from jbkv_cli import quantize_kv, jensen_bias, attend
    qt = quantize_kv(x, bits=2, group_size=32, scheme="rtn")   # x: [..., L, D]
    b = jensen_bias(q, qt.step, scale, method="taylor")        # [..., Lq, L]
    out = attend(q, k_cur, v_cur, cached=(qk, qv), scale=scale, correction="taylor")
"""

from jbkv_cli.attention import attend, attention_backend, jensen_bias, record_attention
from jbkv_cli.quant import KVSpec, QuantizedTensor, quantize_kv
from jbkv_cli.quant.cache import ChunkKVCache

__version__ = "0.1.0"

__all__ = [
    "ChunkKVCache",
    "KVSpec",
    "QuantizedTensor",
    "attend",
    "attention_backend",
    "jensen_bias",
    "quantize_kv",
    "record_attention",
]
