r"""Logging: the one-line-per-session record, and the text or JSON set-up.

Operators grep (text) or ship (JSON) the same records; both come from the
standard ``logging`` module, so library loggers (Hypercorn's included) share
the format. Extra fields passed with ``extra={"realtime": {...}}`` become JSON
keys and are appended as ``key=value`` in text.

Records carry client-controlled text (a request path, a header), so neither format
lets it forge a line or drive the terminal: text escapes every control character
(``\r``, ``\x1b``) and JSON escapes through ``json``; and a message is cut to
:data:`MAX_MESSAGE_CHARS`, so one request cannot write kilobytes of log.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Literal, TextIO

from realtime.observe import Observer, RefusalReason, SessionReport

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
EXTRA: Final = "realtime"
"""The ``extra`` key under which records carry their structured fields."""
MAX_MESSAGE_CHARS: Final = 2000
"""A message (and each line of a traceback, and each text field) is cut to this many
characters, with a note of how many were dropped: a log line's size is bounded
whatever a client sends."""


def _escape_of(code: int) -> str:
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    if code in named:
        return named[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_UNSAFE: Final = (
    *range(0x00, 0x20),  # C0: CR and LF forge lines, ESC starts terminal sequences
    *range(0x7F, 0xA0),  # DEL and C1 (0x9b is a one-byte CSI on some terminals)
    0x2028,  # line and paragraph separators: line breaks to many log viewers
    0x2029,
    *range(0x202A, 0x202F),  # bidirectional overrides: reorder what a reader sees
    *range(0x2066, 0x206A),
)
_ESCAPES: Final[dict[int, str]] = {code: _escape_of(code) for code in _UNSAFE}


def escape_controls(text: str) -> str:
    r"""``text`` with every control character written as an escape (``\r``, ``\x1b``),
    so it prints as one inert line."""
    return text.translate(_ESCAPES)


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS, *, escape: bool = True) -> str:
    """``text`` escaped (unless ``escape`` is false) and cut to ``limit`` characters, plus
    a note of how many of its characters were dropped. An escape is never cut in two."""
    kept = text[:limit]
    out = kept.translate(_ESCAPES) if escape else kept
    if len(out) > limit:  # the escapes made it longer: keep the characters that fit
        size = 0
        fits = 0
        for char in kept:
            size += len(_ESCAPES.get(ord(char), char))
            if size > limit:
                break
            fits += 1
        kept = kept[:fits]
        out = kept.translate(_ESCAPES)
    dropped = len(text) - len(kept)
    return f"{out} [{dropped} more characters dropped]" if dropped else out


def _bounded_lines(text: str, *, escape: bool = True) -> str:
    """A multi-line text (a traceback) with each line escaped and bounded on its own."""
    return "\n".join(bounded(line, escape=escape) for line in text.split("\n"))


session_log = logging.getLogger("realtime.session")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
            + f".{int(record.msecs):03d}"
            + _utc_offset(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": bounded(record.getMessage(), escape=False),
        }
        fields = getattr(record, EXTRA, None)
        if isinstance(fields, Mapping):
            out.update(fields)
        if record.exc_info:
            out["exception"] = _bounded_lines(self.formatException(record.exc_info), escape=False)
        if record.stack_info:
            out["stack"] = _bounded_lines(self.formatStack(record.stack_info), escape=False)
        # ensure_ascii (the default) writes every control and non-ASCII character as
        # \uXXXX: the line stays one line, whatever the record holds.
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """The human-readable default, with a record's fields appended as ``key=value``.

    The first line is the record's only line unless it has a traceback; every control
    character in it, and in each traceback line, is escaped, and each is bounded
    (:func:`bounded`), so client-controlled text cannot forge lines or colour the
    terminal.
    """

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = bounded(record.getMessage())
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = escape_controls(self.formatMessage(record))
        fields = getattr(record, EXTRA, None)
        if isinstance(fields, Mapping) and fields:
            pairs = " ".join(
                f"{escape_controls(str(k))}={_text_value(v)}" for k, v in fields.items()
            )
            text = f"{text} {pairs}"
        # Not cached on the record (as logging.Formatter does): other handlers keep
        # Python's own traceback text.
        exc_text = self.formatException(record.exc_info) if record.exc_info else record.exc_text
        if exc_text:
            text = f"{text}\n{_bounded_lines(exc_text)}"
        if record.stack_info:
            text = f"{text}\n{_bounded_lines(self.formatStack(record.stack_info))}"
        return text

    def formatException(self, ei: ExcInfo) -> str:
        """Python's traceback, with the line breaks inside an exception's message
        escaped: they come from its text (a client's path, say), not from the
        traceback's layout, and would start a line that looks like a record of its own.
        (An exception group's lines all carry its ``|`` margin, so none can.)"""
        _, value, tb = ei
        if value is None:
            return super().formatException(ei)
        finals = _message_chunks(value)
        chunks = traceback.format_exception(type(value), value, tb)
        text = "".join(_one_line(chunk) if chunk in finals else chunk for chunk in chunks)
        return text.removesuffix("\n")


def _message_chunks(exc: BaseException) -> set[str]:
    """What ``traceback`` writes for the message of ``exc`` and of every exception
    chained to it (each text ends with its one legitimate line break)."""
    found: set[str] = set()
    seen: set[int] = set()
    pending = [exc]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        found.update(traceback.format_exception_only(type(item), item))
        pending.extend(e for e in (item.__cause__, item.__context__) if e is not None)
        if isinstance(item, BaseExceptionGroup):
            pending.extend(item.exceptions)
    return found


def _one_line(chunk: str) -> str:
    body, end = (chunk[:-1], "\n") if chunk.endswith("\n") else (chunk, "")
    return body.replace("\n", "\\n") + end


def _text_value(value: object) -> str:
    """A field's value as one token: quoted (a JSON string, its controls escaped) when
    it holds a space or a control character or is empty."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = bounded(str(value), escape=False)
    plain = bool(text) and " " not in text and escape_controls(text) == text
    return text if plain else json.dumps(text)


def _utc_offset(record: logging.LogRecord) -> str:
    import time

    offset = time.strftime("%z", time.localtime(record.created))
    return offset[:3] + ":" + offset[3:] if len(offset) == 5 else offset


def setup_logging(
    level: str = "info", fmt: LogFormat = "text", stream: TextIO | None = None
) -> None:
    """Configure the root logger once for the process (replacing earlier handlers)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


class SessionLog(Observer):
    """One INFO line per finished session, and one per refused connection.

    Never logs key material: a refusal names only its reason.
    """

    def session_ended(self, report: SessionReport) -> None:
        steps = sorted(report.step_seconds)
        fields = {
            "session_id": report.session_id,
            "outcome": report.outcome,
            "duration_s": round(report.duration, 3),
            "frames": report.frames,
            "audio_s": round(report.audio_seconds, 2),
            "realtime_factor": _round(report.realtime_factor, 3),
            "step_p50_ms": _round(_ms(_percentile(steps, 0.50)), 2),
            "step_p95_ms": _round(_ms(_percentile(steps, 0.95)), 2),
            "latency_p95_ms": _round(_ms(_percentile(sorted(report.frame_latency), 0.95)), 1),
            "sessions": report.sessions,
            "close_code": report.close_code,
            "close_reason": report.close_reason,
        }
        if report.tenant is not None:
            fields["tenant"] = report.tenant
        session_log.info("session ended", extra={EXTRA: fields})

    def session_resumed(self, session_id: str, seconds: float, replayed: int) -> None:
        fields = {
            "session_id": session_id,
            "outcome": "resumed",
            "resume_ms": round(1000 * seconds, 1),
            "replayed": replayed,
        }
        session_log.info("session resumed", extra={EXTRA: fields})

    def connection_refused(self, reason: RefusalReason, tenant: str | None = None) -> None:
        fields = {"reason": reason} if tenant is None else {"reason": reason, "tenant": tenant}
        session_log.info("connection refused", extra={EXTRA: fields})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
