"""VoiceChat's tool format (realtime/models/voicechat/tools.py), as pure functions: what
is rendered reads back the same (declared tools, calls, tool results), whatever text the
client or the model put in it, and what does not parse is refused, not raised."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.models.base import VOICECHAT_FIGURES
from realtime.models.voicechat import tools
from realtime.models.voicechat.tools import (
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    VOICECHAT_MARKERS,
    CallReader,
    Markers,
    declared_tools,
    parse_calls,
    render_call,
    render_prompt,
    tool_response_text,
)

HOSTILE = [
    "</AVAILABLE_TOOLS>",
    "<AVAILABLE_TOOLS>",
    "<TOOLCALL>",
    "</TOOLCALL>",
    "<SPECIAL_20>",
    "<SPECIAL_21>",
    "]</TOOL_RESPONSE>",
    "<TOOL_RESPONSE>[",
    '"}]',
    "\\",
    "😀",
]
"""Text that spells the format's own tags and markers, or JSON's syntax."""

texts = st.one_of(
    st.text(max_size=30),
    st.lists(st.sampled_from(HOSTILE) | st.text(max_size=5), max_size=6).map("".join),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
function_tools = st.fixed_dictionaries(
    {"name": texts},
    optional={
        "description": texts,
        "parameters": st.dictionaries(texts, json_values, max_size=3),
        "type": st.just("function"),
    },
)


def shown(tool: dict[str, Any]) -> dict[str, Any]:
    """What of a tool the model is shown."""
    return {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}


# --- declared tools ----------------------------------------------------------------------


def test_the_prompt_is_the_trained_format() -> None:
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    assert render_prompt("Be brief.", [weather]) == (
        "Be brief.\n\nYou can use the following tools to assist the user if required:\n"
        '<AVAILABLE_TOOLS>[{"name": "get_weather", "parameters": {"type": "object"}}]'
        "</AVAILABLE_TOOLS>\n\n"
        "To call tools, answer in this format:\n"
        '<TOOLCALL>[{"name": "tool_name", "arguments": {"arg": "value"}}]</TOOLCALL>\n\n'
        "Tool results come back in this format:\n"
        '<TOOL_RESPONSE>[{"result": "..."}]</TOOL_RESPONSE>'
    )
    assert render_prompt(None, [weather]).startswith("You can use")  # type: ignore[union-attr]
    assert render_prompt("Be brief.", []) == "Be brief."
    assert render_prompt(None, []) is None


@settings(max_examples=200, deadline=None)
@given(st.none() | texts, st.lists(function_tools, min_size=1, max_size=3))
def test_declared_tools_read_back_what_the_prompt_declares(
    instructions: str | None, declared: list[dict[str, Any]]
) -> None:
    prompt = render_prompt(instructions, declared)
    assert prompt is not None
    assert declared_tools(prompt) == [shown(tool) for tool in declared]


@pytest.mark.parametrize(
    "prompt",
    [
        None,
        "",
        "Be brief.",
        "<AVAILABLE_TOOLS>not json</AVAILABLE_TOOLS>",
        "<AVAILABLE_TOOLS>[{}]</AVAILABLE_TOOLS>",
        '<AVAILABLE_TOOLS>{"name": "f"}</AVAILABLE_TOOLS>',
        '<AVAILABLE_TOOLS>[{"name": 3}]</AVAILABLE_TOOLS>',
        '<AVAILABLE_TOOLS>[{"name": "f"}]',  # never closed
        "</AVAILABLE_TOOLS><AVAILABLE_TOOLS>",
        "<AVAILABLE_TOOLS>" + "[" * 100_000 + "</AVAILABLE_TOOLS>",  # too deep to parse
    ],
)
def test_a_prompt_that_declares_no_tool_declares_none(prompt: str | None) -> None:
    assert declared_tools(prompt) == []


# --- calls --------------------------------------------------------------------------------


def test_a_call_is_the_trained_format() -> None:
    assert render_call("get_weather", {"city": "Paris"}) == (
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>'
    )
    assert parse_calls('[{"name": "f", "arguments": "{}"}]') == [("f", "{}")]
    assert parse_calls('<TOOLCALL>{"name": "f"}</TOOLCALL>') == [("f", "{}")]
    assert parse_calls('<SPECIAL_20>[{"name": "f", "arguments": {"a": 1}}]<SPECIAL_21>') == [
        ("f", '{"a": 1}')
    ]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(texts, st.dictionaries(texts, json_values, max_size=3)), min_size=1, max_size=3
    ),
    st.integers(min_value=1, max_value=7),
)
def test_calls_read_back_whatever_their_text_in_any_pieces(
    calls: list[tuple[str, dict[str, Any]]], piece: int
) -> None:
    stream = "".join(render_call(name, arguments) for name, arguments in calls)
    reader = CallReader()
    taken = [c for i in range(0, len(stream), piece) for c in reader.push(stream[i : i + piece])]
    assert [(name, json.loads(args)) for name, args in taken] == calls
    for name, arguments in calls:
        only = parse_calls(render_call(name, arguments))
        assert only is not None and [(n, json.loads(a)) for n, a in only] == [(name, arguments)]


def test_a_call_uses_the_markers_the_figures_name() -> None:
    markers = Markers.of(VOICECHAT_FIGURES)
    assert markers == VOICECHAT_MARKERS
    other = Markers(("<<",), (">>",), "<<|>>")
    text = render_call("f", {"x": "a>>b"}, other)
    assert text.startswith("<<") and text.endswith(">>") and text.count(">>") == 1
    reader = CallReader(other)
    assert reader.push(text[:5]) == []
    assert reader.push(text[5:]) == [("f", '{"x": "a>>b"}')]


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "<TOOLCALL></TOOLCALL>",
        "not json",
        '[{"name": "f"',
        '["x"]',
        "[]",
        '[{"arguments": {}}]',
        '[{"name": ["f"]}]',
        "[" * 5000 + "]" * 5000,
        '{"name": "f", "arguments": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
)
def test_a_payload_that_does_not_parse_is_none(payload: str) -> None:
    assert parse_calls(payload) is None


def test_a_malformed_marked_call_is_skipped_not_held() -> None:
    reader = CallReader()
    assert reader.push("<TOOLCALL>not json</TOOLCALL>") == []
    assert reader.push('<TOOLCALL>[{"name": "f"}]</TOOLCALL>') == [("f", "{}")]
    assert reader.push("<TOOLCALL>" + "[" * 5000) == []
    assert reader.push("</TOOLCALL>" + render_call("g", {})) == [("g", "{}")]


# --- tool results ---------------------------------------------------------------------------


def response_value(text: str) -> Any:
    """What the model reads in a rendered tool result."""
    assert text.startswith(RESPONSE_OPEN) and text.endswith(RESPONSE_CLOSE)
    return json.loads(text[len(RESPONSE_OPEN) : -len(RESPONSE_CLOSE)])


def test_a_tool_result_is_the_trained_format() -> None:
    assert tool_response_text('{"temperature": 21}') == (
        '<TOOL_RESPONSE>[{"temperature": 21}]</TOOL_RESPONSE>'
    )
    assert tool_response_text("sunny") == '<TOOL_RESPONSE>["sunny"]</TOOL_RESPONSE>'
    assert tool_response_text("Zürich") == '<TOOL_RESPONSE>["Z\\u00fcrich"]</TOOL_RESPONSE>'


@settings(max_examples=200, deadline=None)
@given(texts | json_values.map(lambda v: json.dumps(v, ensure_ascii=False)))
def test_a_tool_result_reads_back_and_spells_no_marker(output: str) -> None:
    text = tool_response_text(output)
    assert text.isascii()
    inside = text[len(RESPONSE_OPEN) : -len(RESPONSE_CLOSE)]
    assert not VOICECHAT_MARKERS.any.search(inside)
    try:
        expected = json.loads(output)  # a JSON output is read as its value
    except ValueError:
        expected = output  # anything else as a string
    assert response_value(text) == expected


def test_a_tool_result_nested_too_deeply_raises_recursion_error() -> None:
    with pytest.raises(RecursionError):
        tool_response_text("[" * 100_000 + "]" * 100_000)


def test_the_model_figures_name_the_formats_markers() -> None:
    assert VOICECHAT_FIGURES.tool_call_start == tools.CALL_START
    assert VOICECHAT_FIGURES.tool_call_end == tools.CALL_END
    assert VOICECHAT_FIGURES.marker_pattern == tools.MARKER_PATTERN
