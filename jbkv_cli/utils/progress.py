"""Progress bars on stderr that stop drawing the moment a signal arrives.

Rich draws a progress display from a refresh thread while the command runs (on a terminal) and
once more as it stops (the final frame; the only one where stderr is a pipe or a file). An
interrupted command must print its one error line and nothing else after the signal, so every
display jbkv opens is a :class:`Progress` whose live display is *frozen* by the signal handler
(:func:`jbkv_cli.utils.lifecycle.on_interrupt`): from then on it draws no frame, neither from the
refresh thread nor as it stops. On a terminal the cursor is still shown again and the line
ended, so the error line starts on a line of its own.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from jbkv_cli.utils import lifecycle
from jbkv_cli.utils.console import err

_open: weakref.WeakSet[_FreezableLive] = weakref.WeakSet()


class _FreezableLive(Live):
    """A Rich ``Live`` that draws nothing once :attr:`frozen` is set (a plain attribute, so the
    signal handler sets it without taking a lock)."""

    frozen = False

    def refresh(self) -> None:
        if not self.frozen:
            super().refresh()

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        if self.frozen:  # a line printed now is not followed by the display
            return renderables
        return super().process_renderables(renderables)


class Progress(RichProgress):
    """A Rich ``Progress`` (on jbkv's stderr console unless told) that a signal freezes."""

    def __init__(
        self,
        *columns: Any,
        console: Any = err,
        auto_refresh: bool = True,
        refresh_per_second: float = 10,
        transient: bool = False,
        redirect_stdout: bool = True,
        redirect_stderr: bool = True,
        **kwargs: Any,
    ) -> None:
        live = {
            "auto_refresh": auto_refresh,
            "refresh_per_second": refresh_per_second,
            "transient": transient,
            "redirect_stdout": redirect_stdout,
            "redirect_stderr": redirect_stderr,
        }
        super().__init__(*columns, console=console, **live, **kwargs)
        self.live = _FreezableLive(console=console, get_renderable=self.get_renderable, **live)
        _open.add(self.live)

    def stop(self) -> None:
        if self.live.frozen:  # no final frame, nor the blank line Rich ends a pipe's with
            self.live.stop()
            return
        super().stop()


def freeze_all() -> None:
    """Stop every open display from drawing (the signal handler calls this)."""
    for live in list(_open):
        live.frozen = True


lifecycle.on_interrupt(freeze_all)


def counting_columns() -> tuple[Any, ...]:
    """Description (user text: no markup), bar, ``done/total``, elapsed time."""
    return (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )


@contextlib.contextmanager
def counting_progress(enabled: bool) -> Iterator[Progress | None]:
    """A :class:`Progress` of :func:`counting_columns` kept on screen when done, or None."""
    if not enabled:
        yield None
        return
    with Progress(*counting_columns(), transient=False) as progress:
        yield progress


__all__ = ["Progress", "counting_columns", "counting_progress", "freeze_all"]
