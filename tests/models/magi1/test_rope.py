"""RoPE layout: rotate-half on the first 3·D/8·2 channels, absolute temporal positions."""

import math

import torch

from jbkv_cli.models.magi1.rope import LearnableRotaryEmbedding, apply_rotary, rope_angles


def test_rotate_half_on_first_channels_only():
    d, f = 128, 48
    x = torch.randn(2, 3, 5, d)
    ang = torch.rand(5, f) * 6
    out = apply_rotary(x, ang.cos(), ang.sin())
    z = torch.complex(x[..., :f], x[..., f : 2 * f]) * torch.polar(torch.ones_like(ang), ang)
    torch.testing.assert_close(out[..., :f], z.real)
    torch.testing.assert_close(out[..., f : 2 * f], z.imag)
    assert torch.equal(out[..., 2 * f :], x[..., 2 * f :])  # dims 96..127 pass through


def test_positions_are_absolute_in_time_and_centred_in_space():
    bands = torch.tensor([1.0])  # one band per axis
    ang = rope_angles(bands, frames=3, height=2, width=4).reshape(3, 2, 4, 3)
    torch.testing.assert_close(ang[:, 0, 0, 0], torch.tensor([0.0, 1.0, 2.0]))
    rho = math.sqrt(2 * 4 / 256)
    h_ref = 2 / rho
    torch.testing.assert_close(ang[0, :, 0, 1], torch.tensor([-0.5, 0.5]) * (h_ref - 1))
    rope = LearnableRotaryEmbedding(128)
    assert rope.bands.shape == (16,)
    cos_full, _ = rope(12, 12, 2, 2)
    cos_tail, _ = rope(12, 4, 2, 2)  # the last chunk of a forward that starts at frame 8
    torch.testing.assert_close(cos_tail, cos_full[-16:])
