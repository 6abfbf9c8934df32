"""Log lines as text or JSON, with the sweep and trial they belong to.

`log_context(sweep_id=..., trial=...)` sets what every log line of this thread (and of the tasks it
starts) carries until the block ends; `configure("json")` makes each line one JSON object:

    {"time": "2026-12-02T04:58:12.031Z", "level": "INFO", "logger": "sweeps.search",
     "message": "...", "sweep_id": "demo-1a2b3c4d", "trial": "trial_00003"}

The service (`SWEEPS_LOG_FORMAT=json`) and every sweep driver it launches (the format travels in the
`SweepRuntime`) log this way; `text` keeps the plain lines, with `[sweep trial]` appended when known.
Standard library logging only: a formatter and a filter, no handler of our own.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s"

_sweep: contextvars.ContextVar[str | None] = contextvars.ContextVar("batchsweep_sweep_id", default=None)
_trial: contextvars.ContextVar[str | None] = contextvars.ContextVar("batchsweep_trial", default=None)


@contextlib.contextmanager
def log_context(*, sweep_id: str | None = None, trial: str | None = None) -> Iterator[None]:
    """Lines logged in this block carry `sweep_id` and `trial` (those given; the others stay)."""
    tokens = []
    if sweep_id is not None:
        tokens.append((_sweep, _sweep.set(sweep_id)))
    if trial is not None:
        tokens.append((_trial, _trial.set(trial)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class ContextFilter(logging.Filter):
    """Puts the context on every record: `sweep_id`, `trial`, and `context` (text: ` [sweep trial]`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.sweep_id, record.trial = _sweep.get(), _trial.get()
        known = " ".join(v for v in (record.sweep_id, record.trial) if v)
        record.context = f" [{known}]" if known else ""
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("sweep_id", "trial"):
            if (value := getattr(record, key, None)) is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str = "text", level: int | str = logging.INFO) -> None:
    """The root logger's handlers (one to stderr if there is none) format as `log_format`, with the context."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    root.setLevel(level if isinstance(level, int) else level.upper())
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
        if not any(isinstance(f, ContextFilter) for f in handler.filters):
            handler.addFilter(ContextFilter())


__all__ = ["LOG_FORMATS", "ContextFilter", "JsonFormatter", "LogFormat", "configure", "log_context"]
