"""What the red team sent, as functions: each one attack on a server at HOST:PORT.

Plain sockets and wsproto, so the bytes are exactly the attack's (a WebSocket library
would wait for the 101 before it sends a frame, and would answer a close politely).
"""

from __future__ import annotations

import base64
import os
import socket
import struct

import trio
from wsproto.events import CloseConnection

from tests.reliability.rawws import RawClient


def upgrade_request(port: int, path: str = "/v1/realtime", headers: str = "") -> bytes:
    """A WebSocket upgrade request as one block of bytes."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n"
        f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
        f"{headers}\r\n"
    ).encode()


def raw_frame(
    opcode: int, payload: bytes, *, masked: bool = True, rsv: int = 0, fin: bool = True
) -> bytes:
    """One WebSocket frame, built by hand (to break the protocol on purpose)."""
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head += bytes([mask_bit | length])
    else:
        head += bytes([mask_bit | 126]) + struct.pack("!H", length)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def early_data(port: int, path: str, extra: bytes, headers: str = "") -> bytes:
    """The upgrade request and ``extra`` in one write; what the server answered
    (b"" if it closed without a word)."""
    with trio.socket.socket() as sock:
        await sock.connect(("127.0.0.1", port))
        await sock.send(upgrade_request(port, path, headers) + extra)
        answer = b""
        with trio.move_on_after(5):
            while True:
                try:
                    data = await sock.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                answer += data
                if b"\r\n\r\n" in answer:
                    break
        return answer


async def refused_then_gone(
    port: int, path: str, *, wait: bool, headers: dict[str, str] | None = None
) -> int | None:
    """Connect while the slot is held, and once the refusal's ``error`` event arrives
    send a close frame and close the socket at once (``wait``: wait for the server's
    close first). The HTTP status if the upgrade itself was refused."""
    client = await RawClient.connect("127.0.0.1", port, path=path, headers=headers)
    if client.rejected_status is not None:
        await client.aclose()
        return client.rejected_status
    try:
        event = await client.recv_json(timeout=10)
        assert event is None or event["type"] == "error", event
        await client.stream.send_all(client.ws.send(CloseConnection(code=1000)))
        if wait:
            with trio.move_on_after(2):
                await client.drain_to_close(timeout=2)
    except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
        pass
    finally:
        await client.aclose()
    return None


def socket_reset(sock: socket.socket) -> None:
    """Close with a TCP reset."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
