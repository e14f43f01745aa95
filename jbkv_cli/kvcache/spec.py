"""KVSpec: what one variant does to the KV cache, as a composition.

    KVSpec(key=RTN(bits=2), value=RTN(bits=2), correction="taylor")   # INT2 rtn g32 +taylor
    KVSpec.build("quarot", bits=2, correction="taylor")                # the same, by name
    KVSpec()                                                           # the 16-bit reference
    KVSpec.build("rtn", 2, pruner=ForcingKV())                         # INT2 rtn g32 Forcing-KV
    KVSpec.build("rtn", 4, value_bits=2)               # K INT4 rtn g32 / V INT2 rtn g32
    KVSpec.build("rtn", layers=parse_bit_spec("K2V2@0-3+K2V1@4-"))  # per layer: at_layer(i)

``key`` and ``value`` are compression methods (:mod:`jbkv_cli.quant`; None keeps that side in
full precision: the keys-only / values-only ablations), ``correction`` a name from
:data:`~jbkv_cli.attention.correction.CORRECTIONS` (``bias-only`` is the ablation that keeps the
cache exact and injects the predicted bias), ``sink_chunks`` the first committed chunks kept in
full precision, ``pruner`` a :class:`~jbkv_cli.prune.base.KVPruner` choosing the tokens each
KV head keeps (None: all; pruning composes with the methods: prune, then quantize what is kept,
and with the correction on the kept keys). The reference is the spec with no method and no
pruner. The variant's label and id (its run-folder name) derive from these.

**Per layer** (``layers``, a :class:`~jbkv_cli.run.bit_specs.LayerBits`): the widths differ by
attention layer. ``key`` and ``value`` then hold the method at the first width the spec names
for that side (the template every layer's method is made from: the same options, its bits
replaced) and :meth:`at_layer` gives each layer's plain spec; a cache is built from that
(:func:`~jbkv_cli.kvcache.layer_caches`), never from the per-layer spec itself. A layer whose
keys stay exact gets no correction. The id and label name the spec
(``k2v2l0to3-k2v1l4up-rtn-g32``, ``K2V2@0-3+K2V1@4- rtn g32``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jbkv_cli.attention.correction import CORRECTIONS, Correction, get_correction
from jbkv_cli.prune.base import KVPruner
from jbkv_cli.prune.registry import pruner_from_record
from jbkv_cli.prune.registry import table_rank as pruner_rank
from jbkv_cli.quant.method import KVMethod
from jbkv_cli.quant.registry import build_method, table_rank
from jbkv_cli.run.bit_specs import LayerBits, parse_bit_spec, taylor_outside

REFERENCE_ID = "reference"
LEGACY_REFERENCE_ID = "bf16"  # the reference folder of runs made before jbkv 0.2


@dataclass(frozen=True)
class KVSpec:
    """How finished chunks are stored in the cache and how attention reads them."""

    key: KVMethod | None = None
    value: KVMethod | None = None
    correction: str = "none"
    sink_chunks: int = 0
    pruner: KVPruner | None = None
    layers: LayerBits | None = None

    def __post_init__(self) -> None:
        corr = get_correction(self.correction)
        object.__setattr__(self, "correction", corr.name)
        if corr.active and self.key is None:
            raise ValueError(f"the {corr.name} correction needs a key method (quantized keys)")
        if self.layers is not None:
            self._check_layers()
        if self.sink_chunks < 0:
            raise ValueError(f"sink_chunks must be >= 0, got {self.sink_chunks}")
        if self.pruner is not None and not corr.quantizes:
            raise ValueError(f"{self.pruner.name} cannot be combined with the bias-only ablation")
        if self.pruner is not None:
            for m in (self.key, self.value):
                policy = None if m is None else m.cache_policy()
                if policy is not None and (
                    not policy.per_chunk or policy.sink_keep_chunks is not None
                ):
                    raise ValueError(
                        f"{m.label}: spans and sink-keep are not implemented for pruned caches"
                    )
            if self.key_layout == "pre-rope":
                raise ValueError("the pre-RoPE key layout is not implemented for pruned caches")
            if self.pruner.owns_buffer and self.sink_chunks:
                raise ValueError(f"{self.pruner.name} keeps its own sink: no sink chunks")

    def _check_layers(self) -> None:
        """The template methods are the first width each side names (None: no layer stores
        that side compressed), one method for both, every width one it supports."""
        layers = self.layers
        for role, method in (("key", self.key), ("value", self.value)):
            widths = [w for w in layers.widths(role) if w != 16]
            first = widths[0] if widths else None
            if (method.bits if method is not None else None) != first:
                raise ValueError(
                    f"the {role} method of the per-layer spec {layers} must be at its first "
                    f"{role} width ({first}), got {None if method is None else method.bits}"
                )
            for width in widths[1:]:
                _at_bits(method, width)  # ValueError: a width the method does not support
        both = self.key is not None and self.value is not None
        if both and _at_bits(self.value, self.key.bits) != self.key:
            raise ValueError("a per-layer spec stores keys and values with one method")

    def with_sink(self, sink: int) -> KVSpec:
        """This spec with a model's ``sink`` chunks (its first chunks kept for good besides
        the window); ``ValueError`` when the spec already asks for another number."""
        if self.sink_chunks not in (0, sink):
            raise ValueError(
                f"the KV spec asks for {self.sink_chunks} sink chunk(s), the model for {sink}"
            )
        return replace(self, sink_chunks=sink) if sink else self

    def at_layer(self, layer: int) -> KVSpec:
        """The plain spec of attention layer ``layer``: its methods bound to the layer
        (:meth:`~jbkv_cli.quant.method.KVMethod.at_layer`: a KVQuant calibration's tables;
        itself when none binds anything), and when ``layers`` is set the template methods at
        that layer's widths, the correction where its keys are quantized (``ValueError`` when
        the spec names no width for ``layer``)."""
        if self.layers is None:
            key, value = (None if m is None else m.at_layer(layer) for m in (self.key, self.value))
            if (key, value) == (self.key, self.value):
                return self
            return replace(self, key=key, value=value)
        pair = self.layers.at(layer)
        template = self.key or self.value
        key = None if pair.key == 16 else _at_bits(template, pair.key).at_layer(layer)
        value = None if pair.value == 16 else _at_bits(template, pair.value).at_layer(layer)
        correction = self.correction if key is not None else "none"
        return replace(self, key=key, value=value, correction=correction, layers=None)

    @classmethod
    def build(
        cls,
        quantizer: str = "none",
        bits: int = 16,
        group_size: int = 32,
        correction: str = "none",
        *,
        keys: bool = True,
        values: bool = True,
        bias_only: bool = False,
        sink_chunks: int = 0,
        pruner: KVPruner | None = None,
        value_bits: int | None = None,
        layers: LayerBits | None = None,
        **options: Any,
    ) -> KVSpec:
        """A variant by method name: ``quantizer`` applied to keys and/or values (after
        ``pruner``, when given). ``bits`` are the keys' and, unless ``value_bits`` says
        otherwise, the values' (16 keeps that side in full precision: ``value_bits=16`` is the
        keys-only variant, ``bits=16`` with ``value_bits`` below 16 values-only). ``layers``:
        the widths per layer instead (``bits`` and ``value_bits`` are then ignored; no
        ``keys``/``values``/``bias_only`` ablation)."""
        if layers is not None:
            if not (keys and values) or bias_only:
                raise ValueError(f"the per-layer spec {layers} takes no ablation")
            return cls._build_layered(
                quantizer, layers, group_size, correction, sink_chunks, pruner, **options
            )
        value_bits = bits if value_bits is None else value_bits
        if (quantizer == "none") != (bits == value_bits == 16):
            raise ValueError(
                "bits=16 goes with quantizer='none' and vice versa "
                f"(got quantizer={quantizer!r}, bits={bits}, value_bits={value_bits})"
            )
        if quantizer == "none":
            return cls(correction=correction, sink_chunks=sink_chunks, pruner=pruner)
        method = build_method(quantizer, bits, group_size, **options) if bits != 16 else None
        value_method = method
        if value_bits != bits:
            value_method = None
            if value_bits != 16:
                value_method = build_method(quantizer, value_bits, group_size, **options)
        if bias_only:
            correction = "bias-only"
        key, value = method if keys else None, value_method if values else None
        return cls(key, value, correction, sink_chunks, pruner)

    @classmethod
    def _build_layered(
        cls,
        quantizer: str,
        layers: LayerBits,
        group_size: int,
        correction: str,
        sink_chunks: int,
        pruner: KVPruner | None,
        **options: Any,
    ) -> KVSpec:
        if quantizer == "none":
            raise ValueError(f"the per-layer spec {layers} needs a method")
        first = {}
        for role in ("key", "value"):
            first[role] = next((w for w in layers.widths(role) if w != 16), None)
        key = value = None
        if first["key"] is not None:
            key = build_method(quantizer, first["key"], group_size, **options)
        if first["value"] is not None:
            value = key if first["value"] == first["key"] else None
            value = value or build_method(quantizer, first["value"], group_size, **options)
        return cls(key, value, correction, sink_chunks, pruner, layers)

    def for_model(self, model: str, chunk_tokens: int | None = None) -> KVSpec:
        """The spec as ``model`` (``name`` or ``name:config``) runs it: each method's options
        left to the model filled in (:meth:`~jbkv_cli.quant.method.KVMethod.for_model`; QVG's
        cache policy and K rule), for chunks of ``chunk_tokens`` tokens when known."""
        pruned = self.pruner is not None

        def fill(m: KVMethod | None) -> KVMethod | None:
            return None if m is None else m.for_model(model, chunk_tokens, pruned=pruned)

        key, value = fill(self.key), fill(self.value)
        return (
            self if (key, value) == (self.key, self.value) else replace(self, key=key, value=value)
        )

    def post_rope(self) -> KVSpec | None:
        """The spec with its keys cached after RoPE where its methods leave the layout to the
        model (:meth:`~jbkv_cli.quant.method.KVMethod.without_pre_rope`); None when a method
        asks for pre-RoPE keys."""
        methods = (self.key, self.value)
        moved = [None if m is None else m.without_pre_rope() for m in methods]
        if any(new is None and old is not None for new, old in zip(moved, methods, strict=True)):
            return None
        return replace(self, key=moved[0], value=moved[1])

    # --- what it is -------------------------------------------------------------------------

    @property
    def key_layout(self) -> str:
        """How keys are cached: ``post-rope`` (rotated, the default) or ``pre-rope`` (rotated on
        read), as the variant's method asks (:mod:`jbkv_cli.attention.rope`)."""
        return self.method.key_layout() if self.method is not None else "post-rope"

    @property
    def correction_(self) -> Correction:
        return get_correction(self.correction)

    @property
    def method(self) -> KVMethod | None:
        """The method of the variant (the key method, else the value method)."""
        return self.key or self.value

    @property
    def is_reference(self) -> bool:
        return self.key is None and self.value is None and self.pruner is None

    @property
    def quantized(self) -> bool:
        """True when cached keys or values are stored below 16 bits."""
        return self.method is not None and self.correction_.quantizes

    @property
    def bits(self) -> int:
        return self.method.bits if self.method else 16

    @property
    def quantizer(self) -> str:
        return self.method.name if self.method else "none"

    @property
    def group_size(self) -> int | None:
        return self.method.group_size if self.method else None

    @property
    def keys(self) -> bool:
        """Keys are not ablated (stored by the method; True without a method)."""
        return self.key is not None or self.method is None

    @property
    def values(self) -> bool:
        """Values are not ablated (stored by the method; True without a method)."""
        return self.value is not None or self.method is None

    @property
    def bias_only(self) -> bool:
        return not self.correction_.quantizes

    @property
    def mixed(self) -> bool:
        """Keys and values stored by different methods (a per-layer spec: never; its layers
        say)."""
        if self.layers is not None:
            return False
        return self.key is not None and self.value is not None and self.key != self.value

    @property
    def key_widths(self) -> tuple[int, ...]:
        """The widths cached keys are stored at (in some layer; 16: exact)."""
        if self.layers is not None:
            return tuple(self.layers.widths("key"))
        return (16,) if self.key is None else (self.key.bits,)

    @property
    def taylor_outside(self) -> bool:
        """The taylor correction on 1-bit keys: outside its range
        (:func:`~jbkv_cli.run.bit_specs.taylor_outside`)."""
        return self.quantized and taylor_outside(self.key_widths, self.correction)

    def _parts(self, id_form: bool) -> list[str]:
        pruned = [] if self.pruner is None else [self._pruner_part(id_form)]
        if self.method is None:
            return pruned
        return self._method_parts(id_form) + pruned

    def _pruner_part(self, id_form: bool) -> str:
        return self.pruner.variant_id if id_form else self.pruner.label

    def _method_parts(self, id_form: bool) -> list[str]:
        if self.layers is not None:  # the per-layer spec, then the method without its bits
            m = self.method
            if id_form:
                return [self.layers.id_part, m.variant_id.removeprefix(f"int{m.bits}-")]
            return [f"{self.layers} {m.label.removeprefix(f'INT{m.bits} ')}"]
        if self.mixed:
            if id_form:
                return [f"k{self.key.variant_id}", f"v{self.value.variant_id}"]
            return [f"K {self.key.label} / V {self.value.label}"]
        parts = [self.method.variant_id if id_form else self.method.label]
        if self.value is None:
            parts.append("konly" if id_form else "K-only")
        elif self.key is None:
            parts.append("vonly" if id_form else "V-only")
        return parts

    @property
    def storage_id(self) -> str | None:
        """How the cache is stored, without the correction: e.g. ``int2-kivi-g32-r64``."""
        return None if self.is_reference else "-".join(self._parts(id_form=True))

    @property
    def label(self) -> str:
        """A short human label, e.g. ``INT2 rtn g32 +taylor``."""
        if self.is_reference:
            return "16-bit reference"
        parts = self._parts(id_form=False)
        if self.method is None:
            parts.insert(0, "16-bit")
        if self.correction != "none":
            parts.append("bias-only" if self.bias_only else f"+{self.correction}")
        if self.sink_chunks:
            parts.append(f"sink{self.sink_chunks}")
        return " ".join(parts)

    @property
    def variant_id(self) -> str:
        """A file-safe name that determines the spec, e.g. ``int2-quarot-g32-taylor``."""
        if self.is_reference:
            return REFERENCE_ID
        parts = [*self._parts(id_form=True), self.correction_.id]
        if self.sink_chunks:
            parts.append(f"sink{self.sink_chunks}")
        return "-".join(p for p in parts if p)

    def sort_key(self) -> tuple:
        """Table order: the reference, then per method (registry order), group size and bit
        width (high to low) the full variant, its ablations, then its corrections; pruned
        variants after the unpruned ones, per pruner, the 16-bit pruned one first."""
        if self.is_reference:
            return (0,)
        prune = (0,)
        if self.pruner is not None:
            prune = (1, pruner_rank(self.pruner.name), self.pruner.variant_id)
        m = self.method
        if m is None:  # pruned only
            return (1, *prune, 0, self.sink_chunks)
        corr = list(CORRECTIONS).index(self.correction)
        ablation = (not self.keys) + 2 * (not self.values) + 4 * self.bias_only
        rank = (table_rank(m.name), m.group_size, -m.bits)
        key = (ablation, corr, m.variant_id, self.mixed, self.sink_chunks)
        return (1, *prune, 1, *rank, *key)

    # --- on disk ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON; ``pruner`` appears only when set (older run folders have none)."""
        out = {
            "key": None if self.key is None else self.key.to_dict(),
            "value": None if self.value is None else self.value.to_dict(),
            "correction": self.correction,
            "sink_chunks": self.sink_chunks,
        }
        if self.pruner is not None:
            out["pruner"] = self.pruner.to_dict()
        if self.layers is not None:
            out["layers"] = str(self.layers)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVSpec:
        """Inverse of :meth:`to_dict`; also reads the flat format of jbkv ≤ 0.1 run folders."""
        if "quantizer" in data:
            return cls._from_flat(data)
        unknown = set(data) - {"key", "value", "correction", "sink_chunks", "pruner", "layers"}
        if unknown:
            raise ValueError(f"unknown KVSpec fields {sorted(unknown)}")
        return cls(
            _method(data.get("key")),
            _method(data.get("value")),
            data.get("correction", "none"),
            data.get("sink_chunks", 0),
            _pruner(data.get("pruner")),
            _layers(data.get("layers")),
        )

    @classmethod
    def _from_flat(cls, d: dict[str, Any]) -> KVSpec:
        options = {}
        if d.get("quantizer") == "quarot":
            options = {"seed": d.get("rotation_seed", 0), "block_size": d.get("rotation_block")}
        return cls.build(
            d["quantizer"],
            d.get("bits", 16),
            d.get("group_size", 32),
            d.get("correction", "none"),
            keys=d.get("keys", True),
            values=d.get("values", True),
            bias_only=d.get("bias_only", False),
            sink_chunks=d.get("sink_chunks", 0),
            **options,
        )


def _method(data: dict[str, Any] | None) -> KVMethod | None:
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ValueError("a method must be an object with a 'name'")
    options = {k: v for k, v in data.items() if k not in ("name", "bits", "group_size")}
    return build_method(data["name"], data.get("bits", 2), data.get("group_size", 32), **options)


def _layers(text: Any) -> LayerBits | None:
    """A stored per-layer spec (its text, :func:`~jbkv_cli.run.bit_specs.parse_bit_spec`)."""
    if text is None:
        return None
    spec = parse_bit_spec(text) if isinstance(text, str) else None
    if not isinstance(spec, LayerBits):
        raise ValueError(f"layers must be a per-layer bit spec, got {text!r}")
    return spec


def _at_bits(method: KVMethod, bits: int) -> KVMethod:
    """``method`` at ``bits`` (itself when it has them): the same options, validated again
    (``ValueError`` for a width it does not support)."""
    return method if method.bits == bits else replace(method, bits=bits)


def _pruner(data: dict[str, Any] | None) -> KVPruner | None:
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ValueError("a pruner must be an object with a 'name'")
    return pruner_from_record(data)


FULL_PRECISION = KVSpec()


@dataclass(frozen=True)
class ExactPreRope(KVSpec):
    """The 16-bit reference with its keys cached before RoPE and rotated on read (on a model
    whose caches can): the same attention as :data:`FULL_PRECISION` up to float rounding, its
    commits the pre-RoPE keys a pre-RoPE method stores (``jbkv calibrate`` observes them)."""

    @property
    def key_layout(self) -> str:
        return "pre-rope"
