"""The key check: Matrix-Game-2.0's cached chunk loop with full-precision caches (main, mouse
and keyboard) equals a cache-free re-run of the whole video so far under upstream's
block-causal local mask (``_prepare_blockwise_causal_attn_mask[_action]``), chunk by chunk,
step by step, with the same noise — on the tiny random config (3 chunks of 3 latent frames,
local attention 6 frames: from chunk 2 on, chunk 0 has left every window)."""

import torch

from jbkv_cli.kvcache import FULL_PRECISION, KVSpec
from jbkv_cli.kvcache.coverage import counting
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.matrix_game.attention import MaskedAttention
from jbkv_cli.models.wan.self_forcing.schedule import renoise, to_x0


def cache_free_latents(model, cond, seed, name):
    """The loop stated without caches: chunk c's every step runs the DiT on the clean chunks
    0 … c − 1 (t = 0) followed by the noisy chunk c (t_i), masked; its last 3 frames' output."""
    s, sched = model.config, model.schedule
    k = s.chunk_frames
    g = noise_generator(seed, name)
    done: list[torch.Tensor] = []
    for c in range(s.num_chunks):
        x = next(model.draws(g, 1))
        frames = (c + 1) * k
        attn = MaskedAttention(frames, model.frame_tokens, k, model.preset.dit.local_attn_size)
        for i, (t, sigma) in enumerate(zip(sched.timesteps, sched.sigmas, strict=True)):
            seq = torch.cat([*done, x], dim=2)
            ts = torch.tensor([[0.0] * (c * k) + [float(t)] * k])
            a = cond.actions
            v = model.dit(
                seq, ts, 0, cond.cond[:, :, :frames], cond.clip, a.mouse, a.keyboard, attn
            )
            x0 = to_x0(x, v[:, :, -k:].float(), sigma)
            if i + 1 < len(sched):
                x = renoise(x0, next(model.draws(g, 1)), sched.sigmas[i + 1])
        done.append(x0)
    return torch.cat(done, dim=2)


def test_matrix_game_cached_loop_equals_cache_free_masked_rerun(tiny_model, tiny_case):
    case, cond = tiny_case
    with torch.no_grad():
        cached, info = tiny_model.generate_latents(cond, 0, case.name, FULL_PRECISION)
        oracle = cache_free_latents(tiny_model, cond, 0, case.name)
    assert cached.shape == oracle.shape == (1, 16, 9, 4, 4)
    torch.testing.assert_close(cached, oracle, rtol=1e-4, atol=1e-4)
    assert set(info["kv_cache_bytes_by_cache"]) == {"main", "mouse", "keyboard"}


def test_matrix_game_actions_steer_the_video(tiny_model, tiny_case):
    """The ActionModule is live: other keys and mouse give other latents (an oracle that
    ignored the actions would pass the test above for any action file)."""
    case, cond = tiny_case
    other = type(cond)(
        cond.cond, cond.clip, type(cond.actions)(1 - cond.actions.keyboard, -cond.actions.mouse)
    )
    with torch.no_grad():
        a, _ = tiny_model.generate_latents(cond, 0, case.name, FULL_PRECISION)
        b, _ = tiny_model.generate_latents(other, 0, case.name, FULL_PRECISION)
    assert (a - b).abs().max() > 1e-3


def test_matrix_game_int2_action_caches_are_quantized_and_reported(tiny_model, tiny_case):
    """INT2 stores every cache smaller; quantize_actions=False keeps the action caches at
    the reference's bytes while the main cache shrinks."""
    from dataclasses import replace

    case, cond = tiny_case
    spec = KVSpec.build("rtn", 2, correction="taylor")
    with torch.no_grad():
        _, ref = tiny_model.generate_latents(cond, 0, case.name, FULL_PRECISION)
        _, q = tiny_model.generate_latents(cond, 0, case.name, spec)
        keep = replace(tiny_model.config, quantize_actions=False)
        model16 = type(tiny_model)(
            tiny_model.dit, tiny_model.vae, tiny_model.image_encoder, tiny_model.preset, keep
        )
        _, k16 = model16.generate_latents(cond, 0, case.name, spec)
    r, qq, kk = (d["kv_cache_bytes_by_cache"] for d in (ref, q, k16))
    for part in ("main", "mouse", "keyboard"):
        assert 0 < qq[part] < r[part], part
    assert kk["mouse"] == r["mouse"] and kk["keyboard"] == r["keyboard"]
    assert kk["main"] == qq["main"]
    assert q["kv_cache_bytes"] == sum(qq.values())


def test_matrix_game_qvg_reads_every_held_chunk_quantized(tiny_model, tiny_case):
    """QVG on Matrix-Game-2.0 per chunk (jbkv's stated choice, qvg_policy.py): every finished
    chunk its caches hold is stored quantized (share 1). LingBot-v2's guards, which models
    without a QVG script get elsewhere, would quantize each chunk only as it leaves the
    one-chunk window: nothing held quantized (share 0), a no-op."""
    case, cond = tiny_case
    with torch.no_grad(), counting() as per_chunk:
        tiny_model.generate_latents(cond, 0, case.name, KVSpec.build("qvg", 2, 32))
    assert per_chunk.held > 0 and per_chunk.compressed == per_chunk.held
    guarded = KVSpec.build("qvg", 2, 32, span_chunks=1, keep_recent_chunks=1, sink_keep_chunks=1)
    with torch.no_grad(), counting() as lingbot:
        tiny_model.generate_latents(cond, 0, case.name, guarded)
    assert lingbot.held > 0 and lingbot.compressed == 0


def test_matrix_game_a_window_of_4_frames_is_kept_frame_by_frame(tiny_model, tiny_case):
    """GTA's local attention of 4 frames (not whole chunks of 3): the caches commit frame by
    frame and keep the previous chunk's last frame — the masked re-run with local = 4 again."""
    from jbkv_cli.models.wan.matrix_game import load_model

    case, cond = tiny_case
    gta = load_model(config="tiny-random", device="cpu", local_attn_size=4)
    assert (gta.config.window, gta.config.commit_frames) == (1, 1)
    with torch.no_grad():
        cached, info = gta.generate_latents(cond, 0, case.name, FULL_PRECISION)
        oracle = cache_free_latents(gta, cond, 0, case.name)
        six, _ = tiny_model.generate_latents(cond, 0, case.name, FULL_PRECISION)
    torch.testing.assert_close(cached, oracle, rtol=1e-4, atol=1e-4)
    assert (cached - six).abs().max() > 1e-3  # another window, another video
    # one frame of 4 tokens a layer: a third of the 6-frame window's chunk of 3 frames
    _, info6 = tiny_model.generate_latents(cond, 0, case.name, FULL_PRECISION)
    assert 3 * info["kv_cache_bytes_by_cache"]["main"] == info6["kv_cache_bytes_by_cache"]["main"]
