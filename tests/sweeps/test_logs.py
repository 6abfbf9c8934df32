"""Log lines as text or JSON, carrying the sweep and the trial they belong to (sweeps/logs.py)."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from sweeps.logs import configure, log_context


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger with one handler writing to a buffer, restored after."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    out = io.StringIO()
    root.handlers = [logging.StreamHandler(out)]
    yield out
    root.handlers, root.level = saved, level


def test_json_lines_carry_the_sweep_and_the_trial(captured: io.StringIO) -> None:
    configure("json")
    log = logging.getLogger("sweeps.search")
    log.info("outside")
    with log_context(sweep_id="demo-1a2b3c4d"):
        log.warning("driver %s", "started")
        with log_context(trial="trial_00003"):
            log.info("trial done")
        log.info("after the trial")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [(x["level"], x["message"], x.get("sweep_id"), x.get("trial")) for x in lines] == [
        ("INFO", "outside", None, None),
        ("WARNING", "driver started", "demo-1a2b3c4d", None),
        ("INFO", "trial done", "demo-1a2b3c4d", "trial_00003"),
        ("INFO", "after the trial", "demo-1a2b3c4d", None),
    ]
    assert all(x["logger"] == "sweeps.search" and x["time"].endswith("Z") for x in lines)


def test_text_lines_append_the_context_and_threads_keep_their_own(captured: io.StringIO) -> None:
    configure("text")
    log = logging.getLogger("service.cluster.supervisor")

    def other() -> None:
        with log_context(sweep_id="b"):
            log.info("from b")

    with log_context(sweep_id="a"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        log.info("from a")
    text = captured.getvalue().splitlines()
    assert text[0].endswith("service.cluster.supervisor: from b [b]") and text[1].endswith("from a [a]")


def test_an_unknown_format_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="one of text, json, got 'xml'"):
        configure("xml")
