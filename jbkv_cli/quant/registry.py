"""The compression methods by name: the one list the CLI choices, help texts, table order and
validation come from. Adding a method is one module plus one line below (or, from outside the
package, one :func:`register_method` call)."""

from __future__ import annotations

from typing import Any

from jbkv_cli.quant.kivi import KIVI
from jbkv_cli.quant.kvquant import KVQuant
from jbkv_cli.quant.method import KVMethod
from jbkv_cli.quant.quantwm import QuantWM, QuantWMBase, QuantWMPSAC, QuantWMQSAC
from jbkv_cli.quant.quarot import QuaRot
from jbkv_cli.quant.qvg import QVG
from jbkv_cli.quant.rtn import RTN, RTNNearest
from jbkv_cli.quant.turboquant import TurboQuantMSE, TurboQuantProd

METHODS: dict[str, type[KVMethod]] = {}


def register_method(cls: type[KVMethod]) -> type[KVMethod]:
    """Make ``cls`` available by ``cls.name`` (usable as a class decorator)."""
    if not cls.name or not cls.name.replace("-", "").isalnum() or cls.name != cls.name.lower():
        raise ValueError(f"a method name must be lower-case letters, digits and '-': {cls.name!r}")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"a method named {cls.name!r} is already registered")
    METHODS[cls.name] = cls
    return cls


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def build_method(name: str, bits: int, group_size: int = 32, **options: Any) -> KVMethod:
    """The method ``name`` with these settings; ``ValueError`` for unknown names or options."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    try:
        return METHODS[name](bits=bits, group_size=group_size, **options)
    except TypeError as exc:
        raise ValueError(f"method {name!r} does not take these options ({exc})") from None


def table_rank(name: str) -> int:
    """Position of a method in tables: registration order (unknown names last)."""
    names = list(METHODS)
    return names.index(name) if name in names else len(names)


for _cls in (
    RTN,
    RTNNearest,
    QuaRot,
    KIVI,
    QVG,
    QuantWM,
    QuantWMQSAC,
    QuantWMPSAC,
    QuantWMBase,
    TurboQuantMSE,
    TurboQuantProd,
    KVQuant,
):
    register_method(_cls)
