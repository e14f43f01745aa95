"""HY-WorldPlay's ``[text | memory]`` view (``combine``): the same view one cache gives when it
holds the 16-bit text as an exact sink chunk and the memory after it, so every correction reads
it as it reads any cache (the signed ones included, which need the memory's noise terms)."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.attention.attend import attend
from jbkv_cli.attention.correction import CORRECTIONS
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.models.hy_worldplay.memory import combine

B, H, D, TEXT, MEMORY = 1, 2, 64, 5, 24


@pytest.mark.parametrize("method", ["rtn", "qvg"])
@pytest.mark.parametrize("correction", list(CORRECTIONS))
def test_text_then_memory_reads_as_one_cache(method, correction):
    g = torch.Generator().manual_seed(0)
    text_k, text_v, mem_k, mem_v = (
        torch.randn(B, H, n, D, generator=g) for n in (TEXT, TEXT, MEMORY, MEMORY)
    )
    spec = KVSpec.build(method, 2, correction=correction)
    text, memory = ChunkKVCache(KVSpec()), ChunkKVCache(spec)
    text.commit(text_k, text_v)
    memory.commit(mem_k, mem_v)
    one = ChunkKVCache(KVSpec.build(method, 2, correction=correction, sink_chunks=1))
    one.commit(text_k, text_v)  # a sink chunk: kept 16-bit
    one.commit(mem_k, mem_v)
    got, want = combine([text.read(), memory.read()]), one.read()
    for name in ("k", "v", "k_step", "k_step2", "k_unshrink"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        assert a is None or torch.equal(a, b), name
    assert got.steps_fp8 == want.steps_fp8
    q, k, v = (torch.randn(B, H, 8, D, generator=g) for _ in range(3))
    out = attend(q, k, v, got, scale=D**-0.5, correction=spec.correction_)
    ref = attend(q, k, v, want, scale=D**-0.5, correction=spec.correction_)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
