"""The tail of an ended conversation, through a real socket on both endpoints: the
server writes its last events and closes (here: its idle timeout), and the client's
connection drops before it read them. The session ends and frees its slot at once,
but its unread events stay resumable for the grace: the resumed client gets every
event once, then the same close. A client that read everything and answered the close
leaves nothing behind."""

from __future__ import annotations

import pytest
import trio

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.session.link import Link
from tests.helpers import ahttp, running_server
from tests.resume.test_resume_errors import NATIVE, OPENAI, opened, refused, until_released

IDLE = 1.0


async def closed_by_server(links: list[Link]) -> Link:
    """The session once the server has decided its close (its last events written)."""
    with trio.fail_after(10):
        while not (closing := [link for link in links if link.closing is not None]):
            await trio.sleep(0.02)
    return closing[0]


@pytest.mark.parametrize("path", [NATIVE, OPENAI], ids=["native", "openai"])
async def test_a_drop_after_the_servers_close_resumes_the_tail(engine: Engine, path: str) -> None:
    async with running_server(engine, limits=Limits(idle_timeout=IDLE)) as server:
        peer = await opened(server.http, path)
        read = peer.seen
        # The client reads nothing more: the server times it out, writes its last
        # events and its close; then the client's connection drops, unread.
        link = await closed_by_server(server.state.resumes.holders())
        peer.drop()
        await until_released(engine)  # the slot is freed at once, as always
        with trio.fail_after(5):
            while not link.ended:
                await trio.sleep(0.02)
        assert server.state.tails() == 1 and server.state.detached() == 0
        assert not server.state.resumable_held()
        _, health = await ahttp("GET", server.http + "/health")
        assert health["resume_tails"] == 1 and health["detached"] == 0
        assert health["sessions_active"] == 0
        written = link.journal.sent
        assert written > read

        answer = await peer.resume()
        assert answer["type"] == "session.resumed", answer
        assert answer["last_seq"] == read and answer["next_seq"] == written + 1
        assert answer["replayed"] == written - read
        while await peer.recv() is not None:
            pass
        assert peer.seen == written  # every event once, numbered without a gap
        last = peer.events[-1]  # the idle timeout's error, in the endpoint's shape
        assert last["type"] == "error" and "s; closing" in last["error"]["message"]
        assert peer.ws.close_code == 1008  # the session's own close, again
        await peer.close(1008)  # the client answers it: the tail is done
        with trio.fail_after(5):
            while server.state.tails():
                await trio.sleep(0.02)
        assert await refused(peer) == ("resume_failed", 1008)


@pytest.mark.parametrize("path", [NATIVE, OPENAI], ids=["native", "openai"])
async def test_a_client_that_answers_the_close_leaves_no_tail(engine: Engine, path: str) -> None:
    async with running_server(engine, limits=Limits(idle_timeout=IDLE)) as server:
        peer = await opened(server.http, path)
        link = await closed_by_server(server.state.resumes.holders())
        while await peer.recv() is not None:
            pass
        assert peer.ws.close_code == 1008
        await peer.close(1008)
        with trio.fail_after(5):
            while not link.ended:
                await trio.sleep(0.02)
        assert link.settled and len(server.state.resumes) == 0
        assert server.state.tails() == 0
        await until_released(engine)
        assert await refused(peer) == ("resume_failed", 1008)
