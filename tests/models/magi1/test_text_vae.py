"""T5 loading (tiny random config), MAGI-1's caption padding rules, and the ViT VAE."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from jbkv_cli.models.magi1 import load_vae
from jbkv_cli.models.magi1.config import TINY_VAE, VAEConfig
from jbkv_cli.models.magi1.text import (
    SpecialTokens,
    build_text_condition,
    clean_caption,
    load_t5,
)
from jbkv_cli.models.magi1.tiny import char_tokenizer, tiny_t5_config, tiny_vae
from jbkv_cli.models.magi1.vae import ViTVAE, tiled_decode, to_uint8
from jbkv_cli.utils.errors import WeightsNotFoundError


def test_t5_loads_from_local_dir_and_encodes(tmp_path):
    from transformers import T5EncoderModel

    torch.manual_seed(0)
    d = tmp_path / "t5" / "t5-v1_1-xxl"
    T5EncoderModel(tiny_t5_config(32)).save_pretrained(str(d))
    char_tokenizer().save_pretrained(str(d))
    enc = load_t5(tmp_path / "t5", max_length=16)
    emb, mask = enc.encode("A Cat runs")
    assert emb.shape == (1, 16, 32) and emb.dtype == torch.float32
    assert mask.tolist()[0] == [1] * 11 + [0] * 5  # 10 characters + </s>
    emb2, _ = enc.encode("a cat runs")
    assert torch.equal(emb, emb2)  # captions are lower-cased


def test_t5_missing_dir(tmp_path):
    with pytest.raises(WeightsNotFoundError, match=r"config\.json"):
        load_t5(tmp_path, max_length=8)


def test_clean_caption():
    assert clean_caption("  A <b>Dog</b>   runs  https://x.com/a ") == "a dog runs"
    assert clean_caption("“Hello”") == "hello"


def _special(c=4):
    return SpecialTokens(hq=torch.full((c,), 9.0), duration=torch.arange(8.0)[:, None].repeat(1, c))


def test_caption_padding_rules():
    length, c, n = 8, 4, 3
    emb = torch.ones(1, length, c)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0]])
    null = torch.full((length, c), -1.0)
    text = build_text_condition(emb, mask, null, n, _special(c))
    assert text.cond.shape == (n, length, c)
    for i in range(n):
        # [DURATION_{n-1-i}, HQ, caption...]
        assert float(text.cond[i, 0, 0]) == float(n - 1 - i)
        assert float(text.cond[i, 1, 0]) == 9.0
        assert text.cond_mask[i].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert bool((text.null == -1).all()) and text.null_mask.sum() == n * length  # 50 > L
    many = build_text_condition(emb, mask, null, 12, _special(c))
    assert float(many.cond[0, 0, 0]) == 7.0  # DURATION index saturates at 8 chunks
    empty = build_text_condition(emb, torch.zeros_like(mask), null, n, _special(c))
    assert torch.equal(empty.cond, empty.null)


def test_special_tokens_npz(tmp_path):
    other = np.random.default_rng(0).normal(size=(100, 4))
    np.savez(
        tmp_path / "special_tokens.npz",
        caption_token=other[:1],
        logo_token=other[:1],
        other_tokens=other,
    )
    tok = SpecialTokens.from_npz(tmp_path / "special_tokens.npz")
    want = torch.from_numpy(other.astype(np.float16)).float()
    assert torch.equal(tok.hq, want[1]) and torch.equal(tok.duration, want[7:15])
    with pytest.raises(WeightsNotFoundError):
        SpecialTokens.from_npz(tmp_path / "nope.npz")


def test_vae_keys_follow_upstream():
    with torch.device("meta"):
        vae = ViTVAE(VAEConfig())
    keys = vae.state_dict()
    assert tuple(keys["encoder.patch_embed.proj.weight"].shape) == (1024, 3, 4, 8, 8)
    assert tuple(keys["decoder.proj_in.weight"].shape) == (1024, 16)
    assert tuple(keys["decoder.last_layer.weight"].shape) == (3, 4, 3, 3, 3)
    assert tuple(keys["encoder.last_layer.weight"].shape) == (32, 1024)
    assert "encoder.blocks.23.attn.qkv.bias" in keys and "decoder.blocks.23.mlp.fc2.bias" in keys
    assert not any(".norm1." in k for k in keys)  # ln_in_attn: no pre-attention LayerNorm
    per_block = {k.split(".", 3)[3] for k in keys if k.startswith("encoder.blocks.0.")}
    assert per_block == {
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.proj.weight",
        "attn.proj.bias",
        "norm2.weight",
        "norm2.bias",
        "mlp.fc1.weight",
        "mlp.fc1.bias",
        "mlp.fc2.weight",
        "mlp.fc2.bias",
    }


def test_tiny_vae_shapes_and_strict_load(tmp_path):
    vae = tiny_vae()
    x = torch.rand(1, 3, 8, 32, 32) * 2 - 1
    z = vae.encode(x)
    assert z.shape == (1, TINY_VAE.z_chans, 2, 4, 4)
    out = vae.decode(z)
    assert out.shape == (1, 3, 8, 32, 32)
    sampled = vae.encode(x, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == z.shape and not torch.equal(sampled, z)
    # other grids resize the learned positions
    assert vae.decode(torch.randn(1, 4, 3, 6, 4)).shape == (1, 3, 12, 48, 32)
    cfg = {k: getattr(TINY_VAE, k) for k in TINY_VAE.__dataclass_fields__}
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "ViTVAE", "ddconfig": cfg}))
    save_file(
        {k: v.contiguous() for k, v in vae.state_dict().items()},
        str(tmp_path / "diffusion_pytorch_model.safetensors"),
    )
    loaded = load_vae(tmp_path)
    torch.testing.assert_close(loaded.decode(z), out)


def test_tiled_decode_single_tile_equals_decode_and_blends():
    vae = tiny_vae()
    z = torch.randn(1, 4, 2, 4, 4)
    torch.testing.assert_close(tiled_decode(vae, z, tile_px=256), vae.decode(z))
    big = torch.randn(1, 4, 6, 8, 12)
    out = tiled_decode(vae, big, tile_px=32, tile_frames=8, overlap=0.25)
    # stride 3 latents = 24 px; tiles cropped to 24 px and blended over 8 px
    assert out.shape[:3] == (1, 3, 24)
    frames = to_uint8(out)
    assert frames.dtype == torch.uint8 and frames.shape[-1] == 3
