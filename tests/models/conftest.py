"""Shared by the model adapters' tests: a cache made without jbkv's quant code (the oracle)."""

import json

import pytest
import torch
import torch.nn.functional as F

from jbkv_cli.kvcache.spec import FULL_PRECISION


class PlainCache:
    """The unquantized cache without jbkv: raw tensors, concatenation and plain SDPA. ``window``
    keeps the last chunks only; ``attend(..., last=n)`` reads the last ``n`` held chunks."""

    spec = FULL_PRECISION
    working_nbytes = 0
    pruning = None  # never prunes

    def __init__(self, spec=None, window=None, observer=None):
        self.k, self.v, self.window, self.committed = [], [], window, 0

    @property
    def num_chunks(self) -> int:
        return len(self.k)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def commit(self, k, v) -> None:
        self.k, self.v = [*self.k, k.clone()], [*self.v, v.clone()]
        self.committed += 1
        if self.window is not None:
            self.k, self.v = self.k[-self.window :], self.v[-self.window :]

    def attend(self, q, k_cur, v_cur, scale, last=None, backend=None):
        held = self.k if last is None else self.k[len(self.k) - last :]
        values = self.v if last is None else self.v[len(self.v) - last :]
        keys = torch.cat([*held, k_cur], dim=-2)
        values = torch.cat([*values, v_cur], dim=-2)
        return F.scaled_dot_product_attention(q, keys, values, scale=scale, enable_gqa=True)


@pytest.fixture
def plain_cache():
    """The :class:`PlainCache` class (a fixture, as test modules are imported by path)."""
    return PlainCache


@pytest.fixture
def plain_layer_caches():
    """A stand-in for :func:`jbkv_cli.kvcache.layer_caches` that builds :class:`PlainCache`s."""

    def build(
        spec, window, *, model, layers, kv_heads, frame_tokens, observer=None, rope=None, phase=None
    ):
        assert rope is None, "PlainCache holds post-RoPE keys"
        assert phase is None or spec.pruner is None, "PlainCache re-phases no sink"
        return [PlainCache(spec, window) for _ in range(layers)]

    return build


@pytest.fixture
def head_profile(tmp_path):
    """``head_profile(model, layout, kind, anchor)``: the path of a Forcing-KV profile for
    ``model``'s ``head_layout()`` with every head of class ``kind``."""
    from jbkv_cli.prune.profile import FORMAT

    def write(model: str, layout: dict, kind: str, anchor: int) -> str:
        doc = {
            "format": FORMAT,
            "model": model,
            "anchor_frames": anchor,
            "threshold": 0.75,
            "layers": [{"heads": [kind] * layout["kv_heads"]}] * layout["layers"],
        }
        path = tmp_path / f"{model}-{kind}-{anchor}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    return write


@pytest.fixture(
    params=[("dynamic", 1, 1.0), ("static", 100, 0.33)],
    ids=["dynamic-keeps-every-segment", "static-anchors-span-the-video"],
)
def keep_everything(request) -> tuple[str, int, float]:
    """``(kind, anchor_frames, retention)`` of Forcing-KV profiles that drop no token: dynamic
    heads keeping every segment, or static heads whose anchors outlast the video."""
    return request.param
