"""The pre-RoPE cache layout (``ChunkKVCache(rope=...)``, ``jbkv_cli/kvcache/rope.py``): keys
committed before RoPE read back rotated at their positions — the same tensors as a post-RoPE
cache for 16 bits, at shifted positions when a read asks, quantized in the pre-RoPE basis with
the rotation carried to the correction — and the tiny model's chunk loop either way."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.kvcache.spec import FULL_PRECISION
from jbkv_cli.models.tiny.model import (
    TinyConfig,
    TinyDiT,
    apply_rope,
    key_rope,
    rope_angles,
    rope_tables,
)
from jbkv_cli.quant.qvg import QVG

CFG = TinyConfig()
F = CFG.frames_per_chunk


def _chunk(serial: int, heads: int = 2):
    g = torch.Generator().manual_seed(serial)
    shape = (1, heads, CFG.chunk_len, CFG.head_dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def _rotate(k: torch.Tensor, frame: int) -> torch.Tensor:
    """The tiny model's own RoPE of one chunk starting at ``frame``."""
    return apply_rope(k, rope_tables(rope_angles(CFG, frame, F)))


def test_16bit_pre_rope_reads_what_a_post_rope_cache_holds():
    pre, post = ChunkKVCache(FULL_PRECISION, rope=key_rope(CFG)), ChunkKVCache(FULL_PRECISION)
    for i in range(3):
        k, v = _chunk(i)
        pre.commit(k, v, position=i * F)
        post.commit(_rotate(k, i * F), v)
    a, b = pre.read(), post.read()
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and a.key_rotation is None
    q, k, v = (torch.randn(1, 2, 8, CFG.head_dim) for _ in range(3))
    assert torch.equal(pre.attend(q, k, v, scale=0.125), post.attend(q, k, v, scale=0.125))


def test_read_positions_rotate_a_chunk_where_the_read_asks():
    """Rolling Forcing's need: a sink read as if at another frame, on this read only."""
    cache = ChunkKVCache(FULL_PRECISION, rope=key_rope(CFG))
    (k0, v0), (k1, v1) = _chunk(0), _chunk(1)
    cache.commit(k0, v0, position=0)
    cache.commit(k1, v1, position=F)
    shifted = cache.read(positions={0: 3 * F})
    assert torch.equal(shifted.k[..., : CFG.chunk_len, :], _rotate(k0, 3 * F))
    assert torch.equal(shifted.k[..., CFG.chunk_len :, :], _rotate(k1, F))
    assert torch.equal(cache.read().k[..., : CFG.chunk_len, :], _rotate(k0, 0))


def test_quantized_pre_rope_keys_and_the_rotation_the_correction_gets():
    rope = key_rope(CFG)
    cache = ChunkKVCache(KVSpec.build("qvg", 2, 64, "taylor"), rope=rope)
    k, v = _chunk(0)
    cache.commit(k, v, position=2 * F)
    view = cache.read()
    stored = QVG(2).quantize(k, "key")  # quantized before RoPE
    assert torch.equal(view.k, _rotate(stored.dequantize(), 2 * F))
    cos, sin = rope_tables(rope_angles(CFG, 2 * F, F))
    assert torch.equal(view.key_rotation.cos, cos[:, : CFG.head_dim // 2])
    assert torch.equal(view.key_rotation.sin, sin[:, : CFG.head_dim // 2])
    assert view.key_rotation.pairs == "half"


def test_diagnostics_of_a_pre_rope_cache_see_rotated_keys():
    rec = AttentionRecorder(every=1)
    cache = ChunkKVCache(KVSpec.build("qvg", 2, 64, "taylor"), rope=key_rope(CFG), observer=rec)
    k, v = _chunk(0)
    cache.commit(k, v, position=0)
    q = _rotate(torch.randn(1, 2, CFG.chunk_len, CFG.head_dim), F)
    cache.attend(q, *_chunk(1), scale=0.125)
    noise = rec.summary()
    assert 0.5 < noise["noise_z_var"] < 1.5  # the rotated noise matches the rotated model


@pytest.mark.parametrize(
    ("build", "commit", "match"),
    [
        (lambda: ChunkKVCache(FULL_PRECISION, rope=key_rope(CFG)), {}, "needs each chunk"),
        (lambda: ChunkKVCache(FULL_PRECISION), {"position": 0}, "takes none"),
        (
            lambda: ChunkKVCache(KVSpec.build("quarot", 2), rope=key_rope(CFG)),
            {"position": 0},
            "cannot store them before RoPE",
        ),
    ],
)
def test_layout_misuse_is_refused(build, commit, match):
    cache = build()
    with pytest.raises(ValueError, match=match):
        cache.commit(*_chunk(0), **commit)


def test_read_positions_need_a_pre_rope_cache():
    cache = ChunkKVCache(FULL_PRECISION)
    cache.commit(*_chunk(0))
    with pytest.raises(ValueError, match="pre-RoPE"):
        cache.read(positions={0: 4})


def test_tiny_model_chunk_loop_is_the_same_with_either_layout():
    torch.manual_seed(0)
    model = TinyDiT(TinyConfig(depth=2)).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # adaLN-zero init would make every block the identity
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    words = torch.tensor([[0, 4, 7, 11]])
    tokens = torch.randn(3, 1, CFG.chunk_len, CFG.patch_dim, generator=gen)
    outs = {}
    for pre in (False, True):
        rope = key_rope(model.cfg) if pre else None
        caches = [ChunkKVCache(FULL_PRECISION, window=2, rope=rope) for _ in range(2)]
        with torch.no_grad():
            for i in range(3):
                t = torch.full((1,), 0.1)
                model.forward_chunk(tokens[i], t, words, i, caches, commit=True, pre_rope=pre)
            outs[pre] = model.forward_chunk(tokens[0], torch.ones(1), words, 3, caches)
    assert torch.equal(outs[False], outs[True])


def test_the_table_memo_keeps_the_latest_positions_and_recomputes_the_same():
    from jbkv_cli.kvcache.rope import MEMO, KeyRope

    built: list[int] = []

    def table(position: int) -> tuple[torch.Tensor, torch.Tensor]:
        built.append(position)
        angles = torch.arange(6.0).repeat(3, 1) * (position + 1)
        return angles.cos(), angles.sin()

    rope = KeyRope("half", table)
    first = rope.tables(0)
    for position in range(1, MEMO + 5):  # a sink re-placed at a new position every step
        rope.tables(position)
    assert len(rope._memo) == MEMO and built == list(range(MEMO + 5))
    rope.tables(MEMO + 4)  # the newest: kept
    assert len(built) == MEMO + 5
    again = rope.tables(0)  # dropped: built again, the same values
    assert built[-1] == 0 and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
