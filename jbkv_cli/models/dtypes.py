"""Model dtypes by name (``--model-option dtype=bf16``)."""

from __future__ import annotations

import torch

from jbkv_cli.utils.errors import UsageError

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``/``"float16"``/``"fp16"``/``"float32"``/``"fp32"`` -> dtype."""
    if isinstance(name, torch.dtype):
        return name
    if str(name) not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}; choose one of: {', '.join(DTYPES)}")
    return DTYPES[str(name)]
