"""The model contract in one place: what a model adapter is, and what its module registers.

A model is two things (how to add one: ``docs/library.md``, "Add a model"):

- an **adapter object**, what ``load_model`` returns: a :class:`VideoModel`; optionally also a
  :class:`PrunableModel` (pruners and ``jbkv profile-heads`` run on it) and a
  :class:`CasePlanner` (a per-case plan kept in the run's manifest). Every adapter class
  subclasses :class:`VideoModelBase`, which holds the defaults of the optional members;
- a **registry entry**, the :class:`ModelEntry` its module exports as ``ENTRY``
  (:data:`jbkv_cli.models.registry.MODELS` names the module): the factory and the checks
  commands run before anything is created.

No member is probed for with a fallback: a capability is a protocol that ``isinstance``
checks; every other optional member has its default in :class:`VideoModelBase` or
:class:`ModelEntry`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache.layers import HeadLayout
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.base import ProgressFn, Video
from jbkv_cli.models.cases import Case
from jbkv_cli.utils.errors import UsageError

if TYPE_CHECKING:
    import torch

    from jbkv_cli.prune.profile import FrameMassProbe

# --------------------------------------------------------------------------- the adapter object

PromptCheck = Callable[[Case, "torch.Tensor"], list[bool]]
"""A model's per-chunk prompt check (:attr:`VideoModel.follows_prompt`)."""


@runtime_checkable
class VideoModel(Protocol):
    """A chunk-wise AR video model behind jbkv's KV cache.

    Required (the adapter states them): ``name``, the registered name; ``settings``, the
    generation settings it was built with (num_chunks, steps, window, size, dtype, ...: plain
    JSON-able values, recorded in the run manifest so a run folder knows exactly what produced
    it; commands also read ``head_dim``, ``num_chunks``, ``chunk_frames``, ``commit_frames``,
    ``window`` and ``tokens_per_chunk`` when present); :meth:`generate`.

    Optional (defaults in :class:`VideoModelBase`): ``pre_rope``, :meth:`resolve_kv`,
    ``follows_prompt`` and ``follows_prompt_version``.
    """

    name: str
    settings: dict[str, Any]
    pre_rope: bool
    """Whether its caches can hold keys before RoPE (``layout=pre-rope``); default False."""

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it: each method's options left to the model filled in
        (QuantVideoGen's cache policy and K rule, :mod:`jbkv_cli.quant.qvg_policy`). Default:
        :meth:`KVSpec.for_model` by name, the chunk size unknown."""
        ...

    follows_prompt: PromptCheck | None
    """``follows_prompt(case, frames)``: per chunk of ``frames`` (uint8 ``[T, H, W, 3]``, a video
    this model made of ``case``), does the chunk still do what the case asks? A check on the
    video alone, no reference, so it stays meaningful after the video has diverged from its
    reference (the report's long-horizon section, ``docs/report.md``). Default None: the model
    has no such check."""
    follows_prompt_version: int
    """Which definition of ``follows_prompt`` (:class:`VideoModelBase`); default 1."""

    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """Generate one video of ``case`` (:class:`~jbkv_cli.models.cases.Case`; a string is a
        prompt-only case). Same (case, seed, settings) => same initial noise for any ``kv``.

        A text-only model reads ``text_case(case, self.name).prompt``
        (:func:`~jbkv_cli.models.base.text_case` refuses an image or a trajectory).
        ``observer`` (diagnostics) is handed to every layer's cache; ``progress`` is called after
        each finished chunk."""
        ...


class VideoModelBase:
    """The base of every adapter class: the defaults of :class:`VideoModel`'s and
    :class:`PrunableModel`'s optional members. An adapter overrides what it has."""

    name: str
    settings: dict[str, Any]
    pre_rope: bool = False
    profiles_cases: bool = False
    follows_prompt: PromptCheck | None = None
    follows_prompt_version: int = 1
    """The definition of ``follows_prompt``, raised when it changes: a run's stored checks of
    another version are made again, so one report never mixes two definitions."""

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """:meth:`KVSpec.for_model` by name (an adapter that knows its chunk size passes it)."""
        return kv.for_model(self.name)


@runtime_checkable
class PrunableModel(VideoModel, Protocol):
    """A :class:`VideoModel` that KV-cache pruners (Forcing-KV) and ``jbkv profile-heads`` can
    run on: it states its head layout and profiles heads through its own chunk loop.

    ``profiles_cases`` (optional, default False): :meth:`profile_heads` takes the whole
    :class:`~jbkv_cli.models.cases.Case` (an image and actions: ``profile-heads --cases``); else
    it takes the case's prompt and profiles prompt-only cases only."""

    profiles_cases: bool

    def head_layout(self) -> HeadLayout:
        """Attention layers, KV heads per layer and tokens per latent frame (its caches are
        built from this with :func:`~jbkv_cli.kvcache.layer_caches`)."""
        ...

    def profile_heads(self, case: Case | str, seed: int, probe: FrameMassProbe) -> None:
        """Generate ``case`` (its prompt unless ``profiles_cases``) with the full-precision
        cache while ``probe`` (:class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps the
        caches and is told the chunk and denoising step before each forward."""
        ...


@runtime_checkable
class CasePlanner(Protocol):
    """A model that computes something once per case which every variant must share (e.g.
    HY-WorldPlay's memory index lists): the run keeps it in its manifest (computed on first
    registration, reused on resume) and hands it back as ``case.plan``."""

    def plan_case(self, case: Case) -> Any:
        """A JSON-able plan for ``case`` (deterministic)."""
        ...


def resolve_spec(model: VideoModel, spec: KVSpec) -> KVSpec:
    """``spec`` as ``model`` runs it (:meth:`VideoModel.resolve_kv`). On a model that cannot
    cache keys before RoPE (``pre_rope`` False) a method that leaves the layout to the model
    caches them after RoPE (:meth:`KVSpec.post_rope`); one that asks for pre-RoPE keys is a
    :class:`UsageError`."""
    spec = model.resolve_kv(spec)
    if spec.key_layout == "pre-rope" and not model.pre_rope:
        moved = spec.post_rope()
        if moved is None:
            raise UsageError(f"{spec.label}: model {model.name} cannot cache keys before RoPE")
        spec = moved
    return spec


def check_layers(model: VideoModel, spec: KVSpec) -> None:
    """A per-layer spec (``--bits K2V2@0-3+K2V1@4-``) against ``model``'s attention layers (its
    :meth:`PrunableModel.head_layout`): a :class:`UsageError` when a range lies beyond them, a
    layer has no width, or the model states no layout; nothing for other specs."""
    if spec.layers is None:
        return
    if not hasattr(model, "head_layout"):
        raise UsageError(
            f"--bits {spec.layers}: model {model.name!r} states no attention layers "
            "(no head_layout(), models/contract.py: PrunableModel)"
        )
    try:
        spec.layers.check(model.head_layout()["layers"])
    except ValueError as exc:
        raise UsageError(f"--bits {spec.layers} on {model.name}: {exc}") from None


def resolve_specs(model: VideoModel, specs: list[KVSpec]) -> list[KVSpec]:
    """:func:`resolve_spec` of each, in order, duplicates dropped."""
    return list(dict.fromkeys(resolve_spec(model, s) for s in specs))


# --------------------------------------------------------------------------- the module's entry


class LoadModel(Protocol):
    def __call__(self, **options: Any) -> VideoModel: ...


class SampleCase(Protocol):
    def __call__(self, folder: Path, /, **options: Any) -> Case: ...


class CheckOptions(Protocol):
    def __call__(self, **options: Any) -> object: ...


class InputPaths(Protocol):
    def __call__(self, **options: Any) -> Mapping[str, Path]: ...


class CheckPrompt(Protocol):
    def __call__(self, prompt: str, /) -> None: ...


class CheckCases(Protocol):
    def __call__(self, cases: Iterable[Case], /, **options: Any) -> None: ...


def any_prompt(prompt: str, /) -> None:
    """The default ``check_prompt``: the model reads any prompt (a tokenizer, no grammar)."""


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """What a model's module registers, as ``ENTRY``; the module is imported on first use.

    Every option is passed as a keyword, as ``-o key=value`` gives it; a hook raises
    :class:`~jbkv_cli.utils.errors.UsageError` (one line) for what it refuses.

    Required:

    - ``load_model(**options)``: build the adapter (:class:`VideoModel`).
    - ``check_options(**options)``: refuse what ``load_model`` would refuse for these options
      and their weight files, with the same message, without building anything (commands
      check every model of a run before any runs).
    - ``input_paths(**options)``: role -> each file or folder ``load_model`` would read,
      located as it locates them (``weights``, an environment variable, the Hugging Face
      cache) without reading them; empty for a model that reads no file (a tiny random
      config). The one list of what a model reads: commands refuse an output path onto any of
      them (:mod:`jbkv_cli.cli.outputs`) and a run fingerprints them by role
      (:mod:`jbkv_cli.run.fingerprints`) to refuse a resume from changed files.

    Optional:

    - ``check_prompt(prompt)``: refuse a prompt the model cannot read (the tiny model's
      closed grammar). Default :func:`any_prompt`: every prompt is read.
    - ``check_cases(cases, **options)``: refuse the first case the model cannot generate with
      these options (a model that reads an image or a trajectory). Default None: the model
      takes prompt-only cases (:func:`~jbkv_cli.models.base.text_case`), each prompt through
      ``check_prompt`` (:func:`jbkv_cli.models.registry.check_cases`).

    - ``plan_model(**options)``: build the adapter as a GPU runs it (``cuda``, its 16-bit
      dtype) at the configuration the options name, with no file read and no weight allocated
      (modules built on ``meta``, random configs' values never drawn), for ``jbkv plan``, which
      calls it under its fake CUDA device (:mod:`jbkv_cli.plan`). Default None: the model
      cannot be planned.
    - ``sample_case(folder, **options)``: the case ``jbkv plan`` generates when the user gives
      none, its files (an image, an actions file) written into ``folder``. Default None: a
      prompt (:mod:`jbkv_cli.plan.job`).
    - ``plan_options``: options ``jbkv plan`` builds the model with unless the user sets them,
      ones that leave every byte of the plan where it is and make it faster (the fewest
      denoising steps: every step runs forwards of the same shapes; tested per model).
    - ``horizon_options``: options ``quantize-eval --horizon`` runs the model with unless the
      user sets them (the tiny model: its long-rollout weights, whose reference stays valid
      over the preset's rollout).
    - ``plan_blocks(model)``: the adapter's stack of transformer blocks (a ``ModuleList``), which
      ``jbkv plan`` traces with few middle blocks and extrapolates to the real depth
      (:mod:`jbkv_cli.plan.depth`); the model must count its layers as ``len`` of this list
      (its caches, its pruner's layout). Default None: the plan traces every block.

    Commands call the checks for every prompt and case before anything is created.
    """

    load_model: LoadModel
    check_options: CheckOptions
    input_paths: InputPaths
    check_prompt: CheckPrompt = any_prompt
    check_cases: CheckCases | None = None
    plan_model: LoadModel | None = None
    sample_case: SampleCase | None = None
    plan_options: Mapping[str, Any] = field(default_factory=dict)
    horizon_options: Mapping[str, Any] = field(default_factory=dict)
    plan_blocks: Callable[[Any], Any] | None = None
