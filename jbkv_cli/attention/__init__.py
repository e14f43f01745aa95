"""Where the Jensen bias lives: the correction, corrected attention and its diagnostics."""

from jbkv_cli.attention.attend import BACKENDS, CachedKV, attend, attention_backend
from jbkv_cli.attention.correction import (
    CORRECTIONS,
    Correction,
    exact_bias,
    get_correction,
    jensen_bias,
    taylor_bias,
)
from jbkv_cli.attention.diagnostics import AttentionObserver, AttentionRecorder

__all__ = [
    "BACKENDS",
    "CORRECTIONS",
    "AttentionObserver",
    "AttentionRecorder",
    "CachedKV",
    "Correction",
    "attend",
    "attention_backend",
    "exact_bias",
    "get_correction",
    "jensen_bias",
    "taylor_bias",
]
