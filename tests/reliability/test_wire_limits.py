"""The wire's bounds (realtime.http.guard, realtime.http.app), each reproducing a red-team attack.

Against the real app on Hypercorn on 127.0.0.1, in this trio run, with the fake model.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from realtime.engine.facade import Engine
from realtime.http.guard import (
    BUSY_RESPONSE,
    LOG_BURST,
    LOG_WINDOW_SECONDS,
    GuardedTCPServer,
    LogBudget,
    connection_bound,
    installed,
    split_errors,
)
from realtime.limits import Limits
from tests.helpers import Server, ahttp, running_server
from tests.reliability.attacks import raw_frame, upgrade_request
from tests.reliability.rawws import RawClient

# --- pure rules ---------------------------------------------------------------------


def test_the_connection_bound_leaves_a_reserve_and_three_descriptors_each() -> None:
    assert connection_bound(1024, 40) == (1024 - 40 - 64) // 3
    assert connection_bound(256, 40) == 50
    assert connection_bound(64, 60) == 8  # never below a handful


def test_a_log_budget_says_how_many_lines_it_left_out() -> None:
    budget = LogBudget()
    said = [budget.take(0.0) for _ in range(LOG_BURST + 3)]
    assert said == [0] * LOG_BURST + [None] * 3
    assert budget.take(LOG_WINDOW_SECONDS) == 3
    assert budget.take(LOG_WINDOW_SECONDS + 0.1) == 0


def test_split_errors_keeps_cancellation_and_interrupts_apart() -> None:
    boom = ValueError("x")
    assert split_errors(boom) == ([boom], None)
    interrupt = KeyboardInterrupt()
    assert split_errors(interrupt) == ([], interrupt)
    group = BaseExceptionGroup("g", [boom, ExceptionGroup("h", [TypeError("y")]), interrupt])
    errors, rest = split_errors(group)
    assert [type(e) for e in errors] == [ValueError, TypeError]
    assert isinstance(rest, BaseExceptionGroup) and rest.exceptions == (interrupt,)


def test_the_busy_answer_is_well_formed_http() -> None:
    head, _, body = BUSY_RESPONSE.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.startswith(b"content-length")
    )
    assert length == len(body)
    assert json.loads(body)["error"]["code"] == "connection_limit"


# --- on a server --------------------------------------------------------------------


@asynccontextmanager
async def served(engine: Engine, **limits: float) -> AsyncIterator[tuple[Server, int]]:
    async with running_server(engine, limits=Limits(**limits)) as server:  # type: ignore[arg-type]
        assert installed()
        yield server, int(server.http.rsplit(":", 1)[1])


async def _metric(server: Server, name: str) -> float:
    _, text = await ahttp("GET", server.http + "/metrics")
    body = text.decode() if isinstance(text, bytes) else str(text)
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the exposition")


async def _raw_http(port: int, request: bytes, *, read: bool = True) -> bytes:
    with trio.socket.socket() as sock:
        await sock.connect(("127.0.0.1", port))
        await sock.send(request)
        answer = b""
        with trio.fail_after(10):
            while read:
                data = await sock.recv(65536)
                if not data:
                    break
                answer += data
        return answer


async def _wait_free(engine: Engine) -> None:
    with trio.fail_after(10):
        while engine.is_reserved():
            await trio.sleep(0.01)


PROTOCOL_VIOLATIONS = [
    pytest.param(raw_frame(0x1, b"\xff\xfe not utf-8"), 1007, id="invalid-utf8"),
    pytest.param(raw_frame(0x1, b'{"type": "x"}', masked=False), 1002, id="unmasked"),
    pytest.param(raw_frame(0x3, b"reserved"), 1002, id="reserved-opcode"),
    pytest.param(raw_frame(0x9, b"p" * 126), 1002, id="control-frame-too-long"),
    pytest.param(raw_frame(0x1, b"{}", rsv=4), 1002, id="rsv1-without-deflate"),
]


@pytest.mark.parametrize(("frame", "code"), PROTOCOL_VIOLATIONS)
async def test_a_protocol_violation_gets_its_close_code(
    engine: Engine, frame: bytes, code: int
) -> None:
    async with served(engine) as (_, port):
        client = await RawClient.connect("127.0.0.1", port)
        created = await client.recv_json()
        assert created is not None and created["type"] == "session.created"
        await client.stream.send_all(frame)
        assert await client.drain_to_close(timeout=5) == code
        await client.aclose()
        await _wait_free(engine)


async def test_permessage_deflate_is_declined(engine: Engine) -> None:
    async with served(engine) as (_, port):
        offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", port))
            await sock.send(upgrade_request(port, headers=offer))
            with trio.fail_after(5):
                head = b""
                while b"\r\n\r\n" not in head:
                    head += await sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        assert b"sec-websocket-extensions" not in head.lower()
        await _wait_free(engine)


async def test_a_message_over_the_bound_ends_the_connection_after_1009(engine: Engine) -> None:
    """Hypercorn sent 1009 and then kept appending what the client sent (1:1 growth;
    with deflate, GBs) until the idle timeout."""
    async with served(engine, max_message_bytes=1024) as (server, port):
        client = await RawClient.connect("127.0.0.1", port)
        await client.recv_json()
        first = raw_frame(0x1, b"a" * 60000, fin=False)  # one message, in fragments
        more = raw_frame(0x0, b"a" * 60000, fin=False)
        await client.stream.send_all(first)
        sent = len(first)
        code = None
        with trio.fail_after(10):
            try:
                while sent < 64 * 1024 * 1024:
                    await client.stream.send_all(more)
                    sent += len(more)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            with trio.move_on_after(2):
                code = await client.drain_to_close(timeout=2)
        assert sent < 16 * 1024 * 1024, f"the server took {sent} bytes after its 1009"
        assert code in (1009, None)
        await client.aclose()
        await _wait_free(engine)
        status, _ = await ahttp("GET", server.http + "/health")
        assert status == 200


async def test_a_request_without_host_is_served(engine: Engine) -> None:
    """HTTP/1.0 without Host is what ``option httpchk GET /health`` sends."""
    async with served(engine) as (_, port):
        answer = await _raw_http(port, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") or answer.startswith(b"HTTP/1.0 200"), answer


async def test_unknown_static_paths_are_404_and_refusals_are_counted(engine: Engine) -> None:
    async with served(engine) as (server, port):
        evil = "/static/" + "a%0d%0aX-Injected:%201%1b[31m" * 150
        status, _ = await ahttp("GET", server.http + evil)
        assert status == 404
        status, body = await ahttp("GET", server.http + "/static/app.js")
        assert status == 200 and b"session.updated" in body
        status, _ = await ahttp("GET", server.http + "/static/../app.py")
        assert status == 404
        answer = await _raw_http(port, b"GET /health HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403")
        refused = 'realtime_http_requests_refused_total{reason="forbidden_host"}'
        assert await _metric(server, refused) == 1.0


async def test_past_the_connection_bound_new_connections_get_503_and_a_session_goes_on(
    engine: Engine,
) -> None:
    async with served(engine, max_connections=8) as (server, port):
        holder = await RawClient.connect("127.0.0.1", port)
        created = await holder.recv_json()
        assert created is not None and created["type"] == "session.created"
        idle: list[socket.socket] = []
        try:
            for _ in range(12):  # more than the bound: idle keep-alive connections
                sock = socket.create_connection(("127.0.0.1", port))
                idle.append(sock)
            await trio.sleep(0.2)
            answer = await _raw_http(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"connection_limit" in answer
            # The conversation already open is not touched.
            await holder.send_json({"type": "session.ping"})
            pong = await holder.recv_json()
            assert pong is not None and pong["type"] == "session.pong"
        finally:
            for sock in idle:
                sock.close()
        await trio.sleep(0.2)
        status, _ = await ahttp("GET", server.http + "/health")
        assert status == 200
        limited = 'realtime_connections_refused_total{reason="connection_limit"}'
        assert await _metric(server, limited) >= 1
        await holder.aclose()
        await _wait_free(engine)


def _slow_reader(port: int, requests: int) -> socket.socket:
    """A client that pipelines ``requests`` GETs of the largest static file and reads
    nothing, with a tiny receive buffer: the server's writes to it block."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    one = b"GET /static/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sock.sendall(one * requests)
    return sock


async def test_a_plain_http_client_that_reads_nothing_is_dropped(engine: Engine) -> None:
    async with served(engine, send_timeout=0.5) as (server, port):
        sock = _slow_reader(port, 200)
        try:
            with trio.fail_after(10):
                while server.state.tcp.open:
                    await trio.sleep(0.05)
        finally:
            sock.close()
        status, _ = await ahttp("GET", server.http + "/health")
        assert status == 200


async def test_shutdown_is_bounded_with_a_slow_plain_http_reader(engine: Engine) -> None:
    """A stuck write to a plain HTTP client held the process 30-40 s after SIGTERM."""
    sock = None
    with trio.fail_after(15):
        async with served(engine, shutdown_timeout=0.5, send_timeout=60) as (server, port):
            sock = _slow_reader(port, 200)
            with trio.fail_after(5):
                while not any(c for c in server.state.tcp.open):
                    await trio.sleep(0.05)
            started = trio.current_time()
        # running_server has stopped serving: the stuck connection was aborted.
        assert trio.current_time() - started < 10
    assert sock is not None
    sock.close()


async def test_an_exception_in_hypercorn_ends_only_its_connection(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The structural guarantee: whatever a connection's own tasks raise is logged,
    counted and ends that connection only."""
    from hypercorn.protocol.h11 import H11Protocol

    real = H11Protocol.handle

    async def handle(self: H11Protocol, event: object) -> None:
        data = getattr(event, "data", b"")
        if isinstance(data, bytes) and b"X-Boom" in data:
            raise RuntimeError("boom")
        await real(self, event)  # type: ignore[arg-type]

    monkeypatch.setattr(H11Protocol, "handle", handle)
    async with served(engine) as (server, port):
        await _raw_http(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Boom: 1\r\n\r\n")
        status, _ = await ahttp("GET", server.http + "/health")
        assert status == 200
        errors = 'realtime_connection_errors_total{where="server"}'
        assert await _metric(server, errors) == 1.0


async def test_an_exception_in_the_app_ends_only_its_connection(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from realtime.http.app import RealtimeApp

    async def broken(self: RealtimeApp, *args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(RealtimeApp, "_realtime", broken)
    async with served(engine) as (server, port):
        client = await RawClient.connect("127.0.0.1", port)
        assert client.rejected_status == 500
        await client.aclose()
        status, _ = await ahttp("GET", server.http + "/health")
        assert status == 200
        errors = 'realtime_connection_errors_total{where="app"}'
        assert await _metric(server, errors) == 1.0


def test_the_guard_is_what_hypercorn_runs() -> None:
    from hypercorn.protocol import h11
    from hypercorn.trio import run

    from realtime.http.guard import GuardedWSStream, install

    install()
    assert installed()
    assert vars(run)["TCPServer"] is GuardedTCPServer
    assert vars(h11)["WSStream"] is GuardedWSStream
