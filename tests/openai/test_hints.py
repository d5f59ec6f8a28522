"""A client at the wrong endpoint is told the right one, in one line, from each side.

Native messages at ``/openai/v1/realtime`` are refused naming ``/v1/realtime``; OpenAI
messages at ``/v1/realtime`` name ``/openai/v1/realtime`` (the native rules are in
tests/native/test_wire.py, the native client's in tests/client/test_client.py). The word lists
each side keeps of the other are checked against the other's own here, so neither
drifts.
"""

from __future__ import annotations

import json
import typing
from functools import partial
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from realtime import client as rc
from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.native import wire as protocol
from realtime.openai import events as ev
from realtime.openai import messages as msg
from realtime.openai import session as sess
from realtime.openai.dialect import Dialect
from tests.helpers import running_server

HINT = "the native VoiceChat protocol is at /v1/realtime"


def refusal(message: dict[str, Any]) -> ev.Invalid:
    parsed = msg.parse_message(json.dumps(message), max_bytes=1 << 20)
    assert isinstance(parsed, ev.Invalid), parsed
    return parsed


def test_the_word_lists_agree_with_the_other_endpoint() -> None:
    from realtime import endpoints

    # One vocabulary below both dialects: the dialect parses exactly what the native
    # endpoint's hint recognises.
    assert msg.CLIENT_TYPES == endpoints.OPENAI_CLIENT_TYPES
    assert sess.SESSION_KEYS == endpoints.OPENAI_SESSION_KEYS
    native_only_fields = set(protocol.SESSION_FIELDS) - sess.SESSION_KEYS
    assert native_only_fields == msg.NATIVE_SESSION_FIELDS
    native_only_types = set(protocol.CLIENT_TYPES) - msg.CLIENT_TYPES
    assert native_only_types == msg.NATIVE_TYPES
    ga_server_types = _sdk_server_event_types()
    shared = {
        "session.created",
        "session.updated",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.delta",
        "response.done",
        "error",
    }
    # A newer SDK may add types: they read as UnknownEvent until rc.OPENAI_EVENT_TYPES has them.
    assert ga_server_types - shared >= rc.OPENAI_EVENT_TYPES
    assert len(rc.OPENAI_EVENT_TYPES) >= 40
    native = {"response.audio.delta", "response.text.delta", "response.function.delta"}
    assert not rc.OPENAI_EVENT_TYPES & native


def _sdk_server_event_types() -> set[str]:
    """Every ``type`` of the openai SDK's GA server event union."""
    realtime = pytest.importorskip("openai.types.realtime")
    union = typing.get_args(realtime.RealtimeServerEvent)[0]
    found: set[str] = set()
    for model in typing.get_args(union):
        found.update(typing.get_args(model.model_fields["type"].annotation))
    assert len(found) > 30, found
    return found


@pytest.mark.parametrize("field", sorted(msg.NATIVE_SESSION_FIELDS))
def test_a_native_session_field_is_refused_naming_the_native_endpoint(field: str) -> None:
    """Refused, not ignored: the update is not applied, and the line says where it fits."""
    refused = refusal({"type": "session.update", "session": {field: 1}, "event_id": "c1"})
    assert (refused.code, refused.param, refused.event_id) == (
        "unknown_parameter",
        f"session.{field}",
        "c1",
    )
    assert refused.message == (
        f"session.{field} belongs to the native VoiceChat protocol, not to a GA session "
        f"(the system prompt is 'instructions' here); this update was not applied; {HINT}"
    )


def test_a_native_append_and_native_messages_name_the_native_endpoint() -> None:
    both = refusal({"type": "session.update", "session": {"seed": 0, "system_prompt": "x"}})
    assert both.message.startswith("session.seed, session.system_prompt belong to the native")
    assert both.param == "session.seed"
    append = refusal({"type": "input_audio_buffer.append", "audio": "", "sample_rate": 16000})
    assert (append.code, append.param) == ("unknown_parameter", "sample_rate")
    assert append.message.endswith(f"this append was not accepted; {HINT}")
    for kind in ("session.cancel", "session.ping"):
        refused = refusal({"type": kind})
        assert (refused.code, refused.param) == ("unknown_event", "type")
        native = f"unknown client event type {kind!r} (a native VoiceChat message)"
        assert refused.message == f"{native}; {HINT}"
    # Anything else reads as before, without the hint.
    assert refusal({"type": "nope"}).message == "unknown client event type 'nope'"
    other = msg.parse_message(
        json.dumps({"type": "session.update", "session": {"voice": "x", "unknown": 1}}),
        max_bytes=1 << 20,
    )
    assert isinstance(other, msg.SessionUpdate)


def test_the_dialect_refuses_a_native_update_and_keeps_its_session() -> None:
    d = Dialect("sess_test", "m", Limits(), now=0.0)
    before = json.dumps(d.session, sort_keys=True)
    update = {"type": "session.update", "session": {"system_prompt": "Be brief.", "seed": 3}}
    (error,) = d.receive(json.dumps(update), 0.0)
    assert isinstance(error, dict) and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].endswith(HINT)
    assert json.dumps(d.session, sort_keys=True) == before


async def test_each_wrong_endpoint_says_the_right_one(engine: Engine) -> None:
    """On a real server: an OpenAI update at /v1/realtime, a native one at
    /openai/v1/realtime; each error keeps its code and adds the other path."""
    async with running_server(engine) as server:
        openai_url = server.url.replace("/v1/realtime", "/openai/v1/realtime")
        with trio.fail_after(20):
            async with open_websocket_url(server.url) as ws:
                assert json.loads(await ws.get_message())["type"] == "session.created"
                update = {"type": "session.update", "session": {"type": "realtime"}}
                await ws.send_message(json.dumps(update))
                error = json.loads(await ws.get_message())["error"]
                assert error["code"] == "invalid_request"
                assert error["message"] == (
                    "unknown session field 'type'; accepted fields: model, system_prompt, seed, "
                    "max_streaming_seconds; this is the native VoiceChat endpoint; the OpenAI "
                    "Realtime dialect is at /openai/v1/realtime"
                )
            while engine.is_reserved():  # the native session's slot, released after close
                await trio.sleep(0.01)
            async with open_websocket_url(openai_url) as ws:
                assert json.loads(await ws.get_message())["type"] == "session.created"
                await ws.send_message(json.dumps({"type": "session.ping"}))
                error = json.loads(await ws.get_message())["error"]
                assert error["code"] == "unknown_event" and error["message"].endswith(HINT)


async def test_the_openai_sdk_at_the_native_endpoint_reads_where_to_go(engine: Engine) -> None:
    """The openai SDK given ``/v1`` instead of ``/openai/v1``: its first update's error
    names the OpenAI endpoint."""
    pytest.importorskip("openai")
    async with running_server(engine) as server:
        error = await trio.to_thread.run_sync(partial(_sdk_update_error, server.http + "/v1"))
    assert error["code"] == "invalid_request"
    assert error["message"].startswith("unknown session fields 'instructions', 'type'")
    assert error["message"].endswith("the OpenAI Realtime dialect is at /openai/v1/realtime")


def _sdk_update_error(base: str) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(
        api_key="sk-local-test",
        base_url=base,
        websocket_base_url=base.replace("http://", "ws://"),
        max_retries=0,
    )
    with client.realtime.connect(model="nemotron-voicechat") as conn:
        assert json.loads(conn.recv_bytes())["type"] == "session.created"
        conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        event: dict[str, Any] = json.loads(conn.recv_bytes())
    assert event["type"] == "error", event
    error: dict[str, Any] = event["error"]
    return error
