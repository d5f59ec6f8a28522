"""``--max-sessions N`` through real sockets: both endpoints share the capacity, every
way out frees its slot, admission by load refuses like a full server, and /health,
/ready and /metrics follow the capacity."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from realtime.engine.admission import MIN_SAMPLES
from realtime.engine.facade import Engine
from realtime.errors import UsageError
from realtime.launch.cli import batch_frames_from_args, build_parser
from realtime.launch.server import engine_for
from realtime.limits import BATCH_FRAMES_ENV, Limits, batch_frames_from_env, batching
from realtime.session.close_codes import CLOSE_TRY_AGAIN
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import Server, ahttp, append_msg, connect, noise, running_engine, running_server
from tests.telemetry.test_metrics import value

MOMENT = json.dumps(
    {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(4800)).decode()}
)
"""100 ms of 24 kHz PCM16 for the OpenAI endpoint: its model session opens."""


async def wait_for(condition: Any, seconds: float = 10.0) -> None:
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.01)


@asynccontextmanager
async def openai(server: Server) -> AsyncIterator[WebSocketConnection]:
    url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
    async with open_websocket_url(url) as ws:
        yield ws


async def first_events(ws: WebSocketConnection, n: int) -> list[dict[str, Any]]:
    with trio.fail_after(10):
        return [json.loads(await ws.get_message()) for _ in range(n)]


async def refused(server: Server, endpoint: str) -> tuple[dict[str, Any], int | None]:
    """Connect to a full server: the error event and the close code it got."""
    if endpoint == "native":
        async with connect(server.url) as client:
            error = await client.recv()
            return error, await client.closed_code()
    async with openai(server) as ws:
        error = json.loads(await ws.get_message())
        with trio.fail_after(10):
            while not ws.closed:
                try:
                    await ws.get_message()
                except Exception:
                    break
        return error, ws.closed.code if ws.closed else None


async def test_both_endpoints_share_the_capacity_and_the_next_client_gets_1013() -> None:
    with running_engine(FakeModel(), capacity=2) as engine:
        async with running_server(engine) as server:
            async with connect(server.url) as native, openai(server) as other:
                await native.configure()
                (created, *_) = await first_events(other, 1)
                assert created["type"] == "session.created"
                await wait_for(lambda: engine.reserved == 2)
                status, health = await ahttp("GET", server.http + "/health")
                assert status == 200
                assert health["sessions_active"] == 2 and health["capacity"] == 2
                status, ready = await ahttp("GET", server.http + "/ready")
                assert (status, ready["reason"]) == (503, "busy")
                status, _ = await ahttp("GET", server.http + "/ready?allow_busy=1")
                assert status == 200
                for endpoint in ("native", "openai"):
                    error, code = await refused(server, endpoint)
                    assert error["type"] == "error", error
                    assert error["error"]["code"] == "server_busy"
                    assert "all 2 conversations" in error["error"]["message"]
                    assert code == CLOSE_TRY_AGAIN
            await wait_for(lambda: engine.reserved == 0)
            async with connect(server.url) as again:
                await again.configure()
            status, raw = await ahttp("GET", server.http + "/metrics")
            text = raw.decode()
            assert value(text, "realtime_sessions_capacity") == 2
            assert value(text, "realtime_connections_refused_total", reason="busy") == 2


async def test_one_session_by_default_refuses_the_second_as_the_seed_says() -> None:
    with running_engine(FakeModel()) as engine:
        async with running_server(engine) as server, connect(server.url) as first:
            await first.configure()
            error, code = await refused(server, "native")
            assert error["error"] == {
                "code": "server_busy",
                "message": "another session is active on this server; try again when it ends",
            } or error["error"]["message"].startswith("another session is active")
            assert code == CLOSE_TRY_AGAIN


async def _one_conversation(server: Server, rng: random.Random) -> str:
    """One client leaving one of the ways a client leaves; what it saw."""
    way = rng.choice(
        ["at_once", "after_update", "commit", "cancel", "mid_audio", "garbage", "openai"]
    )
    try:
        if way == "openai":  # the other endpoint holds a slot of the same capacity
            async with openai(server) as ws:
                (first,) = await first_events(ws, 1)
                if first["type"] == "error":
                    return "busy"
                await ws.send_message(MOMENT)
                await trio.sleep(rng.random() * 0.2)
                return way
        async with connect(server.url) as client:
            created = await client.recv()
            if created["type"] == "error":
                return "busy"
            if way == "at_once":
                return way
            await client.send({"type": "session.update", "session": {"seed": rng.randrange(9)}})
            await client.recv()
            if way == "after_update":
                return way
            await client.send(append_msg(noise(1280 * rng.randint(1, 6), seed=rng.randrange(9))))
            if way == "mid_audio":
                return way
            if way == "garbage":
                await client.send("{not json")
                await client.recv()
                return way
            kind = "input_audio_buffer.commit" if way == "commit" else "response.cancel"
            await client.send({"type": kind})
            await client.recv_until("response.done" if way == "commit" else "response.cancelled")
            return way
    except Exception as exc:  # a close the server decided is fine; anything else is not
        return f"{type(exc).__name__}"


async def test_every_way_out_frees_its_slot_under_a_bounded_storm() -> None:
    rng = random.Random(11)
    with running_engine(FakeModel(FakeOptions(frame_delay=0.002)), capacity=3) as engine:
        async with running_server(engine) as server:
            seen: list[str] = []

            async def client(seed: int) -> None:
                await trio.sleep(rng.random() * 0.3)
                seen.append(await _one_conversation(server, random.Random(seed)))

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(30):
                        nursery.start_soon(client, i)
            assert len(seen) == 30
            unexpected = [s for s in seen if s[0].isupper()]
            assert not unexpected, seen
            await wait_for(lambda: engine.reserved == 0 and engine.queue_depth == 0)
            async with connect(server.url) as after:  # all three slots are free again
                await after.configure()


async def test_admission_by_load_refuses_and_ready_says_overloaded() -> None:
    """At 50 ms a step one conversation is all a 0.75 margin admits: the second client
    is refused like at a full server, and /ready is 503 even with allow_busy."""
    model = FakeModel(FakeOptions(frame_delay=0.05))
    engine = Engine(lambda: model, capacity=3, admission_margin=0.75)
    engine.start()
    try:
        async with running_server(engine, limits=Limits(max_sessions=3)) as server:
            async with connect(server.url) as first:
                await first.configure()
                await first.send(append_msg(noise(1280 * (MIN_SAMPLES + 2))))
                for _ in range(MIN_SAMPLES + 2):
                    await first.recv_until("response.audio.delta")
                status, ready = await ahttp("GET", server.http + "/ready?allow_busy=1")
                assert (status, ready["reason"]) == (503, "overloaded")
                error, code = await refused(server, "native")
                assert error["error"]["code"] == "server_busy"
                assert "real-time capacity (1 conversation at" in error["error"]["message"]
                assert code == CLOSE_TRY_AGAIN
                status, raw = await ahttp("GET", server.http + "/metrics")
                text = raw.decode()
                assert value(text, "realtime_connections_refused_total", reason="overloaded") == 1
                assert value(text, "realtime_engine_step_p90_seconds") >= 0.05
    finally:
        engine.shutdown()


async def test_openai_sessions_side_by_side_each_keep_their_silence_clock() -> None:
    """Two OpenAI clients that speak a moment, then go quiet: the engine feeds each
    one's model clock silence, in turn."""
    model = FakeModel()
    with running_engine(model, capacity=2) as engine:
        async with running_server(engine) as server:
            async with openai(server) as a, openai(server) as b:
                for ws in (a, b):
                    await first_events(ws, 1)
                    await ws.send_message(MOMENT)
                await wait_for(
                    lambda: (
                        len(model.sessions) == 2
                        and all(s.frame_index >= 10 for s in model.sessions)
                    ),
                    seconds=20,
                )
            await wait_for(lambda: engine.reserved == 0)


# --- batched frames: the switch and the wiring ------------------------------------------


def test_batch_frames_is_on_past_one_conversation_unless_switched() -> None:
    assert not batching(None, 1)  # the seed's one conversation steps alone
    assert batching(None, 2) and batching(True, 1) and not batching(False, 4)
    assert (
        batch_frames_from_env({}) is None and batch_frames_from_env({BATCH_FRAMES_ENV: ""}) is None
    )
    assert batch_frames_from_env({BATCH_FRAMES_ENV: "ON"}) is True
    assert batch_frames_from_env({BATCH_FRAMES_ENV: "0"}) is False
    with pytest.raises(ValueError, match=f"^{BATCH_FRAMES_ENV} must be one of"):
        batch_frames_from_env({BATCH_FRAMES_ENV: "sometimes"})
    loader = FakeModel
    assert not engine_for(loader, Limits()).batch_frames
    assert engine_for(loader, Limits(max_sessions=3)).batch_frames
    assert engine_for(loader, Limits(max_sessions=3)).max_batch == 3
    assert not engine_for(loader, Limits(max_sessions=3), batch_frames=False).batch_frames


def test_the_serve_flag_and_its_environment_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BATCH_FRAMES_ENV, raising=False)
    parse = build_parser().parse_args
    assert batch_frames_from_args(parse(["serve"])) is None
    assert batch_frames_from_args(parse(["serve", "--batch-frames"])) is True
    assert batch_frames_from_args(parse(["serve", "--no-batch-frames"])) is False
    monkeypatch.setenv(BATCH_FRAMES_ENV, "off")
    assert batch_frames_from_args(parse(["serve"])) is False
    assert batch_frames_from_args(parse(["serve", "--batch-frames"])) is True  # the flag wins
    monkeypatch.setenv(BATCH_FRAMES_ENV, "maybe")
    with pytest.raises(UsageError, match=BATCH_FRAMES_ENV):
        batch_frames_from_args(parse(["serve"]))


async def test_conversations_on_a_batched_server_share_model_steps() -> None:
    """Three clients each append ten frames at once on a batched server: every frame
    comes back to its own client, in fewer model steps than frames (rows that were due
    together ran as one step), and /metrics counts the batch sizes."""
    model = FakeModel(FakeOptions(frame_delay=0.02, batch_row_delay=0.0))
    engine = Engine(lambda: model, capacity=3, batch_frames=True)
    engine.start()
    try:
        async with running_server(engine, limits=Limits(max_sessions=3)) as server:

            async def converse(seed: int) -> None:
                async with connect(server.url) as client:
                    await client.configure(seed=seed)
                    await client.send(append_msg(noise(1280 * 10, seed)))
                    indexes = []
                    for _ in range(10):
                        events = await client.recv_until("response.audio.delta")
                        indexes.append(events[-1]["frame_index"])
                    assert indexes == list(range(10))

            async with trio.open_nursery() as nursery:
                for seed in (1, 2, 3):
                    nursery.start_soon(converse, seed)
            assert sum(model.batches) == 30 and len(model.batches) < 30
    finally:
        engine.shutdown()


def test_the_asgi_app_reads_its_environment_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REALTIME_MODEL", raising=False)
    import realtime.launch.asgi

    monkeypatch.setenv("REALTIME_MAX_SESSIONS", "3")
    assert realtime.launch.asgi.create_app_from_env().state.engine.batch_frames
    monkeypatch.setenv(BATCH_FRAMES_ENV, "off")
    assert not realtime.launch.asgi.create_app_from_env().state.engine.batch_frames
    monkeypatch.setenv(BATCH_FRAMES_ENV, "maybe")
    with pytest.raises(SystemExit) as info:
        realtime.launch.asgi.create_app_from_env()
    assert info.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(f"realtime: error: {BATCH_FRAMES_ENV} must be one of")
    )
