"""The llm-prefill job: every (example, chunk size, variant) missing from the run, scored.

Order of work (one process, or each rank of a ``torchrun`` job):

1. rank 0 makes the variant folders and lists the examples with at least one record missing
   (:func:`~jbkv_cli.utils.distributed.from_rank0`: every rank gets the same list);
2. each rank takes its share (:func:`~jbkv_cli.utils.distributed.shard`, round-robin), and per
   example runs the exact prefix once and each missing variant's chunk over it
   (:func:`~jbkv_cli.llm.prefill.score_example`), writing one record per variant as it is done;
3. the ranks meet and the summary counts every rank's work; rank 0 then writes the report.

A rank only ever writes the records of its own examples, so no file has two writers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.llm.data import Example
from jbkv_cli.llm.models import LoadedLM
from jbkv_cli.llm.prefill import score_example, summary
from jbkv_cli.llm.run import LlmRun
from jbkv_cli.utils import distributed
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.progress import counting_progress

SAMPLES = 512  # per-query ΔP_S values kept per record (for histograms)


@dataclass
class Summary:
    scored: int = 0  # (example, variant) records written
    skipped: int = 0  # already done
    seconds: float = 0.0
    peak_kv_bytes: int = 0
    per_rank: list[int] = field(default_factory=list)


def _record(ex: Example, vid: str, result, prefix_seconds: float) -> dict:
    samples = result.delta_ps
    if len(samples) > SAMPLES:
        step = len(samples) / SAMPLES
        samples = [samples[int(i * step)] for i in range(SAMPLES)]
    return {
        "document": ex.document,
        "bin": [ex.bin.lo, ex.bin.hi],
        "chunk": ex.chunk,
        "prefix": ex.prefix,
        "variant": vid,
        **summary(result),
        "prefix_seconds": prefix_seconds,
        "rank": distributed.rank(),
        "world_size": distributed.world_size(),
        "delta_ps_samples": samples,
    }


def run_jobs(
    lm: LoadedLM,
    run: LlmRun,
    specs: list[KVSpec],
    examples: list[Example],
    *,
    diagnostics: bool = True,
    backend: str | None = None,
    show_progress: bool = True,
) -> Summary:
    """Score every missing (example, variant) of ``examples`` × ``specs`` into ``run``."""

    def missing() -> tuple[list[str], list[int], int]:
        vids = [run.ensure_variant(s) for s in specs]
        todo, done = [], 0
        for i, ex in enumerate(examples):
            left = sum(not run.is_done(v, ex.key) for v in vids)
            done += len(vids) - left
            if left:
                todo.append(i)
        return vids, todo, done

    vids, todo, done = distributed.from_rank0(missing, "listing the jobs to run")
    mine = distributed.shard(todo)
    result = Summary(skipped=done if distributed.is_main() else 0)
    with counting_progress(show_progress) as progress:
        task = progress.add_task("examples", total=len(mine)) if progress else None
        for i in mine:
            ex = examples[i]
            if progress:
                progress.update(task, description=f"c{ex.chunk} {ex.bin.name} {ex.document[:24]}")
            left = [(s, v) for s, v in zip(specs, vids, strict=True) if not run.is_done(v, ex.key)]
            try:
                prefix, scores = score_example(
                    lm.model,
                    ex.ids,
                    ex.prefix,
                    [s for s, _ in left],
                    diagnostics=diagnostics,
                    backend=backend,
                )
            except ValueError as exc:
                raise JbkvError(f"{lm.name} on {ex.key}: {exc}") from exc
            for spec, vid in left:
                scored = scores[spec]
                run.save(vid, ex.key, _record(ex, vid, scored, prefix.seconds))
                result.scored += 1
                result.seconds += scored.seconds
                result.peak_kv_bytes = max(result.peak_kv_bytes, scored.kv_cache_bytes)
            distributed.beat()
            if progress:
                progress.advance(task)
    distributed.wait_for_peers("scoring the examples")
    parts = distributed.gather(result, "counting the jobs")
    return Summary(
        scored=sum(p.scored for p in parts),
        skipped=sum(p.skipped for p in parts),
        seconds=sum(p.seconds for p in parts),
        peak_kv_bytes=max(p.peak_kv_bytes for p in parts),
        per_rank=[p.scored for p in parts],
    )
