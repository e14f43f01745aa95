"""Progress displays draw nothing after a signal: no frame from the refresh thread, none as
they stop (the final frame, the only one a pipe gets), no trailing blank line.

Through the installed ``jbkv`` the signal lands at a point the process announces
(``JBKV_TEST_PAUSE``: the first video's temp file exists, inside the progress display), so the
test needs no sleep and gives the same answer on a loaded machine.
"""

from __future__ import annotations

import io
import signal

from rich.console import Console

from jbkv_cli.utils.progress import Progress, counting_columns, freeze_all
from tests.cli.test_cli_contract import TINY, interrupt_at

BAR = "━"


def _terminal() -> tuple[Console, io.StringIO]:
    sink = io.StringIO()
    return Console(file=sink, force_terminal=True, width=80), sink


def test_a_frozen_display_draws_no_frame_on_a_terminal():
    console, sink = _terminal()
    progress = Progress(*counting_columns(), console=console, auto_refresh=False)
    progress.start()
    task = progress.add_task("videos", total=4)
    progress.advance(task)
    progress.refresh()
    drawn = sink.getvalue()
    assert BAR in drawn and "1/4" in drawn
    freeze_all()  # what the signal handler does
    progress.advance(task)
    progress.refresh()
    console.print("a line printed now")  # not followed by the display either
    progress.stop()
    after = sink.getvalue()[len(drawn) :]
    assert BAR not in after and "2/4" not in after, repr(after)
    assert "a line printed now" in after
    assert "\x1b[?25h" in after, "the cursor was left hidden"


def test_a_frozen_display_prints_nothing_into_a_pipe():
    sink = io.StringIO()
    console = Console(file=sink, width=80)
    with Progress(*counting_columns(), console=console) as progress:
        progress.add_task("videos", total=4, completed=1)
        freeze_all()
    assert sink.getvalue() == ""


def test_an_unfrozen_display_still_prints_its_final_frame_into_a_pipe():
    sink = io.StringIO()
    console = Console(file=sink, width=80)
    with Progress(*counting_columns(), console=console) as progress:
        progress.add_task("videos", total=4, completed=4)
    assert "4/4" in sink.getvalue()


def test_an_interrupted_run_prints_only_its_error_line(tmp_path):
    """SIGINT while the first video is written, inside the progress display: stderr is the one
    error line (the old code printed the display's final frame, two lines, first)."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    argv = ["generate", "--bits", "2", "--seeds", "0-1", *TINY, "--out", "o"]
    code, out, err = interrupt_at("writing:*.mkv", signal.SIGINT, argv, cwd)
    assert code == 130, err
    assert out == ""
    assert err.splitlines() == [
        "error: interrupted (SIGINT); completed files are kept, no partial file is left"
    ], err
