"""What a method stores holds exactly its own bytes: every tensor of ``stored()`` has a storage of
its own size, so the device keeps what ``nbytes`` counts. The input is what a model hands a
cache, bf16 keys and values sliced from a fused QKV projection (views of a storage three times
their size): a stored tensor that is a view of them (a slice kept as is, a dtype conversion
that returns its input) would keep the whole projection alive (``quant/tensor.py``,
``compact``)."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.quant import METHODS, build_method
from jbkv_cli.quant.queries import QueryStats


def _projection(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[B, H, L, D]`` as views of one ``[B, L, 3, H, D]`` bf16 projection."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(1, 64, 3, 2, 64, generator=gen).to(torch.bfloat16)
    return qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)


def _cases():
    for name, cls in METHODS.items():
        bits = 2 if 2 in cls.SUPPORTED_BITS else cls.SUPPORTED_BITS[0]
        yield pytest.param(name, bits, {}, id=name)
    yield pytest.param("kvquant", 2, {"first_tokens": 0}, id="kvquant-no-first-tokens")
    yield pytest.param("kvquant", 2, {"first_tokens": 4}, id="kvquant-first-tokens")
    yield pytest.param("kvquant", 2, {"first_tokens": 64}, id="kvquant-every-token-first")


@pytest.mark.parametrize(("name", "bits", "options"), list(_cases()))
@pytest.mark.parametrize("role", ["key", "value"])
def test_every_stored_tensor_owns_exactly_its_bytes(name, bits, options, role):
    method = build_method(name, bits, 32, **options).at_layer(0)
    k, v = _projection(0)
    x = k if role == "key" else v
    stored = method.quantize(x, role, QueryStats())
    tensors = {n: t for n, t in stored.stored().items() if t is not None}
    assert tensors
    for part, t in tensors.items():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), (name, part)
    assert stored.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
