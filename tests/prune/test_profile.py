"""Head profiling: frame-level attention mass, classes, the JSON round trip and its errors."""

import json

import pytest
import torch

from jbkv_cli.attention import CachedKV
from jbkv_cli.prune import ForcingKV, ForcingKVHistory, ProfileError, load_profile
from jbkv_cli.prune.profile import (
    FORMAT,
    FrameMassProbe,
    Rule,
    _Record,
    default_profile_path,
    frame_mass,
    last_frames_mass,
    parse_profile,
    profile_document,
    summarize,
)

T = 4


def test_frame_mass_is_softmax_mass_per_frame():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k_cached = torch.randn(1, 1, 3 * T, 8, generator=g)
    k_cur = torch.randn(1, 1, 2 * T, 8, generator=g)  # a current chunk of 2 frames
    cur, frames = frame_mass(q, k_cached, k_cur, 0.3, T, block=2)
    p = (0.3 * q @ torch.cat([k_cached, k_cur], -2).transpose(-1, -2)).softmax(-1)
    per_frame = p.unflatten(-1, (5, T)).sum(-1).mean(-2)
    assert torch.allclose(frames, per_frame[..., :3]) and torch.allclose(cur, per_frame[..., 3:])
    assert torch.allclose(cur.sum(-1) + frames.sum(-1), torch.ones(1, 2))


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
    measured = summarize(probe, 1, 2, Rule("local-mass", 0.75, anchor_frames=1))
    assert measured["layers"][0]["heads"] == ["static", "dynamic"]
    assert measured["layers"][0]["score"] == [0.9, 0.2]
    assert measured["stability"]["samples"] == {"groups": 2, "agreement": 1.0, "worst": 1.0}
    assert measured["stability"]["steps"]["agreement"] == 1.0
    doc = profile_document("tiny", {"steps": 2}, probe, measured, "jbkv profile-heads ...")
    path = tmp_path / "heads.json"
    path.write_text(json.dumps(doc))
    profile = load_profile(path)
    assert profile.heads == (("static", "dynamic"),) and profile.anchor_frames == 1
    assert profile.rule == "local-mass"
    assert doc["samples"] == [{"prompt": "a", "seed": 0}, {"prompt": "b", "seed": 0}]
    # a wider anchor counts the older frames as local too
    wide = summarize(probe, 1, 2, Rule("local-mass", 0.75, anchor_frames=3))
    assert wide["layers"][0]["heads"] == ["static", "static"]
    # upstream's rule on the same reads: key frames (oldest first) 0.05 0.05 0.4 | 0.5 and
    # 0.7 0.1 0.1 | 0.1; head 0: 0.95 / 0.95 of the mass after the sink; head 1: 0.3 / 0.3
    # (4 key frames: the last 4 are all of them, sink included, as upstream's min(4, n))
    upstream = summarize(probe, 1, 2)
    assert upstream["rule"] == "forcing-kv" and upstream["threshold"] == 0.8
    assert upstream["layers"][0]["score"] == [1.0526, 3.3333]
    doc = profile_document("tiny", {}, probe, upstream, "jbkv profile-heads ...")
    path.write_text(json.dumps(doc))
    profile = load_profile(path)
    assert profile.rule == "forcing-kv" and profile.anchor_frames is None


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


def _record(masses: list, current_frames: int = 3) -> _Record:
    """One read whose key frames (oldest first, the last ``current_frames`` the current chunk)
    hold ``masses``: one list for one head, or a list per head."""
    x = torch.tensor(masses if isinstance(masses[0], list) else [masses])
    cur = x[:, -current_frames:]
    return _Record(0, 0, 1, 0, cur.sum(-1), x[:, :-current_frames].flip(-1), cur)


def test_upstream_rule_last_four_key_frames_over_the_mass_after_the_sink():
    """head_profile.py: score = mass(last 4 key frames) / mass(key frames after the first);
    static iff >= 0.8. Here 6 key frames: the sink, 2 older frames, then Self-Forcing's chunk."""
    sink_heavy = _record([0.6, 0.04, 0.04, 0.1, 0.1, 0.12])  # 0.36 / 0.40 = 0.9
    num, den = last_frames_mass(sink_heavy)
    torch.testing.assert_close((num / den), torch.tensor([0.9]))  # the sink left out
    # with the sink in the denominator (jbkv's local-mass share) it would be 0.36 < 0.8
    edge = _record([0.5, 0.1, 0.0, 0.1, 0.1, 0.2])  # exactly 0.4 / 0.5 = 0.8: static
    below = _record([0.2, 0.2, 0.1, 0.2, 0.1, 0.2])  # 0.6 / 0.8 = 0.75: dynamic
    probe = FrameMassProbe(T)
    probe.begin_sample("p", 0)
    for layer, r in enumerate((sink_heavy, edge, below)):
        r.layer = layer
        probe.records.append(r)
    measured = summarize(probe, 3, 1)
    assert [layer["heads"] for layer in measured["layers"]] == [["static"], ["static"], ["dynamic"]]
    # pooled over reads: Σ numerators / Σ denominators (0.7 / 1.2), not a mean of ratios (0.75)
    reads = [_record([0.0, 0.5, 0.1, 0.1, 0.1, 0.2]), _record([0.8, 0.0, 0.05, 0.05, 0.05, 0.05])]
    pooled = summarize(_probe_of(reads), 1, 1)
    assert pooled["layers"][0]["score"] == [round(0.7 / 1.2, 4)]
    # fewer key frames than the skip: the read is left out, as upstream refuses it
    assert last_frames_mass(_record([1.0], current_frames=1)) is None
    assert last_frames_mass(_record([0.5, 0.5], current_frames=1), last=1, skip=1) is not None


def test_upstream_rule_per_kv_head_is_the_mean_over_its_query_heads():
    # two query heads of one KV head: 0.5 / 1.0 and 0.2 / 0.2 -> (0.5 + 1.0) / 2
    r = _record([[0.0, 0.5, 0.1, 0.1, 0.1, 0.2], [0.8, 0.0, 0.05, 0.05, 0.05, 0.05]])
    measured = summarize(_probe_of([r]), layers=1, kv_heads=1)
    assert measured["layers"][0]["score"] == [0.75]


def _probe_of(records: list[_Record]) -> FrameMassProbe:
    probe = FrameMassProbe(T)
    probe.begin_sample("p", 0)
    probe.records.extend(records)
    return probe


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
        ({**GOOD, "rule": "snap"}, "'rule'"),
        ({**GOOD, "rule": "local-mass", "anchor_frames": None}, "'anchor_frames'"),
        ({**GOOD, "rule": "forcing-kv", "anchor_frames": 1.5}, "'anchor_frames'"),
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
    for pruner in (ForcingKV, ForcingKVHistory):
        with pytest.raises(ValueError, match=message):
            pruner(profile=path)  # validated when the pruner is built, before any work


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


def test_shipped_profiles_of_the_embedded_model():
    doc = json.loads(default_profile_path("tiny").read_text())  # forcing-kv-history's
    profile = parse_profile(doc)
    assert profile.model == "tiny" and profile.layers == 4 and len(profile.heads[0]) == 2
    assert doc["command"].startswith("jbkv profile-heads --model tiny")
    assert profile.rule == "local-mass" and profile.anchor_frames == 4
    assert set(profile.counts()) == {"static", "dynamic"} and all(profile.counts().values())
    assert len(ForcingKVHistory().plans("tiny", 4, 2, 64)) == 4
    doc = json.loads(default_profile_path("tiny", "forcing-kv").read_text())  # forcing-kv's
    profile = parse_profile(doc)
    assert (profile.rule, profile.threshold, doc["last_frames"], doc["skip_frames"]) == (
        "forcing-kv",
        0.8,
        4,
        1,
    )
    assert doc["command"].startswith("jbkv profile-heads --model tiny --rule forcing-kv")
    assert profile.layers == 4 and len(ForcingKV().plans("tiny", 4, 2, 64)) == 4


def test_a_profile_given_by_path_is_recorded_by_digest(tmp_path):
    from jbkv_cli.kvcache import KVSpec

    path = tmp_path / "heads.json"
    path.write_text(json.dumps(GOOD))
    specs = [KVSpec(pruner=p(profile=str(path))) for p in (ForcingKV, ForcingKVHistory)]
    stored = [spec.to_dict() for spec in specs]
    assert {s["pruner"]["profile"] for s in stored} == {str(path.resolve())}
    digest = stored[0]["pruner"]["profile_sha256"][:8]
    assert [s.variant_id for s in specs] == [f"forcingkv-p{digest}", f"fkv-p{digest}"]
    path.unlink()  # a run folder is read back without the file
    assert [KVSpec.from_dict(s) for s in stored] == specs
