"""KV-cache compression methods (one module each) and what they store.

- :mod:`~jbkv_cli.quant.method`: the :class:`KVMethod` base every method subclasses.
- :mod:`~jbkv_cli.quant.registry`: the methods by name (``rtn``, ``rtn-nearest``, ``quarot``, ...).
- :mod:`~jbkv_cli.quant.tensor`: :class:`QuantizedTensor`, what a method returns.
- :mod:`~jbkv_cli.quant.groupwise`, :mod:`~jbkv_cli.quant.rotation`: shared primitives.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from jbkv_cli.quant.method import KVMethod, check_tensor
from jbkv_cli.quant.registry import METHODS, build_method, method_names, register_method
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.tensor import GroupQuantized, QuantizedTensor, RawTensor

__all__ = [
    "METHODS",
    "GroupQuantized",
    "KVMethod",
    "QuantizedTensor",
    "RandomHadamard",
    "RawTensor",
    "build_method",
    "method_names",
    "quantize_kv",
    "register_method",
]


def quantize_kv(
    x: torch.Tensor,
    bits: int = 2,
    group_size: int = 32,
    scheme: str = "rtn",
    *,
    role: str = "key",
    seed: int = 0,
    block_size: int | None = None,
    **options: Any,
) -> QuantizedTensor:
    """Store keys or values ``x [..., L, D]`` with method ``scheme`` (a registry name).

    ``scheme="none"`` or ``bits=16`` stores ``x`` unchanged. ``seed`` and ``block_size`` go to
    rotation methods (``quarot``) and are ignored by the others; other ``options`` pass through
    to the method. The result's ``step`` is the stored Δ the Jensen-bias correction must use.
    """
    if scheme == "none" or bits == 16:
        check_tensor(x)
        return RawTensor(x)
    names = {f.name for f in fields(METHODS[scheme])} if scheme in METHODS else set()
    rotation = {"seed": seed, "block_size": block_size}
    options |= {k: v for k, v in rotation.items() if k in names}
    return build_method(scheme, bits, group_size, **options).quantize(x, role)  # type: ignore[arg-type]
