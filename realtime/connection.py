"""One WebSocket connection's life, from accept to close, in one nursery.

Three tasks share the connection: a *receiver* that reads and parses every
message (and answers pings at once), a *processor* that runs configuration,
audio and commit in arrival order on the engine, and a *sender* that owns
every socket write. A watchdog drops clients that stop reading. Whatever ends
the connection, the engine session is closed and the reservation released.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import attrs
import trio

from realtime import protocol
from realtime.engine import Engine, EngineError
from realtime.limits import Limits
from realtime.models.base import (
    FRAME_SAMPLES,
    INPUT_SAMPLE_RATE,
    AudioDelta,
    Cancelled,
    Done,
    ModelEvent,
)

log = logging.getLogger("realtime.connection")

CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_POLICY: Final = 1008
CLOSE_INTERNAL: Final = 1011
CLOSE_TRY_AGAIN: Final = 1013

MAX_QUEUED_MESSAGES: Final = 1024
"""Messages waiting for the processor; beyond it a client is sending faster than it may."""


class TransportClosed(Exception):
    """The peer has gone away."""


class Transport(Protocol):
    """What the lifecycle needs from a WebSocket (Quart's, or an in-memory fake)."""

    async def receive(self) -> str | bytes | None: ...

    async def send(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


@attrs.frozen(slots=True)
class _Close:
    code: int
    reason: str


@attrs.frozen(slots=True)
class _Wake:
    """Wakes an idle processor so it sees a cancel."""


_ProcessorItem = protocol.SessionUpdate | protocol.AudioAppend | protocol.AudioCommit | _Wake


PIPELINE_DEPTH: Final = 2
"""Slices handed to the engine at once: one running, the next waiting in its queue."""


def _emit_rank(event: ModelEvent) -> int:
    if isinstance(event, AudioDelta):
        return 0
    return 2 if isinstance(event, (Done, Cancelled)) else 1


class Connection:
    """Runs one client's session; ``run`` returns when the connection is over."""

    def __init__(
        self,
        transport: Transport,
        engine: Engine,
        limits: Limits,
        *,
        shutdown: trio.Event | None = None,
    ) -> None:
        self.transport = transport
        self.engine = engine
        self.limits = limits
        self.shutdown = shutdown if shutdown is not None else trio.Event()
        self.session_id = protocol.new_session_id()
        model = engine.model
        self.model_id = model.model_id
        self.model_path = model.path
        self.close_code: int | None = None
        # Receiver-side view of the conversation (the processor confirms it).
        self._update_requested = False
        self._configured = False
        self._committed = False
        self._cancel_requested = False
        self._pending_samples = 0
        self._max_pending = int(limits.max_pending_audio_seconds * INPUT_SAMPLE_RATE)
        self._released = False
        self._stop_pushes = threading.Event()
        """Set on cancel or release: the engine skips this session's queued slices."""
        self._lookahead: _ProcessorItem | None = None
        self._send_started: float | None = None
        self._out_send, self._out_recv = trio.open_memory_channel[str | _Close](
            limits.send_queue_events
        )
        self._work_send, self._work_recv = trio.open_memory_channel[_ProcessorItem](
            MAX_QUEUED_MESSAGES
        )

    # --- entry point ------------------------------------------------------------

    async def run(self) -> None:
        if not self.engine.alive:
            await self._refuse(
                "inference_error",
                f"the model engine has stopped: {self.engine.dead_reason}",
                CLOSE_INTERNAL,
            )
            return
        if not self.engine.try_reserve(self.session_id):
            await self._refuse(
                "server_busy",
                "another session is active on this server; try again when it ends",
                CLOSE_TRY_AGAIN,
            )
            return
        log.info("session %s opened", self.session_id)
        urgent: _Close | None = None
        try:
            await self.transport.send(protocol.serialize(protocol.session_created(self.session_id)))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._until_gone, self._receiver)
                nursery.start_soon(self._processor)
                nursery.start_soon(self._until_gone, self._sender)
                nursery.start_soon(self._stall_watchdog)
                await self.shutdown.wait()
                urgent = _Close(CLOSE_GOING_AWAY, "server shutting down")
                nursery.cancel_scope.cancel()
        except TransportClosed:
            log.info("session %s: client went away", self.session_id)
        finally:
            self._release()
            if urgent is not None and self.close_code is None:
                self.close_code = urgent.code
                with trio.move_on_after(1.0):
                    await self._close_transport(urgent)
            log.info("session %s closed (code %s)", self.session_id, self.close_code)

    async def _refuse(self, code: protocol.ErrorCode, message: str, close_code: int) -> None:
        self.close_code = close_code
        try:
            await self.transport.send(protocol.serialize(protocol.error_event(code, message)))
            await self.transport.close(close_code, message[:120])
        except TransportClosed:
            pass

    def _release(self) -> None:
        """Close the engine session and free the slot; synchronous so it runs even
        when cancelled, and idempotent. The engine runs commands in order, so a
        next session's ``open`` queues behind this ``close``."""
        if self._released:
            return
        self._released = True
        self._stop_pushes.set()
        self.engine.submit("close", self.session_id)
        self.engine.release(self.session_id)

    def _finish(self) -> None:
        self._nursery.cancel_scope.cancel()

    async def _until_gone(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run a socket task; the peer going away ends the whole connection."""
        try:
            await task()
        except TransportClosed:
            log.info("session %s: client went away", self.session_id)
            self._finish()

    async def _close_transport(self, close: _Close) -> None:
        try:
            await self.transport.close(close.code, close.reason)
        except TransportClosed:
            pass

    # --- sender -----------------------------------------------------------------

    async def _emit(self, event: protocol.Event) -> None:
        await self._out_send.send(protocol.serialize(event))

    async def _end(self, code: int, reason: str, error: protocol.Event | None = None) -> None:
        """Queue an orderly close after everything already queued."""
        if error is not None:
            await self._emit(error)
        await self._out_send.send(_Close(code, reason))

    async def _sender(self) -> None:
        async for item in self._out_recv:
            if isinstance(item, _Close):
                self.close_code = item.code
                await self._close_transport(item)
                self._finish()
                return
            self._send_started = trio.current_time()
            await self.transport.send(item)
            self._send_started = None

    async def _stall_watchdog(self) -> None:
        """Drop a client that reads nothing while events wait for it.

        Hypercorn shields socket writes, so a blocked write cannot be cancelled:
        the session and the slot are released here first, then the connection
        is told to close, which completes once the write finishes or the TCP
        connection dies.
        """
        timeout = self.limits.send_timeout
        period = min(1.0, timeout / 4)
        while True:
            await trio.sleep(period)
            started = self._send_started
            if started is not None and trio.current_time() - started > timeout:
                log.warning(
                    "session %s: client read nothing for %.1f s; dropping it",
                    self.session_id,
                    timeout,
                )
                self._release()
                self.close_code = CLOSE_POLICY
                self._finish()
                # Shielded: the cancel above must not stop the close; bounded, so
                # a client that never reads again cannot hold this task forever.
                with trio.CancelScope(shield=True), trio.move_on_after(timeout):
                    await self._close_transport(_Close(CLOSE_POLICY, "client stopped reading"))
                return

    # --- receiver ---------------------------------------------------------------

    async def _receiver(self) -> None:
        opened = trio.current_time()
        while True:
            idle_deadline = trio.current_time() + self.limits.idle_timeout
            deadline = idle_deadline
            if self._committed or self._cancel_requested:
                # The connection is ending on its own; keep answering pings.
                deadline = math.inf
            elif not self._update_requested:
                deadline = min(deadline, opened + self.limits.configure_timeout)
            with trio.CancelScope(deadline=deadline) as scope:
                frame = await self.transport.receive()
            if scope.cancelled_caught:
                await self._receive_timed_out(idle=deadline == idle_deadline)
                return
            await self._handle_frame(frame)

    async def _receive_timed_out(self, *, idle: bool) -> None:
        if idle:
            message = f"no message for {self.limits.idle_timeout:g} s; closing"
        else:
            message = f"no session.update within {self.limits.configure_timeout:g} s; closing"
        await self._end(CLOSE_POLICY, message, protocol.error_event("invalid_request", message))

    async def _reject(self, message: str) -> None:
        await self._emit(protocol.error_event("invalid_request", message))

    async def _handle_frame(self, frame: str | bytes | None) -> None:
        if frame is None:
            frame = b""
        if len(frame) > self.limits.max_message_bytes:
            await self._reject(
                f"message of {len(frame)} bytes exceeds the "
                f"{self.limits.max_message_bytes}-byte limit"
            )
            return
        try:
            message = protocol.parse_client_message(frame)
        except protocol.ProtocolError as exc:
            await self._reject(exc.message)
            return
        if isinstance(message, protocol.Ping):
            await self._emit(protocol.pong())
        elif isinstance(message, protocol.Cancel):
            if not (self._cancel_requested or self._committed):
                self._cancel_requested = True
                self._stop_pushes.set()
                # Wake an idle processor; a busy one checks the flag between slices.
                try:
                    self._work_send.send_nowait(_Wake())
                except trio.WouldBlock:
                    pass
        elif self._cancel_requested:
            await self._reject("the session was cancelled; no more input is accepted")
        elif isinstance(message, protocol.SessionUpdate):
            await self._handle_update(message)
        elif not self._update_requested:
            what = "audio" if isinstance(message, protocol.AudioAppend) else "commit"
            await self._reject(f"send session.update before {what}")
        elif self._committed:
            await self._reject("input audio was already committed; the session is ending")
        elif isinstance(message, protocol.AudioAppend):
            await self._handle_append(message)
        else:
            self._committed = True
            await self._enqueue(message)

    async def _handle_update(self, update: protocol.SessionUpdate) -> None:
        if self._update_requested:
            await self._reject(
                "the session is already configured; session.update is accepted once per connection"
            )
            return
        if update.model is not None and not protocol.model_matches(
            update.model, self.model_id, self.model_path
        ):
            await self._reject(
                f"model {update.model!r} is not served here; this server serves {self.model_id!r}"
            )
            return
        self._update_requested = True
        await self._enqueue(update)

    async def _handle_append(self, append: protocol.AudioAppend) -> None:
        n = int(append.samples.shape[0])
        if self._pending_samples + n > self._max_pending:
            await self._reject(
                f"input audio backlog is full: {self._pending_samples / INPUT_SAMPLE_RATE:.2f} s "
                f"waiting, limit {self.limits.max_pending_audio_seconds:g} s; this append of "
                f"{n / INPUT_SAMPLE_RATE:.2f} s was refused (send audio no faster than real time)"
            )
            return
        self._pending_samples += n
        if not await self._enqueue(append):
            self._pending_samples -= n

    async def _enqueue(self, item: _ProcessorItem) -> bool:
        try:
            self._work_send.send_nowait(item)
        except trio.WouldBlock:
            await self._reject(
                f"more than {MAX_QUEUED_MESSAGES} messages are waiting; this one was refused"
            )
            return False
        return True

    # --- processor --------------------------------------------------------------

    async def _processor(self) -> None:
        try:
            while True:
                item = await self._next_item()
                if self._cancel_requested:
                    break
                if isinstance(item, protocol.SessionUpdate):
                    await self._configure(item)
                elif isinstance(item, protocol.AudioAppend):
                    await self._run_appends(item)
                elif isinstance(item, protocol.AudioCommit):
                    await self._commit(item)
                    return
            await self._cancel()
        except EngineError as exc:
            # The session is gone (engine failure): say so and close.
            await self._end(
                CLOSE_INTERNAL, exc.message[:120], protocol.error_event(exc.code, exc.message)
            )

    async def _next_item(self) -> _ProcessorItem:
        if self._lookahead is not None:
            item, self._lookahead = self._lookahead, None
            return item
        return await self._work_recv.receive()

    def _next_append(self) -> protocol.AudioAppend | None:
        """The next queued message if it is audio; anything else waits its turn."""
        if self._lookahead is not None:
            return None
        try:
            item = self._work_recv.receive_nowait()
        except trio.WouldBlock:
            return None
        if isinstance(item, protocol.AudioAppend):
            return item
        self._lookahead = item
        return None

    async def _configure(self, update: protocol.SessionUpdate) -> None:
        try:
            await self.engine.open(
                self.session_id,
                system_prompt=update.system_prompt,
                seed=update.seed,
                max_streaming_seconds=update.max_streaming_seconds,
            )
        except EngineError as exc:
            if exc.session_dropped and not self.engine.alive:
                raise
            # Nothing was opened: the client may fix its options and try again.
            self._update_requested = False
            await self._emit(protocol.error_event(exc.code, exc.message))
            return
        self._configured = True
        await self._emit(protocol.session_updated(self.session_id, self.model_id, update))

    def _refusal(self, append: protocol.AudioAppend) -> protocol.Event | None:
        if not self._configured:
            return protocol.error_event("invalid_request", "send session.update before audio")
        if append.sample_rate != INPUT_SAMPLE_RATE:
            return protocol.error_event(
                "inference_error",
                f"expected {INPUT_SAMPLE_RATE} Hz PCM, received {append.sample_rate} Hz; "
                "resample to 16000 Hz mono before sending",
            )
        return None

    async def _run_appends(self, append: protocol.AudioAppend) -> None:
        """Run this append and every one queued behind it, slice by slice.

        Up to ``PIPELINE_DEPTH`` slices are handed to the engine at once, so the
        next slice is already waiting when one finishes and the model never idles
        on a round trip through trio. Events still go out in slice order. A cancel
        sets ``_stop_pushes``, which the engine checks before running a queued
        slice: at most the slice already running completes after a cancel.
        """
        inflight: deque[tuple[concurrent.futures.Future[Any], int]] = deque()
        current: protocol.AudioAppend | None = append
        number = offset = 0
        failed = -1  # the append whose remaining slices are dropped after an error
        try:
            while True:
                while current is not None and len(inflight) < PIPELINE_DEPTH:
                    if self._cancel_requested:
                        return
                    total = int(current.samples.shape[0])
                    refusal = self._refusal(current) if offset == 0 else None
                    if refusal is not None or offset >= total:
                        if refusal is not None:
                            await self._drain(inflight, failed)
                            await self._emit(refusal)
                            self._pending_samples -= total
                        current, number, offset = self._next_append(), number + 1, 0
                        continue
                    piece = current.samples[offset : offset + FRAME_SAMPLES]
                    offset += int(piece.shape[0])
                    self._pending_samples -= int(piece.shape[0])
                    future = self.engine.submit(
                        "push", self.session_id, piece, current.sample_rate, self._stop_pushes
                    )
                    inflight.append((future, number))
                if not inflight:
                    return
                future, owner = inflight.popleft()
                failed, ok = await self._collect(future, owner, failed)
                if not ok and current is not None and number == owner:
                    # Drop the rest of the failed append.
                    self._pending_samples -= int(current.samples.shape[0]) - offset
                    current, number, offset = self._next_append(), number + 1, 0
                if current is None:
                    current, number, offset = self._next_append(), number + 1, 0
        finally:
            if current is not None:
                self._pending_samples -= int(current.samples.shape[0]) - offset

    async def _collect(
        self, future: concurrent.futures.Future[Any], owner: int, failed: int
    ) -> tuple[int, bool]:
        """Await one slice and send its events, or its error once per append.

        Returns the append that has failed (``failed`` or ``owner``) and whether
        this slice ran. A dropped session raises: the connection cannot go on.
        """
        try:
            events = await self.engine.wait(future)
        except EngineError as exc:
            if exc.session_dropped:
                raise
            if owner != failed:
                await self._emit(protocol.error_event(exc.code, exc.message))
            return owner, False
        if events is not None and owner != failed:
            await self._emit_model_events(events)
        return failed, True

    async def _drain(
        self, inflight: deque[tuple[concurrent.futures.Future[Any], int]], failed: int
    ) -> None:
        """Finish the slices already handed to the engine, sending their events."""
        while inflight:
            failed, _ = await self._collect(*inflight.popleft(), failed)

    async def _emit_model_events(self, events: list[ModelEvent]) -> None:
        # A frame's audio goes first: it is what the listener waits for; text and
        # transcript only update a display. Done/Cancelled stay last.
        for event in sorted(events, key=_emit_rank):
            await self._emit(protocol.wire_event(event))

    async def _commit(self, commit: protocol.AudioCommit) -> None:
        await self._emit(protocol.input_audio_committed())
        await self._emit_model_events(await self.engine.flush(self.session_id, commit.pad_partial))
        await self._end(CLOSE_NORMAL, "response done")

    async def _cancel(self) -> None:
        if self._configured:
            events = await self.engine.cancel(self.session_id)
            frame_index = 0
            for event in events:
                await self._emit(protocol.wire_event(event))
                frame_index = event.frame_index
            if not events:
                await self._emit(protocol.cancelled(frame_index))
        else:
            await self._emit(protocol.cancelled(0))
        await self._end(CLOSE_NORMAL, "cancelled")
