"""Loading the official encoders offline (Qwen2.5-VL-7B text model, ByT5 + Glyph-SDXL-v2,
FLUX.1-Redux's SigLIP), as upstream's ``_load_text_encoders``, ``_load_byt5`` and
``_load_vision_encoder`` do (Tencent-Hunyuan/HY-WorldPlay@da2d0c2
``hyvideo/pipelines/worldplay_video_pipeline.py``):

- Qwen: ``AutoModel``'s ``language_model`` (here ``Qwen2_5_VLModel``'s), fp16, the tokenizer
  padding right; the vision tower is dropped after loading.
- ByT5: google/byt5-small's config and byte tokenizer, Glyph-SDXL-v2's color and font tokens
  added (``<color-i>``, ``<xx-font-j>``, as ``add_special_token``), the embedding resized to
  the new vocabulary, then Glyph's encoder weights loaded strictly (byt5-small's own weights
  are never read: every encoder tensor comes from Glyph's checkpoint).
- SigLIP: ``image_encoder/`` and ``feature_extractor/`` of FLUX.1-Redux-dev, fp16.

On the CPU the encoders run in float32 (fp16 matmuls there are slow and some are missing).
"""

from __future__ import annotations

from pathlib import Path

import torch

from jbkv_cli.models.hy_worldplay.checkpoint import WeightPaths
from jbkv_cli.models.hy_worldplay.encoders import Encoders
from jbkv_cli.models.safetensors_io import check_state_dict, open_safetensors
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.jsonio import read_json
from jbkv_cli.utils.pretrained import from_pretrained


def glyph_tokens(glyph: Path) -> list[str]:
    """Glyph-SDXL-v2's special tokens: colors then multilingual fonts (upstream's order)."""
    fonts = read_json(glyph / "assets" / "multilingual_10-lang_idx.json", "Glyph font index")
    colors = read_json(glyph / "assets" / "color_idx.json", "Glyph color index")
    if not isinstance(fonts, dict) or not isinstance(colors, dict):
        raise JbkvError(f"{glyph / 'assets'}: the color and font indexes must be JSON objects")
    return [f"<color-{i}>" for i in range(len(colors))] + [
        f"<{code[:2]}-font-{fonts[code]}>" for code in fonts
    ]


def load_byt5(paths: WeightPaths, dtype: torch.dtype):
    from transformers import AutoTokenizer, T5Config, T5EncoderModel

    tokenizer = from_pretrained(AutoTokenizer, paths.byt5, local_files_only=True)
    tokenizer.add_tokens(glyph_tokens(paths.glyph), special_tokens=True)
    config = from_pretrained(T5Config, paths.byt5, local_files_only=True)
    model = T5EncoderModel(config)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    path = paths.glyph / "checkpoints" / "byt5_model.safetensors"
    with open_safetensors(path) as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    check_state_dict(model.encoder, state, f"Glyph-SDXL-v2 ByT5 ({path})")
    model.encoder.load_state_dict(state, strict=True)
    return tokenizer, model.to(dtype).eval()


def load_encoders(paths: WeightPaths, home: str, device: str) -> Encoders:
    """The three encoders on ``home`` (the CPU when offloading), run on ``device``."""
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLModel,
        SiglipImageProcessor,
        SiglipVisionModel,
    )

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    full = from_pretrained(
        Qwen2_5_VLModel,
        paths.qwen,
        torch_dtype=dtype,
        local_files_only=True,
        low_cpu_mem_usage=True,
    )
    qwen = full.language_model
    del full
    qwen_tok = from_pretrained(
        AutoTokenizer, paths.qwen, padding_side="right", local_files_only=True
    )
    byt5_tok, byt5 = load_byt5(paths, dtype)
    siglip = from_pretrained(
        SiglipVisionModel, paths.siglip / "image_encoder", torch_dtype=dtype, local_files_only=True
    )
    processor = from_pretrained(
        SiglipImageProcessor, paths.siglip / "feature_extractor", local_files_only=True
    )
    for m in (qwen, byt5, siglip):
        m.requires_grad_(False).eval().to(home)
    return Encoders(qwen, qwen_tok, byt5, byt5_tok, siglip, processor, device=device)
