"""CausVid through the ``self-forcing`` adapter: upstream's presets (tianweiy/CausVid @ca21150),
its unwarped 3-step schedule against the table stated by hand, the full-cache loop against a
cache-free statement of it, its checkpoint layout, and bad inputs through the installed ``jbkv``.

All on CPU in float32 with the tiny random configuration; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.wan.self_forcing import components as comp
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.self_forcing.checkpoint import diffusers_name, strip_wrappers
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule
from jbkv_cli.utils.errors import UsageError
from tests.installed import JBKV, run_jbkv

ATOL = 1e-5
CAUSVID = dict(config="tiny-random", step_list="1000,757,522", warp=False, shift=8.0)
CAUSVID |= dict(num_chunks=4, device="cpu")


def _full_cache(options: dict) -> sf.SelfForcing:
    """The tiny model with CausVid's full cache (window None: an option cannot say "none")."""
    model = sf.load_model(**options)
    return sf.SelfForcing(model.components, sf.replace(model.config, window=None))


_spec = importlib.util.spec_from_file_location(
    "derive_keys", Path(__file__).parent / "fixtures" / "derive_keys.py"
)
derive_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(derive_keys)
TINY_UPSTREAM = dict(
    dim=64, ffn_dim=32, freq_dim=256, text_dim=32, num_layers=2, in_dim=16, out_dim=16
) | {"patch": (1, 2, 2)}


def test_causvid_presets_are_upstreams_defaults():
    """``configs/wan_causal_dmd.yaml`` / ``wan_causal_dmd_warp_4step_cfg2.yaml``, the wrapper's
    shift 8 and ``autoregressive_inference.py``'s ``model.pt["generator"]``."""
    three, four = sf.PRESETS["causvid"], sf.PRESETS["causvid-warp-4step"]
    assert (three["step_list"], three["warp"], three["shift"]) == ("1000,757,522", False, 8.0)
    assert (four["steps"], four["step_list"], four["warp"], four["shift"]) == (4, None, True, 8.0)
    for preset in (three, four):
        assert (preset["chunk_frames"], preset["num_chunks"], preset["window"]) == (3, 7, None)
        assert preset["sink"] == 0 and preset["ema"] is False
    assert sf.HORIZONS["causvid"] == sf.HORIZONS["causvid-warp-4step"] == 21
    assert comp.GENERATORS["causvid"].file == "autoregressive_checkpoint/model.pt"
    settings = sf.build_settings({"config": "causvid", "device": "cpu"})
    assert (settings.step_list, settings.steps) == ((1000, 757, 522), 3)
    assert sf.build_settings({"config": "causvid", "steps": 2, "device": "cpu"}).step_list is None


def test_causvid_unwarped_steps_take_the_nearest_table_sigma():
    """t = 1000, 757, 522 go to the model as they are; σ is the shift-8 table's entry whose
    timestep is nearest (``argmin |t_j − t|``), stated here in float64 by hand."""
    schedule = FewStepSchedule.build(3, 8.0, (1000, 757, 522), warp=False)
    assert schedule.timesteps == (1000.0, 757.0, 522.0)
    table = [8 * (1 - j / 1000) / (1 + 7 * (1 - j / 1000)) for j in range(1000)]
    for t, sigma in zip(schedule.timesteps, schedule.sigmas, strict=True):
        j = min(range(1000), key=lambda i: abs(1000 * table[i] - t))
        assert sigma == pytest.approx(table[j], abs=1e-6)
        assert abs(1000 * sigma - t) < 1.0  # near t/1000, not the warped value
    warped = FewStepSchedule.build(4, 8.0)
    assert warped.timesteps == pytest.approx((1000.0, 960.0, 8000 / 9, 8000 / 11), abs=1e-3)


@pytest.mark.parametrize("variant", ["3-step", "warp-4step"])
def test_causvid_full_cache_loop_equals_a_cache_free_sampler(variant, cache_free):
    """Every earlier chunk stays in the cache (no window): the mask is block-causal in full."""
    options = dict(CAUSVID)
    if variant == "warp-4step":
        del options["step_list"]
        options |= dict(warp=True, steps=4)
    model = _full_cache(options)
    assert model.config.window is None and len(model.schedule) == (3 if "3" in variant else 4)
    with torch.no_grad():
        ours, info = model.generate_latents("a cat", 5, FULL_PRECISION)
        reference = cache_free(model, "a cat", 5, None)
    print(f"{variant}: max |cached - cache-free| = {(ours - reference).abs().max():.2e}")
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
    # 3 finished chunks held at the peak: 2 layers x (K, V) x [1, 2, 12, 32] fp32 each
    assert info["kv_cache_bytes"] == 3 * 2 * 2 * (2 * 12 * 32) * 4


def test_causvid_generates_int2_taylor():
    model = _full_cache(CAUSVID)
    assert model.settings["timesteps"] == [1000.0, 757.0, 522.0]
    video = model.generate("a cat", 0, KVSpec.build("rtn", bits=2, correction="taylor"))
    assert video.frames.shape == (45, 32, 32, 3) and video.kv_cache_bytes > 0


def test_causvid_reads_its_checkpoint_layout(tmp_path):
    """``CHECKPOINT_FOLDER/model.pt`` = ``{"generator": sd}`` with upstream names under
    ``model.`` (no EMA), read weights-only."""
    tiny = comp.tiny_components(seed=0)
    base = tmp_path / comp.BASE_DIR
    tiny.transformer.save_config(base / "transformer")
    tiny.vae.save_pretrained(base / "vae")
    tiny.text_encoder.save_pretrained(base / "text_encoder")
    tiny.tokenizer.save_pretrained(base / "tokenizer")
    sd = tiny.transformer.state_dict()
    state = {k: sd[diffusers_name(strip_wrappers(k))] for k in derive_keys.derive(TINY_UPSTREAM)}
    assert all(k.startswith("model.") for k in state)
    (tmp_path / "autoregressive_checkpoint").mkdir()
    torch.save({"generator": state}, tmp_path / "autoregressive_checkpoint" / "model.pt")
    model = sf.load_model(
        config="causvid", weights=str(tmp_path), height=32, width=32, num_chunks=2, device="cpu"
    )
    assert model.settings["generator"].endswith("autoregressive_checkpoint/model.pt")
    loaded = model.components.transformer.state_dict()
    assert set(loaded) == set(sd) and all(torch.equal(loaded[k], sd[k]) for k in sd)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(config="causvid", num_chunks=8), "trained on 21 latent frames"),
        (dict(config="tiny-random", step_list="757,1000"), "descending"),
        (dict(config="tiny-random", step_list="0,1"), "descending"),
        (dict(config="tiny-random", step_list="a,b"), "step_list"),
    ],
)
def test_causvid_bad_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        sf.check_options(**options)


@pytest.mark.slow
def test_causvid_past_its_horizon_is_one_line_through_the_installed_jbkv(tmp_path):
    if not Path(JBKV).is_file():
        pytest.skip(f"no installed jbkv next to {sys.executable}")
    out = tmp_path / "run"
    argv = ["generate", "-m", "self-forcing", "-o", "config=causvid", "-o", "num_chunks=8"]
    argv += ["--prompt", "a cat", "--out", str(out)]
    result = run_jbkv(*argv, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "causvid was trained on 21 latent frames" in lines[0]
    assert not out.exists()
