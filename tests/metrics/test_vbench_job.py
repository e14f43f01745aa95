"""``jbkv_cli.metrics.vbench_job``: the ``vbench run`` request checked whole, then run (no Typer).

VBench itself is replaced by a stub where a test runs it (``run_variant``; the real one needs
its environment: ``test_vbench_env_e2e.py``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from jbkv_cli.metrics import vbench_job, vbench_run
from jbkv_cli.metrics.vbench_job import VBenchRequest, parse_dimensions, prepare, run_vbench
from jbkv_cli.metrics.vbench_scores import DimensionScore
from jbkv_cli.utils.errors import JbkvError, UsageError, WeightsNotFoundError


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """No VBench environment, no weights (every cache folder under an empty HOME)."""
    for var in ("VBENCH_CACHE_DIR", "TORCH_HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JBKV_VBENCH_ENV", str(tmp_path / "env"))
    return tmp_path


@pytest.fixture
def stub_env(monkeypatch):
    """A VBench environment that is 'there' (what the summary records of it)."""
    monkeypatch.setattr(
        vbench_job, "require_env", lambda root: SimpleNamespace(key="stub", info={})
    )


def _run(root: Path, variants=("bf16", "int2")) -> Path:
    for variant in variants:
        folder = root / "run" / "videos" / variant
        folder.mkdir(parents=True)
        for name in ("a cat-0.mp4", "a dog-0.mp4"):
            (folder / name).write_bytes(b"")
    return root / "run"


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def _refused(request: VBenchRequest, root: Path, error: type[Exception], match: str) -> None:
    before = _tree(root)
    with pytest.raises(error, match=match):
        prepare(request)
    assert _tree(root) == before, "a refused request created or changed files"


def test_a_request_without_the_environment_is_refused_before_anything_exists(home):
    run = _run(home)
    _refused(VBenchRequest(run), home, JbkvError, "jbkv vbench setup")


def test_missing_weights_are_refused_before_anything_exists(home, stub_env):
    run = _run(home)
    request = VBenchRequest(run, dimensions=("motion_smoothness",))
    _refused(request, home, WeightsNotFoundError, r"amt-s\.pth")
    skipping = VBenchRequest(run, dimensions=("motion_smoothness",), skip_missing=True)
    _refused(skipping, home, JbkvError, "no selected VBench dimension has its weights")


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"device": "tpu"}, UsageError, "--device must be one of auto, cpu, cuda"),
        ({"mode": "long"}, JbkvError, "unknown VBench mode"),
        ({"dimensions": ("sharpness",)}, JbkvError, "unknown VBench dimension"),
        ({"dimensions": ("color",)}, JbkvError, "standard prompts"),
        ({"static_filter": True}, JbkvError, "static filter needs"),
    ],
)
def test_bad_settings_are_refused_before_anything_exists(home, stub_env, changes, error, match):
    request = VBenchRequest(_run(home), dimensions=("temporal_flickering",))
    _refused(VBenchRequest(**{**request.__dict__, **changes}), home, error, match)


def test_a_folder_without_videos_is_refused_before_anything_exists(home, stub_env):
    empty = home / "empty"
    empty.mkdir()
    _refused(
        VBenchRequest(empty, dimensions=("temporal_flickering",)), home, JbkvError, "no videos"
    )


def test_skip_missing_leaves_out_the_dimensions_without_weights(home, stub_env):
    plan = prepare(
        VBenchRequest(
            _run(home), dimensions=("temporal_flickering,motion_smoothness",), skip_missing=True
        )
    )
    assert plan.skipped == ("motion_smoothness",)
    assert plan.config.dimensions == ("temporal_flickering",)


def test_dimensions_default_to_the_mode_and_expand_groups():
    assert parse_dimensions((), "long_custom_input") == vbench_run.CUSTOM_DIMENSIONS
    assert len(parse_dimensions((), "long_vbench_standard")) == 16
    assert parse_dimensions(("dynamic degree,custom",), "x")[0] == "dynamic_degree"


def _stub_vbench(monkeypatch, errors: dict[str, str]) -> None:
    """``run_variant`` without VBench: a score per dimension, or the given error per variant."""

    def fake(env, videos, work, config, on_event=None, force=False):
        result = vbench_run.VariantResult()
        for d in config.dimensions:
            on_event("start", {"dimension": d})
            if work.name in errors:
                result.errors[d] = errors[work.name]
                on_event("error", {"dimension": d, "message": errors[work.name]})
                continue
            result.dimensions[d] = DimensionScore(d, 0.9, {v.stem: 0.9 for v in videos}, 1)
            on_event("done", {"dimension": d})
        return result

    monkeypatch.setattr(vbench_run, "run_variant", fake)


def test_a_run_writes_the_summary_and_reports_each_dimension(home, stub_env, monkeypatch):
    _stub_vbench(monkeypatch, {})
    events = []
    request = VBenchRequest(_run(home), dimensions=("temporal_flickering",))
    outcome = run_vbench(request, lambda variant, kind, ev: events.append((variant, kind, ev)))
    assert outcome.summary_path == (request.path / "metrics" / "vbench.json").resolve()
    assert outcome.summary_path.is_file()
    assert sorted(outcome.doc["variants"]) == ["bf16", "int2"]
    assert outcome.failures() == {}
    outcome.check()  # nothing failed: no error
    assert {(v, k) for v, k, _ in events} == {
        (v, k) for v in ("bf16", "int2") for k in ("start", "done")
    }
    assert all(ev["total"] == 1 for _, _, ev in events)  # what each variant's bar counts to


def test_a_failed_dimension_is_written_then_one_error(home, stub_env, monkeypatch):
    _stub_vbench(monkeypatch, {"int2": "out of memory"})
    outcome = run_vbench(VBenchRequest(_run(home), dimensions=("temporal_flickering",)))
    assert outcome.summary_path.is_file()  # the summary holds what succeeded
    assert outcome.failures() == {"int2": {"temporal_flickering": "out of memory"}}
    with pytest.raises(JbkvError, match=r"VBench failed for int2: temporal_flickering \(logs"):
        outcome.check()
