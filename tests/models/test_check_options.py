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
