"""Resuming through a real socket when something is wrong: wrong, ended or another
key's token, the grace over, the journal past its bound, a half-open old socket, a
resume client that stops reading, floods of guesses, malformed messages; and what
operators see (outcomes, the resume histogram, /health, admission)."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
import trio

import realtime.http.app as app_module
from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.session.resume import new_token
from realtime.tenants import Tenant, Tenants
from realtime.testing.fake import FakeModel
from tests.helpers import ahttp, append_msg, noise, running_engine, running_server
from tests.openai.scripted import call_then_say, scripted
from tests.openai.sdk_exchange import voice
from tests.reliability.rawws import RawClient
from tests.resume.peer import Resuming

NATIVE = "/v1/realtime"
OPENAI = "/openai/v1/realtime?model=x"


async def opened(http: str, path: str = NATIVE, **kwargs: Any) -> Resuming:
    """A resumable conversation, configured, one frame answered."""
    peer = Resuming(http, path, **kwargs)
    await peer.open()
    await peer.until("session.created")
    await peer.until("session.resumable")
    if path == NATIVE:
        await peer.send({"type": "session.update", "session": {"seed": 1}})
        await peer.until("session.updated")
        await peer.send(append_msg(noise(1280)))
        await peer.until("response.audio.delta")
    else:
        await peer.send({"type": "session.update", "session": {"type": "realtime"}})
        await peer.until("session.updated")
    return peer


async def until_released(engine: Engine, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while engine.reserved:
            await trio.sleep(0.01)


async def refused(peer: Resuming, **resume: Any) -> tuple[str, int | None]:
    """Resume and expect an error: its code and the close code."""
    answer = await peer.resume(**resume)
    assert answer["type"] == "error", answer
    return answer["error"]["code"], await peer.ws.drain_to_close()


async def test_a_wrong_token_fails_and_the_real_one_still_resumes(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        peer.drop()
        assert await refused(peer, token=new_token()) == ("resume_failed", 1008)
        answer = await peer.resume()
        assert answer["type"] == "session.resumed"
        await peer.send(append_msg(noise(1280, seed=2)))
        await peer.until("response.audio.delta")
        assert await peer.close() == 1000
        await until_released(engine)


async def test_the_token_resumes_nothing_once_the_session_ended(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        assert await peer.close() == 1000  # a hang-up with 1000: no grace
        await until_released(engine)
        assert await refused(peer) == ("resume_failed", 1008)
        assert len(server.state.resumes) == 0


async def test_another_keys_resume_fails(fake_model: FakeModel, engine: Engine) -> None:
    tenants = Tenants([Tenant.of("acme", "sk-acme"), Tenant.of("umbrella", "sk-umbrella")])
    async with running_server(engine, tenants=tenants) as server:
        peer = await opened(server.http, headers={"Authorization": "Bearer sk-acme"})
        peer.drop()
        peer.headers = {"Authorization": "Bearer sk-umbrella"}
        assert await refused(peer) == ("resume_failed", 1008)
        peer.headers = {"Authorization": "Bearer sk-acme"}
        assert (await peer.resume())["type"] == "session.resumed"
        await peer.close()


async def test_a_token_of_the_other_endpoint_fails(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        peer.drop()
        peer.path = OPENAI
        assert await refused(peer) == ("resume_failed", 1008)


async def test_after_the_grace_the_session_ends_resume_expired(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "realtime.session")
    limits = Limits(resume_grace=0.3)
    async with running_server(engine, limits=limits) as server:
        peer = await opened(server.http)
        peer.drop()
        with trio.fail_after(2):
            while not server.state.detached():
                await trio.sleep(0.01)
        assert engine.reserved == 1  # the slot is held while detached
        await until_released(engine, timeout=3)
        assert await refused(peer) == ("resume_failed", 1008)
        metrics = server.state.metrics.exposition().decode()
    assert 'realtime_sessions_total{outcome="resume_expired"} 1.0' in metrics
    ended = [r for r in caplog.records if r.getMessage() == "session ended"]
    assert [r.realtime["outcome"] for r in ended] == ["resume_expired"]  # type: ignore[attr-defined]
    # The token is never logged.
    assert peer.resumable is not None
    assert not any(peer.resumable["token"] in r.getMessage() for r in caplog.records)


async def test_past_the_journal_bound_the_resume_must_resync(engine: Engine) -> None:
    limits = Limits(resume_journal_bytes=2000)
    async with running_server(engine, limits=limits) as server:
        peer = await opened(server.http)
        for i in range(4):  # each frame's audio delta is ~2 KB: the first ones go
            await peer.send(append_msg(noise(1280, seed=10 + i)))
            await peer.until("response.audio.delta")
        peer.drop()
        assert await refused(peer, last_seq=1) == ("resync_required", 1008)
        assert (await peer.resume())["type"] == "session.resumed"  # the newest is still there
        await peer.close()


async def test_acks_trim_the_journal_and_bad_ones_get_invalid_ack(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        await peer.ack()
        await peer.ack(10_000)
        await peer.ws.send_json('{"type":"session.event_ack","seq":"3"}')
        await peer.ws.send_json('{"type":"session.resume","token":"t","last_seq":0}')
        with trio.fail_after(5):  # answered at once, with no other message after them
            while len(peer.link_errors) < 3:
                assert await peer.recv() is not None
        assert peer.link_errors == ["invalid_ack", "invalid_ack", "resume_failed"]
        peer.drop()
        assert await refused(peer, last_seq=1) == ("resync_required", 1008)  # acked: gone
        answer = await peer.resume()
        assert answer["type"] == "session.resumed" and answer["replayed"] == 0
        await peer.close()


async def test_a_resume_replaces_a_half_open_connection(engine: Engine) -> None:
    async with running_server(engine) as server:
        old = await opened(server.http)
        new = Resuming(server.http, NATIVE)
        new.resumable, new.seen, new.sent = old.resumable, old.seen, list(old.sent)
        answer = await new.resume()
        assert answer["type"] == "session.resumed"
        assert answer["replayed"] == answer["next_seq"] - 1 - answer["last_seq"]
        with trio.fail_after(5):
            while await old.recv() is not None:
                pass
        assert old.link_errors == ["session_replaced"] and old.ws.close_code == 4000
        await new.send(append_msg(noise(1280, seed=5)))
        await new.until("response.audio.delta")
        await new.close()
        await until_released(engine)
        metrics = server.state.metrics.exposition().decode()
    assert 'realtime_sessions_total{outcome="resumed"} 1.0' in metrics
    assert "realtime_resume_seconds_count 1.0" in metrics


async def test_a_resume_client_that_stops_reading_is_dropped(
    fake_model: FakeModel, engine: Engine
) -> None:
    fake_model.options.audio_samples = 200_000  # big frames fill the socket fast
    limits = Limits(send_timeout=1.0)
    async with running_server(engine, limits=limits) as server:
        peer = await opened(server.http)
        peer.drop()
        host, port = server.http.removeprefix("http://").rsplit(":", 1)
        stalled = await RawClient.connect(
            host, int(port), path=NATIVE + "?resume=1", receive_buffer=4096
        )
        assert peer.resumable is not None
        await stalled.send_json(
            {"type": "session.resume", "token": peer.resumable["token"], "last_seq": peer.seen}
        )
        try:
            for i in range(8):
                await stalled.send_json(append_msg(noise(1280, seed=20 + i)))
            await until_released(engine, timeout=10)
            with trio.fail_after(5):
                while server.state.connections:
                    await trio.sleep(0.02)
            # Nothing holds a slot; only the unread tail waits (its grace) for a resume.
            assert server.state.detached() == 0 and server.state.tails() == 1
            assert not server.state.resumable_held()
        finally:
            stalled.reset()


async def test_a_flood_of_guesses_gets_429(engine: Engine) -> None:
    async with running_server(engine) as server:
        victim = await opened(server.http)
        peer = Resuming(server.http, NATIVE)
        peer.resumable = {"token": "guess", "replica": None}
        for _ in range(10):
            assert await refused(peer, token=new_token()) == ("resume_failed", 1008)
        raw = await peer.open("resume=1")
        assert raw.rejected_status == 429
        metrics = server.state.metrics.exposition().decode()
        assert 'realtime_connections_refused_total{reason="resume_limit"} 1.0' in metrics
        assert 'realtime_error_events_total{code="resume_failed"} 10.0' in metrics
        # The conversation whose token was guessed at goes on untouched.
        await victim.send(append_msg(noise(1280, seed=9)))
        await victim.until("response.audio.delta")
        await victim.close()


@pytest.mark.parametrize(
    "first",
    [
        "not json",
        '{"type":"session.update"}',
        '{"type":"session.resume","last_seq":0}',
        '{"type":"session.resume","token":"t","last_seq":-1}',
        '{"type":"session.resume","token":"t","last_seq":true}',
        '{"type":"session.resume","token":"t"}',
        "[" * 100_000 + '"session.resume"' + "]" * 100_000,  # hostile nesting
        json.dumps({"type": "session.resume", "token": "t" * 5000, "last_seq": 0}),
    ],
    ids=lambda first: first[:40],
)
async def test_a_malformed_resume_is_invalid_request(engine: Engine, first: str) -> None:
    async with running_server(engine) as server:
        peer = Resuming(server.http, NATIVE)
        raw = await peer.open("resume=1")
        await raw.send_json(first)
        answer = await raw.recv_json()
        assert answer is not None and answer["error"]["code"] == "invalid_request"
        assert await raw.drain_to_close() == 1008


async def test_a_silent_resume_connection_is_closed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "RESUME_FIRST_MESSAGE_SECONDS", 0.2)
    async with running_server(engine) as server:
        raw = await Resuming(server.http, NATIVE).open("resume=1")
        answer = await raw.recv_json()
        assert answer is not None and answer["error"]["code"] == "invalid_request"
        assert await raw.drain_to_close() == 1008


async def test_the_openai_endpoint_answers_in_its_own_error_shape(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http, OPENAI)
        peer.drop()
        answer = await peer.resume(token=new_token())
        assert answer["type"] == "error" and answer["event_id"].startswith("event_")
        assert answer["error"]["code"] == "resume_failed"
        assert answer["error"]["type"] == "invalid_request_error"
        assert (await peer.resume())["type"] == "session.resumed"
        await peer.close()


async def test_live_has_no_resume(engine: Engine) -> None:
    async with running_server(engine) as server:
        for query in ("resumable=1", "resume=1"):
            raw = await Resuming(server.http, "/openai/v1/live/sessions").open(query)
            assert raw.rejected_status == 400
            assert b"no resume" in raw.rejected_body


async def test_grace_zero_turns_resume_off(engine: Engine) -> None:
    async with running_server(engine, limits=Limits(resume_grace=0)) as server:
        peer = Resuming(server.http, NATIVE)
        raw = await peer.open()
        created = await raw.recv_json()
        assert created is not None and created["type"] == "session.created"
        await raw.send_json({"type": "session.update", "session": {}})
        updated = await raw.recv_json()
        assert updated is not None and updated["type"] == "session.updated"  # no resumable
        peer.resumable = {"token": new_token(), "replica": None}
        peer.drop()
        await until_released(engine)  # no grace: the drop ended it
        assert await refused(peer) == ("resume_failed", 1008)


async def test_a_detached_session_holds_its_slot_and_shows_in_health(engine: Engine) -> None:
    """On a replica behind a balancer (``--replica-id``) a new client beside a
    resumable conversation is refused before the upgrade, detached or attached."""
    async with running_server(engine, replica_id="r1") as server:
        peer = await opened(server.http)
        peer.drop()
        with trio.fail_after(2):
            while not server.state.detached():
                await trio.sleep(0.01)
        status, health = await ahttp("GET", server.http + "/health")
        assert status == 200 and health["detached"] == 1 and health["sessions_active"] == 1
        # A new client is refused before the upgrade (a balancer retries it elsewhere).
        raw = await Resuming(server.http, NATIVE).open("plain=1")
        assert raw.rejected_status == 503
        assert json.loads(raw.rejected_body)["error"]["code"] == "server_busy"
        assert (await peer.resume())["type"] == "session.resumed"
        # Attached again, still refused before the upgrade: a resume may have gone past
        # a balancer's connection limit, which then does not count this conversation.
        raw = await Resuming(server.http, NATIVE).open("plain=1")
        assert raw.rejected_status == 503
        assert json.loads(raw.rejected_body)["error"]["code"] == "server_busy"
        status, health = await ahttp("GET", server.http + "/health")
        assert health["detached"] == 0
        await peer.close()


async def test_a_server_on_its_own_answers_1013_beside_a_resumable_conversation(
    engine: Engine,
) -> None:
    """Without ``--replica-id`` the seed's answer holds whatever the conversation that
    holds the slot asked for: server_busy and close 1013 after the upgrade, while it
    waits for its resume and once it is resumed."""
    async with running_server(engine) as server:
        peer = await opened(server.http)
        peer.drop()
        with trio.fail_after(2):
            while not server.state.detached():
                await trio.sleep(0.01)
        for _ in range(2):
            raw = await Resuming(server.http, NATIVE).open("plain=1")
            busy = await raw.recv_json()
            assert busy is not None and busy["error"]["code"] == "server_busy"
            assert await raw.drain_to_close() == 1013
            if server.state.detached():
                assert (await peer.resume())["type"] == "session.resumed"
        await peer.close()


async def test_beside_a_conversation_that_is_not_resumable_a_new_client_gets_1013(
    engine: Engine,
) -> None:
    """The default answer stays: server_busy and 1013 after the upgrade."""
    async with running_server(engine, replica_id="r1") as server:
        plain = await Resuming(server.http, NATIVE).open("plain=1")
        assert (await plain.recv_json() or {}).get("type") == "session.created"
        raw = await Resuming(server.http, NATIVE).open("plain=1")
        busy = await raw.recv_json()
        assert busy is not None and busy["error"]["code"] == "server_busy"
        assert await raw.drain_to_close() == 1013
        plain.reset()


async def test_shutdown_ends_a_detached_session(engine: Engine) -> None:
    with trio.fail_after(10):
        async with running_server(engine) as server:
            peer = await opened(server.http)
            peer.drop()
            with trio.fail_after(2):
                while not server.state.detached():
                    await trio.sleep(0.01)
    await until_released(engine)


async def test_a_resume_connection_replaced_in_turn_is_told_why(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        peer.drop()
        assert (await peer.resume())["type"] == "session.resumed"
        first_resume = peer.ws
        again = Resuming(server.http, NATIVE)
        again.resumable, again.seen, again.sent = peer.resumable, peer.seen, list(peer.sent)
        assert (await again.resume())["type"] == "session.resumed"
        peer.raw = first_resume
        with trio.fail_after(5):
            while await peer.recv() is not None:
                pass
        assert peer.link_errors == ["session_replaced"] and first_resume.close_code == 4000
        await again.send(append_msg(noise(1280, seed=6)))
        await again.until("response.audio.delta")
        assert await again.close() == 1000
        await until_released(engine)


async def test_a_resume_frees_a_session_stuck_writing_to_a_half_open_socket(
    fake_model: FakeModel, engine: Engine
) -> None:
    """The old socket takes nothing (its writes block, as on a network that vanished
    without a reset): the resume aborts it at once, so the session's sender, held in
    that write, goes on and the stalled-reader clock does not end the conversation."""
    fake_model.options.audio_samples = 200_000  # ~530 KB a frame: the socket fills
    limits = Limits(send_timeout=4.0)
    async with running_server(engine, limits=limits) as server:
        old = Resuming(server.http, NATIVE)
        await old.open(receive_buffer=4096)
        await old.until("session.created")
        await old.until("session.resumable")
        await old.send({"type": "session.update", "session": {"seed": 1}})
        await old.until("session.updated")
        for i in range(6):
            await old.send(append_msg(noise(1280, seed=30 + i)))
        await trio.sleep(0.5)  # the server's writes to it are stuck by now
        new = Resuming(server.http, NATIVE)
        new.resumable, new.seen, new.sent = old.resumable, old.seen, list(old.sent)
        answer = await new.resume()
        assert answer["type"] == "session.resumed"
        with trio.fail_after(20):
            while len([e for e in new.events if e["type"] == "response.audio.delta"]) < 6:
                assert await new.recv() is not None, new.ws.close_code
        assert await new.close() == 1000
        await until_released(engine)
        metrics = server.state.metrics.exposition().decode()
        old.drop()
    assert 'realtime_sessions_total{outcome="stalled_client"} 0.0' in metrics
    assert 'realtime_sessions_total{outcome="closed"} 1.0' in metrics


async def test_a_drop_before_the_first_message_frees_the_slot_at_once(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = Resuming(server.http, NATIVE)
        await peer.open()
        await peer.until("session.resumable")
        peer.drop()
        await until_released(engine, timeout=2)
        assert server.state.detached() == 0
        assert await refused(peer) == ("resume_failed", 1008)


async def test_shutdown_closes_a_resumed_connection_with_1001(engine: Engine) -> None:
    with trio.fail_after(15):
        async with running_server(engine) as server:
            peer = await opened(server.http)
            peer.drop()
            assert (await peer.resume())["type"] == "session.resumed"
            await peer.send({"type": "session.ping"})
            await peer.until("session.pong")
            server.state.shutdown.set()
            assert await peer.ws.drain_to_close() == 1001
    await until_released(engine)


async def test_a_storm_of_resumes_of_one_conversation_leaves_one_connection(
    engine: Engine,
) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        peer.drop()
        peers = []
        for _ in range(6):
            p = Resuming(server.http, NATIVE)
            p.resumable, p.seen, p.sent = peer.resumable, peer.seen, list(peer.sent)
            peers.append(p)

        async def resume(p: Resuming) -> None:
            assert (await p.resume())["type"] == "session.resumed"

        async with trio.open_nursery() as nursery:
            for p in peers:
                nursery.start_soon(resume, p)
        closes = []
        with trio.fail_after(10):
            for p in peers:
                with trio.move_on_after(1.0):
                    while await p.recv() is not None:
                        pass
                closes.append(p.ws.close_code)
        assert sorted(closes, key=str).count(4000) == 5 and closes.count(None) == 1
        winner = peers[closes.index(None)]
        await winner.send(append_msg(noise(1280, seed=8)))
        await winner.until("response.audio.delta")
        assert await winner.close() == 1000
        await until_released(engine)
        with trio.fail_after(5):
            while server.state.connections:
                await trio.sleep(0.02)


async def test_hostile_messages_that_look_like_link_messages_go_to_the_rules(
    engine: Engine,
) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        await peer.send("[" * 100_000 + '"session.event_ack"' + "]" * 100_000)
        error = await peer.until("error")
        assert error["error"]["code"] == "invalid_request"  # the rules' own answer
        await peer.send({"type": "session.ping", "pad": "session.event_ack" * 100})
        await peer.until("session.pong")  # long: not the link's, the rules'
        assert peer.link_errors == []
        assert await peer.close() == 1000


async def test_a_pending_tool_call_carries_over_a_resume() -> None:
    """The model asked for a tool, the connection dropped before the client answered:
    after the resume the client's tool output reaches the same call, and the model
    speaks its answer."""
    with running_engine(scripted(call_then_say("Sunny."))) as engine:
        async with running_server(engine) as server:
            peer = await opened(server.http, OPENAI)
            tool = {"type": "function", "name": "get_weather", "description": "Weather."}
            await peer.send(
                {"type": "session.update", "session": {"type": "realtime", "tools": [tool]}}
            )
            await peer.until("session.updated")
            pcm = voice(0.6)
            for i in range(0, len(pcm), 9600):
                audio = base64.b64encode(pcm[i : i + 9600]).decode()
                await peer.send({"type": "input_audio_buffer.append", "audio": audio})
            args = await peer.until("response.function_call_arguments.done", timeout=20)
            peer.drop()
            await trio.sleep(0.3)
            assert (await peer.resume())["type"] == "session.resumed"
            output = {
                "type": "function_call_output",
                "call_id": args["call_id"],
                "output": '{"sky": "clear"}',
            }
            await peer.send({"type": "conversation.item.create", "item": output})
            with trio.fail_after(20):
                while True:
                    done = await peer.until("response.done", timeout=20)
                    first = done["response"]["output"][0]
                    if first["type"] == "message":
                        break
            assert first["content"][0]["transcript"] == "Sunny."
            await peer.close()


async def test_a_resume_gets_through_while_the_server_drains(engine: Engine) -> None:
    async with running_server(engine) as server:
        peer = await opened(server.http)
        peer.drop()
        server.state.draining.set()
        raw = await Resuming(server.http, NATIVE).open("plain=1")
        assert raw.rejected_status == 503  # a new conversation: no
        assert (await peer.resume())["type"] == "session.resumed"  # the open one goes on
        await peer.send(append_msg(noise(1280, seed=4)))
        await peer.until("response.audio.delta")
        assert await peer.close() == 1000
