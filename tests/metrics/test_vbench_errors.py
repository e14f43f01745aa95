"""Clear one-line errors: environment not set up, weights missing, no videos; env plumbing."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jbkv_cli.cli.commands.vbench import register
from jbkv_cli.metrics.vbench_env import (
    VBenchEnv,
    find_torch,
    locate_env,
    long_config_texts,
    plan_env,
    require_env,
)
from jbkv_cli.metrics.vbench_job import parse_dimensions
from jbkv_cli.metrics.vbench_run import VBenchConfig, discover_variants, num_samples
from jbkv_cli.metrics.vbench_weights import missing_weights, require_weights
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    for var in ("VBENCH_CACHE_DIR", "TORCH_HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JBKV_VBENCH_ENV", str(tmp_path / "env"))
    return tmp_path


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None: ...

    register(app)
    return app


def test_env_not_set_up(empty_home):
    assert locate_env() is None
    with pytest.raises(JbkvError, match=r"not set up .*jbkv vbench setup"):
        require_env()


def test_run_without_env_is_a_one_line_error(empty_home):
    videos = empty_home / "videos"
    videos.mkdir()
    res = CliRunner().invoke(_app(), ["vbench", "run", str(videos), "-d", "temporal_flickering"])
    assert isinstance(res.exception, JbkvError)
    assert "jbkv vbench setup" in str(res.exception)
    assert "\n" not in str(res.exception)


def test_broken_env_is_reported(empty_home):
    root = empty_home / "env"
    (root / "k1" / "torch-link").mkdir(parents=True)
    (root / "k1" / "torch-link" / "torch").symlink_to(empty_home / "gone")
    (root / "k1" / "env.json").write_text(json.dumps({"key": "k1"}))
    (root / "active.json").write_text(json.dumps({"key": "k1"}))
    env = locate_env()
    assert isinstance(env, VBenchEnv)
    assert any("missing" in p for p in env.problems())
    with pytest.raises(JbkvError, match="broken"):
        require_env()


def test_missing_weights_say_where(empty_home, monkeypatch):
    cache = empty_home / "vb"
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(cache))
    assert missing_weights(["temporal_flickering"]) == []
    require_weights(["temporal_flickering"])  # needs none
    with pytest.raises(WeightsNotFoundError) as e:
        require_weights(["dynamic_degree", "temporal_flickering"])
    msg = str(e.value)
    assert "dynamic_degree" in msg and "temporal_flickering" not in msg
    assert str(cache / "raft_model" / "models" / "raft-things.pth") in msg
    assert "\n" not in msg

    with pytest.raises(WeightsNotFoundError, match=r"raft-things\.pth"):
        require_weights(["temporal_flickering"], static_filter=True)  # RAFT for the filter

    (cache / "raft_model" / "models").mkdir(parents=True)
    (cache / "raft_model" / "models" / "raft-things.pth").write_bytes(b"x")
    require_weights(["dynamic_degree"])

    # long mode needs DINOv2 too; short mode only DINO
    long_paths = {m.path.name for m in missing_weights(["subject_consistency"], long_mode=True)}
    short_paths = {m.path.name for m in missing_weights(["subject_consistency"], long_mode=False)}
    assert "dinov2_vitb14_pretrain.pth" in long_paths - short_paths
    torch_home = empty_home / "home" / ".cache" / "torch" / "hub" / "checkpoints"
    assert all(
        m.path.parent in (torch_home, torch_home.parent)
        for m in missing_weights(["subject_consistency"])
    )


def test_cli_run_refuses_missing_weights(empty_home, monkeypatch):
    # a usable-looking env, so the weights check is what fails
    root = empty_home / "env"
    (root / "k1" / "venv" / "bin").mkdir(parents=True)
    (root / "k1" / "venv" / "bin" / "python").write_text("")
    (root / "k1" / "env.json").write_text(json.dumps({"key": "k1"}))
    (root / "active.json").write_text(json.dumps({"key": "k1"}))
    videos = empty_home / "videos"
    videos.mkdir()
    (videos / "a-0.mp4").write_bytes(b"")
    res = CliRunner().invoke(_app(), ["vbench", "run", str(videos), "-d", "motion_smoothness"])
    assert isinstance(res.exception, WeightsNotFoundError)
    assert "amt-s.pth" in str(res.exception)


def test_no_videos(tmp_path):
    with pytest.raises(JbkvError, match="no videos"):
        discover_variants(tmp_path)
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "a.mp4").write_bytes(b"")  # not <prompt>-<index>.mp4
    with pytest.raises(JbkvError, match="no videos"):
        discover_variants(tmp_path)


def test_discover_variants(tmp_path):
    run = tmp_path / "run"
    for variant in ("bf16", "int2"):
        d = run / "videos" / variant
        d.mkdir(parents=True)
        for name in ("a cat-0.mp4", "a cat-1.mp4", "a cat-0.lossless.mkv", "a cat-0.npz"):
            (d / name).write_bytes(b"")
    (run / "manifest.json").write_text("{}")
    v = discover_variants(run)
    assert list(v) == ["bf16", "int2"]
    assert [p.name for p in v["int2"]] == ["a cat-0.mp4", "a cat-1.mp4"]
    assert num_samples(v["bf16"]) == 2

    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "x-0.mp4").write_bytes(b"")
    assert list(discover_variants(flat)) == ["flat"]
    (flat / "bad_name-1.mp4").write_bytes(b"")
    with pytest.raises(JbkvError, match="must not contain '_'"):
        discover_variants(flat)


def test_config_validation():
    VBenchConfig(dimensions=("temporal_flickering",)).validate()
    with pytest.raises(JbkvError, match="standard prompts"):
        VBenchConfig(dimensions=("color",), mode="long_custom_input").validate()
    with pytest.raises(JbkvError, match="unknown VBench dimension"):
        VBenchConfig(dimensions=("sharpness",)).validate()
    with pytest.raises(JbkvError, match="unknown VBench mode"):
        VBenchConfig(mode="long").validate()
    assert parse_dimensions(
        ["temporal_flickering, dynamic degree", "temporal_flickering"], "x"
    ) == (
        "temporal_flickering",
        "dynamic_degree",
    )
    assert parse_dimensions(["custom"], "x") == parse_dimensions(None, "long_custom_input")
    assert len(parse_dimensions(None, "long_vbench_standard")) == 16
    assert "color" not in parse_dimensions(None, "long_custom_input")


def test_long_configs_are_yaml_with_float_keys():
    yaml = pytest.importorskip("yaml")
    texts = long_config_texts()
    assert set(texts) >= {
        "clip_length_mix.yaml",
        "slow_fast_params.yaml",
        "subject_mapping_table.yaml",
        "background_mapping_table.yaml",
    }
    lengths = yaml.safe_load(texts["clip_length_mix.yaml"])
    assert lengths["human_action"] == 10.0 and lengths["subject_consistency"] == 2.0
    assert sorted(k for k, v in lengths.items() if v == 10.0) == [
        "human_action",
        "overall_consistency",
        "temporal_style",
    ]
    table = yaml.safe_load(texts["subject_mapping_table.yaml"])
    assert len(table) == 101 and all(isinstance(k, float) for k in table)
    assert table[0.01] == pytest.approx(0.655812085783768) and table[1.0] == 1.0
    params = yaml.safe_load(texts["slow_fast_params.yaml"])
    assert params["w_inclip_sb"] == params["w_clip2clip_sb"] == 0.5
    assert params["inclip_std_bg"] == pytest.approx(0.02029563684589086)


def test_plan_reuses_this_torch():
    src = find_torch()
    if src is None:
        pytest.skip("no torch + torchvision in this interpreter")
    plan = plan_env()
    assert plan.torch is not None and plan.torch.torch == src.torch
    names = {n for n, _ in src.dists}
    assert {"torch", "torchvision"} <= names
    assert not names & {"numpy", "pillow", "transformers"}
    assert plan.key == plan_env().key
    assert plan_env(reuse_torch=False).key != plan.key


def test_runner_file_exists():
    from jbkv_cli.metrics.vbench_env import RUNNER

    assert Path(RUNNER).is_file()


def test_require_env_relinks_torch_of_same_versions(empty_home):
    src = find_torch()
    if src is None:
        pytest.skip("no torch + torchvision in this interpreter")
    root = empty_home / "env"
    env_dir = root / "k1"
    (env_dir / "venv" / "bin").mkdir(parents=True)
    (env_dir / "venv" / "bin" / "python").write_text("")
    (env_dir / "torch-link").mkdir()
    (env_dir / "torch-link" / "torch").symlink_to(empty_home / "old-checkout" / "torch")
    info = {"key": "k1", "torch": {"mode": "linked", **src.to_json(), "site": "/old"}}
    (env_dir / "env.json").write_text(json.dumps(info))
    (root / "active.json").write_text(json.dumps({"key": "k1"}))
    env = require_env()
    assert env.problems() == []
    links = list((env_dir / "torch-link").iterdir())
    assert {p.name for p in links} >= {"torch", "torchvision"}
    assert all(p.resolve().is_relative_to(src.site) for p in links)
    assert json.loads((env_dir / "env.json").read_text())["torch"]["site"] == str(src.site)
