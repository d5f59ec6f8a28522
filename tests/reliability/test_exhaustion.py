"""Descriptor exhaustion: 600 HTTP clients that read nothing, at ``ulimit -n 256``.

Before the connection bound, ``/health`` timed out, the live session closed with 1011
(the engine waker's ``socketpair()`` got EMFILE) and the log got a traceback per
connection until they left. Now: past the bound new connections get 503 at once, the
live session goes on, the log says so in a few rate-limited lines, the clients that
read nothing are dropped after the write bound, and ``/health`` is 200 again.
"""

from __future__ import annotations

import resource
import socket
import sys
from pathlib import Path

import pytest
import trio

from realtime.http.guard import LOG_BURST
from tests.helpers import http, start_realtime_server
from tests.reliability.rawws import RawClient

FLOOD = 600
DESCRIPTORS = 256

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX ulimit")


def _flood_client(port: int) -> socket.socket | None:
    """Pipelined GETs of the largest static file, a tiny receive buffer, no reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(0.5)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /static/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 20)
    except OSError:
        sock.close()
        return None
    return sock


async def test_non_reading_clients_cannot_exhaust_descriptors(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FLOOD + 200:
        pytest.skip(f"this test opens {FLOOD} sockets; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FLOOD + 200), hard))
    argv = [
        "sh",
        "-c",
        f'ulimit -n {DESCRIPTORS} && exec "{sys.executable}" -m realtime serve --port 0 '
        "--send-timeout 2",
    ]
    with start_realtime_server(argv=argv, log_dir=tmp_path) as server:
        port = int(server.http.rsplit(":", 1)[1])
        holder = await RawClient.connect("127.0.0.1", port)
        created = await holder.recv_json()
        assert created is not None and created["type"] == "session.created"
        await holder.send_json({"type": "session.update", "session": {}})
        await holder.recv_until("session.updated")
        started = trio.current_time()
        flood: list[socket.socket] = []
        try:
            for _ in range(FLOOD):
                sock = await trio.to_thread.run_sync(_flood_client, port)
                if sock is not None:
                    flood.append(sock)
            # At the bound: answered at once (503), never left hanging.
            status, _ = await trio.to_thread.run_sync(http, "GET", server.http + "/health")
            assert status in (200, 503)
            # The live conversation is not touched: no 1011, pings answered.
            for _ in range(3):
                await holder.send_json({"type": "session.ping"})
                pong = await holder.recv_json()
                assert pong is not None and pong["type"] == "session.pong", pong
            # The clients that read nothing are dropped after the write bound.
            with trio.fail_after(30):
                while True:
                    status, _ = await trio.to_thread.run_sync(http, "GET", server.http + "/health")
                    if status == 200:
                        break
                    await trio.sleep(0.2)
        finally:
            for sock in flood:
                sock.close()
        await holder.send_json({"type": "session.ping"})
        pong = await holder.recv_json()
        assert pong is not None and pong["type"] == "session.pong", pong
        await holder.aclose()
        output = server.output()
        assert "Traceback" not in output, output[-3000:]
        refused = output.count("refused a connection:")
        print(f"{len(flood)} clients in {trio.current_time() - started:.1f} s; {refused} log lines")
        assert refused <= 4 * LOG_BURST, f"{refused} refusal lines: not rate-limited"
