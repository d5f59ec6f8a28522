"""Logging: the one-line-per-session record, and the text or JSON set-up.

Operators grep (text) or ship (JSON) the same records; both come from the
standard ``logging`` module, so library loggers (Hypercorn's included) share
the format. Extra fields passed with ``extra={"realtime": {...}}`` become JSON
keys and are appended as ``key=value`` in text.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
from collections.abc import Mapping
from typing import Any, Final, Literal, TextIO

from realtime.observe import Observer, RefusalReason, SessionReport

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
EXTRA: Final = "realtime"
"""The ``extra`` key under which records carry their structured fields."""

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
            "message": record.getMessage(),
        }
        fields = getattr(record, EXTRA, None)
        if isinstance(fields, Mapping):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """The human-readable default, with a record's fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, EXTRA, None)
        if isinstance(fields, Mapping) and fields:
            head, sep, tail = text.partition("\n")
            pairs = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
            text = f"{head} {pairs}{sep}{tail}"
        return text


def _text_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


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
            "close_code": report.close_code,
            "close_reason": report.close_reason,
        }
        session_log.info("session ended", extra={EXTRA: fields})

    def connection_refused(self, reason: RefusalReason) -> None:
        session_log.info("connection refused", extra={EXTRA: {"reason": reason}})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
