"""jbkv: KV-cache quantization and Jensen-bias correction for chunk-wise AR video diffusion.

The stable Python API::

    from jbkv_cli import quantize_kv, jensen_bias, attend
    qt = quantize_kv(x, bits=2, group_size=32, scheme="rtn")   # x: [..., L, D]
    b = jensen_bias(q, qt.step, scale, method="taylor")        # [..., Lq, L]
    out = attend(q, k_cur, v_cur, cached=(qk, qv), scale=scale, correction="taylor")
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Imported on first use (PEP 562), so ``import jbkv_cli`` and the CLI's start-up stay light.
_EXPORTS = {
    "ChunkKVCache": "jbkv_cli.quant.cache",
    "KVSpec": "jbkv_cli.quant",
    "QuantizedTensor": "jbkv_cli.quant",
    "attend": "jbkv_cli.attention",
    "attention_backend": "jbkv_cli.attention",
    "jensen_bias": "jbkv_cli.attention",
    "quantize_kv": "jbkv_cli.quant",
    "record_attention": "jbkv_cli.attention",
}

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


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'jbkv_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
