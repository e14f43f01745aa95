"""Every model's ``input_paths`` names, by role, the weight files and folders its
``load_model`` reads, located the same way: ``--weights``, the model's environment variable, or
the Hugging Face cache. Commands refuse an output onto any of them
(``tests/cli/test_output_paths.py``) and a run fingerprints them by role
(``tests/run/test_changed_inputs.py``). The layouts here are empty files: locating reads none of
them."""

from __future__ import annotations

from pathlib import Path

import pytest

from jbkv_cli.models import registry
from jbkv_cli.models.wan.weights import Required
from tests.models.hy_worldplay.test_hy_worldplay_checkpoint import full_layout


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def fill_layout(root: Path, required: Required) -> Path:
    """Empty files satisfying a diffusers layout's required parts."""
    for part, (files, any_of) in required.items():
        for name in files:
            _touch(root / part / name)
        for group in any_of:
            _touch(root / part / group[0].replace("*", "model"))
    return root


@pytest.mark.parametrize(
    "name", ["tiny", "magi1", "skyreels-v2", "self-forcing", "hy-worldplay", "matrix-game-2"]
)
def test_tiny_random_configs_read_no_weights_but_the_tiny_models(name):
    options = {"config": "tiny-random"} if name != "tiny" else {}
    found = registry.input_paths(name, **options)
    if name == "tiny":
        from jbkv_cli.models.tiny.weights_io import DEFAULT_WEIGHTS

        assert found == {"weights": DEFAULT_WEIGHTS}
    else:
        assert found == {}


def test_tiny_weights_option(tmp_path):
    weights = _touch(tmp_path / "w.safetensors")
    assert registry.input_paths("tiny", weights=str(weights)) == {"weights": weights}


def test_magi1_from_the_hf_cache_and_its_special_tokens(tmp_path, monkeypatch):
    monkeypatch.delenv("JBKV_MAGI1_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--sand-ai--MAGI-1" / "snapshots" / "abc"
    dit = _touch(snap / "ckpt/magi/4.5B_base/inference_weight/model.safetensors").parent
    (snap / "ckpt/t5/t5-v1_1-xxl").mkdir(parents=True)
    (snap / "ckpt/t5/t5-v1_1-xxl/config.json").write_text("{}")
    for f in ("config.json", "diffusion_pytorch_model.safetensors"):
        _touch(snap / "ckpt/vae" / f)
    special = _touch(snap / "special_tokens.npz")
    found = registry.input_paths("magi1", config="4.5B_base")
    assert list(found) == ["dit", "t5", "vae", "special_tokens"]
    assert found["dit"] == dit and found["special_tokens"] == special
    assert found["t5"].name.startswith("t5") and found["vae"] == snap / "ckpt/vae"
    own = _touch(tmp_path / "mine.npz")
    mine = registry.input_paths("magi1", config="4.5B_base", special_tokens=str(own))
    assert mine == found | {"special_tokens": own}  # the option's file, not the located one


def test_skyreels_from_its_environment_variable(tmp_path, monkeypatch):
    from jbkv_cli.models.wan.skyreels_v2 import components as sky

    monkeypatch.setenv(sky.ENV_VAR, str(tmp_path))
    assert registry.input_paths("skyreels-v2") == {"weights": tmp_path}


@pytest.mark.parametrize("name", ["self-forcing", "rolling-forcing"])
@pytest.mark.parametrize("how", ["env", "weights"])
def test_self_forcing_family_base_and_generator(tmp_path, monkeypatch, name, how):
    from jbkv_cli.models.wan.self_forcing import components as comp

    base = fill_layout(tmp_path / comp.BASE_DIR, comp._BASE_REQUIRED)
    generator = "rolling_forcing_dmd.pt" if name == "rolling-forcing" else "self_forcing_dmd.pt"
    checkpoint = _touch(tmp_path / "checkpoints" / generator)
    monkeypatch.delenv(comp.ENV_VAR, raising=False)
    options = {"weights": str(tmp_path)}
    if how == "env":
        monkeypatch.setenv(comp.ENV_VAR, str(tmp_path))
        options = {}
    assert registry.input_paths(name, **options) == {  # the base's parts, not its transformer
        "base/transformer/config.json": base / "transformer" / "config.json",
        "base/vae": base / "vae",
        "base/text_encoder": base / "text_encoder",
        "base/tokenizer": base / "tokenizer",
        "generator": checkpoint,
    }


def test_hy_worldplay_weights_and_pose_file(tmp_path):
    from jbkv_cli.models.hy_worldplay import checkpoint

    root = full_layout(tmp_path / "w")
    pose = _touch(tmp_path / "poses.json")
    found = registry.input_paths("hy-worldplay", weights=str(root), pose=str(pose))
    p = checkpoint.locate(root)
    roles = ["dit", "dit_config", "vae", "qwen", "byt5", "glyph", "siglip"]
    assert found == {r: getattr(p, r) for r in roles} | {"pose": pose}
    tiny = registry.input_paths("hy-worldplay", config="tiny-random", pose=str(pose))
    assert tiny == {"pose": pose}
    assert registry.input_paths("hy-worldplay", config="tiny-random", pose="w-3") == {}


def test_matrix_game_weights_folder(tmp_path):
    from jbkv_cli.models.wan.matrix_game import loaders

    files = [
        _touch(tmp_path / f)
        for f in (loaders.DIT_FILES["universal"], loaders.VAE_FILE, loaders.CLIP_FILE)
    ]
    found = registry.input_paths("matrix-game-2", weights=str(tmp_path))
    assert found == dict(zip(["dit", "vae", "clip"], files, strict=True))
