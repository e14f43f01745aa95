"""The ablations of a quantized cache (``--ablations``, ``generate --ablation``): by name, the
:meth:`~jbkv_cli.kvcache.spec.KVSpec.build` options that switch one part of it off."""

from __future__ import annotations

ABLATIONS: dict[str, dict[str, bool]] = {
    "keys-only": {"values": False},  # the values stay exact
    "values-only": {"keys": False},  # the keys stay exact
    "bias-only": {"bias_only": True},  # an exact cache, the predicted bias added
}
