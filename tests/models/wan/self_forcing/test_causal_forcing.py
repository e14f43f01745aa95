"""Causal-Forcing / Causal-Forcing++ through the ``self-forcing`` adapter: upstream's presets
(thu-ml/Causal-Forcing @1fc7bbc1), the frame-wise cached loop against a cache-free statement of
it (first-chunk step list, image latent as frame 0, a rolling window), checkpoints with FSDP's
``model._fsdp_wrapped_module.`` prefix, and bad inputs through the installed ``jbkv``.

All on CPU in float32 with the tiny random configuration; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from PIL import Image
from safetensors.torch import save_file
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.models.wan.self_forcing import components as comp
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.self_forcing.checkpoint import diffusers_name, strip_wrappers
from jbkv_cli.models.wan.self_forcing.image import image_pixels
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule
from jbkv_cli.utils.errors import JbkvError, UsageError, WeightsNotFoundError
from jbkv_cli.utils.video import read_video
from tests.installed import JBKV, run_jbkv, run_refusal

pytestmark = pytest.mark.slow

ATOL = 1e-5  # fp32: cached loop vs cache-free re-runs under a mask
FSDP = "model._fsdp_wrapped_module."
FRAMEWISE = dict(config="tiny-random", chunk_frames=1, num_chunks=5, window=20, device="cpu")
TINY_CLI = ["-m", "self-forcing", "-o", "config=tiny-random", "--device", "cpu"]
FRAMEWISE_CLI = [*TINY_CLI, "-o", "chunk_frames=1", "-o", "num_chunks=4", "-o", "steps=1"]
FRAMEWISE_CLI += ["-o", "first_chunk_steps=4"]

_spec = importlib.util.spec_from_file_location(
    "derive_keys", Path(__file__).parent / "fixtures" / "derive_keys.py"
)
derive_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(derive_keys)
TINY_UPSTREAM = dict(
    dim=64, ffn_dim=32, freq_dim=256, text_dim=32, num_layers=2, in_dim=16, out_dim=16
) | {"patch": (1, 2, 2)}


@pytest.fixture(scope="module")
def image_path(tmp_path_factory) -> Path:
    """A small RGB picture (a gradient, so the VAE sees structure), not the video's size."""
    path = tmp_path_factory.mktemp("img") / "first.png"
    g = torch.Generator().manual_seed(0)
    pixels = (torch.rand(40, 56, 3, generator=g) * 255).to(torch.uint8)
    Image.fromarray(pixels.numpy()).save(path)
    return path


# --------------------------------------------------------------------------- presets


def test_causal_forcing_presets_are_upstreams_defaults():
    """``configs/causal_forcing_dmd_*.yaml`` + ``inference.py`` + the README's commands."""
    p = sf.PRESETS
    chunkwise = p["causal-forcing-chunkwise"]
    assert (chunkwise["chunk_frames"], chunkwise["num_chunks"], chunkwise["window"]) == (3, 7, 6)
    assert chunkwise["ema"] is False and chunkwise["steps"] == 4  # README: no --use_ema
    assert chunkwise["first_chunk_steps"] is None
    for name, steps, first in [
        ("causal-forcing-framewise", 4, None),
        ("causal-forcing-pp-2step", 2, 4),
        ("causal-forcing-pp-1step", 1, 4),
    ]:
        preset = p[name]
        # num_frame_per_block 1; 21 latent frames; the 32760-token buffer = current + 20
        assert (preset["chunk_frames"], preset["num_chunks"], preset["window"]) == (1, 21, 20)
        assert (preset["steps"], preset["first_chunk_steps"], preset["ema"]) == (steps, first, True)
        assert (preset["height"], preset["width"], preset["shift"]) == (480, 832, 5.0)
    assert {n: sf.HORIZONS[n] for n in p if n.startswith("causal")} == dict.fromkeys(
        [n for n in p if n.startswith("causal")], 21
    )
    files = {n: comp.GENERATORS[n].file for n in p if n.startswith("causal")}
    assert files == {
        "causal-forcing-chunkwise": "chunkwise/causal_forcing.pt",
        "causal-forcing-framewise": "framewise/causal_forcing.pt",
        "causal-forcing-pp-2step": "causal-forcing++/framewise-2step.pt",
        "causal-forcing-pp-1step": "causal-forcing++/framewise-1step.pt",
    }
    assert {g.repo_id for n, g in comp.GENERATORS.items() if n.startswith("causal")} == {
        "zhuhz22/Causal-Forcing"
    }


def test_causal_forcing_step_lists_are_warped_as_self_forcings():
    """[1000, 500] and [1000] index the shifted table at 1000 − t, as [1000, 750, 500, 250]."""
    two, one = FewStepSchedule.build(2, 5.0), FewStepSchedule.build(1, 5.0)
    assert two.timesteps == pytest.approx((1000.0, 2500 / 3), abs=1e-4)  # σ(s=0.5) = 5/6
    assert one.timesteps == (1000.0,) and one.sigmas == (1.0,)


# --------------------------------------------------------------------------- the loop


@pytest.mark.parametrize(
    ("steps", "first", "window", "with_image"),
    [(1, 4, 20, False), (2, 4, 2, False), (4, None, 20, True), (1, 4, 2, True)],
    ids=["pp-1step", "pp-2step-window2", "framewise-i2v", "pp-1step-i2v-window2"],
)
def test_causal_forcing_framewise_loop_equals_a_cache_free_sampler(
    steps, first, window, with_image, image_path, cache_free
):
    """Chunks of one latent frame (4 current tokens against up to 20 cached frames)."""
    model = sf.load_model(**FRAMEWISE | dict(steps=steps, first_chunk_steps=first, window=window))
    image = model.encode_image(str(image_path), "a cat") if with_image else None
    with torch.no_grad():
        ours, _ = model.generate_latents("a cat", 3, FULL_PRECISION, image=image, name="a cat")
        reference = cache_free(model, "a cat", 3, image)
    print(f"max |cached - cache-free| = {(ours - reference).abs().max():.2e}")
    assert ours.shape == (1, 16, 5, 4, 4)
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
    if image is not None:
        assert torch.equal(ours[:, :, :1], image)  # the image latent is frame 0, unchanged


def _timesteps_seen(model, monkeypatch, case) -> list[float]:
    seen: list[float] = []
    flow = model.flow

    def recording(x, t, text):
        seen.append(round(float(t), 4))
        return flow(x, t, text)

    monkeypatch.setattr(model, "flow", recording)
    model.generate(case, 0, FULL_PRECISION)
    return seen


def test_causal_forcing_first_chunk_uses_its_step_list(monkeypatch, image_path):
    """Causal-Forcing++: 4 steps for the first generated chunk, 1 after; with an image, the
    image's t = 0 commit comes first and the first *generated* chunk takes the 4 steps."""
    model = sf.load_model(**FRAMEWISE | dict(num_chunks=3, steps=1, first_chunk_steps=4))
    assert model.settings["first_chunk_timesteps"] == [1000.0, 937.5, 833.3333, 625.0]
    assert model.settings["timesteps"] == [1000.0]
    four = [1000.0, 937.5, 833.3333, 625.0]
    assert _timesteps_seen(model, monkeypatch, "a cat") == [*four, 0.0, 1000.0, 0.0, 1000.0]
    monkeypatch.undo()
    i2v = _timesteps_seen(model, monkeypatch, Case("a cat", image=str(image_path)))
    assert i2v == [0.0, *four, 0.0, 1000.0]


def test_causal_forcing_image_is_resized_scaled_and_encoded_as_upstream(image_path):
    model = sf.load_model(**FRAMEWISE)
    pixels = image_pixels(Image.new("RGB", (7, 5), (255, 0, 51)), 32, 48)
    assert pixels.shape == (1, 3, 1, 32, 48)
    expected = torch.tensor([1.0, -1.0, 51 / 127.5 - 1]).view(1, 3, 1, 1, 1).expand_as(pixels)
    torch.testing.assert_close(pixels, expected, atol=1e-6, rtol=0)
    vae = model.components.vae
    latent = model.encode_image(str(image_path), "a cat")
    with Image.open(image_path) as img:
        picture = img.convert("RGB").resize((32, 32), Image.BILINEAR).tobytes()
    rgb = torch.tensor(list(picture), dtype=torch.float32).view(32, 32, 3).permute(2, 0, 1)
    x = (rgb / 127.5 - 1)[None, :, None]
    with torch.no_grad():
        mu = vae.encode(x).latent_dist.mean
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(latent, (mu - mean) / std, atol=1e-5, rtol=1e-5)
    assert latent.shape == model.chunk_shape


def test_causal_forcing_i2v_generates_int2_taylor_videos(image_path):
    model = sf.load_model(**FRAMEWISE | dict(steps=1, first_chunk_steps=4))
    case = Case("a cat", image=str(image_path))
    spec = KVSpec.build("rtn", bits=2, correction="taylor")
    video = model.generate(case, 0, spec)
    assert video.frames.shape == (17, 32, 32, 3) and video.info["image"] == str(image_path)
    assert video.kv_cache_bytes > 0 and video.info["kv"] == spec.label
    t2v = model.generate("a cat", 0, spec)
    assert not torch.equal(video.frames, t2v.frames)


# --------------------------------------------------------------------------- checkpoints


def _upstream_state(transformer, prefix: str) -> dict[str, torch.Tensor]:
    """The tiny transformer's weights under upstream's names, behind ``prefix``."""
    sd = transformer.state_dict()
    names = derive_keys.derive(TINY_UPSTREAM)  # "model.blocks.0…"
    return {
        prefix + k.removeprefix("model."): sd[diffusers_name(strip_wrappers(k))].clone()
        for k in names
    }


class NotATensor:
    """A class a weights-only unpickler refuses."""


@pytest.fixture(scope="module")
def causal_root(tmp_path_factory):
    """ROOT/Wan2.1-T2V-1.3B-Diffusers/ + Causal-Forcing's files at their repo paths: EMA under
    FSDP's prefix (what the released framewise files hold), raw weights under ``model.``."""
    tiny = comp.tiny_components(seed=0)
    root = tmp_path_factory.mktemp("cf")
    base = root / comp.BASE_DIR
    tiny.transformer.save_config(base / "transformer")
    tiny.vae.save_pretrained(base / "vae")
    tiny.text_encoder.save_pretrained(base / "text_encoder")
    tiny.tokenizer.save_pretrained(base / "tokenizer")
    ema = _upstream_state(tiny.transformer, FSDP)
    raw = {k: v + 0.5 for k, v in _upstream_state(tiny.transformer, "model.").items()}
    for rel in ("framewise/causal_forcing.pt", "chunkwise/causal_forcing.pt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"generator": raw, "generator_ema": ema, "step": 100}, root / rel)
    pp = root / "causal-forcing++"
    pp.mkdir()
    save_file(ema, str(pp / "framewise-1step.safetensors"))  # a flat file, prefixed keys
    torch.save({"generator_ema": ema, "args": NotATensor()}, pp / "framewise-2step.pt")
    return root, tiny


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


SMALL = dict(height=32, width=32, num_chunks=2, device="cpu", dtype="float32")


def test_causal_forcing_checkpoint_prefix_is_stripped(causal_root):
    root, tiny = causal_root
    framewise = sf.load_model(config="causal-forcing-framewise", weights=str(root), **SMALL)
    assert framewise.settings["generator"].endswith("framewise/causal_forcing.pt")
    assert framewise.config.ema and _same(framewise.components.transformer, tiny.transformer)
    chunkwise = sf.load_model(config="causal-forcing-chunkwise", weights=str(root), **SMALL)
    assert not chunkwise.config.ema  # reads "generator": the raw weights, + 0.5
    w = chunkwise.components.transformer.blocks[0].attn1.to_q.weight
    assert torch.equal(w, tiny.transformer.blocks[0].attn1.to_q.weight + 0.5)
    one = sf.load_model(config="causal-forcing-pp-1step", weights=str(root), **SMALL)
    assert one.settings["generator"].endswith("framewise-1step.safetensors")
    assert _same(one.components.transformer, tiny.transformer)
    assert one.settings["first_chunk_timesteps"] == [1000.0, 937.5, 833.3333, 625.0]


def test_causal_forcing_checkpoint_is_read_weights_only(causal_root):
    root, _ = causal_root
    with pytest.raises(JbkvError, match="weights_only=True") as err:
        sf.load_model(config="causal-forcing-pp-2step", weights=str(root), **SMALL)
    assert "NotATensor" in str(err.value) and "\n" not in str(err.value)


def test_causal_forcing_missing_weights_name_the_repo_and_file(tmp_path):
    with pytest.raises(WeightsNotFoundError) as err:
        sf.check_options(config="causal-forcing-pp-1step", weights=str(tmp_path))
    message = str(err.value)
    assert "causal-forcing++/framewise-1step.pt" in message and "zhuhz22/Causal-Forcing" in message


# --------------------------------------------------------------------------- bad inputs


def test_causal_forcing_horizon_and_rotary_table_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="trained on 21 latent frames"):
        sf.check_options(config="causal-forcing-framewise", num_chunks=22)
    with pytest.raises(UsageError, match="trained on 21 latent frames"):
        sf.check_options(config="causal-forcing-chunkwise", num_frames=93)
    with pytest.raises(WeightsNotFoundError):  # past the horizon on request: on to the weights
        sf.check_options(
            config="causal-forcing-framewise", num_chunks=22, beyond_horizon=True, weights=tmp_path
        )
    with pytest.raises(UsageError, match="rotary table"):  # Causal-Forcing #2: 3,000 frames
        sf.check_options(
            config="causal-forcing-framewise", num_chunks=1024, chunk_frames=3, beyond_horizon=True
        )


_jbkv = run_jbkv


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-o", "config=causal-forcing-framewise", "-o", "num_chunks=22"], "trained on 21"),
        (["-o", "config=tiny-random", "-o", "chunk_frames=1", "-o", "num_chunks=33"], "rotary"),
        (["-o", "config=tiny-random", "--image", "IMAGE"], "needs a frame-wise config"),
        (["-o", "config=tiny-random", "-o", "chunk_frames=1", "--image", "nope.png"], "not a file"),
        (["-o", "config=tiny-random", "-o", "chunk_frames=1", "--image", "BAD"], "cannot read"),
        (["-o", "config=tiny-random", "--image", "IMAGE", "--cases", "CASES"], "leave out"),
    ],
    ids=["horizon", "rope", "chunkwise-image", "no-image", "bad-image", "image-and-cases"],
)
def test_causal_forcing_bad_inputs_are_one_line_usage_errors(extra, message, image_path, tmp_path):
    if not Path(JBKV).is_file():
        pytest.skip(f"no installed jbkv next to {sys.executable}")
    bad = tmp_path / "bad.png"
    bad.write_text("not a picture")
    cases = tmp_path / "cases.csv"
    cases.write_text(f"prompt,image\na cat,{image_path}\n")
    subs = {"IMAGE": image_path, "BAD": bad, "CASES": cases}
    extra = [subs.get(a, a) for a in extra]
    out = tmp_path / "run"
    args = ["generate", "-m", "self-forcing", "--device", "cpu", *extra]
    if "--cases" not in extra:
        args += ["--prompt", "a cat"]
    first = "config=causal-forcing-framewise" in extra  # through the installed jbkv too
    result = run_refusal(*args, "--out", out, cwd=tmp_path, installed=first)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- the CLI


def test_causal_forcing_i2v_generate_through_the_installed_jbkv(image_path, tmp_path):
    if not Path(JBKV).is_file():
        pytest.skip(f"no installed jbkv next to {sys.executable}")
    out = tmp_path / "run"
    args = ["generate", *FRAMEWISE_CLI, "--image", image_path, "--prompt", "a cat"]
    result = _jbkv(*args, "--bits", "2", "--correct", "--out", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cases"]["a cat"]["image"] == str(image_path.resolve())
    assert manifest["settings"]["first_chunk_timesteps"] == [1000.0, 937.5, 833.3333, 625.0]
    for variant in ("reference", "int2-rtn-g32-taylor"):
        frames, _ = read_video(out / "videos" / variant / "a cat-0.mkv")
        assert frames.shape == (13, 32, 32, 3)
    # the same prompt without the image is another case: refused in this run folder
    again = _jbkv("generate", *FRAMEWISE_CLI, "--prompt", "a cat", "--out", out, cwd=tmp_path)
    assert again.returncode == 2 and "other inputs" in again.stderr


def test_causal_forcing_quantize_eval_with_an_image(image_path, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "quantize-eval",
            *FRAMEWISE_CLI,
            "--image",
            str(image_path),
            "--prompt",
            "a cat",
            "--bits",
            "2",
            "--quantizers",
            "rtn",
            "--corrections",
            "none,taylor",
            "--no-lpips",
            "--no-plots",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "INT2 rtn g32 +taylor" in result.output
