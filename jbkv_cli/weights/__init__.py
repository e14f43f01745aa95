"""Weights jbkv cannot ship: a pinned manifest, a resumable verified download, a status check.

- :mod:`~jbkv_cli.weights.manifest`: what each file is, where it comes from and where it goes.
- :mod:`~jbkv_cli.weights.download`: HTTP(S)/file download with resume, SHA-256 check, atomic move.
- :mod:`~jbkv_cli.weights.status`: present / missing / corrupt / partial, per manifest entry.
"""

from jbkv_cli.weights.download import fetch_entry
from jbkv_cli.weights.manifest import GROUPS, WeightEntry, load_manifest, select
from jbkv_cli.weights.status import EntryStatus, entry_status

__all__ = [
    "GROUPS",
    "EntryStatus",
    "WeightEntry",
    "entry_status",
    "fetch_entry",
    "load_manifest",
    "select",
]
