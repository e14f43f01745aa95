"""No host syncs in any registered model's chunk loop: each model's tiny random config runs
``model.generate`` on a fake CUDA device (``jbkv_cli/utils/fake_cuda.py``: device tensors have
shapes and no values, a host read of one raises ``HostSync``, host <-> device copies are
counted with their call sites), and once warm a chunk copies nothing between host and device.

**Warm** (:data:`WARM`): the first chunk copies what the loop makes on the host once per video
(the text embedding; the model itself is moved before); a cache's constants are copied the
first time a path needs them, chunk 1 storing the first compressed chunk and chunk 2 reading it.
A cache policy may start later (a span compressed after a keep-recent chunk, a 16-bit sink, a
model that commits a block one window late, a pruner's capacity settling once its first frames
are decided): so each compressed variant runs until a chunk after the first :data:`WARM` (one
more with a pruner) copies nothing, at most :data:`CHUNKS` chunks. A copy made every chunk
never gets there. The 16-bit reference run goes to the end of its video, every chunk after the
first :data:`WARM` copying nothing (a sampler's fill and drain included).

**What runs**, in the dtype each model runs in on a GPU (bfloat16; the embedded model is
float32 only): per model the 16-bit cache first, the whole of ``generate`` (encoders and decode
too), then its compressed variants, each stopped after its quiet chunk, all on one fake device.
The whole method × correction × pruner product on every model (about 1,300 variants, seconds
each here) does not fit a test run, so each variant runs once somewhere and every model runs
its own paths: ``tiny`` (the cheapest) runs every method, method ``i`` with correction
``i + k`` (``k``: the model's place in the registry), so every correction too; model ``k > 0``
runs correction ``k − 1`` with method ``k − 1 + 7k`` (where a model does not accept the pair the
next method), so the large models together run six of the corrections with six methods; and
every model that accepts a pruner runs pruner ``k`` (mod the pruners; the next one it does not
accept it), so each pruner runs on two models or more; a pruner that bounds the cache itself
(Deep Forcing: Self-Forcing only) runs, besides, on every model that accepts it, sized to decide
within the short video. "Accepts" as ``jbkv generate`` decides:
the spec builds, the model resolves it, the method fits the head dim, a pruner has the model's
head layout and a method that stores each token on its own. The full product on one cache is
``tests/kvcache/test_no_host_sync.py``. A variant whose policy compresses nothing in so short a
video (Self-Forcing's QVG spans of 8 chunks, KIVI's 128-token residual) runs its exact path.
Known and not in this covering: QuantWM-QSAC on HY-WorldPlay copies one k-means init index
tensor per chunk (``quant/kmeans.py`` ``Draws`` keeps a device copy per token count, and
HY-WorldPlay's memory length changes from chunk to chunk).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from jbkv_cli.attention.correction import CORRECTIONS
from jbkv_cli.kvcache.pruned import check_prunable
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models import registry
from jbkv_cli.models.contract import PrunableModel, VideoModel, resolve_spec
from jbkv_cli.prune.profile import FORMAT
from jbkv_cli.prune.registry import PRUNERS
from jbkv_cli.quant.registry import METHODS
from jbkv_cli.run.experiment import with_plans
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.fake_cuda import FakeCuda
from tests.kvcache.test_no_host_sync import FEWER_ROUNDS, pruner_with_profile
from tests.models.test_contract import TINY, one_thread  # noqa: F401 (autouse: one thread)

pytestmark = pytest.mark.slow

WARM, CHUNKS = 2, 5  # chunks (module docstring)

# on top of the contract test's tiny configs: the GPU dtype, and fewer denoising steps where
# the loop is the same with them (MAGI-1: a multiple of its 2-chunk pipeline; Rolling Forcing:
# a rolling window of two blocks still fills, slides and drains)
LOOP_OPTIONS: dict[str, dict] = {
    "tiny": {},
    "magi1": {"dtype": "bfloat16", "steps": 2},
    "skyreels-v2": {"dtype": "bfloat16"},
    "self-forcing": {"dtype": "bfloat16"},
    "rolling-forcing": {"dtype": "bfloat16", "steps": 2},
    "hy-worldplay": {"dtype": "bfloat16", "steps": 1},
    "matrix-game-2": {"dtype": "bfloat16"},
}


class LoopDone(Exception):
    """Raised by the progress callback at a compressed variant's quiet chunk."""


@dataclass
class Chunks:
    """The transfers counted by the end of each chunk (at its last progress call: Rolling
    Forcing calls again while its window drains); ``stop_from``: raise :class:`LoopDone` at
    the first chunk from this one on that adds none (None: run to the end)."""

    cuda: FakeCuda
    stop_from: int | None = None

    def __post_init__(self) -> None:
        self.before = self.cuda.count()
        self.ends: dict[int, int] = {}

    def __call__(self, done: int, total: int) -> None:
        self.ends[done] = self.cuda.count()
        quiet = self.added()[-1] == 0
        if self.stop_from is not None and done >= self.stop_from and quiet:
            raise LoopDone

    def added(self) -> list[int]:
        """What each chunk added so far."""
        counts = [self.ends[d] for d in sorted(self.ends)]
        return [b - a for a, b in zip([self.before, *counts], counts, strict=False)]

    def transfers(self) -> list:
        return self.cuda.transfers[self.before :]


def _profile(model: VideoModel, folder: Path) -> str:
    """A head profile for ``model``'s layout: every layer's heads dynamic and static in turn."""
    layout = model.head_layout()
    heads = [("dynamic", "static")[h % 2] for h in range(layout["kv_heads"])]
    doc = {
        "format": FORMAT,
        "model": model.name,
        "anchor_frames": 1,
        "threshold": 0.75,
        "layers": [{"heads": heads} for _ in range(layout["layers"])],
    }
    path = folder / f"{model.name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _accepted(model: VideoModel, method: str, correction: str, pruner) -> KVSpec | None:
    """The spec as the model runs it, or None where ``jbkv generate`` would not run it."""
    try:
        built = KVSpec.build(
            method, 2, correction=correction, pruner=pruner, **FEWER_ROUNDS.get(method, {})
        )
        spec = resolve_spec(model, built)
        head_dim = model.settings.get("head_dim")
        for m in {spec.key, spec.value} - {None}:
            if head_dim is not None:
                m.check(head_dim)
                if pruner is not None:
                    check_prunable(m, head_dim, pruner)
        if pruner is not None:
            if not isinstance(model, PrunableModel):
                return None
            pruner.plans(model.name, **model.head_layout())
    except (ValueError, UsageError):
        return None
    return spec


def _variants(name: str, model: VideoModel, folder: Path) -> list[KVSpec]:
    """The compressed variants run on ``name`` (module docstring), accepted ones only."""
    methods, corrections = list(METHODS), list(CORRECTIONS)
    k = list(registry.MODELS).index(name)

    def first(pairs) -> KVSpec | None:
        return next((s for m, c, p in pairs if (s := _accepted(model, m, c, p))), None)

    def rotated(items: list, start: int) -> list:
        return [items[(start + i) % len(items)] for i in range(len(items))]

    if name == "tiny":
        specs = [
            first((m, c, None) for c in rotated(corrections, i + k)) for i, m in enumerate(methods)
        ]
    else:
        j = k - 1
        specs = [
            first((m, corrections[j], None) for m in rotated(methods, j + len(corrections) * k))
        ]
    if isinstance(model, PrunableModel):
        profile = _profile(model, folder)
        frame = model.head_layout()["frame_tokens"]
        pruners, own = [], []
        chunk_frames = model.settings.get("chunk_frames", 1)
        for p in rotated([p for p in PRUNERS if not PRUNERS[p].owns_buffer], k):
            pruner = pruner_with_profile(p, profile)
            if getattr(pruner, "segments", 0) > frame:  # the tiny frames: 4 tokens
                pruner = replace(pruner, segments=frame)
            pruners.append(pruner)
        for p in (p for p in PRUNERS if PRUNERS[p].owns_buffer):
            own.append(pruner_with_profile(p, profile, chunk_frames))
        for group in (pruners, *([p] for p in own)):
            specs.append(
                first(
                    (m, c, p)
                    for p in group
                    for c in rotated(corrections, k)
                    for m in rotated(methods, k)
                )
            )
    return list(dict.fromkeys(s for s in specs if s is not None))


@pytest.mark.parametrize("name", list(registry.MODELS))
def test_the_chunk_loop_reads_and_copies_nothing_per_chunk(name, tmp_path):
    assert set(LOOP_OPTIONS) == set(registry.MODELS), "add the model's loop options here"
    tiny = TINY[name]
    options = {**tiny.settings, **LOOP_OPTIONS[name], "num_chunks": CHUNKS}
    model = registry.load_model(name, **options)
    (case,) = with_plans(model, [tiny.case(tmp_path, CHUNKS)])
    variants = _variants(name, model, tmp_path)
    assert len(variants) >= (len(METHODS) if name == "tiny" else 1), [
        s.variant_id for s in variants
    ]
    failures = []
    with FakeCuda() as cuda:
        cuda.move(model)
        reference = Chunks(cuda)
        model.generate(case, 0, FULL_PRECISION, progress=reference)  # a host read: HostSync
        added = reference.added()
        assert len(added) == CHUNKS and added[WARM:] == [0] * (CHUNKS - WARM), (
            added,
            reference.transfers(),
        )
        for spec in variants:
            run = Chunks(cuda, stop_from=WARM + 1 + (spec.pruner is not None))
            try:
                model.generate(case, 0, spec, progress=run)
            except LoopDone:
                continue
            failures.append((spec.variant_id, run.added(), run.transfers()))
    assert not failures, failures
