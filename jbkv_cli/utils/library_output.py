"""What transformers, diffusers, torch, Pillow and numpy would print on jbkv's stderr.

stderr is jbkv's: its progress, one-line warnings and one-line errors. The libraries it loads
models with print on their own: transformers' ``Loading weights`` bars and its multi-line load
report, diffusers' two lines when it falls back from safetensors (``An error occurred while
trying to fetch …`` / ``Defaulting to unsafe serialization …``), torch's and Pillow's Python
warnings. Here:

- **Logs** of transformers and diffusers go to one handler of jbkv's (:func:`install`, which
  configures each library as it is imported, so a command that never imports one pays
  nothing): their progress bars are off, their own stderr handler is removed, and each record
  is either known chatter (:data:`CHATTER`, dropped), a load report (summarised in one line:
  :func:`summary`) or one ``warning: transformers: …`` line (its first line). Inside
  :func:`capture` the records are kept for the caller instead (``llm-prefill`` reads a load
  report to say which tensor does not fit).
- **Python warnings** that torch, Pillow or numpy raise while jbkv loads a model or reads an
  image are dropped, inside :func:`quiet_warnings` only: a warning jbkv itself raises, or one
  raised anywhere else, is shown as before.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

LIBRARIES = ("transformers", "diffusers")
CHATTER = (
    "Defaulting to unsafe serialization",  # diffusers: a folder without safetensors weights
    "An error occurred while trying to fetch",  # diffusers: the line before that one
)
QUIET_MODULES = r"(torch|PIL|numpy)(\..*)?\Z"  # whose Python warnings quiet_warnings() drops
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Said:
    """One log record of a library: its name, level name and text (colour codes removed)."""

    library: str
    level: str
    text: str


class _Handler(logging.Handler):
    """Where the libraries' records go: into the innermost :func:`capture`, else one line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.captures: list[list[Said]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            said = Said(
                record.name.split(".")[0], record.levelname, _ANSI.sub("", record.getMessage())
            )
        except Exception:  # a record that cannot be formatted is not worth a traceback
            return
        if self.captures:
            self.captures[-1].append(said)
        else:
            show(said)


_handler = _Handler()
_configured: set[str] = set()


def show(said: Said) -> None:
    """Print a record as one jbkv warning line, unless it is chatter."""
    from jbkv_cli.utils.console import warn

    if any(c in said.text for c in CHATTER):
        return
    line = summary(said.text)
    if line:
        warn(f"{said.library}: {line}")


def summary(text: str) -> str:
    """One line for a record: a transformers load report as its statuses with their first keys
    (``LlamaForCausalLM from DIR: MISSING lm_head.weight and 2 more; …``), anything else as
    its first non-empty line, cut to 300 characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    head = lines[0]
    rows = report_rows(text)
    if " LOAD REPORT" in head and rows:
        by_status: dict[str, list[str]] = {}
        for key, status, _ in rows:
            by_status.setdefault(status, []).append(key)
        parts = [
            f"{status} {keys[0]}" + (f" and {len(keys) - 1} more" if len(keys) > 1 else "")
            for status, keys in by_status.items()
        ]
        head = head.replace(" LOAD REPORT from:", " from").replace(" LOAD REPORT", "")
        head += ": " + "; ".join(parts)
    return " ".join(head.split())[:300]


def report_rows(text: str) -> list[tuple[str, str, str]]:
    """(key, status, details) of each row of a transformers load report's table."""
    rows = []
    for line in _ANSI.sub("", text).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 2 and cells[1].isupper() and cells[1].isalpha() and cells[0] != "Key":
            rows.append((cells[0], cells[1], " ".join(c for c in cells[2:] if c)))
    return rows


@contextlib.contextmanager
def capture() -> Iterator[list[Said]]:
    """The libraries' records during the block, kept in the yielded list instead of shown."""
    install()
    kept: list[Said] = []
    _handler.captures.append(kept)
    try:
        yield kept
    finally:
        _handler.captures.pop()  # blocks nest, so the innermost is the last


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """Drop the Python warnings torch, Pillow and numpy raise during the block (jbkv's loads
    and image reads); every other warning filter stays as it was."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=QUIET_MODULES)
        yield


def _configure(library: str, log: Any) -> None:
    """Bars off, the library's stderr handler replaced by jbkv's (its ``utils.logging``)."""
    if library in _configured:
        return
    _configured.add(library)
    log.disable_progress_bar()
    log.disable_default_handler()
    log.add_handler(_handler)


class _ConfigureAfter(importlib.abc.Loader):
    """The loader of ``LIBRARY.utils.logging``, configuring the library once it has run."""

    def __init__(self, loader: Any, library: str) -> None:
        self.loader, self.library = loader, library

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _configure(self.library, module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, … for tracebacks
        return getattr(self.loader, name)


class _Watch(importlib.abc.MetaPathFinder):
    """Finds nothing itself; hands each library's logging module a configuring loader."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        library = name.split(".")[0]
        if library not in LIBRARIES or name != f"{library}.utils.logging":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ConfigureAfter(spec.loader, library)
        return spec


_watch = _Watch()


def install() -> None:
    """Route transformers' and diffusers' output through jbkv from now on: those imported
    already are configured at once, the others as they are imported. Idempotent."""
    for library in LIBRARIES:
        log = sys.modules.get(f"{library}.utils.logging")
        if log is not None:
            _configure(library, log)
    if _watch not in sys.meta_path:
        sys.meta_path.insert(0, _watch)


__all__ = [
    "CHATTER",
    "LIBRARIES",
    "Said",
    "capture",
    "install",
    "quiet_warnings",
    "report_rows",
    "show",
    "summary",
]
