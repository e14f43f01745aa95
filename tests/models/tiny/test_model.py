"""The tiny model's attention: cached chunk loop (real ChunkKVCache, 16 bits) == one full
block-causal forward; data grammar; RoPE is relative in time."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache
from jbkv_cli.kvcache.spec import FULL_PRECISION
from jbkv_cli.models.tiny.data import DataConfig, all_prompts, parse_prompt, render
from jbkv_cli.models.tiny.model import (
    TinyConfig,
    TinyDiT,
    apply_rope,
    patchify,
    rope_angles,
    rope_tables,
    unpatchify,
)
from jbkv_cli.utils.errors import JbkvError


def random_model(window: int = 2, depth: int = 2) -> TinyDiT:
    torch.manual_seed(0)
    model = TinyDiT(TinyConfig(depth=depth, window=window))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # adaLN-zero init would make every block the identity
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.mark.parametrize("window", [1, 2])
def test_cached_chunk_loop_equals_full_block_causal_forward(window: int) -> None:
    model = random_model(window)
    cfg = model.cfg
    n, b = window + 2, 2  # long enough for the window to slide (evictions)
    gen = torch.Generator().manual_seed(2)
    clean = torch.randn(b, n, cfg.chunk_len, cfg.patch_dim, generator=gen)
    noisy = torch.randn(b, n, cfg.chunk_len, cfg.patch_dim, generator=gen)
    t_clean, t_noisy = 0.2 * torch.rand(b, n, generator=gen), torch.rand(b, n, generator=gen)
    words = torch.tensor([[0, 4, 7, 11], [3, 6, 9, 13]])
    with torch.no_grad():
        full_noisy = model.forward_train(clean, noisy, t_clean, t_noisy, words)
        full_clean = model.forward_train(clean, None, t_clean, None, words)
        caches = [ChunkKVCache(FULL_PRECISION, window=window) for _ in range(cfg.depth)]
        for i in range(n):
            out = model.forward_chunk(noisy[:, i], t_noisy[:, i], words, i, caches)
            torch.testing.assert_close(out, full_noisy[:, i], atol=1e-5, rtol=1e-5)
            out = model.forward_chunk(clean[:, i], t_clean[:, i], words, i, caches, commit=True)
            torch.testing.assert_close(out, full_clean[:, i], atol=1e-5, rtol=1e-5)
            assert caches[0].num_chunks == min(i + 1, window)
    assert caches[0].num_tokens == window * cfg.chunk_len


def test_rope_scores_depend_on_frame_differences_only() -> None:
    cfg = TinyConfig()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, cfg.chunk_len, cfg.head_dim, generator=gen)
    k = torch.randn(1, 1, cfg.chunk_len, cfg.head_dim, generator=gen)

    def scores(tq: int, tk: int) -> torch.Tensor:
        f = cfg.frames_per_chunk
        qr = apply_rope(q, rope_tables(rope_angles(cfg, tq, f)))
        kr = apply_rope(k, rope_tables(rope_angles(cfg, tk, f)))
        return qr @ kr.transpose(-1, -2)

    torch.testing.assert_close(scores(8, 4), scores(108, 104), atol=1e-3, rtol=1e-4)


def test_patchify_roundtrip() -> None:
    video = torch.rand(2, 4, 3, 32, 32)
    tokens = patchify(video, 4)
    assert tokens.shape == (2, 4 * 64, 48)
    torch.testing.assert_close(unpatchify(tokens, 4, 3, 32), video)


def test_prompt_grammar() -> None:
    p = parse_prompt("A red circle moves right on a dark background.")
    assert (p.colour, p.shape, p.motion, p.background) == ("red", "circle", "right", "dark")
    assert parse_prompt(p.text) == p
    assert len(all_prompts()) == 144
    with pytest.raises(JbkvError, match="only prompts of the form"):
        parse_prompt("a cat playing piano")
    with pytest.raises(JbkvError, match="unknown colour 'purple'"):
        parse_prompt("a purple circle moves left on a dark background")


def test_render_moves_the_shape_in_the_named_direction() -> None:
    prompts = [
        parse_prompt(f"a red square moves {d} on a dark background") for d in ("right", "up")
    ]
    video = render(prompts, DataConfig(num_frames=6), torch.Generator().manual_seed(0))
    mask = (video[:, :, 0] > 0.5).float()  # red channel of the shape
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    cx = (mask * xs).sum((-1, -2)) / mask.sum((-1, -2))
    cy = (mask * ys).sum((-1, -2)) / mask.sum((-1, -2))
    assert cx[0, -1] > cx[0, 0] + 2 and abs(cy[0, -1] - cy[0, 0]) < 0.1
    assert cy[1, -1] < cy[1, 0] - 2 and abs(cx[1, -1] - cx[1, 0]) < 0.1
