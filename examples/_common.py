"""Shared pieces of the example clients: connect, configure, encode, check and print.

Both ``voicechat_file_client.py`` and ``voicechat_microphone.py`` speak the same
``/v1/realtime`` protocol (see docs/nemotron-voicechat.md); everything they have in
common lives here so the two scripts differ only in where audio comes from and goes.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt
import trio_websocket

from realtime.models.base import (
    FRAME_SAMPLES,
    INPUT_SAMPLE_RATE,
    OUTPUT_FRAME_SAMPLES,
    OUTPUT_SAMPLE_RATE,
    Samples,
)

PCM16 = npt.NDArray[np.int16]
Event = dict[str, Any]

FRAME_SECONDS = FRAME_SAMPLES / INPUT_SAMPLE_RATE
"""80 ms: the model's step and the cadence at which live clients send audio."""

TEXT_EVENTS = {
    "conversation.item.input_audio_transcription.delta": "user",
    "response.text.delta": "assistant",
    "response.function.delta": "function",
}
"""Wire event type -> the channel label the clients print (``[user] ...``)."""

CLOSE_CODE_NAMES = {
    1000: "normal closure",
    1001: "going away",
    1008: "policy violation (timeout or limit)",
    1009: "message too big",
    1011: "server error",
    1013: "server busy, try again later",
}


class ClientError(Exception):
    """A failure the user should see as one line; the scripts exit 1 with it."""


class ServerError(ClientError):
    """The server sent an ``error`` event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.server_message = message


class ServerClosed(ClientError):
    """The server closed the WebSocket before the client was done."""

    def __init__(self, code: int | None, reason: str | None, *, context: str) -> None:
        name = CLOSE_CODE_NAMES.get(code or 0, "")
        detail = f"code {code}" + (f" ({name})" if name else "")
        if reason:
            detail += f": {reason}"
        super().__init__(f"server closed the connection {context} [{detail}]")
        self.code = code
        self.reason = reason


def auth_headers(api_key: str | None) -> list[tuple[bytes, bytes]]:
    """``Authorization: Bearer KEY`` for servers started with ``--api-key``."""
    if not api_key:
        return []
    return [(b"authorization", f"Bearer {api_key}".encode())]


def describe_rejection(url: str, exc: trio_websocket.HandshakeError) -> str:
    """Turn a failed upgrade into advice (401 usually means a missing or wrong key)."""
    if isinstance(exc, trio_websocket.ConnectionRejected):
        status = exc.status_code
        body = (exc.body or b"").decode("utf-8", "replace").strip()
        hint = {
            401: "the server needs an API key: pass --api-key KEY",
            403: "the server refused this client (Origin not allowed?)",
            404: "no /v1/realtime here: is this a realtime server and the right path?",
        }.get(status, "")
        parts = [f"server rejected the WebSocket upgrade at {url}: HTTP {status}"]
        if body:
            parts.append(body[:200])
        if hint:
            parts.append(hint)
        return "; ".join(parts)
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError):  # trio-websocket wraps a refused TCP connect
        return f"cannot connect to {url}: {cause.strerror or cause}"
    return f"WebSocket handshake with {url} failed: {cause or exc!r}"


@asynccontextmanager
async def connect(
    url: str,
    *,
    api_key: str | None = None,
    connect_timeout: float = 30.0,
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """Open the WebSocket with auth, mapping every way it can fail to a ClientError."""
    if not url.startswith(("ws://", "wss://")):
        raise ClientError(f"URL must start with ws:// or wss://, got {url!r}")
    try:
        async with trio_websocket.open_websocket_url(
            url,
            extra_headers=auth_headers(api_key),
            connect_timeout=connect_timeout,
            disconnect_timeout=5.0,
            max_message_size=16 * 1024 * 1024,
        ) as ws:
            yield ws
    except trio_websocket.HandshakeError as exc:
        raise ClientError(describe_rejection(url, exc)) from None
    except OSError as exc:
        raise ClientError(f"cannot connect to {url}: {exc.strerror or exc}") from None


def encode_pcm16(pcm: PCM16) -> str:
    """Base64 of little-endian PCM16, the wire encoding of both directions."""
    return base64.b64encode(np.asarray(pcm, dtype="<i2").tobytes()).decode("ascii")


def decode_pcm16(data: str) -> PCM16:
    """Inverse of :func:`encode_pcm16`; bad payloads are the server's fault."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ClientError(f"server sent invalid base64 audio: {exc}") from None
    if len(raw) % 2:
        raise ClientError(f"server sent an odd audio byte count ({len(raw)})")
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


def session_update(system_prompt: str | None, seed: int) -> Event:
    session: dict[str, Any] = {"seed": seed}
    if system_prompt is not None:
        session["system_prompt"] = system_prompt
    return {"type": "session.update", "session": session}


def append_message(pcm: PCM16) -> Event:
    return {
        "type": "input_audio_buffer.append",
        "audio": encode_pcm16(pcm),
        "sample_rate": INPUT_SAMPLE_RATE,
    }


def commit_message(pad_partial: bool = True) -> Event:
    return {"type": "input_audio_buffer.commit", "pad_partial": pad_partial}


def redact_audio(event: Event) -> Event:
    """A copy fit for a log: base64 audio replaced by its sample count."""
    if event.get("type") != "response.audio.delta" or not isinstance(event.get("delta"), str):
        return event
    out = dict(event)
    out["delta"] = len(base64.b64decode(event["delta"])) // 2
    return out


class Session:
    """A configured ``/v1/realtime`` connection: typed receive and send helpers."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.created: Event | None = None
        self.updated: Event | None = None

    async def send(self, message: Event) -> None:
        await self.ws.send_message(json.dumps(message, separators=(",", ":")))

    async def receive(self, *, context: str = "before response.done") -> Event:
        """The next event; raises ServerError / ServerClosed instead of returning them."""
        try:
            raw = await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            reason = exc.reason
            raise ServerClosed(
                reason.code if reason else None, reason.reason if reason else None, context=context
            ) from None
        if isinstance(raw, bytes):
            raise ClientError(f"server sent a binary message ({len(raw)} bytes)")
        try:
            event = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ClientError(f"server sent invalid JSON: {exc}") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ClientError(f"server sent a message without a type: {raw[:200]}")
        if event["type"] == "error":
            err = event.get("error") or {}
            raise ServerError(str(err.get("code", "unknown")), str(err.get("message", "")))
        return event

    async def configure(
        self,
        system_prompt: str | None,
        seed: int,
        *,
        on_event: Callable[[Event], None] | None = None,
    ) -> Event:
        """Send ``session.update`` and wait for ``session.updated`` (and ``session.created``)."""
        await self.send(session_update(system_prompt, seed))
        while True:
            event = await self.receive(context="before session.updated")
            if on_event is not None:
                on_event(event)
            if event["type"] == "session.created":
                self.created = event
            elif event["type"] == "session.updated":
                self.updated = event
                return event
            else:
                raise ClientError(f"unexpected {event['type']!r} before session.updated")


class AudioDeltaChecker:
    """Checks the audio contract: 1764-sample frames with increasing ``frame_index``."""

    def __init__(self) -> None:
        self.frames = 0
        self.last_frame_index: int | None = None

    def check(self, event: Event) -> PCM16:
        pcm = decode_pcm16(str(event.get("delta", "")))
        index = event.get("frame_index")
        if not isinstance(index, int):
            raise ClientError(f"response.audio.delta without an integer frame_index: {index!r}")
        if self.last_frame_index is not None and index <= self.last_frame_index:
            raise ClientError(
                f"audio frame_index went from {self.last_frame_index} to {index} (must increase)"
            )
        if pcm.size != OUTPUT_FRAME_SAMPLES:
            raise ClientError(
                f"audio frame {index} has {pcm.size} samples, expected {OUTPUT_FRAME_SAMPLES}"
            )
        if event.get("sample_rate", OUTPUT_SAMPLE_RATE) != OUTPUT_SAMPLE_RATE:
            raise ClientError(f"audio frame {index} is at {event.get('sample_rate')} Hz")
        self.last_frame_index = index
        self.frames += 1
        return pcm


class TranscriptPrinter:
    """Prints text deltas live, one ``[channel] ...`` line per run of the same channel.

    The model interleaves user transcript, assistant text and the function channel
    frame by frame; starting a new line on each switch keeps them readable.
    """

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.channel: str | None = None
        self.texts: dict[str, str] = {"user": "", "assistant": "", "function": ""}

    def feed(self, event: Event) -> None:
        channel = TEXT_EVENTS.get(str(event.get("type")))
        if channel is None:
            return
        delta = str(event.get("delta", ""))
        self.texts[channel] += delta
        if not delta:
            return
        if channel != self.channel:
            if self.channel is not None:
                self.out.write("\n")
            self.out.write(f"[{channel}] ")
            self.channel = channel
        self.out.write(delta.replace("\n", " "))
        self.out.flush()

    def finish(self) -> None:
        if self.channel is not None:
            self.out.write("\n")
            self.out.flush()
            self.channel = None


class FrameFramer:
    """Cuts a stream of PCM16 chunks into 1280-sample frames (the model's 80 ms step)."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: PCM16) -> list[PCM16]:
        data = np.concatenate([self._pending, np.asarray(pcm, dtype=np.int16)])
        whole = data.size // FRAME_SAMPLES * FRAME_SAMPLES
        frames = [data[i : i + FRAME_SAMPLES] for i in range(0, whole, FRAME_SAMPLES)]
        self._pending = data[whole:]
        return frames

    def flush(self) -> PCM16:
        """The partial frame left over (the server pads it on commit)."""
        rest, self._pending = self._pending, np.zeros(0, dtype=np.int16)
        return rest


class StreamResampler:
    """Chunk-by-chunk resampling without clicks at chunk edges.

    ``realtime.audio.resample`` resamples a whole signal at once; a live stream
    arrives in 80 ms pieces and resampling each piece alone would put an edge
    artefact every 80 ms, so this keeps soxr's filter state between chunks.
    """

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream: Any = None
        if from_rate != to_rate:
            import soxr

            self._stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32")

    def process(self, samples: Samples, *, last: bool = False) -> Samples:
        x = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return x
        out = self._stream.resample_chunk(x, last=last)
        return np.asarray(out, dtype=np.float32)
