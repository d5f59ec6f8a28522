"""The client's half of resumable sessions, as rules with no I/O: what the server
offered (``session.resumable``), how the client counts the server's events and when
it acknowledges them, the bounded record of what it sent (re-sent after
``session.resumed`` from the server's ``received``), the reconnect backoff, and the
URLs. :class:`realtime.client.RealtimeClient` drives them over its sockets; the
protocol is docs/client.md's "Resuming after a dropped connection".
"""

from __future__ import annotations

import json
import math
import urllib.parse
from collections import deque
from typing import Any, Final

import attrs

ACK_EVERY_EVENTS: Final = 64
"""Acknowledge at least every this many events..."""
ACK_EVERY_SECONDS: Final = 1.0
"""...and at least this often while events arrive."""

OUTBOX_MAX_BYTES: Final = 8 * 1024 * 1024
"""What the client keeps of what it sent, at most (the server journal's default)."""
OUTBOX_MAX_SECONDS: Final = 60.0
"""...and for at most this long."""

BACKOFF_FIRST: Final = 0.25
BACKOFF_MAX: Final = 4.0
RESUME_ANSWER_SECONDS: Final = 10.0
"""How long a resume attempt waits for ``session.resumed`` (the server waits as long
for ``session.resume``)."""

LINK_EVENT_TYPES: Final = frozenset({"session.resumable", "session.resumed"})
"""Events about the connection, not the session: never numbered, never shown."""
LINK_ERROR_CODES: Final = frozenset({"invalid_ack", "resume_failed", "resync_required"})
"""Error codes that answer the resume machinery itself (not numbered)."""

CLOSE_NO_FRAME: Final = 1006
"""What a WebSocket library reports when the TCP connection ended with no close frame:
the only ending a client resumes from (any close frame is the server's last word)."""


@attrs.frozen(slots=True)
class ResumeOffer:
    """``session.resumable``: what a later resume needs (the token never leaves
    this process except in ``session.resume``)."""

    token: str = attrs.field(repr=False)
    replica: str | None
    grace_seconds: float

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> ResumeOffer | None:
        """The offer in ``raw``, or None when it is not one a client can use."""
        token, replica, grace = raw.get("token"), raw.get("replica"), raw.get("grace_seconds")
        if not isinstance(token, str) or not token:
            return None
        if replica is not None and (not isinstance(replica, str) or not replica):
            return None
        if isinstance(grace, bool) or not isinstance(grace, (int, float)):
            return None
        if not (math.isfinite(grace) and grace > 0):
            return None
        return cls(token, replica, float(grace))


class EventCounter:
    """Numbers the server's events as the server does (1, 2, ...) and says when to
    acknowledge: on every :data:`ACK_EVERY_EVENTS` events, or once
    :data:`ACK_EVERY_SECONDS` have passed since the last ack."""

    def __init__(self, now: float) -> None:
        self.seq = 0
        """The highest event number received."""
        self.acked = 0
        self._acked_at = now

    def received(self, now: float) -> int | None:
        """Count one event; the number to acknowledge now, or None."""
        self.seq += 1
        if self.seq - self.acked >= ACK_EVERY_EVENTS or now - self._acked_at >= ACK_EVERY_SECONDS:
            self.acked = self.seq
            self._acked_at = now
            return self.seq
        return None


class InputLost(Exception):
    """The server needs a message the outbox no longer holds."""


class Outbox:
    """The messages this client sent, numbered 1, 2, ... as the server counts them
    (acks and ``session.resume`` are not), kept within a byte and an age bound so
    that after ``session.resumed`` the ones the server never took are sent again."""

    def __init__(
        self, max_bytes: int = OUTBOX_MAX_BYTES, max_seconds: float = OUTBOX_MAX_SECONDS
    ) -> None:
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.count = 0
        """Messages sent so far (the number of the last one)."""
        self._kept: deque[tuple[int, float, str | bytes]] = deque()
        self._bytes = 0
        self.dropped = 0
        """The highest number no longer kept (0: none dropped)."""

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def add(self, message: str | bytes, now: float) -> int:
        """Record one sent message; its number."""
        self.count += 1
        self._kept.append((self.count, now, message))
        self._bytes += len(message)
        while self._kept and (
            self._bytes > self.max_bytes or now - self._kept[0][1] > self.max_seconds
        ):
            number, _, old = self._kept.popleft()
            self._bytes -= len(old)
            self.dropped = number
        return self.count

    def confirm(self, received: int) -> None:
        """The server has taken messages 1 .. ``received`` (``session.resumed``): forget
        them. :class:`InputLost` when it needs one that was dropped, or claims more
        than was sent."""
        if received > self.count or received < 0:
            raise InputLost(f"the server says it took {received} messages; {self.count} were sent")
        if received < self.dropped:
            raise InputLost(
                f"the server took {received} messages; the client kept only those after "
                f"{self.dropped} (past {self.max_bytes} bytes or {self.max_seconds:g} s)"
            )
        while self._kept and self._kept[0][0] <= received:
            _, _, old = self._kept.popleft()
            self._bytes -= len(old)
        self.dropped = max(self.dropped, received)

    def since(self, number: int) -> list[tuple[int, str | bytes]]:
        """The kept messages after ``number``, with their numbers (nothing forgotten)."""
        return [(n, message) for n, _, message in self._kept if n > number]


def backoff(attempt: int) -> float:
    """Seconds before reconnect ``attempt`` (0-based): 0 for the first (a blip), then
    0.25, 0.5, 1, 2, 4, 4 ... seconds."""
    if attempt <= 0:
        return 0.0
    return float(min(BACKOFF_FIRST * 2.0 ** (attempt - 1), BACKOFF_MAX))


def with_query(url: str, drop: tuple[str, ...] = (), **params: str) -> str:
    """``url`` with ``params`` set in its query and the names in ``drop`` removed (the
    rest of the query, such as ``model=``, kept in order)."""
    parts = urllib.parse.urlsplit(url)
    names = set(drop) | set(params)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    query = [(k, v) for k, v in query if k not in names] + list(params.items())
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def resumable_url(url: str) -> str:
    """The URL that asks for a resumable session."""
    return with_query(url, resumable="1")


def resume_url(url: str, replica: str | None) -> str:
    """The URL a resume opens: the same path, ``resume=1`` and the replica that holds
    the session (when the offer named one), without ``resumable``."""
    extra = {"replica": replica} if replica is not None else {}
    return with_query(url, drop=("resumable", "resume", "replica"), resume="1", **extra)


def resume_message(offer: ResumeOffer, last_seq: int) -> str:
    return json.dumps(
        {"type": "session.resume", "token": offer.token, "last_seq": last_seq},
        separators=(",", ":"),
    )


def ack_message(seq: int) -> str:
    return json.dumps({"type": "session.event_ack", "seq": seq}, separators=(",", ":"))


@attrs.frozen(slots=True)
class Resumed:
    """``session.resumed``: the events to expect (``replayed`` of them first) and how
    many client messages the server had taken (``received``)."""

    last_seq: int
    next_seq: int
    replayed: int
    received: int

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Resumed | None:
        values = [raw.get(k) for k in ("last_seq", "next_seq", "replayed", "received")]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
            return None
        return cls(*values)  # type: ignore[arg-type]
