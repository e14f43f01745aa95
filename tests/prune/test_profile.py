"""Head profiling: frame-level attention mass, classes, the JSON round trip and its errors."""

import json

import pytest
import torch

from jbkv_cli.attention import CachedKV
from jbkv_cli.prune import ForcingKV, ProfileError, load_profile
from jbkv_cli.prune.profile import (
    FORMAT,
    FrameMassProbe,
    _Record,
    default_profile_path,
    frame_mass,
    parse_profile,
    profile_document,
    summarize,
)

T = 4


def test_frame_mass_is_softmax_mass_per_frame():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k_cached, k_cur = torch.randn(1, 1, 3 * T, 8, generator=g), torch.randn(1, 1, T, 8, generator=g)
    cur, frames = frame_mass(q, k_cached, k_cur, 0.3, T, block=2)
    p = (0.3 * q @ torch.cat([k_cached, k_cur], -2).transpose(-1, -2)).softmax(-1)
    assert torch.allclose(frames, p[..., : 3 * T].unflatten(-1, (3, T)).sum(-1).mean(-2))
    assert torch.allclose(cur, p[..., 3 * T :].sum(-1).mean(-1))
    assert torch.allclose(cur + frames.sum(-1), torch.ones(1, 2))


def _probe() -> FrameMassProbe:
    """Two samples x one layer x two heads, two denoising steps: head 0 attends to the current
    chunk and the newest cached frame, head 1 to the oldest."""
    probe = FrameMassProbe(T)
    current = torch.tensor([0.5, 0.1])
    recent = torch.tensor([[0.4, 0.05, 0.05], [0.1, 0.1, 0.7]])  # most recent frame first
    for sample in ("a", "b"):
        probe.begin_sample(sample, 0)
        for step in (0, 1):
            probe.records.append(_Record(len(probe.samples) - 1, 0, 1, step, current, recent))
    return probe


def test_classes_stability_and_round_trip(tmp_path):
    probe = _probe()
    measured = summarize(probe, layers=1, kv_heads=2, anchor_frames=1, threshold=0.75)
    assert measured["layers"][0]["heads"] == ["static", "dynamic"]
    assert measured["layers"][0]["local_mass"] == [0.9, 0.2]
    assert measured["stability"]["samples"] == {"groups": 2, "agreement": 1.0, "worst": 1.0}
    assert measured["stability"]["steps"]["agreement"] == 1.0
    doc = profile_document("tiny", {"steps": 2}, probe, measured, "jbkv profile-heads ...")
    path = tmp_path / "heads.json"
    path.write_text(json.dumps(doc))
    profile = load_profile(path)
    assert profile.heads == (("static", "dynamic"),) and profile.anchor_frames == 1
    assert doc["samples"] == [{"prompt": "a", "seed": 0}, {"prompt": "b", "seed": 0}]
    # a wider anchor counts the older frames as local too
    wide = summarize(probe, 1, 2, anchor_frames=3, threshold=0.75)
    assert wide["layers"][0]["heads"] == ["static", "static"]


def test_probe_measures_through_the_cache_wrapper():
    class Cache:
        def __init__(self):
            self.view = CachedKV(torch.randn(1, 2, 2 * T, 8), torch.randn(1, 2, 2 * T, 8))

        def read(self, last=None):
            return self.view

        def attend(self, q, k, v, scale, last=None, backend=None):
            return q

    probe = FrameMassProbe(T)
    probe.begin_sample("p", 0)
    [layer] = probe.wrap([Cache()])
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, T, 8)
    probe.at(0, None)
    layer.attend(q, k, k, 0.1)  # not a denoising step: not measured
    probe.at(0, 2)
    layer.attend(q, k, k, 0.1)
    [record] = probe.records
    assert record.step == 2 and record.recent.shape == (2, 2)
    _, frames = frame_mass(q, layer.view.k, k, 0.1, T)
    assert torch.allclose(record.recent, frames[0].flip(-1))


def _write(tmp_path, doc) -> str:
    path = tmp_path / "p.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


GOOD = {
    "format": FORMAT,
    "model": "tiny",
    "anchor_frames": 1,
    "threshold": 0.75,
    "layers": [{"heads": ["static", "dynamic"]}],
}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "invalid JSON"),
        ([], "not a JSON object"),
        ({**GOOD, "format": "other"}, "'format'"),
        ({**GOOD, "model": 3}, "'model'"),
        ({**GOOD, "anchor_frames": 0}, "'anchor_frames'"),
        ({**GOOD, "threshold": "high"}, "'threshold'"),
        ({**GOOD, "layers": []}, "'layers'"),
        ({**GOOD, "layers": [{"heads": ["static", "fast"]}]}, "static/dynamic"),
        ({**GOOD, "layers": [{"heads": ["static"]}, {"heads": ["static", "static"]}]}, "layer 1"),
    ],
)
def test_validation_errors_name_the_file(tmp_path, doc, message):
    path = _write(tmp_path, doc)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(info.value).startswith(path) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match=message):
        ForcingKV(profile=path)  # validated when the pruner is built, before any work


def test_missing_file_and_wrong_model(tmp_path):
    with pytest.raises(ProfileError, match=r"missing\.json"):
        load_profile(tmp_path / "missing.json")
    path = _write(tmp_path, {**GOOD, "model": "magi1"})
    with pytest.raises(ValueError, match="profiles model 'magi1'"):
        ForcingKV(profile=path).check("tiny")
    with pytest.raises(ValueError, match="has 1 layers x 2 heads"):
        ForcingKV(profile=_write(tmp_path, GOOD)).plans("tiny", 4, 2, 64)
    with pytest.raises(ValueError, match="no head profile for model 'nosuch'"):
        ForcingKV().check("nosuch")


def test_shipped_profile_of_the_embedded_model():
    doc = json.loads(default_profile_path("tiny").read_text())
    profile = parse_profile(doc)
    assert profile.model == "tiny" and profile.layers == 4 and len(profile.heads[0]) == 2
    assert doc["command"].startswith("jbkv profile-heads --model tiny")
    assert set(profile.counts()) == {"static", "dynamic"} and all(profile.counts().values())
    assert len(ForcingKV().plans("tiny", 4, 2, 64)) == 4


def test_a_profile_given_by_path_is_recorded_by_digest(tmp_path):
    from jbkv_cli.kvcache import KVSpec

    path = tmp_path / "heads.json"
    path.write_text(json.dumps(GOOD))
    spec = KVSpec(pruner=ForcingKV(profile=str(path)))
    stored = spec.to_dict()
    assert stored["pruner"]["profile"] == str(path.resolve())
    assert spec.variant_id == "fkv-p" + stored["pruner"]["profile_sha256"][:8]
    path.unlink()  # a run folder is read back without the file
    assert KVSpec.from_dict(stored) == spec
