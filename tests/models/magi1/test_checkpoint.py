"""Checkpoint compatibility: upstream key names/shapes, sharded strict loading, clear errors."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from jbkv_cli.models.magi1 import load_dit, load_model
from jbkv_cli.models.magi1.checkpoint import locate
from jbkv_cli.models.magi1.config import TINY_DIT, TINY_VARIANT, VARIANTS
from jbkv_cli.models.magi1.dit import VideoDiT
from jbkv_cli.models.magi1.tiny import tiny_dit
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError

FIXTURES = Path(__file__).parent / "fixtures"


def _meta_shapes(cfg) -> dict[str, list[int]]:
    with torch.device("meta"):
        model = VideoDiT(cfg)
    return {k: list(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    ("variant", "fixture"),
    [
        ("4.5B_base", "magi1_4.5b_keys.json"),
        ("4.5B_distill", "magi1_4.5b_keys.json"),
        ("24B_base", "magi1_24b_keys.json"),
        ("24B_distill", "magi1_24b_keys.json"),
    ],
)
def test_meta_model_matches_upstream_key_set(variant, fixture):
    expected = json.loads((FIXTURES / fixture).read_text())
    assert _meta_shapes(VARIANTS[variant].dit) == expected


def test_4_5b_parameter_count():
    shapes = json.loads((FIXTURES / "magi1_4.5b_keys.json").read_text())
    total = sum(torch.Size(s).numel() for s in shapes.values())
    assert 4.0e9 < total < 5.0e9


def _write_sharded(state, directory: Path, shards: int = 2) -> None:
    directory.mkdir(parents=True)
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k].contiguous() for k in part}, str(directory / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


@pytest.fixture(scope="module")
def tiny_state():
    return {k: v.to(torch.bfloat16) for k, v in tiny_dit(seed=3).state_dict().items()}


def test_sharded_checkpoint_loads_strictly(tmp_path, tiny_state):
    d = tmp_path / "inference_weight.distill"
    _write_sharded(tiny_state, d)
    model = load_dit(d, TINY_DIT)
    got = model.state_dict()
    assert set(got) == set(tiny_state)
    for k, v in tiny_state.items():
        assert torch.equal(got[k], v), k


def test_single_file_checkpoint_loads(tmp_path, tiny_state):
    d = tmp_path / "w"
    d.mkdir()
    save_file(dict(tiny_state), str(d / "model.safetensors"))
    assert set(load_dit(d, TINY_DIT).state_dict()) == set(tiny_state)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("rope.bands"), "missing: rope.bands"),
        (lambda s: s.__setitem__("extra.weight", torch.zeros(2)), "unexpected: extra.weight"),
        (lambda s: s.__setitem__("final_linear.linear.weight", torch.zeros(3, 3)), "wrong shape"),
        (
            lambda s: s.__setitem__(
                "videodit_blocks.layers.1.mlp.linear_fc2.weight_scale", torch.zeros(1)
            ),
            "FP8",
        ),
    ],
)
def test_bad_checkpoint_fails_clearly(tmp_path, tiny_state, edit, message):
    state = dict(tiny_state)
    edit(state)
    d = tmp_path / "w"
    _write_sharded(state, d)
    with pytest.raises(JbkvError, match=message):
        load_dit(d, TINY_DIT)


def test_missing_shard_is_reported(tmp_path, tiny_state):
    d = tmp_path / "w"
    _write_sharded(tiny_state, d)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsNotFoundError, match="model-00002-of-00002"):
        load_dit(d, TINY_DIT)


def test_weights_not_found_lists_expected_files(tmp_path, monkeypatch):
    monkeypatch.delenv("JBKV_MAGI1_DIR", raising=False)
    with pytest.raises(WeightsNotFoundError) as e:
        load_model(config="4.5B_distill", weights=str(tmp_path), device="cpu")
    msg = str(e.value)
    for part in (
        "4.5B_distill/inference_weight.distill",
        "t5-v1_1-xxl",
        "vae",
        "special_tokens.npz",
    ):
        assert part in msg
    assert "\n" not in msg


def test_env_var_and_hf_cache_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("JBKV_MAGI1_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(WeightsNotFoundError, match="JBKV_MAGI1_DIR"):
        locate(VARIANTS["4.5B_base"])
    monkeypatch.delenv("JBKV_MAGI1_DIR")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--sand-ai--MAGI-1" / "snapshots" / "abc"
    dit = snap / "ckpt" / "magi" / "4.5B_base" / "inference_weight"
    dit.mkdir(parents=True)
    (dit / "model.safetensors").write_bytes(b"")
    (snap / "ckpt" / "t5" / "t5-v1_1-xxl").mkdir(parents=True)
    (snap / "ckpt" / "t5" / "t5-v1_1-xxl" / "config.json").write_text("{}")
    (snap / "ckpt" / "vae").mkdir(parents=True)
    for f in ("config.json", "diffusion_pytorch_model.safetensors"):
        (snap / "ckpt" / "vae" / f).write_text("{}")
    (snap / "special_tokens.npz").write_bytes(b"")
    paths = locate(VARIANTS["4.5B_base"])
    assert paths.dit == dit


def test_fp8_variant_is_declared_unsupported():
    with pytest.raises(JbkvError, match="FP8"):
        load_model(config="4.5B_distill_quant", device="cpu")


def test_unknown_config_and_option():
    with pytest.raises(JbkvError, match="tiny-random"):
        load_model(config="7B")
    with pytest.raises(JbkvError, match="unknown magi1 option"):
        load_model(config=TINY_VARIANT.name, colour="red")
