"""Checkpoint key renames on upstream's key list: the names ``WanDiffusionWrapper.state_dict()``
has for a CausalWanModel of 2 blocks with the ActionModule in block 0 (universal's layout:
keyboard + mouse), written out from upstream's source (causal_model.py, model.py,
action_module.py of SkyworkAI/Matrix-Game's Matrix-Game-2 folder; the ``model.`` prefix is
the wrapper's attribute)."""

import pytest
import torch

from jbkv_cli.models.wan.matrix_game.checkpoint import load_strict, rename_keys
from jbkv_cli.models.wan.matrix_game.config import TINY
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT
from jbkv_cli.utils.errors import JbkvError

_LINEAR = ("weight", "bias")
_BLOCK = [
    "modulation",
    "norm3.weight",
    "norm3.bias",
    *(f"self_attn.{p}.{w}" for p in "qkvo" for w in _LINEAR),
    "self_attn.norm_q.weight",
    "self_attn.norm_k.weight",
    *(f"cross_attn.{p}.{w}" for p in "qkvo" for w in _LINEAR),
    "cross_attn.norm_q.weight",
    "cross_attn.norm_k.weight",
    *(f"ffn.{i}.{w}" for i in (0, 2) for w in _LINEAR),
]
_ACTION = [
    *(f"keyboard_embed.{i}.{w}" for i in (0, 2) for w in _LINEAR),
    *(f"mouse_mlp.{i}.{w}" for i in (0, 2, 3) for w in _LINEAR),
    "t_qkv.weight",  # qkv_bias false: no bias on t_qkv, proj_*, mouse_attn_q, keyboard_attn_kv
    "img_attn_q_norm.weight",
    "img_attn_k_norm.weight",
    "proj_mouse.weight",
    "key_attn_q_norm.weight",
    "key_attn_k_norm.weight",
    "mouse_attn_q.weight",
    "keyboard_attn_kv.weight",
    "proj_keyboard.weight",
]
UPSTREAM_KEYS = [
    "model.patch_embedding.weight",
    "model.patch_embedding.bias",
    *(f"model.time_embedding.{i}.{w}" for i in (0, 2) for w in _LINEAR),
    *(f"model.time_projection.1.{w}" for w in _LINEAR),
    *(f"model.blocks.{b}.{k}" for b in (0, 1) for k in _BLOCK),
    *(f"model.blocks.0.action_model.{k}" for k in _ACTION),
    "model.head.modulation",
    "model.head.head.weight",
    "model.head.head.bias",
    *(f"model.img_emb.proj.{i}.{w}" for i in (0, 1, 3, 4) for w in _LINEAR),
]


def test_matrix_game_upstream_keys_rename_onto_the_dit():
    want = set(MatrixGameDiT(TINY.dit).state_dict())
    renamed = rename_keys(dict.fromkeys(UPSTREAM_KEYS, torch.zeros(1)))
    assert set(renamed) == want


def test_matrix_game_load_strict_reads_an_upstream_state_and_names_problems():
    src = MatrixGameDiT(TINY.dit)
    state = {f"model.{k}": v for k, v in src.state_dict().items()}
    with torch.device("meta"):
        dst = MatrixGameDiT(TINY.dit)
    load_strict(dst, state, "test")
    assert torch.equal(dst.head.head.weight, src.head.head.weight)
    del state["model.blocks.0.action_model.t_qkv.weight"]
    with pytest.raises(JbkvError, match="1 missing key"):
        load_strict(MatrixGameDiT(TINY.dit), state, "test")
