"""``/ready``, the SIGTERM drain, the port check before loading, and the log output."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from trio_websocket import ConnectionRejected

from realtime.engine.facade import Engine
from realtime.http.app import ServerState
from realtime.launch.server import hypercorn_config, run_server
from realtime.limits import Limits
from realtime.testing.fake import FakeModel
from tests.helpers import REPO, ahttp, append_msg, connect, http, noise, start_realtime_server


@asynccontextmanager
async def draining_server(
    engine: Engine, drain_timeout: float
) -> AsyncIterator[tuple[str, ServerState, trio.Event, trio.Event]]:
    """A server whose ``stop`` event plays SIGTERM; ``done`` is set once it has stopped."""
    state = ServerState(engine=engine)
    stop, done = trio.Event(), trio.Event()

    async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await run_server(
                state,
                hypercorn_config("127.0.0.1", 0, Limits()),
                shutdown_trigger=stop.wait,
                drain_timeout=drain_timeout,
                task_status=task_status,
            )
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve)
        yield binds[0], state, stop, done
        stop.set()


def ws(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/v1/realtime"


async def test_ready_states(engine: Engine) -> None:
    async with draining_server(engine, 0) as (base, state, _stop, _done):
        status, body = await ahttp("GET", base + "/ready")
        assert (status, body["status"]) == (200, "ready")
        async with connect(ws(base)) as client:
            await client.configure()
            status, body = await ahttp("GET", base + "/ready")
            assert (status, body["reason"]) == (503, "busy")
            status, body = await ahttp("GET", base + "/ready?allow_busy=1")
            assert status == 200
            state.draining.set()
            status, body = await ahttp("GET", base + "/ready?allow_busy=1")
            assert (status, body["reason"], body["draining"]) == (503, "draining", True)
            status, body = await ahttp("GET", base + "/health")
            assert status == 200  # liveness is not readiness
        await trio.to_thread.run_sync(engine.shutdown)
        status, body = await ahttp("GET", base + "/ready")
        assert (status, body["reason"]) == (503, "engine_unavailable")


async def test_drain_lets_the_open_conversation_finish(fake_model: FakeModel) -> None:
    engine = Engine(lambda: fake_model)
    await trio.to_thread.run_sync(engine.start)
    try:
        async with draining_server(engine, 60) as (base, state, stop, done):
            async with connect(ws(base)) as client:
                await client.configure()
                stop.set()  # SIGTERM
                with trio.fail_after(5):
                    await state.draining.wait()
                status, body = await ahttp("GET", base + "/ready")
                assert (status, body["reason"]) == (503, "draining")
                with pytest.raises(ConnectionRejected) as refused:
                    async with connect(ws(base)):
                        pass
                assert refused.value.status_code == 503
                assert b'"draining"' in (refused.value.body or b"")
                assert state.metrics.refusals.labels("draining")._value.get() == 1
                # The open conversation goes on undisturbed, to its normal end.
                await client.send(append_msg(noise(1280 * 3)))
                await client.send({"type": "input_audio_buffer.commit"})
                events = await client.recv_until("response.done")
                assert not [e for e in events if e["type"] == "error"]
                assert await client.closed_code() != 1001
            with trio.fail_after(10):  # then the server stops by itself, well before 60 s
                await done.wait()
            assert not state.shutdown.is_set() or not engine.is_reserved()
    finally:
        await trio.to_thread.run_sync(engine.shutdown)


async def test_drain_timeout_then_1001(engine: Engine) -> None:
    async with draining_server(engine, 0.3) as (base, _state, stop, done):
        async with connect(ws(base)) as client:
            await client.configure()
            stop.set()
            assert await client.closed_code() == 1001  # after 0.3 s of drain
        with trio.fail_after(10):
            await done.wait()


async def test_shutdown_during_the_drain_skips_the_rest(engine: Engine) -> None:
    async with draining_server(engine, 3600) as (base, state, stop, done):
        async with connect(ws(base)) as client:
            await client.configure()
            stop.set()
            with trio.fail_after(5):
                await state.draining.wait()
            state.shutdown.set()  # what a second SIGTERM or a SIGINT does
            assert await client.closed_code() == 1001
        with trio.fail_after(10):
            await done.wait()


async def test_sigterm_drains_a_real_server_and_a_second_signal_stops_it() -> None:
    with start_realtime_server(
        "--drain-timeout", "600", env={"REALTIME_LOG_FORMAT": "json"}
    ) as server:
        async with connect(server.url) as client:
            await client.configure()
            server.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                while http("GET", server.http + "/ready")[1].get("reason") != "draining":
                    await trio.sleep(0.05)
            with pytest.raises(ConnectionRejected) as refused:
                async with connect(server.url):
                    pass
            assert refused.value.status_code == 503
            server.proc.send_signal(signal.SIGTERM)  # skip the rest of the drain
            assert await client.closed_code() == 1001
        assert await trio.to_thread.run_sync(server.proc.wait, 15) == 0
        output = server.output()
    # --log-format json: every log line is one JSON object (the URL lines are prints).
    records = [
        json.loads(line)
        for line in output.splitlines()
        if line.strip() and not line.startswith("realtime: ")
    ]
    messages = [r["message"] for r in records]
    assert sum("Running on" in m for m in messages) == 1
    assert not [m for m in messages if m.startswith("weights")]
    ended = [r for r in records if r["message"] == "session ended"]
    assert len(ended) == 1 and ended[0]["close_code"] == 1001
    assert ended[0]["session_id"].startswith("sess_")
    refused_lines = [r for r in records if r["message"] == "connection refused"]
    assert [r["reason"] for r in refused_lines] == ["draining"]


def test_port_in_use_exits_2_before_loading() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "realtime", "serve", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert lines == [f"realtime: error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "ready on thread" not in proc.stderr and "serving model" not in proc.stderr
