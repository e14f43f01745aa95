"""Where the Jensen bias lives: the correction, corrected attention and its diagnostics."""

from jbkv_cli.attention.attend import BACKENDS, CachedKV, attend, attention_backend
from jbkv_cli.attention.correction import exact_bias, jensen_bias, taylor_bias
from jbkv_cli.attention.diagnostics import AttentionRecorder, record_attention

__all__ = [
    "BACKENDS",
    "AttentionRecorder",
    "CachedKV",
    "attend",
    "attention_backend",
    "exact_bias",
    "jensen_bias",
    "record_attention",
    "taylor_bias",
]
