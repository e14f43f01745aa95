"""KV-cache pruners: which cached tokens each KV head keeps (one module each).

- :mod:`~jbkv_cli.prune.base`: the :class:`KVPruner` base and the per-layer protocol.
- :mod:`~jbkv_cli.prune.registry`: the pruners by name (``forcing-kv``, ``forcing-kv-history``,
  ``flowcache``, ``flowcache-corrected``, ``deep-forcing``).
- :mod:`~jbkv_cli.prune.forcing_kv`: Forcing-KV as its official code runs it.
- :mod:`~jbkv_cli.prune.forcing_kv_history`: jbkv's earlier pruner after Forcing-KV's abstract.
- :mod:`~jbkv_cli.prune.flowcache`: after FlowCache (re-scored eviction) and its corrected ablation.
- :mod:`~jbkv_cli.prune.deep_forcing`: after Deep Forcing (Participative Compression, Deep Sink).
- :mod:`~jbkv_cli.prune.profile`: offline head profiling and the JSON profile it writes.
"""

from jbkv_cli.prune.base import (
    Decision,
    HeldKeys,
    KVPruner,
    LayerPruning,
    ReadPruning,
    RescoringPruning,
)
from jbkv_cli.prune.deep_forcing import DeepForcing, DeepForcingLayer
from jbkv_cli.prune.flowcache import FlowCache, FlowCacheCorrected, FlowCacheLayer
from jbkv_cli.prune.forcing_kv import ForcingKV, ForcingKVLayer
from jbkv_cli.prune.forcing_kv_history import ForcingKVHistory, ForcingKVHistoryLayer
from jbkv_cli.prune.profile import HeadProfile, ProfileError, load_profile
from jbkv_cli.prune.registry import (
    PRUNERS,
    build_pruner,
    pruner_from_record,
    pruner_names,
    register_pruner,
)

__all__ = [
    "PRUNERS",
    "Decision",
    "DeepForcing",
    "DeepForcingLayer",
    "FlowCache",
    "FlowCacheCorrected",
    "FlowCacheLayer",
    "ForcingKV",
    "ForcingKVHistory",
    "ForcingKVHistoryLayer",
    "ForcingKVLayer",
    "HeadProfile",
    "HeldKeys",
    "KVPruner",
    "LayerPruning",
    "ProfileError",
    "ReadPruning",
    "RescoringPruning",
    "build_pruner",
    "load_profile",
    "pruner_from_record",
    "pruner_names",
    "register_pruner",
]
