"""Shared by the HY-WorldPlay tests: one CPU thread (tiny tensors: threads only add
contention), the tiny random DiT, and random case conditions."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    """The tiny random DiT (fp32) and its config."""
    from jbkv_cli.models.hy_worldplay.config import TINY
    from jbkv_cli.models.hy_worldplay.tiny import tiny_dit

    return tiny_dit(TINY, seed=0), TINY


@pytest.fixture
def conditions():
    """:func:`make_conditions` (a fixture: test modules are imported by path)."""
    return make_conditions


def make_conditions(dit, cfg, spec: str, latents: int, size: int = 2, seed: int = 1):
    """Random text tokens, an image condition on latent 0 and the trajectory ``spec`` with its
    seeded memory plan."""
    from jbkv_cli.models.hy_worldplay import retrieval, trajectory
    from jbkv_cli.models.hy_worldplay.sampler import Conditions

    g = torch.Generator().manual_seed(seed)
    qwen = torch.randn(1, 7, cfg.text_states_dim, generator=g)
    byt5 = torch.randn(1, 3, cfg.byt5_dim, generator=g)
    vision = torch.randn(1, 5, cfg.vision_states_dim, generator=g)
    with torch.no_grad():
        txt, vec = dit.embed_text(qwen, byt5, vision)
    traj = trajectory.load_trajectory(spec, latents)
    points = retrieval.sample_points(retrieval.points_seed(trajectory.trajectory_digest(traj)))
    plan = retrieval.memory_plan(traj.w2c, points)
    cond = torch.zeros(1, cfg.in_channels + 1, latents, size, size)
    cond[:, : cfg.in_channels, 0] = torch.randn(1, cfg.in_channels, size, size, generator=g)
    cond[:, -1, 0] = 1.0
    noise = torch.randn(1, cfg.in_channels, latents, size, size, generator=g)
    return Conditions(txt, vec, cond, traj, plan), noise
