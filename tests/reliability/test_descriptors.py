"""§4: connections the server is done with give their descriptors back.

The server runs in this process, so the count below is the server's descriptors
plus the test clients' own sockets; each scenario ends with the count back at its
baseline plus exactly those client sockets, then at the baseline once they close.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from realtime.engine.facade import Engine
from realtime.launch.server import KEEP_ALIVE_SECONDS
from tests.helpers import running_server
from tests.reliability.rawws import open_descriptors

CLIENTS = 100
"""Enough to see a leak plainly; the issue saw 200 held for over a minute."""
GUARD = KEEP_ALIVE_SECONDS + 10.0
"""Failure guard: Hypercorn's keep-alive timeout plus slack for a loaded machine."""


async def settles(check: Callable[[], bool], timeout: float = GUARD) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.1)


async def open_clients(port: int, request: bytes | None) -> list[trio.SocketStream]:
    clients = []
    for _ in range(CLIENTS):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if request is not None:
            await stream.send_all(request)
        clients.append(stream)
    return clients


async def read_response(stream: trio.SocketStream) -> bytes:
    """Everything up to the server's end of the connection (FIN)."""
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def given_back(clients: list[trio.SocketStream], baseline: int) -> None:
    """The server's side of every client goes while the clients still hold theirs;
    once they close theirs too, the count is back at ``baseline``."""
    await settles(lambda: open_descriptors() <= baseline + len(clients))
    for stream in clients:
        await stream.aclose()
    await settles(lambda: open_descriptors() <= baseline)


def port_of(http: str) -> int:
    return int(http.rsplit(":", 1)[1])


async def test_connection_close_clients_that_never_close(engine: Engine) -> None:
    async with running_server(engine) as server:
        port = port_of(server.http)
        baseline = open_descriptors()
        request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        clients = await open_clients(port, request.encode())
        for stream in clients:
            assert (await read_response(stream)).startswith(b"HTTP/1.1 200")
        # The clients keep their sockets open; the server's side must be gone.
        await given_back(clients, baseline)


async def test_idle_keep_alive_and_silent_clients_are_closed(engine: Engine) -> None:
    async with running_server(engine) as server:
        port = port_of(server.http)
        baseline = open_descriptors()
        request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        kept = await open_clients(port, request)  # keep-alive, then nothing more
        silent = await open_clients(port, None)  # connect and never send a byte
        partial = await open_clients(port, b"GET /health HTTP/1.1\r\nHo")  # slowloris
        for stream in kept:
            with trio.fail_after(10):
                assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200")
        clients = kept + silent + partial
        # Hypercorn closes each after its keep-alive timeout: each client sees EOF.
        for stream in clients:
            with trio.fail_after(GUARD):
                while await stream.receive_some(65536):
                    pass
        await given_back(clients, baseline)


async def test_reset_websocket_clients_leave_nothing_behind(engine: Engine) -> None:
    """Abrupt TCP resets mid-session: the slot and every descriptor come back."""
    from tests.reliability.rawws import RawClient

    async with running_server(engine) as server:
        port = port_of(server.http)
        baseline = open_descriptors()
        for _ in range(20):
            client = await RawClient.connect("127.0.0.1", port)
            assert (await client.recv_json() or {})["type"] == "session.created"
            await client.send_json({"type": "session.update", "session": {}})
            client.reset()
            with trio.fail_after(5):
                while engine.is_reserved() or server.state.connections:
                    await trio.sleep(0.01)
        await settles(lambda: open_descriptors() <= baseline)
    assert not engine.is_reserved()
