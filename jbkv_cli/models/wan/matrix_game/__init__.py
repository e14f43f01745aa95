"""Matrix-Game-2.0 (Skywork, SkyworkAI/Matrix-Game v2): an interactive world model — a causal
Wan2.1-1.3B I2V DiT with keyboard/mouse ActionModules — with all of its caches in jbkv's.

``load_model(**options)`` builds a :class:`~jbkv_cli.models.wan.matrix_game.model.MatrixGame2`:

    config            universal (default; keyboard 4-d + mouse) | gta (keyboard 2-d + mouse,
                      local attention 4 frames) | templerun (keyboard 7-d) | tiny-random
    local_attn_size   latent frames attended, the current chunk included (preset: 6; GTA 4)
    weights           the Skywork/Matrix-Game-2.0 folder (else $JBKV_MATRIX_GAME_DIR, else
                      the Hugging Face cache)
    num_chunks        chunks of 3 latent frames (default 50 = 150 latent frames = 597 frames;
                      tiny-random 3); or num_frames (4·latents − 3 … i.e. 4·(3·chunks − 1) + 1)
    quantize_actions  store the mouse/keyboard caches with the variant's KVSpec (default
                      true); false keeps them in full precision
    device, dtype     default cuda + bfloat16 when available, else cpu + float32
    precision         upstream (default: the sampler's latents in the model dtype, as
                      upstream) | fp32-accum (float32 latents); 16-bit models only
    attention_backend fused | flex | reference (jbkv's cached attention)
    init_seed         tiny-random's weight seed (0)

Cases (``--cases FILE``): an image column and, in the ``pose`` column, an actions JSON file
(:mod:`~jbkv_cli.models.wan.matrix_game.actions`), both checked by :func:`check_cases` before
anything is created. A video longer than the rotary table (1,024 latent frames) is a usage
error. The released files are found and read by :mod:`~jbkv_cli.models.wan.matrix_game.loaders`
(``weights``: the downloaded ``Skywork/Matrix-Game-2.0`` folder). Memory:
``benchmarks/matrix_game_memory.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.models import limits
from jbkv_cli.models.base import located
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import ModelEntry
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.precision import PRECISION, UPSTREAM
from jbkv_cli.models.wan.matrix_game.config import PRESETS, ROPE_FRAMES, Preset, with_local
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT
from jbkv_cli.models.wan.matrix_game.model import MatrixGame2, Settings, check_case
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.fields import Spec, parse_options

__all__ = [
    "ENTRY",
    "OPTIONS",
    "MatrixGame2",
    "check_cases",
    "check_options",
    "input_paths",
    "load_model",
]

OPTIONS: dict[str, Spec] = {
    "config": Spec("str", choices=tuple(PRESETS)),
    "num_chunks": limits.CHUNKS,
    "num_frames": Spec("int", lo=1, hi=4 * (3 * limits.MAX_CHUNKS - 1) + 1),
    "weights": limits.PATH,
    "quantize_actions": limits.FLAG,
    "device": limits.DEVICE,
    "dtype": limits.DTYPE,
    "attention_backend": Spec("str", choices=("fused", "flex", "reference")),
    "init_seed": limits.SEED,
    "local_attn_size": Spec("int", lo=3, hi=3 * limits.MAX_CHUNKS),
    "precision": PRECISION,
}


def _chunks(opt: dict[str, Any], preset: Preset) -> int:
    k = preset.chunk_frames
    frames = opt.get("num_frames")
    if frames is None:
        return int(opt.get("num_chunks", preset.num_chunks))
    latents, rest = divmod(int(frames) - 1, 4)
    latents += 1
    if rest or latents % k:
        raise UsageError(
            f"matrix-game-2: num_frames must be 4·(3·chunks − 1) + 1 (9, 21, …, 597), got {frames}"
        )
    if opt.get("num_chunks") not in (None, latents // k):
        raise UsageError(
            f"matrix-game-2: num_frames={frames} is {latents // k} chunks, "
            f"not num_chunks={opt['num_chunks']}"
        )
    return latents // k


def _resolved(options: dict[str, Any]) -> tuple[Settings, Preset, dict[str, Any]]:
    opt = parse_options(OPTIONS, options, "matrix-game-2", sep=": ", error=UsageError)
    config = str(opt.get("config", "universal"))
    preset = PRESETS[config]
    if "local_attn_size" in opt:  # latent frames, the current chunk included (upstream's)
        preset = with_local(preset, int(opt["local_attn_size"]))
    local, k = preset.dit.local_attn_size, preset.chunk_frames
    commit = k if local % k == 0 else 1  # GTA's 4 frames: the window kept frame by frame
    if config == "tiny-random" and opt.get("weights") is not None:
        raise UsageError("matrix-game-2: config=tiny-random builds random weights; no weights=")
    chunks = _chunks(opt, preset)
    latents = chunks * k
    if latents > min(ROPE_FRAMES, preset.dit.rope_frames):
        raise UsageError(
            f"matrix-game-2: {chunks} chunks are {latents} latent frames, past the rotary table "
            f"({ROPE_FRAMES} latent frames): give num_chunks <= {ROPE_FRAMES // k}"
        )
    device = opt.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {device!r} requested but CUDA is not available")
    dtype = opt.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32")
    settings = Settings(
        config=config,
        num_chunks=chunks,
        chunk_frames=k,
        window=(local - k) // commit,
        commit_frames=commit,
        height=preset.height,
        width=preset.width,
        fps=preset.fps,
        device=device,
        dtype=dtype,
        quantize_actions=bool(opt.get("quantize_actions", True)),
        attention_backend=opt.get("attention_backend"),
        precision=str(opt.get("precision", UPSTREAM)),
    )
    return settings, preset, opt


def check_options(**options: Any) -> None:
    """Refuse what :func:`load_model` would refuse (values, missing weight files), without
    building anything."""
    settings, _, opt = _resolved(options)
    if settings.config != "tiny-random":
        from jbkv_cli.models.wan.matrix_game.loaders import locate

        locate(settings.config, opt.get("weights"))


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the weight files these options read (none for tiny-random)."""
    settings, _, opt = _resolved(options)
    if settings.config == "tiny-random":
        return {}
    from jbkv_cli.models.wan.matrix_game.loaders import locate

    return located(locate(settings.config, opt.get("weights")))


def plan_model(**options: Any) -> MatrixGame2:
    """Matrix-Game-2.0 as a GPU runs it (``cuda``, bfloat16 unless ``dtype`` says otherwise)
    at the configuration the options name, for ``jbkv plan``: the preset's DiT, CLIP's visual
    tower and the Wan VAE built on ``meta`` (no weight read), placed as :func:`load_model`
    places them; tiny-random builds its random parts."""
    import diffusers

    from jbkv_cli.models.wan.matrix_game.clip import VisionTower

    given = {k: v for k, v in options.items() if v is not None}
    settings, preset, opt = _resolved({"dtype": "bfloat16", **given, "device": "cpu"})
    settings = replace(settings, device="cuda")
    dt = dtype_from_name(settings.dtype)
    if settings.config == "tiny-random":
        from jbkv_cli.models.wan.matrix_game.tiny import tiny_parts

        dit, vae, encoder = tiny_parts(preset, int(opt.get("init_seed", 0)))
    else:
        with torch.device("meta"):
            dit = MatrixGameDiT(preset.dit).eval()
            encoder = VisionTower().eval().to(dt)
            vae = diffusers.AutoencoderKLWan().eval().to(dt)
    dit = dit.to(settings.device, dt)
    return MatrixGame2(dit, vae.to(settings.device), encoder.to(settings.device), preset, settings)


def sample_case(folder: Path, **options: Any) -> Case:
    """A case for ``jbkv plan``: a gray image of the preset's size and an actions file that
    holds still for the video's frames, written into ``folder``."""
    import json

    from PIL import Image

    given = {k: v for k, v in options.items() if v is not None}
    settings, preset, _ = _resolved(given | {"device": "cpu"})
    image = folder / "matrix-game-2.png"
    Image.new("RGB", (settings.width, settings.height), (128, 128, 128)).save(image)
    action = preset.dit.action
    rows = {"keyboard": [[0] * action.keyboard_dim] * settings.num_frames}
    if action.mouse_dim:
        rows["mouse"] = [[0.0] * action.mouse_dim] * settings.num_frames
    actions = folder / "matrix-game-2-actions.json"
    actions.write_text(json.dumps(rows))
    return Case("planned", str(image), str(actions), id="plan")


def check_cases(cases: Iterable[Case], **options: Any) -> None:
    """Every case needs a readable image and a valid actions file of the video's frames;
    the first problem is one usage error naming the case."""
    settings, preset, _ = _resolved(options)
    for case in cases:
        check_case(case, settings, preset)


def load_model(**options: Any) -> MatrixGame2:
    """Build Matrix-Game-2.0 (module docstring)."""
    settings, preset, opt = _resolved(options)
    dt = dtype_from_name(settings.dtype)
    if settings.config == "tiny-random":
        from jbkv_cli.models.wan.matrix_game.tiny import tiny_parts

        dit, vae, encoder = tiny_parts(preset, int(opt.get("init_seed", 0)))
    else:
        from jbkv_cli.models.wan.matrix_game import loaders

        paths = loaders.locate(settings.config, opt.get("weights"))
        dit = loaders.load_dit(preset, paths.dit)
        encoder = loaders.load_clip(paths.clip).to(dt)
        vae = loaders.load_vae(paths.vae).to(dt)
    dit = dit.to(settings.device, dt)
    return MatrixGame2(dit, vae.to(settings.device), encoder.to(settings.device), preset, settings)


ENTRY = ModelEntry(
    load_model=load_model,
    check_options=check_options,
    input_paths=input_paths,
    check_cases=check_cases,
    plan_model=plan_model,
    sample_case=sample_case,
    plan_blocks=lambda model: model.dit.blocks,  # two runs: with the ActionModule, without
)
