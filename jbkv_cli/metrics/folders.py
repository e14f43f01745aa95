"""The folders ``jbkv fidelity`` compares, checked before torch is imported."""

from __future__ import annotations

from pathlib import Path

from jbkv_cli.utils.errors import JbkvError


def check_video_folder(root: Path, role: str) -> None:
    """Raise :class:`JbkvError` unless ``root`` is an existing folder (``role``: "reference"
    or "test", for the message)."""
    if not root.exists():
        raise JbkvError(f"{role} folder not found: {root}")
    if not root.is_dir():
        raise JbkvError(f"{role} path is not a folder: {root}")
