"""HY-WorldPlay's weights: upstream's key names, a strict load, quantized checkpoints refused,
missing parts listed in one error, and the reused prompt template checked against upstream's.

The key fixtures (``upstream_dit_keys.txt``, ``upstream_vae_keys.txt``) list the parameter names
and shapes of upstream's modules (Tencent-Hunyuan/HY-WorldPlay@da2d0c2) built with small
widths; every checkpoint here is a tiny safetensors made in the test (nothing is downloaded).
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from jbkv_cli.models.hy_worldplay import checkpoint
from jbkv_cli.models.hy_worldplay.config import TINY
from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT
from jbkv_cli.models.hy_worldplay.tiny import tiny_dit
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError

HERE = Path(__file__).parent

# hyvideo/models/text_encoders/__init__.py, PROMPT_TEMPLATE_ENCODE_VIDEO_JSON's system content:
# a string literal continued with backslashes, so each continuation keeps its 8-space indent.
UPSTREAM_VIDEO_SYSTEM = (
    "You are a helpful assistant. Describe the video by detailing the following aspects: "
    "        1. The main content and theme of the video. "
    "        2. The color, shape, size, texture, quantity, text, and spatial relationships of the "
    "objects. "
    "        3. Actions, events, behaviors temporal relationships, physical movement changes of the "
    "objects. "
    "        4. background environment, light, style and atmosphere. "
    "        5. camera angles, movements, and transitions used in the video."
)


def fixture_keys(name: str) -> dict[str, tuple[int, ...]]:
    out = {}
    for line in (HERE / name).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, shape = line.split(" ", 1)
        out[key] = tuple(int(x) for x in shape.strip("(),").split(",") if x.strip())
    return out


def shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_hy_worldplay_dit_keys_are_upstreams():
    """The fixture's module (hidden 64, ByT5 mapper at upstream's fixed 1472/2048) and the port
    built with the same widths have the same names and shapes."""
    with torch.device("meta"):
        dit = WorldPlayDiT(replace(TINY, byt5_dim=1472, byt5_hidden=2048))
    expected = fixture_keys("upstream_dit_keys.txt")
    assert shapes(dit) == expected
    assert any(k.endswith("img_attn_prope_proj.weight") for k in expected)
    assert "action_in.mlp.2.weight" in expected


def test_hy_worldplay_vae_keys_map_to_diffusers():
    """Upstream's VAE names, renamed by :func:`diffusers_key`, are exactly diffusers' module's
    (same widths), shapes included."""
    from jbkv_cli.models.hy_worldplay.vae import build_vae, diffusers_key

    vae = build_vae(
        {
            "latent_channels": 4,
            "block_out_channels": (8, 8, 16),
            "layers_per_block": 1,
            "spatial_compression_ratio": 4,
            "temporal_compression_ratio": 4,
        }
    )
    upstream = fixture_keys("upstream_vae_keys.txt")
    assert {diffusers_key(k): v for k, v in upstream.items()} == shapes(vae)


def test_hy_worldplay_vae_config_reads_upstream_names(tmp_path):
    from jbkv_cli.models.hy_worldplay.vae import vae_config

    (tmp_path / "config.json").write_text(
        '{"latent_channels": 32, "block_out_channels": [128, 256], "ffactor_spatial": 16, '
        '"ffactor_temporal": 4, "scaling_factor": 1.03682, "shift_factor": null}'
    )
    assert vae_config(tmp_path) == {
        "latent_channels": 32,
        "block_out_channels": (128, 256),
        "spatial_compression_ratio": 16,
        "temporal_compression_ratio": 4,
        "scaling_factor": 1.03682,
    }


def save(state: dict[str, torch.Tensor], path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def test_hy_worldplay_strict_load_round_trips(tmp_path):
    src = tiny_dit(TINY, seed=3)
    path = save(src.state_dict(), tmp_path / "model.safetensors")
    with torch.device("meta"):
        dst = WorldPlayDiT(TINY)
    checkpoint.load_strict(dst, path, "tiny")
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k


def test_hy_worldplay_strict_load_names_every_mismatch(tmp_path):
    state = dict(tiny_dit(TINY).state_dict())
    del state["action_in.mlp.0.weight"]
    state["double_blocks.0.img_attn_prope.weight"] = torch.zeros(2)
    state["final_layer.linear.bias"] = torch.zeros(5)
    path = save(state, tmp_path / "model.safetensors")
    with torch.device("meta"):
        dst = WorldPlayDiT(TINY)
    with pytest.raises(JbkvError) as err:
        checkpoint.load_strict(dst, path, "tiny")
    msg = str(err.value)
    assert "missing: action_in.mlp.0.weight" in msg
    assert "unexpected: double_blocks.0.img_attn_prope.weight" in msg
    assert "wrong shape: final_layer.linear.bias (5,) != (4,)" in msg


@pytest.mark.parametrize(
    "extra",
    [
        {"w": torch.zeros(4, dtype=torch.float8_e4m3fn)},
        {"w": torch.zeros(4, dtype=torch.int8)},
        {"double_blocks.0.img_attn_q.weight_scale": torch.ones(1)},
    ],
)
def test_hy_worldplay_quantized_checkpoints_are_refused(tmp_path, extra):
    path = save({"a": torch.zeros(2, dtype=torch.bfloat16), **extra}, tmp_path / "m.safetensors")
    with pytest.raises(JbkvError, match="is a quantized checkpoint"):
        checkpoint.refuse_quantized(path)


def full_layout(root: Path, skip: str | None = None) -> Path:
    """Every file :func:`checkpoint.locate` looks for (empty placeholders), but ``skip``'s."""
    paths = checkpoint.layout(root, root)
    files = {
        "dit": [paths.dit],
        "dit_config": [paths.dit_config],
        "vae": [paths.vae / "config.json", paths.vae / "diffusion_pytorch_model.safetensors"],
        "qwen": [paths.qwen / "config.json"],
        "byt5": [paths.byt5 / "config.json"],
        "glyph": [
            paths.glyph / "assets" / "color_idx.json",
            paths.glyph / "assets" / "multilingual_10-lang_idx.json",
            paths.glyph / "checkpoints" / "byt5_model.safetensors",
        ],
        "siglip": [
            paths.siglip / "image_encoder" / "config.json",
            paths.siglip / "feature_extractor" / "preprocessor_config.json",
        ],
    }
    for part, items in files.items():
        if part == skip:
            continue
        for f in items:
            f.parent.mkdir(parents=True, exist_ok=True)
            if part == "dit":
                save({"a": torch.zeros(2, dtype=torch.bfloat16)}, f)
            else:
                f.write_text("{}")
    return root


def test_hy_worldplay_locate_lists_everything_missing_in_one_error(tmp_path):
    with pytest.raises(WeightsNotFoundError) as err:
        checkpoint.locate(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    for source in checkpoint.SOURCES.values():
        assert source in msg
    assert "ar_distilled_action_model" in msg and "gated" in msg


def test_hy_worldplay_locate_names_the_gated_siglip(tmp_path):
    root = full_layout(tmp_path / "w", skip="siglip")
    with pytest.raises(WeightsNotFoundError, match=r"FLUX\.1-Redux-dev \(gated") as err:
        checkpoint.locate(root)
    assert "Qwen" not in str(err.value) and "vision_encoder/siglip" in str(err.value)
    full_layout(root)
    assert checkpoint.locate(root).dit.name == "diffusion_pytorch_model.safetensors"


def test_hy_worldplay_locate_env_and_hf_cache(tmp_path, monkeypatch):
    root = full_layout(tmp_path / "env")
    monkeypatch.setenv(checkpoint.ENV_VAR, str(root))
    assert checkpoint.locate().qwen == root / "text_encoder" / "llm"
    monkeypatch.delenv(checkpoint.ENV_VAR)
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    base = hub / "models--tencent--HunyuanVideo-1.5" / "snapshots" / "abc"
    play = hub / "models--tencent--HY-WorldPlay" / "snapshots" / "def"
    full_layout(base, skip="dit")
    (play / checkpoint.DIT_DIR).mkdir(parents=True)
    save({"a": torch.zeros(2)}, play / checkpoint.DIT_DIR / "model.safetensors")
    found = checkpoint.locate()
    assert found.dit == play / checkpoint.DIT_DIR / "model.safetensors"
    assert found.vae == base / "vae"


def test_hy_worldplay_transformer_config_must_be_the_ported_one(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"hidden_size": 2048, "heads_num": 16, "mm_double_blocks_depth": 54}')
    bad.write_text('{"hidden_size": 3072, "mm_single_blocks_depth": 20}')
    checkpoint.check_dit_config(good)
    with pytest.raises(JbkvError, match=r"hidden_size=3072 \(jbkv: 2048\), mm_single_blocks_depth"):
        checkpoint.check_dit_config(bad)


def test_hy_worldplay_prompt_template_is_upstreams():
    """diffusers' default system message (reused) is upstream's video template, to the space."""
    from jbkv_cli.models.hy_worldplay.encoders import system_message

    assert system_message() == UPSTREAM_VIDEO_SYSTEM


@pytest.mark.slow
def test_hy_worldplay_glyph_checkpoint_is_converted_to_safetensors(tmp_path):
    """Glyph-SDXL-v2's ``byt5_model.pt`` (a pickle of ``state_dict``) becomes a safetensors of
    the ByT5 encoder stack's tensors, prefix stripped, through the installed jbkv."""

    from safetensors.torch import load_file

    block = torch.arange(6.0).reshape(2, 3)
    src = tmp_path / "byt5_model.pt"
    torch.save(
        {
            "state_dict": {
                "module.text_tower.encoder.block.0.layer.0.SelfAttention.q.weight": block,
                "module.text_tower.shared.weight": torch.zeros(2),
                "module.other.weight": torch.ones(1),
            }
        },
        src,
    )
    from tests.installed import run_jbkv

    r = run_jbkv("convert-checkpoint", src, "--glyph")
    assert r.returncode == 0, r.stderr
    out = load_file(str(tmp_path / "byt5_model.safetensors"))
    assert list(out) == ["block.0.layer.0.SelfAttention.q.weight"]
    assert torch.equal(out["block.0.layer.0.SelfAttention.q.weight"], block)


def test_hy_worldplay_vae_decoder_attends_within_each_latent_frame():
    """Upstream's default decode (``hunyuanvideo_15_vae_w_cache.AutoencoderKLConv3D.decode``,
    untiled as ``run.sh`` runs it) feeds the decoder one latent at a time, so its mid-block
    attention sees one frame: jbkv's decoder attention on T frames equals T one-frame calls
    (diffusers' causal default would let frame t read frames < t)."""
    from diffusers import AutoencoderKLHunyuanVideo15

    from jbkv_cli.models.hy_worldplay.tiny import TINY_VAE
    from jbkv_cli.models.hy_worldplay.vae import build_vae

    torch.manual_seed(0)
    attn = build_vae(TINY_VAE).decoder.mid_block.attentions[0]
    x = torch.randn(1, attn.in_channels, 3, 2, 3)
    with torch.no_grad():
        whole = attn(x)
        frames = torch.cat([attn(x[:, :, t : t + 1]) for t in range(3)], dim=2)
        plain = AutoencoderKLHunyuanVideo15(**TINY_VAE).decoder.mid_block.attentions[0]
        plain.load_state_dict(attn.state_dict())
        causal = plain(x)
    assert torch.allclose(whole, frames, atol=1e-6)
    assert not torch.allclose(causal[:, :, 1:], frames[:, :, 1:], atol=1e-3)
