"""Forcing-KV as its official code runs it (arXiv 2605.09681; ``zju-jiyicheng/Forcing-KV@50ac1f45``).

Sources, read for every rule below (``M`` = ``wan/modules/causal_model_forcingkv.py``, ``C`` =
``configs/forcing-kv/forcingkv_self_forcing_inference.yaml``; line numbers at that commit):

- **Knobs and defaults** (C:12-25): ``sink_size 1`` (``model_kwargs``), ``ar_start 1``,
  ``spatial_context_length 1``, ``temporal_context_length 1``, ``dynamic_context_length 1``,
  ``dynamic_temporal_enabled true``, ``num_frame_patch 6``, ``sim_retention_ratio 0.33``. jbkv's
  options carry upstream's names and these defaults (``num_frame_patch`` and
  ``dynamic_context_length`` resolve per model, see below). Lengths are in latent frames.
- **Before the split** (M:395-420): every layer keeps the sink (the first ``sink_size`` frames of
  the video) and the last ``H = max(spatial, temporal)`` frames after it (``local_k``), for all
  heads; so after chunk 0 of Self-Forcing it holds frames 0 and 2, after chunk 1 frames 0 and 5.
- **The split** (M:1361-1362, 910-983): after the clean update pass of chunk ``ar_start``
  (``AR_step == ar_start``) every layer but layer 0 splits its heads by the offline profile
  (:mod:`jbkv_cli.prune.profile`): static heads keep the sink and a ring of the last
  ``spatial_context_length`` frames, dynamic heads the sink, a ring of the last
  ``temporal_context_length`` frames and an empty buffer of ``dynamic_context_length`` frames.
  **Layer 0 is never split** (M:393 ``layer_idx != 0``): sink + ``H`` frames for good.
- **Every later chunk** (M:475-562): static heads append the chunk to their ring; dynamic heads
  first refill the buffer (``dynamic_compression``, M:221-336), then append to their ring.
  The candidates are the first 3 frames of ``[ring | new chunk]`` — the frames leaving the ring
  (M:280-283: the old ring frames and the first ``3 − T`` new ones), each cut into
  ``num_frame_patch`` runs of consecutive tokens (M:287-292, 312-317): 18 patches. A patch's
  score is the mean over its tokens of the cosine between the token and the co-located token of
  the next frame, over the keys of **all dynamic heads flattened** (M:293-294), **batch 0**
  (M:286 ``[:1]``); the ``round(18 × 0.33) = 6`` least similar (M:262, 298 ``topk(largest=
  False)``) are copied into the buffer in index order (M:299, 164-181), **overwriting** it
  (``copy_``): older selections are gone. The selection is computed **at layer 1 only** and
  shared by every layer (M:285-310, class attributes ``shared_dynamic_chunk_indices``); with no
  frame in the ring yet (fewer than one frame, M:243-246) no buffer is kept that chunk.
  Upstream requires ``dynamic_context_length · num_frame_patch == round(18 · ratio)``
  (M:254-265) and whole patches (M:241).
- **Twice-held patches** (M:91-116 ``_allocate_ring_cache``, M:459-463 the read): the dynamic
  ring starts at the split with the last ``min(T, 3·(ar_start + 1) − sink_size)`` frames. When
  that is fewer than ``T`` the ring is only partly full, so at the next chunk the candidates
  (the ring's ``r < T`` frames and the first ``3 − r`` new ones) include new frames that stay
  in the ring after the append: their chosen patches sit in the buffer *and* in the ring, and
  the read ``cat[sink, buffer, ring, cur]`` attends them twice (until the next chunk's
  refill). jbkv reproduces that multiplicity: the pruner hands the cache a count per token
  (2 for those patches), the token is stored once with its count, and attention adds
  ``ln 2`` to its score (:func:`~jbkv_cli.attention.attend.key_mask`), which is the softmax
  over the duplicated rows. Bytes: stored once, plus one byte of count per kept token of such
  a lane (upstream's buffer is a separate copy).

So after the ring fills every layer holds a constant budget: Self-Forcing keeps, per layer
1..29, the sink frame + 1 frame per static head and the sink + 1 + 1 (buffer) frames per dynamic
head; layer 0 the sink + 1 frame. Attention reads exactly what is kept (static and dynamic heads
alike read sink, buffer and ring; M:457-463) and the current chunk.

**How jbkv runs it.** The cache commits each finished chunk's clean keys once (the update pass);
this pruner decides at each commit which tokens each (layer, KV head) keeps, the new chunk's and
those of chunks committed earlier (dropped tokens are removed from the stored tensors; prune,
then quantize what is kept: :mod:`jbkv_cli.kvcache.pruned`). Chunk ``s`` holds frames
``s·C .. s·C + C − 1`` (``C`` latent frames per chunk, 3 on Self-Forcing). Choices where the
source is silent or the geometry differs from Self-Forcing's:

- **Frames per chunk.** Upstream hard-codes 3 (Self-Forcing's chunk). jbkv takes ``C`` from the
  committed chunk: the candidates are the first ``C`` frames of ``[ring | new chunk]`` (the
  frames that leave the ring when the ring is full; exactly upstream's rule at ``C = 3``), so a
  chunk scores ``C · P`` patches and keeps ``round(C · P · ratio)``: 6 of 18 on Self-Forcing, 11
  of 32 on the embedded model (4-frame chunks of 8 runs), 10 of 30 on SkyReels-V2 (5 frames)
  and on MAGI-1 at 720×720 (6 frames of 5 runs), 12 of 36 on MAGI-1 at 720×1280. ``temporal_context_length`` keeps upstream's bound 1..3; above
  ``C`` (2-frame chunks) the candidates are the ring's oldest ``C`` frames, as the same rule says.
- **Patches per frame.** ``num_frame_patch`` must divide a frame's tokens (upstream's rule). Left
  unset it is 6 where 6 divides the frame (Self-Forcing's 1,560 = 30×52 tokens: 260-token runs,
  5 patch rows; SkyReels-V2's 2,040; MAGI-1's 3,600 at 720×1280) and otherwise the divisor of
  the frame's tokens nearest 6, ties to the larger (MAGI-1's 2,025 at 720×720: 5; the embedded
  model's 8×8 frames: 8 runs of one row; the tiny random configurations' 4-token frames: 4).
- **Buffer size.** ``dynamic_context_length`` left unset is what the ratio keeps,
  ``round(C·P·ratio) / P`` frames (1 on Self-Forcing, its config's value). Given, it must agree
  as upstream requires; that needs ``C``, so it is checked at the first commit.
- **Layer deciding the selection.** Layer 1, as upstream. When layer 1 has no dynamic head,
  upstream does not fail (torch 2.14): its similarity runs over zero channels, every patch
  scores 0 (the cosine of empty vectors) and ``topk`` picks among ties, an order the kernel
  decides (on a CPU: 10-14 and 16 of 18), so the buffer holds arbitrary patches. jbkv lets
  the first layer after it that has a dynamic head decide instead (a choice; the layers in
  between have no dynamic head to apply it to).
- **Batch.** Batch 0 decides for the whole batch, as upstream. jbkv's models run one sample per
  cache (SkyReels-V2's CFG branches have a cache each), so it matters only for direct use.
- **Exact keys.** The similarity uses the exact post-RoPE keys the cache is handed, never the
  quantized ones (upstream's cache is 16-bit), so a 16-bit and an INT2 variant keep the same
  tokens. The deciding layer therefore holds the exact keys of its dynamic heads' ring frames
  (batch 0) for the next chunk's comparison; they are counted in the cache's bytes (class
  ``dynamic``). Similarities are computed in float32; ties in the ranking go to the earlier
  patch (``torch.topk`` leaves them to the kernel). Classes are per KV head (the cache stores
  KV heads; upstream's models are MHA).
- **Cache window and sinks.** Pruning keeps a subset of what the variant's cache holds: the
  model's window (whole chunks, jbkv's ``window``) still evicts, so the sink frame lives as long
  as chunk 0 is in the window — always on Self-Forcing's default 7 chunks (window 6); upstream's
  Forcing-KV path has no window, so use ``--window`` larger than the video to keep the sink for
  good (the embedded model's default window of 2 chunks drops it from the 4th chunk on; MAGI-1's
  default window is only what its kv ranges need, so there the cache keeps what lies in the
  chunks those ranges read). Sink chunks of the cache (``KVSpec.sink_chunks``) are kept whole
  by the cache and are neither sink nor history here. Byte classes: ``static``, ``dynamic`` (layers ≥ 1, by profile) and
  ``unsplit`` (layer 0).
- **Not exposed / not reproduced:** ``dynamic_temporal_enabled false`` (dynamic heads without a
  buffer), the recache and prompt-switch paths (LongLive interactive), TeaCache, the
  SageAttention FP8 option, the Triton kernels and speed-ups (attention here runs over the cached
  chunks with dropped tokens masked), the sink frozen at the split when ``sink_size`` exceeds
  the frames generated by then (jbkv: the first ``sink_size`` frames, always), and the paper's
  numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from jbkv_cli.prune.base import Decision, KVPruner
from jbkv_cli.prune.forcing_kv_history import percent_id
from jbkv_cli.prune.profile import HeadProfile, default_profile_path, load_profile, read_profile
from jbkv_cli.utils.fields import option
from jbkv_cli.utils.host_reads import device_copy

UPSTREAM_PATCHES = 6  # num_frame_patch of the Self-Forcing config
MAX_FRAMES = 1024
MAX_PATCHES = 2**16
MAX_AR_START = 2**20

FrameId = tuple[int, int]  # (chunk serial, frame in the chunk)


# --- the rules (pure functions) -----------------------------------------------------------------


def default_patches(frame_tokens: int) -> int:
    """``num_frame_patch`` left unset: 6 where it divides the frame, else the divisor of
    ``frame_tokens`` nearest 6 (ties: the larger)."""
    divisors = [p for p in range(1, frame_tokens + 1) if frame_tokens % p == 0]
    return min(divisors, key=lambda p: (abs(p - UPSTREAM_PATCHES), -p))


def kept_patches(candidates: int, ratio: float) -> int:
    """``round(candidates · ratio)`` within ``0..candidates`` (upstream M:262-263; Python's
    round, as upstream's ``int(round(...))``)."""
    return max(0, min(candidates, round(candidates * ratio)))


def patch_scores(chain: torch.Tensor, patches: int) -> torch.Tensor:
    """``[F + 1, T, X] -> [F, P]``: per frame ``j`` and patch ``p`` (a run of ``T / P``
    consecutive tokens) the mean over its tokens of ``cos(token of frame j, same token of frame
    j + 1)``, ``X`` the flattened keys of the deciding heads (upstream M:286-294), float32."""
    x = chain.float()
    cos = F.cosine_similarity(x[:-1], x[1:], dim=-1)  # [F, T]
    return cos.unflatten(-1, (patches, -1)).mean(-1)


def least_similar_index(scores: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` lowest of ``scores [F, P]`` as flat indices ``j · P + p`` (int64, on the scores'
    device, lowest first; ties: the earlier index; upstream M:296-299). No host read: the
    selection stays a tensor (n, a Python int, is its shape)."""
    return torch.argsort(scores.flatten(), stable=True)[:n]


def least_similar(scores: torch.Tensor, n: int) -> list[int]:
    """:func:`least_similar_index` as ascending Python ints (a host read: for inspection)."""
    return sorted(least_similar_index(scores, n).tolist())


# --- the state shared by a model's layers -------------------------------------------------------


@dataclass
class SharedSelection:
    """The patches the deciding layer chose for the chunk it committed last, read by the later
    layers committing the same chunk (upstream's class attributes, M:185-186, 304-308): the
    candidate frames and the chosen flat indices ``j · P + p`` into them (a tensor on the
    device, :func:`least_similar_index`; None: no buffer this chunk)."""

    serial: int | None = None
    candidates: list[FrameId] = field(default_factory=list)
    picks: torch.Tensor | None = None

    def publish(self, serial: int, candidates: list[FrameId], picks: torch.Tensor | None) -> None:
        self.serial, self.candidates, self.picks = serial, candidates, picks

    def read(self, serial: int, layer: int) -> tuple[list[FrameId], torch.Tensor | None]:
        if self.serial != serial:
            raise RuntimeError(
                f"forcing-kv: layer {layer} committed chunk {serial} before the deciding layer"
            )
        return self.candidates, self.picks


@dataclass
class Marks:
    """What makes a frame's mask, known without reading it: per KV head the rings holding the
    frame whole, and the chunk whose buffer selection may hold some of its patches (None: no
    selection reads it). Two frames with equal marks have equal masks."""

    whole: list[int]
    picked: int | None = None

    @property
    def held(self) -> bool:
        return any(self.whole) or self.picked is not None


@dataclass(frozen=True)
class Budget:
    """One model's resolved settings (frames, patches; see the module docstring)."""

    frame_tokens: int
    sink_size: int
    spatial: int
    temporal: int
    dynamic: int | None
    patches: int
    ratio: float
    ar_start: int

    @property
    def history(self) -> int:
        """``H``: frames after the sink kept before the split (and by layer 0)."""
        return max(self.spatial, self.temporal)

    def check_chunk(self, chunk_frames: int) -> None:
        """Upstream's consistency rule (M:254-265) once ``C`` is known."""
        n = kept_patches(chunk_frames * self.patches, self.ratio)
        if self.dynamic is not None and self.dynamic * self.patches != n:
            raise ValueError(
                f"forcing-kv: dynamic_context_length={self.dynamic} holds "
                f"{self.dynamic * self.patches} patches but sim_retention_ratio={self.ratio:g} "
                f"keeps round({chunk_frames * self.patches} × {self.ratio:g}) = {n} "
                "(upstream requires them equal; leave dynamic_context_length unset)"
            )


# --- one layer's state --------------------------------------------------------------------------


class ForcingKVLayer:
    """The decisions for one layer's cache (see the module docstring). ``kinds`` per KV head
    (``unsplit`` at layer 0); ``decides``: this layer computes the shared selection.

    Every decision is made without a host read: the masks are tensors built from Python
    bookkeeping (:class:`Marks`: which ring holds a frame, which buffer selection may) and the
    buffer's selection, a tensor of patch indices whose count is a shape; which earlier frames
    changed is read from the marks, not from the masks."""

    def __init__(
        self,
        layer: int,
        kinds: tuple[str, ...],
        budget: Budget,
        shared: SharedSelection,
        decides: bool = False,
    ) -> None:
        self.layer = layer
        self.kinds = ("unsplit",) * len(kinds) if layer == 0 else tuple(kinds)
        self.budget = budget
        self.shared = shared
        self.decides = decides
        self.static = [h for h, k in enumerate(self.kinds) if k == "static"]
        self.dynamic = [h for h, k in enumerate(self.kinds) if k == "dynamic"]
        # the same, to index with (copied to the device once: host_reads.device_copy)
        self._heads = {
            "static": torch.tensor(self.static, dtype=torch.long),
            "dynamic": torch.tensor(self.dynamic, dtype=torch.long),
        }
        # the deciding layer of a model whose layer 1 has no dynamic head uses its own dynamic
        # heads; every deciding layer has one (ForcingKV.plans)
        self.chunk_frames: int | None = None
        self.history: list[FrameId] = []  # frames after the sink, oldest first (at most H)
        self.kept: dict[FrameId, torch.Tensor] = {}  # [Hkv, T] counts, frames after the sink
        self.marks: dict[FrameId, Marks] = {}  # what made each of those masks
        self.ring_keys: dict[FrameId, torch.Tensor] = {}  # deciding layer: [T, X], batch 0

    def _index(self, kind: str, device: torch.device) -> torch.Tensor:
        return device_copy(self._heads[kind], device)

    # -- the protocol ----------------------------------------------------------------------------

    def commit(self, serial: int, k: torch.Tensor) -> Decision:
        """Decide on chunk ``serial``'s keys ``[B, Hkv, L, D]`` and on the earlier chunks'."""
        b, h, length, _ = k.shape
        t, bud = self.budget.frame_tokens, self.budget
        if h != len(self.kinds):
            raise ValueError(f"the head profile has {len(self.kinds)} KV heads, the chunk {h}")
        if length % t:
            raise ValueError(f"a chunk of {length} tokens is not whole frames of {t} tokens")
        c = length // t
        if self.chunk_frames is None:
            bud.check_chunk(c)
            self.chunk_frames = c
        elif c != self.chunk_frames:
            raise ValueError(
                f"forcing-kv: a chunk of {c} frames after chunks of {self.chunk_frames}"
            )
        new = [(serial, f) for f in range(c)]
        sink = [self._sink(fid) for fid in new]
        post = [fid for fid, is_sink in zip(new, sink, strict=True) if not is_sink]
        before = self.history
        history = (before + post)[-bud.history :]
        now, marks = self._kept_after(serial, before, post, history, k)
        keep = torch.zeros(h, length, dtype=torch.uint8, device=k.device)
        for f, fid in enumerate(new):
            if sink[f]:
                keep[:, f * t : (f + 1) * t] = 1
            elif fid in now:
                keep[:, f * t : (f + 1) * t] = now[fid]
        settled = []
        for fid, was in self.kept.items():
            if marks.get(fid) != self.marks[fid]:  # equal marks: an equal mask
                mask = now.get(fid)
                mask = torch.zeros_like(was) if mask is None else mask
                settled.append((fid[0], fid[1] * t, mask.expand(b, -1, -1)))
        self.kept, self.marks, self.history = now, marks, history
        if self.decides:  # the ring's exact keys, for the next chunk's comparison
            ring = history[-bud.temporal :]
            self.ring_keys = {fid: self._key(fid, serial, k).clone() for fid in ring}
        touched = {serial} | {s for s, _, _ in settled}
        return Decision(keep.expand(b, -1, -1), settled, {s: self._held(s) for s in touched})

    def forget(self, serials: set[int]) -> None:
        self.history = [fid for fid in self.history if fid[0] not in serials]
        self.kept = {fid: m for fid, m in self.kept.items() if fid[0] not in serials}
        self.marks = {fid: m for fid, m in self.marks.items() if fid[0] not in serials}
        self.ring_keys = {fid: x for fid, x in self.ring_keys.items() if fid[0] not in serials}

    def nbytes_by_kind(self) -> dict[str, int]:
        """The deciding layer's exact ring keys (for the next chunk's similarity)."""
        held = sum(x.numel() * x.element_size() for x in self.ring_keys.values())
        return {"dynamic": held} if held else {}

    # -- the rules -------------------------------------------------------------------------------

    def _sink(self, fid: FrameId) -> bool:
        return fid[0] * self.chunk_frames + fid[1] < self.budget.sink_size

    def _held(self, serial: int) -> tuple[int, ...]:
        """Per KV head, the most tokens of chunk ``serial`` a batch row holds (for
        :attr:`Decision.held`): sink frames and frames a ring holds whole, and of a frame the
        buffer selection may read, the selection's tokens (all in that frame at most)."""
        bud, t = self.budget, self.budget.frame_tokens
        size = t // bud.patches
        chosen = kept_patches(self.chunk_frames * bud.patches, bud.ratio)
        buffer = min(t, chosen * size)
        out = [0] * len(self.kinds)
        for f in range(self.chunk_frames):
            fid = (serial, f)
            marks = self.marks.get(fid)
            for head in range(len(out)):
                if self._sink(fid) or (marks is not None and marks.whole[head]):
                    out[head] += t
                elif marks is not None and marks.picked is not None and head in self.dynamic:
                    out[head] += buffer
        return tuple(out)

    def _kept_after(
        self,
        serial: int,
        before: list[FrameId],
        post: list[FrameId],
        history: list[FrameId],
        k: torch.Tensor,
    ) -> tuple[dict[FrameId, torch.Tensor], dict[FrameId, Marks]]:
        """``{frame: uint8 [Hkv, T]}``: how many times each head holds each token after the
        sink after this commit — once in a ring, once more in the buffer (twice when a
        candidate stays in the ring, as upstream's ``cat[sink, buffer, ring, cur]``) — and the
        frames' :class:`Marks`; frames no ring and no buffer selection holds are absent."""
        bud, t, h = self.budget, self.budget.frame_tokens, len(self.kinds)
        now: dict[FrameId, torch.Tensor] = {}
        marks: dict[FrameId, Marks] = {}

        def frame(fid: FrameId) -> tuple[torch.Tensor, Marks]:
            if fid not in now:
                now[fid] = torch.zeros(h, t, dtype=torch.uint8, device=k.device)
                marks[fid] = Marks([0] * h)
            return now[fid], marks[fid]

        def whole(fid: FrameId, kind: str | None) -> None:
            heads = range(h) if kind is None else getattr(self, kind)
            if not heads:
                return
            mask, held = frame(fid)
            mask[slice(None) if kind is None else self._index(kind, k.device)] += 1
            for head in heads:
                held.whole[head] += 1

        if self.layer == 0 or serial < bud.ar_start:  # unsplit: sink + H frames, every head
            for fid in history:
                whole(fid, None)
            return now, marks
        for fid in history[-bud.spatial :] if bud.spatial else ():
            whole(fid, "static")
        for fid in history[-bud.temporal :]:
            whole(fid, "dynamic")
        if serial > bud.ar_start:  # the buffer, overwritten (chunk ar_start splits only)
            candidates, picks = self._picks(serial, before[-bud.temporal :], post, k)
            if picks is not None and self.dynamic:
                size = t // bud.patches
                chosen = torch.zeros(
                    len(candidates) * bud.patches, dtype=torch.uint8, device=k.device
                )
                chosen.index_fill_(0, picks, 1)
                tokens = chosen.view(len(candidates), -1).repeat_interleave(size, dim=-1)
                dynamic = self._index("dynamic", k.device)
                for j, fid in enumerate(candidates):
                    mask, held = frame(fid)
                    mask[dynamic] += tokens[j]
                    held.picked = serial
        return now, marks

    def _picks(
        self, serial: int, ring: list[FrameId], post: list[FrameId], k: torch.Tensor
    ) -> tuple[list[FrameId], torch.Tensor | None]:
        """The buffer's candidate frames and chosen patches for this chunk (flat indices into
        the candidates' patches): computed by the deciding layer, read by the others
        (M:285-310)."""
        if not self.decides:
            return self.shared.read(serial, self.layer) if self.dynamic else ([], None)
        c, bud = self.chunk_frames, self.budget
        seq = ring + post
        candidates: list[FrameId] = []
        picks = None
        if ring and len(seq) > c:
            chain = torch.stack([self._key(fid, serial, k) for fid in seq[: c + 1]])
            n = kept_patches(c * bud.patches, bud.ratio)
            candidates, picks = seq[:c], least_similar_index(patch_scores(chain, bud.patches), n)
        self.shared.publish(serial, candidates, picks)
        return candidates, picks

    def _key(self, fid: FrameId, serial: int, k: torch.Tensor) -> torch.Tensor:
        """``[T, X]``: frame ``fid``'s keys of this layer's dynamic heads, batch 0, flattened
        per token (from the new chunk, else from the ring kept at the last commit)."""
        if fid[0] != serial:
            return self.ring_keys[fid]
        t = self.budget.frame_tokens
        x = k[0, self._index("dynamic", k.device), fid[1] * t : (fid[1] + 1) * t]  # [Hd, T, D]
        return x.transpose(0, 1).flatten(1)


# --- the pruner ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForcingKV(KVPruner):
    """Forcing-KV with upstream's knobs (names and Self-Forcing defaults of its config; lengths
    in latent frames): ``sink_size``, ``spatial_context_length`` (static heads' ring),
    ``temporal_context_length`` (dynamic heads' ring, 1..3), ``dynamic_context_length`` (the
    buffer; None: what the ratio keeps), ``num_frame_patch`` (None: 6, or the frame's divisor
    nearest 6), ``sim_retention_ratio``, ``ar_start`` (the chunk after whose commit heads split),
    and ``profile`` (a JSON file from ``jbkv profile-heads``; None: the one shipped for the model,
    made by upstream's rule).

    A ``profile`` given by path is validated when the pruner is built and stored as its absolute
    path with ``profile_sha256``, the digest of its bytes (in the variant id), so a run folder
    records which profile it used and is read back without the file."""

    name: ClassVar[str] = "forcing-kv"
    title: ClassVar[str] = "Forcing-KV"
    short: ClassVar[str] = "forcingkv"
    summary: ClassVar[str] = (
        "Forcing-KV as its official code: static heads keep the sink and the last frame, "
        "dynamic heads also a one-frame buffer of the patches that change most, refilled "
        "every chunk; layer 0 unsplit"
    )

    sink_size: int = option(1, "int", lo=0, hi=MAX_FRAMES)
    spatial_context_length: int = option(1, "int", lo=0, hi=MAX_FRAMES)
    temporal_context_length: int = option(1, "int", lo=1, hi=3, note="upstream's dynamic mode")
    dynamic_context_length: int | None = option(None, "int", lo=0, hi=MAX_FRAMES, optional=True)
    num_frame_patch: int | None = option(None, "int", lo=1, hi=MAX_PATCHES, optional=True)
    sim_retention_ratio: float = option(0.33, "float", lo=0, hi=1)
    ar_start: int = option(1, "int", lo=0, hi=MAX_AR_START)
    profile: str | None = option(None, "path", optional=True)
    profile_sha256: str | None = option(
        None, "str", optional=True, pattern="[0-9a-f]{64}", what="a SHA-256 digest", cli=False
    )

    ID_PARTS: ClassVar[dict[str, str]] = {
        "sink_size": "sink",
        "spatial_context_length": "sc",
        "temporal_context_length": "tc",
        "dynamic_context_length": "dc",
        "num_frame_patch": "np",
        "ar_start": "ar",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.profile is not None and self.profile_sha256 is None:
            path = Path(self.profile).resolve()
            _, data = read_profile(path)  # validated before any work; read once
            object.__setattr__(self, "profile", str(path))
            object.__setattr__(self, "profile_sha256", hashlib.sha256(data).hexdigest())

    def profile_path(self, model: str) -> Path:
        return Path(self.profile) if self.profile else default_profile_path(model, "forcing-kv")

    def head_profile(self, model: str) -> HeadProfile:
        """The profile for ``model``; ``ValueError`` (naming the file) when it is unusable."""
        path = self.profile_path(model)
        if self.profile is None and not path.is_file():
            raise ValueError(
                f"forcing-kv has no head profile for model {model!r}: make one with "
                f"`jbkv profile-heads --model {model} --out FILE` and pass "
                "-M forcing-kv.profile=FILE"
            )
        profile = load_profile(path)
        if profile.model != model:
            raise ValueError(f"{path} profiles model {profile.model!r}, not {model!r}")
        return profile

    def check(self, model: str) -> None:
        self.head_profile(model)

    def budget(self, frame_tokens: int) -> Budget:
        """The settings resolved for frames of ``frame_tokens`` tokens."""
        patches = self.num_frame_patch or default_patches(frame_tokens)
        if frame_tokens % patches:
            raise ValueError(
                f"num_frame_patch={patches} does not divide a frame's {frame_tokens} tokens "
                "(upstream cuts frames into whole patches)"
            )
        return Budget(
            frame_tokens,
            self.sink_size,
            self.spatial_context_length,
            self.temporal_context_length,
            self.dynamic_context_length,
            patches,
            self.sim_retention_ratio,
            self.ar_start,
        )

    def plans(
        self, model: str, layers: int, kv_heads: int, frame_tokens: int
    ) -> list[ForcingKVLayer]:
        profile = self.head_profile(model)
        if profile.layers != layers or len(profile.heads[0]) != kv_heads:
            raise ValueError(
                f"{self.profile_path(model)} has {profile.layers} layers x "
                f"{len(profile.heads[0])} heads; {model} has {layers} x {kv_heads}"
            )
        budget = self.budget(frame_tokens)
        decider = deciding_layer(profile.heads)
        shared = SharedSelection()
        return [
            ForcingKVLayer(i, kinds, budget, shared, decides=i == decider)
            for i, kinds in enumerate(profile.heads)
        ]

    def extra_id(self) -> list[str]:
        defaults = {f.name: f.default for f in fields(self)}
        parts = []
        for name, tag in self.ID_PARTS.items():
            value = getattr(self, name)
            if value != defaults[name]:
                parts.append(f"{tag}{value}")
        if self.sim_retention_ratio != defaults["sim_retention_ratio"]:
            parts.append(f"r{percent_id(self.sim_retention_ratio)}")
        if self.profile_sha256 is not None:
            parts.append(f"p{self.profile_sha256[:8]}")
        return parts


def deciding_layer(heads: tuple[tuple[str, ...], ...]) -> int | None:
    """Layer 1 (upstream), or the first later layer with a dynamic head when layer 1 has none;
    None when no layer after 0 has one (nothing to select for)."""
    return next((i for i, kinds in enumerate(heads) if i >= 1 and "dynamic" in kinds), None)
