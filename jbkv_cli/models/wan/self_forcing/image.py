"""Image-to-video for the frame-wise Causal-Forcing models: the conditioning image as latent
frame 0.

As upstream's ``inference.py --i2v`` (thu-ml/Causal-Forcing @1fc7bbc1): the image is resized to
the video's ``height × width`` (``transforms.Resize((480, 832))`` on a PIL image, i.e. PIL's
bilinear resize, no crop), scaled to [−1, 1] (``ToTensor`` then ``Normalize([0.5], [0.5])``)
and encoded by the Wan VAE as one frame; ``WanVAEWrapper.encode_to_latent`` keeps the
posterior mean, normalised per channel, ``(μ − mean) / std`` — here diffusers'
``AutoencoderKLWan`` ``latent_dist.mode()`` with the config's ``latents_mean`` /
``latents_std``, the inverse of :func:`~jbkv_cli.models.wan.decode.decode_wan`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from PIL import Image

from jbkv_cli.utils.errors import UsageError, shown
from jbkv_cli.utils.library_output import quiet_warnings

BOMBS = (Image.DecompressionBombError, Image.DecompressionBombWarning)


def read_image(path: str, case: str) -> Image.Image:
    """The case's image as RGB; one usage error naming the case when it cannot be read. An
    image of more pixels than Pillow's ``MAX_IMAGE_PIXELS`` (a decompression bomb, or a size
    no video model is fed) is refused before it is decoded, where Pillow would only warn; its
    other warnings are dropped (:func:`~jbkv_cli.utils.library_output.quiet_warnings`)."""
    try:
        with quiet_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                return img.convert("RGB")
    except (OSError, ValueError, *BOMBS) as exc:
        reason = " ".join(str(exc).split())[:120]
        raise UsageError(f"case {shown(case)}: cannot read image {path}: {reason}") from None


def image_pixels(image: Image.Image, height: int, width: int) -> torch.Tensor:
    """``[1, 3, 1, height, width]`` float32 in [−1, 1]: bilinear resize, ``x / 127.5 − 1``."""
    resized = image.resize((width, height), Image.BILINEAR)
    pixels = torch.frombuffer(bytearray(resized.tobytes()), dtype=torch.uint8)
    pixels = pixels.view(height, width, 3).permute(2, 0, 1).float() / 255.0
    return ((pixels - 0.5) / 0.5)[None, :, None]


def encode_image(
    vae: Any, path: str, case: str, height: int, width: int, device: str
) -> torch.Tensor:
    """The image at ``path`` as a normalised latent frame ``[1, C, 1, h, w]`` (float32)."""
    pixels = image_pixels(read_image(path, case), height, width)
    with torch.no_grad():
        posterior = vae.encode(pixels.to(device, vae.dtype)).latent_dist
        mu = posterior.mode().float()
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, -1, 1, 1, 1)
    return (mu - mean.to(mu.device)) / std.to(mu.device)
