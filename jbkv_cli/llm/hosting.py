"""jbkv's quantized cache and corrected attention inside a Hugging Face causal LM, without a fork.

Two pieces, both plain transformers extension points (transformers 5.x, ``cache_utils`` and
``AttentionInterface``; checked against the installed 5.24):

- :class:`JbkvLayer`, a ``CacheLayerMixin``: each ``update(k, v)`` is one chunk of the prompt.
  It commits the previous chunk (the one attention has finished with) to a
  :class:`~jbkv_cli.kvcache.ChunkKVCache`, which stores it through the variant's
  :class:`~jbkv_cli.kvcache.KVSpec` (keys and values by their methods: codes, steps, zero
  points; KIVI's residual, QuaRot's rotation, QuantWM's query statistics all as in the video
  path), keeps the new chunk exact, and returns ``[dequantized cache | chunk]`` as any layer does,
  so a stock attention implementation (``sdpa``, ``eager``) still computes the uncorrected result.
- :func:`jbkv_attention`, registered as ``attn_implementation="jbkv"``: it finds the layer that
  was just updated and runs :func:`~jbkv_cli.attention.attend` on ``(the layer's stored cache
  with its steps and rotation, the exact chunk)`` with the variant's correction, causally inside
  the chunk, GQA by head ratio. With no jbkv layer behind the call (no cache, another cache
  class) it is exact causal attention.

The attention function cannot see the cache object (models pass it to ``update`` only), so
:meth:`JbkvLayer.update` leaves itself in a context variable and the attention call of the same
layer claims it, checking that the model handed attention the very tensors the layer returned;
a model that changes cached keys between the two calls is refused rather than silently wrong.

Refused (``ValueError``): a padding ``attention_mask`` (rows must be unpadded), sliding-window
layers whose window is shorter than the keys, logit soft-capping and attention sinks — jbkv's
attention implements none of them, so a model that needs them would be computed wrongly.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from jbkv_cli.attention.attend import CachedKV, attend
from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache.cache import ChunkKVCache
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.quant.queries import QueryStats

ATTENTION = "jbkv"
_PENDING: contextvars.ContextVar[JbkvLayer | None] = contextvars.ContextVar(
    "jbkv_pending_layer", default=None
)
_WINDOWS: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "jbkv_sliding_windows", default=None
)


@dataclass
class _Chunk:
    """The chunk attention is reading now: exact keys/values and what ``update`` returned."""

    k: torch.Tensor
    v: torch.Tensor
    returned: tuple[torch.Tensor, torch.Tensor]


class JbkvLayer(CacheLayerMixin):
    """One decoder layer's KV cache: earlier chunks stored through ``spec``, the current exact.

    ``observer``: an :class:`~jbkv_cli.attention.AttentionObserver` fed every attention call that
    reads a quantized cache (the cache then keeps full-precision copies for it). For a method
    that ``needs_queries`` (QuantWM) the queries of each chunk go to the cache's ``pending``
    statistics and join its history only once the chunk itself is stored (the cache's commit
    protocol, App. C.3: a chunk is quantized with the queries of earlier chunks only).
    """

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(
        self,
        spec: KVSpec,
        layer_idx: int,
        observer: AttentionObserver | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.layer_idx = layer_idx
        self.backend = backend
        self.store = ChunkKVCache(spec, window=None, observer=observer, keep_view=True)
        self.observer = observer
        self.current: _Chunk | None = None
        self.calls = 0

    # --- the CacheLayerMixin protocol -------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the next chunk ``[B, Hkv, L, D]`` (post-RoPE); return ``[cache | chunk]``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.flush()
        cached = self.store.read()
        if cached is None:
            returned = (key_states, value_states)
        else:
            returned = (
                torch.cat([cached.k.to(key_states.dtype), key_states], dim=-2),
                torch.cat([cached.v.to(value_states.dtype), value_states], dim=-2),
            )
        self.current = _Chunk(key_states, value_states, returned)
        _PENDING.set(self)
        return returned

    def get_seq_length(self) -> int:
        pending = self.current.k.shape[-2] if self.current is not None else 0
        return self.store.num_tokens + pending

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.store.reset()
        self.current = None

    # --- jbkv ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Store the chunk attention has finished reading (called before the next chunk)."""
        if self.current is not None:
            self.store.commit(self.current.k, self.current.v)
            self.current = None

    def commit(self, k: torch.Tensor, v: torch.Tensor, queries: QueryStats | None = None) -> None:
        """Store a prefix computed elsewhere (its exact post-RoPE ``k``, ``v``) as one chunk, as
        ``update`` would have after attention read it; ``queries``: the statistics of that
        chunk's own queries (for QuantWM). They are pending, as ``attend`` leaves them: the
        chunk is stored with the history of earlier chunks only (none in a fresh cache) and its
        queries join the history after it (App. C.3)."""
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        self.flush()
        if queries is not None and self.store.pending is not None:
            self.store.pending = QueryStats()
            self.store.pending.absorb(queries)
        self.store.commit(k, v)

    @property
    def nbytes(self) -> int:
        """Bytes the stored chunks hold (codes, steps, zero points, exact tokens)."""
        return self.store.nbytes

    def attend(self, query: torch.Tensor, scale: float) -> torch.Tensor:
        """``[B, Hq, L, D]`` attention of the current chunk's queries, as the variant does it."""
        chunk = self.current
        cached = self.store.read()
        corr = self.spec.correction_
        out = attend(
            query,
            chunk.k.to(query.dtype),
            chunk.v.to(query.dtype),
            cached,
            scale=scale,
            correction=corr,
            backend=self.backend,
            causal=True,
        )
        if self.store.pending is not None:  # history once this chunk is stored (commit)
            self.store.pending.update(query, chunk.k.shape[-3])
        self.calls += 1
        obs = self.observer
        if (
            obs is not None
            and cached is not None
            and cached.k_ref is not None
            and cached.k_step is not None
            and self.calls % obs.every == 0
        ):
            obs.observe(query, chunk.k, chunk.v, cached, scale, corr)
        return out


class JbkvCache(Cache):
    """A transformers ``Cache`` of :class:`JbkvLayer`, one per decoder layer."""

    def __init__(self, layers: Sequence[JbkvLayer]) -> None:
        super().__init__(layers=list(layers))

    @classmethod
    def for_model(
        cls,
        model: PreTrainedModel,
        spec: KVSpec,
        observer: AttentionObserver | None = None,
        backend: str | None = None,
    ) -> JbkvCache:
        layers = decoder_layers(model)
        return cls([JbkvLayer(spec, i, observer, backend) for i in range(layers)])

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


def decoder_layers(model: PreTrainedModel) -> int:
    """The number of attention layers of a decoder-only model (its text config)."""
    config = model.config.get_text_config()
    return int(config.num_hidden_layers)


def _claim(module: torch.nn.Module, key: torch.Tensor) -> JbkvLayer | None:
    """The jbkv layer whose ``update`` produced ``key`` for this module's call, if any."""
    layer = _PENDING.get()
    if layer is None or layer.current is None:
        return None
    _PENDING.set(None)
    index = getattr(module, "layer_idx", layer.layer_idx)
    if index != layer.layer_idx or key is not layer.current.returned[0]:
        raise ValueError(
            f"jbkv attention of layer {index} did not receive the keys its cache layer "
            f"{layer.layer_idx} returned (the model transforms cached keys); not supported"
        )
    return layer


def _refuse_unsupported(query: torch.Tensor, key: torch.Tensor, mask, kwargs) -> None:
    if mask is not None:
        raise ValueError("jbkv attention takes unpadded rows only (got an attention mask)")
    window = kwargs.get("sliding_window")
    seen = _WINDOWS.get()
    if seen is not None and window is not None:
        seen.add(int(window))
    if window is not None and key.shape[-2] > int(window):
        raise ValueError(
            f"sliding-window attention (window {window}) over {key.shape[-2]} keys is not "
            "supported by jbkv attention"
        )
    if kwargs.get("softcap") is not None:
        raise ValueError("attention logit soft-capping is not supported by jbkv attention")
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError("attention sinks (s_aux) are not supported by jbkv attention")


def jbkv_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, Hq, L, D]`` post-RoPE, ``key``/
    ``value`` what the cache returned; returns ``([B, L, Hq, D], None)``."""
    _refuse_unsupported(query, key, attention_mask, kwargs)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    layer = _claim(module, key)
    if layer is not None:
        out = layer.attend(query, scale)
    else:  # no jbkv cache: exact causal attention, any earlier keys as an exact prefix
        lc = key.shape[-2] - query.shape[-2]
        prefix = CachedKV(key[..., :lc, :], value[..., :lc, :]) if lc > 0 else None
        k, v = key[..., max(lc, 0) :, :], value[..., max(lc, 0) :, :]
        out = attend(query, k, v, prefix, scale=scale, correction="none", causal=True)
    return out.transpose(1, 2).contiguous(), None


@torch.no_grad()
def sliding_windows(model: PreTrainedModel) -> set[int]:
    """The sliding windows ``model``'s layers hand to attention (empty: none), as one forward
    of one token through jbkv attention finds them: what each model does with its config's
    ``sliding_window``, ``use_sliding_window`` and ``layer_types`` is its own, so it is
    observed rather than read. Call it on a hosted model (:func:`host`); jbkv attention refuses
    more keys than the smallest window holds."""
    seen: set[int] = set()
    token = _WINDOWS.set(seen)
    try:
        ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
        model.get_decoder()(input_ids=ids, use_cache=False)
    finally:
        _WINDOWS.reset(token)
    return seen


def register() -> None:
    """Make ``attn_implementation="jbkv"`` available (idempotent)."""
    AttentionInterface.register(ATTENTION, jbkv_attention)


def host(model: PreTrainedModel) -> PreTrainedModel:
    """Switch ``model`` to jbkv attention; ``ValueError`` for a model whose attention does not go
    through transformers' ``AttentionInterface`` (there is nothing to hook into)."""
    register()
    if not model._can_set_attn_implementation():
        raise ValueError(
            f"{type(model).__name__}'s attention does not go through transformers' "
            "AttentionInterface, so jbkv cannot host its KV cache"
        )
    model.set_attn_implementation(ATTENTION)
    return model


register()
