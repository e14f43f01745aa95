"""The pruners by name: the CLI choices (``--pruners``), help texts and validation come from
here. Adding a pruner is one module plus one line below (or one :func:`register_pruner` call)."""

from __future__ import annotations

from typing import Any

from jbkv_cli.prune.base import KVPruner
from jbkv_cli.prune.deep_forcing import DeepForcing
from jbkv_cli.prune.flowcache import FlowCache, FlowCacheCorrected
from jbkv_cli.prune.forcing_kv import ForcingKV
from jbkv_cli.prune.forcing_kv_history import ForcingKVHistory

PRUNERS: dict[str, type[KVPruner]] = {}

# Options only jbkv's earlier pruner has: a stored record named ``forcing-kv`` with them was
# written before ``forcing-kv`` became the faithful method, by what is now forcing-kv-history.
LEGACY_FORCING_KV_OPTIONS = frozenset({"anchor_frames", "segments", "retention"})


def register_pruner(cls: type[KVPruner]) -> type[KVPruner]:
    """Make ``cls`` available by ``cls.name`` (usable as a class decorator)."""
    if not cls.name or not cls.name.replace("-", "").isalnum() or cls.name != cls.name.lower():
        raise ValueError(f"a pruner name must be lower-case letters, digits and '-': {cls.name!r}")
    if cls.name == "none" or (cls.name in PRUNERS and PRUNERS[cls.name] is not cls):
        raise ValueError(f"a pruner named {cls.name!r} is already registered")
    PRUNERS[cls.name] = cls
    return cls


def pruner_names() -> tuple[str, ...]:
    return tuple(PRUNERS)


def build_pruner(name: str, **options: Any) -> KVPruner:
    """The pruner ``name`` with these options; ``ValueError`` for unknown names or options."""
    if name not in PRUNERS:
        raise ValueError(f"unknown pruner {name!r}; known: {', '.join(PRUNERS)}")
    try:
        return PRUNERS[name](**options)
    except TypeError as exc:
        raise ValueError(f"pruner {name!r} does not take these options ({exc})") from None


def pruner_from_record(data: dict[str, Any]) -> KVPruner:
    """The pruner a run folder recorded (``{"name": ..., **options}``). A ``forcing-kv`` record
    with the earlier pruner's options (``anchor_frames``, ``segments``, ``retention``) is that
    pruner, now ``forcing-kv-history``: same options, same variant id (``fkv…``)."""
    name = data["name"]
    options = {k: v for k, v in data.items() if k != "name"}
    if name == ForcingKV.name and LEGACY_FORCING_KV_OPTIONS & options.keys():
        name = ForcingKVHistory.name
    return build_pruner(name, **options)


def table_rank(name: str) -> int:
    """Position of a pruner in tables: registration order (unknown names last)."""
    names = list(PRUNERS)
    return names.index(name) if name in names else len(names)


register_pruner(ForcingKV)
register_pruner(ForcingKVHistory)
register_pruner(FlowCache)
register_pruner(FlowCacheCorrected)
register_pruner(DeepForcing)
