"""Two demo replicas behind HAProxy with the shipped ``deploy/haproxy/haproxy.cfg``.

Shows the behaviour docs/deploy.md promises: one conversation per replica, a
queue then a 503 when all are busy, a replica free as soon as its socket closes,
a SIGKILLed replica costing only its own client, and a draining replica taking
no new conversation while its open one finishes; that the OpenAI endpoint is
balanced like the native one, also for two clients connecting in the same
instant; and that with ``--max-sessions 2`` replicas and ``REALTIME_MAX_SESSIONS=2``
for HAProxy the same config holds two conversations per replica. Skips without
``haproxy`` unless ``REALTIME_REQUIRE_HAPROXY=1`` (CI installs it).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from realtime.testing.servers import ServerProcess
from tests.helpers import (
    REPO,
    Client,
    ahttp,
    append_msg,
    connect,
    http,
    noise,
    start_realtime_server,
)
from tests.reliability.rawws import RawClient

pytestmark = pytest.mark.slow

CONFIG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or next(
    (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.path.exists(p)), None
)
if HAPROXY is None and os.environ.get("REALTIME_REQUIRE_HAPROXY") != "1":
    pytest.skip(
        "haproxy is not installed (apt-get install haproxy; CI sets REALTIME_REQUIRE_HAPROXY=1)",
        allow_module_level=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_of(server: ServerProcess) -> int:
    return int(server.http.rsplit(":", 1)[1])


def render_config(tmp: Path, front: int, replicas: list[int]) -> tuple[Path, Path]:
    """The shipped config with test ports and paths (and nothing else) changed."""
    text = CONFIG.read_text()
    stats = tmp / "haproxy.sock"
    text = text.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{front}")
    for i, port in enumerate(replicas, start=1):
        text = text.replace(f"127.0.0.1:{8080 + i}", f"127.0.0.1:{port}")
    text = text.replace("errors/503.http", str(CONFIG.parent / "errors" / "503.http"))
    path = tmp / "haproxy.cfg"
    path.write_text(text)
    return path, stats


@contextlib.contextmanager
def run_haproxy(
    config: Path, log: Path, max_sessions: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """HAProxy on ``config``; ``REALTIME_MAX_SESSIONS`` (its ``maxconn`` per replica) set
    to ``max_sessions``, or left out (the config's default of 1) for ``None``."""
    assert HAPROXY is not None, "REALTIME_REQUIRE_HAPROXY=1 but haproxy is not installed"
    env = {k: v for k, v in os.environ.items() if k != "REALTIME_MAX_SESSIONS"}
    if max_sessions is not None:
        env["REALTIME_MAX_SESSIONS"] = str(max_sessions)
    env["REALTIME_HAPROXY_SOCKET"] = str(config.parent / "haproxy.sock")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)], stdout=sink, stderr=subprocess.STDOUT, env=env
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_stat(stats: Path, column: str, rows: tuple[str, ...] = ()) -> dict[tuple[str, str], str]:
    """``show stat`` on the runtime API: (backend, server) -> that server's ``column``
    (``status``: UP/DOWN/...; ``scur``: connections HAProxy counts on it now; ``slim``:
    its ``maxconn``); also the FRONTEND/BACKEND rows named in ``rows``."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(stats))
        s.sendall(b"show stat\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    lines = raw.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    col = {name: i for i, name in enumerate(header)}
    out = {}
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) <= col[column]:
            continue
        if fields[1] not in ("FRONTEND", "BACKEND") or fields[1] in rows:
            out[(fields[0], fields[1])] = fields[col[column]]
    return out


def in_conversations(stats: Path, column: str) -> list[str | None]:
    """``column`` of replica1 and replica2 in the ``conversations`` backend (None
    while the runtime API does not answer yet)."""
    try:
        states = server_stat(stats, column)
    except OSError:
        return [None, None]
    return [states.get(("conversations", f"replica{i}")) for i in (1, 2)]


async def wait_for(predicate: Any, what: str, timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not await trio.to_thread.run_sync(predicate):
            await trio.sleep(0.1)
    del what


def queued(stats: Path) -> int:
    """Clients waiting in the ``conversations`` backend's queue (``qcur``), 0 while the
    runtime API does not answer."""
    try:
        rows = server_stat(stats, "qcur", rows=("BACKEND",))
    except OSError:
        return 0
    return int(rows.get(("conversations", "BACKEND")) or 0)


def active(replica: ServerProcess) -> bool:
    status, body = http("GET", replica.http + "/health")
    return status == 200 and bool(body["session_active"])


def sessions_active(replica: ServerProcess) -> int:
    status, body = http("GET", replica.http + "/health")
    assert status == 200, body
    return int(body["sessions_active"])


async def start_fleet(
    stack: contextlib.ExitStack, tmp: Path, *serve_args: str, max_sessions: int = 1
) -> tuple[list[ServerProcess], str, Path]:
    """Two replicas (``realtime serve SERVE_ARGS``) behind the shipped config, once both
    are UP: the replicas, the front's ``ws://HOST:PORT`` and its runtime API socket.

    ``max_sessions`` > 1 goes to the replicas as ``--max-sessions`` and to HAProxy as
    ``REALTIME_MAX_SESSIONS``; 1 leaves both at their defaults (the config's ``1``)."""
    if max_sessions != 1:
        serve_args = (*serve_args, "--max-sessions", str(max_sessions))
    replicas = [
        stack.enter_context(start_realtime_server(*serve_args, log_dir=tmp)) for _ in range(2)
    ]
    front = free_port()
    config, stats = render_config(tmp, front, [port_of(r) for r in replicas])
    given = max_sessions if max_sessions != 1 else None
    stack.enter_context(run_haproxy(config, tmp / "haproxy.log", given))
    await wait_for(lambda: in_conversations(stats, "status") == ["UP"] * 2, "both UP")
    # HAProxy's maxconn per replica is the replicas' --max-sessions.
    assert in_conversations(stats, "slim") == [str(max_sessions)] * 2
    return replicas, f"ws://127.0.0.1:{front}", stats


async def converse(client: Client, frames: int = 3) -> list[dict[str, Any]]:
    """Some audio, commit, and every event up to ``response.done``."""
    await client.send(append_msg(noise(1280 * frames)))
    await client.send({"type": "input_audio_buffer.commit"})
    return await client.recv_until("response.done", timeout=30)


async def test_fleet_behind_haproxy(tmp_path: Path) -> None:
    started = time.monotonic()
    figures: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        replicas, base, _ = await start_fleet(stack, tmp_path, "--drain-timeout", "20")
        url = base + "/v1/realtime"
        figures["start_s"] = time.monotonic() - started

        async with contextlib.AsyncExitStack() as clients:
            # 1. Two concurrent conversations, on different replicas.
            a = await clients.enter_async_context(connect(url))
            await a.configure()
            a_replica = next(r for r in replicas if active(r))
            b = await clients.enter_async_context(connect(url))
            await b.configure()
            assert all(active(r) for r in replicas)
            b_replica = next(r for r in replicas if r is not a_replica)

            # 2. A third while both are busy waits in the queue (timeout queue 5s),
            #    then gets the documented HTTP 503 JSON, never a server_busy socket.
            t0 = time.monotonic()
            with pytest.raises(ConnectionRejected) as rejected:
                async with connect(url):
                    pass
            figures["queue_then_503_s"] = time.monotonic() - t0
            assert rejected.value.status_code == 503
            assert b"server_busy" in (rejected.value.body or b"")

            # 3. One queued while both are busy is served once A ends: no server_busy.
            served = trio.Event()
            c_holder: list[Client] = []

            async def third(task_status: trio.TaskStatus[None]) -> None:
                async with connect(url) as c:
                    c_holder.append(c)
                    task_status.started()
                    await c.configure()
                    served.set()
                    await trio.sleep_forever()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: nursery.start(third))
                await trio.sleep(0.5)  # C is queued in HAProxy (no replica free)
                assert not served.is_set()
                events = await converse(a)
                assert all(e["type"] != "error" for e in events), events
                ended_at = time.monotonic()
                await a.closed_code()
                with trio.fail_after(10):
                    await served.wait()
                figures["queued_served_after_end_s"] = time.monotonic() - ended_at
                nursery.cancel_scope.cancel()
            # C was served by the replica A left (cancelled by the nursery above, so
            # it went away as a client would).

            # 4. SIGKILL B's replica mid-conversation: only B's connection ends.
            async with connect(url) as c:
                await c.configure()
                assert active(a_replica) and active(b_replica)
                b_replica.proc.kill()
                b_replica.proc.wait(10)
                code = await b.closed_code(timeout=10)
                assert code in (None, 1006), code
                await c.send({"type": "session.ping"})
                pong = await c.recv_until("session.pong")
                assert pong[-1]["type"] == "session.pong"
                events = await converse(c)
                assert events[-1]["type"] == "response.done"
                await c.closed_code()
            # New conversations go to the survivor (retried off the dead one at once).
            async with connect(url) as d:
                await d.configure()
                assert active(a_replica)
                await converse(d)
                await d.closed_code()

        # 5. Drain: the survivor gets SIGTERM with a conversation open; it finishes it
        #    (no 1001), takes no new conversation, and exits 0.
        async with connect(url) as e:
            await e.configure()
            a_replica.proc.send_signal(signal.SIGTERM)
            await wait_for(
                lambda: http("GET", a_replica.http + "/ready")[1].get("reason") == "draining",
                "/ready says draining",
            )
            with pytest.raises(ConnectionRejected) as refused:
                async with connect(a_replica.url):
                    pass
            assert refused.value.status_code == 503
            # Through HAProxy a new client is not given to the draining replica: with
            # the other one dead, it queues and then gets the 503.
            with pytest.raises(ConnectionRejected) as refused:
                async with connect(url):
                    pass
            assert refused.value.status_code == 503
            events = await converse(e)
            assert events[-1]["type"] == "response.done"
            assert await e.closed_code() != 1001
        assert await trio.to_thread.run_sync(a_replica.proc.wait, 15) == 0
        status, _ = await ahttp("GET", base.replace("ws://", "http://") + "/v1/models")
        assert status == 503  # no replica left at all: HAProxy's own JSON 503
    figures["total_s"] = time.monotonic() - started
    print("fleet figures:", {k: round(v, 2) for k, v in figures.items()})


OPENAI_PATH = "/openai/v1/realtime?model=nemotron-voicechat"
"""As OpenAI clients ask for it: the query must not keep it from the balancing."""
NATIVE_PATH = "/v1/realtime"
SAME_INSTANT_ROUNDS = 100
"""Pairs connecting at once (about 65 ms each). With two HAProxy threads one pair in
20 to 60 went wrong (docs/deploy.md), which 100 rounds catch with 83 to 99 % odds."""


async def first_event(url: str, events: list[str], got: trio.Event, leave: trio.Event) -> None:
    """Connect, note the first event (``session.created``, or ``error CODE`` for a
    refusal), stay until ``leave``; the same for either endpoint."""
    async with open_websocket_url(url) as ws:
        with trio.fail_after(10):
            event = json.loads(await ws.get_message())
        kind = event["type"]
        events.append(f"error {event['error']['code']}" if kind == "error" else kind)
        got.set()
        await leave.wait()


async def test_openai_endpoint_is_balanced_like_the_native_one(tmp_path: Path) -> None:
    """Both WebSocket endpoints go to the ``maxconn 1`` backend: an OpenAI client is
    never given a busy replica while one is free, one after another or two at once."""
    started = time.monotonic()
    figures: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        replicas, base, stats = await start_fleet(stack, tmp_path)
        figures["start_s"] = time.monotonic() - started

        def all_free() -> bool:
            idle = in_conversations(stats, "scur") == ["0", "0"]
            return idle and not any(active(r) for r in replicas)

        # 1. A native conversation holds one replica; OpenAI clients one after another
        #    all get the other. (Round robin, as before, gave every second one the busy
        #    replica: 1013.)
        async with connect(base + NATIVE_PATH) as holder:
            await holder.configure()
            for _ in range(4):
                async with open_websocket_url(base + OPENAI_PATH) as ws:
                    with trio.fail_after(10):
                        created = json.loads(await ws.get_message())
                    assert created["type"] == "session.created", created
                    assert created["session"]["type"] == "realtime"
                    await ws.send_message(
                        json.dumps({"type": "session.update", "session": {"type": "realtime"}})
                    )
                    with trio.fail_after(10):
                        updated = json.loads(await ws.get_message())
                    assert updated["type"] == "session.updated", updated
                    assert all(active(r) for r in replicas)
                await wait_for(lambda: sum(map(active, replicas)) == 1, "the OpenAI one ended")
        await wait_for(all_free, "both replicas free")

        # 2. Two clients in the same instant (OpenAI, and OpenAI beside native), both
        #    replicas free: one each, never 1013.
        pairs = itertools.cycle(
            [(OPENAI_PATH, OPENAI_PATH), (OPENAI_PATH, NATIVE_PATH), (NATIVE_PATH, OPENAI_PATH)]
        )
        t0 = time.monotonic()
        slowest = 0.0
        with trio.fail_after(120):
            for pair in itertools.islice(pairs, SAME_INSTANT_ROUNDS):
                events: list[str] = []
                got = [trio.Event(), trio.Event()]
                leave = trio.Event()
                async with trio.open_nursery() as nursery:
                    t_round = time.monotonic()
                    for path, arrived in zip(pair, got, strict=True):
                        nursery.start_soon(first_event, base + path, events, arrived, leave)
                    for arrived in got:
                        await arrived.wait()
                    slowest = max(slowest, time.monotonic() - t_round)
                    assert events == ["session.created"] * 2, (pair, events)
                    assert all(active(r) for r in replicas), pair
                    leave.set()
                await wait_for(all_free, "both replicas free again", timeout=10)
        figures["same_instant_rounds_s"] = time.monotonic() - t0
        figures["slowest_pair_s"] = slowest
    figures["total_s"] = time.monotonic() - started
    print("openai fleet figures:", {k: round(v, 3) for k, v in figures.items()})


MAX_SESSIONS = 2


@attrs.define
class Held:
    """One conversation through the front, on either endpoint, held open until ``finish``
    (native: commit, and the server ends it after ``response.done``) or ``leave`` (the
    client goes). ``outcome`` (and ``settled``): ``served`` once it has
    ``session.updated`` (native: and audio for its first frames), or ``HTTP 503 CODE``
    when HAProxy refused the upgrade."""

    url: str
    outcome: str | None = None
    settled: trio.Event = attrs.Factory(trio.Event)
    settled_at: float = 0.0
    done: trio.Event = attrs.Factory(trio.Event)
    finish: trio.Event = attrs.Factory(trio.Event)
    leave: trio.Event = attrs.Factory(trio.Event)

    def _settle(self, outcome: str) -> None:
        self.outcome = outcome
        self.settled_at = time.monotonic()
        self.settled.set()

    async def run(self) -> None:
        try:
            if "/openai/" in self.url:
                await self._openai()
            else:
                await self._native()
        except ConnectionRejected as exc:
            error = json.loads(exc.body or b"{}").get("error", {})
            self._settle(f"HTTP {exc.status_code} {error.get('code')}")
        finally:
            self.done.set()

    async def _native(self) -> None:
        async with connect(self.url) as client:
            await client.configure()
            await client.send(append_msg(noise(1280 * 2)))
            await client.recv_until("response.audio.delta")  # the model runs it
            self._settle("served")
            with trio.move_on_after(math.inf) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on, self.leave, scope)
                    await self.finish.wait()
                    await client.send({"type": "input_audio_buffer.commit"})
                    events = await client.recv_until("response.done", timeout=30)
                    assert all(e["type"] != "error" for e in events), events
                    await client.closed_code()
                    scope.cancel()

    async def _openai(self) -> None:
        async with open_websocket_url(self.url) as ws:
            with trio.fail_after(10):
                created = json.loads(await ws.get_message())
                assert created["type"] == "session.created", created
                update = {"type": "session.update", "session": {"type": "realtime"}}
                await ws.send_message(json.dumps(update))
                updated = json.loads(await ws.get_message())
                assert updated["type"] == "session.updated", updated
            self._settle("served")
            await self.leave.wait()


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def test_replicas_with_max_sessions_2_behind_maxconn_2(tmp_path: Path) -> None:
    """``--max-sessions 2`` replicas, HAProxy with ``REALTIME_MAX_SESSIONS=2`` (``maxconn
    2``): four conversations at once (native and OpenAI) are all served, two a replica;
    a fifth and a sixth wait in HAProxy's queue (never a replica's ``server_busy``);
    when one conversation ends, one of them is served and the other gets the config's
    503 at ``timeout queue``.

    ``--admission-margin 0``: on a 2-core VM the demo model's step takes most of a frame,
    so admission by load would rightly refuse a second conversation per replica once
    it has measured; this test is about the balancer's limit, not the replica's rule.
    """
    started = time.monotonic()
    figures: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        replicas, base, stats = await start_fleet(
            stack, tmp_path, "--admission-margin", "0", max_sessions=MAX_SESSIONS
        )
        figures["start_s"] = time.monotonic() - started
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                # 1. Four at once, both endpoints: all served, two per replica.
                held = [Held(base + path) for path in (NATIVE_PATH, OPENAI_PATH) * 2]
                for h in held:
                    nursery.start_soon(h.run)
                for h in held:
                    await h.settled.wait()
                assert [h.outcome for h in held] == ["served"] * 4, [h.outcome for h in held]
                assert [sessions_active(r) for r in replicas] == [MAX_SESSIONS] * 2
                assert in_conversations(stats, "scur") == [str(MAX_SESSIONS)] * 2

                # 2. Two more while every slot is held: both wait in HAProxy's queue.
                waiting = [Held(base + NATIVE_PATH), Held(base + OPENAI_PATH)]
                for w in waiting:
                    nursery.start_soon(w.run)
                await wait_for(lambda: queued(stats) == 2, "two queued")
                assert [w.outcome for w in waiting] == [None, None]

                # 3. One conversation ends: a queued client is served on the replica it
                #    left; the other waits out `timeout queue` and gets the 503 JSON.
                held[0].finish.set()
                await held[0].done.wait()
                ended_at = time.monotonic()
                for w in waiting:
                    await w.settled.wait()
                outcomes = sorted(w.outcome or "" for w in waiting)
                assert outcomes == ["HTTP 503 server_busy", "served"], outcomes
                for w in waiting:
                    name = "served" if w.outcome == "served" else "503"
                    figures[f"queued_{name}_after_end_s"] = w.settled_at - ended_at
                assert [sessions_active(r) for r in replicas] == [MAX_SESSIONS] * 2
                assert queued(stats) == 0
                for h in (*held, *waiting):
                    h.leave.set()
        await wait_for(lambda: in_conversations(stats, "scur") == ["0", "0"], "all closed")
    figures["total_s"] = time.monotonic() - started
    print("max-sessions fleet figures:", {k: round(v, 2) for k, v in figures.items()})


PUBLIC_NAME = "voice.example.com"
"""The name clients use for the fleet, as docs/deploy.md starts every replica with."""


async def test_the_fleet_answers_its_public_name(tmp_path: Path) -> None:
    """Replicas started as docs/deploy.md says (``--allowed-host NAME``), clients sending
    ``Host: NAME`` through HAProxy: a native conversation, an OpenAI session and the
    HTTP routes are served; a name no replica was given is refused 403 ``forbidden_host``
    (what every request got before the guide gave the flag). HAProxy's log has each
    request once."""
    with contextlib.ExitStack() as stack:
        _, base, _ = await start_fleet(stack, tmp_path, "--allowed-host", PUBLIC_NAME)
        front = base.replace("ws://", "http://")
        host, port = front.removeprefix("http://").rsplit(":", 1)
        status, body = await ahttp("GET", front + "/v1/models", {"Host": PUBLIC_NAME})
        assert status == 200, body
        status, body = await ahttp("GET", front + "/v1/models", {"Host": "other.example.com"})
        assert status == 403 and body["error"]["code"] == "forbidden_host", body
        native = await RawClient.connect(host, int(port), host_header=PUBLIC_NAME)
        assert native.rejected_status is None
        assert (await native.recv_json() or {}).get("type") == "session.created"
        await native.send_json({"type": "session.update", "session": {}})
        await native.send_json(append_msg(noise(1280 * 3)))
        await native.send_json({"type": "input_audio_buffer.commit"})
        await native.recv_until("response.done", timeout=30)
        await native.aclose()
        openai = await RawClient.connect(
            host, int(port), host_header=f"{PUBLIC_NAME}:{port}", path=OPENAI_PATH
        )
        assert openai.rejected_status is None
        assert (await openai.recv_json() or {}).get("type") == "session.created"
        await openai.aclose()
        refused = await RawClient.connect(host, int(port), host_header="other.example.com")
        assert refused.rejected_status == 403
        await refused.aclose()
    log = (tmp_path / "haproxy.log").read_text().splitlines()
    requests = [line for line in log if "GET /v1/models" in line]
    assert len(requests) == 2, requests  # one line per request, not two
    # HAProxy's own messages ("[WARNING]  (PID) : Server ... is UP") come once, not
    # again as log lines ("<5>Server ... is UP").
    printed = {line.split(" : ", 1)[1] for line in log if line.startswith("[")}
    logged = {line.split(">", 1)[1] for line in log if line.startswith("<")}
    assert not printed & logged, printed & logged
