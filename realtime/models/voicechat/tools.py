"""VoiceChat's tool format, rendered and parsed in one place.

VoiceChat was trained on its tools declared in the system prompt
(``<AVAILABLE_TOOLS>[…]</AVAILABLE_TOOLS>``), answers with
``<TOOLCALL>[{"name", "arguments"}]</TOOLCALL>`` (or between ``<SPECIAL_20>`` and
``<SPECIAL_21>``, or bare JSON) on a channel of its own, a few tokens a frame, and
reads a tool's output as ``<TOOL_RESPONSE>[…]</TOOL_RESPONSE>``
(docs/nemotron-voicechat.md cites NVIDIA's code). The OpenAI and Live dialects, the
demo model and the frame step all read and write it through here.

Pure text in, text or values out, and no MLX: the dialects and the demo import this
module and nothing else of ``realtime.models.voicechat`` (tests/test_mlx_boundary.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

CALL_START: Final = ("<SPECIAL_20>", "<TOOLCALL>")
"""What opens a call on the function channel: the tokenizer's special token, or the
spelled-out tag of the prompt format (the last, which :func:`render_call` writes)."""
CALL_END: Final = ("<SPECIAL_21>", "</TOOLCALL>")
"""What closes a call, as :data:`CALL_START`."""
MARKER_PATTERN: Final = r"<SPECIAL_\d+>|</?TOOLCALL>|</?TOOL_RESPONSE>"
"""Every special-token text that never belongs in a call's payload."""

TOOLS_OPEN: Final = "<AVAILABLE_TOOLS>"
TOOLS_CLOSE: Final = "</AVAILABLE_TOOLS>"
RESPONSE_OPEN: Final = "<TOOL_RESPONSE>["
RESPONSE_CLOSE: Final = "]</TOOL_RESPONSE>"

_DECLARED: Final = ("name", "description", "parameters")
"""What of a function tool the model is shown."""
_LISTING_TAGS: Final = re.compile(f"{re.escape(TOOLS_OPEN)}|{re.escape(TOOLS_CLOSE)}")

Call = tuple[str, str]
"""One tool call: its name and its arguments as JSON text."""


class NamesMarkers(Protocol):
    """Where a model names its call markers (``realtime.models.base.ModelFigures``)."""

    @property
    def tool_call_start(self) -> tuple[str, ...]: ...
    @property
    def tool_call_end(self) -> tuple[str, ...]: ...
    @property
    def marker_pattern(self) -> str: ...


def _one_of(markers: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(m) for m in markers))


@attrs.frozen(slots=True)
class Markers:
    """The function channel's markers: any of ``start`` opens a call, any of ``end``
    closes it, ``pattern`` matches every marker text a payload drops."""

    start: tuple[str, ...]
    end: tuple[str, ...]
    pattern: str
    starts: re.Pattern[str] = attrs.field(
        init=False, default=attrs.Factory(lambda self: _one_of(self.start), takes_self=True)
    )
    ends: re.Pattern[str] = attrs.field(
        init=False, default=attrs.Factory(lambda self: _one_of(self.end), takes_self=True)
    )
    any: re.Pattern[str] = attrs.field(
        init=False, default=attrs.Factory(lambda self: re.compile(self.pattern), takes_self=True)
    )

    @classmethod
    def of(cls, figures: NamesMarkers) -> Markers:
        """The markers a model's figures name."""
        return cls(figures.tool_call_start, figures.tool_call_end, figures.marker_pattern)


VOICECHAT_MARKERS: Final = Markers(CALL_START, CALL_END, MARKER_PATTERN)


def _escaped(json_text: str, marks: re.Pattern[str]) -> str:
    """``json_text`` with each match of ``marks`` (a marker, a tag) spelled with its
    first character as a JSON escape: the same value to a JSON reader, but no longer
    the marker, so a string inside cannot close (or open) what holds it. Markers are
    special-token texts, never JSON syntax: they only match inside strings."""
    return marks.sub(lambda m: _json_escape(m.group()[0]) + m.group()[1:], json_text)


def _json_escape(char: str) -> str:
    """``char`` as JSON's ``\\uXXXX`` escapes (a surrogate pair past the BMP)."""
    units = char.encode("utf-16-be", "surrogatepass")
    return "".join(
        f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)
    )


# --- the system prompt: tools declared -----------------------------------------------


def render_prompt(instructions: str | None, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """The system prompt: the instructions, then the declared tools (their name,
    description and parameters) in the format VoiceChat was trained on, last. Their
    text never spells the listing's tags (:func:`declared_tools` reads back every
    tool, whatever the instructions and the tools say)."""
    if not tools:
        return instructions
    declared = [{k: v for k, v in tool.items() if k in _DECLARED} for tool in tools]
    listing = _escaped(json.dumps(declared, ensure_ascii=False, sort_keys=True), _LISTING_TAGS)
    base = instructions if instructions is not None else ""
    return (
        f"{base}\n\nYou can use the following tools to assist the user if required:\n"
        f"{TOOLS_OPEN}{listing}{TOOLS_CLOSE}\n\n"
        "To call tools, answer in this format:\n"
        f'{CALL_START[-1]}[{{"name": "tool_name", "arguments": {{"arg": "value"}}}}]'
        f"{CALL_END[-1]}\n\n"
        "Tool results come back in this format:\n"
        f'{RESPONSE_OPEN}{{"result": "..."}}{RESPONSE_CLOSE}'
    ).lstrip()


def declared_tools(system_prompt: str | None) -> list[dict[str, Any]]:
    """The tools ``system_prompt`` declares (its last listing, where
    :func:`render_prompt` puts it), each an object with a string ``name``; none when
    it declares none or its listing does not parse."""
    text = system_prompt or ""
    start = text.rfind(TOOLS_OPEN)
    end = text.find(TOOLS_CLOSE, start)
    if start < 0 or end < 0:
        return []
    try:
        tools = json.loads(text[start + len(TOOLS_OPEN) : end])
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
        return []
    if not isinstance(tools, list):
        return []
    return [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]


# --- the function channel: calls ---------------------------------------------------------


def render_call(
    name: str, arguments: Mapping[str, Any], markers: Markers = VOICECHAT_MARKERS
) -> str:
    """One call as the model writes it on its function channel, between the markers
    named last (the spelled-out tags of the prompt format); no marker text inside it
    (:func:`parse_calls` and :class:`CallReader` read back the same call)."""
    call = json.dumps([{"name": name, "arguments": dict(arguments)}], ensure_ascii=False)
    return f"{markers.start[-1]}{_escaped(call, markers.any)}{markers.end[-1]}"


def parse_calls(text: str, markers: Markers = VOICECHAT_MARKERS) -> list[Call] | None:
    """``(name, arguments JSON)`` of each call in one tool-call payload, or ``None``
    while it does not parse yet."""
    body = markers.any.sub("", text).strip()
    if not body:
        return None
    try:
        parsed = json.loads(body)
        entries = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                return None
            args = entry.get("arguments", {})
            calls.append((entry["name"], args if isinstance(args, str) else json.dumps(args)))
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse or dump
        return None
    return calls or None


class CallReader:
    """The function channel as it streams in, a delta at a time: each call comes out
    once it is complete. A call between markers waits for its end marker; one that
    still does not parse then is skipped, so a malformed call cannot hold back the
    ones after it."""

    def __init__(self, markers: Markers = VOICECHAT_MARKERS) -> None:
        self._markers = markers
        self._pending = ""
        """What arrived after the last call taken (or skipped)."""

    def push(self, delta: str) -> list[Call]:
        """The calls ``delta`` completes (usually none; a delta that ends one call and
        holds the next keeps what it holds of the next)."""
        self._pending += delta
        calls: list[Call] = []
        while (taken := self._take()) is not None:
            calls += taken
        return calls

    def _take(self) -> list[Call] | None:
        """The next call's calls, taken from what is pending ([] for a malformed marked
        call, skipped); None while nothing more is complete."""
        start = self._markers.starts.search(self._pending)
        end = self._markers.ends.search(self._pending)
        if start is not None and end is None:
            return None  # a marked call is still arriving
        payload = self._pending[
            start.end() if start else 0 : end.start() if end else len(self._pending)
        ]
        calls = parse_calls(payload, self._markers)
        if end is not None:  # taken, or malformed and skipped: what follows stays
            self._pending = self._pending[end.end() :]
            return calls or []
        if calls is None:
            return None  # an unmarked call, not complete yet
        self._pending = ""
        return calls


# --- a tool's output, fed back ---------------------------------------------------------


def tool_response_text(output: str) -> str:
    """A tool's output as the model was trained to read it: NVIDIA's
    ``<TOOL_RESPONSE>[...]</TOOL_RESPONSE>`` with the value as ASCII JSON (a JSON
    output re-serialised, anything else as a JSON string), in which no marker text is
    spelled (the output cannot close the response or open a call). RecursionError
    when the output's JSON nests too deeply to parse."""
    try:
        body = json.dumps(json.loads(output))
    except ValueError:
        body = json.dumps(output)
    return f"{RESPONSE_OPEN}{_escaped(body, VOICECHAT_MARKERS.any)}{RESPONSE_CLOSE}"
