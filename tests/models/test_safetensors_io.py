"""Weights files: pickles refused without being loaded, damaged files and missing tensors as one
line, only regular files read (jbkv_cli/models/safetensors_io.py, through the tiny model's
loader)."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from jbkv_cli.models.tiny.weights_io import DEFAULT_WEIGHTS, load_weights
from jbkv_cli.utils.errors import JbkvError


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and len(text) < 400
    return text


@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_pickle_checkpoints_are_refused_unopened(tmp_path, kind, monkeypatch):
    path = tmp_path / "w.pt"
    if kind == "torch.save":
        torch.save({"w": torch.zeros(2)}, path)
    else:
        path.write_bytes(pickle.dumps({"w": [0.0]}, protocol=4))
    monkeypatch.setattr(pickle, "loads", lambda *_: pytest.fail("a pickle was loaded"))
    with pytest.raises(JbkvError) as exc:
        load_weights(path)
    assert "pickle checkpoint" in _one_line(exc) and str(path) in str(exc.value)


@pytest.mark.parametrize("cut", [0, 5, 8, 100, -1000])
def test_truncated_or_garbage_files_are_one_line(tmp_path, cut):
    data = DEFAULT_WEIGHTS.read_bytes()
    path = tmp_path / "w.safetensors"
    path.write_bytes(data[:cut])
    with pytest.raises(JbkvError) as exc:
        load_weights(path)
    assert str(path) in _one_line(exc)


def test_missing_tensors_are_listed(tmp_path):
    from safetensors import safe_open

    with safe_open(str(DEFAULT_WEIGHTS), framework="pt") as f:
        meta = f.metadata()
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    dropped = sorted(state)[:2]
    for k in dropped:
        del state[k]
    path = tmp_path / "w.safetensors"
    save_file(state, str(path), metadata=meta)
    with pytest.raises(JbkvError) as exc:
        load_weights(path)
    text = _one_line(exc)
    assert "missing: " + ", ".join(dropped) in text


def test_no_config_metadata_is_one_line(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(2)}, str(path), metadata={"other": json.dumps({})})
    with pytest.raises(JbkvError) as exc:
        load_weights(path)
    assert "no valid tiny-model config" in _one_line(exc)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_only_regular_files_are_read(tmp_path, kind):
    """A FIFO would block the read forever and /dev/zero never ends: both are refused by what
    they are (as a directory is), never reported as missing weights."""
    from jbkv_cli.models.safetensors_io import open_safetensors

    path = tmp_path / "w.safetensors"
    if kind == "fifo":
        os.mkfifo(path)
        want = "a FIFO"
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
        want = "a character device: /dev/zero"
    else:
        path.mkdir()
        want = "a directory"
    with pytest.raises(JbkvError) as exc:
        load_weights(path)
    assert f"{path} is not a regular file ({want})" in _one_line(exc)
    assert "not found" not in str(exc.value)
    with pytest.raises(JbkvError, match="is not a regular file"), open_safetensors(path):
        pass  # the reader itself refuses it too


def test_missing_weights_still_say_how_to_make_them(tmp_path):
    with pytest.raises(JbkvError, match=r"not found .* train them"):
        load_weights(tmp_path / "missing.safetensors")
