"""Typed, bounded options, declared once and checked by one validator.

Methods and pruners declare each option field with :func:`option` (its :class:`Spec` rides in
the dataclass field's metadata) and call :func:`check_fields` in ``__post_init__``; models keep a
``{name: Spec}`` table and call :func:`parse_options`. :meth:`Spec.parse` takes what a command
line gives (a string) or what Python code and JSON files give (numbers, booleans, None) and
returns the one canonical value (``"01"``, ``"+1"`` and ``1`` are all ``1``; a float keeps 10
significant digits), so two equal settings always make the same variant id. A value of the
wrong type, out of range or not finite is refused with a message that names the option and its
allowed range::

    quarot.seed must be an integer in 0..4294967295, got 'abc'
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from jbkv_cli.utils.errors import shown

Kind = Literal["int", "float", "bool", "str", "path", "ints"]
SPEC = "jbkv_spec"  # the dataclass field metadata key
MAX_SEED = 2**32 - 1
MAX_TEXT = 4096  # bytes of a str or path option
_INT = re.compile(r"[+-]?\d{1,30}")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class Spec:
    """One option: its ``kind``, bounds ``lo``/``hi`` (inclusive unless ``lo_open``/``hi_open``),
    ``choices`` (str), ``pattern`` (str, a full match, described by ``what``), ``power_of_two``
    (int), ``optional`` (None allowed: "use the default"), ``cli`` (False: set by jbkv, never
    given by a user), ``note`` (why the bounds, shown after them)."""

    kind: Kind
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    optional: bool = False
    choices: tuple[str, ...] = ()
    pattern: str = ""
    what: str = ""
    power_of_two: bool = False
    cli: bool = True
    note: str = ""

    def describe(self) -> str:
        """The allowed values in words, e.g. ``an integer in 1..256`` or ``a number in (0, 1]``
        (then ``note``, and ``or none`` for an optional one)."""
        text = self._describe() + (f" ({self.note})" if self.note else "")
        return f"{text} (or none)" if self.optional else text

    def _describe(self) -> str:
        if self.what:
            return self.what
        if self.kind == "bool":
            return "true or false"
        if self.kind == "path":
            return "a file path"
        if self.kind == "str":
            return f"one of {', '.join(self.choices)}" if self.choices else "a text"
        if self.kind == "float":
            return "a number" + self._range()
        noun = "integers" if self.kind == "ints" else "an integer"
        if self.power_of_two:
            noun = "a power of two"
        return f"{'a comma list of ' if self.kind == 'ints' else ''}{noun}{self._range()}"

    def _range(self) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            return ""
        if self.kind != "float" and not (self.lo_open or self.hi_open):
            if hi is None:
                return f" >= {num(lo)}"
            if lo is None:
                return f" <= {num(hi)}"
            return f" in {num(lo)}..{num(hi)}"
        if hi is None:
            return f" {'>' if self.lo_open else '>='} {num(lo)}"
        if lo is None:
            return f" {'<' if self.hi_open else '<='} {num(hi)}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f" in {left}{num(lo)}, {num(hi)}{right}"

    def parse(self, raw: Any, label: str) -> Any:
        """``raw`` as this option's canonical value; ``ValueError`` naming ``label`` otherwise."""
        value = self._parse(raw)
        if value is _BAD:
            raise ValueError(f"{label} must be {self.describe()}, got {_shown(raw)}")
        return value

    def _parse(self, raw: Any) -> Any:
        if raw is None or (self.optional and isinstance(raw, str) and raw.strip() == "none"):
            return None if self.optional else _BAD
        if self.kind == "int":
            return self._bounded(_int(raw))
        if self.kind == "ints":
            parts = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(parts, list | tuple) or not parts:
                return _BAD
            values = tuple(self._bounded(_int(p)) for p in parts)
            return _BAD if _BAD in values else values
        if self.kind == "float":
            return self._bounded(_float(raw))
        if self.kind == "bool":
            return _bool(raw)
        return self._text(raw)

    def _bounded(self, x: Any) -> Any:
        if x is _BAD:
            return _BAD
        lo, hi = self.lo, self.hi
        if lo is not None and (x <= lo if self.lo_open else x < lo):
            return _BAD
        if hi is not None and (x >= hi if self.hi_open else x > hi):
            return _BAD
        if self.power_of_two and (x < 1 or x & (x - 1)):
            return _BAD
        return x

    def _text(self, raw: Any) -> Any:
        if self.kind == "path" and isinstance(raw, os.PathLike):
            raw = os.fspath(raw)
        if (
            not isinstance(raw, str)
            or "\0" in raw
            or len(raw.encode("utf-8", "replace")) > MAX_TEXT
        ):
            return _BAD
        if self.kind == "path":
            return raw if raw.strip() else _BAD
        if self.choices and raw not in self.choices:
            return _BAD
        if self.pattern and not re.fullmatch(self.pattern, raw):
            return _BAD
        return raw


_BAD = object()


def _int(raw: Any) -> Any:
    if isinstance(raw, bool):
        return _BAD
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _INT.fullmatch(raw.strip()):
        return int(raw.strip())
    return _BAD


def _float(raw: Any) -> Any:
    if isinstance(raw, bool):
        return _BAD
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            return _BAD
    if not isinstance(raw, int | float):
        return _BAD
    try:
        value = float(raw)
    except OverflowError:
        return _BAD
    if not math.isfinite(value):
        return _BAD
    return float(f"{value:.10g}") + 0.0  # canonical: 10 significant digits, no -0.0


def _bool(raw: Any) -> Any:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    return _BAD


def _shown(raw: Any) -> str:
    return shown(raw) if isinstance(raw, str) else repr(raw)[:60]


def option(default: Any, kind: Kind, **spec: Any) -> Any:
    """A dataclass field with its :class:`Spec` (``option(0, "int", lo=0, hi=MAX_SEED)``)."""
    return field(default=default, metadata={SPEC: Spec(kind, **spec)})


def declared_specs(cls: type) -> dict[str, Spec]:
    """The fields of a dataclass (type or instance) declared with :func:`option`."""
    return {f.name: f.metadata[SPEC] for f in fields(cls) if SPEC in f.metadata}


def specs_of(cls: type) -> dict[str, Spec]:
    """Every field's spec, in field order: the declared one, else one inferred from the field's
    default and annotation (a method written elsewhere with plain fields, ``sigmas: float =
    3.0``, is typed but unbounded); a field whose type cannot be told is left out (not
    settable with ``-M``, not checked)."""
    out = {}
    for f in fields(cls):
        spec = f.metadata.get(SPEC) or _inferred(f)
        if spec is not None:
            out[f.name] = spec
    return out


def _inferred(f: Any) -> Spec | None:
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    optional = f.default is None or "None" in annotation or "Optional" in annotation
    for kind, cls in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if type(f.default) is cls or (f.default is None and kind in annotation.split("|")[0]):
            return Spec(kind, optional=optional)  # type: ignore[arg-type]
    return None


def check_fields(obj: Any, owner: str) -> None:
    """Validate every declared field of the frozen dataclass ``obj`` and store its canonical
    value; ``ValueError`` naming ``owner.field`` for the first bad one."""
    for name, spec in specs_of(obj).items():
        object.__setattr__(obj, name, spec.parse(getattr(obj, name), f"{owner}.{name}"))


def parse_options(
    specs: Mapping[str, Spec],
    given: Mapping[str, Any],
    owner: str,
    *,
    sep: str = ".",
    error: type[Exception] = ValueError,
) -> dict[str, Any]:
    """``given`` with every value canonical (None values dropped: they mean "the default").
    Unknown names, names jbkv sets itself and bad values raise ``error`` naming the option
    (``owner + sep + name``) and what it allows."""
    out: dict[str, Any] = {}
    for name, raw in given.items():
        spec = specs.get(name)
        if spec is None or not spec.cli:
            known = ", ".join(n for n, s in specs.items() if s.cli) or "none"
            raise error(f"unknown {owner} option {name!r}; known: {known}")
        if raw is None:
            continue
        try:
            out[name] = spec.parse(raw, f"{owner}{sep}{name}")
        except ValueError as exc:
            raise error(str(exc)) from None
    return out


__all__ = [
    "MAX_SEED",
    "SPEC",
    "Spec",
    "check_fields",
    "declared_specs",
    "option",
    "parse_options",
    "specs_of",
]
