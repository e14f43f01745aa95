"""Seeds: every variant of a (prompt, seed) pair starts from the same noise, drawn on the CPU
from a generator seeded with ``sha256(f"{seed}\\0{prompt}")`` (:func:`derive_seed`)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # derive_seed needs no torch (llm-prefill's data, checked at start-up)
    import torch


def derive_seed(seed: int, prompt: str) -> int:
    """A stable 63-bit seed from (seed, prompt): ``sha256(f"{seed}\\0{prompt}")[:8]``."""
    digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def noise_generator(seed: int, prompt: str) -> torch.Generator:
    """A CPU generator seeded from (seed, prompt); draw on the CPU, then move to the device."""
    import torch

    return torch.Generator(device="cpu").manual_seed(derive_seed(seed, prompt))
