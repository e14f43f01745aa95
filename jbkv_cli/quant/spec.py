"""KVSpec: what a variant does to the KV cache, as one small frozen dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass

QUANTIZER_NAMES = ("none", "rtn", "quarot")
CORRECTIONS = ("none", "taylor", "exact")
SUPPORTED_BITS = (2, 3, 4, 8, 16)


@dataclass(frozen=True)
class KVSpec:
    """How finished chunks are stored in the cache and how attention reads them.

    Attributes:
        quantizer: registry name, ``none`` (full precision), ``rtn`` or ``quarot``.
        bits: code width B (2, 3, 4, 8); 16 means "not quantized".
        group_size: channels per quantization group g (divides the head dim).
        correction: Jensen-bias correction applied to cached scores (``none``, ``taylor``, ``exact``).
        keys, values: which of K and V are quantized (ablations: keys-only, values-only).
        bias_only: ablation; keep the cache in full precision but *add* the Jensen bias
            predicted for this quantizer to the cached scores (isolates bias from rounding noise).
        rotation_seed: seed of the randomized Hadamard rotation (``quarot``).
        rotation_block: Hadamard block size (None: the head dim).
        sink_chunks: the first ``sink_chunks`` committed chunks are kept in full precision.
    """

    quantizer: str = "none"
    bits: int = 16
    group_size: int = 32
    correction: str = "none"
    keys: bool = True
    values: bool = True
    bias_only: bool = False
    rotation_seed: int = 0
    rotation_block: int | None = None
    sink_chunks: int = 0

    def __post_init__(self) -> None:
        if self.quantizer not in QUANTIZER_NAMES:
            raise ValueError(f"quantizer must be one of {QUANTIZER_NAMES}, got {self.quantizer!r}")
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {self.bits}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {CORRECTIONS}, got {self.correction!r}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be positive, got {self.group_size}")
        if self.sink_chunks < 0:
            raise ValueError(f"sink_chunks must be >= 0, got {self.sink_chunks}")
        if (self.quantizer == "none") != (self.bits == 16):
            raise ValueError(
                "bits=16 goes with quantizer='none' and vice versa "
                f"(got quantizer={self.quantizer!r}, bits={self.bits})"
            )

    @property
    def quantized(self) -> bool:
        """True when cached keys or values are stored below 16 bits."""
        return self.bits < 16 and not self.bias_only and (self.keys or self.values)

    @property
    def label(self) -> str:
        """A short human label, e.g. ``INT2 rtn g32 +taylor``."""
        if self.bits == 16:
            return "16-bit reference"
        parts = [f"INT{self.bits}", self.quantizer, f"g{self.group_size}"]
        if not (self.keys and self.values):
            parts.append("K-only" if self.keys else "V-only")
        if self.bias_only:
            parts.append("bias-only")
        if self.correction != "none":
            parts.append(f"+{self.correction}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


FULL_PRECISION = KVSpec()
