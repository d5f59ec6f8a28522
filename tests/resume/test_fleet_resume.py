"""Resumable conversations through the fleet: two demo replicas started with
``--replica-id`` equal to their HAProxy server names, behind the shipped
``deploy/haproxy/haproxy.cfg``, and a TCP proxy in front that cuts the client's
connection mid-answer. The resume (``?resume=1&replica=NAME``) reaches the replica that
holds the conversation (HAProxy's ``use-server``; its log names the server), and the
answer equals one with no drop, bit for bit.

Skips like tests/deploy/test_fleet.py without ``haproxy``.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from realtime.client import AudioDelta, ResponseDone, connect
from realtime.models.base import VOICECHAT_FIGURES
from realtime.testing.servers import ServerProcess
from tests.deploy.test_fleet import (
    free_port,
    in_conversations,
    port_of,
    render_config,
    run_haproxy,
    wait_for,
)
from tests.helpers import http, start_realtime_server
from tests.resume.cut_proxy import CutProxy, cut_proxy

pytestmark = pytest.mark.slow

FRAME = VOICECHAT_FIGURES.frame_samples


async def start_named_fleet(
    stack: contextlib.ExitStack, tmp: Path, *serve_args: str
) -> tuple[list[ServerProcess], int, Path, Path]:
    """Two replicas named replica1 and replica2 (``--replica-id``, as the config's
    server names) behind the shipped config: the replicas, the front's port,
    HAProxy's log and its runtime API's socket."""
    replicas = [
        stack.enter_context(
            start_realtime_server(*serve_args, "--replica-id", f"replica{i}", log_dir=tmp)
        )
        for i in (1, 2)
    ]
    front = free_port()
    config, stats = render_config(tmp, front, [port_of(r) for r in replicas])
    log = tmp / "haproxy.log"
    stack.enter_context(run_haproxy(config, log))
    await wait_for(lambda: in_conversations(stats, "status") == ["UP"] * 2, "both UP")
    return replicas, front, log, stats


async def _answer(
    url: str,
    pcm: npt.NDArray[np.int16],
    cut_at: tuple[int, ...] = (),
    proxy: CutProxy | None = None,
    silent_upstream: bool = False,
) -> tuple[bytes, str | None, int]:
    """One conversation: the question's frames, then commit; the answer's audio, the
    replica the server named, and how often it was resumed."""
    chunks: list[bytes] = []
    async with connect(url) as conn:
        await conn.configure(seed=3)
        assert conn.link is not None and conn.link.offer is not None
        replica = conn.link.offer.replica

        async def send() -> None:
            for start in range(0, pcm.size, FRAME):
                await conn.append(pcm[start : start + FRAME])
                await trio.sleep(0.02)
            await conn.commit()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            while True:
                event = await conn.receive()
                if isinstance(event, AudioDelta):
                    chunks.append(event.pcm().tobytes())
                    if proxy is not None and len(chunks) in cut_at:
                        proxy.cut(silent_upstream=silent_upstream)
                elif isinstance(event, ResponseDone):
                    break
        resumes = conn.resumes
    return b"".join(chunks), replica, resumes


@pytest.mark.parametrize("silent_upstream", [False, True], ids=["closed", "vanished"])
async def test_a_resume_through_haproxy_lands_on_its_replica_bit_for_bit(
    tmp_path: Path, silent_upstream: bool
) -> None:
    """Two drops mid-answer: the client's connection closed (HAProxy sees it end), or
    vanished (HAProxy still holds the old connection, and so the replica's one slot
    by its count: the resume goes past maxconn, and the replica replaces the old one)."""
    pcm = (np.random.default_rng(11).standard_normal(24 * FRAME) * 3000).astype(np.int16)
    with contextlib.ExitStack() as stack:
        _, front, log, _ = await start_named_fleet(stack, tmp_path)
        url = f"ws://127.0.0.1:{front}/v1/realtime"
        clean, _, _ = await _answer(url, pcm)
        async with cut_proxy(front) as proxy:
            with trio.fail_after(60):
                dropped, replica, resumes = await _answer(
                    f"ws://127.0.0.1:{proxy.port}/v1/realtime",
                    pcm,
                    cut_at=(5, 14),
                    proxy=proxy,
                    silent_upstream=silent_upstream,
                )
        assert replica in ("replica1", "replica2") and resumes == 2
        assert dropped == clean  # bit for bit, with two drops
        await trio.sleep(0.5)  # HAProxy logs a request once it ends
    # HAProxy sent both resumes to the server the conversation's replica id names,
    # past maxconn where it still counted the old connection.
    text = log.read_text()
    lines = [line for line in text.splitlines() if "resume=1" in line]
    assert len(lines) == 2, text
    for line in lines:
        assert f"replica={replica}" in line
        assert re.search(rf"(conversations|resumes)/{replica}\b", line), line
        waited = int(line.split(" 101 ")[0].split()[-1].split("/")[1])  # Tw: queued ms
        assert waited < 1500, line
    if silent_upstream:
        assert any(f"resumes/{replica}" in line for line in lines), text


async def _open_outcome(url: str) -> str:
    """What a new client gets: its first event's type or error code, or the HTTP
    status of a refused upgrade (then the socket is closed with 1000)."""
    try:
        async with open_websocket_url(url) as ws:
            with trio.fail_after(15):
                first = json.loads(await ws.get_message())
            await ws.aclose(1000)
    except ConnectionRejected as exc:
        return f"HTTP {exc.status_code}"
    if first["type"] == "error":
        return str(first["error"]["code"])
    return str(first["type"])


async def test_new_clients_beside_a_detached_and_a_resumed_conversation(tmp_path: Path) -> None:
    """A conversation whose client dropped holds its replica's one slot with no TCP
    connection, which HAProxy's maxconn cannot see; after its resume (past maxconn
    while HAProxy still counted the old connection) it holds it uncounted. New
    clients meanwhile are served, or told the fleet is busy (server_busy, HTTP 503),
    never anything else; with every other slot taken as well, a new client is told so
    with HTTP 503 before the upgrade (the replica refuses it, HAProxy retries it
    elsewhere); the resume lands on its replica whatever came meanwhile."""
    outcomes: dict[str, list[str]] = {}
    with contextlib.ExitStack() as stack:
        replicas, front, _, _ = await start_named_fleet(stack, tmp_path)
        new = f"ws://127.0.0.1:{front}/v1/realtime"
        async with cut_proxy(front) as proxy:
            opening = f"ws://127.0.0.1:{proxy.port}/v1/realtime?resumable=1"
            async with open_websocket_url(opening) as ws:
                assert json.loads(await ws.get_message())["type"] == "session.created"
                offer = json.loads(await ws.get_message())
                assert offer["type"] == "session.resumable"
                # A session is held for a resume once its client has said something.
                await ws.send_message(json.dumps({"type": "session.update", "session": {}}))
                assert json.loads(await ws.get_message())["type"] == "session.updated"
                proxy.cut()
        held = replicas[int(offer["replica"][-1]) - 1]
        await wait_for(lambda: http("GET", held.http + "/health")[1].get("detached") == 1, "")
        outcomes["detached"] = [await _open_outcome(new) for _ in range(6)]
        # The other replica taken too: HAProxy sees the detached one's slot free, and
        # sends the next client there; the replica refuses it before the upgrade (503),
        # HAProxy tries the other (full: it queues), then answers 503 itself.
        async with open_websocket_url(new) as other:
            assert json.loads(await other.get_message())["type"] == "session.created"
            outcomes["full"] = [await _open_outcome(new)]
            await other.aclose(1000)
        resume = f"{new}?resume=1&replica={offer['replica']}"
        async with open_websocket_url(resume) as ws:
            hello = {"type": "session.resume", "token": offer["token"], "last_seq": 2}
            await ws.send_message(json.dumps(hello))
            answer = json.loads(await ws.get_message())
            assert answer["type"] == "session.resumed", answer
            outcomes["resumed"] = [await _open_outcome(new) for _ in range(6)]
            await ws.aclose(1000)
    print("new clients beside a detached, then a resumed conversation:", outcomes)
    assert outcomes["full"] == ["HTTP 503"], outcomes  # busy before the upgrade, not 1013
    # Never server_busy after the upgrade: the held replica refuses them before it.
    for seen in (outcomes["detached"], outcomes["resumed"]):
        assert set(seen) <= {"session.created", "HTTP 503"}, outcomes
        assert "session.created" in seen, outcomes  # the other replica is free


async def test_new_clients_beside_a_conversation_resumed_past_maxconn(tmp_path: Path) -> None:
    """A resume that HAProxy sends past maxconn (``backend resumes``: the client's
    side of the old connection closed, HAProxy still counts its server side for
    ``timeout client-fin``) holds its replica's slot uncounted once the old connection
    is gone; every new client is still served, by the free
    replica (the held one refuses them with HTTP 503 before the upgrade, HAProxy
    retries the other), never ``server_busy`` after the upgrade."""
    with contextlib.ExitStack() as stack:
        _, front, log, stats = await start_named_fleet(stack, tmp_path)
        new = f"ws://127.0.0.1:{front}/v1/realtime"
        async with cut_proxy(front) as proxy:
            opening = f"ws://127.0.0.1:{proxy.port}/v1/realtime?resumable=1"
            async with open_websocket_url(opening) as ws:
                assert json.loads(await ws.get_message())["type"] == "session.created"
                offer = json.loads(await ws.get_message())
                await ws.send_message(json.dumps({"type": "session.update", "session": {}}))
                assert json.loads(await ws.get_message())["type"] == "session.updated"
                proxy.cut()
            held = int(offer["replica"][-1]) - 1
            resume = f"{new}?resume=1&replica={offer['replica']}"
            async with open_websocket_url(resume) as ws:
                hello = {"type": "session.resume", "token": offer["token"], "last_seq": 2}
                await ws.send_message(json.dumps(hello))
                assert json.loads(await ws.get_message())["type"] == "session.resumed"
                # The replaced connection ends; HAProxy then counts nothing on the held
                # replica, which still serves the resumed conversation.
                await wait_for(lambda: in_conversations(stats, "scur")[held] == "0", "old one gone")
                outcomes = [await _open_outcome(new) for _ in range(6)]
                await ws.aclose(1000)
        await trio.sleep(0.5)  # HAProxy logs a request once it ends
    print("new clients beside a conversation resumed past maxconn:", outcomes)
    assert outcomes == ["session.created"] * 6, outcomes
    assert re.search(rf"resumes/{offer['replica']}\b", log.read_text()), log.read_text()
