"""VBench issue #186: which clip length VBench-Long scores imaging and aesthetic quality on, and
what jbkv passes to it (no VBench, no weights: the rule, and the runner with stand-in modules)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from dataclasses import asdict

import pytest

from jbkv_cli.metrics.vbench_clips import clip_lengths, clip_record, clip_seconds
from jbkv_cli.metrics.vbench_env import RUNNER
from jbkv_cli.metrics.vbench_run import VBenchConfig

QUALITY = ["aesthetic_quality", "imaging_quality", "overall_consistency"]  # one full_info entry


def test_standard_mode_scores_imaging_and_aesthetic_on_10_second_clips():
    lengths = clip_lengths()
    assert lengths["imaging_quality"] == lengths["aesthetic_quality"] == 2.0  # the YAML's value
    assert clip_seconds("long_vbench_standard", QUALITY, lengths) == 10.0  # the largest wins
    assert clip_seconds("long_vbench_standard", ["imaging_quality"], lengths) == 2.0
    assert clip_seconds("long_custom_input", QUALITY, lengths) == 2.0  # fixed in custom mode
    assert clip_seconds("custom_input", QUALITY, lengths) is None  # short modes do not split


def test_vbench_json_records_the_clip_length_of_each_dimension():
    dims = ["imaging_quality", "aesthetic_quality", "subject_consistency", "human_action"]
    standard = clip_record("long_vbench_standard", dims)["dimensions"]
    assert standard == {
        "imaging_quality": [10.0],
        "aesthetic_quality": [10.0],
        "subject_consistency": [2.0],
        "human_action": [10.0],
    }
    custom = clip_record("long_custom_input", dims[:3])["dimensions"]
    assert custom == {d: [2.0] for d in dims[:3]}
    assert clip_record("long_vbench_standard", dims, "no_such.yaml")["dimensions"] == {}


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """vbench_runner.py loaded by path, with stand-ins for vbench and vbench2_beta_long that
    record what ``VBenchLong.evaluate`` is called with."""
    calls = []
    (tmp_path / "vbench").mkdir()
    entry = {"prompt_en": "a cat", "dimension": QUALITY}
    (tmp_path / "vbench" / "VBench_full_info.json").write_text(json.dumps([entry]))
    vbench = types.ModuleType("vbench")
    vbench.__file__ = str(tmp_path / "vbench" / "__init__.py")
    vbench.VBench = object
    utils = types.ModuleType("vbench.utils")
    utils.save_json = lambda data, path: None
    long = types.ModuleType("vbench2_beta_long")
    long.__file__ = str(tmp_path / "vbench2_beta_long" / "__init__.py")

    class VBenchLong:
        def __init__(self, device, full_info, out):
            self.full_info_dir = full_info

        def evaluate(self, **kwargs):
            calls.append(kwargs)

    long.VBenchLong = VBenchLong
    for name, module in (("vbench", vbench), ("vbench.utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "vbench2_beta_long", long)
    spec = importlib.util.spec_from_file_location("jbkv_vbench_runner", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "a cat-0.mp4").write_bytes(b"")
    return module, calls, videos


@pytest.mark.parametrize("mode", ["long_vbench_standard", "long_custom_input"])
def test_the_runner_passes_the_mode_and_the_mix_clip_lengths(runner, tmp_path, mode):
    module, calls, videos = runner
    config = VBenchConfig(dimensions=("imaging_quality",), mode=mode, device="cpu")
    request = {**asdict(config), "videos_path": str(videos), "output_path": str(tmp_path / "o")}
    assert module.evaluate(request) == 0
    (call,) = calls
    assert call["mode"] == mode and call["dimension_list"] == ["imaging_quality"]
    assert call["clip_length_config"] == "clip_length_mix.yaml"
