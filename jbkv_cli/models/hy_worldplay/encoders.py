"""HY-WorldPlay's condition encoders: Qwen2.5-VL (prompt), ByT5 (quoted glyph text), SigLIP
(image), reusing diffusers' and transformers' modules where they are upstream's.

What is reused (and checked to be upstream's, Tencent-Hunyuan/HY-WorldPlay@da2d0c2):

- **Prompt**: diffusers 0.42's ``HunyuanVideo15ImageToVideoPipeline._get_mllm_prompt_embeds``
  (chat template of the system message and the prompt, padded to ``1000 + crop_start``, hidden
  state 3 from the end, the template's tokens cropped) with its default system message, which
  is upstream's ``PROMPT_TEMPLATE_ENCODE_VIDEO_JSON`` (``hyvideo/models/text_encoders/
  __init__.py``; the tests compare the two strings). The encoder is transformers'
  ``Qwen2_5_VLTextModel`` (upstream: ``AutoModel(...).language_model``, the same module).
  ``crop_start`` is computed as upstream does (the position after ``<|im_start|>user\\n`` in
  the tokenized template) instead of diffusers' constant 108, so it also holds for the tiny
  tokenizer.
- **Glyph text**: diffusers' ``_get_byt5_prompt_embeds`` (quoted substrings, formatted
  ``Text "x". `` each as upstream's ``MultilingualPromptFormat.format_prompt`` does for
  unstyled text, 256 byte tokens) with transformers' ``T5EncoderModel`` (upstream:
  ``T5ForConditionalGeneration.get_encoder()``, the same ``T5Stack``), the Glyph-SDXL-v2
  special tokens added and its weights loaded.
- **Image**: transformers' ``SiglipVisionModel`` + ``SiglipImageProcessor`` (upstream's
  ``VisionEncoder``), fed the image resized and center-cropped to the bucket of the 480p
  target (``get_closest_resolution_given_reference_image``, ``resize_and_center_crop``); 729
  tokens of 1152 for FLUX.1-Redux's SigLIP.

Only valid tokens leave this module (``[1, L, D]``): the transformer reads nothing else.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

USER_MARKER = "<|im_start|>user\n"
QWEN_MAX_LENGTH = 1000
HIDDEN_STATE_SKIP = 2
BYT5_MAX_LENGTH = 256
BUCKET_BASE = 640  # "480p": bucket_hw_base_size
BUCKET_STRIDE = 16


def _pipeline():
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    return HunyuanVideo15ImageToVideoPipeline


def system_message() -> str:
    """The system message of diffusers' ``_get_mllm_prompt_embeds`` (upstream's video one)."""
    fn = _pipeline()._get_mllm_prompt_embeds
    return inspect.signature(fn).parameters["system_message"].default


def crop_start(tokenizer: Any) -> int:
    """Tokens before the prompt in the chat template (upstream's ``calculate_crop_start``):
    the end of ``<|im_start|>user\\n`` in the tokenized template of a sample prompt; 0 if the
    marker is not found."""
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5_image2video import (
        format_text_input,
    )

    chat = format_text_input(["a photo of a cat"], system_message())
    ids = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"][0]
    ids = list(ids)
    marker = tokenizer(USER_MARKER, add_special_tokens=False)["input_ids"]
    for i in range(len(ids) - len(marker) + 1):
        if ids[i : i + len(marker)] == marker:
            return i + len(marker)
    return 0


def bucket_size(width: int, height: int) -> tuple[int, int]:
    """``(height, width)`` of the 480p bucket closest to the image's aspect ratio
    (``generate_crop_size_list(640, 16)`` + ``get_closest_ratio``)."""
    patches = round((BUCKET_BASE / BUCKET_STRIDE) ** 2)
    sizes, wp, hp = [], patches, 1
    while wp > 0:
        if max(wp, hp) / min(wp, hp) <= 4.0:
            sizes.append((wp * BUCKET_STRIDE, hp * BUCKET_STRIDE))
        if (hp + 1) * wp <= patches:
            hp += 1
        else:
            wp -= 1
    ratios = np.array([round(float(h) / float(w), 5) for h, w in sizes])
    best = int(np.abs(ratios - float(height) / float(width)).argmin())
    return sizes[best]


def resize_center_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """Scale to cover ``width x height`` (Lanczos), then crop the center (upstream's
    ``resize_and_center_crop`` and its i2v condition transform)."""
    if image.size == (width, height):
        return image
    scale = max(width / image.width, height / image.height)
    rw, rh = round(image.width * scale), round(image.height * scale)
    resized = image.resize((rw, rh), Image.LANCZOS)
    left, top = (rw - width) / 2, (rh - height) / 2
    return resized.crop((left, top, left + width, top + height))


def _valid(emb: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rows of ``emb [L, C]`` where ``mask [L]`` is set: the mask is read on the host (one
    copy per prompt) and the rows gathered by position, so no device value is read."""
    rows = mask.cpu().nonzero().flatten()
    return emb.index_select(0, rows.to(emb.device))


@dataclass
class Encoders:
    """The three encoders and their tokenizers / processor, on ``device``."""

    qwen: Any
    qwen_tokenizer: Any
    byt5: Any
    byt5_tokenizer: Any
    siglip: Any
    siglip_processor: Any
    device: str = "cpu"
    qwen_max_length: int = QWEN_MAX_LENGTH

    def __post_init__(self) -> None:
        self.crop = crop_start(self.qwen_tokenizer)

    def modules(self) -> list[torch.nn.Module]:
        return [self.qwen, self.byt5, self.siglip]

    @torch.no_grad()
    def encode_prompt(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(qwen [1, L, 3584], byt5 [1, Lb, 1472])`` valid tokens (``Lb = 0`` without quoted
        text)."""
        pipe = _pipeline()
        emb, mask = pipe._get_mllm_prompt_embeds(
            self.qwen,
            self.qwen_tokenizer,
            prompt,
            torch.device(self.device),
            tokenizer_max_length=self.qwen_max_length,
            num_hidden_layers_to_skip=HIDDEN_STATE_SKIP,
            crop_start=self.crop,
        )
        qwen = _valid(emb[0], mask[0])[None]
        g_emb, g_mask = pipe._get_byt5_prompt_embeds(
            self.byt5_tokenizer,
            self.byt5,
            prompt,
            torch.device(self.device),
            tokenizer_max_length=BYT5_MAX_LENGTH,
        )
        byt5 = _valid(g_emb[0], g_mask[0])[None]
        return qwen, byt5

    @torch.no_grad()
    def encode_image(self, image: Image.Image) -> torch.Tensor:
        """SigLIP's last hidden state ``[1, N, 1152]`` of ``image`` in its 480p bucket."""
        h, w = bucket_size(image.width, image.height)
        crop = resize_center_crop(image, w, h)
        return _pipeline()._get_image_embeds(
            self.siglip, self.siglip_processor, crop, torch.device(self.device)
        )


def image_condition(image: Image.Image, width: int, height: int) -> torch.Tensor:
    """The VAE's input for the image, ``[1, 3, 1, H, W]`` float32 in [-1, 1]: scaled to cover
    (Lanczos) and center-cropped as torchvision's ``CenterCrop`` rounds (upstream's
    ``get_image_condition_latents`` transform)."""
    scale = max(width / image.width, height / image.height)
    rw, rh = round(image.width * scale), round(image.height * scale)
    resized = image.resize((rw, rh), Image.LANCZOS)
    top, left = round((rh - height) / 2.0), round((rw - width) / 2.0)
    crop = resized.crop((left, top, left + width, top + height))
    pixels = torch.from_numpy(np.asarray(crop, dtype=np.float32) / 255.0)
    pixels = pixels.permute(2, 0, 1) * 2.0 - 1.0
    return pixels[None, :, None]
