"""The library's names and defaults the command line shows and checks, without importing it.

The modules that define methods, pruners, corrections and head profiling import torch (seconds
at every start), and ``jbkv --help``, ``--version`` or a usage error that needs only the command
line should not wait for it. So the command line takes these values from here, and each one's
home (named beside it) stays where it is defined: ``tests/cli/test_names.py`` checks that every
value here equals its home's, so adding a method, pruner or correction to its registry fails
that test until its name is added here too.

Methods and pruners can also be registered at run time
(:func:`~jbkv_cli.quant.registry.register_method`,
:func:`~jbkv_cli.prune.registry.register_pruner`); doing so imports their registry, and once it
is imported :func:`method_names` and :func:`pruner_names` read the registry itself.
"""

from __future__ import annotations

import sys

# jbkv_cli.quant.registry.METHODS, in registration order
METHODS = (
    "rtn",
    "rtn-nearest",
    "quarot",
    "kivi",
    "qvg",
    "quantwm",
    "quantwm-qsac",
    "quantwm-psac",
    "quantwm-base",
    "turboquant-mse",
    "turboquant-prod",
    "kvquant",
)
# jbkv_cli.prune.registry.PRUNERS, in registration order
PRUNERS = ("forcing-kv", "forcing-kv-history", "flowcache", "flowcache-corrected", "deep-forcing")
# jbkv_cli.attention.correction.CORRECTIONS but the ablations (bias-only): --corrections
CORRECTIONS = ("none", "taylor", "exact", "signed", "signed-excess", "signed-unshrink")
# jbkv_cli.llm.job.BACKENDS (the corrected attention's kernels) and DTYPES
LLM_BACKENDS = ("fused", "flex", "reference")
LLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
# jbkv_cli.prune.profile: the head-profiling rules and their defaults
PROFILE_RULES = ("forcing-kv", "local-mass")
PROFILE_DEFAULT_RULE = "forcing-kv"
PROFILE_THRESHOLDS = {"forcing-kv": 0.8, "local-mass": 0.75}
PROFILE_LAST_FRAMES = 4
PROFILE_SKIP_FRAMES = 1
PROFILE_ANCHOR_FRAMES = 1

_METHOD_REGISTRY = "jbkv_cli.quant.registry"
_PRUNER_REGISTRY = "jbkv_cli.prune.registry"


def method_names() -> tuple[str, ...]:
    """The registered methods: :data:`METHODS`, or the registry's names once it is imported
    (a method registered at run time among them)."""
    registry = sys.modules.get(_METHOD_REGISTRY)
    return tuple(registry.METHODS) if registry is not None else METHODS


def pruner_names() -> tuple[str, ...]:
    """The registered pruners: :data:`PRUNERS`, or the registry's names once it is imported."""
    registry = sys.modules.get(_PRUNER_REGISTRY)
    return tuple(registry.PRUNERS) if registry is not None else PRUNERS
