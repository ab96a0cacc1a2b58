"""Pages rendered by a real browser: headless Chromium driven over the DevTools protocol.

No driver and no package: Chromium's ``--remote-debugging-pipe`` reads protocol commands from
file descriptor 3 and writes replies and events to 4, each a JSON message ended by a NUL
byte. The tests open a page, wait for its scripts, and read the DOM as a reader sees it.
Everything is local (``file://`` pages); a request anywhere else is recorded, so a test can
say the page is self-contained. What a report page shows (its tables, images and gate rows)
is read by the helpers at the end, for the report tests on written records and on real runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: A browser other than the Debian package's, for machines that have one elsewhere.
CHROMIUM_ENV = "LONGCTX_TEST_CHROMIUM"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--remote-debugging-pipe",
)
#: Generous: a loaded 2-core machine renders a pytest-html page in seconds, not minutes. Only
#: a hang ends at this limit; no test asserts a duration.
PROTOCOL_TIMEOUT_S = 120.0
#: URL schemes a self-contained page may load.
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:", "chrome:", "devtools:")


class BrowserError(RuntimeError):
    """The browser died, hung or answered a command with an error."""


def find_chromium() -> str | None:
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        return shutil.which(override) or (override if os.access(override, os.X_OK) else None)
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def install_chromium() -> tuple[str | None, str]:
    """Chromium's path, installing the Debian package when root can; else why not."""
    found = find_chromium()
    if found:
        return found, ""
    if os.environ.get(CHROMIUM_ENV):
        return None, f"{CHROMIUM_ENV}={os.environ[CHROMIUM_ENV]} is not an executable browser"
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return None, (
            "Chromium is not installed and cannot be installed here (needs root and apt-get); "
            f"install the 'chromium' package or set {CHROMIUM_ENV}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "chromium"]
    tail = ""
    # Installed straight away when the package lists are there; else after an update.
    for commands in ([install], [[apt, "-q", "update"], install]):
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
            tail = (done.stdout + done.stderr)[-800:]
        if find_chromium():
            break
    found = find_chromium()
    if found:
        return found, ""
    return None, f"`apt-get install -y chromium` did not install Chromium: {tail}"


_ON_THREE_AND_FOUR = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def _above_four(fd: int) -> int:
    """The same pipe end on a descriptor above 4 (the original is closed)."""
    if fd > 4:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return moved


@dataclass
class Page:
    """A loaded page in its own tab: evaluate JavaScript, read what the browser reported."""

    browser: Browser
    session: str
    url: str
    #: Console errors, uncaught exceptions and the browser's error log entries.
    errors: list[str] = field(default_factory=list)
    #: Requests to anything that is not the local file or inline data.
    external_requests: list[str] = field(default_factory=list)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (a promise is awaited), as JSON."""
        reply = self.browser.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]!r} threw: {text}")
        return reply["result"].get("value")

    def wait_for(self, expression: str) -> Any:
        """Wait until ``expression`` is truthy (a script rendering the page), then its value."""
        script = f"""new Promise((resolve) => {{
            const ready = () => {{ try {{ return ({expression}); }} catch (e) {{ return null; }} }};
            const poll = () => {{ const value = ready(); if (value) resolve(value);
                                  else setTimeout(poll, 50); }};
            poll();
        }})"""
        return self.evaluate(script)

    def images(self) -> list[dict]:
        """Every ``<img>`` once it has loaded or failed: alt text, decoded size, whether it
        is rendered (laid out on the page) and the start of its ``src`` attribute."""
        return self.evaluate(
            """Promise.all([...document.images].map((img) =>
                (img.complete ? Promise.resolve() : new Promise((done) => {
                    img.addEventListener('load', done); img.addEventListener('error', done);
                })).then(() => ({alt: img.alt, width: img.naturalWidth,
                                 height: img.naturalHeight,
                                 shown: img.getClientRects().length > 0,
                                 src: (img.getAttribute('src') || '').slice(0, 22)}))))"""
        )

    def table(self, selector: str) -> list[list[str]]:
        """The rendered text of every body row of the table at ``selector``."""
        return self.evaluate(
            f"""[...document.querySelectorAll({json.dumps(selector + " tbody tr")})].map(
                (tr) => [...tr.cells].map((td) => td.innerText.trim()))"""
        )

    def header(self, selector: str) -> list[str]:
        return self.evaluate(
            f"""[...document.querySelectorAll({json.dumps(selector + " thead th")})].map(
                (th) => th.innerText.trim())"""
        )


class Browser:
    """One headless Chromium, spoken to over its DevTools pipe."""

    def __init__(self, executable: str) -> None:
        self._profile = tempfile.mkdtemp(prefix="longctx-chromium-")
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()
        # Above 4, so that placing one on 3 or 4 in the child cannot overwrite the other.
        commands_read, replies_write = (_above_four(fd) for fd in (commands_read, replies_write))
        args = [executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"]
        # Chromium wants the pipe on descriptors 3 and 4 exactly: a small Python process puts
        # it there and becomes Chromium (a POSIX shell cannot name descriptors above 9).
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ON_THREE_AND_FOUR, str(commands_read), str(replies_write)]
            + args,
            pass_fds=(commands_read, replies_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []
        self._pages: dict[str, Page] = {}
        self.version = self.call("Browser.getVersion")["product"]

    # -- protocol

    def _send(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._commands, data) :]

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no message from Chromium in {PROTOCOL_TIMEOUT_S:.0f} s")
            ready, _, _ = select.select([self._replies], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its pipe: {self._stderr_tail()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _dispatch(self, message: dict) -> None:
        page = self._pages.get(message.get("sessionId", ""))
        method, params = message.get("method"), message.get("params", {})
        if page is None:
            self._events.append(message)
            return
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(arg.get("value", arg.get("description", ""))) for arg in params["args"]]
            page.errors.append("console." + params["type"] + ": " + " ".join(texts))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            page.errors.append(f"uncaught: {text}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            page.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(LOCAL_SCHEMES):
                page.external_requests.append(url)
        self._events.append(message)

    def call(self, method: str, params: dict | None = None, *, session: str | None = None) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + PROTOCOL_TIMEOUT_S
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._dispatch(reply)

    def _wait_event(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + PROTOCOL_TIMEOUT_S
        while True:
            for index, event in enumerate(self._events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self._events.pop(index)
            self._dispatch(self._receive(deadline))

    # -- pages

    def open(self, target: Path | str) -> Page:
        """Load a file (or URL) in a new tab and wait for its load event."""
        url = Path(target).absolute().as_uri() if isinstance(target, Path) else target
        target_id = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target_id, "flatten": True})[
            "sessionId"
        ]
        page = Page(self, session, url)
        self._pages[session] = page
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        self._events.clear()
        navigation = self.call("Page.navigate", {"url": url}, session=session)
        if navigation.get("errorText"):
            raise BrowserError(f"{url}: {navigation['errorText']}")
        self._wait_event("Page.loadEventFired", session)
        return page

    def _stderr_tail(self) -> str:
        with contextlib.suppress(Exception):
            if self.process.poll() is not None and self.process.stderr is not None:
                return self.process.stderr.read().decode(errors="replace")[-2000:]
        return "(still running)"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        for fd in (self._commands, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)


# -- what pages show -----------------------------------------------------------------------


def assert_clean(page: Page) -> None:
    """No console error or uncaught exception, and nothing loaded from elsewhere."""
    page.evaluate("document.readyState")  # reads every event the browser sent so far
    assert page.errors == [], page.url
    assert page.external_requests == [], page.url


def assert_images_decoded(page: Page, expected: set[str]) -> list[dict]:
    """Every image on show decoded (a broken or empty one has naturalWidth 0), ``expected``
    among them; returns those. pytest-html's per-row media viewers hold an ``<img src="">``
    that stays hidden in rows without media: those may be empty, never shown."""
    images = page.images()
    shown = [image for image in images if image["shown"]]
    assert shown, f"no image on show in {page.url}: {images}"
    for image in shown:
        assert image["width"] > 0 and image["height"] > 0, image
        assert image["src"].startswith("data:image/png;base64"), image
    for image in images:
        assert image["shown"] or image["src"] == "", image  # a hidden image is a placeholder
    assert expected <= {image["alt"] for image in shown}, images
    return shown


def gate_rows(page: Page) -> dict[str, dict]:
    """The gate table's rows as rendered: length -> cells by header, failing, background."""
    rows = page.evaluate(
        """[...document.querySelectorAll('.longctx-gate-table tbody tr')].map((tr) => ({
            cells: [...tr.cells].map((td) => td.innerText.trim()),
            failing: tr.classList.contains('longctx-gate-failing'),
            background: getComputedStyle(tr.cells[0]).backgroundColor}))"""
    )
    header = page.header(".longctx-gate-table")
    return {
        row["cells"][0]: {
            **dict(zip(header, row["cells"], strict=True)),
            "failing": row["failing"],
            "background": row["background"],
        }
        for row in rows
    }


def assert_gate_shows(page: Page, failing: set[str], passing: set[str]) -> dict[str, dict]:
    rows = gate_rows(page)
    assert set(rows) == failing | passing
    assert {n for n, row in rows.items() if row["failing"]} == failing
    for length in failing:
        assert rows[length]["Gate"] == "regressed"
        assert rows[length]["background"] == "rgb(253, 232, 232)"  # highlighted, as rendered
    for length in passing:
        assert rows[length]["Gate"] == "passed"
        assert rows[length]["background"] != "rgb(253, 232, 232)"
    shown = page.evaluate(
        "[...document.querySelectorAll('.longctx-gate-failures li')].map((li) => li.innerText)"
    )
    assert {text.split(":")[0] for text in shown} == failing
    return rows


def assert_shown(text: str, value: float) -> None:
    """``text`` is ``value`` rounded to the decimals it shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    assert abs(float(text.replace(",", "")) - value) <= 0.5 * 10**-decimals + 1e-9, (text, value)


def results_table(page: Page) -> dict[str, dict[str, str]]:
    """pytest-html's results table once its script built it: test name -> cells by header."""
    page.wait_for("document.querySelectorAll('#results-table tbody.results-table-row').length")
    header = page.header("#results-table")
    rows = page.evaluate(
        """[...document.querySelectorAll('#results-table tbody.results-table-row')].map(
            (body) => [...body.querySelector('tr.collapsible').cells].map(
                (td) => td.innerText.trim()))"""
    )
    table = {}
    for cells in rows:
        row = dict(zip(header, cells, strict=True))
        table[row["Test"].rsplit("::", 1)[-1]] = row
    return table


def summary_lengths(page: Page) -> list[str]:
    return [row[0] for row in page.table(".longctx-lengths")]  # the per-length table



@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's path; installed with apt-get when missing and possible, else a skip."""
    path, why = install_chromium()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def browser(chromium: str) -> Iterator[Browser]:
    instance = Browser(chromium)
    try:
        yield instance
    finally:
        instance.close()
