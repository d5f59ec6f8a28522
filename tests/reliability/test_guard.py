"""Nothing a client sends ends the process (realtime.http.guard), against real servers.

The red team's two process-killers, repeated hundreds of times against
``realtime serve`` (with and without an API key) and ``hypercorn -k trio
realtime.launch.asgi:app``: an upgrade request with bytes after it in the same write, and
refused clients that close as soon as their ``server_busy`` error arrives. After
each run the process is alive, answers ``/health``, the session that held the slot
still answers, and the log has no traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from realtime.endpoints import LIVE_PATH
from tests.helpers import ServerProcess, ahttp, start_hypercorn_cli, start_realtime_server
from tests.reliability.attacks import early_data, raw_frame, refused_then_gone
from tests.reliability.rawws import RawClient

EARLY_ROUNDS = 20
"""Per path and payload: 3 paths x 2 payloads x 20 = 120 requests per server."""
REFUSAL_ROUNDS = 40
"""Per endpoint and way of leaving: 2 x 2 x 40 = 160 refused clients per server."""
KEY = "k"

LAUNCHES = ("serve", "serve-api-key", "hypercorn-cli")


@pytest.fixture(scope="module", params=LAUNCHES)
def server(
    request: pytest.FixtureRequest, demo_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ServerProcess]]:
    launch: str = request.param
    log_dir = tmp_path_factory.mktemp(launch)
    if launch == "hypercorn-cli":
        env = {"REALTIME_CACHE_DIR": os.environ["REALTIME_CACHE_DIR"], "REALTIME_API_KEY": KEY}
        with start_hypercorn_cli(env, log_dir) as proc:
            yield launch, proc
    else:
        args = ("--api-key", KEY) if launch == "serve-api-key" else ()
        with start_realtime_server(*args, log_dir=log_dir) as proc:
            yield launch, proc


def _headers(launch: str) -> dict[str, str]:
    return {} if launch == "serve" else {"Authorization": f"Bearer {KEY}"}


def _port(server: ServerProcess) -> int:
    return int(server.http.rsplit(":", 1)[1])


async def _assert_alive(server: ServerProcess, launch: str) -> None:
    assert server.proc.poll() is None, server.output()
    status, body = await ahttp("GET", server.http + "/health", headers=_headers(launch))
    assert status == 200, body
    output = server.output()
    assert "Traceback" not in output, output[-4000:]
    assert "Error in ASGI Framework" not in output, output[-4000:]
    # Fixed where they start, not only caught by the guard (its line says "ended by").
    assert "ended by" not in output, output[-4000:]


async def test_early_data_after_the_upgrade_request(server: tuple[str, ServerProcess]) -> None:
    """hypercorn#225: the stream's 400 raced the app's 101/401 on one h11 connection."""
    launch, proc = server
    port = _port(proc)
    header = "".join(f"{k}: {v}\r\n" for k, v in _headers(launch).items())
    payloads = (b"x", raw_frame(0x1, b'{"type": "session.ping"}'))
    answers: set[str] = set()
    with trio.fail_after(120):
        for _ in range(EARLY_ROUNDS):
            for path in ("/v1/realtime", "/openai/v1/realtime", LIVE_PATH, "/health"):
                for extra in payloads:
                    answer = await early_data(port, path, extra, header)
                    answers.add(answer.split(b"\r\n", 1)[0].decode(errors="replace"))
                    assert proc.proc.poll() is None, proc.output()[-4000:]
    # The answer is the stream's 400, or the app's own answer when it came first.
    assert answers <= {"HTTP/1.1 400 ", "HTTP/1.1 101 ", "HTTP/1.1 401 ", ""}, answers
    await _assert_alive(proc, launch)


async def test_refused_clients_that_close_at_once(server: tuple[str, ServerProcess]) -> None:
    """The server_busy race: Hypercorn's send_eof against the reader's close reply."""
    launch, proc = server
    port = _port(proc)
    headers = _headers(launch)
    holder = await RawClient.connect("127.0.0.1", port, headers=headers)
    assert holder.rejected_status is None
    created = await holder.recv_json()
    assert created is not None and created["type"] == "session.created"
    statuses: set[int | None] = set()
    with trio.fail_after(180):
        for _ in range(REFUSAL_ROUNDS):
            for path in ("/v1/realtime", "/openai/v1/realtime", LIVE_PATH):
                for wait in (False, True):
                    statuses.add(await refused_then_gone(port, path, wait=wait, headers=headers))
            assert proc.proc.poll() is None, proc.output()[-4000:]
    assert statuses == {None}, statuses
    # The conversation that held the slot was never touched.
    await holder.send_json({"type": "session.ping"})
    pong = await holder.recv_json()
    assert pong is not None and pong["type"] == "session.pong", pong
    await holder.aclose()
    await _assert_alive(proc, launch)
    with trio.fail_after(10):
        while True:
            _, body = await ahttp("GET", proc.http + "/health", headers=headers)
            if not body["session_active"]:
                break
            await trio.sleep(0.05)
