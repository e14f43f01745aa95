"""The experiment: generate every (variant, case, seed) into a run, scoring as it goes.

Data flows one way: matrix of KVSpecs -> model.generate (with an attention recorder as its
observer) -> run directory -> paired fidelity against the reference variant -> rows for the
report. Each quantized video is scored as soon as it and its reference exist (:class:`Scoring`),
by the process (rank) that generated it, not after all generation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.attention.correction import get_correction
from jbkv_cli.attention.memory import cuda_peak, metering
from jbkv_cli.kvcache.coverage import counting
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.metrics.chunks import chunk_frames_of, first_chunk_frames_of
from jbkv_cli.metrics.fidelity import compare_videos
from jbkv_cli.metrics.perceptual import try_load_lpips
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import CasePlanner, PromptCheck, VideoModel
from jbkv_cli.prune.registry import build_pruner
from jbkv_cli.quant.registry import METHODS
from jbkv_cli.run.ablations import ABLATIONS
from jbkv_cli.run.bit_specs import BitPair, LayerBits
from jbkv_cli.run.directory import RunDir, check_inputs, check_prompt, video_name
from jbkv_cli.run.fingerprints import Fingerprint, expand, fingerprint
from jbkv_cli.run.pruned_base import KIND as PRUNED16
from jbkv_cli.run.pruned_base import pruned_baselines
from jbkv_cli.run.shards import merge_shards, save_scores
from jbkv_cli.utils import distributed
from jbkv_cli.utils.console import visible, warn
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.host_reads import deferred_checks
from jbkv_cli.utils.progress import Progress, counting_progress

HISTOGRAM_SAMPLES = 2000


def build_matrix(
    bits: Iterable[int | BitPair | LayerBits],
    quantizers: Iterable[str],
    corrections: Iterable[str],
    group_sizes: Iterable[int] | None,
    ablations: Iterable[str] = (),
    options: dict[str, dict[str, Any]] | None = None,
    pruners: Iterable[str] = ("none",),
) -> list[KVSpec]:
    """The reference plus every quantized combination, then the ablations (uncorrected).

    ``bits``: widths, :class:`~jbkv_cli.run.bit_specs.BitPair` key and value widths
    (16: that side exact; values-only pairs get the uncorrected variant alone, ablations come
    with plain widths) or :class:`~jbkv_cli.run.bit_specs.LayerBits` widths per layer (one
    variant each, with a method that supports every width it names; no ablations).
    ``options``: per method or pruner name, options passed to it (e.g. ``{"quarot": {"seed":
    1}}``). Combinations a method does not define (bits it does not support) are left out. Each
    pruner other than ``none`` adds its 16-bit pruned variant and prunes every quantized
    combination (not the ablations); a method a pruner cannot take (its spec refuses the pair:
    e.g. keys cached before RoPE) is left out of that pruner's variants, named in one warning
    (``ValueError`` where that leaves the method no variant at all). ``group_sizes`` None: each
    method at its source's (:meth:`~jbkv_cli.quant.method.KVMethod.default_group_size`).
    """
    options = options or {}
    chosen = [None if p == "none" else build_pruner(p, **options.get(p, {})) for p in pruners]
    unprunable: dict[tuple[str, str], str] = {}  # (method, pruner) -> why, left out
    built: set[str] = set()  # the methods with a variant
    specs = [FULL_PRECISION, *(KVSpec(pruner=p) for p in chosen if p is not None)]
    for q in quantizers:
        for g in group_sizes or [METHODS[q].default_group_size()]:
            for b in bits:
                if isinstance(b, LayerBits):
                    specs += _layered(b, q, g, corrections, chosen, options.get(q, {}))
                    continue
                kb, vb = (b, b) if isinstance(b, int) else (b.key, b.value)
                if any(w != 16 and w not in METHODS[q].SUPPORTED_BITS for w in (kb, vb)):
                    continue
                kw = options.get(q, {})
                plain = [  # built first: their own errors are the user's
                    KVSpec.build(q, kb, g, c, value_bits=vb, **kw)
                    for c in corrections
                    if kb != 16 or not get_correction(c).active  # a correction reads keys
                ]
                for p in chosen:
                    for spec in plain:
                        try:
                            specs.append(spec if p is None else replace(spec, pruner=p))
                            built.add(q)
                        except ValueError as exc:  # a method the pruner cannot take
                            unprunable.setdefault((q, p.name), str(exc))
                if kb != vb:
                    continue  # the ablations are of a plain width
                for a in ablations:
                    specs.append(KVSpec.build(q, kb, g, "none", **ABLATIONS[a], **kw))
    for (method, _), why in unprunable.items():
        if method not in built:  # nothing of it would run: the user's choice cannot be met
            raise ValueError(why)
    if unprunable:
        (method, pruner), why = next(iter(unprunable.items()))
        pairs = ", ".join(f"{m}+{p}" for m, p in unprunable)
        warn(f"left out of the sweep: {pairs} (e.g. {method} pruned by {pruner}: {why})")
    return list(dict.fromkeys(specs))


def supports(quantizer: str, bits: int | BitPair | LayerBits) -> bool:
    """Whether method ``quantizer`` supports every width ``bits`` names (16: exact, any)."""
    if isinstance(bits, int):
        widths = [bits]
    elif isinstance(bits, BitPair):
        widths = [bits.key, bits.value]
    else:
        widths = bits.widths("key") + bits.widths("value")
    return all(w == 16 or w in METHODS[quantizer].SUPPORTED_BITS for w in widths)


def _layered(
    layers: LayerBits,
    quantizer: str,
    group_size: int,
    corrections: Iterable[str],
    pruners: list,
    options: dict[str, Any],
) -> list[KVSpec]:
    """The per-layer variants of one method and group size: each correction (an active one
    only where some layer quantizes keys) × pruner; none where the method lacks a width."""
    if not supports(quantizer, layers):
        return []
    keys = any(w != 16 for w in layers.widths("key"))
    return [
        KVSpec.build(
            quantizer, group_size=group_size, correction=c, pruner=p, layers=layers, **options
        )
        for p in pruners
        for c in corrections
        if keys or not get_correction(c).active
    ]


@dataclass
class GenerationSummary:
    generated: int = 0
    skipped: int = 0
    seconds: float = 0.0
    peak_kv_bytes: int = 0
    per_rank: list[int] = field(default_factory=list)  # videos generated by each rank


def open_run(
    root: Path, model: str, settings: dict[str, Any], inputs: Fingerprint | None = None
) -> RunDir:
    """:meth:`RunDir.create_or_resume` on rank 0, the only writer of the manifest; the other
    ranks of a torchrun job wait for it and take its manifest (one process: just that call).
    ``inputs``: the model's files (:func:`fingerprint_inputs`)."""
    manifest = distributed.from_rank0(
        lambda: RunDir.create_or_resume(root, model, settings, inputs).manifest, "opening the run"
    )
    return RunDir(Path(root), manifest)


def fingerprint_inputs(
    root: Path, model: str, options: dict[str, Any], cases: Iterable[Case]
) -> Fingerprint:
    """The SHA-256 of every file ``model`` reads with ``options`` (its weights, by role:
    :func:`~jbkv_cli.models.registry.input_paths`), and a run of it at ``root`` checked against
    them and against the files of ``cases`` (their ``sha256``): a run made from other files is
    refused here, naming the file, before the model loads and before anything is created
    (:func:`~jbkv_cli.run.directory.check_inputs`). Rank 0 reads the files; every rank gets the result."""
    from jbkv_cli.models.registry import input_paths

    def plan() -> Fingerprint:
        inputs = fingerprint(expand(input_paths(model, **options)))
        check_inputs(root, model, inputs, cases)
        return inputs

    return distributed.from_rank0(plan, "fingerprinting the inputs")


Job = tuple[KVSpec, str, Case, int]  # (spec, variant id, case, seed)


def with_plans(model: VideoModel, cases: list[Case]) -> list[Case]:
    """``cases`` with the plan a :class:`~jbkv_cli.models.contract.CasePlanner` computes for each
    (unchanged for other models)."""
    if not isinstance(model, CasePlanner):
        return cases
    return [replace(c, plan=model.plan_case(c)) if c.plan is None else c for c in cases]


def generate_all(
    model: VideoModel,
    run: RunDir,
    specs: list[KVSpec],
    items: list[tuple[Case | str, list[int]]],
    *,
    diagnostics: bool = True,
    show_progress: bool = True,
    scoring: Scoring | None = None,
) -> GenerationSummary:
    """Generate every (variant, case, seed) of ``items`` = [(case or prompt, seeds)] that is
    missing; finished videos are skipped (resumable). The reference goes first for each (case,
    seed). Rank 0 registers the cases with their plans (:func:`with_plans`; a plan kept from an
    earlier run wins) and every job reads its case back from the manifest, so every variant,
    rank and resumed run generates a case from the same plan.

    With ``scoring``, the order of work of each process is:

    1. rank 0 (or the one process) lists the missing videos, and the finished videos without a
       score (a killed job's: their references exist, or are among the missing videos);
    2. each rank takes its share of the missing videos (:func:`_split`: references first) and of
       the unscored ones (dealt out by reference), and generates its videos one by one; after
       each one it scores every video of its own whose reference exists by now (the one just
       made, usually), never waiting;
    3. it then waits for the references it still lacks (other ranks make them; the wait is
       progress-aware, :func:`distributed.wait_until`) and scores the rest;
    4. the ranks meet and the summary counts every rank's videos. Each score is in its own
       file (:mod:`jbkv_cli.run.shards`): nothing to merge.

    Every video is scored exactly once, by the rank that generated it or was dealt it.
    """
    items = [(Case.of(c), seeds) for c, seeds in items]
    for case, _ in items:
        check_prompt(case.name)

    def jobs_of(vids: list[str]) -> list[Job]:
        pairs = list(zip(specs, vids, strict=True))
        cases = [run.case(c.name) if not c.prompt_only else c for c, _ in items]
        return [
            (s, v, case, seed)
            for case, (_, seeds) in zip(cases, items, strict=True)
            for seed in seeds
            for s, v in pairs
        ]

    def missing() -> tuple[dict[str, Any], list[str], list[int], list[Pair]]:
        cases = [c for c, _ in items]
        known = set(run.manifest.get("cases", {}))
        planned_cases = with_plans(model, [c for c in cases if c.name not in known])
        by_name = {c.name: c for c in planned_cases}
        run.register(
            [by_name.get(c.name, c) for c in cases],
            sorted({s for _, seeds in items for s in seeds}),
        )
        vids = [run.ensure_variant(spec) for spec in specs]
        jobs = jobs_of(vids)
        todo = [
            i
            for i, (_, vid, case, seed) in enumerate(jobs)
            if not run.is_done(vid, video_name(case.name, run.index_of(seed)))
        ]
        planned = {
            video_name(jobs[i][2].name, run.index_of(jobs[i][3]))
            for i in todo
            if jobs[i][0].is_reference
        }
        unscored = scoring.missing(planned) if scoring else []
        return run.manifest, vids, todo, unscored

    run.manifest, vids, todo, unscored = distributed.from_rank0(
        missing, "listing the videos to make"
    )
    jobs = jobs_of(vids)
    mine = _split(jobs, todo)
    summary = GenerationSummary(skipped=len(jobs) - len(todo) if distributed.is_main() else 0)
    with counting_progress(show_progress) as progress:
        total = len(mine) + summary.skipped
        videos_task = (
            progress.add_task("videos", total=total, completed=summary.skipped)
            if progress
            else None
        )
        chunk_task = progress.add_task("chunks", total=1) if progress else None
        if scoring:
            scoring.start(_deal(unscored), progress)
        for spec, vid, case, seed in mine:
            name = video_name(case.name, run.index_of(seed))
            if progress:
                progress.update(videos_task, description=visible(f"{vid} · {name[:40]}"))
                progress.reset(chunk_task)
            record = _generate_one(
                model, run, spec, vid, name, case, seed, diagnostics, progress, chunk_task
            )
            summary.generated += 1
            summary.seconds += record["seconds"]
            summary.peak_kv_bytes = max(summary.peak_kv_bytes, record["kv_cache_bytes"])
            if progress:
                progress.advance(videos_task)
            if scoring and vid != run.reference:
                scoring.add(vid, name, record)
        if scoring:
            scoring.finish()
    distributed.wait_for_peers("generating and scoring" if scoring else "generating")
    combined = _combine(distributed.gather(summary, "counting the videos"))
    if scoring:
        scoring.merge()
    return combined


def _split(jobs: list[Job], todo: list[int]) -> list[Job]:
    """This rank's jobs: references first (their pairs can be scored as soon as they exist),
    then round-robin. One process keeps the list's order: per (case, seed) the reference,
    then each variant."""
    if distributed.world_size() > 1:
        todo = sorted(todo, key=lambda i: not jobs[i][0].is_reference)
    return [jobs[i] for i in distributed.shard(todo)]


def _combine(parts: list[GenerationSummary]) -> GenerationSummary:
    return GenerationSummary(
        generated=sum(p.generated for p in parts),
        skipped=sum(p.skipped for p in parts),
        seconds=sum(p.seconds for p in parts),
        peak_kv_bytes=max(p.peak_kv_bytes for p in parts),
        per_rank=[p.generated for p in parts],
    )


def _generate_one(model, run, spec, vid, name, case: Case, seed, diagnostics, progress, task):
    def on_chunk(done: int, total: int) -> None:
        distributed.beat()
        if progress is not None:
            progress.update(task, completed=done, total=total)

    run.check_case_files(case)  # its files may have been replaced since the run began
    rec = AttentionRecorder() if diagnostics and not spec.is_reference else None
    start = time.perf_counter()
    try:
        # value checks off the CPU (finite keys, FP8 range) are read once, at the video's end
        with metering() as meter, cuda_peak() as peak, counting() as held, deferred_checks():
            video = model.generate(case, seed, spec, progress=on_chunk, observer=rec)
    except ValueError as exc:
        raise JbkvError(f"{spec.label} on {model.name}: {exc}") from exc
    seconds = time.perf_counter() - start
    diag_seconds = rec.seconds if rec is not None else 0.0
    record: dict[str, Any] = {
        "prompt": case.name,  # what names and pairs the video: the prompt of a prompt-only case
        "seed": seed,
        "index": run.index_of(seed),
        "variant": vid,
        "rank": distributed.rank(),
        "world_size": distributed.world_size(),
        "spec": spec.to_dict(),
        "seconds": seconds - diag_seconds,  # generation alone
        "diagnostics_seconds": diag_seconds,
        "kv_cache_bytes": int(video.kv_cache_bytes),
        "frames": list(video.frames.shape),
        "fps": video.fps,
        "info": video.info,
        "diagnostics": None,
        # the largest cache read's working bytes (attention/memory.py) and, on CUDA, the
        # allocator's peak over the video with what was resident before it (the weights)
        "working_bytes": meter.to_dict(),
        "cuda_memory": peak or None,
        # token-rows the caches held after each commit and, of them, stored compressed (and
        # before/after pruning): kvcache/coverage.py; None for a variant that stores all exact
        "compression": None if held.empty else held.to_dict(),
    }
    if not case.prompt_only:
        record["case"] = case.to_dict() | ({"sha256": case.sha256} if case.sha256 else {})
    if rec is not None:
        record["diagnostics"] = rec.summary()
        dps = rec.delta_ps()
        if dps.numel() > HISTOGRAM_SAMPLES:
            idx = torch.linspace(0, dps.numel() - 1, HISTOGRAM_SAMPLES).long()
            dps = dps[idx]
        record["delta_ps_samples"] = [round(float(x), 6) for x in dps]
        # per observed attention call (a block of queries of one layer): the cached
        # log-partition shift and the part the correction predicts (attention/partition.py)
        record["partition_samples"] = [
            [layer, round(shift, 6), round(predicted, 6)]
            for layer, shift, predicted in rec.partition
        ]
        # per layer (and head) and per (layer, denoising step): the keys' attention error and
        # the part the predicted bias explains (attention/bias_share.py)
        record["attention_error"] = rec.attention_error()
    run.save_video(vid, name, video, record)
    return record


Pair = tuple[str, str, int | None, int | None]  # (variant, video, chunk frames, first chunk's)


class Scoring:
    """Paired PSNR/SSIM/LPIPS of a run's videos against the reference of the same prompt and
    seed, each scored as soon as both videos exist.

    Beside each pair, what the long-horizon report reads (:mod:`jbkv_cli.report.horizon`), each
    in its own file like the fidelity scores and made when missing, so a resumed run or
    ``report --score`` completes it:

    - ``metrics/prompt/<variant>/<video>.json``: the model's per-chunk prompt check of the
      video, the reference's too (``check``: the model's
      :attr:`~jbkv_cli.models.contract.VideoModel.follows_prompt`; None, as under
      ``report --score``, which loads no model: none made);
    - ``metrics/floor/<reference>/<video>.json``: a reference video of seed index ``i ≥ 1``
      scored against the reference of the same prompt at index 0, the PSNR two samples of one
      prompt have per chunk (made once both exist);
    - ``metrics/pruned16/<variant>/<video>.json``: a pruned and quantized video scored against
      the same pruner's 16-bit video of the same prompt and seed, when the run has that variant
      (:mod:`jbkv_cli.run.pruned_base`; made once both exist: in this process's pass, else by
      :meth:`finish`, a resumed run or ``report --score``).

    A reference's own files are made when its first pair is scored (under torchrun: by rank 0
    in :meth:`merge`).

    Order of work: :meth:`start` queues the pairs this process was dealt, :meth:`add` each video
    it generates; :meth:`score_ready` (called by both) scores every queued pair whose reference
    is done and never waits; :meth:`finish` waits for the references still missing (made by
    other ranks) and scores the rest; :meth:`merge` (rank 0, after the ranks met) moves the
    shards of older versions into per-video files. Each score is saved right away
    (:func:`save_scores`: atomically, in the video's own file), so a kill loses at most the
    video being scored, which the next run scores.
    """

    def __init__(
        self,
        run: RunDir,
        *,
        lpips: bool = True,
        check: PromptCheck | None = None,
        check_version: int = 1,
    ) -> None:
        self.run = run
        self.check = check
        self.check_version = check_version
        self.scorer, self.status = try_load_lpips() if lpips else (None, "disabled (--no-lpips)")
        self._pending: list[Pair] = []
        self._ref: tuple[str, torch.Tensor] | None = None  # the last reference decoded
        self._older: dict[tuple[str, str], dict[str, Any]] = {}  # variants' files of older runs
        self._bases: dict[str, str] = {}  # pruned + quantized variant -> its 16-bit variant
        self._base: tuple[str, str, torch.Tensor] | None = None  # the last 16-bit video decoded
        self._later: list[Pair] = []  # pairs scored before their pruned 16-bit video existed
        self._progress: Progress | None = None
        self._task = None
        self._total = 0

    def missing(self, planned: Iterable[str] = ()) -> list[Pair]:
        """Finished videos without a current score whose reference is done or ``planned`` (a
        video name this job makes the reference of), after moving the shards a killed torchrun
        job of an older version left. Rank 0 lists them for everyone."""
        run = self.run
        merge_shards(run, "fidelity")
        reference = run.reference
        refs = {video_name(r["prompt"], r["index"]) for r in run.records(reference)}
        refs |= set(planned)
        settings = run.manifest.get("settings", {})
        ref_todo = self._reference_todo(refs)
        bases = pruned_baselines(run.variants())
        todo = []
        for vid in run.variants():
            if vid == reference:
                continue
            done = run.read_metrics("fidelity", vid)
            checked = run.read_metrics("prompt", vid) if self.check else {}
            base = bases.get(vid)
            against = run.read_metrics(PRUNED16, vid) if base else {}
            for rec in run.records(vid):
                name = video_name(rec["prompt"], rec["index"])
                stale = name not in done or _stale(done[name], self.scorer)
                unchecked = self._unchecked(checked.get(name))
                unpaired = self._pruned_todo(base, name, against.get(name))
                if name in refs and (stale or unchecked or unpaired or name in ref_todo):
                    todo.append((vid, name, *_chunks(rec, settings)))
        return todo

    def _pruned_todo(self, base: str | None, name: str, entry: dict[str, Any] | None) -> bool:
        """Whether a video's score against its pruned 16-bit video ``base`` is missing (or
        lacks LPIPS that is now available) and can be made (``base``'s video is done)."""
        if base is None or not self.run.is_done(base, name):
            return False
        return entry is None or _stale(entry, self.scorer)

    def _reference_todo(self, refs: set[str]) -> set[str]:
        """Reference videos whose prompt check or floor is missing (and can be made)."""
        run = self.run
        reference = run.reference
        checked = run.read_metrics("prompt", reference) if self.check else {}
        floors = run.read_metrics("floor", reference)
        return {
            name
            for name in refs
            if self._unchecked(checked.get(name))
            or (name not in floors and self._floor_source(name) is not None)
        }

    def _floor_source(self, name: str) -> str | None:
        """The reference video ``name``'s floor is measured against: the same prompt at seed
        index 0, when ``name`` is of a later index and that video is done; else None."""
        run = self.run
        rec = run.record(run.reference, name)
        if rec is None or rec["index"] == 0:
            return None
        first = video_name(rec["prompt"], 0)
        return first if run.is_done(run.reference, first) else None

    def start(self, pairs: list[Pair], progress: Progress | None = None) -> None:
        """Queue ``pairs`` (this process's share) and score those that are ready."""
        self._progress = progress
        if progress:
            self._task = progress.add_task("fidelity", total=0)
        self._queue(pairs)

    def add(self, vid: str, name: str, record: dict[str, Any]) -> None:
        """Queue a video this process just generated, and score what is ready."""
        settings = self.run.manifest.get("settings", {})
        self._queue([(vid, name, *_chunks(record, settings))])

    def _queue(self, pairs: list[Pair]) -> None:
        self._pending += pairs
        self._total += len(pairs)
        if self._progress:
            self._progress.update(self._task, total=self._total)
        self.score_ready()

    def score_ready(self) -> None:
        """Score every queued pair whose reference is done (grouped by reference, so each is
        decoded once); never waits."""
        ready = sorted((p for p in self._pending if self._ready(p)), key=lambda p: p[1])
        for pair in ready:
            self._score(*pair)
            self._pending.remove(pair)

    def finish(self) -> None:
        """Score every queued pair, waiting for references other ranks are still making; then
        the scores against pruned 16-bit videos that were not done when their pair was scored
        (those still missing: left to a resumed run or ``report --score``)."""
        self.score_ready()
        while self._pending:
            distributed.wait_until(
                lambda: any(map(self._ready, self._pending)),
                "waiting for reference videos that other ranks make",
            )
            self.score_ready()
        later, self._later = self._later, []
        for vid, name, chunk_frames, first in later:
            self._score_pruned(vid, name, None, chunk_frames, first)

    def merge(self) -> None:
        """Rank 0 of a torchrun job, after the ranks met: move shards of older versions, and
        make the references' prompt checks and floors still missing (under torchrun only rank 0
        makes them, so no two ranks write one file)."""
        if distributed.active() and distributed.is_main():
            merge_shards(self.run, "fidelity")
            run = self.run
            refs = {video_name(r["prompt"], r["index"]) for r in run.records(run.reference)}
            for name in sorted(self._reference_todo(refs)):
                self._score_reference(name, run.load_frames(run.reference, name))

    def _ready(self, pair: Pair) -> bool:
        return self.run.is_done(self.run.reference, pair[1])

    def _score(self, vid: str, name: str, chunk_frames: int | None, first: int | None) -> None:
        run = self.run
        if self._ref is None or self._ref[0] != name:
            self._ref = (name, run.load_frames(run.reference, name))
            if not distributed.active():  # under torchrun: rank 0 in merge()
                self._score_reference(name, self._ref[1])
        current = self._saved("fidelity", vid, name)
        frames = None
        if current is None or _stale(current, self.scorer):
            frames = run.load_frames(vid, name)
            s = self._compare(self._ref[1], frames, name, chunk_frames, first)
            entry = s.to_dict(per_frame=True) | {"lpips_status": self.status}
            save_scores(run, "fidelity", vid, {name: entry})
        self._check_prompt(vid, name, frames, chunk_frames)
        self._score_pruned(vid, name, frames, chunk_frames, first)
        distributed.beat()
        if self._progress:
            self._progress.advance(self._task)

    def _score_pruned(
        self,
        vid: str,
        name: str,
        frames: torch.Tensor | None,
        chunk_frames: int | None,
        first: int | None,
    ) -> None:
        """Save the score of a pruned and quantized video against its pruned 16-bit video when
        the run has one and none is saved (module :mod:`jbkv_cli.run.pruned_base`); queued for
        :meth:`finish` when that video is not done yet."""
        run = self.run
        if vid not in self._bases:
            self._bases = pruned_baselines(run.variants())
        base = self._bases.get(vid)
        if base is None:
            return
        if not run.is_done(base, name):
            self._later.append((vid, name, chunk_frames, first))
            return
        current = self._saved(PRUNED16, vid, name)
        if current is not None and not _stale(current, self.scorer):
            return
        if self._base is None or self._base[:2] != (base, name):
            self._base = (base, name, run.load_frames(base, name))
        frames = run.load_frames(vid, name) if frames is None else frames
        s = self._compare(self._base[2], frames, name, chunk_frames, first)
        entry = s.to_dict(per_frame=True) | {"lpips_status": self.status, "against": base}
        save_scores(run, PRUNED16, vid, {name: entry})

    def _compare(self, ref, frames, name: str, chunk_frames: int | None, first: int | None):
        """``frames`` scored against ``ref`` (whole video, per frame and per chunk)."""
        return compare_videos(
            ref,
            frames,
            0,
            self.scorer,
            name=name,
            chunk_frames=chunk_frames,
            first_chunk_frames=first,
        )

    def _saved(self, kind: str, vid: str, name: str) -> dict[str, Any] | None:
        """One video's saved entry of ``kind`` (its own file, else the variant's file of an older
        run, read once); None when there is none or it is damaged (one warning: made again)."""
        path = self.run.score_path(kind, vid, name)
        if path.exists():
            return self.run.read_score_file(path, kind)
        if (kind, vid) not in self._older:
            older = self.run.metrics_path(kind, vid)
            self._older[kind, vid] = self.run.read_score_map(older, kind=kind)
        return self._older[kind, vid].get(name)

    def _unchecked(self, entry: dict[str, Any] | None) -> bool:
        """Whether a video's prompt check is to be made: the model has a check, and no entry is
        saved or the saved one is of another version of it (no version: 1)."""
        if self.check is None:
            return False
        return entry is None or entry.get("check_version", 1) != self.check_version

    def _check_prompt(
        self, vid: str, name: str, frames: torch.Tensor | None, chunk_frames: int | None
    ) -> None:
        """Save the model's prompt check of one video when there is a check and none saved."""
        run = self.run
        if not self._unchecked(self._saved("prompt", vid, name)):
            return
        frames = run.load_frames(vid, name) if frames is None else frames
        record = run.record(vid, name)
        if record is None:
            return
        assert self.check is not None  # _unchecked is False without a check
        valid = self.check(run.case(record["prompt"]), frames)
        entry = {
            "valid_per_chunk": [bool(v) for v in valid],
            "chunk_frames": chunk_frames or 1,
            "check_version": self.check_version,
        }
        save_scores(run, "prompt", vid, {name: entry})

    def _score_reference(self, name: str, frames: torch.Tensor) -> None:
        """The reference video's own prompt check and its floor, when missing."""
        run = self.run
        record = run.record(run.reference, name)
        if record is None:
            return
        chunk_frames, first = _chunks(record, run.manifest.get("settings", {}))
        self._check_prompt(run.reference, name, frames, chunk_frames)
        source = self._floor_source(name)
        if source is None or self._saved("floor", run.reference, name) is not None:
            return
        s = compare_videos(
            run.load_frames(run.reference, source),
            frames,
            0,
            None,
            name=name,
            chunk_frames=chunk_frames,
            first_chunk_frames=first,
        )
        entry = s.to_dict(per_frame=False) | {"against": source}
        save_scores(run, "floor", run.reference, {name: entry})


def score_fidelity(run: RunDir, *, lpips: bool = True, show_progress: bool = True) -> str:
    """Score every finished video of ``run`` that has no current score (``report --score``;
    resumable). Per-chunk (drift) scores use each video's chunk length (:func:`chunk_frames_of`).
    Under torchrun rank 0 lists the missing pairs and deals them out by reference (each reference
    is decoded by one rank); each score goes to its own file (:mod:`jbkv_cli.run.shards`).

    Returns the LPIPS status line (its description, or why it is unavailable).
    """
    scoring = Scoring(run, lpips=lpips)
    todo = distributed.from_rank0(scoring.missing, "listing the pairs to score")
    mine = _deal(todo)
    with counting_progress(show_progress and bool(mine)) as progress:
        scoring.start(mine, progress)
        scoring.finish()
    distributed.wait_for_peers("scoring")
    scoring.merge()
    return scoring.status


def _deal(pairs: list[Pair]) -> list[Pair]:
    """This rank's share of ``pairs``: those of its share of their references (round-robin), so
    each reference is decoded by one rank."""
    mine = set(distributed.shard(list(dict.fromkeys(p[1] for p in pairs))))
    return [p for p in pairs if p[1] in mine]


def _chunks(record: dict[str, Any], settings: dict[str, Any]) -> tuple[int | None, int | None]:
    """A video's chunk length and its first chunk's (:mod:`jbkv_cli.metrics.chunks`)."""
    return chunk_frames_of(record, settings), first_chunk_frames_of(record, settings)


def _stale(entry: dict[str, Any], scorer) -> bool:
    """Recompute an entry that lacks LPIPS when LPIPS has become available."""
    return scorer is not None and entry.get("lpips") is None
