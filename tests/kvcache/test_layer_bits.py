"""Per-layer widths (issue 37.4): each layer's cache stores at its layer's widths, and the bytes
a stack holds are the sum over layers of what each layer's stored tensors hold."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec, layer_caches
from jbkv_cli.run.bit_specs import BitPair, parse_bit_spec

LAYERS, HEADS, TOKENS, DIM = 4, 2, 48, 64


def _stack(spec: KVSpec, seed: int = 0) -> list[ChunkKVCache]:
    """A stack of ``LAYERS`` caches, each committed two chunks of random keys and values."""
    caches = layer_caches(
        spec, None, model="test", layers=LAYERS, kv_heads=HEADS, frame_tokens=TOKENS
    )
    g = torch.Generator().manual_seed(seed)
    for cache in caches:
        for _ in range(2):
            k, v = (torch.randn(1, HEADS, TOKENS, DIM, generator=g) * 2 for _ in range(2))
            cache.commit(k, v)
    return caches


def _side_bytes(bits: int, group: int = 32) -> int:
    """What one side of one layer holds: two chunks of codes, FP8 steps and BF16 zero points
    (16 bits: the raw float32 tensors)."""
    n = 2 * HEADS * TOKENS * DIM
    return n * 4 if bits == 16 else n * bits // 8 + n // group * 3


def test_each_layer_is_stored_at_its_widths_and_the_bytes_are_their_sum():
    layers = parse_bit_spec("K2V2@0-1+K2V1@2-")
    spec = KVSpec.build("rtn", group_size=32, correction="taylor", layers=layers)
    caches = _stack(spec)
    pairs = [BitPair(c.spec.key.bits, c.spec.value.bits) for c in caches]
    assert pairs == [BitPair(2, 2)] * 2 + [BitPair(2, 1)] * 2
    assert all(c.spec.layers is None and c.spec.correction == "taylor" for c in caches)
    for cache, pair in zip(caches, pairs, strict=True):  # each layer: its stored tensors
        stored = sum(cache.stored(i, role).nbytes for i in range(2) for role in ("key", "value"))
        assert cache.nbytes == stored == _side_bytes(pair.key) + _side_bytes(pair.value)
    total = sum(c.nbytes for c in caches)
    uniform = {
        b: sum(c.nbytes for c in _stack(KVSpec.build("rtn", 2, 32, value_bits=b))) for b in (2, 1)
    }
    assert total == (uniform[2] + uniform[1]) // 2  # half the layers each
    assert uniform[1] < total < uniform[2]


def test_exact_sides_and_layers_without_quantized_keys_get_no_correction():
    spec = KVSpec.build("rtn", correction="exact", layers=parse_bit_spec("K16V2@0+K1V16"))
    first, *rest = (spec.at_layer(i) for i in range(LAYERS))
    assert first.key is None and first.value.bits == 2 and first.correction == "none"
    assert all(s.key.bits == 1 and s.value is None and s.correction == "exact" for s in rest)
    caches = _stack(spec)
    assert caches[0].nbytes == _side_bytes(16) + _side_bytes(2)
    assert caches[1].nbytes == _side_bytes(1) + _side_bytes(16)


def test_a_per_layer_spec_is_refused_where_it_does_not_fit_and_never_built_whole():
    spec = KVSpec.build("rtn", layers=parse_bit_spec("K2V2@0-5+K1V1@6-"))
    with pytest.raises(ValueError, match=r"layer range 0-5 is outside the model's layers 0-3"):
        _stack(spec)
    gap = KVSpec.build("rtn", layers=parse_bit_spec("K2V2@0-1+K1V1@3-"))
    with pytest.raises(ValueError, match="layer 2 has no width"):
        _stack(gap)
    with pytest.raises(ValueError, match=r"give each layer's cache spec\.at_layer"):
        ChunkKVCache(gap)


def test_the_spec_round_trips_and_its_methods_keep_their_options():
    spec = KVSpec.build("quarot", 2, 16, "signed", layers=parse_bit_spec("K2V2+K1V1@2-"), seed=7)
    assert KVSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["layers"] == "K2V2+K1V1@2-"
    one_bit = spec.at_layer(3).key
    assert (one_bit.bits, one_bit.group_size, one_bit.seed) == (1, 16, 7)
    with pytest.raises(ValueError, match="kivi supports bits 1, 2, 4, got 3"):
        KVSpec.build("kivi", layers=parse_bit_spec("K2V2+K3V1@2-"))
    with pytest.raises(ValueError, match="takes no ablation"):
        KVSpec.build("rtn", layers=parse_bit_spec("K2V2+K1V1@2-"), keys=False)


def test_the_embedded_model_stores_each_layer_at_its_widths():
    """Through a model's loop (:class:`~jbkv_cli.models.loop.LoopCaches`): the peak bytes of a
    per-layer spec on the 4-layer embedded model are those of its two halves, between the
    uniform specs."""
    from jbkv_cli.models.tiny import load_model

    model = load_model(num_chunks=3, steps=1)
    assert model.head_layout()["layers"] == LAYERS
    prompt = "a green triangle moves up on a gray background"

    def peak(spec: KVSpec) -> int:
        return int(model.generate(prompt, 0, spec).kv_cache_bytes)

    layered = peak(KVSpec.build("rtn", layers=parse_bit_spec("K2V2@0-1+K2V1@2-")))
    k2v2, k2v1 = peak(KVSpec.build("rtn", 2)), peak(KVSpec.build("rtn", 2, value_bits=1))
    assert layered == (k2v2 + k2v1) // 2 and k2v1 < layered < k2v2
