"""Self-Forcing / LongLive checkpoints: upstream key list → diffusers names (fixture derived from
the upstream module tree), loading a weights directory laid out as upstream's downloads,
LoRA merging, pickles that need code refused, and one-line errors for missing or bad weights.

Tiny random weights written in upstream's format; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from safetensors.torch import save_file

from jbkv_cli.kvcache.spec import FULL_PRECISION
from jbkv_cli.models.wan.self_forcing import components as comp
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.self_forcing.checkpoint import (
    convert_checkpoint,
    diffusers_name,
    merge_lora,
    strip_wrappers,
    to_diffusers,
)
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError

FIXTURES = Path(__file__).parent / "fixtures"
_spec = importlib.util.spec_from_file_location("derive_keys", FIXTURES / "derive_keys.py")
derive_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(derive_keys)

TINY_UPSTREAM = dict(
    dim=64, ffn_dim=32, freq_dim=256, text_dim=32, num_layers=2, in_dim=16, out_dim=16
) | {"patch": (1, 2, 2)}
SMALL = dict(height=32, width=32, num_chunks=2, device="cpu", dtype="float32")


def _meta(shapes: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {k: torch.empty(v, device="meta") for k, v in shapes.items()}


# --------------------------------------------------------------------------- the key mapping


def test_self_forcing_fixtures_are_the_derived_key_lists():
    keys = json.loads((FIXTURES / "self_forcing_1.3b_keys.json").read_text())
    lora = json.loads((FIXTURES / "longlive_lora_keys.json").read_text())
    assert keys == derive_keys.derive(derive_keys.WAN_1_3B)
    assert lora == derive_keys.derive_lora(derive_keys.WAN_1_3B, derive_keys.LONGLIVE_RANK)
    assert 1.41e9 < sum(torch.Size(s).numel() for s in keys.values()) < 1.43e9  # 1.419 B


def test_self_forcing_generator_keys_map_onto_diffusers_wan_1_3b():
    from diffusers import WanTransformer3DModel

    upstream = json.loads((FIXTURES / "self_forcing_1.3b_keys.json").read_text())
    mapped = to_diffusers(_meta(upstream))
    assert len(mapped) == len(upstream)  # one to one
    with torch.device("meta"):
        model = WanTransformer3DModel(**comp.WAN_T2V_1_3B)
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert {k: list(v.shape) for k, v in mapped.items()} == expected


def test_self_forcing_longlive_lora_fits_every_block_linear():
    upstream = {
        strip_wrappers(k): v
        for k, v in _meta(
            json.loads((FIXTURES / "self_forcing_1.3b_keys.json").read_text())
        ).items()
    }
    lora = _meta(json.loads((FIXTURES / "longlive_lora_keys.json").read_text()))
    merged = merge_lora(upstream, lora, alpha=256.0)
    assert set(merged) == set(upstream)
    targets = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in lora}
    assert len(targets) == 30 * 10 and all(f"{t}.weight" in upstream for t in targets)


@pytest.mark.parametrize(
    ("upstream", "diffusers"),
    [
        ("model.blocks.7.norm3.bias", "blocks.7.norm2.bias"),  # cross-attn norm
        ("model._fsdp_wrapped_module.blocks.0.ffn.2.weight", "blocks.0.ffn.net.2.weight"),
        ("model.blocks.1.cross_attn.o.weight", "blocks.1.attn2.to_out.0.weight"),
        ("model.blocks.1.modulation", "blocks.1.scale_shift_table"),
        ("model.head.modulation", "scale_shift_table"),
        ("model.time_projection.1.bias", "condition_embedder.time_proj.bias"),
    ],
)
def test_self_forcing_renames(upstream, diffusers):
    assert diffusers_name(strip_wrappers(upstream)) == diffusers


@pytest.mark.parametrize("bad", ["model.blocks.0.norm2.weight", "model.img_emb.proj.0.weight"])
def test_self_forcing_unknown_upstream_keys_are_one_error(bad):
    with pytest.raises(JbkvError, match=r"not part of a causal Wan2\.1 T2V") as err:
        to_diffusers({bad: torch.zeros(1), "model.patch_embedding.bias": torch.zeros(1)})
    assert bad in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- a weights directory


def _upstream_state(transformer) -> dict[str, torch.Tensor]:
    """The tiny diffusers transformer's weights under upstream's names (``model.`` prefix)."""
    sd = transformer.state_dict()
    return {
        k: sd[diffusers_name(strip_wrappers(k))].clone() for k in derive_keys.derive(TINY_UPSTREAM)
    }


@pytest.fixture(scope="module")
def tiny():
    return comp.tiny_components(seed=0)


@pytest.fixture(scope="module")
def weights_root(tiny, tmp_path_factory):
    """ROOT/Wan2.1-T2V-1.3B-Diffusers/ + ROOT/checkpoints/self_forcing_dmd.pt (+ LongLive's)."""
    root = tmp_path_factory.mktemp("sf")
    base = root / comp.BASE_DIR
    tiny.transformer.save_config(base / "transformer")
    tiny.vae.save_pretrained(base / "vae")
    tiny.text_encoder.save_pretrained(base / "text_encoder")
    tiny.tokenizer.save_pretrained(base / "tokenizer")
    ema = _upstream_state(tiny.transformer)
    raw = {k: v + 0.5 for k, v in ema.items()}
    (root / "checkpoints").mkdir()
    checkpoint = {"generator": raw, "generator_ema": ema, "critic": {"w": torch.ones(2)}}
    torch.save(checkpoint | {"step": 600}, root / "checkpoints" / "self_forcing_dmd.pt")
    (root / "models").mkdir()
    torch.save({"generator": ema}, root / "models" / "longlive_base.pt")
    g = torch.Generator().manual_seed(0)
    lora = {}
    for i in range(2):
        for module, (out_f, in_f) in derive_keys.block_linears(TINY_UPSTREAM).items():
            pre = f"base_model.model.blocks.{i}.{module}"
            lora[pre + ".lora_A.weight"] = torch.randn(4, in_f, generator=g) * 0.1
            lora[pre + ".lora_B.weight"] = torch.randn(out_f, 4, generator=g) * 0.1
    torch.save({"generator_lora": lora, "critic_lora": {}, "step": 1}, root / "models" / "lora.pt")
    return root


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_self_forcing_loads_an_upstream_checkpoint(tiny, weights_root, monkeypatch):
    monkeypatch.setenv(comp.ENV_VAR, str(weights_root))
    model = sf.load_model(**SMALL)
    assert model.settings["generator"].endswith("checkpoints/self_forcing_dmd.pt")
    assert model.settings["ema"] and _same_weights(model.components.transformer, tiny.transformer)
    assert model.components.max_sequence_length == 512  # upstream's text_len
    reference = sf.SelfForcing(replace(tiny, max_sequence_length=512), model.config)
    ours, _ = model.generate_latents("a cat", 0, FULL_PRECISION)
    theirs, _ = reference.generate_latents("a cat", 0, FULL_PRECISION)
    assert torch.equal(ours, theirs)
    raw = sf.load_model(weights=str(weights_root), ema=False, **SMALL)
    assert not _same_weights(raw.components.transformer, tiny.transformer)


def test_self_forcing_converted_safetensors_is_preferred(tiny, weights_root, tmp_path):
    root = tmp_path / "w"
    shutil.copytree(weights_root, root)
    src = root / "checkpoints" / "self_forcing_dmd.pt"
    assert convert_checkpoint(src, src.with_suffix(".safetensors"), ema=True) == len(
        derive_keys.derive(TINY_UPSTREAM)
    )
    src.unlink()  # the converted file alone is enough
    model = sf.load_model(weights=str(root), **SMALL)
    assert model.settings["generator"].endswith("self_forcing_dmd.safetensors")
    assert _same_weights(model.components.transformer, tiny.transformer)


def test_self_forcing_longlive_merges_its_lora(tiny, weights_root):
    model = sf.load_model(config="longlive", weights=str(weights_root), lora_alpha=8, **SMALL)
    assert (model.config.window, model.config.sink, model.config.ema) == (2, 1, False)
    lora = torch.load(weights_root / "models" / "lora.pt", weights_only=True)["generator_lora"]
    a = lora["base_model.model.blocks.1.cross_attn.k.lora_A.weight"]
    b = lora["base_model.model.blocks.1.cross_attn.k.lora_B.weight"]
    expected = tiny.transformer.blocks[1].attn2.to_k.weight + (8 / 4) * (b @ a)
    torch.testing.assert_close(
        model.components.transformer.blocks[1].attn2.to_k.weight, expected, atol=1e-6, rtol=0
    )
    unchanged = model.components.transformer.blocks[0].norm2.weight
    assert torch.equal(unchanged, tiny.transformer.blocks[0].norm2.weight)


def test_self_forcing_pickle_code_is_never_run(weights_root, tmp_path):
    bad = tmp_path / "gen.pt"
    state = torch.load(weights_root / "models" / "longlive_base.pt", weights_only=True)
    torch.save(state | {"args": argparse.Namespace(lr=1)}, bad)
    with pytest.raises(JbkvError, match="weights_only=True") as err:
        sf.load_model(weights=str(weights_root), generator=str(bad), **SMALL)
    assert "argparse.Namespace" in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- errors


def test_self_forcing_empty_dir_lists_everything_missing(tmp_path):
    with pytest.raises(WeightsNotFoundError) as err:
        sf.load_model(weights=str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert f"{comp.BASE_DIR}/ ({comp.BASE_REPO}" in message
    assert "checkpoints/self_forcing_dmd.pt" in message
    (tmp_path / comp.BASE_DIR / "transformer").mkdir(parents=True)
    with pytest.raises(WeightsNotFoundError) as err:
        sf.load_model(weights=str(tmp_path))
    for part in ("transformer/config.json", "vae/", "text_encoder/", "tokenizer/"):
        assert f"{comp.BASE_DIR}/{part}" in str(err.value)
    with pytest.raises(WeightsNotFoundError, match=r"models/lora\.pt"):
        sf.load_model(config="longlive", weights=str(tmp_path))


def test_self_forcing_generator_that_is_not_a_regular_file_is_named_as_such(tmp_path):
    """A FIFO would block the read forever: said what it is, not listed as missing."""
    fifo = tmp_path / "gen.pt"
    os.mkfifo(fifo)
    with pytest.raises(JbkvError, match=r"gen\.pt is not a regular file \(a FIFO\)") as err:
        comp.locate("self-forcing-dmd", weights=tmp_path, generator=str(fifo))
    assert not isinstance(err.value, WeightsNotFoundError)


def test_self_forcing_no_weights_anywhere(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.delenv(comp.ENV_VAR, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(WeightsNotFoundError) as err:
        sf.load_model()
    assert comp.BASE_REPO in str(err.value) and "gdhe17/Self-Forcing" in str(err.value)
    with pytest.raises(WeightsNotFoundError, match="does not exist"):
        sf.load_model(weights=str(tmp_path / "nope"))


def _copy(weights_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "w"
    shutil.copytree(weights_root, root)
    return root


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"garbage", "cannot read checkpoint .*Unsupported operand"),
        ({"critic": {"w": torch.ones(1)}}, "holds no generator state dict"),
        ([1, 2], "not a state dict"),
        ("drop", "missing: blocks.1.attn2.to_q.weight"),
        ("shape", "wrong shape: blocks.0.attn1.to_k.bias"),
    ],
    ids=["garbage", "no-generator", "list", "missing-key", "wrong-shape"],
)
def test_self_forcing_malformed_generator_is_one_line(weights_root, tmp_path, content, message):
    path = _copy(weights_root, tmp_path) / "checkpoints" / "self_forcing_dmd.pt"
    if content in ("drop", "shape"):
        state = torch.load(path, weights_only=True)["generator_ema"]
        if content == "drop":
            del state["model.blocks.1.cross_attn.q.weight"]
        else:
            state["model.blocks.0.self_attn.k.bias"] = torch.zeros(3)
        content = {"generator_ema": state}
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(JbkvError, match=message) as err:
        sf.load_model(weights=str(path.parents[1]), **SMALL)
    assert "\n" not in str(err.value)


def test_self_forcing_malformed_safetensors_and_base(weights_root, tmp_path):
    root = _copy(weights_root, tmp_path)
    (root / "checkpoints" / "self_forcing_dmd.safetensors").write_bytes(b"nope")
    with pytest.raises(JbkvError, match="not a safetensors file"):
        sf.load_model(weights=str(root), **SMALL)
    shutil.copy(
        root / "checkpoints" / "self_forcing_dmd.pt", root / "checkpoints" / "x.safetensors"
    )
    with pytest.raises(JbkvError, match="pickle checkpoint"):  # a renamed .pt is still a pickle
        sf.load_model(
            weights=str(root), generator=str(root / "checkpoints" / "x.safetensors"), **SMALL
        )
    (root / "checkpoints" / "self_forcing_dmd.safetensors").unlink()
    config = root / comp.BASE_DIR / "transformer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"_class_name": "Foo"}))
    with pytest.raises(WeightsNotFoundError, match="not a WanTransformer3DModel"):
        sf.load_model(weights=str(root), **SMALL)
    config.write_text("{oops")
    with pytest.raises(WeightsNotFoundError, match="malformed"):
        sf.load_model(weights=str(root), **SMALL)


def test_self_forcing_lora_that_does_not_fit(weights_root, tmp_path):
    root = _copy(weights_root, tmp_path)
    bad = {"base_model.model.blocks.0.self_attn.q.lora_A.weight": torch.zeros(4, 7)}
    bad["base_model.model.blocks.0.self_attn.q.lora_B.weight"] = torch.zeros(64, 4)
    save_file(bad, str(root / "models" / "lora.safetensors"))
    with pytest.raises(JbkvError, match="LoRA does not fit"):
        sf.load_model(config="longlive", weights=str(root), **SMALL)


# --------------------------------------------------------------------------- the names mean the same


def _upstream_forward(w, x, t, text, start_frame=0, heads=2, eps=1e-6):
    """Upstream ``CausalWanModel`` on one chunk (it attends to itself only), written from the
    module math of Self-Forcing's ``wan/modules/{model,causal_model}.py`` and addressing the
    weights by upstream names: patch embedding; sinusoidal time embedding (cos | sin) →
    ``time_embedding`` → ``time_projection`` (6 modulation vectors); ``text_embedding``; per
    block: self-attention on ``norm1(x)(1 + e1) + e0`` with RMS q/k norms and complex RoPE on
    interleaved pairs starting at ``start_frame``, gate e2; cross-attention on the affine
    ``norm3``; FFN on ``norm2(x)(1 + e4) + e3``, gate e5; head on ``norm(x)(1 + h1) + h0``."""

    import torch.nn.functional as F

    def lin(name, v):
        return F.linear(v, w[f"{name}.weight"], w[f"{name}.bias"])

    def rms(name, v):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w[f"{name}.weight"]

    def ln(v, name=None):
        affine = (w[f"{name}.weight"], w[f"{name}.bias"]) if name else (None, None)
        return F.layer_norm(v, v.shape[-1:], *affine, eps=eps)

    conv = w["patch_embedding.weight"]
    dim, d = conv.shape[0], conv.shape[0] // heads
    h = F.conv3d(x, conv, w["patch_embedding.bias"], stride=conv.shape[2:])
    f, gh, gw = h.shape[2:]
    h = h.flatten(2).transpose(1, 2)  # [1, L, dim]
    half = w["time_embedding.0.weight"].shape[1] // 2
    angle = torch.tensor([t], dtype=torch.float64)[:, None] * torch.pow(
        10000, -torch.arange(half, dtype=torch.float64) / half
    )
    sinus = torch.cat([angle.cos(), angle.sin()], dim=1).float()
    e = lin("time_embedding.2", F.silu(lin("time_embedding.0", sinus)))
    e0 = lin("time_projection.1", F.silu(e)).unflatten(1, (6, dim))  # [1, 6, dim]
    ctx = lin("text_embedding.2", F.gelu(lin("text_embedding.0", text), approximate="tanh"))
    c = d // 2
    parts = [c - 2 * (c // 3), c // 3, c // 3]  # complex pairs for (frame, row, column)

    def table(n, pairs, offset=0):
        inv = 1.0 / torch.pow(
            10000, torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs)
        )
        return torch.polar(
            torch.ones(n, pairs, dtype=torch.float64),
            torch.outer(torch.arange(offset, offset + n).double(), inv),
        )

    rot = torch.cat(
        [
            table(f, parts[0], start_frame)[:, None, None].expand(f, gh, gw, -1),
            table(gh, parts[1])[None, :, None].expand(f, gh, gw, -1),
            table(gw, parts[2])[None, None, :].expand(f, gh, gw, -1),
        ],
        dim=-1,
    ).reshape(-1, 1, c)

    def rope(v):  # [1, L, H, d]
        z = torch.view_as_complex(v.double().reshape(*v.shape[:3], c, 2)) * rot
        return torch.view_as_real(z).flatten(3).float()

    def attention(q, k, v):
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)

    i = 0
    while f"blocks.{i}.modulation" in w:
        p = f"blocks.{i}."
        m = (w[p + "modulation"] + e0).chunk(6, dim=1)
        y = ln(h) * (1 + m[1]) + m[0]
        q = rope(rms(p + "self_attn.norm_q", lin(p + "self_attn.q", y)).unflatten(2, (heads, d)))
        k = rope(rms(p + "self_attn.norm_k", lin(p + "self_attn.k", y)).unflatten(2, (heads, d)))
        v = lin(p + "self_attn.v", y).unflatten(2, (heads, d))
        h = h + lin(p + "self_attn.o", attention(q, k, v)) * m[2]
        y = ln(h, p + "norm3")
        q = rms(p + "cross_attn.norm_q", lin(p + "cross_attn.q", y)).unflatten(2, (heads, d))
        k = rms(p + "cross_attn.norm_k", lin(p + "cross_attn.k", ctx)).unflatten(2, (heads, d))
        v = lin(p + "cross_attn.v", ctx).unflatten(2, (heads, d))
        h = h + lin(p + "cross_attn.o", attention(q, k, v))
        y = ln(h) * (1 + m[4]) + m[3]
        h = h + lin(p + "ffn.2", F.gelu(lin(p + "ffn.0", y), approximate="tanh")) * m[5]
        i += 1
    hm = (w["head.modulation"] + e[:, None]).chunk(2, dim=1)
    out = lin("head.head", ln(h) * (1 + hm[1]) + hm[0])  # [1, L, p_t·p_h·p_w·C]
    pt, ph, pw = conv.shape[2:]
    out = out[0].view(f, gh, gw, pt, ph, pw, -1)
    out = torch.einsum("fhwpqrc->cfphqwr", out)
    return out.reshape(1, -1, f * pt, gh * ph, gw * pw)


@pytest.mark.parametrize(
    ("t", "atol"),
    # diffusers computes the sinusoidal timestep embedding in float32, upstream in float64: the
    # angle error grows with t (max |diff| 4e-6 at t = 0, 1e-4 at 250, 4e-4 at 937.5 here)
    [(0.0, 1e-5), (937.5, 1e-3)],
)
@pytest.mark.parametrize("start_frame", [0, 6])
def test_self_forcing_mapped_weights_compute_what_upstream_computes(
    tiny, start_frame, t, atol, plain_cache
):
    """Upstream names through upstream's math == diffusers names through diffusers' model,
    chunk starting at ``start_frame`` (upstream's ``causal_rope_apply`` offset)."""
    import copy

    from jbkv_cli.models.wan.attention import ChunkContext, cached_self_attention

    g = torch.Generator().manual_seed(2)
    transformer = copy.deepcopy(tiny.transformer)
    with torch.no_grad():  # no parameter left at an initial 0 or 1: a swapped name must show
        for param in transformer.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=g))
    upstream = {strip_wrappers(k): v for k, v in _upstream_state(transformer).items()}
    x = torch.randn(1, 16, 3, 4, 4, generator=g)
    text = torch.randn(1, 8, 32, generator=g)
    with torch.no_grad():
        expected = _upstream_forward(upstream, x, t, text, start_frame)
        context = ChunkContext(caches=[plain_cache() for _ in transformer.blocks])
        context.frame_offset = start_frame
        with cached_self_attention(transformer, context):
            got = transformer(x, torch.tensor([t]), text, return_dict=False)[0]
    diff = (got - expected).abs().max()
    print(f"t {t} start {start_frame}: max |diffusers - upstream| = {diff:.2e}")
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)


@pytest.mark.slow
def test_self_forcing_loads_without_library_chatter(tiny, weights_root, tmp_path):
    """A base folder whose VAE is a ``.bin`` (diffusers falls back from safetensors to it) and
    a UMT5 encoder (transformers draws its ``Loading weights`` bar): through the installed
    ``jbkv``, stderr is jbkv's own progress and summary only. It held diffusers' two lines
    ("An error occurred while trying to fetch …", "Defaulting to unsafe serialization …")
    and transformers' bar."""
    from tests.installed import run_jbkv

    root = _copy(weights_root, tmp_path)
    vae = root / comp.BASE_DIR / "vae"
    for weights in vae.glob("*.safetensors"):
        weights.unlink()
    tiny.vae.save_pretrained(vae, safe_serialization=False)
    assert list(vae.glob("*.bin"))
    options = [x for k, v in SMALL.items() for x in ("-o", f"{k}={v}")]
    r = run_jbkv(
        "generate", "--model", "self-forcing", "-o", f"weights={root}", *options,
        "--prompt", "a cat", "--bits", "2", "--out", "run", cwd=tmp_path, columns=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for chatter in ("unsafe serialization", "An error occurred", "Loading weights", "it/s]"):
        assert chatter not in r.stderr, r.stderr
    assert "videos generated" in r.stderr
