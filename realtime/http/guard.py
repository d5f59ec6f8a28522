"""Every TCP connection served under a guard, and Hypercorn's races closed where they start.

Hypercorn's trio worker runs one ``TCPServer`` per accepted connection in the
handler nursery of ``trio.serve_listeners``. An exception that escapes one of
them (h11's ``LocalProtocolError``, trio's ``BusyResourceError``, any bug) cancels
that nursery and ends the whole server, every other conversation with it
(pgjones/hypercorn#225; the guard proposed upstream in #228 was reverted). This
module is the narrowest point that covers Hypercorn's own reader task:

- :class:`GuardedTCPServer` replaces Hypercorn's ``TCPServer``. Whatever one
  connection raises is logged as one line (the connection's id and the exception's
  type), counted (``realtime_connection_errors_total{where="server"}``) and ends that
  connection only. It also keeps the table of open connections
  (:class:`ConnectionTable`): a bound on them (HTTP 503 past it, so descriptors
  never run out under a live session), a bound on every socket write (a client
  that reads nothing is dropped, plain HTTP included), and a bound on shutdown
  (connections still writing are aborted).
- Its ``_close`` sends the EOF under the send lock: Hypercorn's takes none, so a
  write started while ``send_eof`` sat in its checkpoint raised
  ``BusyResourceError`` in the reader task (a refused client closing fast).
- :class:`GuardedWSStream` replaces Hypercorn's ``WSStream``: data that arrives
  before the app has answered the upgrade no longer races the app's own answer
  (pgjones/hypercorn#225, the part its partial fix 81bbb32 left: the stream's 400
  and the app's 101/401 on one h11 connection), permessage-deflate is declined
  (wsproto inflates without a bound), a frame that breaks the protocol gets its
  close code (1002, 1007) before the TCP connection ends, and a message over the
  size bound ends the connection after its 1009 instead of buffering what follows.

:func:`install` puts both classes in place, for ``realtime serve`` and for
``hypercorn -k trio realtime.launch.asgi:app`` alike (it runs when the app is created);
docs/reliability.md lists each adaptation with its upstream issue.
"""

from __future__ import annotations

import itertools
import logging
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final

import attrs
import trio
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol import h2 as hypercorn_h2
from hypercorn.protocol import h11 as hypercorn_h11
from hypercorn.protocol.events import Body, Data, StreamClosed
from hypercorn.protocol.ws_stream import (
    ASGIWebsocketState,
    FrameTooLargeError,
    WebsocketBuffer,
    WSStream,
)
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection

from realtime.observe import Observer

log = logging.getLogger(__name__)

DESCRIPTORS_PER_CONNECTION: Final = 3
"""What one connection may hold: its TCP socket, and for a session the socket pair
the engine wakes its collector through (``engine.Waker``)."""
RESERVED_DESCRIPTORS: Final = 64
"""Kept free beyond the connections' share: model files, logs, the listening socket,
trio's own wake-up pipe, a subprocess now and then."""
_BUSY_BODY: Final = (
    b'{"error": {"code": "connection_limit", '
    b'"message": "too many open connections on this server; retry shortly"}}\n'
)
BUSY_RESPONSE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: application/json\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n"
    b"content-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)
"""What a connection past the bound gets, before the upgrade or any request is read."""
REFUSAL_SECONDS: Final = 0.2
"""How long refusing one connection may take (reading its request, writing the 503)."""
LOG_BURST: Final = 5
LOG_WINDOW_SECONDS: Final = 10.0
"""At most ``LOG_BURST`` lines of one kind per window; the rest are counted and said
in the next line, so a flood of bad connections cannot flood the log."""

_ids = itertools.count(1)


def descriptor_limit() -> int:
    """This process's soft limit on open descriptors."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def open_descriptors() -> int:
    """How many descriptors are open now (``/dev/fd`` on macOS and Linux)."""
    for folder in ("/dev/fd", "/proc/self/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def connection_bound(limit: int, in_use: int) -> int:
    """How many connections may be open at once with ``limit`` descriptors of which
    ``in_use`` are already taken (a pure rule; at least 8)."""
    return max(8, (limit - in_use - RESERVED_DESCRIPTORS) // DESCRIPTORS_PER_CONNECTION)


@attrs.define(slots=True)
class LogBudget:
    """A rate limit for one kind of log line (``LOG_BURST`` per ``LOG_WINDOW_SECONDS``)."""

    window_start: float = -1e18
    lines: int = 0
    suppressed: int = 0

    def take(self, now: float) -> int | None:
        """None: stay quiet (counted); else log now, saying how many were left out."""
        if now - self.window_start >= LOG_WINDOW_SECONDS:
            self.window_start, self.lines = now, 0
        if self.lines >= LOG_BURST:
            self.suppressed += 1
            return None
        self.lines += 1
        left_out, self.suppressed = self.suppressed, 0
        return left_out


@attrs.define(slots=True, eq=False)
class ConnectionTable:
    """The open TCP connections of one server, whatever they carry.

    ``http_write_seconds``: a write to a plain HTTP client that makes no progress for
    this long drops it. ``websocket_write_seconds``: the same for a WebSocket, a
    backstop only (the session's own stalled-reader clock acts first). ``shutdown_seconds``:
    once the server stops accepting, connections still open this long are aborted.
    """

    bound: int
    http_write_seconds: float
    websocket_write_seconds: float
    shutdown_seconds: float
    observer: Observer = attrs.field(factory=Observer)
    open: set[GuardedTCPServer] = attrs.field(factory=set)
    refusing: int = 0
    stopping: Callable[[], object] | None = None
    """Called when the ASGI server stops accepting (each connection's watch calls it;
    the app's sessions then close 1001): the one signal an app under an external
    server gets before that server's graceful timeout cancels its connections."""
    _budgets: dict[str, LogBudget] = attrs.field(factory=dict)

    @classmethod
    def for_process(
        cls,
        *,
        send_timeout: float,
        shutdown_timeout: float,
        bound: int | None = None,
        observer: Observer | None = None,
    ) -> ConnectionTable:
        """A table sized from this process's descriptor limit (``bound``: fixed)."""
        if bound is None or bound <= 0:
            bound = connection_bound(descriptor_limit(), open_descriptors())
        return cls(
            bound=bound,
            http_write_seconds=send_timeout,
            websocket_write_seconds=3 * send_timeout,
            shutdown_seconds=shutdown_timeout,
            observer=observer if observer is not None else Observer(),
        )

    def admit(self, connection: GuardedTCPServer) -> bool:
        if len(self.open) >= self.bound:
            return False
        self.open.add(connection)
        return True

    def abort(self, local: Sequence[Any] | None, peer: Sequence[Any] | None) -> bool:
        """Reset the open connection from ``local`` to ``peer`` (an ASGI scope's
        ``server`` and ``client``); whether it was found. A WebSocket whose shielded
        write will never finish ends this way (:meth:`GuardedTCPServer.abort`)."""
        for connection in list(self.open):
            if connection.joins(local, peer):
                return connection.abort()
        return False

    def note(self, kind: str, message: str, *args: object) -> None:
        """Log one rate-limited warning line of ``kind``."""
        budget = self._budgets.setdefault(kind, LogBudget())
        left_out = budget.take(trio.current_time())
        if left_out is None:
            return
        if left_out:
            message += " (%d more like it not logged)"
            args = (*args, left_out)
        log.warning(message, *args)


def table_of(app: Any) -> ConnectionTable | None:
    """The table an ASGI app keeps (``connection_table``), looking through Hypercorn's
    wrapper (``ASGIWrapper.app``); None for an app that keeps none."""
    for candidate in (app, getattr(app, "app", None)):
        table = getattr(candidate, "connection_table", None)
        if isinstance(table, ConnectionTable):
            return table
    return None


def split_errors(error: BaseException) -> tuple[list[Exception], BaseException | None]:
    """Split what a connection raised into errors (to log and swallow) and the rest
    (cancellation, KeyboardInterrupt, SystemExit: to re-raise)."""
    if isinstance(error, BaseExceptionGroup):
        matched, rest = error.split(Exception)
        return list(_leaves(matched)) if matched is not None else [], rest
    if isinstance(error, Exception):
        return [error], None
    return [], error


def absorb(error: BaseException, report: Callable[[Exception], None]) -> None:
    """What a guard does with what it caught: ``report`` each error, then re-raise
    the rest (cancellation and interrupts must go on); called in an ``except``."""
    errors, rest = split_errors(error)
    for exc in errors:
        report(exc)
    if rest is not None:
        raise rest from None


def _leaves(group: BaseExceptionGroup[Exception]) -> Iterator[Exception]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _same(address: Any, wanted: Sequence[Any] | None) -> bool:
    """Whether a socket's address is ``wanted`` (host and port)."""
    return (
        wanted is not None
        and len(wanted) >= 2
        and isinstance(address, tuple)
        and len(address) >= 2
        and str(address[0]) == str(wanted[0])
        and int(address[1]) == int(wanted[1])
    )


class GuardedTCPServer(TCPServer):
    """Hypercorn's ``TCPServer`` under a guard; see the module docstring."""

    def __init__(self, app: Any, config: Any, context: Any, state: Any, stream: Any) -> None:
        super().__init__(app, config, context, state, stream)
        self.table = table_of(app)
        self.id = f"c{next(_ids)}"

    def describe(self) -> str:
        """``c12 127.0.0.1:50312``: the id the log lines of this connection carry."""
        try:
            host, port = self.stream.socket.getpeername()[:2]
        except (OSError, AttributeError, ValueError):
            return self.id
        return f"{self.id} {host}:{port}"

    async def run(self) -> None:
        table = self.table
        if table is not None and not table.admit(self):
            await self._refuse(table)
            return
        peer = self.describe()
        shutdown = trio.CancelScope(shield=True)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._abort_when_shutdown_overruns, shutdown)
                try:
                    await super().run()
                finally:
                    shutdown.cancel()
        except BaseException as error:
            absorb(error, lambda exc: self._report(peer, exc))
        finally:
            if table is not None:
                table.open.discard(self)
            with trio.CancelScope(shield=True):
                await self._aclose_quietly()

    async def _read_data(self) -> None:
        await super()._read_data()
        # The peer has gone: stop the keep-alive clock, or an idle connection's handler
        # (and its descriptor) lingered until the keep-alive timeout.
        await self.idle_task.stop()

    def _report(self, peer: str, exc: Exception) -> None:
        if self.table is not None:
            self.table.observer.connection_error("server")
            self.table.note(
                "server-error", "connection %s ended by %s: %s", peer, type(exc).__name__, exc
            )
        else:
            log.warning("connection %s ended by %s: %s", peer, type(exc).__name__, exc)
        log.debug("connection %s: the exception", peer, exc_info=exc)

    async def _aclose_quietly(self) -> None:
        try:
            await self.stream.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _refuse(self, table: ConnectionTable) -> None:
        """Answer a connection past the bound with 503 and close it, within
        ``REFUSAL_SECONDS``; with too many refusals at once, close it unanswered."""
        table.observer.connection_refused("connection_limit")
        table.note(
            "connection-limit",
            "refused a connection: %d connections are open, the bound (--max-connections)",
            len(table.open),
        )
        if table.refusing >= max(8, table.bound // 4):
            await self._aclose_quietly()
            return
        table.refusing += 1
        try:
            with trio.move_on_after(REFUSAL_SECONDS / 2):
                # Read what the request sent, so closing with unread data does not
                # reset the connection before the client reads the answer.
                await self.stream.receive_some(65536)
            with trio.move_on_after(REFUSAL_SECONDS / 2):
                await self.stream.send_all(BUSY_RESPONSE)
                await self.stream.send_eof()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            table.refusing -= 1
            with trio.CancelScope(shield=True):
                await self._aclose_quietly()

    async def _abort_when_shutdown_overruns(self, scope: trio.CancelScope) -> None:
        """Once the server stops accepting, give this connection the shutdown bound,
        then abort it: a write to a client that reads nothing is shielded and would
        hold the process open (the cancel that Hypercorn's graceful timeout sends
        does not reach it). Shielded itself, so that cancel does not end the watch."""
        with scope:
            await self.context.terminated.wait()
            if self.table is not None and self.table.stopping is not None:
                self.table.stopping()
            seconds = float(self.config.graceful_timeout)
            if self.table is not None:
                seconds = min(seconds, self.table.shutdown_seconds)
            await trio.sleep(seconds)
            if self.abort() and self.table is not None:
                self.table.note(
                    "shutdown-abort",
                    "connection %s still open %.1f s after shutdown began; aborted",
                    self.describe(),
                    seconds,
                )

    def joins(self, local: Sequence[Any] | None, peer: Sequence[Any] | None) -> bool:
        """Whether this connection runs from ``local`` to ``peer`` (``(host, port)``)."""
        try:
            sock = self.stream.socket
            return _same(sock.getsockname(), local) and _same(sock.getpeername(), peer)
        except (OSError, AttributeError):
            return False

    def abort(self) -> bool:
        """Reset the TCP connection now (zero linger, shut down both ways): a blocked
        write fails at once; the descriptor stays Hypercorn's to close. Whether the
        socket was still there."""
        try:
            sock = self.stream.socket
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            return False
        return True

    def _websocket(self) -> bool:
        stream = getattr(getattr(self.protocol, "protocol", None), "stream", None)
        return isinstance(stream, WSStream)

    async def protocol_send(self, event: Event) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        websocket = self._websocket()
        limit = None
        if self.table is not None:
            limit = (
                self.table.websocket_write_seconds if websocket else self.table.http_write_seconds
            )
        failed = False
        async with self.send_lock:
            # Shielded as Hypercorn shields it (a cancelled write would leave a
            # partial frame on the wire), but with a deadline of its own.
            with trio.CancelScope(shield=True) as write:
                if limit is not None:
                    write.deadline = trio.current_time() + limit
                try:
                    await self.stream.send_all(event.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    failed = True
        if write.cancelled_caught:
            self.abort()
            if self.table is not None:
                self.table.note(
                    "stalled-write",
                    "connection %s read nothing for %.1f s; dropped",
                    self.describe(),
                    limit or 0.0,
                )
        if not (failed or write.cancelled_caught):
            return
        await self.protocol.handle(Closed())
        if not websocket:
            # The reader of a plain HTTP connection may be parked (h11 pauses it while
            # a pipelined request waits for this response) rather than reading, so
            # it would never notice: end the connection's tasks.
            self._task_group._nursery.cancel_scope.cancel()  # type: ignore[union-attr]

    async def _close(self) -> None:
        """Hypercorn's close, with the EOF sent only under the send lock.

        Hypercorn's ``send_eof`` takes no lock; trio's ``send_eof`` checkpoints inside
        its conflict detector, and a write started meanwhile (the reader answering the
        client's close frame) raised ``BusyResourceError`` in the reader task, which
        ended the server. When the lock is taken (a write in flight, or one handed the
        lock and about to start: trio's lock passes straight to the next waiter), no
        EOF is sent: closing the socket ends that write, which Hypercorn handles as
        the peer gone."""
        try:
            self.send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self.stream.aclose()
            return
        try:
            await super()._close()
        finally:
            self.send_lock.release()


class _BoundedBuffer(WebsocketBuffer):
    """Hypercorn's message buffer, emptied when a message overflows it: Hypercorn
    sends 1009 but kept appending what the client sent after it."""

    def __init__(self, max_length: int) -> None:
        super().__init__(max_length)
        self.overflowed = False

    def extend(self, event: Any) -> None:
        if self.overflowed:
            raise FrameTooLargeError()
        try:
            super().extend(event)
        except FrameTooLargeError:
            self.overflowed = True
            self.clear()
            raise


class GuardedWSStream(WSStream):
    """Hypercorn's ``WSStream`` with the upgrade race closed; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._app_ended = False
        """The app has returned (its last ``send(None)`` came): nothing reads its queue."""
        self._puts: set[trio.CancelScope] = set()
        """Puts into the app's queue under way (the reader's, at most one or two)."""
        self._queue_put: Callable[[Any], Awaitable[None]] | None = None
        super().__init__(*args, **kwargs)
        self.buffer = _BoundedBuffer(self.config.websocket_max_message_size)
        self._answering = False
        """The app has begun its HTTP answer to the upgrade (a refusal's status line
        may be on the wire while its state still says HANDSHAKE)."""
        self._failure: CloseConnection | None = None
        """A frame broke the protocol: the close it calls for, not yet sent."""
        self._peer_close: int | None = None
        """The client's own close frame's code (it hung up), for the app's disconnect."""
        self._close_answered = False
        """The client's close frame answered the app's close (the closing handshake)."""

    @property
    def app_put(self) -> Callable[[Any], Awaitable[None]] | None:
        """Hypercorn's put into the app's queue (``max_app_queue_size`` messages), as
        :meth:`_put` bounds it; ``None`` before the app is started."""
        return None if self._queue_put is None else self._put

    @app_put.setter
    def app_put(self, put: Callable[[Any], Awaitable[None]] | None) -> None:
        self._queue_put = put

    async def _put(self, message: Any) -> None:
        """A message for the app, unless the app has ended. Once it has, nothing reads
        its queue: a client that went on sending filled it, and the connection's reader
        waited in this put (not on the socket, so aborting the socket did not end it)
        until Hypercorn's graceful timeout cancelled it (SIGTERM took
        shutdown timeout + 5 s with a non-reader that kept sending)."""
        if self._app_ended or self._queue_put is None:
            return
        with trio.CancelScope() as scope:
            self._puts.add(scope)
            try:
                await self._queue_put(message)
            finally:
                self._puts.discard(scope)

    async def app_send(self, message: Any) -> None:
        if message is None:  # the app has returned: a put waiting for it never ends
            self._app_ended = True
            for scope in self._puts:
                scope.cancel()
        await super().app_send(message)

    async def handle(self, event: Any) -> None:
        if (
            not self.closed
            and isinstance(event, (Body, Data))
            and not self.handshake.accepted
            and self.state is not ASGIWebsocketState.CONNECTED
        ):
            await self._early_data()
            return
        if (
            isinstance(event, StreamClosed)
            and self._peer_close is not None
            and not self.closed
            and self.app_put is not None
            and self.state is ASGIWebsocketState.CONNECTED
        ):
            # Hypercorn reports 1006 for a client's close frame as for a dropped TCP
            # connection; the app tells a hang-up from a network failure by this code.
            self.closed = True
            await self.app_put({"type": "websocket.disconnect", "code": self._peer_close})
            return
        if (
            isinstance(event, StreamClosed)
            and not self._close_answered
            and self._peer_close is None
            and not self.closed
            and self.app_put is not None
            and self.state is ASGIWebsocketState.CLOSED
        ):
            # The app closed and the connection ended with no close frame from the client:
            # Hypercorn reports 1000 as for a completed handshake; the app (a resumable
            # session's end) tells whether the client read everything by this code.
            self.closed = True
            await self.app_put({"type": "websocket.disconnect", "code": 1006})
            return
        await super().handle(event)

    async def _early_data(self) -> None:
        """Bytes before the upgrade was answered: a client must wait for the 101
        (RFC 6455 4.1). Hypercorn answered 400 while the app might already be
        answering; two responses on one h11 connection raised in whichever task
        came second. Now: closed first (the app's sends from here on are dropped and
        it hears the client left), a 400 only if the app has not begun to answer,
        and the connection ends; if the app is answering, its answer goes out and
        the bytes are dropped."""
        if self._answering or self.state is not ASGIWebsocketState.HANDSHAKE:
            return
        self.closed = True
        if self.app_put is not None:
            await self.app_put({"type": "websocket.disconnect", "code": 1002})
        await self._send_error_response(400)
        await self.send(StreamClosed(stream_id=self.stream_id))

    async def _send_rejection(self, message: Any) -> None:
        self._answering = True
        await super()._send_rejection(message)

    async def _accept(self, message: Any) -> None:
        # No permessage-deflate: wsproto inflates a message without any bound (a few
        # MB on the wire became GBs), and base64 PCM in JSON gains little from it.
        self.handshake.extensions = None
        await super()._accept(message)
        self.connection.events = self._events_of(self.connection)  # type: ignore[method-assign,assignment]

    def _events_of(self, connection: Any) -> Callable[[], Iterator[Any]]:
        """``connection.events`` that holds back the close wsproto reports for a frame
        that broke the protocol (it leaves the state OPEN, so Hypercorn dropped the
        TCP connection without a close frame); ``_handle_events`` sends it."""
        events = type(connection).events

        def guarded() -> Iterator[Any]:
            for event in events(connection):
                if isinstance(event, CloseConnection) and connection.state is ConnectionState.OPEN:
                    self._failure = event
                    return
                if (
                    isinstance(event, CloseConnection)
                    and connection.state is ConnectionState.REMOTE_CLOSING
                ):
                    self._peer_close = int(event.code)
                answer = connection.state is ConnectionState.CLOSED
                if isinstance(event, CloseConnection) and answer:
                    self._close_answered = True
                yield event

        return guarded

    async def _handle_events(self) -> None:
        await super()._handle_events()
        failure, self._failure = self._failure, None
        if failure is not None:
            await self._send_wsproto_event(
                CloseConnection(code=failure.code, reason=(failure.reason or "")[:100])
            )
            await self.send(StreamClosed(stream_id=self.stream_id))
        elif isinstance(self.buffer, _BoundedBuffer) and self.buffer.overflowed:
            await self.send(StreamClosed(stream_id=self.stream_id))


_PLACES: Final = (
    (hypercorn_run, "TCPServer", GuardedTCPServer),
    (hypercorn_h11, "WSStream", GuardedWSStream),
    (hypercorn_h2, "WSStream", GuardedWSStream),
)
"""Where Hypercorn looks the two classes up when it serves (its trio worker, and the
HTTP/1.1 and HTTP/2 protocols that open a WebSocket stream)."""


def install() -> None:
    """Put the guarded classes where Hypercorn looks them up (idempotent)."""
    for module, name, guarded in _PLACES:
        setattr(module, name, guarded)


def installed() -> bool:
    """Whether :func:`install` is in force (tests, and a check at start-up)."""
    return all(getattr(module, name) is guarded for module, name, guarded in _PLACES)
