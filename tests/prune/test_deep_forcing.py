"""After Deep Forcing (``jbkv_cli/prune/deep_forcing.py``): the rules its source states, on small
synthetic tensors with known answers, then through a cache as Self-Forcing's loop drives it
(two attention calls per chunk — a denoising step and the clean pass — then the commit).

Sizes: the shipped ones in frames (buffer 21, sink 10, capacity 16, R = 4, blocks of 3 frames)
with 2 tokens per frame, so every event of the source happens at the same chunk."""

from __future__ import annotations

import math

import pytest
import torch

from jbkv_cli.attention.rope import rotate_pairs
from jbkv_cli.kvcache import ChunkKVCache, KeyRope, KVSpec, layer_caches
from jbkv_cli.kvcache.pruned import check_prunable
from jbkv_cli.prune.deep_forcing import (
    DeepForcing,
    budget,
    newest,
    participation,
    select_participants,
    sink_start,
)
from jbkv_cli.prune.registry import build_pruner
from jbkv_cli.quant.registry import build_method
from jbkv_cli.utils.errors import UsageError

F, K, D, H = 2, 3, 32, 2  # tokens per frame, frames per chunk, head dim, heads
L = F * K  # tokens per chunk
FREQS = 1.0 / (10.0 ** (torch.arange(D // 2, dtype=torch.float64) / (D // 2)))


def table(position: int, tokens: int = L) -> tuple[torch.Tensor, torch.Tensor]:
    """A 1-D (temporal) RoPE on interleaved pairs: token ``t`` of a chunk at frame
    ``position`` sits at frame ``position + t // F``."""
    frames = position + torch.arange(tokens, dtype=torch.float64) // F
    angles = (frames[:, None] * FREQS).repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()


def rope() -> KeyRope:
    return KeyRope("interleaved", table)


def rotated(x: torch.Tensor, frame: int) -> torch.Tensor:
    """``x [..., n, D]`` rotated as tokens at frames ``frame + t // F``."""
    return rotate_pairs(x, *table(frame, x.shape[-2]), "interleaved")


def cache(pruner: DeepForcing | None = None, spec: KVSpec | None = None) -> ChunkKVCache:
    spec = spec or KVSpec(pruner=pruner or DeepForcing())
    (c,) = layer_caches(
        spec, 6, model="self-forcing", layers=1, kv_heads=H, frame_tokens=F, phase=rope()
    )
    return c


class Loop:
    """Self-Forcing's loop over one layer's cache with seeded random pre-RoPE keys: per chunk
    a denoising read, the clean pass's read, the commit of its post-RoPE keys."""

    def __init__(self, c: ChunkKVCache, seed: int = 0) -> None:
        self.cache = c
        self.gen = torch.Generator().manual_seed(seed)
        self.pre: list[torch.Tensor] = []  # each chunk's pre-RoPE keys
        self.queries: list[tuple[torch.Tensor, torch.Tensor]] = []  # (step, clean) per chunk

    def draw(self) -> torch.Tensor:
        return torch.randn(1, H, L, D, generator=self.gen)

    def read(self, chunk: int) -> torch.Tensor:
        """The chunk's first read (its denoising step): returns the step's queries."""
        q, k, v = rotated(self.draw(), chunk * K), rotated(self.draw(), chunk * K), self.draw()
        self.cache.attend(q, k, v, scale=D**-0.5)
        self.step_q = q
        return q

    def finish(self, chunk: int) -> None:
        """The clean pass (a read) and the commit."""
        q, pre, v = rotated(self.draw(), chunk * K), self.draw(), self.draw()
        k = rotated(pre, chunk * K)
        self.cache.attend(q, k, v, scale=D**-0.5)
        self.cache.commit(k, v)
        self.pre.append(pre)
        self.queries.append((self.step_q, q))

    def chunk(self, chunk: int) -> None:
        self.read(chunk)
        self.finish(chunk)

    def held(self) -> torch.Tensor:
        """``[Lh]`` bool: the tokens held (batch row 0, head 0), over every committed chunk
        (released chunks: none held)."""
        out = torch.zeros(len(self.pre) * L, dtype=torch.bool)
        for c in self.cache.chunks:
            out[c.serial * L : (c.serial + 1) * L] = c.pruned.kept[0, 0]
        return out


# --- the rules ---------------------------------------------------------------------------------


def test_participation_is_the_recent_query_sum_dot_each_key_over_heads():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, 8, D, generator=g)  # 8 recent queries per head
    k = torch.randn(1, H, 5, D, generator=g)
    got = participation(q.sum(-2), k, H)
    want = torch.zeros(5, dtype=torch.float64)
    for i in range(5):
        for h in range(H):
            for r in range(8):
                want[i] += (q[0, h, r].double() * k[0, h, i].double()).sum()
    want /= math.sqrt(D) * H
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-5)


def test_participation_reads_a_kv_head_for_its_group_of_query_heads():
    g = torch.Generator().manual_seed(2)
    qsum = torch.randn(1, 4, D, generator=g)  # 4 query heads over 2 KV heads
    k = torch.randn(1, 2, 3, D, generator=g)
    want = ((qsum[:, :2].sum(1) * k[:, 0]).sum(-1) + (qsum[:, 2:].sum(1) * k[:, 1]).sum(-1)) / (
        math.sqrt(D) * 4
    )
    torch.testing.assert_close(participation(qsum, k, 4), want, rtol=1e-5, atol=1e-5)


def test_selection_keeps_sink_recent_and_the_top_c_between():
    scores = torch.tensor([[9.0, 9.0, 1.0, 5.0, 3.0, 4.0, 0.0, 9.0, 9.0]])
    valid = torch.ones(1, 9, dtype=torch.bool)
    sink = torch.arange(9) < 2
    recent = torch.arange(9) >= 7
    keep, chosen = select_participants(scores, valid, sink[None], recent[None], top_c=2)
    assert keep[0].tolist() == [1, 1, 0, 1, 0, 1, 0, 1, 1]  # sink, 5.0 and 4.0, recent
    assert chosen[0].nonzero().flatten().tolist() == [3, 5]


def test_selection_excludes_tokens_chosen_max_reuse_times_and_keeps_fewer_when_few_remain():
    scores = torch.tensor([[0.0, 5.0, 4.0, 3.0, 0.0]])
    valid = torch.tensor([[True, True, True, False, True]])  # token 3 was dropped before
    sink = torch.tensor([[True, False, False, False, False]])
    recent = torch.tensor([[False, False, False, False, True]])
    counts = torch.tensor([[0, 7, 2, 0, 0]], dtype=torch.uint8)
    keep, chosen = select_participants(scores, valid, sink, recent, 2, counts, max_reuse=7)
    assert chosen[0].tolist() == [0, 0, 1, 0, 0]  # 5.0 used up, 3.0 not held: only one left
    assert keep[0].tolist() == [1, 0, 1, 0, 1]
    _, unlimited = select_participants(scores, valid, sink, recent, 2, counts, max_reuse=0)
    assert unlimited[0].tolist() == [0, 1, 1, 0, 0]


def test_recent_tokens_are_the_newest_held_ones():
    valid = torch.tensor([[True, True, False, True, False, True]])
    assert newest(valid, 2)[0].tolist() == [0, 0, 0, 1, 0, 1]
    assert newest(valid, 0)[0].tolist() == [0] * 6


def test_budget_and_sink_phase_at_the_shipped_sizes():
    frame = 1560
    # the first event: 21 frames held, a 3-frame block entering; 10 sink + 2 Top-C + 4 recent
    assert budget(21 * frame, 3 * frame, 10 * frame, 4 * frame, 16 * frame, 21 * frame) == (
        10 * frame,
        4 * frame,
        2 * frame,
    )
    # the sink starts at the new block's frame − 16: upstream's hard-coded first delta 21 − 16
    assert sink_start(21, 16 * frame, 10 * frame, frame) == 21 - 16
    assert sink_start(27, 16 * frame, 10 * frame, frame) == 11
    # few candidates: the total is cut to them, Top-C to what is left
    assert budget(3, 2, 4, 4, 16, 21) == (4, 4, 0)


# --- through a cache, as Self-Forcing's loop drives it ----------------------------------------


def test_nothing_happens_until_a_chunk_would_overflow_the_buffer():
    loop = Loop(cache())
    for c in range(7):  # 21 frames committed: every read before fits the buffer
        loop.chunk(c)
        assert bool(loop.held().all()) and loop.cache.pruning.phase() == (0, 0)
    assert loop.cache.num_tokens == 21 * F  # no window: the model's 6 chunks do not apply
    loop.read(7)  # 21 + 3 > 21: the event, before this read
    held = loop.held()
    assert int(held.sum()) == (16 - K) * F  # compacted: 16 frames with the new block
    assert bool(held[: 10 * F].all())  # the sink
    assert bool(held[20 * F :].all())  # recent: the last held frame (+ the block itself)
    assert int(held[10 * F : 20 * F].sum()) == 2 * F  # Top-C: two frames' worth of tokens
    view = loop.cache.read()
    assert int(view.valid[0, 0].sum()) == int(held.sum())  # attention reads only those


def test_top_c_are_the_tokens_the_recent_queries_sum_points_at():
    loop = Loop(cache())
    for c in range(7):
        loop.chunk(c)
    q7 = loop.read(7)
    # R = 4 frames of queries: the last frame of chunk 6's clean pass, chunk 7's first step
    clean6 = loop.queries[6][1]
    qsum = clean6[..., -F:, :].sum(-2) + q7.sum(-2)  # [1, H, D]
    keys = torch.cat([rotated(p, c * K) for c, p in enumerate(loop.pre)], dim=-2)
    scores = participation(qsum, keys, H)[0]
    middle = torch.arange(10 * F, 20 * F)
    want = set(middle[scores[middle].topk(2 * F).indices].tolist())
    got = set(loop.held()[10 * F : 20 * F].nonzero().flatten().add(10 * F).tolist())
    assert got == want


def test_events_come_every_second_block_and_compact_to_sixteen_frames():
    loop = Loop(cache())
    held_at_read = []
    for c in range(13):
        loop.read(c)
        held_at_read.append(int(loop.held().sum()) // F if c else 0)
        loop.finish(c)
    # before the read: 0, 3, …, 21 frames; events at blocks 7, 9, 11 leave 13 (+ the block: 16)
    assert held_at_read == [0, 3, 6, 9, 12, 15, 18, 13, 16, 13, 16, 13, 16]


def test_the_sink_is_re_phased_to_sit_just_before_the_kept_window():
    loop = Loop(cache())
    for c in range(7):
        loop.chunk(c)
    sink_pre = torch.cat(loop.pre, dim=-2)[..., : 10 * F, :]
    for block, start in ((7, 21 - 16), (9, 27 - 16)):  # the new block's frame − 16
        if block == 9:
            loop.finish(7)
            loop.chunk(8)
        loop.read(block)
        assert loop.cache.pruning.phase() == (10 * F, start)
        view = loop.cache.read()
        # the sink's keys as if committed at frames start … start + 9: just before the 6
        # kept frames (Top-C and recent) that end with the block
        torch.testing.assert_close(view.k[..., : 10 * F, :], rotated(sink_pre, start))
        # the rest of the sink chunks (frames 10, 11 of chunk 3) keep their phases
        held = loop.held()[10 * F : 4 * L]
        torch.testing.assert_close(
            view.k[0, :, 10 * F : 4 * L][:, held], rotated(loop.pre[3], 3 * K)[0, :, F:][:, held]
        )


def test_a_quantized_re_phased_sink_carries_its_rotation_for_the_correction():
    spec = KVSpec.build("rtn", 2, correction="taylor", pruner=DeepForcing())
    loop = Loop(cache(spec=spec))
    for c in range(8):
        loop.chunk(c)
    view = loop.cache.read()
    rot = view.key_rotation
    assert rot is not None and rot.num_tokens == view.k.shape[-2]
    cos, sin = (t[:1, 0::2].float().expand(10 * F, -1) for t in table(21 - 16, 1))
    torch.testing.assert_close(rot.cos[: 10 * F], cos)
    torch.testing.assert_close(rot.sin[: 10 * F], sin)
    assert bool((rot.cos[10 * F :] == 1).all()) and bool((rot.sin[10 * F :] == 0).all())
    assert loop.cache.nbytes_by_kind().keys() == {"participative"}


def test_released_chunks_hold_nothing_and_the_cache_stays_bounded():
    """A chunk outside the sink and outside recent at more than ``max_reuse`` events is
    released from the layer's bookkeeping alone (what bounds the cache off the CPU): each
    release is a chunk the decision keeps nothing of."""
    loop = Loop(cache(DeepForcing(max_reuse=1)))
    layer = loop.cache.pruning
    decide, released = layer.decide, []

    def spy(held, tokens):
        decision = decide(held, tokens)
        keep = {serial: k for serial, _, k in decision.settled}
        assert not any(bool(keep[s].any()) for s in decision.released)
        released.extend(decision.released)
        return decision

    layer.decide = spy
    for c in range(40):
        loop.chunk(c)
        # the 4 chunks of the sink, and (events every second block, a release at the second
        # event a chunk spends outside recent) at most the last 6 blocks
        assert loop.cache.num_chunks <= 4 + 6, c
    assert len(released) > 10
    assert {0, 1, 2, 3, 39} <= {c.serial for c in loop.cache.chunks}


# --- options and refusals ----------------------------------------------------------------------


def test_options_and_variant_id():
    assert DeepForcing().variant_id == "deepforcing"
    assert build_pruner("deep-forcing", sink_frames=14, max_reuse=0).variant_id == (
        "deepforcing-s14-u0"
    )
    with pytest.raises(ValueError, match="at most buffer_frames"):
        DeepForcing(capacity_frames=22)
    with pytest.raises(ValueError, match="runs on self-forcing"):
        DeepForcing().plans("tiny", 1, 2, 4)
    with pytest.raises(ValueError, match="must hold a chunk"):
        DeepForcing().check_chunks(5)


def test_a_method_with_a_rotated_basis_is_refused_and_the_cache_needs_the_table():
    check_prunable(build_method("rtn", bits=2), 64, DeepForcing())
    with pytest.raises(ValueError, match="rotated basis: deep-forcing's sink cannot be re-phased"):
        check_prunable(build_method("quarot", bits=2), 64, DeepForcing())
    check_prunable(build_method("quarot", bits=2), 64, build_pruner("flowcache"))
    plan = DeepForcing().plans("self-forcing", 1, H, F)[0]
    with pytest.raises(ValueError, match="needs the model's RoPE table"):
        ChunkKVCache(KVSpec(pruner=DeepForcing()), pruning=plan)


def test_self_forcing_refusals_and_its_table_re_phasing_in_time():
    from jbkv_cli.models import registry
    from jbkv_cli.models.wan.rope import wan_key_rope, wan_phase_rope

    model = registry.load_model("self-forcing", config="tiny-random", sink=1, window=2)
    with pytest.raises(UsageError, match="keeps its own sink"):
        model.resolve_kv(KVSpec(pruner=DeepForcing()))
    model = registry.load_model("self-forcing", config="tiny-random")
    with pytest.raises(UsageError, match="must hold a chunk"):
        model.resolve_kv(KVSpec(pruner=DeepForcing(recent_frames=2, sink_frames=1)))
    with pytest.raises(ValueError, match="keeps its own sink: no sink chunks"):
        KVSpec(pruner=DeepForcing(), sink_chunks=1)
    # the re-phase on Wan's own table: a key at frame f turned by row 0 of the table at Δ is
    # the key at frame f + Δ (only the temporal channels move)
    table = wan_key_rope(model.components.transformer, torch.empty(model.chunk_shape)).tables
    pre = torch.randn(1, 1, table(0)[0].shape[0], model.settings["head_dim"])
    shift = [t[:1].expand_as(t) for t in table(5)]
    at_4 = rotate_pairs(pre, *table(4), "interleaved")
    torch.testing.assert_close(
        rotate_pairs(at_4, *shift, "interleaved"), rotate_pairs(pre, *table(9), "interleaved")
    )
    # the cache's phase table: that row alone (one token per frame), each memoized table its
    # own [F, D] storage, not the (Δ + F)-frame table it was cut from
    phase = wan_phase_rope(model.components.transformer, torch.empty(model.chunk_shape))
    frames = model.chunk_shape[2]
    for cos, full in zip(phase.tables(5), table(5), strict=True):
        assert cos.shape == (frames, full.shape[-1])
        assert torch.equal(cos[:1], full[:1])
        assert cos.untyped_storage().nbytes() == cos.numel() * cos.element_size()


def test_bytes_are_the_stored_tensors_positions_query_sums_and_counters():
    loop = Loop(cache())
    for c in range(8):  # the event at block 7's read, then block 7 committed whole
        loop.chunk(c)
    held = int(loop.held().sum())  # per lane: (16 − 3) + 3 frames
    assert held == 16 * F
    lanes = H  # one batch row
    stored = lanes * held * (2 * D * 4 + 2)  # float32 keys and values, int16 positions
    window = 4 * H * D * 4  # R = 4 per-frame query sums, float32
    counters = sum(c.length for c in loop.cache.chunks)  # one uint8 per token laid out
    assert loop.cache.nbytes == stored + window + counters


@pytest.mark.slow
def test_quantize_eval_runs_it_on_self_forcing(tmp_path):
    """End to end through the installed ``jbkv`` on the tiny Self-Forcing (about a minute of
    CPU): the 16-bit and INT2 (± taylor) variants after Deep Forcing, sized to decide within 6
    blocks, hold fewer bytes than the reference's window of 6 blocks."""
    import json

    from tests.installed import run_jbkv

    out = tmp_path / "out"
    done = run_jbkv(
        *("quantize-eval", "--model", "self-forcing", "-o", "config=tiny-random", "-o", "steps=1"),
        *("--num-chunks", "6", "--prompt", "a red ball", "--seeds", "0", "--bits", "2"),
        *("--quantizers", "rtn", "--corrections", "none,taylor", "--pruners", "deep-forcing"),
        *("-M", "deep-forcing.buffer_frames=9", "-M", "deep-forcing.sink_frames=2"),
        *("-M", "deep-forcing.capacity_frames=7", "--no-lpips", "--no-plots"),
        *("--device", "cpu", "--out", out),
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "self-forcing" / "report" / "results.json").read_text())["rows"]
    stored = {r["variant"]: r["kv_cache_bytes"] for r in rows}
    ids = ["reference", "deepforcing-b9-s2-c7", "int2-rtn-g32-deepforcing-b9-s2-c7"]
    assert set(ids) | {ids[-1] + "-taylor"} == set(stored)
    assert stored[ids[0]] > stored[ids[1]] > stored[ids[2]] > 0
    assert "after Deep Forcing b9 s2 c7" in done.stdout
