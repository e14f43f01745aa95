"""Forcing-KV-history: jbkv's earlier pruner *after* Forcing-KV's abstract (arXiv 2605.09681),
kept under ``forcing-kv-history`` with its behaviour and variant ids (``fkv…``) unchanged.

It was written before the official code (``zju-jiyicheng/Forcing-KV``) was public; the faithful
method is :mod:`jbkv_cli.prune.forcing_kv` (``forcing-kv``). What this one does differently:
it keeps a *history* — every older frame keeps ``⌈ρ S⌉`` of its segments for as long as the
cache window holds it, so its bytes grow with the window — where upstream keeps a fixed one-frame
buffer that each chunk overwrites; it scores segments by the cosine of segment-*mean* keys (upstream:
the mean of per-token cosines, over all dynamic heads, decided once at layer 1); it prunes layer 0
like the others; it has no attention-sink frame of its own; and its head profile counts the current
chunk plus ``A`` cached frames against the total mass (``--rule local-mass``; upstream: the last 4
key frames against the mass after the sink, ``--rule forcing-kv``). Run folders written before the
rename record the name ``forcing-kv`` with this pruner's options; they are read as this pruner
(:func:`jbkv_cli.prune.registry.pruner_from_record`), ids unchanged.

Attention heads of chunk-wise AR video diffusion models split into **static** heads, which read
the current chunk and the transition anchors (the most recent frames), and **dynamic** heads,
which read corresponding regions of older frames; the split is found once, offline, from
frame-level attention mass (:mod:`jbkv_cli.prune.profile`, ``jbkv profile-heads``) and read
from a JSON profile. With ``T`` tokens per frame, ``A = anchor_frames`` and ``S = segments`` per
frame, for every layer and KV head:

- every cached frame among the ``A`` most recent is kept whole (the transition anchors);
- when a frame ``f`` leaves the anchors (the next chunk is committed), a **static** head drops
  it entirely (structured pruning: only the anchors remain);
- a **dynamic** head splits ``f`` into ``S`` segments of consecutive tokens and compares each
  with the same segment of the next frame ``f + 1``, by the cosine similarity of their mean keys

      sim_s = cos( mean_{i∈s} k_f,i , mean_{i∈s} k_f+1,i )

  and keeps the ``⌈ρ S⌉`` segments with the *lowest* similarity (``ρ = retention``): what
  changes is kept, a segment that the next frame repeats is dropped, since the newer copy
  carries it (the chain ends at the anchors, which are kept).

Tokens are decided once, from the exact keys of the chunk being committed: a frame that leaves
the anchors inside that chunk is pruned before the chunk is quantized ("prune, then quantize
what is kept"); an anchor frame is stored (quantized) with its chunk and its dropped tokens are
removed from the stored tensors when it leaves the anchors (for per-token formats such as RTN
and QuaRot exactly the same as quantizing only the kept tokens; QVG keeps the chunk's
codebook). Attention reads the kept tokens and masks the others (``-inf``), and the cache holds
only kept tokens, their positions and the segment means of undecided anchor frames (dynamic
heads), all counted in its bytes. Sink chunks (``KVSpec.sink_chunks``) are never pruned.

Choices where the paper (as available to us) is silent, and where jbkv differs:

- **Segments** are ``S`` runs of consecutive tokens of a frame in the model's token order (rows
  of patches), ``S = 8`` by default: one 8-token row of the embedded model's 8×8 frames.
- **Similarity** is the cosine of segment-mean post-RoPE keys (the keys the cache holds) of a
  frame and its successor; the retention ``ρ = 0.33`` is a per-frame budget, so every decided
  frame of a dynamic head keeps the same number of segments (ties: the earlier segment).
- **Anchors**: ``A`` comes from the profile (the frames the classification counted as local)
  unless ``anchor_frames`` is given. Decisions use exact keys, never the quantized ones, so a
  16-bit and an INT2 variant prune the same tokens.
- **Classification** per KV head (the cache stores KV heads): the mean local mass of the query
  heads that read it (:mod:`jbkv_cli.prune.profile`).
- Not reproduced: the CUDA kernels and speed-ups (attention here runs over a buffer of the full
  window with dropped tokens masked, so it is no faster), dropping tokens per query chunk inside
  one denoising step, and the paper's numbers. It runs on every adapter that states a head
  layout (:class:`~jbkv_cli.models.contract.PrunableModel`: ``tiny``, ``self-forcing`` — the
  paper's family — ``skyreels-v2`` and ``magi1``); only the embedded model's profile is
  shipped (``profiles/tiny.json``), the others are profiled with ``jbkv profile-heads --rule
  local-mass``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from jbkv_cli.prune.base import Decision, KVPruner
from jbkv_cli.prune.profile import HeadProfile, default_profile_path, load_profile, read_profile
from jbkv_cli.utils.fields import option
from jbkv_cli.utils.host_reads import device_copy

DEFAULT_SEGMENTS = 8
DEFAULT_RETENTION = 0.33
MAX_ANCHOR_FRAMES = 1024
MAX_SEGMENTS = 2**16


# --- the rules (pure functions) -----------------------------------------------------------------


def segment_ids(frame_tokens: int, segments: int) -> torch.Tensor:
    """``[T]``: the segment of each token of a frame (``segments`` runs of consecutive tokens,
    lengths differing by at most one)."""
    if not 1 <= segments <= frame_tokens:
        raise ValueError(
            f"segments must be in 1..{frame_tokens} (tokens per frame), got {segments}"
        )
    parts = torch.tensor_split(torch.arange(frame_tokens), segments)
    return torch.cat([torch.full((len(p),), i) for i, p in enumerate(parts)])


def segment_means(k: torch.Tensor, ids: torch.Tensor, segments: int | None = None) -> torch.Tensor:
    """Mean key per segment: ``[..., F·T, D] -> [..., F, S, D]`` (float32); ``segments``: ``S``
    (default: read from ``ids``, a CPU tensor)."""
    segments = int(ids.max()) + 1 if segments is None else segments
    onehot = F.one_hot(device_copy(ids, k.device), segments).float()  # [T, S]
    frames = k.float().unflatten(-2, (-1, ids.numel()))  # [..., F, T, D]
    return torch.einsum("...td,ts->...sd", frames, onehot / onehot.sum(0))


def segment_similarity(frame: torch.Tensor, successor: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of segment means ``[..., S, D]`` of a frame and the next: ``[..., S]``."""
    return F.cosine_similarity(frame, successor, dim=-1)


def changed_count(segments: int, retention: float) -> int:
    """``⌈retention · S⌉`` (at most ``S``): the segments a dynamic head keeps of a frame."""
    return min(segments, math.ceil(retention * segments - 1e-9))


def changed_segments(similarity: torch.Tensor, retention: float) -> torch.Tensor:
    """``bool [..., S]``: the ``⌈retention · S⌉`` least similar segments (ties: the earlier)."""
    n = changed_count(similarity.shape[-1], retention)
    order = torch.argsort(similarity, dim=-1, stable=True)[..., :n]
    return torch.zeros_like(similarity, dtype=torch.bool).scatter_(-1, order, True)


# --- one layer's state --------------------------------------------------------------------------


class ForcingKVHistoryLayer:
    """The decisions for one layer's cache (see the module docstring); ``kinds`` per KV head."""

    def __init__(
        self,
        kinds: tuple[str, ...],
        frame_tokens: int,
        anchor_frames: int,
        segments: int = DEFAULT_SEGMENTS,
        retention: float = DEFAULT_RETENTION,
    ) -> None:
        if anchor_frames < 1:
            raise ValueError(f"anchor_frames must be >= 1, got {anchor_frames}")
        self.kinds = tuple(kinds)
        self.frame_tokens = frame_tokens
        self.anchor_frames = anchor_frames
        self.retention = retention
        self.ids = segment_ids(frame_tokens, segments)
        self.segments = segments
        self.dynamic = [h for h, kind in enumerate(self.kinds) if kind == "dynamic"]
        self._dynamic = torch.tensor(self.dynamic, dtype=torch.long)  # the same, to index with
        self._pending: list[tuple[int, int, torch.Tensor]] = []  # (serial, frame, means)
        self._frames: dict[int, int] = {}  # frames of each chunk held (for Decision.held)
        # the most tokens a dynamic head keeps of a decided frame: its longest segments
        base, longer = divmod(frame_tokens, segments)  # segment_ids: the first `longer` +1
        kept = changed_count(segments, retention)
        self.decided_tokens = kept * base + min(kept, longer)

    def commit(self, serial: int, k: torch.Tensor) -> Decision:
        """Decide on chunk ``serial``'s keys ``[B, Hkv, L, D]`` and on the frames that leave
        the anchors because of it."""
        b, h, length, _ = k.shape
        t = self.frame_tokens
        if h != len(self.kinds):
            raise ValueError(f"the head profile has {len(self.kinds)} KV heads, the chunk {h}")
        if length % t:
            raise ValueError(f"a chunk of {length} tokens is not whole frames of {t} tokens")
        dynamic = device_copy(self._dynamic, k.device)
        means = segment_means(k[:, dynamic], self.ids, self.segments)  # [B, Hd, F, S, D]
        frames = [*self._pending, *((serial, f, means[:, :, f]) for f in range(length // t))]
        leaving = max(0, len(frames) - self.anchor_frames)
        keep = torch.ones(b, h, length, dtype=torch.bool, device=k.device)
        settled = []
        for i, (s, f, m) in enumerate(frames[:leaving]):
            frame_keep = torch.zeros(b, h, t, dtype=torch.bool, device=k.device)
            if self.dynamic:
                sim = segment_similarity(m, frames[i + 1][2])
                changed = changed_segments(sim, self.retention)
                frame_keep[:, dynamic] = changed[..., device_copy(self.ids, k.device)]
            if s == serial:
                keep[..., f * t : (f + 1) * t] = frame_keep
            else:
                settled.append((s, f * t, frame_keep))
        self._pending = frames[leaving:]
        self._frames[serial] = length // t
        touched = {serial} | {s for s, _, _ in settled}
        return Decision(keep, settled, {s: self._held(s) for s in touched})

    def _held(self, serial: int) -> tuple[int, ...]:
        """Per KV head, the most tokens of chunk ``serial`` a batch row holds: its undecided
        frames whole, of each decided one a dynamic head's kept segments (a static head none)."""
        pending = sum(1 for s, _, _ in self._pending if s == serial)
        decided = self._frames[serial] - pending
        dynamic = set(self.dynamic)
        return tuple(
            pending * self.frame_tokens + decided * (self.decided_tokens if h in dynamic else 0)
            for h in range(len(self.kinds))
        )

    def forget(self, serials: set[int]) -> None:
        self._pending = [p for p in self._pending if p[0] not in serials]
        self._frames = {s: n for s, n in self._frames.items() if s not in serials}

    def nbytes_by_kind(self) -> dict[str, int]:
        """The segment means of undecided anchor frames (dynamic heads only)."""
        held = sum(m.numel() * m.element_size() for _, _, m in self._pending)
        return {"dynamic": held} if held else {}


# --- the pruner ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForcingKVHistory(KVPruner):
    """Options: ``anchor_frames`` (``A``; None: the profile's), ``segments`` per frame (``S``),
    ``retention`` (``ρ``, share of segments a dynamic head keeps of each decided frame) and
    ``profile`` (a JSON file from ``jbkv profile-heads``; None: the one shipped for the model).

    A ``profile`` given by path is validated when the pruner is built and stored as its absolute
    path with ``profile_sha256``, the digest of its bytes (in the variant id), so a run folder
    records which profile it used and is read back without the file."""

    name: ClassVar[str] = "forcing-kv-history"
    title: ClassVar[str] = "Forcing-KV-history"
    short: ClassVar[str] = "fkv"  # the id of the runs made when this pruner was `forcing-kv`
    summary: ClassVar[str] = (
        "jbkv's earlier pruner after Forcing-KV's abstract: static heads keep the anchor frames, "
        "dynamic heads the changing segments of every older frame the window holds"
    )

    anchor_frames: int | None = option(None, "int", lo=1, hi=MAX_ANCHOR_FRAMES, optional=True)
    segments: int = option(DEFAULT_SEGMENTS, "int", lo=1, hi=MAX_SEGMENTS)
    retention: float = option(DEFAULT_RETENTION, "float", lo=0, hi=1)
    profile: str | None = option(None, "path", optional=True)
    profile_sha256: str | None = option(
        None, "str", optional=True, pattern="[0-9a-f]{64}", what="a SHA-256 digest", cli=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.profile is not None and self.profile_sha256 is None:
            path = Path(self.profile).resolve()
            _, data = read_profile(path)  # validated before any work; read once
            object.__setattr__(self, "profile", str(path))
            object.__setattr__(self, "profile_sha256", hashlib.sha256(data).hexdigest())

    def profile_path(self, model: str) -> Path:
        return Path(self.profile) if self.profile else default_profile_path(model)

    def head_profile(self, model: str) -> HeadProfile:
        """The profile for ``model``; ``ValueError`` (naming the file) when it is unusable."""
        path = self.profile_path(model)
        if self.profile is None and not path.is_file():
            raise ValueError(
                f"{self.name} has no head profile for model {model!r}: make one with "
                f"`jbkv profile-heads --model {model} --rule local-mass --out FILE` and pass "
                f"-M {self.name}.profile=FILE"
            )
        profile = load_profile(path)
        if profile.model != model:
            raise ValueError(f"{path} profiles model {profile.model!r}, not {model!r}")
        return profile

    def check(self, model: str) -> None:
        self.head_profile(model)

    def plans(
        self, model: str, layers: int, kv_heads: int, frame_tokens: int
    ) -> list[ForcingKVHistoryLayer]:
        profile = self.head_profile(model)
        if profile.layers != layers or len(profile.heads[0]) != kv_heads:
            raise ValueError(
                f"{self.profile_path(model)} has {profile.layers} layers x "
                f"{len(profile.heads[0])} heads; {model} has {layers} x {kv_heads}"
            )
        anchor = self.anchor_frames or profile.anchor_frames
        if anchor is None:
            raise ValueError(
                f"{self.profile_path(model)} was made with --rule {profile.rule} and names no "
                f"anchor frames: pass -M {self.name}.anchor_frames=N"
            )
        return [
            ForcingKVHistoryLayer(kinds, frame_tokens, anchor, self.segments, self.retention)
            for kinds in profile.heads
        ]

    def extra_id(self) -> list[str]:
        parts = [f"a{self.anchor_frames}"] if self.anchor_frames is not None else []
        parts += [f"s{self.segments}"] if self.segments != DEFAULT_SEGMENTS else []
        if self.retention != DEFAULT_RETENTION:
            parts.append(f"r{percent_id(self.retention)}")
        if self.profile_sha256 is not None:
            parts.append(f"p{self.profile_sha256[:8]}")
        return parts


def percent_id(share: float) -> str:
    """``100 · share`` for a variant id: ``50`` for 0.5, ``33p3`` for 0.333 (``p``: the decimal
    point; ids use ``-`` and ``.`` for other things). Distinct canonical shares (10 significant
    digits, :mod:`jbkv_cli.utils.fields`) give distinct ids; whole percents read as before."""
    text = format(Decimal(f"{100 * share:.10g}").normalize(), "f")
    return text.replace(".", "p")
