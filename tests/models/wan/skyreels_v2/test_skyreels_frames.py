"""SkyReels-V2 frame arithmetic against diffusers #13609 (diffusion-forcing schedules drop tail
latent frames: ``generate_timestep_matrix`` floors ``num_latent_frames // causal_block_size``,
so latent frames past the last whole block are never denoised).

jbkv's adapter is not affected: a video is whole chunks of ``chunk_frames`` latent frames, and a
``num_frames`` whose latent frames ``(num_frames − 1)/4 + 1`` are not a whole number of chunks is
refused (one line naming it) instead of floored. Checked for every ``num_frames`` up to the
rotary table's length, on the tiny configuration and the released one's arithmetic (no weights
read), and the decoded frame count ``4·(F − 1) + 1`` on the tiny VAE.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.models.wan.decode import decode_wan
from jbkv_cli.models.wan.options import rope_frames
from jbkv_cli.models.wan.skyreels_v2 import components as comp
from jbkv_cli.models.wan.skyreels_v2 import model as sky
from jbkv_cli.utils.errors import UsageError


def _accepted(config: str, chunk_frames: int) -> dict[int, sky.SkyReelsSettings]:
    """``num_frames`` -> settings, for every ``num_frames`` in 1 .. 4·(rotary frames) + 5."""
    out = {}
    for num_frames in range(1, 4 * rope_frames(config) + 6):
        options = {"config": config, "num_frames": num_frames, "chunk_frames": chunk_frames}
        try:
            out[num_frames] = sky._settings(options)
        except UsageError as exc:
            assert f"num_frames={num_frames}" in str(exc) or "rotary table" in str(exc)
    return out


@pytest.mark.parametrize(
    ("config", "chunk_frames"), [("tiny-random", 2), ("tiny-random", 3), ("df-1.3b-540p", 5)]
)
def test_every_accepted_num_frames_keeps_every_latent_frame(config, chunk_frames):
    accepted = _accepted(config, chunk_frames)
    whole = rope_frames(config) // chunk_frames
    expected = {4 * (c * chunk_frames - 1) + 1 for c in range(1, whole + 1)}
    assert set(accepted) == expected
    for num_frames, settings in accepted.items():
        latent = (num_frames - 1) // 4 + 1
        assert settings.latent_frames == settings.num_chunks * chunk_frames == latent
        assert 4 * (settings.latent_frames - 1) + 1 == num_frames  # no tail frame dropped


def test_a_partial_last_chunk_is_refused_not_floored():
    """17 frames = 5 latent frames: diffusers (#13609) would denoise 4 of them with blocks of 2."""
    with pytest.raises(UsageError, match="num_frames=17 is not"):
        sky._settings({"config": "tiny-random", "num_frames": 17, "chunk_frames": 2})


def test_decoded_frames_are_four_per_latent_frame_after_the_first():
    vae = comp.tiny_components(seed=0).vae
    for latent in (1, 2, 5):
        frames = decode_wan(vae, torch.zeros(1, 16, latent, 1, 1))
        assert frames.shape[0] == 4 * (latent - 1) + 1
