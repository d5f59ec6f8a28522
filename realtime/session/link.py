"""A resumable session's transport: the session talks to a :class:`Link`, which talks
to whichever WebSocket is attached now (docs/resume.md).

The session keeps running in the handler of the connection that opened it, also
while no socket is attached (Hypercorn does not cancel an ASGI handler when its
socket drops: it hands it ``websocket.disconnect`` and waits for it to return). A
resume connection's handler attaches its socket to the link and waits until it is
let go again; the session's receiver reads from it, its sender writes to it.

Every event written goes to the journal (numbered, kept until acknowledged) and to
the attached socket if there is one. While detached the session's timeline pauses:
:meth:`Link.now` stops, so the rules see the time minus the paused seconds, and the
pipeline's timer waits for a socket (:meth:`Link.wait_attached`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio

from realtime.session.close_codes import CLOSE_GOING_AWAY, CLOSE_NORMAL
from realtime.session.lifetime import Transport, TransportClosed
from realtime.session.resume import Journal, Registry, new_token

log = logging.getLogger("realtime.session.link")

CLOSE_REPLACED: Final = 4000
"""The close code of a connection whose session was resumed on another one."""

RESUME_TYPES: Final = ("session.event_ack", "session.resume")
"""The link's own client messages: never counted, never seen by the rules."""
LINK_MESSAGE_CHARS: Final = 1024
"""The link looks only at messages this short (an ack or a ``session.resume`` is well
under it): anything longer goes to the rules, whose parser bounds what a client sends."""

TAIL_CLOSE_SECONDS: Final = 10.0
"""How long a closed connection of a resumable session may take to answer the close
frame (after a resumed tail's replay: then it is aborted, and the tail waits for
another resume)."""

ErrorText = Callable[[str, str], str]
"""``(code, message) -> serialized error event`` in the endpoint's own error shape."""


@attrs.frozen(slots=True)
class Offer:
    """What a resumable session is registered with: where its token is kept, whose
    it is, at which endpoint, and what ``session.resumable`` announces."""

    registry: Registry[Link]
    tenant: str | None
    path: str
    replica: str | None
    grace: float


@attrs.define(slots=True, eq=False)
class Attachment:
    """One socket's time on the link: ``released`` is set when it is let go (dropped,
    replaced by a resume, or the session over); ``replaced``: by a resume."""

    socket: Transport
    released: trio.Event = attrs.field(factory=trio.Event)
    replaced: bool = False
    stuck: bool = False
    """A write to it was under way when it was let go: a half-open socket whose writes
    block takes no ``session_replaced`` either, so it is aborted at once (the session's
    sender, held in that write, goes on as soon as it fails)."""


@attrs.frozen(slots=True)
class Resumed:
    """A resume that succeeded: the opening connection's attachment when the resume
    replaced it (its handler runs the session, so the resume's handler tells it why it
    ends; a resume connection's own handler does that itself), and the new socket's
    attachment."""

    replaced_opener: Attachment | None
    attachment: Attachment
    replayed: int


class Link:
    """Stands in as one resumable session's :class:`~realtime.session.lifetime.Transport`."""

    def __init__(self, socket: Transport, journal: Journal, offer: Offer, error: ErrorText) -> None:
        self.socket: Transport | None = socket
        self._opener = socket
        self._current: Attachment | None = Attachment(socket)
        self.journal = journal
        self.terms = offer
        self.error = error
        self.session_id = ""
        self.received = 0
        """Client messages taken (acks and ``session.resume`` excluded)."""
        self.paused = 0.0
        """Seconds the session spent detached, before the current detachment."""
        self.detached_at: float | None = None
        """Trio time the current detachment began (None: attached)."""
        self.deadline = math.inf
        """Trio time the current detachment's grace ends."""
        self.ended = False
        self.expired = False
        self.notify: Callable[[str], None] = lambda text: None
        """Hands a link message (an ``error`` for a bad ack) to the session's sender
        (set by the session's lifetime), so it goes out in order with the events."""
        self._changed = trio.Event()
        """Set (and renewed) whenever a socket is attached, the grace changes or the
        session ends: what a detached receiver and timer wait on."""
        self._receiving: trio.CancelScope | None = None
        self._writing_to: Transport | None = None
        """The socket a write is under way to (None: none)."""
        self._resuming = trio.Lock()
        self._digest: bytes | None = None
        self.closing: tuple[int, str] | None = None
        """The server's close of the session (code, reason), once it decided one: a
        resumed tail ends with it again."""
        self.settled = False
        """The client has the session's end: its close frame answered the server's."""
        self._answered = trio.Event()
        """Set once the socket the server closed has answered or dropped."""
        self.tail_until = -math.inf
        """Trio time an ended session's unread tail stops being resumable."""

    # --- the clock ------------------------------------------------------------------

    def now(self) -> float:
        """The session's clock: trio time less the seconds spent detached; it stands
        still while detached."""
        at = self.detached_at
        return (trio.current_time() if at is None else at) - self.paused

    def real_time(self, at: float) -> float:
        """A time of the session's clock as trio time (for a timer's wait)."""
        return at + self.paused

    async def wait_attached(self) -> None:
        """Return once a socket is attached (at once when one is)."""
        while self.socket is None and not self.ended:
            await self._changed.wait()

    @property
    def detached(self) -> bool:
        return self.socket is None and not self.ended

    # --- the transport --------------------------------------------------------------

    async def send(self, text: str) -> None:
        self.journal.append(text, trio.current_time())
        socket = self.socket
        if socket is not None:
            self._writing_to = socket
            try:
                await socket.send(text)
            finally:
                self._writing_to = None

    async def send_notice(self, text: str) -> None:
        """A link message: to the attached socket only, neither numbered nor kept."""
        socket = self.socket
        if socket is not None:
            await socket.send(text)

    async def close(self, code: int, reason: str) -> None:
        """Close the attached socket, and wait for the client's close frame (or the
        drop) that says whether it read every event before it: the session's end is
        final only then (:meth:`end`). Bounded by the caller (the lifetime aborts a
        connection whose close has not gone through in time, which answers it)."""
        self.closing = (code, reason)
        socket = self.socket
        if socket is None:
            return
        if self._digest is None or code == CLOSE_GOING_AWAY or not self.received:
            await socket.close(code, reason)  # no tail could be kept: a plain close
            return
        if self._receiving is not None:
            self._receiving.cancel()  # the receiver parks; what is left is read here
        await socket.close(code, reason)
        with trio.move_on_after(TAIL_CLOSE_SECONDS):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain, socket)
                await self._answered.wait()
                nursery.cancel_scope.cancel()

    async def _drain(self, socket: Transport) -> None:
        self._heard(await self._close_answer(socket))

    def _heard(self, answered: bool) -> None:
        if answered:
            self.settled = True
        self._answered.set()

    async def _close_answer(self, socket: Transport) -> bool:
        """Read a closed socket to its end: True when the client's close frame came
        (it read everything before the server's), False when it dropped. Acks count;
        everything else is too late for the session and dropped."""
        while True:
            try:
                frame = await socket.receive()
            except TransportClosed as closed:
                return closed.code is not None
            if isinstance(frame, str) and len(frame) <= LINK_MESSAGE_CHARS:
                self._link_message(frame)

    def abort(self) -> bool:
        abort: Callable[[], object] | None = getattr(self.socket, "abort", None)
        return bool(abort()) if abort is not None else False

    async def receive(self) -> str | bytes | None:
        while True:
            if self.closing is not None:
                await trio.sleep_forever()  # the close reads the rest (``close``)
            socket = self.socket
            if socket is None:
                await self._wait_or_expire()
                continue
            with trio.CancelScope() as scope:
                self._receiving = scope
                try:
                    frame = await socket.receive()
                except TransportClosed as closed:
                    if socket is not self.socket:
                        continue  # replaced meanwhile: read the new one
                    if self.closing is not None:
                        self._heard(closed.code is not None)
                        continue
                    if closed.code == CLOSE_NORMAL or not self.received:
                        # The client hung up, or left before saying anything (it may
                        # never have read the token): no grace, the slot is freed.
                        raise
                    self._let_go(trio.current_time())
                    log.info("session %s: connection lost; waiting for a resume", self.session_id)
                    continue
                finally:
                    self._receiving = None
            if scope.cancelled_caught:
                continue  # another socket was attached: read that one
            if (
                isinstance(frame, str)
                and len(frame) <= LINK_MESSAGE_CHARS
                and '"session.' in frame
                and self._link_message(frame)
            ):
                continue
            self.received += 1
            return frame

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_or_expire(self) -> None:
        with trio.move_on_at(self.deadline):
            await self._changed.wait()
        if self.socket is None and trio.current_time() >= self.deadline:
            self.expired = True
            raise TransportClosed(None, outcome="resume_expired")

    def _link_message(self, frame: str) -> bool:
        """An ack or a stray ``session.resume`` (handled here: True), or a message for
        the rules (False)."""
        try:
            message: Any = json.loads(frame)
        except (ValueError, RecursionError):
            return False
        kind = message.get("type") if isinstance(message, dict) else None
        if kind not in RESUME_TYPES:
            return False
        if kind == "session.resume":
            self.notify(
                self.error(
                    "resume_failed",
                    "session.resume is only the first message of a resume connection "
                    "(?resume=1); this connection already carries the session",
                )
            )
            return True
        seq = message.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or not self.journal.ack(seq):
            self.notify(
                self.error(
                    "invalid_ack",
                    "session.event_ack needs 'seq': an integer from 0 to the last event "
                    f"sent ({self.journal.sent}), got {seq!r}",
                )
            )
        return True

    def _let_go(self, now: float, *, replaced: bool = False) -> None:
        """The attached socket is gone or replaced: detach (the timeline pauses)."""
        self.socket = None
        current, self._current = self._current, None
        if current is not None:
            current.replaced = replaced
            current.stuck = self._writing_to is current.socket
            current.released.set()
        if self._receiving is not None:
            self._receiving.cancel()
        if self.ended or self.detached_at is not None:
            return
        self.detached_at = now
        self.deadline = now + self.terms.grace

    def release(self, socket: Transport) -> None:
        """``socket``'s handler is ending: detach it if it is still the attached one."""
        if self.socket is socket:
            self._let_go(trio.current_time())

    # --- offer, resume, end ----------------------------------------------------------

    async def offer(self) -> None:
        """Register a fresh token and announce it (right after the greeting)."""
        offer = self.terms
        token = new_token()
        self._digest = offer.registry.add(
            token, self, offer.tenant, offer.path, trio.current_time()
        )
        journal = self.journal
        notice = {
            "type": "session.resumable",
            "token": token,
            "replica": offer.replica,
            "grace_seconds": float(offer.grace),
            "journal_max_bytes": journal.max_bytes,
            "journal_max_seconds": float(journal.max_seconds),
        }
        await self.send_notice(json.dumps(notice, separators=(",", ":")))

    def end(self) -> None:
        """The session is over (idempotent). Its token resumes nothing any more, unless
        the server closed it and the client may not have read the last events: then
        they stay resumable for the grace (the tail; the slot is freed as always)."""
        first, self.ended = not self.ended, True
        if self._digest is not None and first and self._unread_tail():
            self.tail_until = trio.current_time() + self.terms.grace
            self.terms.registry.keep_until(self._digest, self.tail_until)
            log.info(
                "session %s: ended before its client read the end; its last events wait "
                "for a resume",
                self.session_id,
            )
        elif self._digest is not None and self.tail_until == -math.inf:
            self.terms.registry.remove(self._digest)
            self._digest = None
        current, self._current = self._current, None
        if current is not None:
            current.released.set()
        self._wake()

    def _unread_tail(self) -> bool:
        """Whether the session's end may not have reached the client: the server
        closed it (not for shutdown), the client neither answered the close frame nor
        acknowledged every event, and it had said something (so read the token)."""
        return (
            self.closing is not None
            and self.closing[0] != CLOSE_GOING_AWAY
            and not self.settled
            and not self.expired
            and self.received > 0
            and self.journal.floor < self.journal.sent
        )

    async def resume(self, socket: Transport, last_seq: int) -> Resumed | str:
        """Attach ``socket`` after ``session.resumed`` and the replay (an ended
        session's tail: replay it, then close again); the error code
        (``resume_failed``, ``resync_required``) when it cannot."""
        async with self._resuming:
            now = trio.current_time()
            if self.ended:
                if self._digest is None or now >= self.tail_until:
                    return "resume_failed"
                return await self._resume_tail(socket, last_seq, now)
            if now >= self.deadline:
                return "resume_failed"
            if not self.journal.holds_after(last_seq, now):
                return "resync_required"
            replaced = self._current
            if replaced is not None:
                self._let_go(now, replaced=True)
            deadline, self.deadline = self.deadline, math.inf  # no expiry while replaying
            try:
                replayed = await self._replay(socket, last_seq)
                if replayed is None:
                    return "resync_required"
                if self.ended or self.closing is not None:
                    # It was closed while detached (or while replaying): that was its tail.
                    return await self._close_tail(socket, replayed)
                # No await from the replay's last check to here: no event slips between.
                self.socket = socket
                attachment = self._current = Attachment(socket)
                if self.detached_at is not None:
                    self.paused += trio.current_time() - self.detached_at
                self.detached_at = None
                self._wake()
                opener = replaced if replaced and replaced.socket is self._opener else None
                return Resumed(opener, attachment, replayed)
            finally:
                if self.socket is not socket:  # failed or cancelled: the grace goes on
                    self.deadline = deadline
                    self._wake()

    async def _resume_tail(self, socket: Transport, last_seq: int, now: float) -> Resumed | str:
        """The events of an ended session after ``last_seq``, then its own close; once
        the client answers that close the tail is done (its token resumes nothing)."""
        if not self.journal.holds_after(last_seq, now):
            return "resync_required"
        replayed = await self._replay(socket, last_seq)
        if replayed is None:
            return "resync_required"
        return await self._close_tail(socket, replayed)

    async def _close_tail(self, socket: Transport, replayed: int) -> Resumed:
        """After an ended session's replay: its own close again; once the client
        answers it, the session's token resumes nothing any more."""
        code, reason = self.closing or (CLOSE_NORMAL, "")
        answered = False
        with trio.move_on_after(TAIL_CLOSE_SECONDS):
            try:
                await socket.close(code, reason)
            except TransportClosed:
                pass
            else:
                answered = await self._close_answer(socket)
        if answered and self._digest is not None:
            self.settled = True
            self.terms.registry.remove(self._digest)
            self._digest = None
        elif not answered:
            abort: Callable[[], object] | None = getattr(socket, "abort", None)
            if abort is not None:
                abort()
        attachment = Attachment(socket)
        attachment.released.set()
        return Resumed(None, attachment, replayed)

    async def _replay(self, socket: Transport, last_seq: int) -> int | None:
        """``session.resumed`` and the journal after ``last_seq`` to ``socket``, with the
        events written meanwhile; how many were replayed (None: the journal lost one)."""
        journal = self.journal
        upto = journal.sent
        replayed = upto - last_seq
        resumed = {
            "type": "session.resumed",
            "session_id": self.session_id,
            "last_seq": last_seq,
            "next_seq": upto + 1,
            "replayed": replayed,
            "received": self.received,
        }
        await socket.send(json.dumps(resumed, separators=(",", ":")))
        done = last_seq
        # Events written while replaying are numbered after ``upto``: they follow.
        while done < journal.sent:
            if not journal.holds_after(done, trio.current_time()):
                return None
            upto = journal.sent
            for text in journal.between(done, upto):
                await socket.send(text)
            done = upto
        return replayed
