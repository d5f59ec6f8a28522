"""Log formatters on client-controlled text: no forged lines, no terminal escapes, a bound.

A request path like ``/static/<4200 chars with %0d and ESC[31m>`` reached the text
log raw (Quart logs the decoded path, with a traceback). Records in, text out.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from types import TracebackType
from typing import Any

import pytest

from realtime.telemetry.logs import EXTRA, MAX_MESSAGE_CHARS, JsonFormatter, TextFormatter

CONTROLS = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]]
"""C0, DEL and C1: none may reach a text log line raw."""
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
"""What a formatted text record may not contain (LF only between traceback lines)."""
ATTACK = (
    "/static/" + "A" * 10 + "\r\n2026-01-01 00:00:00,000 INFO realtime: forged\x1b[31m" + "B" * 4200
)

ExcInfo = tuple[type[BaseException], BaseException, TracebackType]


def record(
    msg: str,
    *args: object,
    exc_info: ExcInfo | None = None,
    fields: dict[str, Any] | None = None,
    name: str = "quart.app",
) -> logging.LogRecord:
    rec = logging.LogRecord(name, logging.ERROR, "app.py", 1, msg, args or None, exc_info)
    if fields is not None:
        setattr(rec, EXTRA, fields)
    return rec


def raised(message: str) -> ExcInfo:
    try:
        raise ValueError(message)
    except ValueError:
        info = sys.exc_info()
    assert info[0] is not None and info[1] is not None and info[2] is not None
    return info[0], info[1], info[2]


def text(rec: logging.LogRecord) -> str:
    return TextFormatter().format(rec)


@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"{ord(c):#04x}")
def test_every_control_character_is_escaped_in_message_and_arguments(char: str) -> None:
    for rec in (record(f"in the message {char}!"), record("an argument %s!", f"<{char}>")):
        line = text(rec)
        assert char not in line
        assert "\n" not in line
        expected = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(char, f"\\x{ord(char):02x}")
        assert expected in line


def test_a_crlf_and_an_ansi_colour_cannot_forge_a_line() -> None:
    line = text(record("Exception on request GET %s", "/static/a\r\nfake INFO line\x1b[31mred"))
    assert line.endswith(
        "ERROR quart.app: Exception on request GET /static/a\\r\\nfake INFO line\\x1b[31mred"
    )
    assert not UNSAFE.search(line) and "\n" not in line


def test_line_separators_and_bidi_overrides_are_escaped() -> None:
    line = text(record("a\u2028b\u2029c\u202ed\u2066e"))
    assert line.endswith("a\\u2028b\\u2029c\\u202ed\\u2066e")


def test_plain_text_and_unicode_pass_unchanged() -> None:
    message = "model ready: C:\\models\\voix-été 声音 (loaded in 1.2 s)"
    assert text(record(message)).endswith(f"quart.app: {message}")


def test_a_traceback_stays_multi_line_with_each_line_escaped() -> None:
    out = text(record("failed on %s", "x\x1by", exc_info=raised("bad /a\rb\x1b[2J\nFORGED")))
    lines = out.split("\n")
    assert lines[0].endswith("failed on x\\x1by")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[2].startswith('  File "') and lines[3].strip() == "raise ValueError(message)"
    # The message's own line break is escaped: no line of the traceback starts with it.
    assert lines[-1] == "ValueError: bad /a\\rb\\x1b[2J\\nFORGED"
    assert not any(UNSAFE.search(line) for line in lines)


def test_chained_exceptions_keep_their_layout_and_lose_their_line_breaks() -> None:
    try:
        try:
            raise KeyError("inner\n2026-01-01 00:00:00,000 INFO realtime: forged")
        except KeyError as exc:
            raise ValueError("outer\nforged too") from exc
    except ValueError:
        info = sys.exc_info()
    out = text(record("failed", exc_info=info))  # type: ignore[arg-type]
    lines = out.split("\n")
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines.count("Traceback (most recent call last):") == 2
    assert "KeyError: 'inner\\n2026-01-01 00:00:00,000 INFO realtime: forged'" in lines
    assert lines[-1] == "ValueError: outer\\nforged too"
    assert not any(line.startswith(("2026", "forged")) for line in lines[1:])


def test_a_long_message_is_cut_with_a_note() -> None:
    line = text(record("Exception on request GET %s", ATTACK))
    assert "\n" not in line
    message = line.partition("quart.app: ")[2]
    kept, _, note = message.rpartition(" [")
    assert kept.startswith("Exception on request GET /static/AAAAAAAAAA\\r\\n2026-01-01")
    assert len(kept) == MAX_MESSAGE_CHARS
    # The escapes (\r \n \x1b: 2, 2 and 4 characters) lengthen what is kept by 5; the
    # note counts the characters of the message that were dropped.
    full = "Exception on request GET " + ATTACK
    assert note == f"{len(full) - (MAX_MESSAGE_CHARS - 5)} more characters dropped]"


def test_a_message_at_the_bound_is_whole() -> None:
    message = "x" * MAX_MESSAGE_CHARS
    assert text(record(message)).endswith(f": {message}")


def test_a_cut_never_splits_an_escape() -> None:
    line = text(record("\x1b" * 5000))
    kept, _, note = line.partition(": ")[2].rpartition(" [")
    assert kept == "\\x1b" * (MAX_MESSAGE_CHARS // 4)
    assert note == f"{5000 - MAX_MESSAGE_CHARS // 4} more characters dropped]"


def test_a_long_traceback_line_is_cut_too() -> None:
    out = text(record("failed", exc_info=raised("\x1b[31m" + "p" * 5000)))
    last = out.split("\n")[-1]
    assert last.startswith("ValueError: \\x1b[31mppp")
    assert last.endswith(" more characters dropped]")
    assert len(last) < MAX_MESSAGE_CHARS + 40


def test_fields_are_one_token_each_and_escaped() -> None:
    line = text(
        record(
            "session ended",
            fields={
                "session_id": "sess_1",
                "close_reason": "client went away",
                "origin": "evil\x1b[31m\r\nforged",
                "empty": "",
                "late\x1bkey": None,
                "rtf": 1.23456,
            },
            name="realtime.session",
        )
    )
    assert line.endswith(
        'session ended session_id=sess_1 close_reason="client went away" '
        'origin="evil\\u001b[31m\\r\\nforged" empty="" late\\x1bkey=- rtf=1.235'
    )
    assert not UNSAFE.search(line) and "\n" not in line


def test_json_lines_escape_through_json_and_keep_the_text() -> None:
    path = "/static/a\r\nforged\x1b[31m\x7f\x9b\u2028"
    out = JsonFormatter().format(
        record("GET %s", path, exc_info=raised(path), fields={"origin": path})
    )
    assert "\n" not in out and not UNSAFE.search(out)
    assert "\\u001b" in out and "\\r\\n" in out
    data = json.loads(out)
    assert data["message"] == f"GET {path}"
    assert data["origin"] == path
    assert data["exception"].endswith(f"ValueError: {path}")


def test_json_messages_are_bounded_too() -> None:
    data = json.loads(JsonFormatter().format(record("GET %s", ATTACK)))
    full = "GET " + ATTACK
    assert data["message"] == (
        f"{full[:MAX_MESSAGE_CHARS]} [{len(full) - MAX_MESSAGE_CHARS} more characters dropped]"
    )


def test_the_text_formatter_leaves_the_record_for_other_handlers() -> None:
    rec = record("GET %s", "/a\x1b[31m", exc_info=raised("b\x1bc"))
    text(rec)
    data = json.loads(JsonFormatter().format(rec))
    assert data["message"] == "GET /a\x1b[31m"
    assert data["exception"].endswith("ValueError: b\x1bc")
    assert text(rec) == text(rec)
