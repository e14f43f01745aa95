"""The model contract (``jbkv_cli/models/contract.py``) on every registered model: its entry's
hooks (options, prompts, cases, input paths) and the adapter its tiny config builds (resolve a
spec, head layout and profiling where prunable, a per-case plan where it plans, one short
generate). The models come from the registry, so a model registered without its members, or
without a tiny config here, fails."""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from PIL import Image

from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models import registry
from jbkv_cli.models.base import Video
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import (
    CasePlanner,
    ModelEntry,
    PrunableModel,
    VideoModel,
    VideoModelBase,
    any_prompt,
    resolve_spec,
)
from jbkv_cli.prune.profile import FrameMassProbe
from jbkv_cli.utils.errors import UsageError

PROMPT = "a red circle moves right on a dark background"  # in the tiny model's grammar


def text(folder: Path, chunks: int) -> Case:
    return Case(PROMPT)


def image(folder: Path, chunks: int) -> Case:
    """An image and the default trajectory (HY-WorldPlay)."""
    Image.new("RGB", (24, 16), (200, 40, 90)).save(folder / "1.png")
    return Case("a red room", str(folder / "1.png"))


def actions(folder: Path, chunks: int) -> Case:
    """An image and a random actions file of the video's frames (Matrix-Game-2.0: chunks of 3
    latent frames, 4 frames a latent but the first)."""
    from jbkv_cli.models.wan.matrix_game.actions import write_actions

    frames = 4 * (3 * chunks - 1) + 1
    g = torch.Generator().manual_seed(0)
    keys = (torch.rand(frames, 4, generator=g) > 0.5).float().tolist()
    mouse = ((torch.rand(frames, 2, generator=g) - 0.5) * 0.2).tolist()
    write_actions(folder / "a.json", keys, mouse)
    Image.new("RGB", (48, 32), (200, 40, 90)).save(folder / "1.png")
    return Case("a red room", str(folder / "1.png"), str(folder / "a.json"), "c1")


@dataclass(frozen=True)
class Tiny:
    """How this test runs a model: the options of a config that builds and generates on a CPU
    in seconds (two chunks: profiling needs a cached one), the case it generates, what it is
    (prunable, a case planner), a prompt it refuses (None: it reads any prompt)."""

    options: dict = field(default_factory=lambda: {"config": "tiny-random"})
    case: Callable[[Path, int], Case] = text
    prunable: bool = True
    plans: bool = False
    bad_prompt: str | None = None

    @property
    def settings(self) -> dict:
        return {**self.options, "num_chunks": 2, "device": "cpu"}


TINY: dict[str, Tiny] = {
    "tiny": Tiny({"steps": 1}, bad_prompt="a purple dragon flies over the sea"),
    "magi1": Tiny(),
    "skyreels-v2": Tiny({"config": "tiny-random", "steps": 1}),
    "self-forcing": Tiny({"config": "tiny-random", "steps": 1}),
    "rolling-forcing": Tiny(),
    # re-selects its memory every chunk: no frame history for Forcing-KV to keep
    "hy-worldplay": Tiny(case=image, prunable=False, plans=True),
    "matrix-game-2": Tiny(case=actions),
}


def test_every_registered_model_has_a_tiny_config_here():
    assert set(TINY) == set(registry.MODELS), "add the model's tiny config to TINY"


@pytest.fixture(scope="module", params=sorted(registry.MODELS))
def name(request) -> str:
    assert request.param in TINY, f"{request.param}: add its tiny config to TINY"
    return request.param


@pytest.fixture(scope="module")
def case(name, tmp_path_factory) -> Case:
    return TINY[name].case(tmp_path_factory.mktemp(name), 2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: threads only add contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(name) -> VideoModel:
    return registry.load_model(name, **TINY[name].settings)


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert message and "\n" not in message, message
    return message


def test_the_entry_checks_options(name):
    entry, options = registry.entry(name), TINY[name].settings
    assert isinstance(entry, ModelEntry)
    registry.check_options(name, **options)
    with pytest.raises(UsageError) as unknown:
        registry.check_options(name, **options, no_such_option=1)
    assert "no_such_option" in one_line(unknown)
    with pytest.raises(UsageError) as bad:
        registry.check_options(name, **{**options, "num_chunks": 0})
    assert "num_chunks" in one_line(bad)


def test_the_entry_locates_what_the_tiny_config_reads(name):
    """Files shipped with jbkv at most (the tiny model's weights): none to download."""
    found = registry.input_paths(name, **TINY[name].settings)
    assert all(isinstance(p, Path) and p.is_file() for p in found.values()), found


def test_the_entry_checks_prompts_and_cases(name, case):
    tiny, entry = TINY[name], registry.entry(name)
    registry.check_prompts(name, [case.prompt])
    registry.check_cases(name, [case], **tiny.settings)
    assert (entry.check_prompt is any_prompt) == (tiny.bad_prompt is None)
    if tiny.bad_prompt is not None:
        with pytest.raises(UsageError):
            registry.check_prompts(name, [case.prompt, tiny.bad_prompt])
        with pytest.raises(UsageError):
            registry.check_cases(name, [case, Case(tiny.bad_prompt)], **tiny.settings)
    missing = Case(case.prompt, str(Path(case.image or "x.png").with_name("missing.png")))
    with pytest.raises(UsageError) as refused:
        registry.check_cases(name, [case, missing], **tiny.settings)
    one_line(refused)


def test_the_adapter_states_the_required_members(name, model):
    assert isinstance(model, VideoModel) and isinstance(model, VideoModelBase)
    assert model.name == name
    assert json.loads(json.dumps(model.settings)) == model.settings
    # what `jbkv generate` checks a method against (it fits the head dim, pruning can drop
    # its tokens): a model that does not say would run a variant that fails mid-run
    assert isinstance(model.settings.get("head_dim"), int), model.settings
    assert isinstance(model.pre_rope, bool) and isinstance(model.profiles_cases, bool)


def test_the_adapter_resolves_specs_and_refuses_pre_rope_keys_it_cannot_cache(model):
    int2 = resolve_spec(model, KVSpec.build("rtn", 2, 32))
    assert isinstance(int2, KVSpec) and int2.key.bits == 2
    assert resolve_spec(model, int2) == int2  # resolving twice changes nothing
    pre = KVSpec.build("qvg", 2, 64, layout="pre-rope")
    if model.pre_rope:
        assert resolve_spec(model, pre).key_layout == "pre-rope"
    else:
        with pytest.raises(UsageError, match="cannot cache keys before RoPE"):
            resolve_spec(model, pre)


def test_a_prunable_adapter_profiles_every_layer_it_states(name, model, case):
    assert isinstance(model, PrunableModel) == TINY[name].prunable
    if not isinstance(model, PrunableModel):
        assert not hasattr(model, "head_layout") and not hasattr(model, "profile_heads")
        return
    layout = model.head_layout()
    assert all(type(layout[k]) is int and layout[k] > 0 for k in layout), layout
    probe = FrameMassProbe(layout["frame_tokens"])
    model.profile_heads(case if model.profiles_cases else case.prompt, 0, probe)
    assert probe.samples == [(case.name, 0)]
    assert {r.layer for r in probe.records} == set(range(layout["layers"]))
    for record in probe.records:
        assert record.current.shape[0] % layout["kv_heads"] == 0  # query heads over KV heads
        assert torch.all(record.current >= 0) and torch.all(record.current <= 1 + 1e-5)


def test_a_case_planner_plans_each_case_the_same(name, model, case):
    assert isinstance(model, CasePlanner) == TINY[name].plans
    if isinstance(model, CasePlanner):
        plan = model.plan_case(case)
        assert json.loads(json.dumps(plan)) == plan
        assert model.plan_case(case) == plan


def test_the_adapter_generates_a_short_video(model, case):
    """Two chunks with the full-precision cache, the case planned as a run plans it."""
    from jbkv_cli.run.experiment import with_plans

    calls: list[tuple[int, int]] = []
    (planned,) = with_plans(model, [case])
    video = model.generate(planned, 0, FULL_PRECISION, progress=lambda d, t: calls.append((d, t)))
    assert isinstance(video, Video) and video.frames.shape[0] > 0 and video.fps > 0
    assert video.kv_cache_bytes > 0
    # what the progress bar relies on (Rolling Forcing repeats the count while its window
    # slides past the last chunk): counts rise to the two chunks, the total is constant
    assert calls and {t for _, t in calls} == {2} and calls[-1] == (2, 2), calls
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[0][0] >= 1, calls


def test_a_module_without_an_entry_is_a_registration_error(monkeypatch):
    module = types.ModuleType("jbkv_test_no_entry")
    module.load_model = lambda **options: None  # the old convention: not an entry
    monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    monkeypatch.setitem(registry.MODELS, "no-entry", module.__name__)
    with pytest.raises(TypeError, match="ENTRY must be a ModelEntry"):
        registry.load_model("no-entry")
    with pytest.raises(TypeError):  # the required hooks
        ModelEntry(load_model=module.load_model)  # type: ignore[call-arg]


def test_the_optional_members_default_in_the_base():
    class Minimal(VideoModelBase):
        name = "magi1"

    kv = KVSpec.build("qvg", 2, 64)
    assert Minimal().resolve_kv(kv) == kv.for_model("magi1")
    assert (Minimal.pre_rope, Minimal.profiles_cases) == (False, False)
