"""The benchmark's own client parts on top of :mod:`realtime.client`: test audio,
pre-encoded messages, receive timestamps, busy retries, a raw client that can drop
its TCP stream, and a tiny HTTP GET.

The same client talks to this project's server and to mlx-vlm's, so the only
dialect difference is ``session.model`` (which mlx-vlm requires).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
import trio
import wsproto
import wsproto.events

from realtime import client as rc
from realtime.client import CANCEL, PING, append_message, commit_message, decode_pcm16
from realtime.demo.turns import SILENT_DB, frame_energy_db
from realtime.models.base import ModelFigures

__all__ = ["CANCEL", "PING", "append_message"]

AUDIO_DELTA: Final = "response.audio.delta"
COMMIT: Final = commit_message()

Int16 = npt.NDArray[np.int16]
Float32 = npt.NDArray[np.float32]


class BenchError(Exception):
    """A server answered something the benchmark cannot measure through."""


def test_pcm(samples: int, seed: int = 0) -> Int16:
    """Deterministic noise as PCM16: every row feeds the model the same input."""
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal(samples) * 0.1, -1.0, 1.0)
    return np.rint(x * 32767).astype(np.int16)


def speech_pcm(samples: int, rate: int, seed: int = 0) -> Int16:
    """Deterministic speech-like PCM16: a voiced tone (harmonics of a wandering pitch)
    whose loudness rises and falls a few times a second, as syllables do, with a little
    noise. A turn detector hears it as speech (white noise, being steady, it takes for
    the room's noise); ``seed`` moves the pitch and the syllables' phase."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / rate
    pitch = 110.0 + 40.0 * rng.random() + 30.0 * np.sin(2 * np.pi * 0.6 * t + rng.random() * 6)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    syllables = (0.5 + 0.5 * np.sin(2 * np.pi * 3.5 * t + rng.random() * 6)) ** 2
    x = 0.2 * voice * syllables + 0.005 * rng.standard_normal(samples)
    return np.rint(np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


def audio_level_db(event: dict[str, Any]) -> float:
    """An audio delta's level in dBFS (the demo's turn policy's measure; -100 for
    digital silence)."""
    pcm = decode_pcm16(event["delta"])
    return frame_energy_db(pcm_to_float(pcm)) if pcm.size else SILENT_DB


def pcm_to_float(pcm: Int16) -> Float32:
    """What the servers feed the model: PCM16 ``/ 32768``."""
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def figures_for(path: Path | None) -> ModelFigures:
    """The figures of the model a server will serve: the checkpoint's (read from its
    config, no weights loaded), or the zero-cost model's for ``None``. Audio is
    encoded before any server is up, so they are needed first."""
    if path is None:
        from realtime.testing.fake import NullModel

        return NullModel().figures
    from realtime.models.voicechat.figures import checkpoint_figures

    return checkpoint_figures(path)


def frame_messages(pcm: Int16, figures: ModelFigures) -> list[str]:
    """One append per model step (the last may be short), encoded before any timing
    starts."""
    size, rate = figures.frame_samples, figures.input_sample_rate
    return [append_message(pcm[i : i + size], rate) for i in range(0, pcm.size, size)]


def update_message(model: str | None, seed: int = 0) -> str:
    return rc.session_update_message(model=model, seed=seed)


class Client:
    """Raw event dicts from a :class:`realtime.client.RealtimeClient`, with send and
    receive timestamps (``perf_counter`` just before a send, just as a message lands)."""

    def __init__(self, conn: rc.RealtimeClient, model: str | None) -> None:
        self.conn = conn
        self.model = model
        self.busy_retries = 0

    @property
    def session_id(self) -> str | None:
        return self.conn.created.session_id if self.conn.created is not None else None

    async def send(self, text: str) -> float:
        """Send one frame; the ``perf_counter`` taken just before it went out."""
        sent = time.perf_counter()
        await self.conn.send_raw(text)
        return sent

    async def recv(self) -> tuple[float, dict[str, Any]]:
        event = await self.conn.receive()
        return self.conn.received_at, event.raw

    async def expect(self, kind: str, within: float) -> dict[str, Any]:
        with trio.fail_after(within):
            _, event = await self.recv()
        if event.get("type") != kind:
            raise BenchError(f"expected {kind}, got {event}")
        return event

    async def configure(self, *, seed: int = 0, within: float = 180.0) -> None:
        """session.created (unless :func:`connect` read it), then session.update."""
        with trio.fail_after(within):
            await self.conn.configure(model=self.model, seed=seed)

    async def drain_until(self, kind: str, within: float) -> list[dict[str, Any]]:
        """Every event up to and including the first ``kind``."""
        events: list[dict[str, Any]] = []
        with trio.fail_after(within):
            while True:
                _, event = await self.recv()
                events.append(event)
                if event.get("type") == kind:
                    return events
                if event.get("type") == "error":
                    raise BenchError(f"server error while waiting for {kind}: {event}")


BUSY_RETRIES: Final = 500
BUSY_PAUSE: Final = 0.01


@asynccontextmanager
async def connect(url: str, model: str | None, *, retry_busy: bool = True) -> AsyncIterator[Client]:
    """A connection to ``url``. With ``retry_busy``, a ``server_busy`` refusal is
    retried (up to 5 s): a server may release its slot a moment after the previous
    session's last event (mlx-vlm's does), and the benchmark measures sessions, not
    that race. Without it the first event is left for the caller to read. Sessions are
    not resumable (``resume=False``): a benchmark measures the protocol every client
    gets, not the resume journal a client asks for (docs/resume.md), and mlx-vlm's
    peer takes the same URL."""
    busy = 0
    for _ in range(BUSY_RETRIES if retry_busy else 1):
        async with rc.connect(url, raise_errors=False, disconnect_timeout=10, resume=False) as conn:
            client = Client(conn, model)
            client.busy_retries = busy
            if not retry_busy:
                yield client
                return
            with trio.fail_after(60):
                first = await conn.receive()
            if isinstance(first, rc.SessionCreated):
                conn.created = first
                yield client
                return
            if not (isinstance(first, rc.ErrorEvent) and first.code == "server_busy"):
                raise BenchError(f"expected session.created, got {first.raw}")
            busy += 1
        await trio.sleep(BUSY_PAUSE)
    raise BenchError(f"{url} stayed busy for {BUSY_RETRIES * BUSY_PAUSE:g} s")


async def http_get_json(http: str, path: str, within: float = 10.0) -> tuple[int, Any]:
    """GET ``http + path`` over a fresh TCP connection; (status, parsed JSON body)."""
    status, body = await http_get(http, path, within, accept="application/json")
    return status, json.loads(body) if body else None


async def http_get(
    http: str, path: str, within: float = 10.0, *, accept: str = "*/*"
) -> tuple[int, bytes]:
    """GET ``http + path`` over a fresh TCP connection; (status, raw body).

    Reads exactly Content-Length bytes (or chunks): Hypercorn may keep the
    connection open after the response even when asked to close it.
    """
    parts = urlsplit(http)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    with trio.fail_after(within):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            request = (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Accept: {accept}\r\nConnection: close\r\n\r\n"
            )
            await stream.send_all(request.encode())
            raw = bytearray()
            while b"\r\n\r\n" not in raw:
                raw += await _receive(stream)
            head, _, body = bytes(raw).partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
            }
            if headers.get("transfer-encoding", "").lower() == "chunked":
                while not body.endswith(b"0\r\n\r\n"):
                    body += await _receive(stream)
                body = _dechunk(body)
            else:
                length = int(headers.get("content-length", "0"))
                while len(body) < length:
                    body += await _receive(stream)
    return status, body


async def _receive(stream: trio.SocketStream) -> bytes:
    data = await stream.receive_some(65536)
    if not data:
        raise BenchError("the server closed the connection mid-response")
    return bytes(data)


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


class RawClient:
    """A WebSocket client on wsproto over a bare TCP stream, so the benchmark can
    drop the connection the way a crashed client does: no close frame, just EOF."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self._text: list[str] = []
        self._ready: list[dict[str, Any]] = []
        self.accepted = False

    @classmethod
    async def open(cls, url: str) -> RawClient:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 80
        client = cls(await trio.open_tcp_stream(host, port))
        await client._send(wsproto.events.Request(host=f"{host}:{port}", target=parts.path))
        while not client.accepted:
            await client._pump()
        return client

    async def _send(self, event: wsproto.events.Event) -> None:
        await self.stream.send_all(self.conn.send(event))

    async def _pump(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise BenchError("server closed the TCP connection")
        self.conn.receive_data(data)
        for event in self.conn.events():
            if isinstance(event, wsproto.events.AcceptConnection):
                self.accepted = True
            elif isinstance(event, wsproto.events.RejectConnection):
                raise BenchError("WebSocket upgrade refused")
            elif isinstance(event, wsproto.events.TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    self._ready.append(json.loads("".join(self._text)))
                    self._text.clear()
            elif isinstance(event, wsproto.events.Ping):
                await self._send(event.response())
            elif isinstance(event, wsproto.events.CloseConnection):
                raise BenchError(f"server closed the WebSocket ({event.code})")

    async def send(self, text: str) -> None:
        await self._send(wsproto.events.Message(data=text))

    async def recv(self) -> dict[str, Any]:
        while not self._ready:
            await self._pump()
        return self._ready.pop(0)

    async def drop(self) -> None:
        """Close the TCP stream with no WebSocket close handshake."""
        await self.stream.aclose()
