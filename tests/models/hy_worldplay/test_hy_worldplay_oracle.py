"""The cached AR loop held to one uncached forward, on the tiny random config (fp32).

The oracle (:meth:`~jbkv_cli.models.hy_worldplay.dit.WorldPlayDiT.full_forward`) runs every
denoising forward as one pass over ``[text | memory | current]`` under the block mask (text ->
text; memory -> text + memory; current -> all), the memory and current latents one clip at
RoPE positions 0..M+3: no cache at all. The loop under test fills the text caches once, the
memory caches once per chunk (at positions 0..M-1) and caches nothing of the current chunk.
The trajectory runs 8 chunks, so chunks 6 and 7 use retrieved memory (12 recent latents, the
first chunk and one clip chosen by view overlap), not just every earlier latent.
"""

import pytest
import torch

from jbkv_cli.kvcache import FULL_PRECISION, ChunkKVCache, KVSpec
from jbkv_cli.kvcache.coverage import counting
from jbkv_cli.models.hy_worldplay.config import TINY_SCHEDULE
from jbkv_cli.models.hy_worldplay.sampler import rollout
from jbkv_cli.quant.rtn import RTN

SPEC = "w-8, right-8, s-8, a-7"  # 32 latents = 8 chunks, every chunk a new motion
LATENTS = 32
INT2 = KVSpec(key=RTN(bits=2), value=RTN(bits=2))
INT2_TAYLOR = KVSpec(key=RTN(bits=2), value=RTN(bits=2), correction="taylor")


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def run(dit, cond, noise, kv=FULL_PRECISION, **kw):
    steps = []
    latents, info = rollout(
        dit,
        cond,
        noise,
        TINY_SCHEDULE,
        kv,
        on_step=lambda c, i, x, v: steps.append(v.clone()),
        **kw,
    )
    return latents, info, steps


@pytest.fixture(scope="module")
def case(tiny):
    from jbkv_cli.models.hy_worldplay import retrieval, trajectory
    from jbkv_cli.models.hy_worldplay.sampler import Conditions

    dit, cfg = tiny
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        txt, vec = dit.embed_text(
            torch.randn(1, 7, cfg.text_states_dim, generator=g),
            torch.randn(1, 3, cfg.byt5_dim, generator=g),
            torch.randn(1, 5, cfg.vision_states_dim, generator=g),
        )
    traj = trajectory.load_trajectory(SPEC, LATENTS)
    seed = retrieval.points_seed(trajectory.trajectory_digest(traj))
    plan = retrieval.memory_plan(traj.w2c, retrieval.sample_points(seed))
    cond = torch.zeros(1, cfg.in_channels + 1, LATENTS, 2, 3)
    cond[:, : cfg.in_channels, 0] = torch.randn(1, cfg.in_channels, 2, 3, generator=g)
    cond[:, -1, 0] = 1.0
    noise = torch.randn(1, cfg.in_channels, LATENTS, 2, 3, generator=g)
    return Conditions(txt, vec, cond, traj, plan), noise


def test_hy_worldplay_oracle_plan_reaches_retrieval(case):
    """The fixture exercises what the oracle must cover: no memory for chunk 0, every earlier
    latent up to chunk 5, then 20 retrieved latents that are not simply the latest ones."""
    plan = case[0].plan
    assert plan[0] == [] and plan[5] == list(range(20))
    for c in (6, 7):
        assert len(plan[c]) == 20 and plan[c] != list(range(4 * c - 20, 4 * c))
        assert plan[c][:4] == [0, 1, 2, 3] and plan[c][-12:] == list(range(4 * c - 12, 4 * c))


def test_hy_worldplay_cached_loop_equals_one_full_forward(tiny, case):
    """Every denoising velocity and the final latents of the cached loop (16-bit caches) equal
    the uncached block-masked forward: rel-L2 <= 1e-5 (fp32)."""
    dit, _ = tiny
    cond, noise = case
    ref, _, ref_steps = run(dit, cond, noise, uncached=True)
    got, info, steps = run(dit, cond, noise)
    assert len(steps) == len(ref_steps) == 8 * TINY_SCHEDULE.steps
    worst = max(rel_l2(a, b) for a, b in zip(steps, ref_steps, strict=True))
    assert worst <= 1e-5, worst
    assert rel_l2(got, ref) <= 1e-5
    assert info["memory_latents"] == [len(p) for p in cond.plan]


def test_hy_worldplay_oracle_sees_a_wrong_memory_position(tiny, case, monkeypatch):
    """The oracle is not blind to the temporal reframing: a memory pass at RoPE positions
    1..M (instead of 0..M-1) moves the loop far from it."""
    dit, _ = tiny
    cond, noise = case
    ref, _, _ = run(dit, cond, noise, uncached=True)
    original = dit.vision_pass

    def shifted(lat, start, attend, final=True):
        return original(lat, start + (0 if final else 1), attend, final)

    monkeypatch.setattr(dit, "vision_pass", shifted)
    got, _, _ = run(dit, cond, noise)
    assert rel_l2(got, ref) > 1e-3


def test_hy_worldplay_only_text_and_memory_are_cached(tiny, case, monkeypatch):
    """Commits: the text once per block (16-bit), then per chunk with memory one commit per
    block and branch of exactly the memory latents' tokens; nothing of the current chunk."""
    dit, cfg = tiny
    cond, noise = case
    commits = []
    original = ChunkKVCache.commit

    def spy(self, k, v, position=None):
        commits.append(k.shape[-2])
        return original(self, k, v, position)

    monkeypatch.setattr(ChunkKVCache, "commit", spy)
    run(dit, cond, noise, INT2)
    blocks, per_latent = cfg.mm_double_blocks_depth, 2 * 3
    text_tokens = cond.txt.shape[1]
    expected = [text_tokens] * blocks
    for idx in cond.plan:
        if idx:
            expected += [len(idx) * per_latent] * (2 * blocks)
    assert commits == expected


def test_hy_worldplay_memory_bytes_per_branch(tiny, case):
    """Bytes from the stored tensors: the text 16-bit (fp32 here: the model dtype) unless
    ``quantize_text``; each branch's 2-bit memory of 20 latents at its peak, far below 16-bit."""
    dit, cfg = tiny
    cond, noise = case
    blocks, heads, dim = cfg.mm_double_blocks_depth, cfg.heads_num, cfg.head_dim
    text_tokens = cond.txt.shape[1]
    _, full, _ = run(dit, cond, noise)
    _, q2, _ = run(dit, cond, noise, INT2)
    _, q2_text, _ = run(dit, cond, noise, INT2, quantize_text=True)
    text_bytes = blocks * 2 * heads * text_tokens * dim * 4
    mem_bytes = blocks * 2 * heads * 20 * 6 * dim * 4  # K and V of 20 latents, per branch
    parts = full["kv_cache_bytes_by_branch"]
    assert parts == {"text": text_bytes, "rope": mem_bytes, "prope": mem_bytes}
    assert q2["kv_cache_bytes_by_branch"]["text"] == text_bytes
    assert q2["kv_cache_bytes_by_branch"]["rope"] < mem_bytes / 4
    assert q2["kv_cache_bytes_by_branch"]["rope"] == q2["kv_cache_bytes_by_branch"]["prope"]
    assert q2_text["kv_cache_bytes_by_branch"]["text"] < text_bytes / 4
    assert full["kv_cache_bytes"] == sum(parts.values())


def test_hy_worldplay_qvg_quantizes_every_second_memory_commit(tiny, case):
    """QVG as upstream's HY-WorldPlay integration runs it (qvg_policy.py: spans of 2 chunks,
    post-RoPE): each memory cache (window 1, one commit per chunk with memory) quantizes commits
    1, 3, … (one codebook with the commit before) and holds commits 0, 2, … 16-bit, so the
    measured compressed share is the odd commits' part of the memory rows (the text stays
    16-bit and is not counted)."""
    dit, _ = tiny
    cond, noise = case
    spec = KVSpec.build("qvg", 2, 32).for_model("hy-worldplay")
    with counting() as held:
        run(dit, cond, noise, spec)
    sizes = [len(p) for p in cond.plan if p]  # latents of each memory commit
    assert len(sizes) >= 4
    assert held.compressed / held.held == pytest.approx(sum(sizes[1::2]) / sum(sizes), abs=1e-12)


def test_hy_worldplay_int2_memory_moves_the_output_and_taylor_is_finite(tiny, case):
    """2-bit memory changes the video (the cache is really read quantized) by a bounded amount;
    the Taylor correction runs on both branches with finite output."""
    dit, _ = tiny
    cond, noise = case
    ref, _, _ = run(dit, cond, noise)
    q2, _, _ = run(dit, cond, noise, INT2)
    q2t, _, _ = run(dit, cond, noise, INT2_TAYLOR)
    assert 1e-4 < rel_l2(q2, ref) < 0.5
    assert torch.isfinite(q2t).all() and not torch.equal(q2t, q2)


def test_hy_worldplay_action_and_camera_branches_matter(tiny, case):
    """The tiny config's action embedding and PRoPE projections are nonzero: changing the
    action labels or the cameras changes the velocity (upstream zero-initialises both)."""
    from dataclasses import replace

    dit, _ = tiny
    cond, noise = case
    ref, _, _ = run(dit, cond, noise, uncached=True)
    traj = cond.trajectory
    other_actions = replace(cond, trajectory=replace(traj, actions=(traj.actions + 1) % 81))
    w2c = traj.w2c.clone()
    w2c[:, :3, 3] += 0.5
    other_cameras = replace(cond, trajectory=replace(traj, w2c=w2c))
    for changed in (other_actions, other_cameras):
        out, _, _ = run(dit, changed, noise, uncached=True)
        assert rel_l2(out, ref) > 1e-3


def test_hy_worldplay_bf16_cache_equals_the_uncached_path_to_bf16_rounding(case):
    """In the model's bf16 (as on a GPU) the 16-bit cache stores exactly the K/V the uncached
    forward computes; only the summation order differs: rel-L2 <= 1e-2 over 8 chunks (measured
    4e-3), while a 2-bit memory is further off (measured 5.5e-2)."""
    from dataclasses import replace

    from jbkv_cli.models.hy_worldplay.config import TINY
    from jbkv_cli.models.hy_worldplay.tiny import tiny_dit

    dit = tiny_dit(TINY, seed=0).bfloat16()
    cond, noise = case
    cond = replace(cond, txt=cond.txt.bfloat16(), vec_txt=cond.vec_txt.bfloat16())
    ref, _, _ = run(dit, cond, noise, uncached=True)
    got, _, _ = run(dit, cond, noise)
    q2, _, _ = run(dit, cond, noise, INT2)
    assert rel_l2(got, ref) <= 1e-2
    assert rel_l2(q2, ref) > 2e-2
