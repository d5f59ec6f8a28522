"""A resuming client for the tests: it counts the server's numbered events, keeps what
it sent, drops its TCP connection on demand and resumes as docs/resume.md says."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlsplit

import trio
from wsproto.events import CloseConnection

from tests.reliability.rawws import RawClient

LINK_ERRORS = ("resume_failed", "resync_required", "invalid_ack", "session_replaced")
"""The codes of the link's own ``error`` events: not numbered."""
AUDIO_TYPES = ("response.audio.delta", "response.output_audio.delta")


class Resuming:
    """One conversation over one or more connections (``path``: the endpoint's path
    with its query, without the resume parameters)."""

    def __init__(self, http: str, path: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(http)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = path
        self.headers = headers or {}
        self.raw: RawClient | None = None
        self.sent: list[str] = []
        """Every client message of the conversation (acks excluded), in order."""
        self.seen = 0
        """Numbered events received."""
        self.events: list[dict[str, Any]] = []
        self.resumable: dict[str, Any] | None = None
        self.resumed: dict[str, Any] | None = None
        self.link_errors: list[str] = []

    def _url(self, query: str) -> str:
        return self.path + ("&" if "?" in self.path else "?") + query

    @property
    def ws(self) -> RawClient:
        assert self.raw is not None
        return self.raw

    async def open(
        self, query: str = "resumable=1", receive_buffer: int | None = None
    ) -> RawClient:
        self.raw = await RawClient.connect(
            self.host,
            self.port,
            path=self._url(query),
            headers=self.headers,
            receive_buffer=receive_buffer,
        )
        return self.raw

    async def recv(self, timeout: float = 10.0) -> dict[str, Any] | None:
        event = await self.ws.recv_json(timeout)
        if event is None:
            return None
        if event["type"] == "session.resumable":
            self.resumable = event
        elif event["type"] == "session.resumed":
            self.resumed = event
        elif event["type"] == "error" and event["error"].get("code") in LINK_ERRORS:
            self.link_errors.append(event["error"]["code"])
        else:
            self.seen += 1
            self.events.append(event)
        return event

    async def until(self, type_: str, timeout: float = 10.0) -> dict[str, Any]:
        while True:
            event = await self.recv(timeout)
            if event is None:
                raise AssertionError(f"closed before {type_} ({self.ws.close_code})")
            if event["type"] == type_:
                return event

    async def send(self, message: dict[str, Any] | str) -> None:
        text = message if isinstance(message, str) else json.dumps(message)
        self.sent.append(text)
        await self.ws.send_json(text)

    async def ack(self, seq: int | None = None) -> None:
        await self.ws.send_json(
            {"type": "session.event_ack", "seq": self.seen if seq is None else seq}
        )

    async def close(self, code: int = 1000) -> int | None:
        """Hang up (a close frame): the session ends; the server's close code."""
        try:
            await self.ws._send(CloseConnection(code=code))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        return await self.ws.drain_to_close()

    def drop(self) -> None:
        """Vanish mid-conversation: a TCP reset, no close frame."""
        self.ws.reset()

    async def resume(self, last_seq: int | None = None, token: str | None = None) -> dict[str, Any]:
        """Reconnect with ``?resume=1``, resume, and re-send what the server did not
        take; the server's first answer (``session.resumed`` or an ``error``)."""
        assert self.resumable is not None
        replica = self.resumable.get("replica")
        query = "resume=1" + (f"&replica={replica}" if replica else "")
        await self.open(query)
        await self.ws.send_json(
            {
                "type": "session.resume",
                "token": token or self.resumable["token"],
                "last_seq": self.seen if last_seq is None else last_seq,
            }
        )
        answer = await self.ws.recv_json()
        assert answer is not None, self.ws.close_code
        if answer["type"] != "session.resumed":
            return answer
        self.resumed = answer
        for text in self.sent[answer["received"] :]:
            await self.ws.send_json(text)
        return answer

    def audio(self) -> bytes:
        """Every output audio byte received, in order."""
        out = b""
        for event in self.events:
            if event["type"] in AUDIO_TYPES:
                out += base64.b64decode(event["delta"])
        return out
