"""The link a resumable session talks through, on in-memory sockets with a mock clock:
the grace period, the paused clock, the replay, acks, replacing a half-open socket."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import trio
import trio.testing

from realtime.session.lifetime import TransportClosed
from realtime.session.link import Link, Offer, Resumed
from realtime.session.resume import Journal, Registry


class Socket:
    """An in-memory WebSocket: the test feeds it client frames and reads what was sent."""

    def __init__(self) -> None:
        self.incoming_send, self.incoming = trio.open_memory_channel[str | TransportClosed](16)
        self.sent: list[str] = []
        self.closed: tuple[int, str] | None = None

    async def receive(self) -> str | bytes | None:
        item = await self.incoming.receive()
        if isinstance(item, TransportClosed):
            raise item
        return item

    async def send(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def feed(self, item: str | TransportClosed) -> None:
        self.incoming_send.send_nowait(item)

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(text) for text in self.sent]


def error_text(code: str, message: str) -> str:
    return json.dumps({"type": "error", "error": {"code": code, "message": message}})


def make_link(
    socket: Socket, *, grace: float = 30.0, max_bytes: int = 1 << 20, max_seconds: float = 60.0
) -> tuple[Link, Registry[Link]]:
    registry: Registry[Link] = Registry()
    offer = Offer(registry, "acme", "/v1/realtime", "r1", grace)
    link = Link(socket, Journal(max_bytes, max_seconds), offer, error_text)
    link.session_id = "sess_1"
    return link, registry


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_offer_announces_a_token_kept_only_as_a_digest() -> None:
    socket = Socket()
    link, registry = make_link(socket)
    await link.offer()
    resumable = socket.json()[0]
    assert resumable == {
        "type": "session.resumable",
        "token": resumable["token"],
        "replica": "r1",
        "grace_seconds": 30.0,
        "journal_max_bytes": 1 << 20,
        "journal_max_seconds": 60.0,
    }
    assert registry.find(resumable["token"], "acme", "/v1/realtime") is link
    assert link.journal.sent == 0  # a link message is not numbered
    link.end()
    assert registry.find(resumable["token"], "acme", "/v1/realtime") is None


async def test_acks_are_the_links_and_bad_ones_are_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    socket = Socket()
    link, _ = make_link(socket)
    notices: list[str] = []
    link.notify = notices.append
    for i in range(3):
        await link.send(f'{{"n":{i}}}')
    socket.feed(json.dumps({"type": "session.event_ack", "seq": 2}))
    socket.feed(json.dumps({"type": "session.event_ack", "seq": 9}))
    socket.feed(json.dumps({"type": "session.event_ack", "seq": True}))
    socket.feed(json.dumps({"type": "session.event_ack"}))
    socket.feed(json.dumps({"type": "session.resume", "token": "x", "last_seq": 0}))
    socket.feed('{"type":"session.update"}')
    assert await link.receive() == '{"type":"session.update"}'
    assert link.received == 1 and link.journal.floor == 2
    codes = [json.loads(text)["error"]["code"] for text in notices]
    assert codes == ["invalid_ack", "invalid_ack", "invalid_ack", "resume_failed"]


async def test_a_drop_detaches_and_the_grace_ends_the_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    socket = Socket()
    link, _ = make_link(socket, grace=30.0)
    start = trio.current_time()
    socket.feed("session.update")
    assert await link.receive() == "session.update"
    socket.feed(TransportClosed(None))
    with pytest.raises(TransportClosed) as raised:
        await link.receive()
    assert raised.value.outcome == "resume_expired" and link.expired
    assert trio.current_time() - start == pytest.approx(30.0)
    # The session's clock stood still from the drop on.
    assert link.now() == pytest.approx(start)


async def test_a_close_frame_with_1000_ends_at_once() -> None:
    socket = Socket()
    link, _ = make_link(socket)
    socket.feed("hello")
    assert await link.receive() == "hello"
    socket.feed(TransportClosed(1000))
    with pytest.raises(TransportClosed) as raised:
        await link.receive()
    assert raised.value.code == 1000 and raised.value.outcome is None


async def test_a_drop_before_the_first_client_message_ends_at_once() -> None:
    socket = Socket()
    link, _ = make_link(socket)
    socket.feed(TransportClosed(None))
    with pytest.raises(TransportClosed) as raised:
        await link.receive()
    assert raised.value.code is None and raised.value.outcome is None
    assert not link.detached


async def test_a_resume_replays_after_last_seq_and_the_clock_skips_the_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = Socket()
    link, _ = make_link(first, grace=30.0)
    for i in range(1, 6):
        await link.send(f"event {i}")
    first.feed("m1")
    assert await link.receive() == "m1"
    first.feed(TransportClosed(1006))
    second = Socket()
    before = link.now()
    async with trio.open_nursery() as nursery:
        received: list[str | bytes | None] = []

        async def reader() -> None:
            received.append(await link.receive())

        nursery.start_soon(reader)
        await trio.sleep(10)  # detached for ten seconds
        await link.send("event 6")  # work already under way: to the journal only
        assert link.detached and first.sent == [f"event {i}" for i in range(1, 6)]
        result = await link.resume(second, 3)
        assert isinstance(result, Resumed) and result.replaced_opener is None
        second.feed("m2")
    assert received == ["m2"] and link.received == 2
    resumed = json.loads(second.sent[0])
    assert resumed == {
        "type": "session.resumed",
        "session_id": "sess_1",
        "last_seq": 3,
        "next_seq": 7,
        "replayed": 3,
        "received": 1,
    }
    assert second.sent[1:] == ["event 4", "event 5", "event 6"]
    assert link.now() == pytest.approx(before)  # ten seconds away did not count
    await link.send("event 7")
    assert second.sent[-1] == "event 7" and link.journal.sent == 7


async def test_a_resume_past_the_journal_or_after_the_end_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = Socket()
    link, _ = make_link(first, max_bytes=20)
    for _ in range(5):
        await link.send("x" * 9)
    second = Socket()
    assert await link.resume(second, 0) == "resync_required"
    assert await link.resume(second, 9) == "resync_required"  # past what was sent
    assert second.sent == [] and link.socket is first  # nothing changed
    link.end()
    assert await link.resume(second, 5) == "resume_failed"


async def test_a_resume_after_the_grace_fails(autojump_clock: trio.testing.MockClock) -> None:
    first = Socket()
    link, _ = make_link(first, grace=5.0)
    first.feed("m1")
    await link.receive()
    first.feed(TransportClosed(None))
    with pytest.raises(TransportClosed):
        await link.receive()
    assert await link.resume(Socket(), 0) == "resume_failed"


async def test_a_resume_replaces_a_half_open_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = Socket()
    link, _ = make_link(first)
    await link.send("event 1")
    second = Socket()
    async with trio.open_nursery() as nursery:
        got: list[str | bytes | None] = []

        async def reader() -> None:
            got.append(await link.receive())  # blocked on the half-open first socket

        nursery.start_soon(reader)
        await trio.sleep(1)
        result = await link.resume(second, 1)
        assert isinstance(result, Resumed) and result.replaced_opener is not None
        assert result.replaced_opener.socket is first and not result.replaced_opener.stuck
        first.feed("late, from the old socket")
        second.feed("from the new one")
    assert got == ["from the new one"]
    assert json.loads(second.sent[0])["replayed"] == 0
    assert not result.attachment.released.is_set()
    third = Socket()
    again = await link.resume(third, 1)  # a resume connection replaced in turn
    assert isinstance(again, Resumed) and again.replaced_opener is None
    assert result.attachment.released.is_set() and result.attachment.replaced
    third.feed(TransportClosed(None))  # the newest drops: released, detached
    with trio.move_on_after(1):
        await link.receive()
    assert again.attachment.released.is_set() and not again.attachment.replaced
    assert link.detached and link.deadline < math.inf


class StuckSocket(Socket):
    """A socket whose writes never finish (a client that reads nothing)."""

    async def send(self, text: str) -> None:
        await trio.sleep_forever()


async def test_a_cancelled_resume_leaves_the_grace_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = Socket()
    link, _ = make_link(first, grace=30.0)
    await link.send("event 1")
    first.feed("m1")
    await link.receive()
    first.feed(TransportClosed(None))
    start = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def resume_stuck() -> None:
            with trio.move_on_after(5):
                await link.resume(StuckSocket(), 0)

        nursery.start_soon(resume_stuck)
        with pytest.raises(TransportClosed) as raised:
            await link.receive()
    assert raised.value.outcome == "resume_expired"
    assert trio.current_time() - start == pytest.approx(30.0)


async def test_an_unread_tail_is_kept_for_the_grace_then_resumes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The server closed the session, the client neither answered the close nor
    acknowledged everything: its end waits for a resume for the grace (the replay,
    then the same close), and after the grace it is gone."""
    socket = Socket()
    link, registry = make_link(socket, grace=30.0)
    await link.offer()
    token = socket.json()[0]["token"]
    socket.feed('{"type":"session.update"}')
    await link.receive()
    for i in range(1, 4):
        await link.send(f'{{"n":{i}}}')
    socket.feed(json.dumps({"type": "session.event_ack", "seq": 1}))
    socket.feed(TransportClosed(None))  # dropped after the close went out
    await link.close(1008, "idle")
    assert socket.closed == (1008, "idle") and not link.settled
    link.end()
    assert link.ended and registry.find(token, "acme", "/v1/realtime") is link
    assert link.journal.floor == 1  # the ack read while closing counts
    await trio.sleep(29.0)
    again = Socket()
    again.feed(TransportClosed(1008))  # this time the client answers the close
    resumed = await link.resume(again, 1)
    assert isinstance(resumed, Resumed) and resumed.replayed == 2
    assert resumed.attachment.released.is_set()
    assert [event.get("n") for event in again.json()[1:]] == [2, 3]
    assert again.closed == (1008, "idle") and link.settled
    assert registry.find(token, "acme", "/v1/realtime") is None  # done

    # Another one that is never resumed: gone with its grace.
    socket = Socket()
    link, registry = make_link(socket, grace=30.0)
    await link.offer()
    token = socket.json()[0]["token"]
    socket.feed('{"type":"session.update"}')
    await link.receive()
    await link.send('{"n":1}')
    socket.feed(TransportClosed(None))
    await link.close(1000, "done")
    link.end()
    await trio.sleep(30.0)
    now = trio.current_time()
    assert registry.find(token, "acme", "/v1/realtime", now) is None and len(registry) == 0
    assert await link.resume(Socket(), 0) == "resume_failed"


async def test_an_answered_close_or_a_full_ack_ends_the_session_for_good(
    autojump_clock: trio.testing.MockClock,
) -> None:
    for answer, ack in ((TransportClosed(1000), 0), (TransportClosed(None), 1)):
        socket = Socket()
        link, registry = make_link(socket)
        await link.offer()
        socket.feed('{"type":"session.update"}')
        await link.receive()
        await link.send('{"n":1}')
        if ack:
            socket.feed(json.dumps({"type": "session.event_ack", "seq": ack}))
        socket.feed(answer)
        await link.close(1000, "done")
        link.end()
        assert len(registry) == 0
