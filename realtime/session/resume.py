"""The pure state of resumable conversations (docs/resume.md): the replay journal, the
registry of resume tokens, and the per-address bound on failed resumes.

No I/O and no clock of their own: every method that needs the time takes ``now``, so
the bounds are tested as plain functions. :mod:`realtime.session.link` drives them.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from collections import deque
from typing import Final, Generic, TypeVar

import attrs

TOKEN_BYTES: Final = 32
"""A resume token's randomness: 256 bits (``secrets.token_urlsafe``)."""

RESUME_FIRST_MESSAGE_SECONDS: Final = 10.0
"""How long a resume connection has to send its ``session.resume``."""

FAILURE_BURST: Final = 10
"""Failed resumes one client address may make at once before it gets HTTP 429."""
FAILURE_REFILL_SECONDS: Final = 6.0
"""One more failed resume allowed per this many seconds (ten a minute)."""
FAILURE_ADDRESSES: Final = 4096
"""Client addresses whose failures are remembered at most (bounded memory under a
flood from many addresses; the fullest buckets are forgotten first)."""


REPLICA_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A replica's name (``--replica-id``): it travels in URLs and in balancer rules, so
plain and short."""


def replica_id(text: str) -> str | None:
    """A ``--replica-id`` / ``REALTIME_REPLICA_ID`` value (empty: none); ValueError
    naming what is allowed for anything else."""
    if not text:
        return None
    if REPLICA_ID.fullmatch(text) is None:
        raise ValueError(
            "expected letters, digits, '.', '_' or '-' (at most 64, a letter or digit "
            f"first), got {text!r}"
        )
    return text


def new_token() -> str:
    """A fresh resume token (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_digest(token: str) -> bytes:
    """What the server keeps of a token: its SHA-256 (the token itself is never stored
    or logged)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def event_size(text: str) -> int:
    """An event's size in UTF-8 bytes (O(1) for the ASCII events most are)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@attrs.define(slots=True, eq=False)
class Journal:
    """The events of one session that the client has not acknowledged, numbered 1, 2,
    3, ... in the order they were written; bounded by bytes and by age.

    ``floor``: every event numbered ``floor`` or below is gone (acknowledged, or dropped
    past a bound), so a resume that needs one of them must resync.
    """

    max_bytes: int
    max_seconds: float
    sent: int = 0
    """The last number handed out."""
    floor: int = 0
    size: int = 0
    """Bytes held."""
    _events: deque[tuple[float, int, str]] = attrs.field(factory=deque)
    """``(written at, bytes, text)`` of events ``floor + 1 .. sent``."""

    def append(self, text: str, now: float) -> int:
        """Number and keep one event; its number."""
        self.sent += 1
        n = event_size(text)
        self._events.append((now, n, text))
        self.size += n
        self.trim(now)
        return self.sent

    def trim(self, now: float) -> None:
        """Drop events past the byte bound or older than the age bound."""
        events = self._events
        oldest = now - self.max_seconds
        while events and (self.size > self.max_bytes or events[0][0] < oldest):
            self.size -= events.popleft()[1]
            self.floor += 1

    def ack(self, seq: int) -> bool:
        """The client has every event up to ``seq``: drop them. False (nothing dropped)
        when ``seq`` is negative or above the last event written."""
        if seq < 0 or seq > self.sent:
            return False
        events = self._events
        while self.floor < seq:
            self.size -= events.popleft()[1]
            self.floor += 1
        return True

    def holds_after(self, last_seq: int, now: float) -> bool:
        """Whether every event after ``last_seq`` is still here (a resume can replay)."""
        self.trim(now)
        return self.floor <= last_seq <= self.sent

    def between(self, after: int, upto: int) -> list[str]:
        """Events ``after + 1 .. upto`` (all held: check :meth:`holds_after` first)."""
        start = after - self.floor
        return [self._events[i][2] for i in range(max(start, 0), upto - self.floor)]


H = TypeVar("H")


@attrs.define(slots=True, eq=False)
class Registration(Generic[H]):
    """One resumable session: who may resume it (the tenant's name, None where no key
    is asked for) and at which endpoint."""

    holder: H
    tenant: str | None
    path: str
    expires: float = math.inf
    """When the entry resumes nothing any more (an ended session's tail: its grace)."""


@attrs.define(slots=True, eq=False)
class Registry(Generic[H]):
    """Resume tokens (by SHA-256) of the sessions that may still be resumed: running
    ones, and ended ones whose last events the client may not have read (their
    tails), each until its grace ends."""

    _entries: dict[bytes, Registration[H]] = attrs.field(factory=dict)

    def add(
        self, token: str, holder: H, tenant: str | None, path: str, now: float | None = None
    ) -> bytes:
        """Register a session under ``token``; the key to :meth:`remove` it with.
        Forgets the entries expired at ``now`` (so they are bounded by the sessions
        that end within a grace)."""
        if now is not None:
            self.sweep(now)
        digest = token_digest(token)
        self._entries[digest] = Registration(holder, tenant, path)
        return digest

    def remove(self, digest: bytes) -> None:
        self._entries.pop(digest, None)

    def keep_until(self, digest: bytes, expires: float) -> None:
        """Keep an entry only until ``expires`` (an ended session's tail)."""
        entry = self._entries.get(digest)
        if entry is not None:
            entry.expires = expires

    def sweep(self, now: float) -> None:
        """Forget the entries whose time is over."""
        for digest in [d for d, entry in self._entries.items() if entry.expires <= now]:
            del self._entries[digest]

    def find(
        self, token: object, tenant: str | None, path: str, now: float | None = None
    ) -> H | None:
        """The session ``token`` resumes, if the same tenant asks at the same endpoint
        (before the entry expires, at ``now``); None for anything else (one answer for
        every failure: a guess learns nothing)."""
        if now is not None:
            self.sweep(now)
        if not isinstance(token, str) or not 0 < len(token) <= 4 * TOKEN_BYTES:
            return None
        entry = self._entries.get(token_digest(token))
        if entry is None or entry.tenant != tenant or entry.path != path:
            return None
        return entry.holder

    def holders(self, now: float | None = None) -> list[H]:
        """Every registered session (those not expired at ``now``, when given)."""
        if now is not None:
            self.sweep(now)
        return [entry.holder for entry in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)


@attrs.define(slots=True, eq=False)
class FailedResumes:
    """Failed resumes per client address, as token buckets: ``burst`` at once, one
    more every ``refill_seconds``; an address with none left is refused (HTTP 429)
    until its bucket refills."""

    burst: int = FAILURE_BURST
    refill_seconds: float = FAILURE_REFILL_SECONDS
    max_addresses: int = FAILURE_ADDRESSES
    _buckets: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    """address -> (failures allowed left, when counted)."""

    def _left(self, address: str, now: float) -> float:
        left, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), left + max(now - at, 0.0) / self.refill_seconds)

    def allowed(self, address: str, now: float) -> bool:
        """Whether ``address`` may try a resume now."""
        return self._left(address, now) >= 1.0

    def failed(self, address: str, now: float) -> None:
        """Count one failed resume from ``address``."""
        self._buckets[address] = (max(self._left(address, now) - 1.0, 0.0), now)
        if len(self._buckets) > self.max_addresses:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Forget the addresses whose buckets have refilled, else the oldest."""
        for address in [a for a in self._buckets if self._left(a, now) >= self.burst]:
            del self._buckets[address]
        while len(self._buckets) > self.max_addresses:
            del self._buckets[next(iter(self._buckets))]
