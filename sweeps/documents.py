"""Spec documents (YAML or JSON text) -> plain data, with bounded work: the one parser of specs.

Both `SweepSpec.from_yaml`/`from_json`/`load` (the CLI) and the HTTP service (`service.policy.parse_body`)
parse through `parse_document`, so a document the one refuses the other refuses too, with the same
message. What it refuses, and why:

* YAML anchors and aliases (`&a`, `*a`, `<<: *a`): a 762-byte alias bomb expands to megabytes, and a
  self-referencing alias makes a cyclic object. A spec has no use for them; each value is written out.
* Nesting deeper than MAX_DEPTH (a spec needs 5 levels) and more than MAX_NODES values: the parsers and
  validators recurse and walk, so both are capped before anything else runs.
* Numbers that are not finite (JSON's NaN/Infinity, 1e400, YAML's .inf/.nan) and integers too long for
  Python to convert.

Every refusal is a `SpecLoadError` whose message names the line where the parser knows it, and never
quotes more than a short excerpt of the document.

Torch-free, like sweeps.spec (the service imports it).
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any, Literal

import yaml

__all__ = ["MAX_DEPTH", "MAX_NODES", "SpecLoadError", "compose_yaml", "parse_document", "parse_json", "parse_yaml"]

# A spec nests 5 levels deep (spec > optimizers > entry > extra > value) and holds ~100 values. The node
# bound also bounds the CPU a request costs the service: at 2,000 values a document parses and validates in
# tens of milliseconds (tests/service/test_no_freeze.py loads the service with the worst case).
MAX_DEPTH = 32
MAX_NODES = 2_000
_MESSAGE_CHARS = 300  # a parser's own message is cut here (it may quote a line of the document)
_KEY_CHARS = 40  # of each key in the path a message names


class SpecLoadError(ValueError):
    """The file or text could not be read or parsed (before validation)."""


Kind = Literal["yaml", "json"]


def parse_document(text: str, kind: Kind) -> Any:
    """The data of `text` as YAML or JSON; `SpecLoadError` when it is invalid or refused (see the module)."""
    data = parse_yaml(text) if kind == "yaml" else parse_json(text)
    check_tree(data)
    return data


# --------------------------------------------------------------------------------------------------
# YAML
# --------------------------------------------------------------------------------------------------


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases and caps depth and node count while composing, so
    neither an alias bomb nor thousands of nested `[` ever becomes an object (or a RecursionError)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark is not None else "?"
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise SpecLoadError(
                f"invalid YAML: anchors and aliases (&name, *name, <<: *name) are not accepted (line {line}); "
                f"write each value out"
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise SpecLoadError(f"invalid YAML: more than {MAX_NODES} values (line {line})")
        if not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise SpecLoadError(f"invalid YAML: nested deeper than {MAX_DEPTH} levels (line {line})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_yaml(text: str) -> Any:
    loader = _SpecLoader(text)
    try:
        return loader.get_single_data()
    except SpecLoadError:
        raise
    # ValueError, OverflowError: a constructor's own (an int of 5,000 digits, a bad timestamp)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        raise SpecLoadError(f"invalid YAML: {_parser_message(exc)}") from None
    finally:
        loader.dispose()


def compose_yaml(text: str) -> yaml.Node | None:
    """The node tree of `text` (lines and columns of every value) under the same bounds as
    `parse_yaml`; None when the text is not a document those bounds accept."""
    loader = _SpecLoader(text)
    try:
        return loader.get_single_node()
    except (SpecLoadError, yaml.YAMLError):
        return None
    finally:
        loader.dispose()


# --------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------

# A JSON string literal, escapes included, or an unclosed one to the end of the text: brackets inside
# strings do not nest. Possessive (`++`, `*+`) and closed or not, it matches at every quote it starts
# from without backtracking, so the scan is linear; requiring the closing quote made each unclosed
# quote rescan the rest of the text (quadratic: 256 KiB of `\\"` took minutes).
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_BRACKET_STEPS = str.maketrans({"[": "\x01", "{": "\x01", "]": "\x02", "}": "\x02"})
_NOT_BRACKETS = re.compile(r"[^\x01\x02]")


def _json_depth(text: str) -> int:
    """How deep the brackets of `text` nest, outside strings; linear, without recursion, and done before
    `json.loads` (whose C scanner recurses once per level)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0  # too few brackets to nest too deep: the common case costs two counts
    steps = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", text).translate(_BRACKET_STEPS))
    return max(accumulate(1 if c == "\x01" else -1 for c in steps), default=0)


def _no_constant(name: str) -> Any:
    raise SpecLoadError(f"invalid JSON: {name} is not a number a spec accepts; numbers must be finite")


def parse_json(text: str) -> Any:
    if _json_depth(text) > MAX_DEPTH:
        raise SpecLoadError(f"invalid JSON: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except SpecLoadError:
        raise
    # ValueError: JSONDecodeError, and an int of more than 4,300 digits; RecursionError: a last guard
    except (ValueError, RecursionError) as exc:
        raise SpecLoadError(f"invalid JSON: {_parser_message(exc)}") from None


# --------------------------------------------------------------------------------------------------
# Both
# --------------------------------------------------------------------------------------------------


def check_tree(data: Any) -> None:
    """Depth, node count and finite numbers of parsed data, walked without recursion."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    nodes = 0
    while stack:
        value, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise SpecLoadError(f"the document holds more than {MAX_NODES} values")
        if isinstance(value, float) and not math.isfinite(value):
            where = f" (at {path})" if path else ""
            raise SpecLoadError(f"numbers must be finite, got {value}{where}")
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise SpecLoadError(f"the document is nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                # keys are the client's: cut, so a message names where without quoting a long key
                stack.append((child, depth + 1, f"{path}.{str(key)[:_KEY_CHARS]}".lstrip(".")))


def _parser_message(exc: BaseException) -> str:
    message = str(exc)
    if "integer string conversion" in message:  # Python's own limit, phrased for the programmer
        return "a number has more than 4300 digits"
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_DEPTH} levels"
    return message if len(message) <= _MESSAGE_CHARS else message[:_MESSAGE_CHARS] + "..."
