"""Forcing-KV on the other geometries (tiny random configurations, float32, CPU): SkyReels-V2 (two
CFG branches, each with its own cache and its own shared selection; 2-frame chunks) and MAGI-1
(several chunks in flight per forward; 2-frame chunks, GQA): the budget after the ring fills is
what the rules give, per class of head."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("diffusers")

from jbkv_cli.kvcache import KVSpec
from jbkv_cli.prune import ForcingKV
from jbkv_cli.prune.forcing_kv import kept_patches
from jbkv_cli.prune.profile import FORMAT

T = 4  # tokens per latent frame at 32x32 in both tiny configurations


def _profile(tmp_path, model: str, layout: dict) -> str:
    kinds = (["static", "dynamic"] * layout["kv_heads"])[: layout["kv_heads"]]
    doc = {"format": FORMAT, "rule": "forcing-kv", "model": model, "threshold": 0.8}
    doc["layers"] = [{"heads": kinds}] * layout["layers"]
    path = tmp_path / f"{model}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _per_head(layout: dict, head_dim: int, dtype_bytes: int = 4) -> dict[str, int]:
    """Bytes per class once the ring has filled, from the rules (2-frame chunks, defaults:
    sink 1, rings of 1 frame, 4 one-token patches per frame: round(2·4·0.33) = 3 kept)."""
    token = 2 * head_dim * dtype_bytes + 2  # k + v + an int16 position
    layers = layout["layers"]
    buffer = kept_patches(2 * 4, 0.33)  # one-token patches
    return {
        "unsplit": 2 * T * token * layout["kv_heads"],  # layer 0: sink + 1 frame
        "static": 2 * T * token * (layers - 1),
        "dynamic": (2 * T + buffer) * token * (layers - 1),
    }


def test_skyreels_v2_both_cfg_branches_keep_the_budget(tmp_path):
    from jbkv_cli.models.wan.skyreels_v2 import model as sky

    model = sky.load_model(config="tiny-random", device="cpu", num_chunks=4)
    layout = model.head_layout()
    assert layout["kv_heads"] == 2 and layout["frame_tokens"] == T
    spec = KVSpec(pruner=ForcingKV(profile=_profile(tmp_path, "skyreels-v2", layout)))
    _, info = model.generate_latents("a red ball", 0, spec)
    assert info["cfg_branches"] == 2
    head_dim = model.settings["head_dim"]
    per = _per_head(layout, head_dim)
    state = T * head_dim * 4  # the deciding layer's ring keys: one frame of its dynamic head
    want = {k: 2 * v for k, v in per.items()} | {"dynamic": 2 * (per["dynamic"] + state)}
    assert info["kv_cache_bytes_by_head"] == want  # both branches, at the peak (chunk 2 on)


def test_magi1_keeps_the_budget_with_chunks_in_flight(tmp_path):
    from jbkv_cli.models.magi1 import load_model

    # a window holding the whole video (MAGI-1's default is what its kv ranges need: 1 chunk)
    model = load_model(
        config="tiny-random",
        seed=0,
        device="cpu",
        attention_backend="reference",
        num_chunks=4,
        window=4,
    )
    layout = model.head_layout()
    spec = KVSpec(pruner=ForcingKV(profile=_profile(tmp_path, "magi1", layout)))
    out = model.sample_latents("x", 3, spec)
    head_dim = model.settings["head_dim"]
    per = _per_head(layout, head_dim)
    per["dynamic"] += T * head_dim * 4
    assert out.peak_bytes_by_kind == per and out.peak_cache_bytes == sum(per.values())
