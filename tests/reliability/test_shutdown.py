"""§3/§4: shutdown and dropped clients are bounded whatever the client does.

A client that stops reading leaves Hypercorn's (shielded) socket write blocked;
the server must still end the connection, release the session, free the
descriptor and, on shutdown, stop within ``shutdown_timeout``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from urllib.parse import urlsplit

import trio

from realtime.engine.facade import Engine
from realtime.http.app import ServerState
from realtime.launch.server import hypercorn_config, run_server
from realtime.limits import Limits
from realtime.testing.fake import FakeModel, FakeOptions
from realtime.testing.servers import start_server_process
from tests.helpers import REPO, append_msg, noise
from tests.reliability.rawws import RawClient, open_descriptors

BIG_FRAMES = 50_000
"""Output samples per frame: ~130 kB events fill the socket buffers in a few frames."""


def started(model: FakeModel) -> Engine:
    engine = Engine(lambda: model)
    engine.start()
    return engine


@asynccontextmanager
async def server_until(
    engine: Engine, limits: Limits, stop: trio.Event
) -> AsyncIterator[tuple[int, ServerState, trio.Event]]:
    """run_server in this trio run; ``done`` is set when it has returned."""
    state = ServerState(engine=engine, limits=limits)
    done = trio.Event()

    async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await run_server(
                state,
                hypercorn_config("127.0.0.1", 0, limits),
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve)
        port = urlsplit(binds[0]).port
        assert port is not None
        yield port, state, done
        stop.set()


async def stalled_client(port: int) -> RawClient:
    """A client that configured, asked for ~19 s of audio and then reads nothing."""
    client = await RawClient.connect("127.0.0.1", port, receive_buffer=4096)
    assert (await client.recv_json() or {})["type"] == "session.created"
    await client.send_json({"type": "session.update", "session": {}})
    assert (await client.recv_json() or {})["type"] == "session.updated"
    await client.send_json(append_msg(noise(16000 * 19)))
    return client


async def wait_until(check: object, timeout: float, what: str) -> None:
    assert callable(check)
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.05)


async def test_shutdown_is_bounded_with_a_client_that_reads_nothing() -> None:
    model = FakeModel(FakeOptions(audio_samples=BIG_FRAMES))
    engine = started(model)
    try:
        # The stalled-reader drop is far away: only the shutdown bound can end this.
        limits = Limits(shutdown_timeout=1.0, send_timeout=600, send_queue_events=4)
        stop = trio.Event()
        async with server_until(engine, limits, stop) as (port, state, done):
            client = await stalled_client(port)
            # Wait until the server's writes are blocked: the model stops running
            # because the sender cannot take more events.
            frames = -1
            while model.frames_run != frames:
                frames = model.frames_run
                await trio.sleep(0.3)
            assert frames < 237 and engine.is_reserved()
            started_at = time.monotonic()
            stop.set()
            with trio.fail_after(15):  # failure guard: shutdown_timeout + abort grace + slack
                await done.wait()
            elapsed = time.monotonic() - started_at
            assert state.connections == 0 and not state.transports
            await client.aclose()
        # The engine thread frees the slot once it has run the session's close.
        await wait_until(lambda: not engine.is_reserved(), 5, "released")
        assert elapsed < 10, elapsed
    finally:
        engine.shutdown()
    assert not engine.alive


async def test_a_dropped_stalled_reader_frees_its_descriptor() -> None:
    model = FakeModel(FakeOptions(audio_samples=BIG_FRAMES))
    engine = started(model)
    try:
        limits = Limits(send_timeout=0.5, send_queue_events=4)
        stop = trio.Event()
        async with server_until(engine, limits, stop) as (port, state, _done):
            baseline = open_descriptors()
            client = await stalled_client(port)
            # The server drops it (1008 cannot get through), then aborts its TCP
            # connection: the handler ends and the server's descriptor is closed.
            await wait_until(lambda: state.connections == 0, 15, "the connection ended")
            assert not engine.is_reserved()
            # Only the client's own socket is left open in this process.
            await wait_until(lambda: open_descriptors() <= baseline + 1, 10, "descriptor freed")
            await client.aclose()
            await wait_until(lambda: open_descriptors() <= baseline, 10, "back to baseline")
    finally:
        engine.shutdown()


SERVE_FAKE = """
import sys
from realtime.engine.facade import Engine
from realtime.testing.fake import FakeModel, FakeOptions
from realtime.testing.servers import serve_engine
engine = Engine(lambda: FakeModel(FakeOptions(audio_samples=50_000)))
engine.start()
serve_engine(engine)
print("engine alive after shutdown:", engine.alive, file=sys.stderr, flush=True)
"""


async def test_sigterm_exits_0_within_the_bound_while_a_client_reads_nothing(
    tmp_path: object,
) -> None:
    with start_server_process(
        argv=[sys.executable, "-c", SERVE_FAKE], cwd=REPO, name="stall"
    ) as server:
        port = urlsplit(server.http).port
        assert port is not None
        client = await stalled_client(port)
        await trio.sleep(1.5)  # the server's write to it is blocked by now
        started_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = await trio.to_thread.run_sync(partial(server.proc.wait, 30))
        except subprocess.TimeoutExpired:
            raise AssertionError("SIGTERM did not end the server:\n" + server.output()) from None
        elapsed = time.monotonic() - started_at
        await client.aclose()
        output = server.output()
    assert code == 0, output
    # Default shutdown_timeout (5 s) plus the abort grace; a failure guard only.
    assert elapsed < 20, (elapsed, output)
    assert "aborted 1 TCP connection" in output, output
    assert "engine alive after shutdown: False" in output, output
    assert "Traceback" not in output, output


SERVE_FAKE_FOUR = """
import sys
from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import FakeModel, FakeOptions
from realtime.testing.servers import serve_engine
limits = Limits(max_sessions=4, shutdown_timeout=3.0, admission_margin=0)
engine = Engine(lambda: FakeModel(FakeOptions(audio_samples=50_000)), capacity=4)
engine.start()
serve_engine(engine, limits=limits)
print("engine alive after shutdown:", engine.alive, file=sys.stderr, flush=True)
"""


async def streaming_client(port: int, stop: trio.Event, opened: list[int]) -> int | None:
    """A client that streams a frame every 80 ms and reads everything, until the
    server closes; its close code."""
    client = await RawClient.connect("127.0.0.1", port)
    assert (await client.recv_json() or {})["type"] == "session.created"
    await client.send_json({"type": "session.update", "session": {}})
    assert (await client.recv_json() or {})["type"] == "session.updated"
    opened.append(1)

    async def read() -> None:
        while await client.recv_json(30) is not None:
            pass
        stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        frame = append_msg(noise(1280))
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while not stop.is_set():
                await client.send_json(frame)
                await trio.sleep(0.08)
    await client.aclose()
    return client.close_code


async def sigterm_beside_a_non_reader() -> tuple[int, list[int | None], float, str]:
    """Three conversations streaming and one client that stopped reading but goes on
    sending, ``--max-sessions 4``, shutdown timeout 3 s, then SIGTERM: the exit code,
    the streams' close codes, the seconds from the signal to the exit, the log."""
    with start_server_process(
        argv=[sys.executable, "-c", SERVE_FAKE_FOUR], cwd=REPO, name="stall4"
    ) as server:
        port = urlsplit(server.http).port
        assert port is not None
        closes: list[int | None] = []
        opened: list[int] = []
        done = trio.Event()

        async def stream() -> None:
            closes.append(await streaming_client(port, trio.Event(), opened))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(stream)
            await wait_until(lambda: len(opened) == 3, 10, "three streaming")
            client = await stalled_client(port)

            async def keep_sending() -> None:
                frame = append_msg(noise(1280))
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while not done.is_set():
                        await client.send_json(frame)
                        await trio.sleep(0.08)

            nursery.start_soon(keep_sending)
            await trio.sleep(2)  # its writes are blocked and its appends queue up
            started_at = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            try:
                code = await trio.to_thread.run_sync(partial(server.proc.wait, 30))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    "SIGTERM did not end the server:\n" + server.output()
                ) from None
            elapsed = time.monotonic() - started_at
            done.set()
        await client.aclose()
        output = server.output()
    return code, closes, elapsed, output


async def test_sigterm_with_three_streams_and_a_non_reader_that_keeps_sending() -> None:
    """Three conversations streaming and one client that stopped
    reading but goes on sending, ``--max-sessions 4``, shutdown timeout 3 s: SIGTERM
    exits 0 within drain + shutdown timeout + 2 s = 5 s. Before: 8.1 s. Once its
    session ended, nothing read the app's queue, which the client's appends had
    filled: the connection's reader waited in its put (not on the socket, so the abort
    did not end it) until Hypercorn's graceful timeout (shutdown timeout + 2 s)."""
    code, closes, elapsed, output = await sigterm_beside_a_non_reader()
    assert code == 0, output
    assert closes == [1001, 1001, 1001], (closes, output)
    # The documented bound: drain (0) + shutdown timeout (3 s) + 2 s.
    assert elapsed < 5.0, (elapsed, output)
    assert "aborted 1 TCP connection" in output, output
    assert "engine alive after shutdown: False" in output, output
    assert "Traceback" not in output, output


async def test_a_dropped_stalled_reader_that_keeps_sending_ends_its_connection() -> None:
    """A client that stops reading but goes on sending: once its session is dropped
    (send timeout), nothing reads the app's queue. Before, its appends filled it and the
    connection's reader waited in the put until shutdown (handler and descriptor held);
    now the connection ends with its session."""
    model = FakeModel(FakeOptions(audio_samples=BIG_FRAMES))
    engine = started(model)
    try:
        limits = Limits(send_timeout=0.5, send_queue_events=4)
        stop = trio.Event()
        async with server_until(engine, limits, stop) as (port, state, _done):
            client = await stalled_client(port)
            gone = trio.Event()

            async def keep_sending() -> None:
                frame = append_msg(noise(1280))
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while not gone.is_set():
                        await client.send_json(frame)
                        await trio.sleep(0.02)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_sending)
                await wait_until(lambda: state.connections == 0, 15, "the session ended")
                await wait_until(lambda: not state.tcp.open, 15, "the TCP connection ended")
                gone.set()
            assert not engine.is_reserved()
            await client.aclose()
    finally:
        engine.shutdown()
