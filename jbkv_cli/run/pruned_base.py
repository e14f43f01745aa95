"""The fair reference of a pruned and quantized variant: the same pruner's 16-bit variant.

Eviction removes attention mass from the cache (Δlog Z < 0) while quantization adds it, so a
pruned and quantized variant scored against the full reference mixes both. Scored against the
16-bit variant of the same pruner (same pruner settings and sink, same prompt and seed), only
what quantization (and a correction) changes is left. Those scores are kept beside the fidelity
ones, ``metrics/pruned16/<variant>/<video>.json`` (the fidelity entry plus ``against``: the
16-bit variant), made by :class:`~jbkv_cli.run.experiment.Scoring` once both videos exist and
read by the report's correction gains (:func:`jbkv_cli.report.table.paired_differences`).
"""

from __future__ import annotations

from jbkv_cli.kvcache.spec import KVSpec

KIND = "pruned16"
"""The metrics kind (``metrics/pruned16/…``) of the scores against the pruned 16-bit video."""


def pruned_baselines(variants: dict[str, KVSpec]) -> dict[str, str]:
    """Variant -> its pruned 16-bit variant, for every variant of ``variants`` with a pruner and
    a quantizer whose 16-bit variant (no method, an equal pruner and sink) is among them."""
    bases = {
        (spec.pruner, spec.sink_chunks): vid
        for vid, spec in variants.items()
        if spec.pruner is not None and spec.method is None
    }
    out = {}
    for vid, spec in variants.items():
        if spec.pruner is None or spec.method is None:
            continue
        base = bases.get((spec.pruner, spec.sink_chunks))
        if base is not None:
            out[vid] = base
    return out
