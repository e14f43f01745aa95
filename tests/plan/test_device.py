"""The plan's device: components by name, offloads to ``meta``, the labels of the cache's
calls, the tensors a cache holds."""

from __future__ import annotations

import gc

import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.plan.device import ATTENTION, CACHE, PlanDevice, components, held_tensors


class _Encoder:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(4, 4)


class _Adapter:
    def __init__(self) -> None:
        self.dit = torch.nn.Linear(8, 8)
        self.vae = torch.nn.Conv1d(2, 2, 3)
        self.text_encoder = _Encoder()
        self.parts = {"head": torch.nn.Linear(2, 2), "dit": self.dit}  # dit again: once


_Adapter.__module__ = _Encoder.__module__ = "jbkv_cli.tests"  # walked like an adapter


def test_components_are_the_top_level_modules_by_name():
    found = components(_Adapter())
    assert sorted(found) == ["dit", "head", "text_encoder", "vae"]


def test_weights_by_component_and_an_offload_goes_to_meta():
    with PlanDevice() as device:
        adapter = _Adapter()
        adapter.dit.to("cuda")
        sizes = device.adopt_weights(adapter)
        assert sizes["dit"] == (8 * 8 + 8) * 4
        assert device.tracker.live == {"weights:dit": (8 * 8 + 8) * 4}
        adapter.text_encoder.model.to("cuda")  # a phase puts it on the device ...
        assert device.tracker.live["weights:text_encoder"] == (16 + 4) * 4
        adapter.text_encoder.model.to("cpu")  # ... and takes it off: never onto the host
        gc.collect()
        assert adapter.text_encoder.model.weight.device.type == "meta"
        assert "weights:text_encoder" not in device.tracker.live


def test_a_commit_is_the_cache_and_a_read_is_attention():
    spec = KVSpec.build("rtn", 2)
    with PlanDevice() as device:
        cache = ChunkKVCache(spec, window=1)
        k = torch.empty(1, 2, 64, 32, device="cuda", dtype=torch.bfloat16)
        cache.commit(k, k)
        gc.collect()
        assert device.tracker.live[CACHE] == cache.nbytes  # codes and steps, nothing else kept
        q = torch.empty(1, 2, 16, 32, device="cuda", dtype=torch.bfloat16)
        out = cache.attend(q, q, q, scale=32**-0.5)
        assert device.tracker.live[ATTENTION] >= out.numel() * 2
        assert {t.untyped_storage()._cdata for t in held_tensors([cache])} >= {
            t.untyped_storage()._cdata
            for t in cache.chunks[0].sides["key"].parts[0].stored().values()
        }


def test_tied_weights_stay_one_tensor_on_the_device():
    with PlanDevice() as device:
        with torch.device("meta"):
            embed = torch.nn.Embedding(100, 8)
            head = torch.nn.Linear(8, 100, bias=False)
        head.weight = embed.weight  # tied, as T5's and UMT5's embeddings are
        model = torch.nn.ModuleDict({"embed": embed, "head": head}).to(torch.bfloat16).to("cuda")
        assert model["embed"].weight is model["head"].weight
        assert device.tracker.total == 100 * 8 * 2
