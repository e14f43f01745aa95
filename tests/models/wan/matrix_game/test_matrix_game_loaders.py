"""The released files' loaders on tiny stand-ins written in upstream's layouts: the DiT's
safetensors with the wrapper's ``model.`` prefix, CLIP's ``.pth`` with its text tower and the
32nd block (skipped), and one line naming every missing file."""

import pytest
import torch
from safetensors.torch import save_file

from jbkv_cli.models.wan.matrix_game import check_options, loaders
from jbkv_cli.models.wan.matrix_game.clip import VisionTower, visual_state
from jbkv_cli.models.wan.matrix_game.config import TINY
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError


def test_matrix_game_locate_lists_every_missing_file(tmp_path):
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"x")
    with pytest.raises(WeightsNotFoundError) as err:
        loaders.locate("universal", str(tmp_path))
    msg = str(err.value)
    assert "base_distilled_model/base_distill.safetensors" in msg and loaders.CLIP_FILE in msg
    assert "Wan2.1_VAE.pth" not in msg.split("lack:")[1]
    with pytest.raises(WeightsNotFoundError):
        check_options(config="templerun", weights=str(tmp_path))
    with pytest.raises(WeightsNotFoundError, match="gta_keyboard2dim"):
        check_options(config="gta", weights=str(tmp_path))


def test_matrix_game_load_dit_reads_upstream_safetensors(tmp_path):
    src = MatrixGameDiT(TINY.dit)
    path = tmp_path / "dit.safetensors"
    save_file({f"model.{k}": v.contiguous() for k, v in src.state_dict().items()}, str(path))
    dit = loaders.load_dit(TINY, path)
    assert torch.equal(
        dit.blocks[0].action_model.t_qkv.weight, src.blocks[0].action_model.t_qkv.weight
    )
    bad = {f"model.{k}": v.contiguous() for k, v in src.state_dict().items()}
    bad["model.head.head.weight"] = torch.zeros(3, 3)
    save_file(bad, str(path))
    with pytest.raises(JbkvError, match=r"wrong shape: head\.head\.weight"):
        loaders.load_dit(TINY, path)


def test_matrix_game_clip_reads_31_of_32_visual_blocks(tmp_path):
    full = VisionTower(image_size=28, patch=14, dim=32, heads=2, blocks=2)
    state = {f"visual.{k}": v for k, v in full.state_dict().items()}
    state |= {"visual.post_norm.weight": torch.ones(32), "visual.head": torch.zeros(32, 8)}
    state |= {"textual.token_embedding.weight": torch.zeros(4, 8), "log_scale": torch.zeros(())}
    kept = visual_state(state, blocks=1)
    assert not any(k.startswith(("transformer.1.", "post_norm", "head")) for k in kept)
    tower = VisionTower(image_size=28, patch=14, dim=32, heads=2, blocks=1)
    tower.load_state_dict(kept, strict=True)
    out = tower(torch.zeros(1, 3, 40, 60))
    assert out.shape == (1, 5, 32)  # 2 × 2 patches + the class token
