"""Consoles: data on stdout, progress, warnings and errors on stderr (so JSON stays parseable).

Everything jbkv prints may hold user text (a prompt, a path, an option value, a variant read
from a run folder), so nothing printed here is read as Rich markup or emoji codes: ``[/]`` and
``:cat:`` print as typed. Styles are applied with :class:`~rich.text.Text` (:func:`plain`), never
with markup in a string. Bidi controls that reorder the rest of a line (U+202A–U+202E,
U+2066–U+2069) are shown as ``\\u202e`` on the terminal (:func:`visible`), so a prompt holding
RIGHT-TO-LEFT OVERRIDE cannot reverse the bar, the numbers or the path printed after it.

A reader that leaves early (``jbkv --help | head``) is not a failure: the stream it read from
goes to ``/dev/null`` and the command ends as it would have, quietly (:func:`reader_gone`;
Rich's own reaction was exit 1, click's a ``BrokenPipeError``).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from typing import Any

from rich.console import Console
from rich.style import StyleType
from rich.text import Text

from jbkv_cli.utils.lifecycle import rank_tag

# The explicit directional formatting characters: embeddings, overrides, isolates and their ends.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_VISIBLE = {ord(c): f"\\u{ord(c):04x}" for c in BIDI_CONTROLS}


def visible(text: str) -> str:
    """``text`` with every bidi control written as ``\\uXXXX``: shown, never obeyed."""
    return text.translate(_VISIBLE)


def plain(text: object, style: StyleType = "") -> Text:
    """``text`` as a Rich ``Text`` shown literally (no markup, bidi controls visible), in
    ``style``: the one way jbkv styles or tabulates a string that may hold user text."""
    return Text(visible(str(text)), style=style)


class PlainConsole(Console):
    """A Rich console that prints strings as they are: no markup, no emoji codes, bidi controls
    visible. Strings passed to ``print``, table cells, titles and captions all go through
    :meth:`render_str`; ``Text`` objects are the caller's (make them with :func:`plain`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text), **kwargs)


def _broken(fd: int) -> bool:
    """Whether ``fd`` is a pipe whose reader has gone (``poll`` reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll(), a closed descriptor
        return False


def reader_gone() -> bool:
    """Whether the reader of stdout or stderr left; each such stream then writes to
    ``/dev/null``, so what is still printed (and Python's last flush) goes nowhere, silently."""
    gone = [fd for fd in (1, 2) if _broken(fd)]
    for fd in gone:
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
    return bool(gone)


def _on_broken_pipe(self: Console) -> None:
    """Rich's hook when a write meets a broken pipe: its default exits 1; here the reader has
    left and the command goes on (:func:`reader_gone`). Set on ``Console`` itself, so the help
    screens Typer prints with its own console behave the same."""
    reader_gone()
    self.quiet = True


Console.on_broken_pipe = _on_broken_pipe  # type: ignore[method-assign]


def _width(stream: Any) -> int | None:
    # Tables are wide: when not a terminal (pipes, CI logs), don't squeeze them into 80 cols.
    return None if stream.isatty() else 160


out = PlainConsole(width=_width(sys.stdout))
err = PlainConsole(stderr=True, width=_width(sys.stderr))
# Errors have their own console: muting a rank's output (below) must never hide its error.
_errors = PlainConsole(stderr=True, width=_width(sys.stderr))


def warn(message: str) -> None:
    """``warning: MESSAGE`` on stderr; ``message`` is plain text, printed as it is."""
    line = Text.assemble(("warning:", "yellow"), " ", plain(message))
    err.print(line, highlight=False, soft_wrap=True)


def error(message: str) -> None:
    """One line on stderr, ``message`` printed as it is; inside a torchrun job it names the
    rank (``rank 1/4: …``)."""
    line = Text.assemble(("error:", "bold red"), " ", plain(rank_tag() + message))
    _errors.print(line, highlight=False, soft_wrap=True)


def mute() -> None:
    """Send ``out`` and ``err`` to /dev/null: under torchrun only rank 0 prints tables,
    summaries, warnings and progress; every rank still prints its own one-line error."""
    sink = open(os.devnull, "w")  # noqa: SIM115 (open for the life of the process)
    out.file = sink
    err.file = sink
