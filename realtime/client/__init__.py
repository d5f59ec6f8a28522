"""The Python client of ``/v1/realtime``: connect, configure, stream audio, read events.

One trio-websocket connection wrapped in typed sends, typed server events and
one-line exceptions (:class:`ClientError` and its subclasses), so an application,
the example scripts, the benchmarks and the tests all speak the protocol through
the same code. See docs/client.md for a walk-through.

Parsing is kept cheap on purpose (one ``json.loads`` and one small attrs object
per frame; audio stays base64 until :meth:`AudioDelta.pcm` is called): the
benchmarks measure a zero-cost server through this client.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar, overload

import attrs
import numpy as np
import numpy.typing as npt
import trio
import trio_websocket

from realtime.audio import float_to_pcm16, pcm16_from_base64
from realtime.client.resume import (
    CLOSE_NO_FRAME,
    LINK_ERROR_CODES,
    LINK_EVENT_TYPES,
    OUTBOX_MAX_BYTES,
    OUTBOX_MAX_SECONDS,
    RESUME_ANSWER_SECONDS,
    EventCounter,
    InputLost,
    Outbox,
    Resumed,
    ResumeOffer,
    ack_message,
    backoff,
    resumable_url,
    resume_message,
    resume_url,
)
from realtime.models.base import VOICECHAT_FIGURES
from realtime.session.close_codes import CLOSE_CODE_NAMES, CLOSE_TRY_AGAIN

PCM16 = npt.NDArray[np.int16]
Raw = dict[str, Any]

MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024

# --- errors ---------------------------------------------------------------------------


class ClientError(Exception):
    """Anything that ends a client's session; ``str(exc)`` is one line for the user."""


class BadURL(ClientError):
    """The URL is not a ``ws://`` or ``wss://`` URL."""


class ServerUnreachable(ClientError):
    """No TCP connection (refused, unknown host, timed out)."""


class UpgradeRejected(ClientError):
    """The server answered the WebSocket upgrade with an HTTP error status."""

    def __init__(self, status: int, body: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        """The response body, shortened; an HTML page is reduced to its title."""


class Unauthorized(UpgradeRejected):
    """HTTP 401: the server needs an API key, or a different one."""


class Forbidden(UpgradeRejected):
    """HTTP 403: the server refused this client (usually its ``Origin``)."""


class ServerBusy(ClientError):
    """The server has no conversation free for this client (``server_busy`` error and/or
    close code 1013): all of its ``--max-sessions`` are in use, or it is at its real-time
    capacity. ``message`` is the server's own word on which (the error event's message,
    else the close reason; ``None`` if it sent neither), and the text includes it."""

    def __init__(self, text: str, message: str | None = None) -> None:
        super().__init__(text)
        self.message = message


class BusyUpgrade(ServerBusy, UpgradeRejected):
    """HTTP 503 before the upgrade: a balancer with no replica free (HAProxy's answer
    after its queue timeout), a draining server, or one at its connection limit. Busy,
    like ``server_busy`` + 1013; ``retry_after`` is the ``Retry-After`` header's seconds
    (``None`` when absent or not a number of seconds)."""

    def __init__(self, status: int, body: str, message: str, retry_after: float | None) -> None:
        UpgradeRejected.__init__(self, status, body, message)
        self.message = body or None
        self.retry_after = retry_after


class ServerClosed(ClientError):
    """The server closed the WebSocket before the client was done."""

    def __init__(self, code: int | None, reason: str | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class ServerError(ClientError):
    """The server sent an ``error`` event (``code`` is the wire code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.message = message


class ResumeFailed(ServerError):
    """The connection dropped and the server would not resume the session
    (``resume_failed``: it ended or expired meanwhile, or the replica that held it is
    gone) or could not (``resync_required``: it no longer holds the events this
    client missed; start a new session)."""

    def __init__(self, code: str, message: str) -> None:
        ClientError.__init__(
            self,
            f"the connection dropped and the server could not resume the conversation "
            f"({code}: {message})",
        )
        self.code = code
        self.message = message


class ResumeExpired(ClientError):
    """The connection dropped and no resume got through within the grace period the
    server announced (``last`` says what the last try met)."""

    def __init__(self, grace: float, tries: int, last: str) -> None:
        super().__init__(
            f"the connection dropped and could not be restored within the server's "
            f"{grace:g} s grace period ({tries} tries; last: {last})"
        )
        self.last = last


class ProtocolViolation(ClientError):
    """The server sent something the protocol does not allow (bad JSON, bad audio)."""


class WrongEndpoint(ProtocolViolation):
    """The URL is the server's OpenAI Realtime endpoint (``/openai/v1/realtime``); this
    client speaks the native protocol, at ``/v1/realtime``. Raised at the first event
    that shows it, instead of a "malformed event" further on."""


# --- server events --------------------------------------------------------------------


@attrs.frozen(slots=True)
class SessionCreated:
    session_id: str
    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class SessionUpdated:
    """The session is ready. The figures are the served model's, as sent (``None``
    when a server leaves one out); :class:`RealtimeClient` falls back to VoiceChat's."""

    session_id: str
    model: str | None
    frame_samples: int | None
    raw: Raw = attrs.field(repr=False)
    output_frame_samples: int | None = None
    input_sample_rate: int | None = None
    output_sample_rate: int | None = None


@attrs.frozen(slots=True)
class AudioDelta:
    """One model step of speech (80 ms from VoiceChat); ``delta`` is still base64
    (decode with :meth:`pcm`)."""

    frame_index: int
    delta: str = attrs.field(repr=False)
    raw: Raw = attrs.field(repr=False)

    @property
    def sample_rate(self) -> int:
        return int(self.raw.get("sample_rate", VOICECHAT_FIGURES.output_sample_rate))

    @property
    def audio_codes(self) -> list[int]:
        codes: list[int] = self.raw.get("audio_codes", [])
        return codes

    def pcm(self) -> PCM16:
        """The samples as native int16 (``output_frame_samples`` of ``session.updated``:
        1764 at 22 050 Hz from VoiceChat)."""
        return decode_pcm16(self.delta)


@attrs.frozen(slots=True)
class _TokenDelta:
    frame_index: int
    token_id: int
    delta: str
    text: str
    """The channel's text so far."""
    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class TextDelta(_TokenDelta):
    """The assistant's text channel."""


@attrs.frozen(slots=True)
class FunctionDelta(_TokenDelta):
    """The tool-call channel."""


@attrs.frozen(slots=True)
class TranscriptDelta:
    """What the model heard the user say."""

    frame_index: int
    delta: str
    transcript: str
    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class Committed:
    """The commit was accepted; the rest of the answer follows."""

    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class _Final:
    frame_index: int
    """The frame count of the timeline when it ended."""
    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class ResponseDone(_Final):
    """The answer is complete; the server then closes with 1000."""


@attrs.frozen(slots=True)
class ResponseCancelled(_Final):
    """The session was cancelled; the server then closes with 1000."""


@attrs.frozen(slots=True)
class Pong:
    """The answer to :meth:`RealtimeClient.ping`."""

    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class ErrorEvent:
    code: str
    message: str
    raw: Raw = attrs.field(repr=False)


@attrs.frozen(slots=True)
class UnknownEvent:
    """A ``type`` this client does not know (a newer server); the OpenAI dialect's
    events raise :class:`WrongEndpoint` instead."""

    type: str
    raw: Raw = attrs.field(repr=False)


ServerEvent = (
    SessionCreated
    | SessionUpdated
    | AudioDelta
    | TextDelta
    | FunctionDelta
    | TranscriptDelta
    | Committed
    | ResponseDone
    | ResponseCancelled
    | Pong
    | ErrorEvent
    | UnknownEvent
)


_Expected = TypeVar("_Expected", SessionCreated, SessionUpdated)


def _session(raw: Raw) -> Raw:
    session = raw.get("session")
    return session if isinstance(session, dict) else {}


def _figure(session: Raw, key: str, within: str | None = None) -> int | None:
    """A positive integer of the session object (``within``: of its sub-object), or
    None when absent; anything else is malformed (TypeError)."""
    holder = session.get(within) if within is not None else session
    value = holder.get(key) if isinstance(holder, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TypeError(f"session.{within + '.' if within else ''}{key} is {value!r}")
    return value


def _updated(raw: Raw) -> SessionUpdated:
    session = _session(raw)
    return SessionUpdated(
        str(session.get("id", "")),
        session.get("model"),
        _figure(session, "frame_samples"),
        raw,
        output_frame_samples=_figure(session, "output_frame_samples"),
        input_sample_rate=_figure(session, "sample_rate", "input_audio_format"),
        output_sample_rate=_figure(session, "sample_rate", "output_audio_format"),
    )


def _error(raw: Raw) -> ErrorEvent:
    err = raw.get("error")
    err = err if isinstance(err, dict) else {}
    return ErrorEvent(str(err.get("code", "unknown")), str(err.get("message", "")), raw)


OPENAI_EVENT_TYPES: Final = frozenset(
    {
        "conversation.created",
        "conversation.item.added",
        "conversation.item.created",
        "conversation.item.deleted",
        "conversation.item.done",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed",
        "conversation.item.input_audio_transcription.segment",
        "conversation.item.retrieved",
        "conversation.item.truncated",
        "input_audio_buffer.cleared",
        "input_audio_buffer.dtmf_event_received",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.timeout_triggered",
        "mcp_list_tools.completed",
        "mcp_list_tools.failed",
        "mcp_list_tools.in_progress",
        "output_audio_buffer.cleared",
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
        "rate_limits.updated",
        "response.content_part.added",
        "response.content_part.done",
        "response.created",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.done",
        "response.output_item.added",
        "response.output_item.done",
        "response.output_text.delta",
        "response.output_text.done",
    }
)
"""Server events of the OpenAI Realtime GA dialect (the ``openai`` SDK's union) that
the native protocol has not; the six it shares are told apart by :data:`_GA_SHAPES`."""


def _ga_session(raw: Raw) -> bool:
    return _session(raw).get("type") == "realtime"


_GA_SHAPES: Final[dict[str, Callable[[Raw], bool]]] = {
    "session.created": _ga_session,
    "session.updated": _ga_session,
    "conversation.item.input_audio_transcription.delta": lambda r: "item_id" in r,
    "input_audio_buffer.committed": lambda r: "item_id" in r,
    "response.done": lambda r: isinstance(r.get("response"), dict),
    "error": lambda r: isinstance(r.get("error"), dict) and "type" in r["error"],
}
"""Event types both dialects have, and what tells the GA one apart (fields the native
event never carries)."""


def openai_sign(raw: Raw) -> str | None:
    """What shows ``raw`` to be an event of the OpenAI Realtime dialect, or None."""
    kind = raw.get("type")
    if not isinstance(kind, str):
        return None
    if kind in OPENAI_EVENT_TYPES:
        return f"{kind!r}"
    shaped = _GA_SHAPES.get(kind)
    return f"{kind!r} in the OpenAI shape" if shaped is not None and shaped(raw) else None


def wrong_endpoint_message(sign: str) -> str:
    """The one line a native client gives when it reached the OpenAI endpoint."""
    return (
        f"this URL serves the OpenAI Realtime dialect (the server sent {sign}); this client "
        "speaks the native VoiceChat protocol, served at ws://HOST:PORT/v1/realtime "
        "(not /openai/v1/realtime)"
    )


def _native(parse: Callable[[Raw], ServerEvent]) -> Callable[[Raw], ServerEvent]:
    """``parse`` for a type both dialects have: the OpenAI one raises
    :class:`WrongEndpoint` before its missing native fields read as "malformed"."""

    def checked(raw: Raw) -> ServerEvent:
        sign = openai_sign(raw)
        if sign is not None:
            raise WrongEndpoint(wrong_endpoint_message(sign))
        return parse(raw)

    return checked


def _openai_only(raw: Raw) -> ServerEvent:
    raise WrongEndpoint(wrong_endpoint_message(f"{raw['type']!r}"))


_PARSERS: Final[dict[str, Callable[[Raw], ServerEvent]]] = {
    "response.audio.delta": lambda r: AudioDelta(r["frame_index"], r["delta"], r),
    "response.text.delta": lambda r: TextDelta(
        r["frame_index"], r.get("token_id", -1), r["delta"], r.get("text", ""), r
    ),
    "conversation.item.input_audio_transcription.delta": _native(
        lambda r: TranscriptDelta(r["frame_index"], r["delta"], r.get("transcript", ""), r)
    ),
    "response.function.delta": lambda r: FunctionDelta(
        r["frame_index"], r.get("token_id", -1), r["delta"], r.get("text", ""), r
    ),
    "session.created": _native(lambda r: SessionCreated(str(_session(r).get("id", "")), r)),
    "session.updated": _native(_updated),
    "input_audio_buffer.committed": _native(Committed),
    "response.done": _native(lambda r: ResponseDone(r.get("frame_index", -1), r)),
    "response.cancelled": lambda r: ResponseCancelled(r.get("frame_index", -1), r),
    "session.pong": Pong,
    "error": _native(_error),
    **dict.fromkeys(OPENAI_EVENT_TYPES, _openai_only),
}
"""Wire ``type`` -> event; the audio delta first, being most of the traffic. Its
parser, like every type only the native protocol has, checks nothing more: the
OpenAI dialect's audio delta is another type."""


def parse_event(message: str | bytes) -> ServerEvent:
    """One server frame as a typed event; :class:`ProtocolViolation` when malformed."""
    if isinstance(message, bytes):
        raise ProtocolViolation(f"server sent a binary message ({len(message)} bytes)")
    try:
        raw = json.loads(message)
        kind = raw["type"]
        parser = _PARSERS.get(kind)
        return parser(raw) if parser is not None else UnknownEvent(str(kind), raw)
    except json.JSONDecodeError as exc:
        raise ProtocolViolation(f"server sent invalid JSON: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise ProtocolViolation(f"server sent a malformed event ({exc}): {message[:200]}") from None


def is_final(event: ServerEvent) -> bool:
    """``response.done`` or ``response.cancelled``: the server closes after it."""
    return isinstance(event, _Final)


# --- client messages ------------------------------------------------------------------


def encode_pcm16(pcm: npt.ArrayLike) -> str:
    """Base64 of little-endian PCM16; float input is converted with the wire's rule."""
    x = np.asarray(pcm)
    if x.dtype != np.int16:
        x = float_to_pcm16(x) if np.issubdtype(x.dtype, np.floating) else x.astype(np.int16)
    return base64.b64encode(x.astype("<i2", copy=False).tobytes()).decode("ascii")


def decode_pcm16(data: str) -> PCM16:
    """Inverse of :func:`encode_pcm16`; :class:`ProtocolViolation` on bad payloads."""
    try:
        return pcm16_from_base64(data).astype(np.int16)
    except ValueError as exc:
        raise ProtocolViolation(f"server sent bad audio: {exc}") from None


def _dumps(message: Raw) -> str:
    return json.dumps(message, separators=(",", ":"))


def session_update_message(
    *,
    model: str | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    max_streaming_seconds: float | None = None,
) -> str:
    session: Raw = {"seed": seed}
    if model is not None:
        session["model"] = model
    if system_prompt is not None:
        session["system_prompt"] = system_prompt
    if max_streaming_seconds is not None:
        session["max_streaming_seconds"] = max_streaming_seconds
    return _dumps({"type": "session.update", "session": session})


def append_message(
    pcm: npt.ArrayLike, sample_rate: int = VOICECHAT_FIGURES.input_sample_rate
) -> str:
    """``input_audio_buffer.append`` of mono audio (int16, or float in [-1, 1]) at
    ``sample_rate``: the model's input rate (``RealtimeClient.input_sample_rate``)."""
    return _dumps(
        {
            "type": "input_audio_buffer.append",
            "audio": encode_pcm16(pcm),
            "sample_rate": sample_rate,
        }
    )


def commit_message(pad_partial: bool = True) -> str:
    return _dumps({"type": "input_audio_buffer.commit", "pad_partial": pad_partial})


PING: Final = _dumps({"type": "session.ping"})
CANCEL: Final = _dumps({"type": "session.cancel"})

# --- the connection -------------------------------------------------------------------


class _ServedFigure:
    """A figure of the served model, as ``session.updated`` sent it; VoiceChat's before
    it arrives or where the server leaves it out. One rule for every figure a client
    paces, frames or checks audio by."""

    def __set_name__(self, owner: type[RealtimeClient], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, client: None, owner: type[RealtimeClient]) -> _ServedFigure: ...

    @overload
    def __get__(self, client: RealtimeClient, owner: type[RealtimeClient]) -> int: ...

    def __get__(
        self, client: RealtimeClient | None, owner: type[RealtimeClient]
    ) -> int | _ServedFigure:
        if client is None:
            return self
        updated = client.updated
        sent: int | None = getattr(updated, self.name) if updated is not None else None
        fallback: int = getattr(VOICECHAT_FIGURES, self.name)
        return sent or fallback


class RealtimeClient:
    """One ``/v1/realtime`` connection; made by :func:`connect`.

    With ``raise_errors`` (the default) an ``error`` event raises :class:`ServerError`
    (:class:`ServerBusy` for ``server_busy``) from :meth:`receive`; without, it is
    returned as an :class:`ErrorEvent` (the server goes on after ``invalid_request``).
    """

    def __init__(
        self,
        ws: trio_websocket.WebSocketConnection,
        *,
        raise_errors: bool = True,
        link: Link | None = None,
    ):
        self.ws = ws
        """The trio-websocket connection underneath, for what this class does not wrap
        (after a resume, the new one)."""
        self.raise_errors = raise_errors
        self.link = link
        """What resuming needs (None: the session was opened without ``resumable=1``)."""
        self.created: SessionCreated | None = None
        self.updated: SessionUpdated | None = None
        self.finished = False
        """``response.done`` or ``response.cancelled`` has been received."""
        self.received_at = 0.0
        """``time.perf_counter()`` as the last message arrived, before parsing (benchmarks)."""

    input_sample_rate: Final = _ServedFigure()
    """The rate :meth:`append` sends at. This and the next three are the served model's
    (``session.updated``), VoiceChat's before it arrives or where it leaves one out."""
    output_sample_rate: Final = _ServedFigure()
    """The rate of the audio deltas."""
    frame_samples: Final = _ServedFigure()
    """Input samples per model step."""
    output_frame_samples: Final = _ServedFigure()
    """Samples of each audio delta."""

    @property
    def frame_seconds(self) -> float:
        """One model step in seconds: the pace of a live stream."""
        return self.frame_samples / self.input_sample_rate

    @property
    def close_code(self) -> int | None:
        """The WebSocket close code once the connection is closed, else None."""
        closed = self.ws.closed
        return closed.code if closed is not None else None

    def _closed_error(self, exc: trio_websocket.ConnectionClosed) -> ClientError:
        code = exc.reason.code if exc.reason is not None else None
        reason = exc.reason.reason if exc.reason is not None else None
        if code == CLOSE_TRY_AGAIN:
            said = reason or None
            return ServerBusy(f"server busy: {said or 'no conversation is free'} [code 1013]", said)
        if self.updated is None:
            context = " before session.updated"
        elif not self.finished:
            context = " before response.done"
        else:
            context = ""
        name = CLOSE_CODE_NAMES.get(code or 0, "")
        detail = f"code {code}" + (f" ({name})" if name else "") + (f": {reason}" if reason else "")
        return ServerClosed(code, reason, f"server closed the connection{context} [{detail}]")

    @property
    def resumable(self) -> bool:
        """The server offered to resume this session after a dropped connection."""
        return self.link is not None and self.link.offer is not None

    @property
    def resumes(self) -> int:
        """How many times the session was resumed on a new connection."""
        return self.link.resumes if self.link is not None else 0

    def _may_resume(self, exc: trio_websocket.ConnectionClosed) -> bool:
        """The connection dropped (no close frame) in a session the server offered to
        resume, before its answer ended."""
        code = exc.reason.code if exc.reason is not None else CLOSE_NO_FRAME
        return self.resumable and not self.finished and code == CLOSE_NO_FRAME

    async def send_raw(self, message: str | bytes) -> None:
        """Send one frame as is (pre-encoded messages, or invalid ones in tests).

        In a resumable session a message that meets a dropped connection is kept, and
        sent again once the session is resumed (if the server had not taken it)."""
        link = self.link
        if link is not None:
            link.outbox.add(message, trio.current_time())
        try:
            # Read self.ws after the outbox took the message, with no wait between:
            # a resume swaps it only once everything in the outbox went out.
            await self.ws.send_message(message)
        except trio_websocket.ConnectionClosed as exc:
            if not self._may_resume(exc):
                raise self._closed_error(exc) from None

    async def receive(self) -> ServerEvent:
        """The next server event; raises :class:`ServerClosed` when the socket closes.

        In a resumable session a dropped connection is resumed here (reconnect with
        backoff, replay, re-send), so the events go on as if nothing happened;
        :class:`ResumeFailed` or :class:`ResumeExpired` when it cannot be."""
        while True:
            try:
                message = await self.ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                if not self._may_resume(exc):
                    raise self._closed_error(exc) from None
                assert self.link is not None
                await self.link.resume(self)
                continue
            self.received_at = time.perf_counter()
            event = parse_event(message)
            if self.link is None or await self.link.counted(self, event):
                break
        if isinstance(event, AudioDelta):
            return event
        if is_final(event):
            self.finished = True
        elif isinstance(event, ErrorEvent) and self.raise_errors:
            raise _error_exception(event)
        return event

    def __aiter__(self) -> AsyncIterator[ServerEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ServerEvent]:
        """Every event up to and including ``response.done`` / ``response.cancelled``."""
        while not self.finished:
            yield await self.receive()

    async def configure(
        self,
        model: str | None = None,
        system_prompt: str | None = None,
        seed: int = 0,
        max_streaming_seconds: float | None = None,
    ) -> SessionUpdated:
        """Wait for ``session.created``, send ``session.update``, return ``session.updated``.

        Any ``error`` here raises (configuration failed), whatever ``raise_errors`` says.
        """
        if self.created is None:
            self.created = await self._expect(SessionCreated)
        await self.send_raw(
            session_update_message(
                model=model,
                system_prompt=system_prompt,
                seed=seed,
                max_streaming_seconds=max_streaming_seconds,
            )
        )
        self.updated = await self._expect(SessionUpdated)
        return self.updated

    async def _expect(self, kind: type[_Expected]) -> _Expected:
        event = await self.receive()
        if isinstance(event, ErrorEvent):
            raise _error_exception(event)
        if not isinstance(event, kind):
            raise ProtocolViolation(f"expected {kind.__name__}, got {event.raw.get('type')!r}")
        return event

    async def append(self, pcm: npt.ArrayLike) -> None:
        """Send mono audio at :attr:`input_sample_rate`: int16 PCM, or float32 in [-1, 1]."""
        await self.send_raw(append_message(pcm, self.input_sample_rate))

    async def commit(self, pad_partial: bool = True) -> None:
        """No more audio: the server answers the rest and ends with ``response.done``."""
        await self.send_raw(commit_message(pad_partial))

    async def cancel(self) -> None:
        """Stop now: the server answers ``response.cancelled`` and closes."""
        await self.send_raw(CANCEL)

    async def ping(self) -> None:
        """Ask for a ``session.pong`` (answered even while the model runs)."""
        await self.send_raw(PING)

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await self.ws.aclose(code, reason)


def _error_exception(event: ErrorEvent) -> ServerError | ServerBusy:
    if event.code == "server_busy":
        return ServerBusy(f"server busy: {event.message}", event.message or None)
    return ServerError(event.code, event.message)


# --- resuming -------------------------------------------------------------------------

Opener = Callable[[str], Awaitable[trio_websocket.WebSocketConnection]]


class Link:
    """What a resumable session's client keeps across connections: the server's
    offer, the event count and its acks, the outbox of what it sent; and how it
    resumes (the rules are :mod:`realtime.client.resume`; this is their I/O)."""

    def __init__(
        self,
        url: str,
        opener: Opener,
        outbox: Outbox,
        connect_timeout: float,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.on_change = on_change
        """Told ``"reconnecting"`` when a drop is seen, ``"resumed"`` once it is over."""
        self.opener = opener
        self.outbox = outbox
        self.connect_timeout = connect_timeout
        self.counter = EventCounter(trio.current_time())
        self.offer: ResumeOffer | None = None
        self.resumes = 0

    async def counted(self, client: RealtimeClient, event: ServerEvent) -> bool:
        """Count a session event (and acknowledge when due); False for the link's own
        messages, which the caller never sees."""
        if isinstance(event, UnknownEvent) and event.type in LINK_EVENT_TYPES:
            if event.type == "session.resumable":
                self.offer = ResumeOffer.parse(event.raw)
            return False
        if isinstance(event, ErrorEvent) and event.code in LINK_ERROR_CODES:
            if event.code == "invalid_ack":
                return False  # the server keeps the events a little longer; no harm
            raise ResumeFailed(event.code, event.message)
        seq = self.counter.received(trio.current_time())
        if seq is not None and self.offer is not None:
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                await client.ws.send_message(ack_message(seq))  # a drop shows on receive
        return True

    async def resume(self, client: RealtimeClient) -> None:
        """Reconnect with backoff until the session is resumed on a new connection and
        everything the server had not taken is sent again; then swap it in."""
        offer = self.offer
        assert offer is not None
        if self.on_change is not None:
            self.on_change("reconnecting")
        deadline = trio.current_time() + offer.grace_seconds
        url = resume_url(self.url, offer.replica)
        last = "no try yet"
        attempt = 0
        while True:
            wait = backoff(attempt)
            if trio.current_time() + wait >= deadline:
                raise ResumeExpired(offer.grace_seconds, attempt, last)
            await trio.sleep(wait)
            attempt += 1
            try:
                with trio.fail_after(min(self.connect_timeout, deadline - trio.current_time())):
                    ws = await self.opener(url)
            except trio.TooSlowError:
                last = "timed out"
                continue
            except (ServerUnreachable, BusyUpgrade) as exc:
                last = str(exc)
                continue
            except UpgradeRejected as exc:
                if exc.status not in (429, 502, 504):
                    raise
                last = str(exc)
                continue
            try:
                if await self._resumed_on(client, ws, offer):
                    if self.on_change is not None:
                        self.on_change("resumed")
                    return
                last = "the new connection dropped too"
            except BaseException:
                await _abandon(ws)
                raise
            await _abandon(ws)

    async def _resumed_on(
        self, client: RealtimeClient, ws: trio_websocket.WebSocketConnection, offer: ResumeOffer
    ) -> bool:
        """One resume on the new connection ``ws``: True once it is the client's."""
        try:
            with trio.fail_after(RESUME_ANSWER_SECONDS):
                await ws.send_message(resume_message(offer, self.counter.seq))
                answer = parse_event(await ws.get_message())
        except (trio_websocket.ConnectionClosed, trio.TooSlowError):
            return False
        if isinstance(answer, ErrorEvent):
            if answer.code == "server_busy":
                return False
            if answer.code in LINK_ERROR_CODES:
                raise ResumeFailed(answer.code, answer.message)
            raise ServerError(answer.code, answer.message)
        resumed = Resumed.parse(answer.raw) if isinstance(answer, UnknownEvent) else None
        if resumed is None or answer.raw.get("type") != "session.resumed":
            raise ProtocolViolation(f"expected session.resumed, got {str(answer.raw)[:200]}")
        if resumed.last_seq != self.counter.seq:
            raise ProtocolViolation(
                f"session.resumed says last_seq {resumed.last_seq}; "
                f"this client received {self.counter.seq}"
            )
        try:
            self.outbox.confirm(resumed.received)
        except InputLost as exc:
            raise ResumeFailed("input_lost", str(exc)) from None
        done = resumed.received
        try:
            # What the sender adds meanwhile (it fails on the old socket) joins in.
            while done < self.outbox.count:
                for number, message in self.outbox.since(done):
                    await ws.send_message(message)
                    done = number
        except trio_websocket.ConnectionClosed:
            return False
        client.ws = ws  # no wait since the last check: nothing sent is left behind
        self.resumes += 1
        return True


async def _abandon(ws: trio_websocket.WebSocketConnection) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
        await ws.aclose()


# --- connecting -----------------------------------------------------------------------


def auth_headers(api_key: str | None) -> list[tuple[bytes, bytes]]:
    """``Authorization: Bearer KEY`` for servers started with ``--api-key``."""
    return [(b"authorization", f"Bearer {api_key}".encode())] if api_key else []


def _summarise_body(body: bytes | None) -> str:
    """A rejection body in one short line: a JSON error becomes its message, an HTML
    page its title."""
    text = (body or b"").decode("utf-8", "replace").strip()
    lower = text.lower()
    if text.startswith("{"):
        try:
            err = json.loads(text).get("error")
            text = str(err.get("message") or err.get("code") or text)
        except (ValueError, AttributeError):
            pass
    elif "<html" in lower or "<!doctype" in lower:
        start, end = lower.find("<title>"), lower.find("</title>")
        text = text[start + 7 : end].strip() if 0 <= start < end else "an HTML page"
    return " ".join(text.split())[:200]


ENDPOINT_HINT: Final = "the endpoint is ws://HOST:PORT/v1/realtime"

_REJECTION_HINTS: Final = {
    400: f"no WebSocket endpoint at this path: {ENDPOINT_HINT}",
    401: "the server needs an API key: pass --api-key KEY (or api_key=)",
    403: "the server refused this client (Origin not allowed? see --allowed-origin)",
    404: f"nothing at this path: {ENDPOINT_HINT}",
}
"""What to do about a refused upgrade, by status; any other status gets
:data:`OTHER_REJECTION_HINT`."""

OTHER_REJECTION_HINT: Final = f"check the URL and the server's log ({ENDPOINT_HINT})"


def _without_retry_hint(text: str) -> str:
    """``text`` less its clauses that say when to retry (a balancer's 503 page says
    "try again in a few seconds"): the client adds the one hint it knows best."""
    clauses = [c.strip() for c in text.split(";")]
    kept = [c for c in clauses if c and not c.lower().startswith(("try again", "retry"))]
    return "; ".join(kept)


def retry_after(headers: Sequence[tuple[bytes, bytes]]) -> float | None:
    """The ``Retry-After`` header as seconds (``None``: absent, or an HTTP date)."""
    for name, value in headers:
        if name.lower() == b"retry-after":
            try:
                seconds = float(value.decode("ascii").strip())
            except (UnicodeDecodeError, ValueError):
                return None
            return seconds if 0 <= seconds < 86_400 else None
    return None


def _rejected(url: str, exc: trio_websocket.ConnectionRejected) -> UpgradeRejected:
    status = exc.status_code
    body = _summarise_body(exc.body)
    if status == 503:
        wait = retry_after(exc.headers or ())
        hint = f"try again in {wait:g} s" if wait is not None else "try again later"
        said = _without_retry_hint(body)
        said = f": {said}" if said else ""
        return BusyUpgrade(status, body, f"server busy (HTTP 503 at {url}){said}; {hint}", wait)
    parts = [f"server rejected the WebSocket upgrade at {url}: HTTP {status}"]
    parts += [p for p in (body, _REJECTION_HINTS.get(status, OTHER_REJECTION_HINT)) if p]
    kind = {401: Unauthorized, 403: Forbidden}.get(status, UpgradeRejected)
    return kind(status, body, "; ".join(parts))


def _unreachable(url: str, exc: BaseException) -> ServerUnreachable:
    cause = exc.__cause__ if isinstance(exc, trio_websocket.HandshakeError) else exc
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        why = "timed out"
    elif isinstance(cause, OSError):
        why = cause.strerror or str(cause)
    else:
        why = str(cause or exc) or type(exc).__name__
    return ServerUnreachable(f"cannot connect to {url}: {why}")


def check_url(url: str) -> None:
    """Raise :class:`BadURL` unless ``url`` is a ``ws://`` or ``wss://`` URL with a host:
    what :func:`connect` checks first, for a client to check before it opens anything
    else (audio devices, files)."""
    if not url.startswith(("ws://", "wss://")):
        hint = " (the WebSocket URL is ws://HOST:PORT/v1/realtime)" if "://" in url else ""
        raise BadURL(f"URL must start with ws:// or wss://, got {url!r}{hint}")
    if not urllib.parse.urlsplit(url).hostname:
        raise BadURL(f"URL has no host: {url!r} (ws://HOST:PORT/v1/realtime)")


@attrs.frozen(slots=True)
class _Settings:
    """How :func:`connect` opens each of a session's connections."""

    headers: list[tuple[bytes, bytes]]
    subprotocols: Sequence[str] | None
    connect_timeout: float
    disconnect_timeout: float
    message_queue_size: int
    receive_buffer_size: int


async def _hold(
    url: str,
    settings: _Settings,
    *,
    task_status: trio.TaskStatus[trio_websocket.WebSocketConnection] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open a WebSocket to ``url`` and hand it to the starter, then keep it (its reader
    task) until cancelled. Every way it can fail to open is a :class:`ClientError`
    raised to the starter; once open, how it ends is the connection's own news."""
    started = False
    try:
        async with trio_websocket.open_websocket_url(
            url,
            subprotocols=settings.subprotocols,
            extra_headers=settings.headers,
            message_queue_size=settings.message_queue_size,
            receive_buffer_size=settings.receive_buffer_size,
            max_message_size=MAX_MESSAGE_SIZE,
            connect_timeout=settings.connect_timeout,
            disconnect_timeout=settings.disconnect_timeout,
        ) as ws:
            task_status.started(ws)
            started = True
            await trio.sleep_forever()
    except trio_websocket.ConnectionRejected as exc:
        if not started:
            raise _rejected(url, exc) from None
    except (trio_websocket.HandshakeError, OSError) as exc:
        if not started:
            raise _unreachable(url, exc) from None
    except ValueError as exc:  # a URL trio-websocket cannot parse
        if not started:
            raise BadURL(f"bad WebSocket URL {url!r}: {exc}") from None


def _one_error(
    group: BaseExceptionGroup[BaseException], raised: BaseException | None
) -> BaseException:
    """What :func:`connect`'s nursery ends with, as one exception: the body's own
    (``raised``) when there is one; its tasks never fail but by cancellation."""
    if raised is not None:
        return raised
    others = [e for e in group.exceptions if not isinstance(e, trio.Cancelled)]
    if len(others) == 1:
        return others[0]
    return group if others else group.exceptions[0]


@asynccontextmanager
async def connect(
    url: str,
    *,
    api_key: str | None = None,
    origin: str | None = None,
    raise_errors: bool = True,
    subprotocols: Sequence[str] | None = None,
    connect_timeout: float = 30.0,
    disconnect_timeout: float = 5.0,
    message_queue_size: int = 256,
    receive_buffer_size: int = 65536,
    resume: bool = True,
    outbox_max_bytes: int = OUTBOX_MAX_BYTES,
    outbox_max_seconds: float = OUTBOX_MAX_SECONDS,
    on_link: Callable[[str], None] | None = None,
) -> AsyncIterator[RealtimeClient]:
    """Open ``url`` (``ws://HOST:PORT/v1/realtime``) and yield a :class:`RealtimeClient`.

    Every way the opening can fail becomes a :class:`ClientError` subclass:
    :class:`BadURL`, :class:`ServerUnreachable`, :class:`Unauthorized`,
    :class:`Forbidden`, :class:`BusyUpgrade` (HTTP 503: a :class:`ServerBusy`) or
    :class:`UpgradeRejected`.

    With ``resume`` (the default) the session is asked to be resumable
    (``resumable=1``): where the server offers it, a dropped connection is resumed
    within the server's grace period without the caller seeing it (the client keeps
    what it sent, up to ``outbox_max_bytes`` and ``outbox_max_seconds``, to send it
    again). A server that offers nothing is served as without it. ``on_link`` is told
    ``"reconnecting"`` when a drop is seen and ``"resumed"`` when it is over (a
    terminal client says so).
    """
    check_url(url)
    headers = auth_headers(api_key)
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    settings = _Settings(
        headers,
        subprotocols,
        connect_timeout,
        disconnect_timeout,
        message_queue_size,
        receive_buffer_size,
    )
    raised: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:

                async def opener(target: str) -> trio_websocket.WebSocketConnection:
                    ws: trio_websocket.WebSocketConnection = await nursery.start(
                        _hold, target, settings
                    )
                    return ws

                link = None
                if resume:
                    outbox = Outbox(outbox_max_bytes, outbox_max_seconds)
                    link = Link(url, opener, outbox, connect_timeout, on_link)
                ws = await opener(resumable_url(url) if resume else url)
                client = RealtimeClient(ws, raise_errors=raise_errors, link=link)
                try:
                    yield client
                finally:
                    # The session is over; a slow close handshake is not the user's error.
                    with trio.CancelScope(shield=True), trio.move_on_after(disconnect_timeout):
                        await client.ws.aclose()
            except BaseException as exc:
                raised = exc
                raise
            finally:
                nursery.cancel_scope.cancel()  # the readers of every connection opened
    except BaseExceptionGroup as group:
        raise _one_error(group, raised) from None
