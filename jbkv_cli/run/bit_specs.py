"""Key and value precision on the command line: ``--bits 4``, ``K4V2``, per layer, or AsymKV's rule.

A bit spec is one of

- a plain width (``4``: keys and values at 4 bits, today's variants and ids);
- ``K<bits>V<bits>`` (case-insensitive), each side one of 1, 2, 3, 4, 8 or 16 (16: that side
  stays in full precision). ``K2V16`` is the keys-only variant (id ``…-konly``), ``K16V2``
  values-only, ``K4V2`` stores keys at 4 and values at 2 bits with the same method (id
  ``kint4-…-vint2-…``, label ``K INT4 … / V INT2 …``; :class:`~jbkv_cli.kvcache.KVSpec`).
  ``K16V16`` is the reference every run holds, so it is refused;
- **per layer** (:class:`LayerBits`): items joined by ``+``, each a width or pair with an
  optional ``@RANGE`` of attention layers (0-based): ``a-b`` (a to b, both included), ``a-``
  (a to the model's last layer) or ``a`` (that layer). At most one item has no range: the
  default of every layer no range names; without one the ranges must cover every layer. Ranges
  may not overlap. ``K2V2@0-3+K2V1@4-`` keeps layers 0–3 at K2V2 and the rest at K2V1;
  ``K4V4+K2V1@8-`` is the rule "K2V1 in layers ≥ 8, K4V4 below". One spec is one variant (one
  id, e.g. ``k2v2l0to3-k2v1l4up-rtn-g32``, one label ``K2V2@0-3+K2V1@4- rtn g32``); a
  per-layer spec whose layers all get one pair is that pair (``K2V1@0-`` is ``K2V1``);
- ``asymkv:LK/LV``, after AsymKV (Tao et al., COLING 2025, arXiv 2410.13212): keys at 2 bits
  in the first ``LK`` layers and 1 bit after, values at 2 bits in the first ``LV`` layers and 1
  bit after (the paper's "AsymKV-l_k/l_v"; its headline Llama-2-7b setting is ``16/0``, per
  the abstract and a third-party summary: the paper's text and code were not available). It is
  a spelling of the per-layer spec it expands to (``asymkv:16/0`` is ``K1V1+K2V1@0-15``);
  differences from the paper: docs/corrections.md, "After AsymKV".

``,`` separates specs in ``quantize-eval``'s sweep, so it cannot appear inside one. Where a
method does not support a side's width the sweep leaves that method out for that spec, as for a
plain width; a spec given with ``--bits`` that no chosen method supports is refused (a default
grid's widths are left out where undefined; ``generate``: the one method refuses).
The layer ranges are checked against the model's attention layers once it is known (before
anything is created): :meth:`LayerBits.check`.

**1 bit.** A 1-bit code has two levels, the ends of the group's grid (RTN: ``z`` and
``z + Δ``, ``Δ`` the group's whole range). The taylor correction is a second-order expansion of
``log E[exp(τ q·ε)]`` for small steps and noise independent of the key; at 1 bit neither holds
(``τ|q_c|Δ/2`` is no longer small, and a two-level code moves each value to the nearer end, an
error set by the key itself), so a run says so for every taylor variant with 1-bit keys
(:func:`taylor_outside`; the row's ``taylor_outside`` and a table note), while ``exact`` and
``signed`` run as they are (what each does there: docs/corrections.md, "1-bit keys").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jbkv_cli.utils.errors import UsageError, shown

WIDTHS = (1, 2, 3, 4, 8)  # a quantized side (1: where a method supports it)
SIDE_WIDTHS = (*WIDTHS, 16)  # 16: the side stays in full precision
_PAIR = re.compile(r"k(\d+)v(\d+)", re.IGNORECASE)
_RANGE = re.compile(r"(\d+)(?:(-)(\d+)?)?")
_ASYMKV = re.compile(r"asymkv:(\d+)/(\d+)", re.IGNORECASE)
ASYMKV_BITS = (2, 1)  # AsymKV's high and low widths (its main experiments)
MAX_LAYER = 10_000
USAGE = (
    "give widths 1, 2, 3, 4, 8, K<bits>V<bits> with 1, 2, 3, 4, 8, 16 per side, per-layer "
    "specs such as K2V2@0-3+K2V1@4-, or asymkv:LK/LV (e.g. 4,K4V2,K2V16)"
)


@dataclass(frozen=True, order=True)
class BitPair:
    """Bits of the stored keys and values (16: full precision)."""

    key: int
    value: int

    @property
    def uniform(self) -> bool:
        """Both sides at one width: a plain ``--bits`` value."""
        return self.key == self.value

    @property
    def id_part(self) -> str:
        """``k2v1``: the pair in a variant id."""
        return f"k{self.key}v{self.value}"

    def __str__(self) -> str:
        return str(self.key) if self.uniform else f"K{self.key}V{self.value}"


@dataclass(frozen=True, order=True)
class LayerRange:
    """Attention layers ``start`` to ``stop`` (both included; ``stop`` None: to the last)."""

    start: int
    stop: int | None = None

    def __post_init__(self) -> None:
        if self.start < 0 or (self.stop is not None and self.stop < self.start):
            raise ValueError(f"layer range {self} is empty or negative")

    def covers(self, layer: int) -> bool:
        return self.start <= layer and (self.stop is None or layer <= self.stop)

    def overlaps(self, other: LayerRange) -> bool:
        first, second = sorted((self, other), key=lambda r: r.start)
        return first.stop is None or second.start <= first.stop

    @property
    def id_part(self) -> str:
        """``l0to3``, ``l4up``, ``l5``: the range in a variant id."""
        if self.stop is None:
            return f"l{self.start}up"
        return f"l{self.start}" if self.stop == self.start else f"l{self.start}to{self.stop}"

    def __str__(self) -> str:
        if self.stop is None:
            return f"{self.start}-"
        return str(self.start) if self.stop == self.start else f"{self.start}-{self.stop}"


@dataclass(frozen=True)
class LayerBits:
    """Key and value bits per attention layer: ``default`` for the layers no range names (None:
    the ranges must cover every layer), ``ranges`` (sorted, disjoint) for the rest.

    Built by :func:`parse_bit_spec` in canonical form (ranges sorted, adjacent ranges with one
    pair merged), so one behaviour has one spec, one id and one label."""

    default: BitPair | None
    ranges: tuple[tuple[LayerRange, BitPair], ...]

    def __post_init__(self) -> None:
        spans = [r for r, _ in self.ranges]
        for i, a in enumerate(spans):
            for b in spans[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"layer ranges {a} and {b} overlap")

    def at(self, layer: int) -> BitPair:
        """The pair of ``layer`` (``ValueError`` when no range and no default names it)."""
        for span, pair in self.ranges:
            if span.covers(layer):
                return pair
        if self.default is None:
            raise ValueError(f"layer {layer} has no width: add a default (a pair with no @range)")
        return self.default

    def check(self, layers: int) -> None:
        """``ValueError`` unless the spec fits a model of ``layers`` attention layers (0 to
        ``layers − 1``): every range starts and ends inside, every layer has a width."""
        last = layers - 1
        for span, _ in self.ranges:
            end = span.start if span.stop is None else span.stop
            if end > last:
                raise ValueError(f"layer range {span} is outside the model's layers 0-{last}")
        for layer in range(layers):
            self.at(layer)

    def per_layer(self, layers: int) -> list[BitPair]:
        """Each layer's pair, for a model of ``layers`` attention layers (:meth:`check`ed)."""
        self.check(layers)
        return [self.at(i) for i in range(layers)]

    @property
    def pairs(self) -> list[BitPair]:
        """Every pair the spec names, the default first, then by range."""
        named = ([self.default] if self.default is not None else []) + [p for _, p in self.ranges]
        return list(dict.fromkeys(named))

    def widths(self, role: str) -> list[int]:
        """Every width of ``role`` (``key`` or ``value``) the spec names, 16 included."""
        return list(dict.fromkeys(getattr(p, role) for p in self.pairs))

    @property
    def id_part(self) -> str:
        """``k2v2l0to3-k2v1l4up``: the spec in a variant id (file-safe)."""
        items = [self.default.id_part] if self.default is not None else []
        return "-".join(items + [p.id_part + r.id_part for r, p in self.ranges])

    def __str__(self) -> str:
        items = [_pair_text(self.default)] if self.default is not None else []
        return "+".join(items + [f"{_pair_text(p)}@{r}" for r, p in self.ranges])


BitSpec = BitPair | LayerBits


def _pair_text(pair: BitPair) -> str:
    """``K2V2``: a pair in a per-layer spec, always with both sides."""
    return f"K{pair.key}V{pair.value}"


def _parse_pair(item: str) -> BitPair:
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
        raise ValueError(f"{shown(item)} has a side outside 1, 2, 3, 4, 8, 16: {USAGE}")
    return BitPair(key, value)


def _parse_range(text: str) -> LayerRange:
    match = _RANGE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{shown(text)} is not a layer range (a-b, a- or a): {USAGE}")
    start, dash, stop = match.groups()
    first = int(start)
    last = None if dash and stop is None else int(stop if stop is not None else start)
    if max(first, last or 0) > MAX_LAYER:
        raise ValueError(f"layer range {shown(text)} is beyond layer {MAX_LAYER}")
    if last is not None and last < first:
        raise ValueError(f"layer range {shown(text)} ends before it starts")
    return LayerRange(first, last)


def asymkv_layers(key_layers: int, value_layers: int) -> BitSpec:
    """AsymKV's ``l_k/l_v`` rule: keys at 2 bits in layers ``< l_k``, values in layers
    ``< l_v``, 1 bit elsewhere (``ASYMKV_BITS``), as a per-layer spec."""
    high, low = ASYMKV_BITS
    cuts = sorted({0, key_layers, value_layers})
    ranges = []
    for lo, hi in zip(cuts, [*cuts[1:], None], strict=True):
        if hi is not None and hi <= lo:
            continue
        pair = BitPair(high if lo < key_layers else low, high if lo < value_layers else low)
        ranges.append((LayerRange(lo, None if hi is None else hi - 1), pair))
    # the open-ended tail is the default: the rule holds for any depth
    *named, (_, tail) = ranges
    return _canonical(tail, named)


def _canonical(default: BitPair | None, ranges: list[tuple[LayerRange, BitPair]]) -> BitSpec:
    """Sorted ranges, adjacent ones with one pair merged, ranges equal to the default kept (they
    still bound the model's depth); a spec with a single pair for every layer is that pair."""
    merged: list[tuple[LayerRange, BitPair]] = []
    for span, pair in sorted(ranges):
        if merged:
            last, last_pair = merged[-1]
            if last.stop is not None and last.stop + 1 == span.start and last_pair == pair:
                merged[-1] = (LayerRange(last.start, span.stop), pair)
                continue
        merged.append((span, pair))
    spec = LayerBits(default, tuple(merged))  # overlaps: ValueError
    if not merged and default is not None:
        return default
    if default is None and len(merged) == 1 and merged[0][0] == LayerRange(0, None):
        return merged[0][1]
    return spec


def parse_bit_spec(text: str) -> BitSpec:
    """One spec (``4``, ``K4V2``, ``K2V2@0-3+K2V1@4-``, ``asymkv:16/0``); ``ValueError`` saying
    what is allowed."""
    item = text.strip()
    rule = _ASYMKV.fullmatch(item)
    if rule is not None:
        key_layers, value_layers = (int(g) for g in rule.groups())
        if max(key_layers, value_layers) > MAX_LAYER:
            raise ValueError(f"{shown(item)}: AsymKV's layer counts are beyond {MAX_LAYER}")
        return asymkv_layers(key_layers, value_layers)
    if "@" not in item and "+" not in item:
        pair = _parse_pair(item)
        if pair.key == pair.value == 16:
            raise ValueError(
                f"{shown(item)} is the 16-bit reference, which every run holds: {USAGE}"
            )
        return pair
    default, ranges = None, []
    for part in item.split("+"):
        head, at, where = part.strip().partition("@")
        pair = _parse_pair(head.strip())
        if not at:
            if default is not None:
                raise ValueError(f"{shown(item)} has two defaults (pairs with no @range)")
            default = pair
        else:
            ranges.append((_parse_range(where), pair))
    spec = _canonical(default, ranges)
    pairs = [spec] if isinstance(spec, BitPair) else spec.pairs
    if all(p.key == p.value == 16 for p in pairs):
        raise ValueError(f"{shown(item)} is the 16-bit reference, which every run holds: {USAGE}")
    return spec


def parse_bit_list(text: str, option: str = "--bits") -> list[BitSpec]:
    """A comma list of specs, duplicates dropped (``4`` and ``K4V4`` are one); a bad one is a
    :class:`UsageError` naming ``option``."""
    items = [x for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"bad {option} {shown(text)}: {USAGE}")
    try:
        return list(dict.fromkeys(parse_bit_spec(x) for x in items))
    except ValueError as exc:
        raise UsageError(f"bad {option}: {exc}") from None


def taylor_outside(key_widths: list[int] | tuple[int, ...], correction: str) -> bool:
    """Whether a variant applies the taylor correction to 1-bit keys (in some layer): outside
    the expansion's range (module docstring); the run and its report say so."""
    return correction == "taylor" and 1 in key_widths


def side_bits(bits: int, key_bits: int | None, value_bits: int | None) -> BitPair:
    """``generate``'s precision: ``--bits`` for both sides unless ``--key-bits`` /
    ``--value-bits`` set one; each side one of 1, 2, 3, 4, 8, 16 (:class:`UsageError`
    otherwise)."""
    pair = BitPair(
        bits if key_bits is None else key_bits, bits if value_bits is None else value_bits
    )
    for name, width in (("--key-bits", pair.key), ("--value-bits", pair.value)):
        if width not in SIDE_WIDTHS:
            flag = "--bits" if (key_bits if name == "--key-bits" else value_bits) is None else name
            raise UsageError(f"{flag} must be one of 1, 2, 3, 4, 8, 16, got {width}")
    return pair
