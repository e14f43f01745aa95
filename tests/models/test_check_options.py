"""Every model's ``check_options`` refuses what its ``load_model`` refuses, with the same
message, without building anything; ``quantize-eval`` checks every model before the first runs."""

from __future__ import annotations

import pytest

from jbkv_cli.models import registry
from jbkv_cli.utils.errors import JbkvError
from tests.installed import run_jbkv

REFUSED = [
    ("tiny", {"steps": 0}),
    ("tiny", {"config": "x"}),
    ("tiny", {"weights": "/nonexistent/tiny.safetensors"}),
    ("magi1", {"config": "nope"}),
    ("magi1", {"config": "tiny-random", "num_chunks": 0}),
    ("magi1", {"weights": "/nonexistent"}),
    ("skyreels-v2", {"config": "tiny-random", "steps": 0}),
    ("skyreels-v2", {"config": "tiny-random", "weights": "w"}),
    ("skyreels-v2", {"weights": "/nonexistent"}),
    ("self-forcing", {"config": "nope"}),
    ("self-forcing", {"config": "tiny-random", "height": 20}),
    ("self-forcing", {"weights": "/nonexistent"}),
    ("self-forcing", {"config": "tiny-random", "precision": "half"}),
    ("rolling-forcing", {"config": "tiny-random", "precision": "half"}),
    ("matrix-game-2", {"config": "tiny-random", "precision": "half"}),
    ("hy-worldplay", {"config": "tiny-random", "precision": "half"}),
]


@pytest.mark.parametrize("name,options", REFUSED, ids=[f"{n}-{o}" for n, o in REFUSED])
def test_check_options_refuses_what_load_model_refuses(name, options, monkeypatch):
    monkeypatch.delenv("JBKV_MAGI1_DIR", raising=False)
    with pytest.raises(JbkvError) as checked:
        registry.check_options(name, **options)
    with pytest.raises(JbkvError) as loaded:
        registry.load_model(name, **options)
    assert str(checked.value) == str(loaded.value)


@pytest.mark.parametrize("name", ["tiny", "magi1", "skyreels-v2", "self-forcing"])
def test_check_options_accepts_what_builds(name):
    options = {} if name == "tiny" else {"config": "tiny-random"}
    registry.check_options(name, **options)


@pytest.mark.slow
def test_quantize_eval_checks_every_model_before_the_first_runs(tmp_path):
    """The second model's bad option is refused before the first model generates anything."""
    args = ["quantize-eval", "-m", "tiny", "-m", "self-forcing"]
    args += ["-o", "self-forcing.config=tiny-random", "-o", "self-forcing.steps=0"]
    args += ["--prompt", "a red circle moves right on a dark background", "--out", "o"]
    r = run_jbkv(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "error: self-forcing: steps must be an integer in 1..1000, got '0'"
    ]
    assert list(tmp_path.iterdir()) == []


def test_horizon_options_sit_under_the_users():
    """``--horizon`` runs the tiny model on its long-rollout weights unless weights are given;
    a model without horizon options keeps the user's exactly."""
    from jbkv_cli.models.tiny.weights_io import LONG_WEIGHTS

    assert registry.horizon_options("tiny", {"device": "cpu"}) == {
        "weights": str(LONG_WEIGHTS),
        "device": "cpu",
    }
    assert registry.horizon_options("tiny", {"weights": "w"}) == {"weights": "w"}
    assert registry.horizon_options("self-forcing", {"steps": "2"}) == {"steps": "2"}
    registry.check_options("tiny", **registry.horizon_options("tiny", {}))  # the file ships


def test_horizon_with_weights_given_reads_those(tmp_path):
    """Through the installed jbkv: the user's --weights win over the preset's."""
    missing = tmp_path / "mine.safetensors"
    r = run_jbkv("quantize-eval", "--horizon", "--weights", missing, "--out", "o", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"error: tiny model weights not found at {missing}")
    assert not (tmp_path / "o").exists()
