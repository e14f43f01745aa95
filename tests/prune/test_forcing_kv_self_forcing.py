"""Forcing-KV on the Self-Forcing adapter (tiny random configuration at 64×64: 2 layers of 2
heads, 16 tokens per latent frame, 3-frame chunks, float32, CPU): after every chunk the tokens
each (layer, head) holds, with the times attention reads them, equal those of a hand-written
statement of upstream's code (zju-jiyicheng/Forcing-KV@50ac1f45,
wan/modules/causal_model_forcingkv.py), and the cache's bytes stay flat once the ring has
filled."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.kvcache import KVSpec
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.prune import ForcingKV
from jbkv_cli.prune.profile import FORMAT

PROMPT = "a red ball"
T, C, CHUNKS = 16, 3, 7  # tokens per frame, frames per chunk, chunks (6 are committed)


@pytest.fixture(scope="module")
def model():
    return sf.load_model(config="tiny-random", device="cpu", height=64, width=64, num_chunks=CHUNKS)


class Recorder:
    """A probe (the adapter's hook for profiling) that passes every call to the layer caches and
    records, after each commit, the committed keys and what every head holds."""

    def __init__(self) -> None:
        self.keys: dict[int, list[torch.Tensor]] = {}  # layer -> committed keys per chunk
        self.held: dict[int, list[dict[int, Counter]]] = {}  # layer -> per chunk, per head
        self.nbytes: list[int] = []
        self.caches: list = []

    def wrap(self, caches):
        self.caches = caches
        return [_Layer(c, self, i) for i, c in enumerate(caches)]

    def at(self, chunk, step) -> None:
        pass

    def committed(self, layer: int, k: torch.Tensor) -> None:
        self.keys.setdefault(layer, []).append(k[0].clone())  # [H, C·T, D], batch 0
        self.held.setdefault(layer, []).append(held(self.caches[layer]))
        if layer == len(self.caches) - 1:
            self.nbytes.append(sum(c.nbytes for c in self.caches))


class _Layer:
    def __init__(self, cache, rec: Recorder, layer: int) -> None:
        self.cache, self.rec, self.layer = cache, rec, layer

    def commit(self, k, v):
        self.cache.commit(k, v)
        self.rec.committed(self.layer, k)

    def attend(self, *args, **kwargs):
        return self.cache.attend(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.cache, name)


def held(cache) -> dict[int, Counter]:
    """Per head, the token positions held and how many times attention reads each."""
    out: dict[int, Counter] = {}
    for chunk in cache.chunks:
        count = chunk.pruned.counts[0]
        for h in range(count.shape[0]):
            reads = out.setdefault(h, Counter())
            for i in count[h].nonzero().flatten().tolist():
                reads[chunk.serial * chunk.length + i] += int(count[h, i])
    return out


# --- upstream's rule, written out as its code runs ---------------------------------------------


def upstream(keys1, kinds1, sink_size=1, spatial=1, temporal=1, patches=8, ratio=0.33, ar=1):
    """Per chunk, what layer 0 and layer 1 hold per head, as token positions with the number of
    rows of upstream's read ``cat[sink, buffer, ring, cur]`` that carry each, following
    ``CausalWanSelfAttention.forward`` / ``dynamic_compression`` /
    ``_apply_offline_head_allocation``: lists of frames for ``sink_k``, ``local_k``, the rings
    and the buffer; ``keys1[s]`` are layer 1's clean keys of chunk ``s`` (batch 0)."""
    frame_keys = {}  # frame -> [H, T, D] of layer 1
    for s, k in enumerate(keys1):
        for f in range(C):
            frame_keys[s * C + f] = k[:, f * T : (f + 1) * T]
    dynamic = [h for h, kind in enumerate(kinds1) if kind == "dynamic"]
    history = max(spatial, temporal)
    size = T // patches
    sink, local = [], []  # frames (both layers until the split; layer 0 for good)
    static_ring, dyn_ring, buffer = [], [], []  # layer 1 after the split; buffer: (frame, patch)
    switched = False
    out = []
    for s in range(len(keys1)):
        new = list(range(s * C, (s + 1) * C))
        # layer 0 (and layer 1 before the switch): k0 = [sink | local | new]
        k0 = sink + local + new
        if not switched:
            sink = k0[:sink_size]
        post = k0[len(sink) :] if switched else k0[sink_size:]
        local = post[-history:]
        if switched:  # layer 1, grouped path
            old = list(dyn_ring)
            if len(old) >= 1:
                cands = old + new[: C - len(old)]
                chain = [*cands, new[C - len(old)]]
                scores = []
                for j in range(C):
                    a, b = frame_keys[chain[j]][dynamic], frame_keys[chain[j + 1]][dynamic]
                    for p in range(patches):
                        cos = [
                            float(
                                torch.dot(a[:, t].flatten(), b[:, t].flatten())
                                / (a[:, t].norm() * b[:, t].norm())
                            )
                            for t in range(p * size, (p + 1) * size)
                        ]
                        scores.append(sum(cos) / size)
                n = round(len(scores) * ratio)
                lowest = sorted(sorted(range(len(scores)), key=lambda i: scores[i])[:n])
                buffer = [(cands[i // patches], i % patches) for i in lowest]
            else:
                buffer = []
            static_ring = (static_ring + new)[-spatial:]
            dyn_ring = (dyn_ring + new)[-temporal:]
        if s == ar and not switched:  # after the update pass of AR step ar_start
            switched = True
            # _allocate_ring_cache: the last `temporal` frames of local_k, fewer when local_k
            # holds fewer (a partly full ring)
            static_ring, dyn_ring, buffer = local[-spatial:], local[-temporal:], []

        def pos(frames):
            return Counter(f * T + t for f in frames for t in range(T))

        layer0 = {h: pos(sink + local) for h in range(2)}
        if not switched:
            layer1 = dict(layer0)
        else:
            layer1 = {}
            for h, kind in enumerate(kinds1):
                if kind == "static":
                    layer1[h] = pos(sink + static_ring)
                else:  # rows of the buffer, then of the ring: a token in both is read twice
                    patch = Counter(f * T + p * size + t for f, p in buffer for t in range(size))
                    layer1[h] = pos(sink + dyn_ring) + patch
        out.append((layer0, layer1))
    return out


def _profile(tmp_path, kinds1) -> str:
    doc = {"format": FORMAT, "rule": "forcing-kv", "model": "self-forcing", "threshold": 0.8}
    doc["layers"] = [{"heads": ["dynamic", "static"]}, {"heads": kinds1}]
    path = tmp_path / "heads.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("kinds1", [["static", "dynamic"], ["dynamic", "dynamic"]])
@pytest.mark.parametrize("quantizer", [None, "rtn"])
def test_kept_tokens_after_each_chunk_are_upstreams(model, tmp_path, kinds1, quantizer):
    pruner = ForcingKV(profile=_profile(tmp_path, kinds1))
    spec = KVSpec.build(quantizer, 2, pruner=pruner) if quantizer else KVSpec(pruner=pruner)
    rec = Recorder()
    model.generate_latents(PROMPT, 0, spec, probe=rec)
    assert len(rec.keys[1]) == CHUNKS - 1  # the last chunk is never committed
    want = upstream(rec.keys[1], kinds1)
    for s, (layer0, layer1) in enumerate(want):
        assert rec.held[0][s] == layer0, f"layer 0 after chunk {s}"
        assert rec.held[1][s] == layer1, f"layer 1 after chunk {s}"
    # 16-token frames: 8 patches (6 does not divide 16; 4 and 8 are as near, the larger wins);
    # the buffer holds round(3 · 8 · 0.33) = 8 patches of 2 tokens: one frame per dynamic head
    dyn = kinds1.index("dynamic")
    assert len(rec.held[1][-1][dyn]) == 3 * T
    # constant budget: flat from the first buffer (chunk ar_start + 1 = 2) on
    assert len(set(rec.nbytes[2:])) == 1 and rec.nbytes[2] > rec.nbytes[1], rec.nbytes


def test_the_statement_of_upstream_is_not_forcing_kv_history(model, tmp_path):
    """The hand-written rule tells the two pruners apart (the test above can fail)."""
    from jbkv_cli.prune import ForcingKVHistory

    path = Path(_profile(tmp_path, ["static", "dynamic"]))
    doc = json.loads(path.read_text()) | {"anchor_frames": 1, "rule": "local-mass"}
    path.write_text(json.dumps(doc))
    rec = Recorder()
    spec = KVSpec(pruner=ForcingKVHistory(profile=str(path), segments=4))
    model.generate_latents(PROMPT, 0, spec, probe=rec)
    want = upstream(rec.keys[1], ["static", "dynamic"])
    assert any(rec.held[1][s] != layer1 for s, (_, layer1) in enumerate(want))


def test_a_partly_full_ring_reads_candidates_twice_as_upstream(model, tmp_path):
    """sink_size 1, ar_start 0, temporal_context_length 3: the split after chunk 0 leaves the
    dynamic ring 3·1 − 1 = 2 frames (1, 2); chunk 1's candidates are frames 1, 2, 3 and frame 3
    stays in the ring, so upstream reads frame 3's chosen patches twice (buffer and ring rows),
    until chunk 2 refills the buffer."""
    kinds1 = ["static", "dynamic"]
    pruner = ForcingKV(profile=_profile(tmp_path, kinds1), ar_start=0, temporal_context_length=3)
    rec = Recorder()
    model.generate_latents(PROMPT, 0, KVSpec(pruner=pruner), probe=rec)
    want = upstream(rec.keys[1], kinds1, temporal=3, ar=0)
    for s, (layer0, layer1) in enumerate(want):
        assert rec.held[0][s] == layer0, f"layer 0 after chunk {s}"
        assert rec.held[1][s] == layer1, f"layer 1 after chunk {s}"
    twice = sorted(p for p, n in rec.held[1][1][1].items() if n == 2)
    assert twice and all(3 * T <= p < 4 * T for p in twice), twice  # frame 3's patches only
    assert set(rec.held[1][2][1].values()) == {1}  # chunk 2: each read once again
