"""realtime.client: typed events, and every failure as one ClientError subclass."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import trio

from realtime import client as rc
from realtime.engine.facade import Engine
from realtime.models.base import (
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    AudioDelta,
    Done,
    UserTranscriptDelta,
)
from realtime.native import wire as protocol
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import running_engine, running_server

FRAME_SAMPLES = VOICECHAT_FIGURES.frame_samples
OUTPUT_FRAME_SAMPLES = VOICECHAT_FIGURES.output_frame_samples


def _function(i: int) -> str | None:
    return "{" if i == 0 else None


async def test_session_round_trip_yields_typed_events() -> None:
    model = FakeModel(FakeOptions(function=_function))
    engine = Engine(lambda: model)
    engine.start()
    try:
        async with running_server(engine) as server, rc.connect(server.url) as conn:
            updated = await conn.configure(system_prompt="Hi.", seed=4)
            assert updated.model == "fake-voicechat" and updated.frame_samples == FRAME_SAMPLES
            assert conn.created is not None and conn.created.session_id == updated.session_id
            await conn.append(np.zeros(FRAME_SAMPLES, np.int16))
            await conn.append(np.full(FRAME_SAMPLES // 2, 0.25, np.float32))
            await conn.ping()
            await conn.commit()
            events = [event async for event in conn]
    finally:
        engine.shutdown()
    kinds = [type(e) for e in events]
    assert kinds.count(rc.AudioDelta) == 2 and rc.Pong in kinds and rc.Committed in kinds
    assert isinstance(events[-1], rc.ResponseDone) and events[-1].frame_index == 2
    audio = next(e for e in events if isinstance(e, rc.AudioDelta))
    assert audio.pcm().shape == (OUTPUT_FRAME_SAMPLES,) and len(audio.audio_codes) == 31
    assert audio.raw["type"] == "response.audio.delta"
    function = next(e for e in events if isinstance(e, rc.FunctionDelta))
    assert function.delta == "{" and function.frame_index == 0
    assert model.calls_named("open") == [("Hi.", 4, None)]


async def test_connection_failures_are_one_line_errors(engine: Engine) -> None:
    async with running_server(
        engine, api_key="k", allowed_origins=["https://app.example"]
    ) as server:
        cases: list[tuple[str | None, str, type[rc.ClientError], str]] = [
            (None, server.url, rc.Unauthorized, "HTTP 401"),
            ("https://evil.example", server.url, rc.Forbidden, "HTTP 403"),
            (None, server.url.replace("/v1/realtime", "/nope"), rc.UpgradeRejected, "HTTP 404"),
            (None, server.http + "/v1/realtime", rc.BadURL, "ws://"),
        ]
        for origin, url, kind, needle in cases:
            key = None if kind is rc.Unauthorized else "k"
            with pytest.raises(kind, match=needle) as caught:
                async with rc.connect(url, api_key=key, origin=origin):
                    pass
            assert "\n" not in str(caught.value) and "<html" not in str(caught.value).lower()
    with pytest.raises(rc.ServerUnreachable, match="cannot connect"):
        async with rc.connect(server.url, api_key="k"):
            pass


async def test_busy_server_before_and_after_update(engine: Engine) -> None:
    async with running_server(engine) as server, rc.connect(server.url) as holder:
        await holder.configure()
        with pytest.raises(rc.ServerBusy):
            async with rc.connect(server.url) as conn:
                await conn.configure()
        with pytest.raises(rc.ServerBusy, match="1013"):
            async with rc.connect(server.url, raise_errors=False) as conn:
                error = await conn.receive()
                assert isinstance(error, rc.ErrorEvent) and error.code == "server_busy"
                await conn.receive()
        await holder.cancel()
        assert isinstance([e async for e in holder][-1], rc.ResponseCancelled)


async def test_busy_carries_the_servers_message(fake_model: FakeModel) -> None:
    """With ``--max-sessions 2`` the third client is told so in the server's words, as
    the error event's message and as the close reason; both reach ``ServerBusy``."""
    with running_engine(fake_model, capacity=2) as engine:
        async with (
            running_server(engine) as server,
            rc.connect(server.url) as one,
            rc.connect(server.url) as two,
        ):
            await one.configure()
            await two.configure()
            with pytest.raises(rc.ServerBusy) as raised:
                async with rc.connect(server.url) as conn:
                    await conn.configure()
            said = raised.value.message
            assert said and "2" in said, said
            assert str(raised.value) == f"server busy: {said}"
            with pytest.raises(rc.ServerBusy, match="1013") as closed:
                async with rc.connect(server.url, raise_errors=False) as conn:
                    error = await conn.receive()
                    assert isinstance(error, rc.ErrorEvent) and error.message == said
                    await conn.receive()
            assert closed.value.message == said and said in str(closed.value)


async def test_error_events_raise_or_return(engine: Engine) -> None:
    async with running_server(engine) as server:
        async with rc.connect(server.url) as conn:
            await conn.configure()
            await conn.send_raw("not json")
            with pytest.raises(rc.ServerError, match="invalid_request"):
                await conn.receive()
            await conn.ping()
            assert isinstance(await conn.receive(), rc.Pong)  # still usable
        with trio.fail_after(5):
            while engine.is_reserved():
                await trio.sleep(0.01)
        async with rc.connect(server.url, raise_errors=False) as conn:
            await conn.configure()
            await conn.send_raw('{"type": "nope"}')
            event = await conn.receive()
            assert isinstance(event, rc.ErrorEvent) and event.code == "invalid_request"


def test_parse_event_is_lenient_on_unknown_and_strict_on_garbage() -> None:
    unknown = rc.parse_event('{"type": "x.y", "a": 1}')
    assert isinstance(unknown, rc.UnknownEvent) and unknown.raw["a"] == 1
    with pytest.raises(rc.ProtocolViolation):
        rc.parse_event("{")
    with pytest.raises(rc.ProtocolViolation):
        rc.parse_event('{"type": "response.audio.delta"}')
    with pytest.raises(rc.ProtocolViolation):
        rc.parse_event(b"\x00")
    assert rc.decode_pcm16(rc.encode_pcm16(np.array([1, -2], np.int16))).tolist() == [1, -2]
    assert rc.decode_pcm16(rc.encode_pcm16(np.array([1.0, -1.0], np.float32))).tolist() == [
        32767,
        -32767,
    ]


def _ga(type_: str, **fields: Any) -> str:
    return json.dumps({"type": type_, "event_id": "event_1", **fields})


GA_EVENTS = [
    _ga("session.created", session={"type": "realtime", "object": "realtime.session", "id": "s"}),
    _ga("session.updated", session={"type": "realtime", "id": "s"}),
    _ga(
        "conversation.item.input_audio_transcription.delta",
        item_id="item_1",
        content_index=0,
        delta="hi",
    ),
    _ga("input_audio_buffer.committed", item_id="item_1", previous_item_id=None),
    _ga("response.done", response={"id": "resp_1", "status": "completed"}),
    _ga("error", error={"type": "invalid_request_error", "code": "x", "message": "m"}),
    *(_ga(kind) for kind in sorted(rc.OPENAI_EVENT_TYPES)),
]


@pytest.mark.parametrize("frame", GA_EVENTS)
def test_an_openai_event_names_the_native_endpoint(frame: str) -> None:
    """A native client at /openai/v1/realtime: one line naming /v1/realtime, never
    "malformed event" (nor a GA response.done taken for the native end)."""
    with pytest.raises(rc.WrongEndpoint) as caught:
        rc.parse_event(frame)
    line = str(caught.value)
    assert "ws://HOST:PORT/v1/realtime" in line and "OpenAI Realtime" in line
    assert "\n" not in line and "malformed" not in line
    assert json.loads(frame)["type"] in line


def test_native_events_are_never_taken_for_openai_ones() -> None:
    """Every event the native server builds parses as before (rc.openai_sign: None)."""
    frames = [
        protocol.session_created("sess_1"),
        protocol.session_updated("sess_1", "m", protocol.SessionUpdate(system_prompt="x")),
        protocol.input_audio_committed(),
        protocol.pong(),
        protocol.error_event("invalid_request", "nope"),
        protocol.cancelled(3),
        protocol.wire_event(Done(4)),
        protocol.wire_event(UserTranscriptDelta(1, "hi", "hi")),
        protocol.wire_event(AssistantTextDelta(1, 7, "a", "a")),
        protocol.wire_event(
            AudioDelta(2, np.zeros(OUTPUT_FRAME_SAMPLES, np.float32), tuple(range(31)))
        ),
    ]
    for frame in frames:
        assert rc.openai_sign(frame) is None, frame
        assert not isinstance(rc.parse_event(protocol.serialize(frame)), rc.UnknownEvent)
    assert rc.openai_sign({"type": ["x"]}) is None


async def test_a_native_client_at_the_openai_endpoint_is_told_where_to_go(
    engine: Engine,
) -> None:
    async with running_server(engine) as server:
        url = server.url.replace("/v1/realtime", "/openai/v1/realtime")
        with pytest.raises(rc.WrongEndpoint, match=r"ws://HOST:PORT/v1/realtime") as caught:
            async with rc.connect(url) as conn:
                await conn.configure()
    assert "'session.created' in the OpenAI shape" in str(caught.value)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [([(b"Retry-After", b"5")], 5.0), ([], None), ([(b"retry-after", b"soon")], None)],
)
async def test_http_503_before_the_upgrade_is_busy_with_its_retry_after(
    headers: list[tuple[bytes, bytes]], wait: float | None
) -> None:
    """A balancer's full fleet (HAProxy answers 503 + Retry-After after its queue
    timeout) is busy, like 1013: ServerBusy, its message and wait kept."""
    import trio_websocket

    said = "no realtime replica is free; try again in a few seconds"  # HAProxy's page
    body = json.dumps({"error": {"code": "server_busy", "message": said}})

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        await request.reject(503, extra_headers=headers, body=body.encode())

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        with pytest.raises(rc.ServerBusy) as caught:
            async with rc.connect(url):
                pass
        nursery.cancel_scope.cancel()
    busy = caught.value
    assert isinstance(busy, rc.BusyUpgrade) and isinstance(busy, rc.UpgradeRejected)
    assert busy.status == 503 and busy.retry_after == wait
    assert busy.message == said
    text = str(busy)
    assert text.startswith("server busy (HTTP 503") and "no realtime replica is free" in text
    assert ("try again in 5 s" if wait else "try again later") in text
    assert text.count("try again") == 1, text  # one retry hint, not the page's and ours


async def test_a_wrong_path_is_told_the_endpoint(engine: Engine) -> None:
    """No path (HTTP 400 from the page's route) and an unknown one (404) both name the
    endpoint."""
    async with running_server(engine) as server:
        root = server.url.removesuffix("/v1/realtime")
        for url in (root + "/", root + "/v1/realtim"):
            with pytest.raises(rc.UpgradeRejected) as caught:
                async with rc.connect(url):
                    pass
            assert "the endpoint is ws://HOST:PORT/v1/realtime" in str(caught.value), url


def test_every_other_refused_upgrade_says_what_to_check() -> None:
    import trio_websocket

    refused = trio_websocket.ConnectionRejected(500, (), b"boom")
    text = str(rc._rejected("ws://h:1/v1/realtime", refused))
    assert "HTTP 500" in text and "check the URL" in text


def test_check_url_refuses_what_connect_would() -> None:
    rc.check_url("ws://127.0.0.1:8080/v1/realtime")
    rc.check_url("wss://example.org/openai/v1/realtime")
    for bad in ("http://127.0.0.1/v1/realtime", "127.0.0.1:8080", "ws:///v1/realtime", ""):
        with pytest.raises(rc.BadURL):
            rc.check_url(bad)
