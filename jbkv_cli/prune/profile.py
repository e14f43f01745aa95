"""Offline head profiling for Forcing-KV: frame-level attention mass, static/dynamic classes.

While a model generates with a full-precision cache, :class:`FrameMassProbe` measures for every
denoising step of every chunk that reads a cache, per layer and query head, the mean over the
chunk's queries of the softmax mass on each key frame (cached frames, then the current chunk's):

    m_f = mean_q Σ_{i ∈ frame f} softmax(τ q·k)_i

Two rules turn these into classes (``rule`` in the profile file):

- ``forcing-kv`` (the default; upstream's ``configs_head/head_profile.py``,
  zju-jiyicheng/Forcing-KV@50ac1f45:configs_head/head_profile.py:8-48): a head's score is the
  mass on the last ``LAST_K = 4`` key frames over the mass on the key frames after the first
  ``SKIP_FIRST_K = 1`` (the sink out of the denominator),

      score = Σ_{f ∈ last 4 key frames} m_f / Σ_{f ≥ 1} m_f,      static iff score ≥ 0.8

  (``THRESHOLD 0.8``). The key frames of a read are its cached frames, oldest first, then the
  current chunk's frames, as upstream's frame-wise attention files; ``last 4`` is ``min(4, n)``
  of the ``n`` key frames, as upstream. On Self-Forcing (3-frame chunks) that is the current chunk
  plus the newest cached frame: what a static head keeps besides the sink. jbkv keeps the
  constant 4 on other geometries (the embedded model's 4-frame chunks: the current chunk alone;
  ``--last-frames`` changes it) and skips the first key frame *of each read*: the sink when the
  cache window holds the whole video (Self-Forcing's default 7 chunks; upstream profiles with
  global attention), the oldest cached frame once a window slides. Upstream classifies one
  attention file per (layer, head); jbkv pools every read: ``Σ numerators / Σ denominators``
  over reads (upstream sums its file over query rows the same way), per query head.
- ``local-mass`` (jbkv's earlier rule, read by ``forcing-kv-history``): the share on the
  current chunk and the ``A`` most recent cached frames, ``ℓ = m_current + Σ_{r=1..A} m_(r)``,
  of the total (sink included), averaged over reads; static iff ``ℓ ≥ 0.75`` by default.

A KV head's class is that of the mean score over the query heads that read it (GQA; equal for
MHA; upstream's models are MHA). The profile also keeps ``m`` by recency per head, and the
agreement of the classification made from each (prompt, seed) alone and from each denoising step
alone with the overall one (the paper's stability claim, measured).

MAGI-1 denoises several chunks per forward: each chunk's cache read is one record, its
"current" frames are the forward's in-flight chunks it reads, and its step is the forward's step
in its stage.

The JSON file (:data:`FORMAT`) is what the pruners read; :func:`load_profile` validates it before
any work and names the file in its one-line error. A file without ``rule`` (written before the
``forcing-kv`` rule existed) is a ``local-mass`` profile.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.utils.jsonio import FileReadError, parse_json, read_bytes

FORMAT = "jbkv-head-profile/1"
KINDS = ("static", "dynamic")
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
RULES = ("forcing-kv", "local-mass")
DEFAULT_RULE = "forcing-kv"
LAST_FRAMES = 4  # head_profile.py LAST_K
SKIP_FRAMES = 1  # head_profile.py SKIP_FIRST_K
THRESHOLDS = {"forcing-kv": 0.8, "local-mass": 0.75}  # head_profile.py THRESHOLD; jbkv's own
DEFAULT_ANCHOR_FRAMES = 1
DEFAULT_THRESHOLD = THRESHOLDS["local-mass"]


class ProfileError(ValueError):
    """A head-profile file that cannot be used (the message names the file)."""


@dataclass(frozen=True)
class HeadProfile:
    """The classes a pruner reads: ``heads[layer][kv_head]`` in :data:`KINDS`; ``rule`` made
    them (:data:`RULES`); ``anchor_frames`` is the ``local-mass`` rule's ``A`` (None for
    ``forcing-kv`` profiles)."""

    model: str
    anchor_frames: int | None
    threshold: float
    heads: tuple[tuple[str, ...], ...]
    rule: str = "local-mass"

    @property
    def layers(self) -> int:
        return len(self.heads)

    def counts(self) -> dict[str, int]:
        return {k: sum(h.count(k) for h in self.heads) for k in KINDS}


def default_profile_path(model: str, rule: str = "local-mass") -> Path:
    """The profile shipped for ``model`` made by ``rule`` (it may not exist):
    ``profiles/MODEL.json`` (``local-mass``, read by ``forcing-kv-history``) or
    ``profiles/forcing-kv/MODEL.json``."""
    if rule == "local-mass":
        return PROFILES_DIR / f"{model}.json"
    return PROFILES_DIR / rule / f"{model}.json"


def _fail(path: Path | str, why: str) -> ProfileError:
    return ProfileError(f"{path} is not a usable head profile: {why}")


def parse_profile(doc: Any, path: Path | str = "<profile>") -> HeadProfile:
    """The :class:`HeadProfile` of a decoded JSON document; :class:`ProfileError` otherwise."""
    if not isinstance(doc, dict):
        raise _fail(path, "not a JSON object")
    if doc.get("format") != FORMAT:
        raise _fail(path, f"'format' must be {FORMAT!r}, got {doc.get('format')!r}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _fail(path, "'model' must be a model name")
    rule = doc.get("rule", "local-mass")
    if rule not in RULES:
        raise _fail(path, f"'rule' must be one of {', '.join(RULES)}, got {rule!r}")
    anchor = doc.get("anchor_frames")
    if (anchor is not None or rule == "local-mass") and (type(anchor) is not int or anchor < 1):
        raise _fail(path, f"'anchor_frames' must be an integer >= 1, got {anchor!r}")
    threshold = doc.get("threshold")
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        raise _fail(path, f"'threshold' must be a number, got {threshold!r}")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _fail(path, "'layers' must be a non-empty list")
    heads = []
    for i, layer in enumerate(layers):
        kinds = layer.get("heads") if isinstance(layer, dict) else None
        if not isinstance(kinds, list) or not kinds or any(k not in KINDS for k in kinds):
            raise _fail(path, f"layer {i}: 'heads' must be a non-empty list of static/dynamic")
        if heads and len(kinds) != len(heads[0]):
            raise _fail(path, f"layer {i} has {len(kinds)} heads, layer 0 has {len(heads[0])}")
        heads.append(tuple(kinds))
    return HeadProfile(model, anchor, float(threshold), tuple(heads), rule)


def load_profile(path: Path | str) -> HeadProfile:
    """Read and validate a profile file (:class:`ProfileError` naming ``path``)."""
    return read_profile(path)[0]


def read_profile(path: Path | str) -> tuple[HeadProfile, bytes]:
    """The validated profile in ``path`` and the bytes it was read from (for its digest).

    Only a regular file of at most :data:`~jbkv_cli.utils.jsonio.MAX_JSON_BYTES` is read (a FIFO or
    ``/dev/zero`` is refused without blocking); bad UTF-8, bad or too deeply nested JSON and a
    wrong shape are one :class:`ProfileError` naming ``path``.
    """
    try:
        data = read_bytes(path, "head profile")
        doc = parse_json(data, path, "head profile")
    except FileReadError as exc:
        raise _fail(path, exc.reason) from None
    return parse_profile(doc, path), data


# --- measuring ----------------------------------------------------------------------------------


def frame_mass(
    q: torch.Tensor,
    k_cached: torch.Tensor,
    k_cur: torch.Tensor,
    scale: float,
    frame_tokens: int,
    block: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean softmax mass per key frame: ``(current [B, Hq, Fq], cached [B, Hq, Fc])``.

    ``q [B, Hq, Lq, D]``, ``k_cached [B, Hkv, Fc·T, D]`` (oldest frame first), ``k_cur`` the
    current chunk's keys (``Fq`` frames of ``T`` tokens, in order); GQA by head ratio; computed
    in float32, ``block`` queries at a time.
    """
    rep = q.shape[-3] // k_cached.shape[-3]
    k = torch.cat([k_cached, k_cur], -2).float().repeat_interleave(rep, dim=-3)
    lc, lq = k_cached.shape[-2], k_cur.shape[-2]
    for what, n in (("cached", lc), ("current", lq)):
        if n % frame_tokens:
            raise ValueError(f"{n} {what} tokens are not whole frames of {frame_tokens}")
    cur = q.new_zeros((*q.shape[:-2], lq // frame_tokens), dtype=torch.float32)
    cached = q.new_zeros((*q.shape[:-2], lc // frame_tokens), dtype=torch.float32)
    for start in range(0, q.shape[-2], block):
        p = (scale * q[..., start : start + block, :].float() @ k.transpose(-1, -2)).softmax(-1)
        p = p.unflatten(-1, (-1, frame_tokens)).sum(-1).sum(-2)  # [B, Hq, frames]
        cached += p[..., : cached.shape[-1]]
        cur += p[..., cached.shape[-1] :]
    return cur / q.shape[-2], cached / q.shape[-2]


@dataclass
class _Record:
    sample: int
    layer: int
    chunk: int
    step: int
    current: torch.Tensor  # [Hq], on the whole current chunk
    recent: torch.Tensor  # [Hq, Fc], most recent cached frame first
    current_frames: torch.Tensor | None = None  # [Hq, Fq] in order (None: one frame)

    def key_frames(self) -> torch.Tensor:
        """``[Hq, Fc + Fq]``: mass per key frame, oldest cached first, current frames last."""
        cur = self.current[:, None] if self.current_frames is None else self.current_frames
        return torch.cat([self.recent.flip(-1), cur], -1)


class _ProbedCache:
    """Passes every call to ``cache`` and measures the frame mass of each attention read."""

    def __init__(self, cache, probe: FrameMassProbe, layer: int) -> None:
        self.cache, self.probe, self.layer = cache, probe, layer

    def commit(self, k: torch.Tensor, v: torch.Tensor, position: int | None = None) -> None:
        self.cache.commit(k, v, position=position)

    def attend(self, q, k_cur, v_cur, scale, last=None, backend=None, **reads):
        self.probe.observe(self.layer, q, k_cur, self.cache.read(last, **reads), scale)
        return self.cache.attend(q, k_cur, v_cur, scale, last=last, backend=backend, **reads)

    def __getattr__(self, name: str):
        return getattr(self.cache, name)


@dataclass
class FrameMassProbe:
    """Collects frame masses while a model generates (see the module docstring).

    The model's chunk loop calls :meth:`wrap` on its caches, :meth:`at` before each forward
    (``step=None`` for passes that are not denoising steps, e.g. a refresh pass: not measured),
    and the caller :meth:`begin_sample` before each (prompt, seed).
    """

    frame_tokens: int
    records: list[_Record] = field(default_factory=list)
    samples: list[tuple[str, int]] = field(default_factory=list)
    _chunk: int = 0
    _step: int | None = None

    def begin_sample(self, prompt: str, seed: int) -> None:
        self.samples.append((prompt, seed))

    def wrap(self, caches: list) -> list:
        return [_ProbedCache(c, self, i) for i, c in enumerate(caches)]

    def at(self, chunk: int, step: int | None) -> None:
        self._chunk, self._step = chunk, step

    def observe(self, layer: int, q, k_cur, cached, scale: float) -> None:
        if self._step is None or cached is None or cached.num_tokens == 0:
            return
        cur, frames = frame_mass(q, cached.k, k_cur, scale, self.frame_tokens)
        cur = cur.mean(0).cpu()  # mean over the batch
        record = _Record(
            len(self.samples) - 1,
            layer,
            self._chunk,
            self._step,
            cur.sum(-1),
            frames.mean(0).flip(-1).cpu(),
            cur,
        )
        self.records.append(record)


# --- classifying --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """How frame masses become classes (see the module docstring): ``name`` in :data:`RULES`,
    ``threshold`` (None: the rule's, :data:`THRESHOLDS`), ``last_frames``/``skip_frames`` (the
    ``forcing-kv`` rule) and ``anchor_frames`` (the ``local-mass`` rule)."""

    name: str = DEFAULT_RULE
    threshold: float | None = None
    last_frames: int = LAST_FRAMES
    skip_frames: int = SKIP_FRAMES
    anchor_frames: int = DEFAULT_ANCHOR_FRAMES

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise ValueError(f"unknown rule {self.name!r}; known: {', '.join(RULES)}")
        if self.threshold is None:
            object.__setattr__(self, "threshold", THRESHOLDS[self.name])
        if self.last_frames < 1 or self.skip_frames < 0 or self.anchor_frames < 1:
            raise ValueError("last_frames and anchor_frames must be >= 1, skip_frames >= 0")

    def settings(self) -> dict[str, Any]:
        """What the profile file records about the rule."""
        if self.name == "local-mass":
            return {"rule": self.name, "anchor_frames": self.anchor_frames}
        return {"rule": self.name, "last_frames": self.last_frames, "skip_frames": self.skip_frames}

    def scores(self, records: list[_Record], layers: int, kv_heads: int) -> torch.Tensor:
        """``[layers, kv_heads]`` scores over ``records`` (NaN where a layer has none)."""
        out = torch.full((layers, kv_heads), float("nan"))
        for layer in range(layers):
            recs = [r for r in records if r.layer == layer]
            score = self._score(recs)
            if score is not None:
                out[layer] = _kv_mean(score, kv_heads)
        return out

    def _score(self, records: list[_Record]) -> torch.Tensor | None:
        """``[Hq]`` for one layer's records, None without a usable one."""
        if self.name == "local-mass":
            if not records:
                return None
            return torch.stack([local_mass(r, self.anchor_frames) for r in records]).mean(0)
        parts = [last_frames_mass(r, self.last_frames, self.skip_frames) for r in records]
        parts = [x for x in parts if x is not None]
        if not parts:
            return None
        num, den = (torch.stack(x).sum(0) for x in zip(*parts, strict=True))
        return num / den.clamp_min(torch.finfo(torch.float32).tiny)


def local_mass(record: _Record, anchor_frames: int) -> torch.Tensor:
    """``ℓ [Hq]``: mass on the current chunk and the ``anchor_frames`` most recent frames."""
    return record.current + record.recent[:, :anchor_frames].sum(-1)


def last_frames_mass(
    record: _Record, last: int = LAST_FRAMES, skip: int = SKIP_FRAMES
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(numerator, denominator) [Hq]`` of upstream's score for one read: the mass on the last
    ``min(last, n)`` of its ``n`` key frames, and on the key frames after the first ``skip``
    (head_profile.py ``compute_attn_score``); None when ``n <= skip`` (upstream refuses it)."""
    frames = record.key_frames()
    n = frames.shape[-1]
    if n <= skip:
        return None
    return frames[:, -min(last, n) :].sum(-1), frames[:, skip:].sum(-1)


def _kv_mean(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Mean over the query heads of each KV head: ``[..., Hq] -> [..., Hkv]``."""
    return x.unflatten(-1, (kv_heads, -1)).mean(-1)


def classify(score: torch.Tensor, threshold: float) -> list[list[str]]:
    """``[layers, heads]`` scores -> classes (static at or above ``threshold``)."""
    return [["static" if x >= threshold else "dynamic" for x in row] for row in score.tolist()]


def _agreement(
    groups: dict[Any, list[_Record]],
    overall: list[list[str]],
    shape: tuple[int, int],
    rule: Rule,
) -> dict[str, Any]:
    """Share of (group, layer, head) whose class from the group alone equals the overall one;
    ``worst``: the lowest share of one group."""
    same = total = 0
    worst = 1.0
    for recs in groups.values():
        score = rule.scores(recs, *shape)
        ok = ~score.isnan()
        classes = classify(score.nan_to_num(0.0), rule.threshold)
        match = [
            c == o
            for row_c, row_o, row_ok in zip(classes, overall, ok.tolist(), strict=True)
            for c, o, k in zip(row_c, row_o, row_ok, strict=True)
            if k
        ]
        same += sum(match)
        total += len(match)
        if match:
            worst = min(worst, sum(match) / len(match))
    return {"groups": len(groups), "agreement": same / total if total else None, "worst": worst}


def summarize(
    probe: FrameMassProbe, layers: int, kv_heads: int, rule: Rule | None = None
) -> dict[str, Any]:
    """The profile's measured part: classes, scores, frame masses and stability."""
    rule = rule or Rule()
    if not probe.records:
        raise ValueError("no attention read a cache: nothing to profile (more chunks?)")
    shape = (layers, kv_heads)
    score = rule.scores(probe.records, *shape)
    if score.isnan().any():
        raise ValueError(f"some layers never read a cache of more than {rule.skip_frames} frames")
    heads = classify(score, rule.threshold)
    out_layers = []
    for layer in range(layers):
        recs = [r for r in probe.records if r.layer == layer]
        depth = max(r.recent.shape[-1] for r in recs)
        by_recency = []
        for d in range(depth):
            xs = [r.recent[:, d] for r in recs if r.recent.shape[-1] > d]
            by_recency.append(torch.stack(xs).mean(0))
        current = torch.stack([r.current for r in recs]).mean(0)
        out_layers.append(
            {
                "heads": heads[layer],
                "score": [round(x, 4) for x in score[layer].tolist()],
                "current_mass": [round(x, 4) for x in current.tolist()],
                "frame_mass": [
                    [round(float(m[h]), 4) for m in by_recency] for h in range(current.shape[0])
                ],
            }
        )
    by_sample = defaultdict(list)
    by_step = defaultdict(list)
    for r in probe.records:
        by_sample[r.sample].append(r)
        by_step[r.step].append(r)
    margin = (score.flatten() - rule.threshold).abs().min().item()
    return {
        **rule.settings(),
        "threshold": rule.threshold,
        "counts": {k: sum(row.count(k) for row in heads) for k in KINDS},
        "min_margin": round(margin, 4),
        "layers": out_layers,
        "stability": {
            "samples": _agreement(by_sample, heads, shape, rule),
            "steps": _agreement(by_step, heads, shape, rule),
        },
        "calls": len(probe.records),
    }


STATISTICS = {
    "forcing-kv": (
        "score = mass on the last last_frames key frames / mass on the key frames after the "
        "first skip_frames (upstream configs_head/head_profile.py), key frames = the cached "
        "frames then the current chunk's, mass = mean softmax mass over a read's queries, pooled "
        "over reads (denoising steps, chunks reading a cache, prompts, seeds); static when >= "
        "threshold (per KV head: mean over its query heads). frame_mass[h]: mass per cached "
        "frame, most recent first; current_mass: on the current chunk."
    ),
    "local-mass": (
        "local mass = mean softmax mass on the current chunk + the anchor_frames most recent "
        "cached frames, averaged over queries, denoising steps, chunks reading a cache, layers' "
        "calls, prompts and seeds; static when >= threshold (per KV head: mean over its query "
        "heads). frame_mass[h]: mass per cached frame, most recent first; current_mass: on the "
        "current chunk."
    ),
}


def profile_document(
    model: str,
    settings: dict[str, Any],
    probe: FrameMassProbe,
    measured: dict[str, Any],
    command: str,
) -> dict[str, Any]:
    """The JSON document :func:`load_profile` reads back."""
    return {
        "format": FORMAT,
        "model": model,
        "command": command,
        "statistic": STATISTICS[measured["rule"]],
        "settings": settings,
        "samples": [{"prompt": p, "seed": s} for p, s in probe.samples],
        **measured,
    }
