"""Shared fixtures for the MAGI-1 tests: a tiny random DiT and an independent dense KV cache."""

import pytest
import torch
import torch.nn.functional as F

from jbkv_cli.kvcache.spec import FULL_PRECISION


class DenseCache:
    """Oracle cache: raw tensors, concatenation and plain SDPA (no jbkv quant code)."""

    def __init__(self) -> None:
        self.spec = FULL_PRECISION
        self.ks, self.vs = [], []

    @property
    def committed(self) -> int:
        return len(self.ks)

    @property
    def num_chunks(self) -> int:
        return len(self.ks)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.ks + self.vs)

    def commit(self, k, v) -> None:
        self.ks.append(k.clone())
        self.vs.append(v.clone())

    def attend(self, q, k_cur, v_cur, scale, last=None, backend=None):
        n = len(self.ks) if last is None else last
        k = torch.cat([*self.ks[len(self.ks) - n :], k_cur], dim=-2)
        v = torch.cat([*self.vs[len(self.vs) - n :], v_cur], dim=-2)
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)


@pytest.fixture
def dense_cache():
    return DenseCache


@pytest.fixture(scope="module")
def tiny():
    from jbkv_cli.models.magi1.tiny import tiny_dit

    torch.manual_seed(0)
    return tiny_dit(seed=0).eval()
