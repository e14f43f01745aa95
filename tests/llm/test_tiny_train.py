"""The embedded LM's training script (:mod:`jbkv_cli.llm.tiny.train`): deterministic from its
seed, and the shipped folder is what it writes (same architecture, same tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch

from jbkv_cli.llm.models import EMBEDDED_DIR
from jbkv_cli.llm.tiny import train as tiny_train
from jbkv_cli.llm.tiny.corpus import CorpusConfig

SHORT = ((3, 64, 2), (2, 96, 1))  # a few steps of the same procedure (curriculum included)


def _trained(monkeypatch, seed: int) -> dict[str, torch.Tensor]:
    monkeypatch.setattr(tiny_train, "PHASES", SHORT)
    threads = torch.get_num_threads()
    try:
        model, log = tiny_train.train(seed, log_every=2)
    finally:
        torch.set_num_threads(threads)
    assert log["steps"] == 5 and log["threads"] == 1
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_is_bit_reproducible_from_the_seed(monkeypatch):
    a, b = _trained(monkeypatch, 0), _trained(monkeypatch, 0)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = _trained(monkeypatch, 1)
    assert any(not torch.equal(a[k], other[k]) for k in a)


@pytest.mark.skipif(not (EMBEDDED_DIR / "config.json").is_file(), reason="embedded LM not built")
def test_shipped_folder_is_the_scripts_architecture_and_tokenizer():
    shipped = json.loads((EMBEDDED_DIR / "config.json").read_text())
    made = tiny_train.ModelConfig().llama(CorpusConfig().vocab_size).to_dict()
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    keys += ("num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
    assert {k: shipped[k] for k in keys} == {k: made[k] for k in keys}
    log = json.loads((EMBEDDED_DIR / "train_log.json").read_text())
    assert log["seed"] == 0 and log["phases"] == [list(p) for p in tiny_train.PHASES]
    from jbkv_cli.llm.tiny.tokenizer import build_tokenizer

    vocab = json.loads((EMBEDDED_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab == build_tokenizer().backend_tokenizer.get_vocab()
