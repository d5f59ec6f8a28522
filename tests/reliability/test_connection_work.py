"""The connection side: what one client sends cannot reach the engine thread
or the event loop as expensive work, nor queue without bound (against a real server).

Judged by counts (calls, threads, refusals), never by timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from realtime.endpoints import LIVE_PATH
from realtime.limits import Limits
from realtime.models.base import MAX_TOOL_OUTPUT_BYTES
from realtime.openai.dialect import COUNT_BURST, MAX_QUEUED_FEEDS
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import connect, running_engine, running_server, start_hypercorn_cli
from tests.reliability.rawws import RawClient

OPENAI_PATH = "/openai/v1/realtime?model=x"


async def openai_client(http: str) -> RawClient:
    host, port = http.removeprefix("http://").split(":")
    client = await RawClient.connect(host, int(port), path=OPENAI_PATH)
    created = await client.recv_json()
    assert created is not None and created["type"] == "session.created", created
    return client


def output_item(output: str, call: int = 0) -> dict[str, Any]:
    item = {"type": "function_call_output", "call_id": f"call_{call}", "output": output}
    return {"type": "conversation.item.create", "item": item}


async def events_until(client: RawClient, count: int, *types: str) -> list[dict[str, Any]]:
    """Events until ``count`` of them are of ``types``."""
    seen: list[dict[str, Any]] = []
    with trio.fail_after(30):
        while sum(e["type"] in types for e in seen) < count:
            event = await client.recv_json()
            assert event is not None, seen
            seen.append(event)
    return seen


async def test_a_tool_output_is_tokenized_on_a_worker_thread_before_the_engine() -> None:
    """Finding 2: the engine thread only runs the feed's steps; the tokens are made on
    a worker thread (neither the engine's nor the event loop's)."""
    model = FakeModel()
    with running_engine(model) as engine:
        async with running_server(engine) as server:
            client = await openai_client(server.http)
            await client.send_json(output_item('{"sky": "clear"}'))
            await events_until(client, 1, "conversation.item.done", "error")
            with trio.fail_after(20):
                while not model.calls_named("tool_result"):
                    await trio.sleep(0.01)
            await client.aclose()
    threads = {name: ident for name, _, ident in model.calls}
    assert model.calls_named("tool_input") == [len('{"sky": "clear"}')]
    assert model.calls_named("tool_result") == ['{"sky": "clear"}']
    assert threads["tool_input"] not in (threads["tool_result"], threading.get_ident())


async def test_a_huge_tool_output_is_refused_before_any_tokenizing_or_queueing() -> None:
    """Findings 2 and 3: a 250 KB output is ``invalid_value`` at once: never stored,
    never tokenized, never queued for the model."""
    model = FakeModel()
    with running_engine(model) as engine:
        async with running_server(engine) as server:
            client = await openai_client(server.http)
            for n in range(20):
                await client.send_json(output_item("x" * 250_000, n))
            events = await events_until(client, 20, "error")
            await client.aclose()
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert {(e["code"], e["param"]) for e in errors} == {("invalid_value", "item.output")}
    assert f"at most {MAX_TOOL_OUTPUT_BYTES}" in errors[0]["message"]
    assert not [e for e in events if e["type"].startswith("conversation.item")]
    assert model.calls_named("tool_input") == [] and model.calls_named("open") == []


async def test_tool_outputs_waiting_for_the_model_are_bounded_in_count() -> None:
    """Finding 3: past ``MAX_QUEUED_FEEDS`` waiting outputs the next is refused
    (``rate_limit_exceeded``, not stored); each accepted one is fed once."""
    model = FakeModel(FakeOptions(frame_delay=0.01))
    sent = 3 * MAX_QUEUED_FEEDS
    output = " ".join(["word"] * 10)  # 11 steps, two frames apart: about 1.8 s each
    with running_engine(model) as engine:
        async with running_server(engine) as server:
            client = await openai_client(server.http)
            for n in range(sent):
                await client.send_json(output_item(output, n))
            events = await events_until(client, sent, "conversation.item.done", "error")
            await client.aclose()
    refused = [e["error"] for e in events if e["type"] == "error"]
    added = [e for e in events if e["type"] == "conversation.item.added"]
    assert len(added) == MAX_QUEUED_FEEDS and len(refused) == sent - MAX_QUEUED_FEEDS
    assert {e["code"] for e in refused} == {"rate_limit_exceeded"}
    assert len(model.calls_named("tool_input")) <= MAX_QUEUED_FEEDS


async def test_deeply_nested_json_in_a_tool_output_is_refused_by_size_or_depth() -> None:
    """Finding 12 (the demo's tokenizer is in tests/models/voicechat/test_step.py): the refusal
    is ``invalid_value`` on the connection, which goes on."""
    model = FakeModel()
    with running_engine(model) as engine:
        async with running_server(engine) as server:
            client = await openai_client(server.http)
            await client.send_json(output_item("[" * 100_000 + "]" * 100_000))
            (error,) = [e for e in await events_until(client, 1, "error") if e["type"] == "error"]
            assert error["error"]["code"] == "invalid_value"
            await client.send_json(output_item(json.dumps({"ok": True})))
            await events_until(client, 1, "conversation.item.done")
            await client.aclose()


async def h2_websocket_statuses(http: str, path: str, streams: int) -> list[int]:
    """Open ``streams`` WebSockets over one prior-knowledge HTTP/2 connection (RFC 8441
    extended CONNECT) with a zero receive window (a client that never reads): the
    ``:status`` each got."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    host, port = http.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    await stream.send_all(conn.data_to_send())
    statuses: dict[int, int] = {}
    sent = False
    with trio.fail_after(20):
        while len(statuses) < streams:
            data = await stream.receive_some(65536)
            assert data, statuses
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
                    statuses[event.stream_id] = int(status)
            if not sent and conn.remote_settings.enable_connect_protocol:
                sent = True
                for _ in range(streams):
                    headers = [
                        (":method", "CONNECT"),
                        (":protocol", "websocket"),
                        (":scheme", "http"),
                        (":path", path),
                        (":authority", f"{host}:{port}"),
                        ("sec-websocket-version", "13"),
                    ]
                    conn.send_headers(conn.get_next_available_stream_id(), headers)
            await stream.send_all(conn.data_to_send())
    await stream.aclose()
    return list(statuses.values())


async def test_websockets_over_http2_are_refused_and_hold_no_slot() -> None:
    """Finding 4: four WebSockets over one HTTP/2 connection that never reads each get
    505 before any session exists (over HTTP/2 Hypercorn buffers every write whatever
    the window, so no stalled-reader clock could drop them); HTTP/1.1 is served."""
    model = FakeModel()
    with running_engine(model, capacity=4) as engine:
        async with running_server(engine) as server:
            for path in ("/v1/realtime", OPENAI_PATH, LIVE_PATH):
                assert await h2_websocket_statuses(server.http, path, 4) == [505] * 4
            assert engine.reserved == 0 and model.calls_named("open") == []
            client = await openai_client(server.http)  # HTTP/1.1 still served
            await client.aclose()


class CountingModel(FakeModel):
    """The fake, recording the thread each prompt is counted on."""

    def count_tokens(self, text: str) -> int:
        self.record("count_tokens", text)
        return super().count_tokens(text)


async def test_session_update_storms_are_counted_off_the_loop_and_rate_limited() -> None:
    """Finding 5: before the model opens every update with new instructions is
    tokenized, on the tokenizing thread (never the event loop's), and past
    ``COUNT_BURST`` at once they are refused (``rate_limit_exceeded``), not counted."""
    model = CountingModel()
    sent = 5 * COUNT_BURST
    with running_engine(model) as engine:
        async with running_server(engine, limits=Limits(max_system_prompt_tokens=64)) as server:
            client = await openai_client(server.http)
            for n in range(sent):
                # 40 two-byte characters: too many bytes to skip counting, 40 tokens
                instructions = f"{n:02d}" + "é" * 38
                update = {"type": "realtime", "instructions": instructions}
                await client.send_json({"type": "session.update", "session": update})
            events = await events_until(client, sent, "session.updated", "error")
            await client.aclose()
    updated = [e for e in events if e["type"] == "session.updated"]
    refused = [e["error"] for e in events if e["type"] == "error"]
    assert {e["code"] for e in refused} == {"rate_limit_exceeded"} and refused
    counts = [(arg, ident) for name, arg, ident in model.calls if name == "count_tokens"]
    assert len(counts) == len(updated) >= COUNT_BURST
    assert threading.get_ident() not in {ident for _, ident in counts}
    assert updated[-1]["session"]["instructions"] == counts[-1][0]


async def flood_items(client: RawClient, seconds: float) -> None:
    """Items (2 KB each) without reading, until the server stops reading or ends the
    connection (once the session is dropped, the guard drops what still arrives, so
    the TCP abort reaches the client as a reset), or ``seconds`` pass."""
    item = {"type": "message", "role": "user", "content": []}
    with (
        trio.move_on_after(seconds),
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
    ):
        for n in range(400):
            message = {
                "type": "conversation.item.create",
                "item": {**item, "id": f"i{n}"},
                "event_id": "x" * 2000,
            }
            await client.send_json(message)


async def test_a_client_that_vanishes_mid_flood_frees_its_slot_within_the_stall_bound() -> None:
    """Finding 6: a client floods items without reading (Hypercorn's ASGI queue fills),
    then resets: its slot is free within the stalled-reader bound (send timeout plus a
    poll of the clock), not at the idle timeout. Mostly at once: the receiver never
    writes itself, so it reads the disconnect unless it waits for room in the send
    queue."""
    model = FakeModel()
    limits = Limits(send_timeout=2.0, idle_timeout=60.0)
    with running_engine(model) as engine:
        async with running_server(engine, limits=limits) as server:
            host, port = server.http.removeprefix("http://").split(":")
            for _ in range(2):
                client = await RawClient.connect(
                    host, int(port), path=OPENAI_PATH, receive_buffer=4096
                )
                await flood_items(client, 0.5)
                assert engine.reserved == 1
                client.reset()
                with trio.fail_after(1.5 * limits.send_timeout + 1):
                    while engine.reserved:
                        await trio.sleep(0.02)


async def test_a_flooding_client_that_stops_reading_is_dropped_within_the_stall_bound() -> None:
    """Finding 6: the OpenAI clock polls its deadlines as the native rules do, so a write
    that starts (and never ends) after the clock last planned still drops the client
    ``send_timeout`` later, not at the idle timeout."""
    model = FakeModel()
    limits = Limits(send_timeout=1.0, idle_timeout=60.0)
    with running_engine(model) as engine:
        async with running_server(engine, limits=limits) as server:
            host, port = server.http.removeprefix("http://").split(":")
            client = await RawClient.connect(host, int(port), path=OPENAI_PATH, receive_buffer=4096)
            with trio.fail_after(4 * limits.send_timeout + 2):
                await flood_items(client, 4 * limits.send_timeout)
                while engine.reserved:
                    await trio.sleep(0.02)
            client.reset()


@pytest.mark.slow
async def test_sigterm_under_the_hypercorn_cli_closes_every_session_1001(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    """Finding 11: under ``hypercorn -k trio realtime.launch.asgi:app`` SIGTERM reaches the
    app when Hypercorn stops accepting (the guard's watch), so each open session is
    told 1001 before the graceful timeout cancels it, the engine thread is joined at
    lifespan shutdown and the C++ runtime is not aborted."""
    env = {
        "REALTIME_MAX_SESSIONS": "4",
        # Four conversations on a 2-core machine: admission by load (measured at start)
        # would rightly refuse some; this test is about shutdown.
        "REALTIME_ADMISSION_MARGIN": "0",
        "REALTIME_CACHE_DIR": os.environ["REALTIME_CACHE_DIR"],
    }
    codes: list[int | None] = []
    with start_hypercorn_cli(env, tmp_path) as server:
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(connect(server.url)) for _ in range(4)]
            for client in clients:
                await client.configure()
            server.proc.send_signal(signal.SIGTERM)
            for client in clients:
                codes.append(await client.closed_code(timeout=20))
        with trio.fail_after(30):
            while server.proc.poll() is None:
                await trio.sleep(0.1)
        output = server.output()
    assert codes == [1001] * 4, output[-3000:]
    assert server.proc.returncode == 0, output[-3000:]
    assert "terminate called" not in output, output[-3000:]


async def test_a_live_client_that_stops_reading_is_dropped_within_the_stall_bound() -> None:
    """The Live endpoint sends every frame's audio whether the client talks or not, so a
    client that stops reading fills its socket within seconds; it is dropped
    ``send_timeout`` after a write stalls, and its slot is freed."""
    model = FakeModel()
    limits = Limits(send_timeout=1.0, idle_timeout=60.0)
    with running_engine(model) as engine:
        async with running_server(engine, limits=limits) as server:
            host, port = server.http.removeprefix("http://").split(":")
            client = await RawClient.connect(host, int(port), path=LIVE_PATH, receive_buffer=4096)
            await client.send_json({"type": "session.start", "session": {"model": "m"}})
            started = await client.recv_json()
            assert started is not None and started["type"] == "session.started", started
            assert engine.reserved == 1
            # Read nothing more: the model's audio (silence fed for it) piles up.
            with trio.fail_after(30):
                while engine.reserved:
                    await trio.sleep(0.05)
            client.reset()
