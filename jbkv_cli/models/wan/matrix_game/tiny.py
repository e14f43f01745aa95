"""tiny-random Matrix-Game-2.0: the DiT of :data:`~jbkv_cli.models.wan.matrix_game.config.TINY`
with random weights, diffusers' tiny Wan VAE and :class:`TinyImageEncoder` — for tests and the
CPU demo path, never for quality."""

from __future__ import annotations

import torch

from jbkv_cli.models.wan.matrix_game.config import Preset
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT
from jbkv_cli.models.wan.matrix_game.model import TinyImageEncoder


def tiny_dit(preset: Preset, seed: int = 0) -> MatrixGameDiT:
    """The DiT with every parameter drawn from N(0, 0.2²) (seeded), so each path (the
    modulations, the ActionModule's output projections) is live."""
    torch.manual_seed(seed)
    dit = MatrixGameDiT(preset.dit)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in dit.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return dit.eval()


def tiny_parts(preset: Preset, seed: int = 0):
    """(DiT, VAE, image encoder) with random weights from ``seed``."""
    import diffusers

    dit = tiny_dit(preset, seed)
    torch.manual_seed(seed + 1)
    vae = diffusers.AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    encoder = TinyImageEncoder(preset.dit.clip_dim).eval()
    return dit, vae, encoder
