"""Function tools in VoiceChat's own format: declared in the system prompt, called
on the model's function channel.

VoiceChat was trained on ``<AVAILABLE_TOOLS>[…]</AVAILABLE_TOOLS>`` in its prompt
and answers with ``<TOOLCALL>[{"name", "arguments"}]</TOOLCALL>`` (or between
``<SPECIAL_20>``/``<SPECIAL_21>``, or bare JSON) on a channel of its own, a few
tokens a frame. Pure text in, text or calls out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from realtime.models.base import VOICECHAT_FIGURES, ModelFigures


@attrs.frozen(slots=True)
class Markers:
    """The function channel's markers as the model's figures name them."""

    start: re.Pattern[str]
    end: re.Pattern[str]
    any: re.Pattern[str]

    @classmethod
    def of(cls, figures: ModelFigures) -> Markers:
        def one_of(markers: Sequence[str]) -> re.Pattern[str]:
            return re.compile("|".join(re.escape(m) for m in markers))

        return cls(
            one_of(figures.tool_call_start),
            one_of(figures.tool_call_end),
            re.compile(figures.marker_pattern),
        )


VOICECHAT_MARKERS: Final = Markers.of(VOICECHAT_FIGURES)
_DECLARED: Final = ("name", "description", "parameters")
"""What of a GA function tool the model is shown."""

Call = tuple[str, str]
"""One tool call: its name and its arguments as JSON text."""


def render_prompt(instructions: str | None, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """The system prompt: the instructions, then the declared tools in the format
    VoiceChat was trained on (``<AVAILABLE_TOOLS>`` in, ``<TOOLCALL>`` out)."""
    if not tools:
        return instructions
    declared = [{k: v for k, v in tool.items() if k in _DECLARED} for tool in tools]
    listing = json.dumps(declared, ensure_ascii=False, sort_keys=True)
    base = instructions if instructions is not None else ""
    return (
        f"{base}\n\nYou can use the following tools to assist the user if required:\n"
        f"<AVAILABLE_TOOLS>{listing}</AVAILABLE_TOOLS>\n\n"
        "To call tools, answer in this format:\n"
        '<TOOLCALL>[{"name": "tool_name", "arguments": {"arg": "value"}}]</TOOLCALL>\n\n'
        "Tool results come back in this format:\n"
        '<TOOL_RESPONSE>[{"result": "..."}]</TOOL_RESPONSE>'
    ).lstrip()


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
        """The calls ``delta`` completes (usually none)."""
        self._pending += delta
        start = self._markers.start.search(self._pending)
        end = self._markers.end.search(self._pending)
        if start is not None and end is None:
            return []  # a marked call is still arriving
        payload = self._pending[
            start.end() if start else 0 : end.start() if end else len(self._pending)
        ]
        calls = parse_calls(payload, self._markers)
        if calls is None:
            if end is not None:  # a malformed marked call: skip it
                self._pending = self._pending[end.end() :]
            return []
        self._pending = ""
        return calls
