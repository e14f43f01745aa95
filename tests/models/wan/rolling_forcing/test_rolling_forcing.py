"""Rolling Forcing (``--model rolling-forcing``, TencentARC/RollingForcing @a1477d09): its
defaults, the rolling plan, the sink-only pre-RoPE cache, the rolling loop against a cache-free
statement of it, its checkpoint layout, and the CLI through the installed ``jbkv``.

All on CPU in float32 with the tiny random configuration; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.kvcache import ChunkKVCache
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.tiny.model import TinyConfig, apply_rope, key_rope, rope_angles, rope_tables
from jbkv_cli.models.wan.rolling_forcing import model as rf
from jbkv_cli.models.wan.rolling_forcing import plan
from jbkv_cli.models.wan.self_forcing import components as comp
from jbkv_cli.models.wan.self_forcing.checkpoint import (
    convert_checkpoint,
    diffusers_name,
    strip_wrappers,
)
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule
from jbkv_cli.utils.errors import UsageError
from tests.installed import run_jbkv

pytestmark = pytest.mark.slow

TOKENS = 4  # tokens per latent frame at 32x32 (4x4 latents, 2x2 patches)
ATOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
    return rf.load_model(config="tiny-random", device="cpu")


# --------------------------------------------------------------------------- defaults and plan


def test_rolling_forcing_preset_is_upstreams_defaults():
    """``configs/rolling_forcing_dmd.yaml``: [1000, 800, 600, 400, 200] warped, shift 5, 3-frame
    blocks; ``causal_model.py``: a 24-frame buffer (sink + 7 blocks), 21 frames attended;
    README: ``checkpoints/rolling_forcing_dmd.pt`` with ``--use_ema``."""
    preset = rf.PRESETS["rolling-forcing"]
    assert (preset["steps"], preset["warp"], preset["shift"], preset["chunk_frames"]) == (
        5,
        True,
        5.0,
        3,
    )
    assert (preset["window"], preset["sink"], preset["ema"]) == (7, 1, True)
    assert (preset["height"], preset["width"]) == (480, 832)
    longvideo = rf.PRESETS["causal-forcing-longvideo"]
    assert longvideo == preset | {"steps": 4}
    assert comp.GENERATORS["causal-forcing-longvideo"].file == "chunkwise/longvideo.pt"
    generator = comp.GENERATORS["rolling-forcing"]
    assert (generator.repo_id, generator.file) == (
        "TencentARC/RollingForcing",
        "checkpoints/rolling_forcing_dmd.pt",
    )
    schedule = FewStepSchedule.build(5, 5.0)
    table = [5 * (1 - j / 1000) / (1 + 4 * (1 - j / 1000)) for j in range(1001)]
    for t, step in zip(schedule.timesteps, (1000, 800, 600, 400, 200), strict=True):
        assert t == pytest.approx(1000 * table[1000 - step], abs=1e-3)


def test_rolling_forcing_plan_staggers_blocks_and_reads():
    """Window w holds blocks max(0, w-4) .. min(B-1, w), block b at step w-b (upstream's
    ``shared_timestep``: the window's first block the cleanest); reads as the buffer gives."""
    ws = plan.windows(10, 5)
    assert len(ws) == 14 and (ws[0].start, ws[0].end) == (0, 0)
    assert [(w.start, w.end) for w in ws[3:7]] == [(0, 3), (0, 4), (1, 5), (2, 6)]
    assert [ws[6].step(b) for b in ws[6].blocks] == [4, 3, 2, 1, 0]
    assert (ws[13].start, ws[13].end, ws[13].step(9)) == (9, 9, 4)
    # full windows: 15 frames + sink + one clean block = 21; the sink right before that block
    assert [plan.window_read(ws[w]) for w in (4, 5, 6, 7, 9)] == [
        None,
        (0, 0),
        (1, 0),
        (1, 3),
        (1, 9),
    ]
    # end windows get more clean blocks: Q = 12, 9, 6, 3 frames -> 2, 3, 4, 5 blocks
    assert [plan.window_read(ws[w]) for w in (10, 11, 12, 13)] == [
        (2, 9),
        (3, 9),
        (4, 9),
        (5, 9),
    ]
    assert [plan.clean_read(b) for b in (1, 6, 7, 9)] == [
        (None, True),
        (None, True),
        (6, False),
        (6, False),
    ]


# --------------------------------------------------------------------------- the cache layout


def _kv(serial: int):
    g = torch.Generator().manual_seed(serial)
    shape = (1, 2, TinyConfig().chunk_len, TinyConfig().head_dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def test_rolling_forcing_sink_only_layout_quantizes_post_rope_and_moves_the_sink():
    """``sinks_only``: the sink stays un-rotated (re-placed per read), every other chunk is
    rotated at commit and then quantized — the same codes as a post-RoPE cache's."""
    cfg = TinyConfig()
    f = cfg.frames_per_chunk
    rope = key_rope(cfg)
    rope.sinks_only = True
    spec = replace(KVSpec.build("rtn", bits=2, correction="taylor"), sink_chunks=1)
    ours, post = ChunkKVCache(spec, rope=rope), ChunkKVCache(spec)

    def rotate(k, frame):
        return apply_rope(k, rope_tables(rope_angles(cfg, frame, f)))

    for i in range(3):
        k, v = _kv(i)
        ours.commit(k, v, position=i * f)
        post.commit(rotate(k, i * f), v)
    a, b = ours.read(), post.read()
    torch.testing.assert_close(a.k, b.k, atol=1e-6, rtol=0)
    assert torch.equal(a.k_step, b.k_step) and torch.equal(a.v, b.v)
    # the 16-bit sink carries no noise: no rotation for the correction (QuaRot's keys may pass);
    # a quantized sink would get its table, the post-RoPE chunks the identity
    n = cfg.chunk_len
    assert a.key_rotation is None
    rotation = rope.rotation([4 * f, None], [n, n], cfg.head_dim)
    assert torch.equal(rotation.cos[:n], rope.rotation([4 * f], [n], cfg.head_dim).cos)
    assert torch.equal(rotation.cos[n:], torch.ones(n, cfg.head_dim // 2))
    assert torch.equal(rotation.sin[n:], torch.zeros(n, cfg.head_dim // 2))
    moved = ours.read(positions={0: 5 * f})
    torch.testing.assert_close(moved.k[..., :n, :], rotate(_kv(0)[0], 5 * f), atol=1e-6, rtol=0)
    assert torch.equal(moved.k[..., n:, :], a.k[..., n:, :])
    assert ours.read(sinks=False).k.shape[-2] == 2 * n
    with pytest.raises(ValueError, match="post-RoPE"):
        ours.read(positions={1: 0})


# --------------------------------------------------------------------------- the oracle


def _rope_rows(transformer, frames: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' own rotary table for a sequence whose latent frames sit at ``frames``."""
    cos, sin = transformer.rope(torch.empty(1, 16, max(frames) + 1, 4, 4, device="meta"))
    rows = torch.cat([torch.arange(f * TOKENS, (f + 1) * TOKENS) for f in frames])
    return cos[:, rows], sin[:, rows]


def _forward(transformer, video, text, times, frames, mask):
    """diffusers' stock processors on ``video`` (frames at positions ``frames``, frame timesteps
    ``times``) under the token ``mask``; no jbkv code."""
    stock = [b.attn1.get_processor() for b in transformer.blocks]
    table = _rope_rows(transformer, frames)

    class Masked:
        def __init__(self, processor):
            self.processor = processor

        def __call__(self, attn, hidden, enc=None, attention_mask=None, rotary=None):
            return self.processor(attn, hidden, enc, mask[None, None], rotary)

    transformer.rope.forward = lambda hidden: table  # the sequence is longer than the table
    timestep = torch.tensor(times).repeat_interleave(TOKENS)[None]
    try:
        for block, processor in zip(transformer.blocks, stock, strict=True):
            block.attn1.set_processor(Masked(processor))
        return transformer(video, timestep, text, return_dict=False)[0]
    finally:
        del transformer.rope.forward
        for block, processor in zip(transformer.blocks, stock, strict=True):
            block.attn1.set_processor(processor)


def cache_free_rolling(model, prompt: str, seed: int) -> torch.Tensor:
    """Upstream's ``inference_rolling_forcing`` stated without a cache. Every window re-runs, in
    one masked forward: all finished blocks at t = 0 at their frames, each seeing blocks
    j-6 .. j (the clean passes: the newest 21 frames of the buffer); a copy of the sink that
    sees itself only, at frame start - 3W - 3; the window at its timesteps, seeing the sink
    copy, its W newest finished blocks (W <= 21 - Q - 3 frames, the sink not counted) and
    itself. x0 = x - sigma v; a block not at its last step is re-noised to the next level."""
    s, transformer = model.config, model.components.transformer
    k, n, blocks = s.chunk_frames, s.steps, s.num_chunks
    schedule = FewStepSchedule.build(n, s.shift)
    text = model.encode_prompt(prompt)
    generator = noise_generator(seed, prompt)
    final: dict[int, torch.Tensor] = {}
    noisy: dict[int, torch.Tensor] = {}
    for w in range(blocks + n - 1):
        start, end = max(0, w - n + 1), min(blocks - 1, w)
        if w < blocks:
            noisy[w] = torch.randn(1, 16, k, 4, 4, generator=generator)
        window = list(range(start, end + 1))
        groups, frames, times, context = [], [], [], []  # groups: (kind, block), sequence order
        if start > 0:
            room = 21 // k - len(window) - 1
            context = list(range(max(1, start - room), start))
            groups += [("clean", j) for j in range(start)] + [("sink", 0)]
            frames += [f for j in range(start) for f in range(j * k, (j + 1) * k)]
            sink_at = (start - len(context) - 1) * k
            frames += list(range(sink_at, sink_at + k))
            times += [0.0] * (start + 1) * k
        groups += [("window", b) for b in window]
        frames += [f for b in window for f in range(b * k, (b + 1) * k)]
        times += [schedule.timesteps[w - b] for b in window for _ in range(k)]

        def sees(q, key, context=context):
            (qk, qb), (kk, kb) = q, key
            if qk == "clean":
                return kk == "clean" and qb - 6 <= kb <= qb
            if qk == "sink":
                return kk == "sink"
            return kk in ("sink", "window") or (kk == "clean" and kb in context)

        allowed = torch.tensor([[sees(q, key) for key in groups] for q in groups])
        mask = allowed.repeat_interleave(k * TOKENS, 0).repeat_interleave(k * TOKENS, 1)
        inputs = [final[b] if kind != "window" else noisy[b] for kind, b in groups]
        flow = _forward(transformer, torch.cat(inputs, dim=2), text, times, frames, mask)
        flow = flow[:, :, -len(window) * k :]
        for j, b in enumerate(window):
            sigma = schedule.sigmas[w - b]
            x = noisy[b]
            x0 = (x.double() - sigma * flow[:, :, j * k : (j + 1) * k].double()).float()
            if w - b + 1 < n:
                eps = torch.randn(1, 16, k, 4, 4, generator=generator)
                noisy[b] = (1 - schedule.sigmas[w - b + 1]) * x0 + schedule.sigmas[w - b + 1] * eps
            else:
                final[b] = x0
    return torch.cat([final[b] for b in range(blocks)], dim=2)


@pytest.mark.parametrize("steps", [5, 4])
def test_rolling_forcing_16bit_loop_equals_a_cache_free_rerun_of_every_window(tiny, steps):
    """10 blocks: the sink re-placed (frames 3 .. 9), eviction (sink + 7), clean passes without
    the sink (blocks 7, 8), short end windows with up to 5 clean blocks; 4 steps: Causal-Forcing's
    long-video window of 4 blocks (2 clean blocks read)."""
    model = (
        tiny if steps == 5 else rf.RollingForcing(tiny.components, replace(tiny.config, steps=4))
    )
    assert len(model.schedule) == steps
    with torch.no_grad():
        ours, info = model.generate_latents("a cat", 5, FULL_PRECISION)
        reference = cache_free_rolling(model, "a cat", 5)
    print(f"max |rolling - cache-free| = {(ours - reference).abs().max():.2e}")
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
    # the buffer at its fullest: sink + 7 blocks, 2 layers x (K, V) x [1, 2, 12, 32] fp32
    assert info["kv_cache_bytes"] == 8 * 2 * 2 * (2 * 12 * 32) * 4


@pytest.mark.parametrize("method", ["rtn", "qvg"])
def test_rolling_forcing_quantized_cache_changes_the_video_and_its_bytes(tiny, method):
    """INT2 keys and values through the loop (QVG: LingBot-v2's policy, no Rolling Forcing
    script upstream)."""
    spec = KVSpec.build(method, bits=2, correction="taylor")
    with torch.no_grad():
        exact, full = tiny.generate_latents("a cat", 5, FULL_PRECISION)
        lat, info = tiny.generate_latents("a cat", 5, spec)
    assert 0 < (lat - exact).abs().max() < 1.0
    assert info["kv_cache_bytes"] <= full["kv_cache_bytes"] and info["sink_chunks"] == 1


def test_rolling_forcing_layout_pre_rope_keeps_every_block_unrotated(tiny):
    shape = torch.empty(tiny.chunk_shape)
    assert tiny.key_rope(FULL_PRECISION, None, shape).sinks_only
    assert not tiny.key_rope(FULL_PRECISION, "pre-rope", shape).sinks_only
    int2 = KVSpec.build("rtn", bits=2, correction="taylor")
    with torch.no_grad():
        a, _ = tiny.generate_latents("a cat", 1, FULL_PRECISION)
        b, _ = tiny.generate_latents("a cat", 1, FULL_PRECISION, layout="pre-rope")
        post, _ = tiny.generate_latents("a cat", 1, int2)
        pre, _ = tiny.generate_latents("a cat", 1, int2, layout="pre-rope")
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert (pre - post).abs().max() > 1e-4  # INT2 keys quantized in another basis


# --------------------------------------------------------------------------- weights and CLI


_spec = importlib.util.spec_from_file_location(
    "derive_keys", Path(__file__).parents[1] / "self_forcing" / "fixtures" / "derive_keys.py"
)
derive_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(derive_keys)
TINY_UPSTREAM = dict(
    dim=64, ffn_dim=32, freq_dim=256, text_dim=32, num_layers=2, in_dim=16, out_dim=16
) | {"patch": (1, 2, 2)}


def test_rolling_forcing_reads_generator_ema_with_fsdp_names(tmp_path):
    """``checkpoints/rolling_forcing_dmd.pt``: ``generator_ema`` (``--use_ema``) with
    ``_fsdp_wrapped_module.`` in its names (upstream's ``remove_fsdp_prefix``), read
    weights-only, or converted once by ``convert-checkpoint``; ``generator`` is not what loads."""
    tiny = comp.tiny_components(seed=0)
    base = tmp_path / comp.BASE_DIR
    tiny.transformer.save_config(base / "transformer")
    tiny.vae.save_pretrained(base / "vae")
    tiny.text_encoder.save_pretrained(base / "text_encoder")
    tiny.tokenizer.save_pretrained(base / "tokenizer")
    sd = tiny.transformer.state_dict()
    names = {k: diffusers_name(strip_wrappers(k)) for k in derive_keys.derive(TINY_UPSTREAM)}
    ema = {k.replace("model.", "model._fsdp_wrapped_module.", 1): sd[d] for k, d in names.items()}
    raw = {k: -sd[d] for k, d in names.items()}
    (tmp_path / "checkpoints").mkdir()
    torch.save(
        {"generator": raw, "generator_ema": ema},
        tmp_path / "checkpoints" / "rolling_forcing_dmd.pt",
    )
    pt = tmp_path / "checkpoints" / "rolling_forcing_dmd.pt"
    for suffix in (".pt", ".safetensors"):  # then converted once, the .safetensors preferred
        if suffix == ".safetensors":
            convert_checkpoint(pt, pt.with_suffix(suffix), ema=True)
        model = rf.load_model(weights=str(tmp_path), height=32, width=32, num_chunks=2)
        assert model.settings["generator"].endswith("checkpoints/rolling_forcing_dmd" + suffix)
        loaded = model.components.transformer.state_dict()
        assert set(loaded) == set(sd) and all(torch.equal(loaded[k], sd[k]) for k in sd)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(config="tiny-random", num_chunks=11), "rotary table"),
        (dict(config="rolling-forcing", num_chunks=342), "rotary table"),
        (dict(config="tiny-random", window=3), "unknown rolling-forcing option"),
    ],
)
def test_rolling_forcing_bad_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        rf.check_options(**options)


def _jbkv(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd)


TINY = ["-m", "rolling-forcing", "-o", "config=tiny-random", "--device", "cpu"]


def test_rolling_forcing_generate_int2_taylor_through_the_installed_jbkv(tmp_path):
    out = tmp_path / "run"
    args = ["generate", *TINY, "-o", "num_chunks=3", "--bits", "2", "--correct"]
    args += ["--prompt", "a cat", "--out", str(out)]
    result = _jbkv(args, tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "rolling-forcing"
    assert manifest["settings"]["rolling_window_blocks"] == 5
    record = json.loads((out / "videos" / "int2-rtn-g32-taylor" / "a cat-0.json").read_text())
    assert record["info"]["kv"] == "INT2 rtn g32 +taylor" and record["kv_cache_bytes"] > 0


def test_rolling_forcing_past_the_rope_table_is_one_line_exit_2(tmp_path):
    out = tmp_path / "run"
    args = ["generate", *TINY, "-o", "num_chunks=11", "--prompt", "a cat", "--out", str(out)]
    result = _jbkv(args, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rotary table" in lines[0] and "num_chunks must be" in lines[0]
    assert not out.exists()


def test_rolling_forcing_quantize_eval_small(tmp_path):
    """In-process (Typer's runner): the exit-code contract is the two tests above."""
    from typer.testing import CliRunner

    from jbkv_cli.cli.app import app

    args = ["quantize-eval", *TINY, "-o", "num_chunks=3", "--prompt", "a cat", "--bits", "2"]
    args += ["--quantizers", "rtn"]
    args += ["--corrections", "none,taylor", "--no-lpips", "--no-plots", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "INT2 rtn g32 +taylor" in result.output
    results = json.loads((tmp_path / "rolling-forcing" / "report" / "results.json").read_text())
    assert {row["variant"] for row in results["rows"]} >= {"int2-rtn-g32", "int2-rtn-g32-taylor"}


def test_rolling_forcing_profile_heads_reads_every_cached_window_and_pruning_is_refused(tiny):
    """``jbkv profile-heads`` measures the windows that read a cache (5 .. 13 of 14) and no clean
    pass; a pruner is one usage error (pruned caches have no pre-RoPE layout for the sink)."""
    from jbkv_cli.prune.profile import FrameMassProbe
    from jbkv_cli.prune.registry import build_pruner

    probe = FrameMassProbe(frame_tokens=TOKENS)
    with torch.no_grad():
        tiny.profile_heads("a cat", 0, probe)
    assert sorted({r.chunk for r in probe.records}) == list(range(5, 14))
    assert len(probe.records) == 9 * 2  # 2 layers
    spec = KVSpec.build("rtn", bits=2, pruner=build_pruner("forcing-kv"))
    with pytest.raises(UsageError, match="cannot prune rolling-forcing"):
        tiny.resolve_kv(spec)


def test_rolling_forcing_runs_every_method_with_the_sink_kept_before_rope(tiny):
    """Every registered method at INT2 with the Taylor correction: keys rotated by the method
    (QuaRot, TurboQuant) are fine, as the blocks they store are rotated before they quantize
    and the 16-bit sink needs no rotation in the correction."""
    from jbkv_cli.quant.registry import method_names

    model = rf.RollingForcing(tiny.components, replace(tiny.config, num_chunks=6))
    with torch.no_grad():
        exact, full = model.generate_latents("a cat", 2, FULL_PRECISION)
        for name in method_names():
            spec = model.resolve_kv(KVSpec.build(name, bits=2, correction="taylor"))
            lat, info = model.generate_latents("a cat", 2, spec)
            assert torch.isfinite(lat).all() and (lat - exact).abs().max() < 1.0, name
            assert 0 < info["kv_cache_bytes"] <= full["kv_cache_bytes"], name
