"""``--model tiny``: the embedded default, a small trained chunk-wise AR video diffusion model.

It runs on a CPU in seconds: 32x32 RGB videos of a coloured shape moving on a plain background,
from prompts of a closed grammar (see :mod:`jbkv_cli.models.tiny.data`). Architecture in
:mod:`~jbkv_cli.models.tiny.model`, training in :mod:`~jbkv_cli.models.tiny.train`, the chunk
loop in :mod:`~jbkv_cli.models.tiny.sampler`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache.layers import HeadLayout
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.base import ProgressFn, Video, text_case
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import ModelEntry, VideoModelBase
from jbkv_cli.models.limits import CHUNKS, DEVICE, MAX_CHUNKS, PATH, STEPS
from jbkv_cli.models.tiny.data import parse_prompt
from jbkv_cli.models.tiny.sampler import SamplerSettings, draw_noise, sample
from jbkv_cli.models.tiny.weights_io import (
    DEFAULT_WEIGHTS,
    LONG_WEIGHTS,
    load_weights,
    weights_file,
)
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.fields import Spec, parse_options

if TYPE_CHECKING:
    from jbkv_cli.prune.profile import FrameMassProbe

FPS = 8.0
OPTIONS: dict[str, Spec] = {
    "weights": PATH,
    "device": DEVICE,
    "num_chunks": CHUNKS,
    "steps": STEPS,
    "window": Spec("int", lo=1, hi=MAX_CHUNKS),
    "sink": Spec("int", lo=0, hi=MAX_CHUNKS),
    "ctx_noise": Spec("float", lo=0, hi=1, hi_open=True),
}


class TinyVideoModel(VideoModelBase):
    """The tiny model as a :class:`~jbkv_cli.models.contract.PrunableModel`."""

    name = "tiny"
    pre_rope = True  # its caches can hold keys before RoPE (``layout=pre-rope``)
    follows_prompt_version = 2  # 2: a chunk's path counts the step into it (a turn at a wall)

    def __init__(
        self,
        weights: Path | str | None = None,
        device: str = "cpu",
        num_chunks: int = 8,
        steps: int = 4,
        window: int | None = None,
        ctx_noise: float = 0.1,
        sink: int = 0,
    ) -> None:
        self.model = load_weights(weights, device)
        self.sink = sink
        self.device = device
        cfg = self.model.cfg
        settings = SamplerSettings(num_chunks, steps, window or cfg.window, ctx_noise)
        self.sampler = settings
        self.settings: dict[str, Any] = {
            "num_chunks": settings.num_chunks,
            "steps": settings.steps,
            "window": settings.window,
            "ctx_noise": settings.ctx_noise,
            "frames_per_chunk": cfg.frames_per_chunk,
            "size": cfg.image_size,
            "tokens_per_chunk": cfg.chunk_len,
            "dtype": "float32",
            "device": device,
            "head_dim": cfg.head_dim,
            "weights_sha256": _digest(Path(weights) if weights is not None else DEFAULT_WEIGHTS),
        }
        if sink:  # absent at 0: a run made before the option has the same settings
            self.settings["sink"] = sink

    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """One video of ``num_chunks * frames_per_chunk`` frames; same noise for every ``kv``."""
        prompt = text_case(case, self.name).prompt
        kv = self.resolve_kv(kv)
        parsed = parse_prompt(prompt)
        noise = draw_noise(self.model, self.sampler.num_chunks, seed, prompt)
        out = sample(self.model, parsed.token_ids, noise, kv, self.sampler, progress, observer)
        frames = (out.frames * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
        info = {"dtype": "float32", "device": self.device, "kv": kv.label, **self.settings}
        bytes_by_head = out.facts.get("kv_cache_bytes_by_head")
        if bytes_by_head is not None:
            info["kv_cache_bytes_by_head"] = bytes_by_head
        return Video(frames, FPS, out.facts["kv_cache_bytes"], info)

    def follows_prompt(self, case: Case, frames: torch.Tensor) -> list[bool]:
        """Per chunk: :func:`~jbkv_cli.models.tiny.check.check_chunks` (colour, shape kept,
        still moving on its axis) against the case's prompt."""
        from jbkv_cli.models.tiny.check import check_chunks

        fpc = self.model.cfg.frames_per_chunk
        return check_chunks(frames, text_case(case, self.name).prompt, fpc)

    def head_layout(self) -> HeadLayout:
        """What a pruner needs: layers, KV heads and tokens per frame."""
        return self.model.head_layout

    @property
    def chunk_tokens(self) -> int:
        return self.model.cfg.chunk_len

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it (:meth:`KVSpec.for_model`: QVG's K rule; no upstream
        cache policy to fill in), with the model's ``sink`` chunks (LongLive-style: the first
        chunks kept for good at their own positions, besides the ``window`` newest)."""
        pruner = kv.pruner
        if self.sink and pruner is not None and pruner.owns_buffer:
            raise UsageError(
                f"{pruner.name} keeps its own sink and buffer: it cannot run with sink={self.sink}"
            )
        return kv.for_model(self.name, self.chunk_tokens).with_sink(self.sink)

    def profile_heads(self, prompt: str, seed: int, probe: FrameMassProbe) -> None:
        """Generate ``prompt`` with the full-precision cache while ``probe`` (a
        :class:`~jbkv_cli.prune.profile.FrameMassProbe`) measures every cache read."""
        parsed = parse_prompt(prompt)
        noise = draw_noise(self.model, self.sampler.num_chunks, seed, prompt)
        probe.begin_sample(prompt, seed)
        sample(self.model, parsed.token_ids, noise, FULL_PRECISION, self.sampler, probe=probe)


def check_prompt(prompt: str) -> None:
    """Refuse a prompt outside the closed grammar (before anything is generated)."""
    parse_prompt(prompt)


def _digest(path: Path) -> str:
    """The first 16 hex digits of the weights file's SHA-256 (identifies them in run manifests)."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def check_options(**options: Any) -> dict[str, Any]:
    """The options, canonical (:data:`OPTIONS`: types and bounds; None means the default), or
    the usage error :func:`load_model` would raise for them, and a missing weights file
    refused, without building the model. Defaults: ``num_chunks`` 8, ``steps`` 4, ``window``
    the trained one (2), ``sink`` 0, ``ctx_noise`` 0.1, ``device`` cpu, the shipped weights."""
    opts = parse_options(OPTIONS, options, "tiny", sep=": ", error=UsageError)
    weights_file(opts.get("weights"))
    return opts


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the weights file these options read."""
    return {"weights": weights_file(check_options(**options).get("weights"))}


def load_model(**options: Any) -> TinyVideoModel:
    """Build the tiny model (shipped weights unless ``weights`` is given); options and defaults
    as :func:`check_options`."""
    return TinyVideoModel(**check_options(**options))


def plan_model(**options: Any) -> TinyVideoModel:
    """The tiny model as a GPU runs it, for ``jbkv plan``: its weights (the shipped ones unless
    ``weights`` is given; 5 MB, read on the host) moved to ``cuda``, float32 (its only dtype)."""
    model = TinyVideoModel(**{**check_options(**options), "device": "cpu"})
    model.model.to("cuda")
    model.device = model.settings["device"] = "cuda"
    return model


ENTRY = ModelEntry(
    load_model=load_model,
    check_options=check_options,
    input_paths=input_paths,
    check_prompt=check_prompt,
    plan_model=plan_model,
    plan_options={"steps": 1},
    horizon_options={"weights": str(LONG_WEIGHTS)},  # RECIPE's stage 3: valid for longer
    plan_blocks=lambda model: model.model.blocks,
)

__all__ = ["ENTRY", "TinyVideoModel", "check_options", "check_prompt", "input_paths", "load_model"]
