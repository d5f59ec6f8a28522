"""How each session ends, as the session log line and ``realtime_sessions_total`` say,
on the three endpoints over a real Hypercorn server: a client's close frame (any code) is
``closed``, a dropped TCP connection ``client_gone``, and the server's own endings keep
theirs (``done``, ``cancelled``, ``shutdown``); a refused client starts no session."""

from __future__ import annotations

import base64
import logging
from typing import Any

import numpy as np
import pytest
import trio
from wsproto.events import CloseConnection
from wsproto.frame_protocol import CloseReason

from realtime.engine.facade import Engine
from realtime.telemetry.logs import EXTRA
from tests.helpers import Server, ahttp, append_msg, noise, running_server
from tests.reliability.rawws import RawClient
from tests.telemetry.test_metrics import value

ENDPOINTS = ["/v1/realtime", "/openai/v1/realtime?model=x", "/openai/v1/live/sessions"]


@pytest.fixture(params=ENDPOINTS)
def path(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every endpoint."""
    endpoint: str = request.param
    return endpoint


def native(path: str) -> bool:
    return path.startswith("/v1/")


def live(path: str) -> bool:
    return path.startswith("/openai/v1/live/")


async def open_client(server: Server, path: str) -> RawClient:
    host, port = server.http.removeprefix("http://").rsplit(":", 1)
    client = await RawClient.connect(host, int(port), path=path)
    if live(path):  # the client speaks first
        await client.send_json({"type": "session.start", "session": {"model": "m"}})
        started = await client.recv_json()
        assert started is not None and started["type"] == "session.started", started
        return client
    created = await client.recv_json()
    assert created is not None and created["type"] == "session.created", created
    if native(path):
        await client.send_json({"type": "session.update", "session": {}})
        updated = await client.recv_json()
        assert updated is not None and updated["type"] == "session.updated", updated
    return client


async def speak(client: RawClient, path: str, frames: int = 2) -> None:
    """Some audio, in the endpoint's own format."""
    if native(path):
        await client.send_json(append_msg(noise(1280 * frames)))
        return
    pcm = (noise(1920 * frames) * 32767).astype(np.int16).tobytes()
    audio = base64.b64encode(pcm).decode()
    kind = "session.input_audio.append" if live(path) else "input_audio_buffer.append"
    await client.send_json({"type": kind, "audio": audio})


def ended(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The fields of every session log line so far."""
    return [
        getattr(r, EXTRA)
        for r in caplog.records
        if r.name == "realtime.session" and r.getMessage() == "session ended"
    ]


async def outcome_of(server: Server, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The one session's log line, once it is written; its outcome counted once."""
    with trio.fail_after(10):
        while not ended(caplog):
            await trio.sleep(0.01)
    [line] = ended(caplog)
    text = (await ahttp("GET", server.http + "/metrics"))[1].decode()
    assert value(text, "realtime_sessions_total", outcome=line["outcome"]) == 1
    return line


def went_away(caplog: pytest.LogCaptureFixture) -> bool:
    return any("went away" in r.getMessage() for r in caplog.records)


@pytest.fixture(autouse=True)
def _info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


@pytest.mark.parametrize("code", [1000, 1001, 4000, 1005])
async def test_a_client_that_hangs_up_is_closed_with_its_code(
    engine: Engine, caplog: pytest.LogCaptureFixture, path: str, code: int
) -> None:
    """1000 (an SDK's ``async with`` exit), 1001 (a page closed), an application code,
    and a close frame with no code (1005): each a hang-up, not a network failure."""
    async with running_server(engine) as server:
        client = await open_client(server, path)
        await speak(client, path)
        await client.recv_json()
        # wsproto sends no code for its own 1005 member (an int 1005 would go out).
        sent = CloseReason.NO_STATUS_RCVD if code == 1005 else code
        await client._send(CloseConnection(code=sent))
        line = await outcome_of(server, caplog)
        assert line["outcome"] == "closed", line
        assert line["close_code"] == code and line["close_reason"] == f"client closed ({code})"
        assert not went_away(caplog)
        await client.aclose()


async def test_a_dropped_connection_is_client_gone(
    engine: Engine, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    async with running_server(engine) as server:
        client = await open_client(server, path)
        await speak(client, path)
        await client.recv_json()
        client.reset()  # no close frame, a TCP reset
        line = await outcome_of(server, caplog)
        assert line["outcome"] == "client_gone" and line["close_code"] is None, line
        assert went_away(caplog)


ENDINGS = {
    # what the client sends: (what it awaits, the outcome) on the native endpoint
    "input_audio_buffer.commit": ("response.done", "done"),
    "session.cancel": ("response.cancelled", "cancelled"),
    "response.cancel": ("response.cancelled", "cancelled"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_after_a_commit_or_a_cancel(
    engine: Engine, caplog: pytest.LogCaptureFixture, path: str, ending: str
) -> None:
    """Native: a commit is answered (``done``), a cancel ends the session
    (``cancelled``), the server closes 1000, and the client's answering close frame
    changes nothing. OpenAI: neither ends the session; the hang-up after it is
    ``closed``. Live: its one ending, ``session.close``, is answered with
    ``session.closed`` (``done``) and 1000."""
    async with running_server(engine) as server:
        client = await open_client(server, path)
        await speak(client, path)
        await client.recv_json()
        if ending == "session.cancel" and not native(path):
            ending = "response.cancel"  # the OpenAI dialect's only cancel
        if live(path):
            ending = "session.close"
        await client.send_json({"type": ending})
        if live(path):
            await client.recv_until("session.closed")
            assert await client.drain_to_close() == 1000
            expected = "done"
        elif native(path):
            awaited, expected = ENDINGS[ending]
            await client.recv_until(awaited)
            assert await client.drain_to_close() == 1000
        else:
            if ending == "input_audio_buffer.commit":
                await client.recv_until("input_audio_buffer.committed")
            await client._send(CloseConnection(code=1000))
            expected = "closed"
        line = await outcome_of(server, caplog)
        assert line["outcome"] == expected, line
        assert not went_away(caplog)
        await client.aclose()


async def test_shutdown(engine: Engine, caplog: pytest.LogCaptureFixture, path: str) -> None:
    async with running_server(engine) as server:
        client = await open_client(server, path)
        server.state.shutdown.set()
        assert await client.drain_to_close() == 1001
        line = await outcome_of(server, caplog)
        assert line["outcome"] == "shutdown" and line["close_code"] == 1001, line
        assert not went_away(caplog)
        await client.aclose()


async def test_a_busy_refusal_is_no_session(
    engine: Engine, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """The refused client is counted as refused, not as a session; the one it met goes
    on and ends as its own client ends it."""
    async with running_server(engine) as server:
        first = await open_client(server, path)
        host, port = server.http.removeprefix("http://").rsplit(":", 1)
        second = await RawClient.connect(host, int(port), path=path)
        error = await second.recv_json()
        assert error is not None and error["type"] == "error", error
        assert await second.drain_to_close() == 1013
        text = (await ahttp("GET", server.http + "/metrics"))[1].decode()
        assert value(text, "realtime_connections_refused_total", reason="busy") == 1
        assert not ended(caplog)
        await first._send(CloseConnection(code=1000))
        line = await outcome_of(server, caplog)
        assert line["outcome"] == "closed", line
        await first.aclose()
        await second.aclose()
