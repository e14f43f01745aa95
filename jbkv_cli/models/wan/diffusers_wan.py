"""Parts shared by the adapters built on diffusers' Wan family (SkyReels-V2, Self-Forcing).

Finding a diffusers-format directory (a local folder or a snapshot in the Hugging Face cache,
never a download) and checking which of its parts are missing; the UMT5 prompt embedding and
Wan-VAE decoding both reference pipelines use; casting a transformer while keeping diffusers'
float32 islands; decoding a chunk loop's latents into a :class:`Video`; the option checks both
adapters make; and tiny random stand-ins (Wan VAE, UMT5 encoder, a character-level tokenizer made
in code) so whole generation paths run on a CPU in tests.
"""

from __future__ import annotations

import html
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.kvcache import FULL_PRECISION, HeadLayout, KeyRope, KVSpec
from jbkv_cli.metrics.chunks import causal_vae_chunks
from jbkv_cli.models import limits
from jbkv_cli.models.base import Video
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.wan.diffusers_cache import wan_key_rope
from jbkv_cli.quant.qvg_policy import LAYOUTS
from jbkv_cli.utils.errors import UsageError, WeightsNotFoundError
from jbkv_cli.utils.fields import Spec
from jbkv_cli.utils.jsonio import FileReadError, read_json
from jbkv_cli.utils.pretrained import CustomCodeError

TINY_TEXT_DIM = 32
TINY_MAX_SEQUENCE_LENGTH = 16

# part -> (files that must all exist, groups of which at least one file must exist)
Required = dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]
WEIGHTS = ("*.safetensors", "*.bin")


# --------------------------------------------------------------------------- finding weights


def hf_cache_snapshot(repo_id: str) -> Path | None:
    """The snapshot directory of ``repo_id`` in the local Hugging Face cache, if any."""
    from huggingface_hub import constants

    repo_dir = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    if snapshots.is_dir():
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None
    return None


def missing_parts(root: Path, required: Required) -> list[str]:
    """Every required file absent under ``root``, as ``part/file`` (``a|b``: any of them)."""
    missing: list[str] = []
    for part, (files, any_of) in required.items():
        folder = root / part
        for name in files:
            if not (folder / name).is_file():
                missing.append(f"{part}/{name}")
        for group in any_of:
            if not any(next(folder.glob(pattern), None) for pattern in group):
                missing.append(f"{part}/{'|'.join(group)}")
    return missing


def transformer_config(root: Path, class_name: str, expected: str) -> dict[str, Any]:
    """``root/transformer/config.json``; a malformed file or another ``_class_name`` is one
    :class:`WeightsNotFoundError` (``expected`` says what should be there)."""
    path = root / "transformer" / "config.json"
    try:
        config = read_json(path, finite=False)  # a regular file, at most 64 MiB
    except FileReadError as exc:
        raise WeightsNotFoundError(f"malformed {path}: {exc.reason}") from exc
    found = config.get("_class_name") if isinstance(config, dict) else None
    if found != class_name:
        raise WeightsNotFoundError(
            f"{path} describes {found!r}, not a {class_name}; expected {expected}"
        )
    return config


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_parts(loaders: dict[str, Callable[[], Any]], what: str, root: Path) -> dict[str, Any]:
    """Each part's loader run in turn; any failure one :class:`WeightsNotFoundError` naming
    ``what``, the part and its folder under ``root`` (a folder that asks to run its own code
    stays the :class:`~jbkv_cli.utils.pretrained.CustomCodeError` it is)."""
    parts: dict[str, Any] = {}
    for name, load in loaders.items():
        try:
            parts[name] = load()
        except CustomCodeError:
            raise
        except Exception as exc:  # any loader failure means a bad weights directory
            raise WeightsNotFoundError(
                f"could not load the {what} {name} from {root / name}: {first_line(exc)}"
            ) from exc
    return parts


# --------------------------------------------------------------------------- running


def cast_keeping_fp32(transformer: Any, dtype: torch.dtype) -> None:
    """Cast parameters to ``dtype`` except those with a name part in ``_keep_in_fp32_modules``
    (rope, time embedder, the ``scale_shift_table`` modulation tables, norms), as
    ``from_pretrained(torch_dtype=...)`` does: it matches parameter names, so a table that is a
    parameter of a block (``blocks.0.scale_shift_table``) stays float32 too."""
    keep = set(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    for name, param in transformer.named_parameters():
        target = torch.float32 if keep & set(name.split(".")) else dtype
        param.data = param.data.to(target)


def encode_umt5(
    tokenizer: Any, text_encoder: Any, text: str, max_length: int, device: str, dtype: torch.dtype
) -> torch.Tensor:
    """UMT5 embedding ``[1, max_length, text_dim]`` of ``text``, zero past its tokens.

    The prompt is cleaned as the Wan pipelines do (HTML entities unescaped twice, whitespace
    collapsed); the encoder runs where its parameters are, the result goes to ``device``.
    """
    text = " ".join(html.unescape(html.unescape(text)).split())
    tokens = tokenizer(
        [text],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    where = next(text_encoder.parameters()).device
    mask = tokens.attention_mask.to(where)
    hidden = text_encoder(tokens.input_ids.to(where), mask).last_hidden_state
    hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
    return hidden.to(device, dtype)


def chunk_video(
    components: Any, config: Any, latents: torch.Tensor, label: str, info: dict[str, Any]
) -> Video:
    """Decode ``latents`` with ``components.vae`` into a :class:`Video` whose info records the
    run settings (``config``: dtype, device, chunk_frames, num_chunks, window, fps), the decoded
    chunks' frame counts (the causal VAE's first chunk is 3 frames short), the cache variant
    ``label``, the weights and ``info`` (with ``kv_cache_bytes``)."""
    with torch.no_grad():
        frames = decode_wan(components.vae, latents)
    record = {
        "dtype": config.dtype,
        "device": config.device,
        "chunk_frames": config.chunk_frames,
        "num_chunks": config.num_chunks,
        "window": config.window,
        "kv": label,
        "weights": components.source,
        **causal_vae_chunks(config.chunk_frames, vae_scale(components.vae)[0]),
        **info,
    }
    return Video(
        frames=frames, fps=float(config.fps), kv_cache_bytes=info["kv_cache_bytes"], info=record
    )


def vae_scale(vae: Any) -> tuple[int, int]:
    """(temporal, spatial) down-sampling of a Wan VAE (4, 8 for Wan 2.1)."""
    downsample = vae.config.temperal_downsample
    return 2 ** sum(downsample), 2 ** len(downsample)


def head_layout(transformer: Any, vae: Any, height: int, width: int) -> HeadLayout:
    """What a pruner needs of a Wan-family transformer generating ``height``×``width`` frames:
    its blocks, heads (multi-head attention: every head is a KV head) and the tokens of one
    latent frame, ``(height/8/p_h)·(width/8/p_w)`` (frames are the outermost token axis)."""
    spatial = vae_scale(vae)[1]
    _, p_h, p_w = transformer.config.patch_size
    return HeadLayout(
        layers=len(transformer.blocks),
        kv_heads=transformer.config.num_attention_heads,
        frame_tokens=(height // spatial // p_h) * (width // spatial // p_w),
    )


class WanHeads:
    """``head_layout()`` and ``profile_heads()`` of a Wan-family adapter (what pruners and
    ``jbkv profile-heads`` need): it has ``components`` (transformer, vae), a ``config`` with
    ``height``/``width``, and ``generate_latents(prompt, seed, kv, probe=...)``."""

    components: Any
    config: Any
    pre_rope = True  # its caches can hold keys before RoPE (:meth:`key_rope`)

    def head_layout(self) -> HeadLayout:
        """Blocks, heads and tokens per latent frame (:func:`head_layout`)."""
        c, s = self.components, self.config
        return head_layout(c.transformer, c.vae, s.height, s.width)

    @property
    def chunk_tokens(self) -> int:
        """Tokens of one chunk (``chunk_frames`` latent frames)."""
        return self.head_layout()["frame_tokens"] * self.config.chunk_frames

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it (:meth:`KVSpec.for_model` for ``name:config``)."""
        return kv.for_model(f"{self.name}:{self.config.config}", self.chunk_tokens)  # type: ignore[attr-defined]

    def key_rope(self, kv: KVSpec, layout: str | None, latents: torch.Tensor) -> KeyRope | None:
        """The caches' :class:`KeyRope` for chunks shaped like ``latents`` when keys are cached
        before RoPE — the spec's method asks for it, or ``layout`` is ``pre-rope`` (whatever the
        spec; ``post-rope`` or None: as the spec) — else None."""
        if layout is not None and layout not in LAYOUTS:
            raise UsageError(f"key layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if "pre-rope" not in (layout, kv.key_layout):
            return None
        return wan_key_rope(self.components.transformer, latents)

    def profile_heads(self, prompt: str, seed: int, probe: Any) -> None:
        """Generate ``prompt`` with the full-precision cache while ``probe`` measures every
        cache read (``jbkv profile-heads``)."""
        probe.begin_sample(prompt, seed)
        self.generate_latents(prompt, seed, FULL_PRECISION, probe=probe)  # type: ignore[attr-defined]


def decode_wan(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents ``[1, C, F, h, w]`` -> uint8 frames ``[T, H, W, 3]`` on the CPU.

    ``z = latents · std + mean`` (the VAE config's per-channel statistics), decoded to [−1, 1]
    and mapped to ``round((x + 1) · 127.5)``.
    """
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    z = (latents * std.to(latents) + mean.to(latents)).to(vae.dtype)
    video = vae.decode(z, return_dict=False)[0]  # [1, 3, T, H, W] in [-1, 1]
    frames = ((video[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().cpu()


# --------------------------------------------------------------------------- tiny, in memory


def tiny_tokenizer() -> Any:
    """A character-level tokenizer (pad 0, eos 1, unk 2 as in T5/UMT5), built without files."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    symbols = string.ascii_letters + string.digits + string.punctuation
    vocab = {token: i for i, token in enumerate(specials + list(symbols))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", vocab["</s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=TINY_MAX_SEQUENCE_LENGTH,
    )


# diffusers' tiny Wan test transformer, except attention_head_dim = 32 (12 upstream) so that
# the default quantization group g = 32 divides the head dim.
TINY_WAN_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=32,
    in_channels=16,
    out_channels=16,
    text_dim=TINY_TEXT_DIM,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)


def tiny_parts(transformer_cls: Any, seed: int, dtype: torch.dtype) -> tuple[Any, Any, Any, Any]:
    """``(transformer, vae, text_encoder, tokenizer)``: ``transformer_cls(**TINY_WAN_TRANSFORMER)``
    and the tiny VAE / UMT5 / tokenizer, random from ``seed`` (the global RNG is left untouched),
    in eval mode; transformer (keeping diffusers' fp32 modules) and text encoder in ``dtype``."""
    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = transformer_cls(**TINY_WAN_TRANSFORMER)
        vae, text_encoder = tiny_vae_and_text_encoder(len(tokenizer))
    for module in (transformer, vae, text_encoder):
        module.eval().requires_grad_(False)
    if dtype != torch.float32:
        cast_keeping_fp32(transformer, dtype)
        text_encoder.to(dtype)
    return transformer, vae, text_encoder, tokenizer


def tiny_vae_and_text_encoder(vocab_size: int) -> tuple[Any, Any]:
    """diffusers' tiny Wan VAE (base_dim 3, z_dim 16, 8x spatial, 4x temporal) and a 2-layer
    UMT5 encoder of width :data:`TINY_TEXT_DIM`, randomly initialised from the global RNG."""
    import diffusers
    import transformers

    vae = diffusers.AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    text_config = transformers.UMT5Config(
        vocab_size=vocab_size,
        d_model=TINY_TEXT_DIM,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
    )
    return vae, transformers.UMT5EncoderModel(text_config)


# --------------------------------------------------------------------------- options

ATTENTION_BACKENDS = ("fused", "flex", "reference")
MAX_LATENT_FRAMES = 1024  # Wan 2.1's rotary table (rope_max_seq_len); tiny-random: its own

# The options both Wan-family adapters take (each adds its own); see jbkv_cli.models.limits.
WAN_OPTIONS: dict[str, Spec] = {
    "weights": limits.PATH,
    "device": limits.DEVICE,
    "dtype": limits.DTYPE,
    "attention_backend": Spec("str", choices=ATTENTION_BACKENDS),
    "init_seed": limits.SEED,
    "steps": limits.STEPS,
    "chunk_frames": Spec("int", lo=1, hi=MAX_LATENT_FRAMES),
    "num_chunks": limits.CHUNKS,
    "num_frames": Spec("int", lo=1, hi=4 * (MAX_LATENT_FRAMES - 1) + 1),
    "height": limits.SIDE,
    "width": limits.SIDE,
    "shift": Spec("float", lo=0, lo_open=True, hi=100),
    "fps": limits.FPS,
}


def rope_frames(config: str) -> int:
    """Latent frames the rotary table of ``config``'s transformer covers (tiny-random: the tiny
    transformer's; the released checkpoints: Wan 2.1's 1,024)."""
    return (
        TINY_WAN_TRANSFORMER["rope_max_seq_len"] if config == "tiny-random" else MAX_LATENT_FRAMES
    )


def check_latent_frames(model: str, config: str, chunk_frames: int, num_chunks: int) -> None:
    """Refuse more latent frames than the rotary table holds, before the model is built."""
    frames = rope_frames(config)
    if chunk_frames * num_chunks > frames:
        raise UsageError(
            f"{model}: {num_chunks} chunks of {chunk_frames} latent frames exceed the rotary "
            f"table of config {config} ({frames} latent frames): num_chunks must be in "
            f"1..{max(1, frames // chunk_frames)}"
        )


def checked_options(
    model: str, options: dict[str, Any], known: frozenset[str], configs: Any, default: str
) -> dict[str, Any]:
    """``options`` without None values and with ``config`` set (``default`` when absent);
    unknown option names or configs are one-line errors naming the choices."""
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(
            f"unknown {model} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    options.setdefault("config", default)
    if options["config"] not in configs:
        raise UsageError(
            f"unknown {model} config {options['config']!r}; choose: {', '.join(configs)}"
        )
    return options


def chunks_for_frames(num_frames: int, chunk_frames: int, num_chunks: int | None) -> int:
    """Whole chunks of ``chunk_frames`` latent frames for a ``num_frames``-frame video.

    The Wan VAE maps F latent frames to ``4·(F − 1) + 1`` frames, so ``num_frames`` must be
    ``4·(chunks·k − 1) + 1``; a ``num_chunks`` given as well must agree.
    """
    k = chunk_frames
    latent = (num_frames - 1) // 4 + 1
    if num_frames < 1 or (num_frames - 1) % 4 or latent % k:
        raise UsageError(
            f"num_frames={num_frames} is not 4·(chunks·{k} − 1) + 1 for whole chunks of {k} "
            f"latent frames (e.g. {4 * (5 * k - 1) + 1} for 5 chunks)"
        )
    if num_chunks is not None and int(num_chunks) != latent // k:
        raise UsageError(f"num_frames={num_frames} and num_chunks={num_chunks} disagree")
    return latent // k


def runtime_options(options: dict[str, Any]) -> tuple[str, str, str | None]:
    """``(device, dtype, attention_backend)`` from ``options``: cuda when available, bfloat16 on
    cuda and float32 on cpu, jbkv's default backend; unknown values are one-line errors."""
    device = str(options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = str(options.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32"))
    dtype_from_name(dtype)
    backend = options.get("attention_backend")
    if backend is not None and backend not in ATTENTION_BACKENDS:
        raise UsageError(
            f"unknown attention_backend {backend!r}; choose: {', '.join(ATTENTION_BACKENDS)}"
        )
    return device, dtype, backend


def check_frame_size(values: dict[str, Any]) -> None:
    """``height``/``width`` in ``values`` become ints, positive multiples of 16 (VAE 8 × patch 2)."""
    for name in ("height", "width"):
        values[name] = int(values[name])
        if values[name] < 16 or values[name] % 16:
            raise UsageError(f"{name} must be a positive multiple of 16, got {values[name]}")
