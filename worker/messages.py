"""How an error message quotes a refused value: named, never echoed at length."""

from __future__ import annotations

from typing import Any

EXCERPT_CHARS = 120  # the most of a refused value an error message echoes (room for an absolute path)


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """repr(value), cut to `limit` characters: messages name a refused value but never echo a long one."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
