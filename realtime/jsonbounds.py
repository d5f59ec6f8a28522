"""JSON from outside (a client's message, an operator's file) read within bounds.

``json.loads`` builds whatever a text describes: a 4 MiB message of 1.3 million
``{}`` costs hundreds of milliseconds of the event loop and ~100 MB while it is built,
and 100,000 levels of nesting raise ``RecursionError`` in the parser or in anything
that walks the result. :func:`load` refuses such a text before building it, by its
structure (how many values, how deep), decided from the text alone; every reader of
outside JSON goes through it (both WebSocket endpoints and ``--warm-prompt`` files),
so the bounds are one implementation with one set of numbers.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import attrs

MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of objects and arrays in a client event. GA events nest a few
levels (a tool's JSON schema a dozen); the bound keeps every recursive step on
client JSON (parsing, ``copy.deepcopy``, comparisons, ``json.dumps``) far from
Python's recursion limit, which 800 to 1000 levels reach (RecursionError)."""
MAX_JSON_VALUES: Final = 4096
"""Most JSON values (objects, arrays, scalars) in one client event, checked before
anything is parsed. A GA event holds a few dozen, a session with tools a few
hundred; one of a million ``{}`` took far more memory and seconds of the event loop
to parse, copy and echo (docs/reliability.md)."""

_TOKEN: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|\{\s*\}|\[\s*\]|[,\[{]')
"""A JSON string (escapes and all), an empty object or array, a comma or an opening
bracket: the tokens that tell how many values a JSON text holds."""
_CHUNK: Final = 1 << 16
"""Characters counted at a time by the first, rough pass of :func:`too_many_values`."""


@attrs.frozen(slots=True)
class Shape:
    """How big a JSON value is as Python builds it."""

    values: int
    """Objects, arrays and scalars, itself included (object keys are not counted)."""
    depth: int
    """Nesting of objects and arrays (a scalar: 0)."""


def shape(value: object) -> Shape:
    """``value``'s shape, walked a level at a time rather than recursively: its depth
    may be what is being checked."""
    values, depth = 0, 0
    level: list[Any] = [value]
    while level:
        values += len(level)
        below: list[Any] = []
        nested = False
        for node in level:
            if isinstance(node, dict):
                below.extend(node.values())
                nested = True
            elif isinstance(node, list):
                below.extend(node)
                nested = True
        depth += nested
        level = below
    return Shape(values, depth)


def utf8_size(text: str) -> int:
    """``text``'s size in UTF-8 bytes (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def too_many_values(frame: str, limit: int) -> bool:
    """Whether the JSON text ``frame`` holds more than ``limit`` values, decided
    without parsing it, at a cost bounded whatever the text.

    Outside strings, a JSON text holds one value, plus one per comma, plus one per
    object or array that is not empty (its first element). A rough pass counts those
    marks anywhere (strings included) a chunk at a time: nearly every message is well
    under (audio is base64, which holds none). Past it, the text is read token by
    token from its start (a string or an empty object or array is one token) until
    the limit is passed, which a flood of ``{},{},...`` does within its first few
    kilobytes. Valid JSON has at most two tokens that are not marks (a key and its
    value) per mark, so a text that goes on longer without passing the limit is not
    JSON: the scan stops there and ``json.loads`` refuses it at its first error."""
    marks = 1
    for start in range(0, len(frame), _CHUNK):
        end = start + _CHUNK
        marks += frame.count(",", start, end) + frame.count("[", start, end)
        marks += frame.count("{", start, end)
        if marks > limit:
            break
    else:
        return False
    values, budget = 1, 3 * limit + 3
    for found in _TOKEN.finditer(frame):
        if found.end() - found.start() == 1:  # a mark; a string or {} is longer
            values += 1
            if values > limit:
                return True
        budget -= 1
        if budget <= 0:
            return False
    return values > limit


class Refused(ValueError):
    """A JSON text :func:`load` did not build; the message completes a sentence whose
    subject the caller names ("message ...", "the warm prompt F ...")."""


class TooManyValues(Refused):
    """More values than the bound: refused from the text, before anything is built."""


class TooDeep(Refused):
    """Nested deeper than the bound (also when the parser itself ran out of stack)."""


class NotJson(Refused):
    """Not JSON at all (or a number longer than Python's int-string limit)."""


def load(text: str, *, max_values: int = MAX_JSON_VALUES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``text`` parsed, or :class:`Refused`. The number of values is checked before
    ``json.loads`` builds anything, the nesting before anything walks the result
    recursively (a text too deep for the C parser is refused the same way), so a
    hostile text costs a bounded scan of it, never its structure."""
    if too_many_values(text, max_values):
        raise TooManyValues(
            f"holds more than {max_values} JSON values (objects, arrays, strings, numbers)"
        )
    deep = TooDeep(f"nests deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except RecursionError:
        raise deep from None
    except json.JSONDecodeError as exc:
        raise NotJson(f"is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer longer than Python's digit limit
        raise NotJson(f"cannot be read: {exc}") from None
    if shape(value).depth > max_depth:
        raise deep
    return value
