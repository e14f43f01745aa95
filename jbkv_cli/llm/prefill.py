"""Teacher-forced NLL of a current chunk predicted from a (quantized) cached prefix.

For one example (``ids`` = prefix ``A`` + chunk ``B`` + 1 tokens):

1. :func:`prefill_prefix` runs the prefix once, exactly (causal attention, full precision), and
   keeps every layer's post-RoPE keys and values, plus the statistics of its queries (for
   QuantWM, which weighs key error by the queries of *earlier* chunks: the prefix is the
   cache's first chunk, so it is stored with no history and its queries join the history
   after it, App. C.3);
2. :func:`chunk_nll`, per variant, stores that prefix through the variant's
   :class:`~jbkv_cli.kvcache.KVSpec` (:class:`~jbkv_cli.llm.hosting.JbkvLayer.commit`) and runs
   the chunk over it with jbkv attention (the prefix read through the variant's methods and
   correction, the chunk exact and causal), then scores positions ``A … A+B−1`` against tokens
   ``A+1 … A+B``: ``nll_t = −log softmax(logits_t)[token_{t+1}]``.

Sharing step 1 across variants is exact: the prefix's own attention never reads the cache, so
every variant would compute the same prefix keys and values.

Logits are made from the decoder's last hidden states by the output embedding in slices of
:data:`LOGIT_ROWS` rows (a ``[B, vocab]`` float32 tensor is 4 GB at B = 8192 and a 128k
vocabulary); models that post-process logits (soft-capping, a logit scale) are refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from jbkv_cli.attention.diagnostics import AttentionRecorder
from jbkv_cli.kvcache.coverage import counting
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.llm.hosting import JbkvCache
from jbkv_cli.quant.queries import QueryStats

LOGIT_ROWS = 1024
DIAGNOSTIC_QUERIES = 32  # queries per layer and call compared against the exact cache


@dataclass
class Prefix:
    """Every layer's exact prefix keys/values ``[1, Hkv, A, D]`` and query statistics."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    queries: list[QueryStats | None]
    seconds: float = 0.0

    @property
    def length(self) -> int:
        return self.keys[0].shape[-2]


@dataclass
class ChunkResult:
    """One variant's scores of one chunk: per-token NLL (nats), storage, diagnostics, time."""

    nll: torch.Tensor  # [B] float64
    kv_cache_bytes: int
    seconds: float
    diagnostics: dict[str, float | None] | None = None
    delta_ps: list[float] = field(default_factory=list)
    compression: dict[str, int] | None = None  # token-rows held / compressed (kvcache/coverage)

    @property
    def mean(self) -> float:
        return float(self.nll.mean())


def check_model(model: PreTrainedModel) -> None:
    """Refuse what the logit slicing or jbkv attention would compute wrongly."""
    config = model.config.get_text_config()
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(config, name, None) is not None:
            raise ValueError(f"{name} is not supported (jbkv computes plain logits/attention)")
    if getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        raise ValueError("a logit scale is not supported (jbkv computes plain logits)")
    if model.get_output_embeddings() is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (not a causal LM?)")


def _decoder(model: PreTrainedModel) -> torch.nn.Module:
    return model.get_decoder()


def _needs_queries(specs: list[KVSpec]) -> bool:
    return any(m is not None and m.needs_queries for s in specs for m in (s.key, s.value))


@torch.no_grad()
def prefill_prefix(model: PreTrainedModel, ids: torch.Tensor, queries: bool = False) -> Prefix:
    """Run ``ids [A]`` exactly; keep each layer's keys/values (and query statistics)."""
    start = time.perf_counter()
    cache = JbkvCache.for_model(model, FULL_PRECISION)
    if queries:  # the attention calls' queries collect here (JbkvLayer.attend)
        for layer in cache.layers:
            layer.store.pending = QueryStats()
    device = model.device
    _decoder(model)(input_ids=ids[None].to(device), cache=cache, use_cache=True)
    keys, values, stats = [], [], []
    for layer in cache.layers:
        if layer.current is None:
            raise ValueError(f"layer {layer.layer_idx} of the model never updated its cache")
        keys.append(layer.current.k)
        values.append(layer.current.v)
        stats.append(layer.store.pending)
    return Prefix(keys, values, stats, time.perf_counter() - start)


def logits_nll(
    model: PreTrainedModel, hidden: torch.Tensor, targets: torch.Tensor, rows: int = LOGIT_ROWS
) -> torch.Tensor:
    """``−log softmax(head(hidden))[targets]`` per row, float64 ``[L]``, ``rows`` at a time."""
    head = model.get_output_embeddings()
    out = torch.empty(targets.shape[0], dtype=torch.float64)
    for s in range(0, targets.shape[0], rows):
        logits = head(hidden[s : s + rows]).float()
        out[s : s + rows] = (
            F.cross_entropy(logits, targets[s : s + rows].to(logits.device), reduction="none")
            .double()
            .cpu()
        )
    return out


@torch.no_grad()
def chunk_nll(
    model: PreTrainedModel,
    prefix: Prefix,
    ids: torch.Tensor,
    spec: KVSpec,
    *,
    diagnostics: bool = True,
    backend: str | None = None,
) -> ChunkResult:
    """The chunk ``ids[A : A+B]`` over ``prefix`` stored as ``spec`` stores it (see the module
    docstring); ``ids`` holds ``A + B + 1`` tokens."""
    start = time.perf_counter()
    a = prefix.length
    b = ids.shape[0] - a - 1
    if b < 1:
        raise ValueError(f"{ids.shape[0]} tokens leave no chunk after a {a}-token prefix")
    recorder = None
    if diagnostics and spec.quantized and spec.key is not None:
        recorder = AttentionRecorder(max_queries=DIAGNOSTIC_QUERIES, every=1, causal=True)
    cache = JbkvCache.for_model(model, spec, observer=recorder, backend=backend)
    with counting() as held:  # what the stored prefix holds compressed (a residual may not)
        for layer, k, v, q in zip(
            cache.layers, prefix.keys, prefix.values, prefix.queries, strict=True
        ):
            layer.commit(k, v, q)
    device = model.device
    positions = torch.arange(a, a + b, device=device)[None]
    hidden = _decoder(model)(
        input_ids=ids[None, a : a + b].to(device),
        position_ids=positions,
        cache=cache,
        use_cache=True,
    ).last_hidden_state[0]
    nll = logits_nll(model, hidden, ids[a + 1 : a + b + 1])
    seconds = time.perf_counter() - start
    diag, samples = None, []
    if recorder is not None:
        seconds -= recorder.seconds
        diag = recorder.summary()
        samples = [round(float(x), 6) for x in recorder.delta_ps()]
    compression = None if held.empty else held.to_dict()
    return ChunkResult(nll, cache.nbytes, seconds, diag, samples, compression)


def score_example(
    model: PreTrainedModel,
    ids: list[int] | tuple[int, ...],
    prefix_len: int,
    specs: list[KVSpec],
    *,
    diagnostics: bool = True,
    backend: str | None = None,
) -> tuple[Prefix, dict[KVSpec, ChunkResult]]:
    """One prefix pass, then :func:`chunk_nll` for every spec."""
    tokens = torch.tensor(ids, dtype=torch.long)
    prefix = prefill_prefix(model, tokens[:prefix_len], _needs_queries(specs))
    out = {
        s: chunk_nll(model, prefix, tokens, s, diagnostics=diagnostics, backend=backend)
        for s in specs
    }
    return prefix, out


def summary(result: ChunkResult) -> dict[str, Any]:
    """The JSON part of a record."""
    return {
        "nll": result.mean,
        "nll_sum": float(result.nll.sum()),
        "tokens": int(result.nll.numel()),
        "kv_cache_bytes": int(result.kv_cache_bytes),
        "seconds": result.seconds,
        "diagnostics": result.diagnostics,
        "compression": result.compression,
    }
