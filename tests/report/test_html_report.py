"""The HTML report: structure and links offline, then the real page in headless Chromium.

The browser test drives Debian's ``chromium`` over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages separated by NUL on file descriptors 3 and 4), so it
needs no Python package and no port; the page is served from 127.0.0.1. Without a chromium
executable (``make browser`` installs it) the test is skipped and says why.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import av
import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.report.html import video_order
from jbkv_cli.report.table import build_rows
from jbkv_cli.run.directory import RunDir

HEADLINE = ["reference", "int4-rtn-g32", "int2-rtn-g32", "int2-rtn-g32-taylor"]


class _Page(HTMLParser):
    """Every tag with its attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def all(self, tag: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag]


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


# --- offline ------------------------------------------------------------------------------------


def test_quantize_eval_writes_the_page_and_its_assets(tiny_run):
    report = tiny_run / "report"
    for name in ("index.html", "report.css", "report.js", "drift.png", "frontier.png"):
        assert (report / name).is_file(), name
    page = _parse(report / "index.html")
    rows = [a for t, a in page.tags if t == "tr" and "data-variant" in a]
    assert [r["data-variant"] for r in rows][:1] == ["reference"] and len(rows) == 5
    groups = page.all("section")
    assert len(groups) == 2 and all(g["class"] == "sync-group" for g in groups)
    assert groups[0]["data-fps"] == "8" and groups[0]["data-chunk-frames"] == "4"
    assert len(page.all("video")) == 2 * 5
    assert all("muted" in v and "loop" in v for v in page.all("video"))
    assert len(page.all("button")) == 2 and len(page.all("input")) == 2


def test_every_link_is_relative_and_resolves_to_a_file(tiny_run):
    report = tiny_run / "report"
    text = (report / "index.html").read_text()
    assert "http://" not in text and "https://" not in text
    page = _parse(report / "index.html")
    links = [a.get("src") or a.get("href") for _, a in page.tags if a.get("src") or a.get("href")]
    assert len(links) > 10
    for link in links:
        if link == "data:,":  # the empty favicon: no request at all
            continue
        assert not urlparse(link).scheme and not link.startswith("/"), link
        assert (report / unquote(link)).resolve().is_file(), link
    assert "url(" not in (report / "report.css").read_text()


def test_video_rows_put_the_headline_variants_first(tiny_run):
    run = RunDir.open(tiny_run)
    assert [r.variant for r in video_order(build_rows(run))][:4] == HEADLINE
    page = _parse(tiny_run / "report" / "index.html")
    figures = [a["data-variant"] for t, a in page.tags if t == "figure" and "data-variant" in a]
    assert figures[:5] == [*HEADLINE, "int4-rtn-g32-taylor"]


def test_script_sorts_tables_and_keeps_videos_in_step(tiny_run):
    js = (tiny_run / "report" / "report.js").read_text()
    for needle in ("sortTable", "setupGroup", "currentTime", "playbackRate", '"input"'):
        assert needle in js


def test_mp4s_play_in_browsers_h264_yuv420p_even_sizes(tiny_run):
    mp4s = sorted((tiny_run / "videos").rglob("*.mp4"))
    assert len(mp4s) == 10
    for path in mp4s:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            ctx = stream.codec_context
            assert ctx.name == "h264" and ctx.pix_fmt == "yuv420p"
            assert ctx.width % 2 == 0 and ctx.height % 2 == 0


def test_report_format_html_rebuilds_the_same_page(tiny_run):
    page = tiny_run / "report" / "index.html"
    before = page.read_text()
    page.unlink()
    result = CliRunner().invoke(app, ["report", str(tiny_run), "--format", "html"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(page)
    assert page.read_text() == before


# --- in a real browser --------------------------------------------------------------------------


def _chromium() -> str | None:
    return os.environ.get("JBKV_CHROMIUM") or shutil.which("chromium")


class Chromium:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (DevTools protocol)."""

    FLAGS = (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--autoplay-policy=no-user-gesture-required",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--remote-debugging-pipe",
    )

    def __init__(self, executable: str, profile: Path) -> None:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()

        def as_fds_3_and_4() -> None:
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.log = profile / "chromium.log"
        self.proc = subprocess.Popen(
            [executable, *self.FLAGS, f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=as_fds_3_and_4,
            pass_fds=(3, 4),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._out = os.fdopen(to_chrome_w, "wb", buffering=0)
        self._in = os.fdopen(from_chrome_r, "rb", buffering=0)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def _receive(self) -> dict:
        while b"\0" not in self._buffer:
            block = self._in.read(1 << 16)
            if not block:
                raise RuntimeError(f"chromium exited; see {self.log}")
            self._buffer += block
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, *, browser: bool = False) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not browser:
            message["sessionId"] = self.session
        self._out.write(json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", timeout=300)

    def js(self, expression: str):
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not self.js(expression):
            if time.monotonic() > end:
                raise TimeoutError(expression)
            time.sleep(0.1)

    def console_errors(self) -> list[str]:
        errors = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(json.dumps(params["exceptionDetails"])[:300])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args"))[:300])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(f"{params['entry'].get('url')}: {params['entry'].get('text')}")
        return errors

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.call("Browser.close", browser=True)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._in.close()
        self._out.close()


VIDEOS = "Array.from(document.querySelectorAll('video'))"


SEEKABLE = "v.readyState >= 2 && v.seekable.length && v.seekable.end(v.seekable.length - 1) > 0"


@pytest.mark.skipif(
    _chromium() is None,
    reason="no chromium executable (Debian's chromium package; `make browser` installs it)",
)
@pytest.mark.slow  # end to end
@pytest.mark.parametrize("served", ["http-ranges", "http-no-ranges", "file"])
def test_page_plays_in_headless_chromium(tiny_run, local_server, tmp_path, served):
    """``http-no-ranges`` is like ``python -m http.server``: the page fetches its videos whole."""
    executable = _chromium()
    shutil.copytree(tiny_run, local_server.root / "run")
    local_server.ranges = served == "http-ranges"
    url = f"{local_server.url}/run/report/index.html"
    if served == "file":
        url = (local_server.root / "run" / "report" / "index.html").as_uri()
    profile = Path(tempfile.mkdtemp(prefix="jbkv-chromium-", dir=tmp_path))
    browser = Chromium(executable, profile)
    try:
        browser.open(url)
        # every video ready and seekable at once (the page's sync seeks may drop a video's
        # readyState to 1 for a moment afterwards: reading it again would race them)
        browser.wait_for(f"{VIDEOS}.length == 10 && {VIDEOS}.every(v => {SEEKABLE})", timeout=900)

        # play: every video's clock advances, and each row stays in step
        start = browser.js(f"{VIDEOS}.map(v => v.currentTime)")
        browser.js("document.querySelectorAll('button.play').forEach(b => b.click())")
        time.sleep(1.5)
        playing = browser.js(f"{VIDEOS}.map(v => [v.currentTime, v.paused, v.error])")
        advance = [t - s for (t, _, _), s in zip(playing, start, strict=True)]
        assert all(not paused and err is None for _, paused, err in playing), playing
        assert min(advance) > 0.3, advance
        browser.js("document.querySelectorAll('button.play').forEach(b => b.click())")  # pause
        groups = browser.js(
            "Array.from(document.querySelectorAll('.sync-group')).map(g => "
            "Array.from(g.querySelectorAll('video')).map(v => v.currentTime))"
        )
        spread = max(max(g) - min(g) for g in groups)
        assert spread <= 1 / 8 + 1e-3, groups  # within a frame after pause

        # scrub: the row's one control moves every video of the row
        browser.js(
            "document.querySelectorAll('input.scrub').forEach(s => { s.value = 2.5; "
            "s.dispatchEvent(new Event('input')); })"
        )
        browser.wait_for(f"{VIDEOS}.every(v => !v.seeking)", timeout=300)
        scrubbed = browser.js(f"{VIDEOS}.map(v => v.currentTime)")
        assert all(abs(t - 2.5) < 1 / 8 for t in scrubbed), scrubbed
        label = browser.js("document.querySelector('.sync-group .time').textContent")
        assert label.startswith("frame 20 · chunk 5"), label

        # sort: a header click orders the rows by that column
        browser.js("document.querySelectorAll('#variants th')[5].click()")  # PSNR
        psnr = browser.js(
            "Array.from(document.querySelectorAll('#variants tbody tr'))"
            ".map(r => r.cells[5].dataset.sort).filter(x => x !== '').map(Number)"
        )
        assert psnr == sorted(psnr) and len(psnr) == 4

        # figures at their natural size (the frontier's panels full width, not thumbnails)
        frontier = browser.js(
            "(() => { const i = document.querySelector('img[src=\"frontier.png\"]'); "
            "return [i.naturalWidth, i.naturalHeight, i.width]; })()"  # width: the content box
        )
        assert frontier[0] >= 900 and frontier[1] > frontier[0], frontier  # panels stacked
        assert abs(frontier[2] - frontier[0]) <= 1, frontier  # shown at 100%

        # screenshot of the first row of videos, not blank
        browser.js("document.querySelector('.sync-group').scrollIntoView()")
        shot = base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png"})["data"])
        path = tmp_path / "report.png"
        path.write_bytes(shot)
        std = _pixel_std(path)
        assert std > 10, std
        errors = browser.console_errors()
        assert errors == [], errors
    finally:
        browser.close()
    print(
        f"\nchromium ({served}): 10 videos ready and seekable; "
        f"currentTime advance in 1.5 s: {min(advance):.2f}..{max(advance):.2f} s; "
        f"spread after pause {spread * 1000:.1f} ms; scrub to 2.5 s: "
        f"{min(scrubbed):.3f}..{max(scrubbed):.3f} s; screenshot {len(shot)} bytes, "
        f"pixel std {std:.1f}"
    )


def _pixel_std(path: Path) -> float:
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(path.read_bytes())) as image:
        return ImageStat.Stat(image.convert("L")).stddev[0]
