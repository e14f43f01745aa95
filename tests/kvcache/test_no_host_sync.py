"""No host syncs in the cache's hot path: every method × correction, and each pruner, method and
correction on a pruned cache, commits, reads and attends on a fake CUDA device
(``jbkv_cli/utils/fake_cuda.py``) without reading a device value on the host, and after the
first chunks copies nothing between host and device: a constant is copied the first time the
path that needs it runs (chunk 0 stores the first quantized chunk, chunk 1 reads it; with sink
chunks stored exact, that comes ``sink_chunks`` chunks later), then kept.
A pruned chunk's lanes are stored at the pruner's capacity (``Decision.held``), which settles
once its first frames are decided: one chunk later, a lane of a new length draws its k-means
inits once more (``quant/kmeans.py``, ``Draws``).

A synthetic layer stack (two KV heads of 64 channels, chunks of two 16-token frames) runs four
chunks of two attention calls and a commit per layer, as a model's loop does: one layer for a
method × correction (layers hold independent caches: a second adds the same operations), two
for the pruners, which read a profile written for it (layer 0 dynamic and static, layer 1
dynamic). Deep Forcing, which runs on Self-Forcing only, gets that name, the rotate-half table
to re-phase its sink with, and sizes that make it decide from the 4th chunk on; its first
re-phase makes the rotation's constants (the correction's pair channels), so it warms a chunk
longer.
The model loops themselves: ``tests/models/test_fake_cuda_loop.py``.
"""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch

from jbkv_cli.attention.correction import CORRECTIONS
from jbkv_cli.kvcache import KVSpec, layer_caches
from jbkv_cli.kvcache.pruned import check_prunable
from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.prune.profile import FORMAT
from jbkv_cli.prune.registry import PRUNERS, build_pruner
from jbkv_cli.quant.registry import METHODS
from jbkv_cli.utils.fake_cuda import FakeCuda, per_chunk

# the whole product under fake CUDA (~2 min on 2 cores); the fast lane has the unit tests
pytestmark = pytest.mark.slow

MODEL = "synthetic"
KV_HEADS, Q_HEADS, DIM = 2, 4, 64
PRUNED_LAYERS = 2  # the profile's layers
FRAME, FRAMES = 16, 2  # tokens per frame, frames per chunk
READS = 2
STEADY = 2  # chunks checked after the warm-up


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> str:
    doc = {
        "format": FORMAT,
        "model": MODEL,
        "anchor_frames": 1,
        "threshold": 0.75,
        "layers": [{"heads": ["dynamic", "static"]}, {"heads": ["dynamic", "dynamic"]}],
    }
    path = tmp_path_factory.mktemp("profile") / f"{MODEL}.json"
    path.write_text(json.dumps(doc))
    return str(path)


# KVQuant's 1-D k-means runs a fixed 50 rounds of the same ops with no read between them
# (quant/nuq.py): 2 rounds here show the same absence of host reads at 1/25 of the cost
FEWER_ROUNDS = {"kvquant": {"iters": 2}}


def _spec(method: str, correction: str, pruner=None) -> KVSpec | None:
    """The spec the CLI runs, or None for a combination refused before the run (a pruned one
    needs methods that store each token on its own: ``check_prunable``)."""
    try:
        spec = KVSpec.build(
            method, 2, correction=correction, pruner=pruner, **FEWER_ROUNDS.get(method, {})
        )
        for stored in {spec.key, spec.value} - {None} if pruner else ():
            check_prunable(stored, DIM, pruner)
    except ValueError:
        return None  # refused before the run (none is refused in it)
    return spec.for_model(MODEL, FRAMES * FRAME)


def _specs() -> list[tuple[str, KVSpec]]:
    """Every method × correction that builds."""
    specs = (_spec(m, c) for m in METHODS for c in CORRECTIONS)
    return [(s.variant_id, s) for s in specs if s is not None]


def _pruned_specs(profile: str) -> list[KVSpec]:
    """A covering of method × pruner × correction: method ``j`` pruned by the first pruner
    from ``j`` on that takes it, with the first correction from ``j`` on that the pair takes;
    then each correction not run yet, with the next pruner in turn and the first method that
    takes both; then each pruner not run yet. The whole method × correction product runs unpruned above; a pruner's
    decisions do not read the correction, and a correction reads every pruned chunk through
    the same pruned read (``kvcache/pruned.py``)."""
    pruners = [pruner_with_profile(name, profile) for name in PRUNERS]
    corrections = list(CORRECTIONS)

    def rotated(items: list, start: int) -> list:
        return [items[(start + i) % len(items)] for i in range(len(items))]

    def first(specs) -> list[KVSpec]:
        return [s for s in [next((s for s in specs if s is not None), None)] if s is not None]

    out = []
    for j, method in enumerate(METHODS):
        pairs = ((p, c) for p in rotated(pruners, j) for c in rotated(corrections, j))
        out += first(_spec(method, c, p) for p, c in pairs)
    for k, correction in enumerate(corrections):
        if not any(s.correction == correction for s in out):
            pairs = ((m, p) for p in rotated(pruners, k) for m in METHODS)
            out += first(_spec(m, correction, p) for m, p in pairs)
    for pruner in pruners:
        if not any(s.pruner == pruner for s in out):
            out += first(_spec(m, c, pruner) for m in METHODS for c in corrections)
    return out


def pruner_with_profile(name: str, profile: str, chunk_frames: int = FRAMES):
    """The pruner ``name``, reading ``profile`` when it takes a head profile; one that bounds
    the cache itself (Deep Forcing) sized to decide at every read from the 4th chunk of
    ``chunk_frames`` frames on (a buffer of 3 chunks; a sink frame, 2 chunks and a frame kept)."""
    takes = "profile" in {f.name for f in fields(PRUNERS[name])}
    options: dict = {"profile": profile} if takes else {}
    if PRUNERS[name].owns_buffer:
        k = chunk_frames
        options = dict(buffer_frames=3 * k, sink_frames=1, capacity_frames=2 * k + 1)
        options["recent_frames"] = k
    return build_pruner(name, **options)


def _rope(device: str) -> KeyRope:
    """Rotate-half RoPE tables made on the device, memoized per position by the cache."""

    def table(position: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(FRAMES * FRAME, device=device, dtype=torch.float32) + position
        freqs = 100.0 ** (-torch.arange(DIM // 2, device=device, dtype=torch.float32) / DIM)
        angles = torch.cat([pos[:, None] * freqs] * 2, dim=-1)
        return angles.cos(), angles.sin()

    return KeyRope("half", table)


def _loop(spec: KVSpec, cuda: FakeCuda, chunks: int, rope: bool) -> list[int]:
    """The transfers each chunk adds (``chunks`` chunks of ``READS`` reads and a commit)."""
    length = FRAMES * FRAME
    owns = spec.pruner is not None and spec.pruner.owns_buffer  # Self-Forcing's, re-phased
    caches = layer_caches(
        spec,
        2,
        model="self-forcing" if owns else MODEL,
        layers=1 if spec.pruner is None else PRUNED_LAYERS,
        kv_heads=KV_HEADS,
        frame_tokens=FRAME,
        rope=_rope("cuda") if rope else None,
        phase=_rope("cuda") if owns else None,
    )
    counts = []
    for chunk in range(chunks):
        for _ in range(READS):
            for cache in caches:
                q = torch.randn(1, Q_HEADS, length, DIM, device="cuda", dtype=torch.bfloat16)
                kv = torch.randn(2, 1, KV_HEADS, length, DIM, device="cuda", dtype=torch.bfloat16)
                cache.attend(q, kv[0], kv[1], scale=DIM**-0.5)
        for cache in caches:
            kv = torch.randn(2, 1, KV_HEADS, length, DIM, device="cuda", dtype=torch.bfloat16)
            cache.commit(kv[0], kv[1], **({"position": chunk * FRAMES} if rope else {}))
        counts.append(cuda.count())
    return per_chunk(counts)


def _check(spec: KVSpec, rope: bool = False) -> None:
    owns = spec.pruner is not None and spec.pruner.owns_buffer
    warm = 2 + spec.sink_chunks + (spec.pruner is not None) + owns  # module docstring
    with FakeCuda() as cuda:
        added = _loop(spec, cuda, warm + STEADY, rope)  # a host read raises HostSync
    assert added[warm:] == [0] * STEADY, (spec.variant_id, added, cuda.transfers)


@pytest.mark.parametrize(("name", "spec"), _specs(), ids=[n for n, _ in _specs()])
def test_every_method_and_correction_reads_nothing_back(name, spec):
    _check(spec, rope=spec.key_layout == "pre-rope")  # KVQuant caches keys before RoPE


def test_every_pruner_reads_nothing_back(profile):
    """Each pruner, each method a pruner takes and each correction a pruned cache takes
    (:func:`_pruned_specs`; one test: the specs need the profile's path)."""
    specs = _pruned_specs(profile)
    pruners = [pruner_with_profile(name, profile) for name in PRUNERS]
    assert {s.pruner.name for s in specs} == set(PRUNERS)
    combos = [(m, c, p) for m in METHODS for c in CORRECTIONS for p in pruners]
    taken = [(m, c) for m, c, p in combos if _spec(m, c, p) is not None]
    assert {s.correction for s in specs} == {c for _, c in taken}
    for method in {m for m, _ in taken}:
        assert any(s.key.name == method for s in specs), method
    for spec in specs:
        _check(spec)


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_pre_rope_keys_read_nothing_back(correction):
    """Keys cached before RoPE and rotated on every read (the rotation's correction terms)."""
    _check(KVSpec.build("qvg", 2, correction=correction, layout="pre-rope"), rope=True)


def test_sink_chunks_read_nothing_back():
    _check(KVSpec.build("rtn", 2, correction="exact", sink_chunks=1))
