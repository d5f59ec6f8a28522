"""A bare WebSocket client for fault tests: it reads only when told to, and can reset.

trio-websocket reads in a background task; these tests need a peer that really
stops reading (so the server's writes block) or vanishes with a TCP reset.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Message,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)


def open_descriptors() -> int:
    """How many descriptors this process has open (Linux and macOS)."""
    return len(os.listdir("/dev/fd")) - 1  # the listing's own


class RawClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[Event] = []
        self.rejected_status: int | None = None
        self.rejected_body = b""

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        headers: dict[str, str] | None = None,
        receive_buffer: int | None = None,
        host_header: str | None = None,
        path: str = "/v1/realtime",
    ) -> RawClient:
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        if receive_buffer is not None:
            # Small before connecting, so the advertised window stays small.
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
        await sock.connect((host, port))
        client = cls(trio.SocketStream(sock))
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await client._send(
            Request(
                host=host_header or f"{host}:{port}",
                target=path,
                extra_headers=extra,
                subprotocols=["realtime"],
            )
        )
        with trio.fail_after(10):
            while True:
                events = await client._read()
                for n, event in enumerate(events):
                    if isinstance(event, AcceptConnection):
                        client.events.extend(events[n + 1 :])  # what came with the 101
                        return client
                    if isinstance(event, RejectConnection):
                        client.rejected_status = event.status_code
                        if not event.has_body:
                            return client
                    elif isinstance(event, RejectData):
                        client.rejected_body += bytes(event.data)
                        if event.body_finished:
                            return client

    async def _send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def _read(self) -> list[Event]:
        """What the next read brings; EOFError when the server has gone."""
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise EOFError from None
        if not data:
            raise EOFError
        self.ws.receive_data(bytes(data))
        return list(self.ws.events())

    async def send_json(self, message: dict[str, Any] | str) -> None:
        text = message if isinstance(message, str) else json.dumps(message)
        await self._send(Message(data=text))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(Message(data=data))

    async def recv_json(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The next text event, or None once the server closed (``close_code`` says how:
        None when the connection ended without a close frame)."""
        buffer = ""
        with trio.fail_after(timeout):
            while True:
                while self.events:
                    event = self.events.pop(0)
                    if isinstance(event, CloseConnection):
                        self.close_code = event.code
                        return None
                    if isinstance(event, TextMessage):
                        buffer += event.data
                        if event.message_finished:
                            parsed: dict[str, Any] = json.loads(buffer)
                            return parsed
                try:
                    self.events.extend(await self._read())
                except EOFError:
                    return None

    close_code: int | None = None

    async def recv_until(self, type_: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        with trio.fail_after(timeout):
            while True:
                event = await self.recv_json(timeout)
                if event is None:
                    raise AssertionError(f"closed before {type_}: {seen[-3:]}")
                seen.append(event)
                if event["type"] == type_:
                    return seen

    async def drain_to_close(self, timeout: float = 10.0) -> int | None:
        with trio.fail_after(timeout):
            while await self.recv_json(timeout) is not None:
                pass
        return self.close_code

    def reset(self) -> None:
        """Vanish: close with a TCP reset (no close frame, no FIN)."""
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.stream.socket.close()

    async def aclose(self) -> None:
        await self.stream.aclose()
