"""Finding and loading the released Matrix-Game-2.0 files (HF ``Skywork/Matrix-Game-2.0``).

The folder (``-o weights=DIR``, else ``$JBKV_MATRIX_GAME_DIR``, else the Hugging Face cache's
snapshot of ``Skywork/Matrix-Game-2.0``; never downloaded) holds, as upstream's README and
``inference.py`` read them: the DiT (``base_distilled_model/base_distill.safetensors`` for
universal, ``templerun_distilled_model/templerun_7dim_onlykey.safetensors``), ``Wan2.1_VAE.pth``
(original Wan layout, converted with diffusers' ``convert_wan_vae_to_diffusers`` into
``AutoencoderKLWan``'s default = Wan2.1 config) and
``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`` (:mod:`.clip`). ``.pth`` files are
read with ``torch.load(weights_only=True)`` only. Every missing file is listed in one
:class:`~jbkv_cli.utils.errors.WeightsNotFoundError` (exit 1) before anything is built.

Not checked against the released files in this repository's tests (no network): the key
names are upstream's (``test_matrix_game_checkpoint.py``), shapes are checked on load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from jbkv_cli.models.safetensors_io import check_state_dict
from jbkv_cli.models.wan.matrix_game.checkpoint import rename_keys
from jbkv_cli.models.wan.matrix_game.clip import VisionTower, visual_state
from jbkv_cli.models.wan.matrix_game.config import Preset
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT
from jbkv_cli.models.wan.weights import hf_cache_snapshot
from jbkv_cli.utils.errors import WeightsNotFoundError

REPO_ID = "Skywork/Matrix-Game-2.0"
ENV_VAR = "JBKV_MATRIX_GAME_DIR"
DIT_FILES = {
    "universal": "base_distilled_model/base_distill.safetensors",
    "templerun": "templerun_distilled_model/templerun_7dim_onlykey.safetensors",
    "gta": "gta_distilled_model/gta_keyboard2dim.safetensors",  # not in the README: the HF
}  # repo's listing
VAE_FILE = "Wan2.1_VAE.pth"
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"


@dataclass(frozen=True)
class Paths:
    dit: Path
    vae: Path
    clip: Path


def locate(config: str, weights: str | None) -> Paths:
    """The three files of ``config`` (module docstring)."""
    root_s = weights or os.environ.get(ENV_VAR) or None
    root = Path(root_s).expanduser() if root_s else hf_cache_snapshot(REPO_ID)
    where = str(root) if root is not None else f"the Hugging Face cache ({REPO_ID})"
    if root is None or not root.is_dir():
        raise WeightsNotFoundError(
            f"Matrix-Game-2.0 weights not found in {where}: download {REPO_ID} "
            f"(huggingface-cli download {REPO_ID} --local-dir DIR) and pass -o weights=DIR "
            f"or set ${ENV_VAR}"
        )
    paths = Paths(root / DIT_FILES[config], root / VAE_FILE, root / CLIP_FILE)
    missing = [
        str(p.relative_to(root)) for p in (paths.dit, paths.vae, paths.clip) if not p.is_file()
    ]
    if missing:
        raise WeightsNotFoundError(f"Matrix-Game-2.0 weights in {root} lack: {', '.join(missing)}")
    return paths


def load_dit(preset: Preset, path: Path) -> MatrixGameDiT:
    """The DiT from upstream's safetensors (keys ``model.*``), shapes checked."""
    from jbkv_cli.models.wan.self_forcing.checkpoint import read_tensors

    with torch.device("meta"):
        dit = MatrixGameDiT(preset.dit)
    state = rename_keys(read_tensors(path))
    check_state_dict(dit, state, f"Matrix-Game-2.0 DiT {path}")
    dit.load_state_dict(state, strict=True, assign=True)
    return dit.eval()


def load_clip(path: Path) -> VisionTower:
    """CLIP ViT-H/14's visual tower through block 31 from Wan's ``.pth``."""
    from jbkv_cli.models.wan.self_forcing.checkpoint import read_tensors

    with torch.device("meta"):
        tower = VisionTower()
    state = visual_state(dict(read_tensors(path)))
    check_state_dict(tower, state, f"CLIP {path}")
    tower.load_state_dict(state, strict=True, assign=True)
    return tower.eval()


def load_vae(path: Path):
    """Wan2.1's VAE from its original ``.pth`` as diffusers' ``AutoencoderKLWan``."""
    import diffusers
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    from jbkv_cli.models.wan.self_forcing.checkpoint import read_tensors

    state = convert_wan_vae_to_diffusers(dict(read_tensors(path)))
    vae = diffusers.AutoencoderKLWan()
    check_state_dict(vae, state, f"Wan VAE {path}")
    vae.load_state_dict(state, strict=True)
    return vae.eval()
