"""The browser of the dashboard tests: Debian's Chromium (`/usr/bin/chromium`, which `make test`'s
setup installs) driven by Playwright. Playwright's own browser download does not work offline; its
Python wheel carries its driver."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = os.environ.get("BATCHSWEEP_CHROMIUM", "/usr/bin/chromium")
# headless on a machine with no network: without the background-networking flags Chromium's own
# connections are refused by the closed network, many at a time
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    exe = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if exe is None:
        pytest.fail("Chromium is missing: these tests need Debian's `chromium` package (apt-get install -y chromium)")
    # Playwright, not our own DevTools-protocol client: the browser's events come typed and tested upstream
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
        yield b
        b.close()
