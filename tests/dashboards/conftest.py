"""The browser of the dashboard tests: `harness.chromium()`, Debian's Chromium driven by Playwright."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import chromium
from playwright.sync_api import Browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b
