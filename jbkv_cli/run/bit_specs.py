"""Key and value precision on the command line: ``--bits 4`` or ``--bits K4V2,K2V16,4``.

A bit spec is a plain width (``4``: keys and values at 4 bits, today's variants and ids) or
``K<bits>V<bits>`` (case-insensitive), each side one of 2, 3, 4, 8 or 16 (16: that side stays in
full precision). ``K2V16`` is the keys-only variant (id ``…-konly``), ``K16V2`` values-only,
``K4V2`` stores keys at 4 and values at 2 bits with the same method (id
``kint4-…-vint2-…``, label ``K INT4 … / V INT2 …``; :class:`~jbkv_cli.kvcache.KVSpec`).
``K16V16`` is the reference every run holds, so it is refused. Where a method does not support
a side's width the sweep leaves that combination out, as for a plain width.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jbkv_cli.utils.errors import UsageError, shown

WIDTHS = (2, 3, 4, 8)  # a quantized side
SIDE_WIDTHS = (*WIDTHS, 16)  # 16: the side stays in full precision
_PAIR = re.compile(r"k(\d+)v(\d+)", re.IGNORECASE)
USAGE = "give widths 2, 3, 4, 8 or K<bits>V<bits> with 2, 3, 4, 8, 16 per side (e.g. 4,K4V2,K2V16)"


@dataclass(frozen=True, order=True)
class BitPair:
    """Bits of the stored keys and values (16: full precision)."""

    key: int
    value: int

    @property
    def uniform(self) -> bool:
        """Both sides at one width: a plain ``--bits`` value."""
        return self.key == self.value

    def __str__(self) -> str:
        return str(self.key) if self.uniform else f"K{self.key}V{self.value}"


def parse_bit_spec(text: str) -> BitPair:
    """One spec (``4``, ``K4V2``); ``ValueError`` saying what is allowed."""
    item = text.strip()
    if item.isdigit():
        width = int(item)
        if width not in WIDTHS:
            raise ValueError(f"{shown(item)} is not a width: {USAGE}")
        return BitPair(width, width)
    match = _PAIR.fullmatch(item)
    if match is None:
        raise ValueError(f"{shown(item)} is neither a width nor K<bits>V<bits>: {USAGE}")
    key, value = (int(g) for g in match.groups())
    if key not in SIDE_WIDTHS or value not in SIDE_WIDTHS:
        raise ValueError(f"{shown(item)} has a side outside 2, 3, 4, 8, 16: {USAGE}")
    if key == value == 16:
        raise ValueError(f"{shown(item)} is the 16-bit reference, which every run holds: {USAGE}")
    return BitPair(key, value)


def parse_bit_list(text: str, option: str = "--bits") -> list[BitPair]:
    """A comma list of specs, duplicates dropped (``4`` and ``K4V4`` are one); a bad one is a
    :class:`UsageError` naming ``option``."""
    items = [x for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"bad {option} {shown(text)}: {USAGE}")
    try:
        return list(dict.fromkeys(parse_bit_spec(x) for x in items))
    except ValueError as exc:
        raise UsageError(f"bad {option}: {exc}") from None


def side_bits(bits: int, key_bits: int | None, value_bits: int | None) -> BitPair:
    """``generate``'s precision: ``--bits`` for both sides unless ``--key-bits`` /
    ``--value-bits`` set one; each side one of 2, 3, 4, 8, 16 (:class:`UsageError` otherwise)."""
    pair = BitPair(
        bits if key_bits is None else key_bits, bits if value_bits is None else value_bits
    )
    for name, width in (("--key-bits", pair.key), ("--value-bits", pair.value)):
        if width not in SIDE_WIDTHS:
            flag = "--bits" if (key_bits if name == "--key-bits" else value_bits) is None else name
            raise UsageError(f"{flag} must be one of 2, 3, 4, 8, 16, got {width}")
    return pair
