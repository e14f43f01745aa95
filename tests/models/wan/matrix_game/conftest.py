"""Shared by the Matrix-Game-2.0 tests: one CPU thread, the tiny random model, an image and
an actions file for its 33-frame video."""

import pytest
import torch
from PIL import Image


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_inputs(folder, frames: int = 33, keyboard_dim: int = 4, seed: int = 0):
    """A 48×32 image and a random actions file (keys 0/1, mouse in ±0.1) of ``frames``."""
    from jbkv_cli.models.wan.matrix_game.actions import write_actions

    g = torch.Generator().manual_seed(seed)
    Image.new("RGB", (48, 32), (200, 40, 90)).save(folder / "1.png")
    keys = (torch.rand(frames, keyboard_dim, generator=g) > 0.5).float().tolist()
    mouse = ((torch.rand(frames, 2, generator=g) - 0.5) * 0.2).tolist()
    write_actions(folder / "a.json", keys, mouse)
    return folder / "1.png", folder / "a.json"


@pytest.fixture(scope="module")
def tiny_model():
    from jbkv_cli.models.wan.matrix_game import load_model

    return load_model(config="tiny-random", device="cpu")


@pytest.fixture(scope="module")
def tiny_case(tiny_model, tmp_path_factory):
    from jbkv_cli.models.cases import Case

    folder = tmp_path_factory.mktemp("mg2")
    image, actions = write_inputs(folder, tiny_model.config.num_frames)
    case = Case("a red room", str(image), str(actions), "c1")
    return case, tiny_model.conditions(case)


@pytest.fixture
def inputs():
    """:func:`write_inputs` (a fixture: test modules are imported by path)."""
    return write_inputs
