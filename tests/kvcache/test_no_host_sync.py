"""No host syncs in the cache's hot path: every method × correction × pruner commits, reads and
attends on a fake CUDA device (``jbkv_cli/utils/fake_cuda.py``) without reading a device value on the
host, and after the first chunks copies nothing between host and device.

A synthetic layer stack (two layers, two KV heads of 64 channels, chunks of two 16-token
frames) runs four chunks of two attention calls and a commit per layer, as a model's loop does;
the pruners read a profile written for it (layer 0 dynamic and static, layer 1 dynamic).
The model loops themselves: ``tests/models/test_fake_cuda_loop.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from jbkv_cli.attention.correction import CORRECTIONS
from jbkv_cli.kvcache import KVSpec, layer_caches
from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.prune.profile import FORMAT
from jbkv_cli.prune.registry import PRUNERS, build_pruner
from jbkv_cli.quant.registry import METHODS
from jbkv_cli.utils.fake_cuda import FakeCuda, per_chunk

MODEL = "synthetic"
LAYERS, KV_HEADS, Q_HEADS, DIM = 2, 2, 4, 64
FRAME, FRAMES = 16, 2  # tokens per frame, frames per chunk
CHUNKS, READS = 4, 2


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


def _specs(profile: str | None = None) -> list[tuple[str, KVSpec]]:
    """Every method × correction (each pruner too, with ``profile``) that builds."""
    pruners = [None] if profile is None else [build_pruner(p, profile=profile) for p in PRUNERS]
    out = []
    for pruner in pruners:
        for method in METHODS:
            for correction in CORRECTIONS:
                try:
                    spec = KVSpec.build(method, 2, correction=correction, pruner=pruner)
                except ValueError:
                    continue  # a combination the spec refuses (none is refused at run time)
                out.append((spec.variant_id, spec.for_model(MODEL, FRAMES * FRAME)))
    return out


def _rope(device: str) -> KeyRope:
    """Rotate-half RoPE tables made on the device, memoized per position by the cache."""

    def table(position: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(FRAMES * FRAME, device=device, dtype=torch.float32) + position
        freqs = 100.0 ** (-torch.arange(DIM // 2, device=device, dtype=torch.float32) / DIM)
        angles = torch.cat([pos[:, None] * freqs] * 2, dim=-1)
        return angles.cos(), angles.sin()

    return KeyRope("half", table)


def _loop(spec: KVSpec, cuda: FakeCuda, rope: bool = False) -> list[int]:
    """The transfers each chunk adds (``CHUNKS`` chunks of ``READS`` reads and a commit)."""
    length = FRAMES * FRAME
    caches = layer_caches(
        spec,
        2,
        model=MODEL,
        layers=LAYERS,
        kv_heads=KV_HEADS,
        frame_tokens=FRAME,
        rope=_rope("cuda") if rope else None,
    )
    counts = []
    for chunk in range(CHUNKS):
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
    with FakeCuda() as cuda:
        added = _loop(spec, cuda, rope)  # a host read of a device value raises HostSync
    assert added[2:] == [0] * (CHUNKS - 2), (added, cuda.transfers)


@pytest.mark.parametrize(("name", "spec"), _specs(), ids=[n for n, _ in _specs()])
def test_every_method_and_correction_reads_nothing_back(name, spec):
    _check(spec)


def test_every_pruner_reads_nothing_back(profile):
    """Each pruner with every method × correction it takes (one test: the specs need the
    profile's path)."""
    specs = _specs(profile)
    assert {s.pruner.name for _, s in specs} == set(PRUNERS)
    for _, spec in specs:
        _check(spec)


@pytest.mark.parametrize("correction", ["taylor", "exact"])
def test_pre_rope_keys_read_nothing_back(correction):
    """Keys cached before RoPE and rotated on every read (the rotation's correction terms)."""
    _check(KVSpec.build("qvg", 2, correction=correction, layout="pre-rope"), rope=True)


def test_sink_chunks_read_nothing_back():
    _check(KVSpec.build("rtn", 2, correction="exact", sink_chunks=1))
