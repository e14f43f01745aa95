"""The plan of one model: every variant's generation run on the plan's device, its peak split.

    plan = plan_model("magi1", options={}, specs=[FULL_PRECISION, int2], budgets=[h100])
    plan.variants[0].peak.total, plan.variants[1].fits["H100"]

The model is built once by its entry's ``plan_model`` (``cuda``, its 16-bit dtype, modules on
``meta``: :class:`~jbkv_cli.models.contract.ModelEntry`) under a
:class:`~jbkv_cli.plan.device.PlanDevice`, then every variant generates one video of the case
(the model's own code path: encoders, the chunk loop with the variant's cache, method,
correction and pruner, the decode). Per variant the tracker's periods (``setup``, ``chunk N``,
``decode``) give the peak and its split; the encoders run with the first variant only where the
model keeps their outputs per case (a GPU run does the same), so each variant's peak is taken
over its own periods and the first variant's ``setup``. With budgets, the model is built again
at one chunk more (one less when the model refuses more) and every variant runs there too: the
two peaks give the longest video that fits (:mod:`jbkv_cli.plan.budget`).

Each build is traced with few blocks where the model names its block stack (``plan_blocks``)
and every variant builds its layers alike (no per-layer widths; no pruner, or one whose layers
decide alike, ``layers_alike``: FlowCache, Deep Forcing): twice, with one middle block per run
of identical blocks and with two, and every number of the real depth — each period's peak and
its split, the cache a run records, ``KV stored`` — is computed from the two traces, exact by
construction (:mod:`jbkv_cli.plan.depth`; the traces are checked to match, else every block is
traced).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import check_layers, resolve_spec
from jbkv_cli.models.registry import entry
from jbkv_cli.plan.blocks import RegionHooks, block_runs, commit_regions, shorten, shortening
from jbkv_cli.plan.budget import Budget, Growth, fits
from jbkv_cli.plan.depth import NotExact, extrapolate_max, extrapolate_periods, line
from jbkv_cli.plan.device import (
    ATTENTION,
    CACHE,
    DECODE,
    DECODER,
    SETUP,
    WEIGHTS,
    LoopDone,
    PlanDevice,
    components,
    weight_bytes,
)
from jbkv_cli.plan.tracker import Peak
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.library_output import quiet_warnings

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Split:
    """Device bytes at one moment: ``total`` = weights (per component) + stored ``cache`` +
    ``attention`` working bytes + other ``activations``."""

    total: int
    weights: dict[str, int]
    cache: int
    attention: int
    activations: int

    @classmethod
    def of(cls, peak: Peak) -> Split:
        labels = peak.by_label
        weights = {k.removeprefix(WEIGHTS): v for k, v in labels.items() if k.startswith(WEIGHTS)}
        cache, attention = labels.get(CACHE, 0), labels.get(ATTENTION, 0)
        rest = peak.total - sum(weights.values()) - cache - attention
        return cls(peak.total, {k: v for k, v in weights.items() if v}, cache, attention, rest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "weights": dict(self.weights),
            "cache": self.cache,
            "attention": self.attention,
            "activations": self.activations,
        }


@dataclass(frozen=True)
class VariantPlan:
    """One variant's plan: its ``peak`` and the ``phases`` (``setup``, ``chunk N``, ``decode``)
    with their own peaks; ``kv_cache_bytes`` is what a run records (the most the caches held
    after a commit pass, from the stored tensors), ``stored`` the most the tracker saw under
    ``cache`` at those moments; ``fits`` and ``longest`` (chunks) per budget name."""

    label: str
    variant_id: str
    peak: Split
    phases: list[tuple[str, Split]]
    kv_cache_bytes: int
    stored: int
    seconds: float
    fits: dict[str, bool] = field(default_factory=dict)
    longest: dict[str, int] = field(default_factory=dict)
    growth: Growth | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "variant": self.label,
            "variant_id": self.variant_id,
            "peak": self.peak.to_dict(),
            "kv_cache_bytes": self.kv_cache_bytes,
            "stored_cache_bytes": self.stored,
            "seconds": round(self.seconds, 3),
            "phases": [{"phase": name, **split.to_dict()} for name, split in self.phases],
        }
        if self.fits:
            out["fits"] = dict(self.fits)
        if self.growth is not None:
            out["growth"] = {
                "chunks": [self.growth.n1, self.growth.n2],
                "peaks": [self.growth.peak1, self.growth.peak2],
                "bytes_per_chunk": round(self.growth.per_chunk),
            }
            out["longest_chunks"] = dict(self.longest)
        return out


@dataclass(frozen=True)
class ModelPlan:
    """A model's plan: its ``settings`` as built, every component's weight bytes (on the
    device or not), the ``variants``' plans, the ``budgets`` asked, ``frames_per_chunk`` (for
    the longest video in frames, None when the model does not state it) and the seconds the
    plan took."""

    model: str
    settings: dict[str, Any]
    components: dict[str, int]
    variants: list[VariantPlan]
    budgets: list[Budget]
    seconds: float
    frames_per_chunk: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "settings": self.settings,
            "components": dict(self.components),
            "budgets": {b.name: b.bytes for b in self.budgets},
            "frames_per_chunk": self.frames_per_chunk,
            "seconds": round(self.seconds, 3),
            "variants": [v.to_dict() for v in self.variants],
        }


@dataclass
class _Run:
    """What one build's variants measured."""

    settings: dict[str, Any]
    components: dict[str, int]
    variants: list[VariantPlan]


def plan_model(
    name: str,
    options: dict[str, Any],
    specs: Sequence[KVSpec],
    case: Case | Callable[[dict[str, Any]], Case],
    *,
    budgets: Sequence[Budget] = (),
    seed: int = 0,
    progress: Progress | None = None,
    full_depth: bool = False,
) -> ModelPlan:
    """The plan of model ``name`` with ``options`` for every spec (module docstring); ``case``,
    or the function that makes the case for a length's options; ``full_depth``: trace every
    block (the oracle of the shortened traces)."""
    start = time.perf_counter()
    model = entry(name)
    if model.plan_model is None:
        raise UsageError(f"model {name!r} cannot be planned (its entry has no plan_model)")
    options = {**model.plan_options, **options}  # the fewest steps unless asked (same bytes)
    run = _run(name, options, specs, case, seed, progress, full_depth)
    variants = run.variants
    if budgets:
        second = None
        for other in _other_lengths(options, run.settings):
            try:
                second = _run(name, other, specs, case, seed, progress, full_depth)
            except UsageError:
                continue  # a length the model refuses (its horizon, its rotary table)
            break
        seconds = second.variants if second is not None else [None] * len(variants)
        variants = [
            _with_budgets(v, w, run.settings, second.settings if second else None, budgets)
            for v, w in zip(variants, seconds, strict=True)
        ]
    return ModelPlan(
        name,
        run.settings,
        run.components,
        variants,
        list(budgets),
        time.perf_counter() - start,
        _frames_per_chunk(run.settings),
    )


@dataclass
class _Generation:
    """One variant's generation as the device saw it: its ``periods``' peaks, the books' peak
    cache bytes (``recorded``), the cache samples and the caches' bytes after each commit pass,
    the cache bytes when the decode began, and the tracker's ``trace`` when one was kept."""

    label: str
    variant_id: str
    loop_only: bool
    periods: list[tuple[str, Peak]]
    recorded: int
    samples: list[int]
    passes: list[int]
    cache_at_decode: int
    seconds: float
    trace: list[tuple] | None = None


@dataclass
class _Trace:
    """One build's generations; ``removed``: the middle blocks each run lost (0: the real
    depth), ``mids``: each run's middle blocks at the real depth."""

    settings: dict[str, Any]
    components: dict[str, int]
    generations: list[_Generation]
    removed: int
    mids: dict[int, int]


SHORTEST = -1  # ``_trace(removed=SHORTEST)``: as few blocks as the runs allow (or none removed)


def _run(
    name: str,
    options: dict[str, Any],
    specs: Sequence[KVSpec],
    case: Case | Callable[[dict[str, Any]], Case],
    seed: int,
    progress: Progress | None,
    full_depth: bool = False,
) -> _Run:
    """Every variant's plan at ``options``: from two shortened traces extrapolated to the real
    depth (:mod:`jbkv_cli.plan.depth`) where the model names its blocks and every variant treats
    its layers alike (:func:`_layers_alike`), else from one trace at the real depth."""
    if not isinstance(case, Case):
        case = case(options)
    shortened = entry(name).plan_blocks is not None and not full_depth
    if shortened and all(_layers_alike(s) for s in specs):
        a = _trace(name, options, specs, case, seed, progress, SHORTEST)
        if not a.removed:
            return _Run(a.settings, a.components, _variants(a.generations))
        b = _trace(name, options, specs, case, seed, progress, a.removed - 1)
        try:
            generations = [
                _extrapolated(x, y, a.removed, a.mids)
                for x, y in zip(a.generations, b.generations, strict=True)
            ]
        except NotExact as exc:  # the traces do not match: trace the real depth
            if progress is not None:
                progress(f"{name} · tracing every block: {exc}")
        else:
            return _Run(a.settings, a.components, _variants(generations))
    full = _trace(name, options, specs, case, seed, progress, 0)
    return _Run(full.settings, full.components, _variants(full.generations))


def _layers_alike(spec: KVSpec) -> bool:
    """Every layer of ``spec``'s cache is built alike: no per-layer widths, no pruner or one
    whose layers decide alike (``layers_alike``: a profile's or a shared decision's do not)."""
    return spec.layers is None and (spec.pruner is None or spec.pruner.layers_alike)


def _trace(
    name: str,
    options: dict[str, Any],
    specs: Sequence[KVSpec],
    case: Case,
    seed: int,
    progress: Progress | None,
    removed: int,
) -> _Trace:
    """Build the model, remove ``removed`` middle blocks from each run of its blocks
    (:data:`SHORTEST`: the most the runs allow, when that leaves at least 2 to extrapolate
    over; else none) and generate every variant."""
    model_entry = entry(name)
    build = model_entry.plan_model
    assert build is not None
    with PlanDevice() as device, quiet_warnings(), contextlib.ExitStack() as scope:
        model = build(**options)
        sizes, mids = None, {}
        if removed:
            blocks = model_entry.plan_blocks(model)
            runs = block_runs(blocks)
            if removed == SHORTEST:
                removed = shortening(runs) if shortening(runs) >= 2 else 0
        if removed:
            sizes = weight_bytes(components(model))  # the real depth's
            kept = shorten(blocks, runs, removed)
            gc.collect()  # the removed blocks' weights are gone before the tracker counts
            RegionHooks(blocks, kept, device.tracker)
            scope.enter_context(commit_regions(kept, device.tracker))
            mids = {i: run.length - 2 for i, run in enumerate(runs)}
        sizes = sizes or device.adopt_weights(model)
        if mids:
            device.adopt_weights(model)
            device.tracker.trace = []
        trace = device.tracker.trace
        resolved = [resolve_spec(model, s) for s in specs]
        for spec in resolved:
            check_layers(model, spec)  # a per-layer spec beyond its layers: a usage error
        decoder = DECODER in sizes
        generations = []
        for index, spec in enumerate(resolved):
            if progress is not None:
                blocks_note = f" · {len(model_entry.plan_blocks(model))} blocks" if mids else ""
                progress(
                    f"{name} · {model.settings.get('num_chunks', '?')} chunks{blocks_note}"
                    f" · {spec.label}"
                )
            loop_only = decoder and index > 0
            began, samples = len(device.tracker.periods), len(device.cache_samples)
            passes, at = len(device.passes), len(trace) if trace is not None else 0
            t0 = time.perf_counter()
            device.begin(loop_only=loop_only)
            try:
                recorded = int(model.generate(case, seed, spec).kv_cache_bytes)
            except LoopDone:
                recorded = device.recorded
            device.finish()
            generations.append(
                _Generation(
                    spec.label,
                    spec.variant_id,
                    loop_only,
                    list(device.tracker.periods[began:]),
                    recorded,
                    device.cache_samples[samples:],
                    device.passes[passes:],
                    device.cache_at_decode,
                    time.perf_counter() - t0,
                    trace[at:] if trace is not None else None,
                )
            )
        settings = dict(model.settings)
    return _Trace(settings, sizes, generations, removed, mids)


def _extrapolated(a: _Generation, b: _Generation, t: int, mids: dict[int, int]) -> _Generation:
    """One variant's generation at the real depth from its two shortened traces."""
    assert a.trace is not None and b.trace is not None
    return _Generation(
        a.label,
        a.variant_id,
        a.loop_only,
        extrapolate_periods(a.trace, b.trace, t, mids),
        extrapolate_max(a.passes, b.passes, t),
        [extrapolate_max(a.samples, b.samples, t)],
        [],
        line(a.cache_at_decode, b.cache_at_decode, t),
        a.seconds + b.seconds,
    )


def _variants(generations: list[_Generation]) -> list[VariantPlan]:
    """Each variant's plan; a variant that stopped before the decode takes the first
    variant's ``setup`` and ``decode`` (module docstring)."""
    variants: list[VariantPlan] = []
    first: dict[str, Split] = {}
    for g in generations:
        own = dict((n, Split.of(p)) for n, p in g.periods)
        if not first:
            first = own
        shared = {SETUP: first.get(SETUP), DECODE: first.get(DECODE)}
        if g.loop_only and shared[DECODE] is not None:
            own[DECODE] = _with_cache(shared[DECODE], g.cache_at_decode)
        if shared[SETUP] is not None and shared[SETUP].total > own.get(SETUP, _NONE).total:
            own[SETUP] = shared[SETUP]
        periods = sorted(own.items(), key=lambda item: _order(item[0]))
        variants.append(
            VariantPlan(
                g.label,
                g.variant_id,
                max((s for _, s in periods), key=lambda s: s.total),
                periods,
                g.recorded,
                max(g.samples, default=0),
                g.seconds,
            )
        )
    return variants


_NONE = Split(0, {}, 0, 0, 0)


def _order(name: str) -> tuple[int, int]:
    """Phases in time order: setup, chunk 1, chunk 2, …, decode."""
    if name == SETUP:
        return (0, 0)
    if name.startswith("chunk "):
        return (1, int(name.split()[1]))
    return (2, 0)


def _with_cache(decode: Split, cache: int) -> Split:
    """The first variant's ``decode`` phase for a variant whose caches hold ``cache`` bytes
    when it starts (the decode's own bytes do not depend on the variant; the caches are the
    variant's where they are still alive at the decode's peak)."""
    if decode.cache == 0:
        return decode
    return Split(
        decode.total - decode.cache + cache,
        decode.weights,
        cache,
        decode.attention,
        decode.activations,
    )


def _chunks(settings: dict[str, Any]) -> int | None:
    n = settings.get("num_chunks")
    return n if type(n) is int else None


def _frames_per_chunk(settings: dict[str, Any]) -> int | None:
    for key in ("chunk_frames", "frames_per_chunk"):
        value = settings.get(key)
        if type(value) is int:
            return value
    return None


def _other_lengths(options: dict[str, Any], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The options at one chunk more, then at one less (the second length of the budget fit)."""
    n = _chunks(settings)
    if n is None:
        return []
    base = {k: v for k, v in options.items() if k != "num_frames"}
    return [base | {"num_chunks": other} for other in (n + 1, n - 1) if other >= 1]


def _setup(plan: VariantPlan) -> int:
    """The peak of the setup phase (0: none)."""
    return max((split.total for name, split in plan.phases if name == SETUP), default=0)


def _growing(plan: VariantPlan) -> int:
    """The peak of every phase but setup (the whole peak where there is no other phase)."""
    return max(
        (split.total for name, split in plan.phases if name != SETUP), default=plan.peak.total
    )


def _with_budgets(
    first: VariantPlan,
    second: VariantPlan | None,
    settings: dict[str, Any],
    other: dict[str, Any] | None,
    budgets: Sequence[Budget],
) -> VariantPlan:
    fit = {b.name: fits(first.peak.total, b) for b in budgets}
    growth, longest = None, {}
    n1, n2 = _chunks(settings), _chunks(other or {})
    if second is not None and n1 is not None and n2 is not None and n1 != n2:
        # the growth of the phases a longer video makes longer (every one but setup: its
        # encoders' peak does not depend on the length, and where it is the peak at both
        # lengths the whole peak's slope would be 0 and claim any length fits); setup must fit
        (a, pa), (b, pb) = sorted([(n1, _growing(first)), (n2, _growing(second))])
        growth = Growth(a, pa, b, pb)
        setup = _setup(first)
        longest = {
            budget.name: growth.longest(budget) if fits(setup, budget) else 0 for budget in budgets
        }
    return VariantPlan(
        first.label,
        first.variant_id,
        first.peak,
        first.phases,
        first.kv_cache_bytes,
        first.stored,
        first.seconds,
        fit,
        longest,
        growth,
    )
