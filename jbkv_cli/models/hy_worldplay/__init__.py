"""HY-WorldPlay (Tencent Hunyuan, WorldPlay-8B on HunyuanVideo-1.5) natively in PyTorch, its
reconstituted context memory in jbkv's cache.

``load_model(**options)`` builds a :class:`~jbkv_cli.models.hy_worldplay.model.HYWorldPlay`:

    config        "8B" (default: ar_distilled_action_model, 4 steps) | "tiny-random"
    weights       the weights folder (else $JBKV_HYWORLDPLAY_DIR, else the Hugging Face cache;
                  layout in :mod:`~jbkv_cli.models.hy_worldplay.checkpoint`)
    num_chunks    chunks of 4 latents (default 16 = 64 latents = 253 frames); or
    frames        frames (4 * latents - 3 with latents a multiple of 4: 13, 29, ..., 253)
    steps         denoising steps per chunk (default 4, the distilled model's)
    height, width video size (default 480 x 832; tiny-random 16 x 16), multiples of 16 (tiny: 4)
    pose          trajectory of cases without one (default w-{latents - 1})
    quantize_text store the text K/V with the variant's method too (default false: 16-bit)
    device, dtype default cuda + bfloat16 when available, else cpu + float32
    precision     upstream (default: the latents in the model dtype between steps, as
                  upstream) | fp32-accum (in float32); the DiT casts as upstream in both
    attention_backend  fused | flex | reference (default: chosen per device, docs/library.md)
    offload       move encoders / DiT / VAE to the device only for their phase (default: on CUDA)
    seed          init seed of tiny-random

Cases (``--cases FILE``, :mod:`jbkv_cli.models.cases`) need an image; a trajectory must have one
entry per latent. Both are checked by :func:`check_cases` before anything is created.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.models import limits
from jbkv_cli.models.base import located
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import ModelEntry
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.hy_worldplay.config import OFFICIAL, SCHEDULE, TINY, TINY_SCHEDULE
from jbkv_cli.models.hy_worldplay.model import HYWorldPlay, Settings, trajectory_of
from jbkv_cli.models.hy_worldplay.trajectory import is_json_path
from jbkv_cli.models.precision import PRECISION, UPSTREAM
from jbkv_cli.models.wan.self_forcing.image import read_image
from jbkv_cli.utils.errors import UsageError, shown
from jbkv_cli.utils.fields import Spec, parse_options

__all__ = [
    "ENTRY",
    "OPTIONS",
    "HYWorldPlay",
    "check_cases",
    "check_options",
    "input_paths",
    "load_model",
]

CONFIGS = ("8B", "tiny-random")
MAX_FRAMES = 4 * 4 * limits.MAX_CHUNKS - 3
OPTIONS: dict[str, Spec] = {
    "config": Spec("str", choices=CONFIGS),
    "weights": limits.PATH,
    "num_chunks": limits.CHUNKS,
    "frames": Spec("int", lo=13, hi=MAX_FRAMES),
    "steps": limits.STEPS,
    "height": limits.SIDE,
    "width": limits.SIDE,
    "pose": Spec("str"),
    "quantize_text": limits.FLAG,
    "device": limits.DEVICE,
    "dtype": limits.DTYPE,
    "attention_backend": Spec("str", choices=("fused", "flex", "reference")),
    "offload": limits.FLAG,
    "seed": limits.SEED,
    "precision": PRECISION,
}


def _chunks(opt: dict[str, Any], schedule) -> int:
    """Chunks from ``num_chunks`` or ``frames`` (upstream: latents = (frames - 1) / 4 + 1,
    a multiple of 4 for the AR model)."""
    frames = opt.get("frames")
    default = 16 if opt.get("config", "8B") == "8B" else 8
    if frames is None:
        return int(opt.get("num_chunks", default))
    per_chunk = schedule.chunk_latents * schedule.temporal_compression
    latents, rest = divmod(frames - 1, schedule.temporal_compression)
    if rest or (latents + 1) % schedule.chunk_latents:
        raise UsageError(
            f"hy-worldplay: frames must be 4 * latents - 3 with latents a multiple of 4 "
            f"(13, 29, ..., 253; {per_chunk} frames a chunk), got {frames}"
        )
    chunks = (latents + 1) // schedule.chunk_latents
    if opt.get("num_chunks") not in (None, chunks):
        raise UsageError(
            f"hy-worldplay: frames={frames} is {chunks} chunks, not num_chunks={opt['num_chunks']}"
        )
    return chunks


def _resolved(options: dict[str, Any]):
    opt = parse_options(OPTIONS, options, "hy-worldplay", sep=": ", error=UsageError)
    config = str(opt.get("config", "8B"))
    tiny = config == "tiny-random"
    schedule = TINY_SCHEDULE if tiny else SCHEDULE
    if "steps" in opt:
        from dataclasses import replace

        schedule = replace(schedule, steps=int(opt["steps"]))
    device = opt.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {device!r} requested but CUDA is not available")
    dtype = dtype_from_name(
        opt.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32")
    )
    height = int(opt.get("height", 16 if tiny else 480))
    width = int(opt.get("width", 16 if tiny else 832))
    mult = schedule.spatial_compression
    if height % mult or width % mult:
        raise UsageError(
            f"hy-worldplay: the video size must be a multiple of {mult}, got {height}x{width}"
        )
    settings = Settings(
        config=config,
        height=height,
        width=width,
        num_chunks=_chunks(opt, schedule),
        device=device,
        dtype=dtype,
        offload=bool(opt.get("offload", device.startswith("cuda") and not tiny)),
        quantize_text=bool(opt.get("quantize_text", False)),
        pose=opt.get("pose"),
        attention_backend=opt.get("attention_backend"),
        precision=str(opt.get("precision", UPSTREAM)),
    )
    return settings, schedule, opt


def check_options(**options: Any) -> None:
    """Refuse what :func:`load_model` would refuse (values, missing or quantized weights)
    without building the model."""
    settings, schedule, opt = _resolved(options)
    if settings.pose is not None:
        trajectory_of(Case("pose option"), settings.latents(schedule), settings.pose)
    if settings.config != "tiny-random":
        from jbkv_cli.models.hy_worldplay.checkpoint import locate

        locate(opt.get("weights"))


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the weight files and folders these options read, and the ``pose`` option's
    JSON file (the trajectory of cases without one; only that for tiny-random)."""
    settings, _, opt = _resolved(options)
    pose = settings.pose
    found = {"pose": Path(pose.strip())} if pose is not None and is_json_path(pose) else {}
    if settings.config == "tiny-random":
        return found
    from jbkv_cli.models.hy_worldplay.checkpoint import locate

    return located(locate(opt.get("weights"))) | found


def check_cases(cases: Iterable[Case], **options: Any) -> None:
    """Every case needs a readable image, a prompt and a trajectory of one entry per latent
    (its own or the ``pose`` option's); the first problem is a usage error naming the case."""
    settings, schedule, _ = _resolved(options)
    latents = settings.latents(schedule)
    for case in cases:
        if case.image is None:
            raise UsageError(
                f"case {shown(case.name)}: hy-worldplay needs an image (a case file with an "
                "image column: --cases FILE)"
            )
        if not Path(case.image).is_file():
            raise UsageError(f"case {shown(case.name)}: image {case.image} is not a file")
        read_image(case.image, case.name)
        try:
            trajectory_of(case, latents, settings.pose)
        except UsageError as exc:
            raise UsageError(f"case {shown(case.name)}: {exc}") from None


def load_model(**options: Any) -> HYWorldPlay:
    """Build HY-WorldPlay (see the module docstring; None means "default")."""
    settings, schedule, opt = _resolved(options)
    if settings.config == "tiny-random":
        return _tiny(settings, schedule, int(opt.get("seed", 0)))
    return _official(settings, schedule, opt.get("weights"))


def _tiny(settings: Settings, schedule, seed: int) -> HYWorldPlay:
    from jbkv_cli.models.hy_worldplay.tiny import tiny_dit, tiny_encoders, tiny_vae

    dev, dt = settings.device, settings.dtype
    dit = tiny_dit(TINY, seed).to(dev, dt)
    vae = tiny_vae(seed).to(dev)
    return HYWorldPlay(dit, vae, tiny_encoders(TINY, seed, dev), settings, schedule)


def _official(settings: Settings, schedule, weights) -> HYWorldPlay:
    from jbkv_cli.models.hy_worldplay.checkpoint import check_dit_config, load_strict, locate
    from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT
    from jbkv_cli.models.hy_worldplay.loaders import load_encoders
    from jbkv_cli.models.hy_worldplay.vae import load_vae

    paths = locate(weights)
    check_dit_config(paths.dit_config)
    home = "cpu" if settings.offload else settings.device
    with torch.device("meta"):
        dit = WorldPlayDiT(OFFICIAL)
    load_strict(dit, paths.dit, f"HY-WorldPlay DiT ({paths.dit})")
    dit = dit.to(home, settings.dtype)
    vae = load_vae(paths.vae, home, torch.float32)
    encoders = load_encoders(paths, home, settings.device)
    return HYWorldPlay(dit, vae, encoders, settings, schedule)


def plan_model(**options: Any) -> HYWorldPlay:
    """HY-WorldPlay as a GPU runs it (``cuda``, the DiT in bfloat16 unless ``dtype`` says
    otherwise, the encoders in float16, offloaded phases unless ``offload=false``) at the
    configuration the options name, for ``jbkv plan``: the WorldPlay-8B DiT, the HunyuanVideo-1.5
    VAE (diffusers' defaults: upstream's architecture) and the encoders
    (:mod:`~jbkv_cli.models.hy_worldplay.planned`) built on ``meta``, no weight read."""
    from dataclasses import replace

    from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT
    from jbkv_cli.models.hy_worldplay.planned import planned_encoders
    from jbkv_cli.models.hy_worldplay.vae import build_vae

    given = {k: v for k, v in options.items() if v is not None}
    settings, schedule, opt = _resolved({"dtype": "bfloat16", **given, "device": "cpu"})
    tiny = settings.config == "tiny-random"
    offload = bool(opt.get("offload", not tiny))
    settings = replace(settings, device="cuda", offload=offload)
    if tiny:
        return _tiny(settings, schedule, int(opt.get("seed", 0)))
    home = "cpu" if offload else settings.device
    with torch.device("meta"):
        dit = WorldPlayDiT(OFFICIAL)
        vae = build_vae()
    dit = dit.to(settings.dtype).to(home)
    vae = vae.eval().to(home)
    encoders = planned_encoders(settings.device, home, torch.float16)
    return HYWorldPlay(dit, vae, encoders, settings, schedule)


def sample_case(folder: Path, **options: Any) -> Case:
    """A case for ``jbkv plan``: a gray image of the video's size (written into ``folder``),
    walking forward (the ``pose`` option's trajectory, else ``w-{latents - 1}``)."""
    from PIL import Image

    given = {k: v for k, v in options.items() if v is not None}
    settings, _, _ = _resolved(given | {"device": "cpu"})
    image = folder / "hy-worldplay.png"
    Image.new("RGB", (settings.width, settings.height), (128, 128, 128)).save(image)
    return Case("a quiet street in the morning", str(image), id="plan")


ENTRY = ModelEntry(
    load_model=load_model,
    check_options=check_options,
    input_paths=input_paths,
    check_cases=check_cases,
    plan_model=plan_model,
    plan_options={"steps": 1},  # every step the same forward (docs/plan.md)
    plan_blocks=lambda model: model.dit.double_blocks,
    sample_case=sample_case,
)
