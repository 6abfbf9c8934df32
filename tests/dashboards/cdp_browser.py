"""A minimal headless-Chromium driver over the DevTools protocol, stdlib only.

Chromium is started with `--remote-debugging-pipe`: it reads CDP commands (JSON, NUL-terminated) on
fd 3 and writes responses and events on fd 4, so no websocket client library and no open debugging
port are needed. Debian's `/usr/bin/chromium` (the project's setup installs it; Playwright's browser
download does not work offline).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("BATCHSWEEP_CHROMIUM", "/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--window-size=1400,1000",
)


class CDPError(RuntimeError):
    pass


def find_chromium() -> str | None:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    return path


class Chromium:
    """`with Chromium() as browser: page = browser.new_page(); page.goto(url)`."""

    def __init__(self, executable: str | None = None, *, user_data_dir: Path | None = None) -> None:
        exe = executable or find_chromium()
        if exe is None:
            raise FileNotFoundError(
                f"no Chromium at {CHROMIUM}: the end-to-end test needs Debian's `chromium` package, which "
                "`make test`'s setup installs (apt-get install -y chromium)"
            )
        self._own_dir = user_data_dir is None
        self.user_data_dir = user_data_dir or Path(tempfile.mkdtemp(prefix="batchsweep-chromium-"))
        to_child_r, self._to_child = os.pipe()  # we write commands -> Chromium reads fd 3
        self._from_child, from_child_w = os.pipe()  # Chromium writes fd 4 -> we read

        def wire() -> None:
            # In the child, before exec: the pipe ends land on fds 3 and 4 (copied out of the way
            # first, in case one of them is 3 or 4 already). subprocess closes other fds after this,
            # keeping pass_fds=(3, 4).
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.user_data_dir}", "about:blank"],
            pass_fds=(3, 4),
            preexec_fn=wire,
            stdout=subprocess.DEVNULL,
            stderr=(self.user_data_dir / "chromium.log").open("wb"),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._responses: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()
        self.call("Browser.getVersion", timeout=60)  # the first answer: Chromium is up

    # ---- transport -------------------------------------------------------------------------------

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._responses[-1] = {"error": {"message": "Chromium closed the pipe"}}
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cond:
                    if "id" in msg:
                        self._responses[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cond.notify_all()

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            msg_id = self._next_id
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError as e:
            raise CDPError(
                f"{method}: Chromium is gone (rc={self.proc.poll()}); its log ends:\n{self.log_tail()}"
            ) from e
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self._responses:
                if -1 in self._responses:
                    raise CDPError(
                        f"{method}: Chromium exited (rc={self.proc.poll()}); its log ends:\n{self.log_tail()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"CDP {method} got no answer in {timeout} s")
                self._cond.wait(left)
            resp = self._responses.pop(msg_id)
        if "error" in resp:
            raise CDPError(f"{method}: {resp['error']}")
        return resp.get("result", {})

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.user_data_dir / "chromium.log").read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def wait_event(
        self, method: str, *, session: str | None = None, since: int = 0, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The first event `method` (of `session`) at index >= since."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events[since:]:
                    if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} event in {timeout} s")
                self._cond.wait(left)

    # ---- pages -----------------------------------------------------------------------------------

    def new_page(self, width: int = 1400, height: int = 1000) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        return page

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._own_dir:
            shutil.rmtree(self.user_data_dir, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session, timeout=timeout)

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait for the load event."""
        since = len(self.browser.events)
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError(f"navigation to {url} failed: {result['errorText']}")
        if "loaderId" not in result:
            return  # a same-document navigation (only the #fragment changed): no load event comes
        self.browser.wait_event("Page.loadEventFired", session=self.session, since=since, timeout=timeout)

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        res = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, timeout=timeout
        )
        if "exceptionDetails" in res:
            raise CDPError(f"evaluate({expression!r}): {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, interval: float = 0.25) -> Any:
        """Poll a JS expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"{expression!r} still falsy after {timeout} s (last value {value!r})")

    def errors(self) -> list[str]:
        """JS exceptions, console.error calls and error log entries (failed loads) of this page."""
        out = []
        for ev in self.browser.events:
            if ev.get("sessionId") != self.session:
                continue
            p = ev.get("params", {})
            if ev["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(
                    "console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", []))
                )
            elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log: {e.get('text')} {e.get('url', '')}")
        return out

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params |= {
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000), "scale": 1},
            }
        data = self.call("Page.captureScreenshot", params, timeout=60)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
