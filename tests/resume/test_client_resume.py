"""The client's half of resumable sessions: its rules as pure functions (counting and
acknowledging events, the outbox of what it sent, the backoff, the URLs), then
:mod:`realtime.client` and the file client against a small fake server that speaks
the resume protocol and cuts its TCP connection mid-answer: the caller sees one
continuous event stream, the server takes every message once, and a resume the
server refuses ends in one clear error.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import numpy as np
import pytest
import trio
import trio.testing
import trio_websocket

from realtime.client import (
    Link,
    ResumeExpired,
    ResumeFailed,
    ServerClosed,
    ServerUnreachable,
    connect,
)
from realtime.client.cli import TranscriptPrinter, add_connection_options, report
from realtime.client.files import run_file_client
from realtime.client.resume import (
    ACK_EVERY_EVENTS,
    EventCounter,
    InputLost,
    Outbox,
    Resumed,
    ResumeOffer,
    backoff,
    resumable_url,
    resume_url,
)
from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.models.base import VOICECHAT_FIGURES
from realtime.testing.fake import FakeModel
from tests.client.test_microphone import ArrayInput, ArrayOutput, _drive, _speech_like
from tests.helpers import ServerProcess, running_engine, running_server
from tests.resume.cut_proxy import cut_proxy

FRAME = VOICECHAT_FIGURES.frame_samples

# --- the rules ------------------------------------------------------------------------


def test_events_are_acknowledged_every_64_and_every_second() -> None:
    counter = EventCounter(now=0.0)
    acks = [counter.received(now=0.0) for _ in range(200)]
    assert [a for a in acks if a is not None] == [64, 128, 192]
    assert counter.received(now=0.5) is None
    assert counter.received(now=1.0) == 202  # a second since the ack at 192... at t=0
    assert counter.received(now=1.5) is None
    assert counter.received(now=2.0) == 204
    assert counter.seq == 204 and counter.acked == 204
    assert ACK_EVERY_EVENTS == 64


def test_the_outbox_resends_what_the_server_did_not_take() -> None:
    box = Outbox(max_bytes=100, max_seconds=10.0)
    for i in range(1, 6):
        assert box.add(f"m{i}", now=float(i)) == i
    assert [m for _, m in box.since(3)] == ["m4", "m5"]
    box.confirm(3)
    assert [n for n, _ in box.since(0)] == [4, 5]
    assert box.kept_bytes == 4
    box.confirm(3)  # the same answer twice (a second resume) is fine
    with pytest.raises(InputLost):
        box.confirm(6)  # more than was sent


def test_the_outbox_is_bounded_by_bytes_and_age() -> None:
    box = Outbox(max_bytes=10, max_seconds=5.0)
    for _ in range(4):
        box.add("abcd", now=0.0)  # 4 bytes each: only two fit
    assert [n for n, _ in box.since(0)] == [3, 4] and box.dropped == 2
    with pytest.raises(InputLost, match="kept only those after 2"):
        box.confirm(1)  # the server needs message 2 again: gone
    box.confirm(2)  # the server had taken what was dropped: nothing lost
    aged = Outbox(max_bytes=1000, max_seconds=5.0)
    aged.add("a", now=0.0)
    aged.add("b", now=6.0)  # the first is past the age bound
    assert aged.dropped == 1
    with pytest.raises(InputLost):
        aged.confirm(0)


def test_backoff_doubles_from_a_quarter_second_to_four() -> None:
    assert [backoff(a) for a in range(8)] == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_urls_keep_the_path_and_the_rest_of_the_query() -> None:
    assert resumable_url("ws://h:1/v1/realtime") == "ws://h:1/v1/realtime?resumable=1"
    openai = "ws://h:1/openai/v1/realtime?model=m&resumable=1"
    assert resume_url(openai, "r2") == "ws://h:1/openai/v1/realtime?model=m&resume=1&replica=r2"
    assert resume_url("ws://h/v1/realtime?resumable=1", None) == "ws://h/v1/realtime?resume=1"


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        ({"token": "t", "replica": "r1", "grace_seconds": 30.0}, True),
        ({"token": "t", "replica": None, "grace_seconds": 5}, True),
        ({"token": "", "grace_seconds": 30.0}, False),
        ({"token": "t", "replica": 3, "grace_seconds": 30.0}, False),
        ({"token": "t", "grace_seconds": 0}, False),
        ({"token": "t", "grace_seconds": math.inf}, False),
        ({"token": "t", "grace_seconds": True}, False),
    ],
)
def test_an_offer_is_used_only_when_well_formed(raw: dict[str, Any], ok: bool) -> None:
    offer = ResumeOffer.parse({"type": "session.resumable", **raw})
    assert (offer is not None) is ok
    assert offer is None or "t" not in repr(offer).replace("grace", "")  # no token in repr


def test_session_resumed_is_read_strictly() -> None:
    good = {"last_seq": 3, "next_seq": 7, "replayed": 3, "received": 2}
    assert Resumed.parse(good) == Resumed(3, 7, 3, 2)
    assert Resumed.parse({**good, "received": -1}) is None
    assert Resumed.parse({**good, "replayed": "3"}) is None


# --- a fake server --------------------------------------------------------------------

SAMPLES = VOICECHAT_FIGURES.output_frame_samples


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def _audio(index: int) -> str:
    pcm = (np.arange(SAMPLES, dtype=np.int64) * (index + 1) % 30000).astype("<i2")
    return _dumps(
        {
            "type": "response.audio.delta",
            "frame_index": index,
            "delta": base64.b64encode(pcm.tobytes()).decode(),
            "sample_rate": VOICECHAT_FIGURES.output_sample_rate,
        }
    )


@attrs.define
class FakeSession:
    """One conversation of the fake server: every event it made (numbered by
    position), every client message it took, and the socket it is on now."""

    token: str = "the-token"
    grace: float = 30.0
    events: list[str] = attrs.field(factory=list)
    taken: list[dict[str, Any]] = attrs.field(factory=list)
    acks: list[int] = attrs.field(factory=list)
    ws: trio_websocket.WebSocketConnection | None = None
    ended: bool = False

    async def emit(self, event: str) -> None:
        self.events.append(event)
        if self.ws is not None:
            try:
                await self.ws.send_message(event)
            except trio_websocket.ConnectionClosed:
                self.ws = None


@attrs.define
class FakeServer:
    """Serves one resumable session (native shapes, a frame of audio per append) and
    cuts the TCP connection (no close frame) each time it has taken another
    ``drop_after`` messages, ``drops`` times. ``refuse`` answers every resume with
    that error code."""

    drop_after: int = 5
    drops: int = 1
    refuse: str | None = None
    offer: bool = True
    replica: str | None = "r1"
    session: FakeSession = attrs.field(factory=FakeSession)
    paths: list[str] = attrs.field(factory=list)

    async def handler(self, request: trio_websocket.WebSocketRequest) -> None:
        self.paths.append(request.path)
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.path).query))
        ws = await request.accept()
        s = self.session
        if query.get("resume") == "1":
            hello = json.loads(await ws.get_message())
            if self.refuse is not None or hello.get("token") != s.token or s.ended:
                code = self.refuse or "resume_failed"
                await ws.send_message(
                    _dumps({"type": "error", "error": {"code": code, "message": "no such"}})
                )
                await ws.aclose(1008)
                return
            last = hello["last_seq"]
            replay = s.events[last:]
            await ws.send_message(
                _dumps(
                    {
                        "type": "session.resumed",
                        "session_id": "sess",
                        "last_seq": last,
                        "next_seq": len(s.events) + 1,
                        "replayed": len(replay),
                        "received": len(s.taken),
                    }
                )
            )
            for event in replay:
                await ws.send_message(event)
        else:
            s.ws = ws
            await s.emit(_dumps({"type": "session.created", "session": {"id": "sess"}}))
            if query.get("resumable") == "1" and self.offer:
                link = {"type": "session.resumable", "token": s.token, "replica": self.replica}
                await ws.send_message(_dumps({**link, "grace_seconds": s.grace}))
        s.ws = ws
        await self.serve(ws)

    async def serve(self, ws: trio_websocket.WebSocketConnection) -> None:
        s = self.session
        while True:
            try:
                message = json.loads(await ws.get_message())
            except trio_websocket.ConnectionClosed:
                return
            if message["type"] == "session.event_ack":
                s.acks.append(message["seq"])
                continue
            s.taken.append(message)
            kind = message["type"]
            if kind == "session.update":
                f = VOICECHAT_FIGURES
                session = {
                    "id": "sess",
                    "model": "fake",
                    "frame_samples": f.frame_samples,
                    "output_frame_samples": f.output_frame_samples,
                    "input_audio_format": {"sample_rate": f.input_sample_rate},
                    "output_audio_format": {"sample_rate": f.output_sample_rate},
                }
                await s.emit(_dumps({"type": "session.updated", "session": session}))
            elif kind == "input_audio_buffer.append":
                await s.emit(_audio(sum(m["type"] == kind for m in s.taken) - 1))
            elif kind == "input_audio_buffer.commit":
                await s.emit(_dumps({"type": "input_audio_buffer.committed"}))
                s.ended = True
                await s.emit(_dumps({"type": "response.done", "frame_index": -1}))
                await ws.aclose(1000)
                return
            if len(s.taken) % self.drop_after == 0 and self.drops > 0:
                self.drops -= 1
                s.ws = None
                # An event made while nobody is connected goes to the journal only.
                await s.emit(_dumps({"type": "session.pong"}))
                await ws._stream.aclose()  # the TCP connection ends: no close frame
                return


@asynccontextmanager
async def fake_server(server: FakeServer) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        listener = await nursery.start(
            trio_websocket.serve_websocket, server.handler, "127.0.0.1", 0, None
        )
        yield f"ws://127.0.0.1:{listener.port}/v1/realtime"
        nursery.cancel_scope.cancel()


async def _converse(url: str, frames: int, **kwargs: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with connect(url, **kwargs) as conn:
        await conn.configure()
        assert conn.created is not None and conn.updated is not None
        seen += [conn.created.raw, conn.updated.raw]
        for _ in range(frames):
            await conn.append(np.zeros(VOICECHAT_FIGURES.frame_samples, np.int16))
        await conn.commit()
        async for event in conn:
            seen.append(event.raw)
        assert conn.resumes == (1 if kwargs.get("resume", True) else 0)
    return seen


async def test_a_drop_mid_answer_is_resumed_with_nothing_lost_or_doubled() -> None:
    server = FakeServer(drop_after=4)
    async with fake_server(server) as url:
        seen = await _converse(url, frames=12)
    s = server.session
    # The caller saw every numbered event once, in order (the link messages hidden).
    assert [_dumps(e) for e in seen] == s.events
    assert sum(e["type"] == "session.pong" for e in seen) == 1  # made during the drop
    audio = [e["frame_index"] for e in seen if e["type"] == "response.audio.delta"]
    assert audio == list(range(12))
    # The server took each client message once, in the order sent.
    kinds = [m["type"] for m in s.taken]
    assert kinds == ["session.update"] + ["input_audio_buffer.append"] * 12 + [
        "input_audio_buffer.commit"
    ]
    assert server.paths[0] == "/v1/realtime?resumable=1"
    assert server.paths[1] == "/v1/realtime?resume=1&replica=r1"


async def test_the_client_acknowledges_what_it_received() -> None:
    server = FakeServer(drops=0)
    async with fake_server(server) as url:
        async with connect(url) as conn:
            await conn.configure()
            for _ in range(70):  # one frame in, one out: acks reach the server live
                await conn.append(np.zeros(VOICECHAT_FIGURES.frame_samples, np.int16))
                await conn.receive()
            await conn.commit()
            async for _ in conn:
                pass
    assert server.session.acks[:1] == [64]  # every 64 events (a fast server: within 1 s)


async def test_without_resume_a_drop_is_an_error_as_before() -> None:
    server = FakeServer(drop_after=4)
    async with fake_server(server) as url:
        with pytest.raises(ServerClosed, match="1006"):
            await _converse(url, frames=12, resume=False)
    assert server.paths == ["/v1/realtime"]


async def test_a_server_that_offers_nothing_is_not_resumed() -> None:
    server = FakeServer(drop_after=4, offer=False)
    async with fake_server(server) as url:
        with pytest.raises(ServerClosed, match="1006"):
            await _converse(url, frames=12)
    assert len(server.paths) == 1


@pytest.mark.parametrize("code", ["resume_failed", "resync_required"])
async def test_a_refused_resume_is_one_clear_error(code: str) -> None:
    server = FakeServer(drop_after=4, refuse=code)
    async with fake_server(server) as url:
        with pytest.raises(ResumeFailed) as caught:
            await _converse(url, frames=12)
    assert caught.value.code == code
    err = io.StringIO()
    assert report(caught.value, err) == 1
    assert err.getvalue().startswith("error: the connection dropped") and code in err.getvalue()
    assert err.getvalue().count("\n") == 1


async def test_the_file_client_output_is_the_same_with_a_drop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    outputs = []
    for drops in (0, 2):
        server = FakeServer(drop_after=3, drops=drops)
        async with fake_server(server) as url:
            pcm = np.zeros(VOICECHAT_FIGURES.frame_samples * 10, np.int16)
            result = await run_file_client(url, pcm)
        assert server.drops == 0
        counts = {k: v for k, v in result.event_counts.items() if k != "session.pong"}
        outputs.append((result.pcm.tobytes(), counts, result.texts))
    assert outputs[0] == outputs[1]  # the fake's own event during a drop aside
    # stderr: a line when a drop is seen, one when it is over (a drop during a resume
    # is part of that resume).
    said = capsys.readouterr().err
    assert said.count("connection lost: reconnecting") == said.count("session resumed") >= 1


async def test_reconnects_back_off_until_the_grace_runs_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Nothing answers after the drop: tries at 0, 0.25, 0.5, 1, 2, 4, 4 ... s apart until
    the server's grace (10 s here) is spent, then one error that says so."""
    tries: list[float] = []

    async def refused(target: str) -> trio_websocket.WebSocketConnection:
        tries.append(trio.current_time())
        raise ServerUnreachable(f"cannot connect to {target}: connection refused")

    link = Link("ws://h:1/v1/realtime", refused, Outbox(), connect_timeout=30.0)
    link.offer = ResumeOffer("t", None, 10.0)
    with pytest.raises(ResumeExpired, match=r"10 s grace period \(6 tries; last: cannot connect"):
        await link.resume(None)  # type: ignore[arg-type]  # no try gets that far
    assert tries == pytest.approx([0.0, 0.25, 0.75, 1.75, 3.75, 7.75])


# --- through a real server ------------------------------------------------------------


async def _with_and_without_drops(url: str, port: int) -> None:
    """The file client on ``url`` and through a proxy to ``port`` that cuts the
    connection twice mid-answer: the answer, its text and its events are the same,
    byte for byte."""
    pcm = (np.random.default_rng(5).standard_normal(30 * FRAME) * 3000).astype(np.int16)
    clean_out = io.StringIO()
    # Paced like a live stream, so both drops come while the question is still sent.
    clean = await run_file_client(
        url, pcm, seed=3, realtime=True, printer=TranscriptPrinter(clean_out)
    )
    async with cut_proxy(port) as proxy:
        audio = 0

        def on_event(event: dict[str, Any]) -> None:
            nonlocal audio
            if event["type"] == "response.audio.delta":
                audio += 1
                if audio in (6, 17):
                    proxy.cut()

        out = io.StringIO()
        dropped = await run_file_client(
            f"ws://127.0.0.1:{proxy.port}/v1/realtime",
            pcm,
            seed=3,
            realtime=True,
            on_event=on_event,
            printer=TranscriptPrinter(out),
        )
    assert proxy.cuts == 2 and proxy.connections == 3
    assert dropped.pcm.tobytes() == clean.pcm.tobytes()
    assert dropped.frames == clean.frames == 30  # one per append: none lost, none twice
    assert dropped.texts == clean.texts and out.getvalue() == clean_out.getvalue()
    assert dropped.event_counts == clean.event_counts


async def test_the_file_client_through_a_server_is_the_same_with_drops(engine: Engine) -> None:
    async with running_server(engine) as server:
        await _with_and_without_drops(server.url, int(server.http.rsplit(":", 1)[1]))


@pytest.mark.slow
async def test_the_file_client_on_the_demo_model_is_the_same_with_drops(
    demo_server: ServerProcess,
) -> None:
    """The same through the real model path (the demo checkpoint, a subprocess).
    Each append is one frame of answer: 30 frames out means each of the 30 appends
    was taken once across the resumes."""
    await _with_and_without_drops(demo_server.url, int(demo_server.http.rsplit(":", 1)[1]))


async def test_the_file_client_resumes_a_drop_after_the_server_finished(engine: Engine) -> None:
    """Sent as fast as the server takes it, the answer is done on the server (its last
    events and its close written, or written while it waited for the resume) before the
    client has read them; a cut then is resumed from the ended conversation's tail (on
    the shared 2-core VM this was the path taken; the socket tests pin it down): the
    same answer, event for event."""
    pcm = (np.random.default_rng(5).standard_normal(30 * FRAME) * 3000).astype(np.int16)
    async with running_server(engine) as server:
        clean = await run_file_client(
            server.url, pcm, seed=3, printer=TranscriptPrinter(io.StringIO())
        )
        async with cut_proxy(int(server.http.rsplit(":", 1)[1])) as proxy:
            audio = 0

            def on_event(event: dict[str, Any]) -> None:
                nonlocal audio
                if event["type"] == "response.audio.delta":
                    audio += 1
                    if audio == 17:
                        proxy.cut()

            dropped = await run_file_client(
                f"ws://127.0.0.1:{proxy.port}/v1/realtime",
                pcm,
                seed=3,
                on_event=on_event,
                printer=TranscriptPrinter(io.StringIO()),
            )
    assert proxy.cuts == 1
    assert dropped.pcm.tobytes() == clean.pcm.tobytes()
    assert dropped.event_counts == clean.event_counts


def test_the_clients_resume_unless_told_not_to() -> None:
    parser = argparse.ArgumentParser()
    add_connection_options(parser)
    assert parser.parse_args([]).resume is True
    assert parser.parse_args(["--no-resume"]).resume is False


async def test_a_resume_past_the_servers_journal_ends_in_one_clear_error(
    fake_model: FakeModel,
) -> None:
    """A server whose journal keeps almost nothing (a few hundred bytes: less than one
    audio frame) cannot replay what the client missed: the file client ends with
    ``resync_required``, one line, exit 1."""
    pcm = (np.random.default_rng(5).standard_normal(60 * FRAME) * 3000).astype(np.int16)
    with running_engine(fake_model) as engine:
        async with running_server(engine, limits=Limits(resume_journal_bytes=300)) as server:
            async with cut_proxy(int(server.http.rsplit(":", 1)[1])) as proxy:
                audio = 0

                def on_event(event: dict[str, Any]) -> None:
                    nonlocal audio
                    if event["type"] == "response.audio.delta":
                        audio += 1
                        if audio == 6:
                            proxy.cut()

                with pytest.raises(ResumeFailed) as caught:
                    await run_file_client(
                        f"ws://127.0.0.1:{proxy.port}/v1/realtime",
                        pcm,
                        # As fast as the server takes it, at most 10 frames ahead:
                        # events are on their way when the cut comes, and the
                        # question is not over.
                        max_ahead_seconds=0.8,
                        on_event=on_event,
                        printer=TranscriptPrinter(io.StringIO()),
                    )
    assert caught.value.code == "resync_required"
    err = io.StringIO()
    assert report(caught.value, err) == 1
    assert err.getvalue().count("\n") == 1 and "resync_required" in err.getvalue()


async def test_the_microphone_client_resumes_a_drop(engine: Engine, fake_model: FakeModel) -> None:
    """A live microphone session whose connection is cut while it talks: it says so on
    stderr, resumes, and every captured frame reaches the model once."""
    source = ArrayInput(_speech_like(2.0, 48_000), 48_000)
    sink = ArrayOutput(44_100)
    async with running_server(engine) as server:
        async with cut_proxy(int(server.http.rsplit(":", 1)[1])) as proxy:

            async def cut_midway() -> None:
                while len(fake_model.calls_named("push")) < 8:
                    await trio.sleep(0.01)
                proxy.cut()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cut_midway)
                with trio.fail_after(30):
                    result, _, err = await _drive(
                        f"ws://127.0.0.1:{proxy.port}/v1/realtime", source, sink
                    )
    assert proxy.cuts == 1 and "connection lost: reconnecting" in err and "session resumed" in err
    assert result.committed and result.done
    assert result.frames_sent == result.audio_frames == 25  # 2 s: 25 frames of 80 ms
    assert sum(fake_model.calls_named("push")) == 25 * FRAME  # each frame heard once
