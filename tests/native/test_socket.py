"""The plumbing of /v1/realtime over a real Hypercorn server and a real WebSocket client.

The rules themselves (what each message is answered with, limits, timeouts) are
tested on the state machine in test_conversation.py; these tests check that the
socket, the tasks and the engine carry them: order, pipelining, cancel, disconnect,
release, stalled readers, shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import trio
from trio_websocket import open_websocket_url

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import FakeModel
from tests.helpers import Client, ahttp, append_msg, connect, noise, running_server
from tests.reliability.rawws import RawClient


async def wait_released(engine: Engine, timeout: float = 2.0) -> float:
    start = trio.current_time()
    with trio.fail_after(timeout):
        while engine.is_reserved():
            await trio.sleep(0.005)
    return trio.current_time() - start


async def leave_during_a_frame(url: str, fake_model: FakeModel) -> None:
    """Configure, send one frame, and drop the TCP connection (no close handshake)
    while the model runs it."""
    async with open_websocket_url(url) as ws:
        client = Client(ws)
        await client.configure()
        await client.send(append_msg(noise(1280)))
        with trio.fail_after(2):
            while not fake_model.calls_named("push"):
                await trio.sleep(0.005)
        await ws._stream.aclose()


async def test_session_created_then_updated(engine: Engine) -> None:
    async with running_server(engine) as server, connect(server.url) as client:
        created = await client.recv()
        assert created["type"] == "session.created"
        assert created["event_id"].startswith("event_") and len(created["event_id"]) == 22
        session = created["session"]
        assert session["id"].startswith("sess_") and len(session["id"]) == 21
        assert session["state"] == "configuring"
        assert session["input_audio_format"] == {"type": "pcm16", "sample_rate": 16000}
        assert session["output_audio_format"] == {"type": "pcm16", "sample_rate": 22050}
        await client.send(
            {"type": "session.update", "session": {"system_prompt": "Be brief.", "seed": 7}}
        )
        updated = await client.recv()
        assert updated["type"] == "session.updated"
        assert updated["session"]["state"] == "ready"
        assert updated["session"]["model"] == "fake-voicechat"
        assert updated["session"]["frame_samples"] == 1280
        assert updated["session"]["id"] == session["id"]
        assert updated["session"]["input_audio_format"]["sample_rate"] == 16000
        assert updated["session"]["output_audio_format"]["sample_rate"] == 22050


async def test_append_streams_events_per_1280_sample_slice(
    engine: Engine, fake_model: FakeModel
) -> None:
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure()
        await client.send(append_msg(noise(3000)))
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.recv_until("response.done")
    assert fake_model.calls_named("push") == [1280, 1280, 440]
    types = [e["type"] for e in events]
    audio = [e for e in events if e["type"] == "response.audio.delta"]
    # 3000 samples: two full frames from the appends, the third from the padded flush.
    assert [a["frame_index"] for a in audio] == [0, 1, 2]
    assert types.index("input_audio_buffer.committed") < types.index("response.done")
    # Frame 1's events all come before frame 2's, frame 0's before frame 1's, and
    # each frame's audio leads its text and transcript.
    frames = [e["frame_index"] for e in events if "frame_index" in e]
    assert frames == sorted(frames)
    for index in (0, 1, 2):
        of_frame = [e["type"] for e in events if e.get("frame_index") == index]
        assert of_frame[0] == "response.audio.delta" and len(of_frame) == 3
    first = audio[0]
    assert first["format"] == "pcm16" and first["sample_rate"] == 22050
    assert first["channels"] == 1 and len(first["audio_codes"]) == 31
    text = [e for e in events if e["type"] == "response.text.delta"]
    assert text[0]["delta"] == "t0 " and text[1]["text"] == "t0 t1 "
    transcript = [
        e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    assert transcript[0]["transcript"] == "u0 "


async def test_many_small_appends_stream_in_order(engine: Engine, fake_model: FakeModel) -> None:
    fake_model.options.frame_delay = 0.005
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure()
        # Appends of odd sizes, sent without waiting: slices never straddle appends.
        sizes = [1280, 700, 1280 * 3 + 5, 1, 2000, 1280]
        for size in sizes:
            await client.send(append_msg(noise(size)))
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.recv_until("response.done")
    expected = [p for n in sizes for p in [1280] * (n // 1280) + ([n % 1280] if n % 1280 else [])]
    assert fake_model.calls_named("push") == expected
    audio = [e["frame_index"] for e in events if e["type"] == "response.audio.delta"]
    total = sum(sizes)
    assert audio == list(range(-(-total // 1280)))
    assert events[-1]["frame_index"] == len(audio)


async def test_commit_emits_committed_then_done_and_closes_1000(engine: Engine) -> None:
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure()
        await client.send(append_msg(noise(1280 * 2)))
        await client.send({"type": "input_audio_buffer.commit", "pad_partial": False})
        events = await client.recv_until("response.done")
        types = [e["type"] for e in events]
        assert types.count("response.audio.delta") == 2
        assert types[-1] == "response.done" and events[-1]["frame_index"] == 2
        assert "input_audio_buffer.committed" in types
        assert await client.closed_code() == 1000
    await wait_released(engine)


async def test_second_connection_gets_server_busy_1013(engine: Engine) -> None:
    async with running_server(engine) as server, connect(server.url) as first:
        await first.configure()
        async with connect(server.url) as second:
            err = await second.recv()
            assert err["type"] == "error" and err["error"]["code"] == "server_busy"
            assert await second.closed_code() == 1013
        # The first session is untouched.
        await first.send({"type": "session.ping"})
        assert (await first.recv())["type"] == "session.pong"
        await first.send({"type": "session.cancel"})
        await first.recv_until("response.cancelled")
        assert await first.closed_code() == 1000
        await wait_released(engine)
        async with connect(server.url) as third:
            assert (await third.recv())["type"] == "session.created"


@pytest.mark.parametrize("kind", ["session.cancel", "response.cancel"])
async def test_cancel_emits_cancelled_and_releases(
    engine: Engine, fake_model: FakeModel, kind: str
) -> None:
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure()
        await client.send(append_msg(noise(1280)))
        await client.recv_until("response.audio.delta")
        await client.send({"type": kind})
        events = await client.recv_until("response.cancelled")
        assert events[-1]["frame_index"] == 1
        assert await client.closed_code() == 1000
    await wait_released(engine)
    assert fake_model.calls_named("cancel")


async def test_abrupt_disconnect_releases_reservation(
    engine: Engine, fake_model: FakeModel
) -> None:
    fake_model.options.frame_delay = 0.02
    async with running_server(engine) as server:
        async with open_websocket_url(server.url) as ws:
            client = Client(ws)
            await client.configure()
            await client.send(append_msg(noise(1280 * 50)))
            await client.recv_until("response.audio.delta")
            # Drop the TCP connection without a close handshake.
            await ws._stream.aclose()
        waited = await wait_released(engine, timeout=2.0)
        assert waited < 0.25
        with trio.fail_after(2):
            while not fake_model.calls_named("clear_cache"):
                await trio.sleep(0.01)
        assert fake_model.calls_named("cancel")
        # Not every queued frame ran: the session was closed on the engine.
        assert fake_model.frames_run < 50


async def test_disconnect_while_the_session_opens_stops_the_prefill(
    engine: Engine, fake_model: FakeModel
) -> None:
    fake_model.options.open_delay = 5.0  # a long system-prompt prefill
    async with running_server(engine) as server:
        async with open_websocket_url(server.url) as ws:
            client = Client(ws)
            await client.recv()
            await client.send({"type": "session.update", "session": {}})
            with trio.fail_after(2):
                while not fake_model.calls_named("open"):
                    await trio.sleep(0.005)
            await ws._stream.aclose()
        # The prefill stops within one step, so the slot is free at once.
        assert await wait_released(engine, timeout=2.0) < 0.25
        assert not fake_model.sessions  # no session was ever opened
        fake_model.options.open_delay = 0
        async with connect(server.url) as client:
            await client.configure()


async def test_the_slot_stays_held_until_the_engine_finished_departed_work(
    engine: Engine, fake_model: FakeModel
) -> None:
    fake_model.options.frame_delay = 2.0  # one slow frame: it cannot be interrupted
    async with running_server(engine) as server:
        await leave_during_a_frame(server.url, fake_model)
        # The engine still runs the departed client's frame (longer than the short
        # wait for a releasing slot): the next client is told the truth (busy)
        # instead of waiting in silence behind the old work.
        async with connect(server.url) as client:
            err = await client.recv()
            assert err["type"] == "error" and err["error"]["code"] == "server_busy"
            assert await client.closed_code() == 1013
        assert engine.is_reserved()
        await wait_released(engine, timeout=4.0)
        fake_model.options.frame_delay = 0
        async with connect(server.url) as client:
            await client.configure()
        assert fake_model.calls_named("cancel")  # the abandoned session was cancelled


@asynccontextmanager
async def answering_a_long_append(engine: Engine, fake_model: FakeModel) -> AsyncIterator[Client]:
    """A client whose 100-frame append (20 ms a frame) the model is answering: the
    first audio came, most of the append is still to run."""
    fake_model.options.frame_delay = 0.02
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure()
        await client.send(append_msg(noise(1280 * 100)))
        await client.recv_until("response.audio.delta")
        yield client


async def test_ping_answered_during_long_append(engine: Engine, fake_model: FakeModel) -> None:
    async with answering_a_long_append(engine, fake_model) as client:
        frames_at_ping = fake_model.frames_run
        await client.send({"type": "session.ping"})
        events = await client.recv_until("session.pong")
        frames_at_pong = fake_model.frames_run
        # Answered while the append is still running, within a frame or two of compute.
        assert frames_at_pong < 100
        assert frames_at_pong - frames_at_ping <= 2
        assert len([e for e in events if e["type"] == "response.audio.delta"]) < 100
        await client.send({"type": "session.cancel"})
        await client.recv_until("response.cancelled", timeout=10)


async def test_cancel_interrupts_long_append(engine: Engine, fake_model: FakeModel) -> None:
    async with answering_a_long_append(engine, fake_model) as client:
        await client.send({"type": "session.cancel"})
        frames_at_cancel = fake_model.frames_run
        events = await client.recv_until("response.cancelled")
        # At most one more slice ran after the cancel arrived.
        assert fake_model.frames_run - frames_at_cancel <= 1
        assert events[-1]["frame_index"] == fake_model.frames_run
        assert await client.closed_code() == 1000
    await wait_released(engine)


async def test_stalled_client_is_closed_and_releases(engine: Engine, fake_model: FakeModel) -> None:
    # Big audio events fill the socket buffers fast once the client stops reading.
    fake_model.options.audio_samples = 50_000
    limits = Limits(send_timeout=1.0, send_queue_events=4)
    async with running_server(engine, limits=limits) as server, connect(server.url) as client:
        await client.configure()
        await client.send(append_msg(noise(16000 * 19)))
        # Read nothing: the server must give the slot up on its own.
        with trio.fail_after(15):
            while engine.is_reserved():
                await trio.sleep(0.05)
        assert fake_model.calls_named("clear_cache")
        async with connect(server.url) as other:
            assert (await other.recv())["type"] == "session.created"
        # Hypercorn shields socket writes, so the close frame goes out once the
        # blocked write completes: reading again reveals it.
        assert await client.closed_code(timeout=10) == 1008
        # Frames stopped: not all 237 queued frames ran.
        assert fake_model.frames_run < 237


def _small_then_huge(index: int, heard: Any) -> Any:
    """Output audio: small frames while the client streams, then one too big for any
    socket buffer (the commit's padded last frame), written after the close is decided."""
    return np.zeros(2_000_000 if index >= 4 else 64, np.float32)


async def test_a_client_that_stops_reading_after_its_commit_is_dropped(
    engine: Engine, fake_model: FakeModel
) -> None:
    """The red team's attack: 4.5 frames, commit, then read nothing through a 4 KB
    receive buffer. The close (1000 after response.done) is already decided while the
    last events wait, so only the stalled-reader deadline can free the slot: it must,
    within about send_timeout (well before any transport-level backstop, which the
    connection guard puts at 3 x send_timeout), and the TCP connection is aborted
    soon after."""
    fake_model.options.audio = _small_then_huge
    send_timeout = 1.0
    limits = Limits(send_timeout=send_timeout)
    async with running_server(engine, limits=limits) as server:
        host, port = server.http.removeprefix("http://").rsplit(":", 1)
        client = await RawClient.connect(host, int(port), receive_buffer=4096)
        try:
            created = await client.recv_json()
            assert created is not None and created["type"] == "session.created"
            await client.send_json({"type": "session.update", "session": {}})
            updated = await client.recv_json()
            assert updated is not None and updated["type"] == "session.updated"
            await client.send_json(append_msg(noise(1280 * 4 + 640)))
            await client.send_json({"type": "input_audio_buffer.commit"})
            committed = trio.current_time()
            with trio.fail_after(10):  # held for good before the fix
                while engine.is_reserved():
                    await trio.sleep(0.02)
            held = trio.current_time() - committed
            assert held < 2.5 * send_timeout, held
            status, health = await ahttp("GET", server.http + "/health")
            assert status == 200 and health["session_active"] is False
            assert fake_model.calls_named("flush")  # the close was decided first
            with trio.fail_after(5):  # the stuck write ended: the connection was aborted
                while server.state.connections:
                    await trio.sleep(0.02)
            async with connect(server.url) as other:
                await other.configure()
        finally:
            client.reset()


async def test_context_limit_is_one_error_then_done_and_close(engine: Engine) -> None:
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure(max_streaming_seconds=0.16)
        await client.send(append_msg(noise(1280 * 3)))
        await client.send(append_msg(noise(1280)))  # past the bound: no second error
        events = await client.recv_until("error")
        assert events[-1]["error"]["code"] == "inference_error"
        assert "context limit" in events[-1]["error"]["message"]
        assert sum(e["type"] == "response.audio.delta" for e in events) == 2
        done = await client.recv()
        assert done["type"] == "response.done" and done["frame_index"] == 2
        assert await client.closed_code() == 1000
        await wait_released(engine)


async def test_shutdown_closes_session_1001(engine: Engine) -> None:
    async with running_server(engine) as server, connect(server.url) as client:
        await client.configure()
        server.state.shutdown.set()
        assert await client.closed_code() == 1001
        await wait_released(engine)


async def test_many_sequential_sessions_leave_the_slot_free(engine: Engine) -> None:
    async with running_server(engine) as server:
        for i in range(20):
            async with connect(server.url) as client:
                await client.configure(seed=i)
                await client.send(append_msg(noise(1280)))
                if i % 2:
                    await client.send({"type": "input_audio_buffer.commit"})
                    await client.recv_until("response.done")
                else:
                    await client.recv_until("response.audio.delta")
            await wait_released(engine)
    assert not engine.is_reserved()


async def test_a_client_arriving_as_another_leaves_is_served_not_refused(
    engine: Engine, fake_model: FakeModel
) -> None:
    """A balancer hands a replica on as soon as a client's connection drops; the
    engine is then still closing that session for a moment. The new client waits
    for it (briefly) instead of getting server_busy."""
    fake_model.options.frame_delay = 0.2
    async with running_server(engine) as server:
        await leave_during_a_frame(server.url, fake_model)
        async with connect(server.url) as client:
            updated = await client.configure()
            assert updated["type"] == "session.updated"
