"""``python -m benchmarks.hostile_json``: what a JSON flood costs the event loop and a
victim beside it, on the native endpoint.

Two figures. The loop time of one hostile message, parsed here as the endpoint parses
it (``parse_client_message``, which is what the connection's receiver runs on the
event loop): the red team's ``{"type":"x","a":[{},{},...]}`` with 1.3 million objects
(3.9 MB, under the 4 MiB message bound). And a victim streaming 125 frames in real
time on a server (:class:`NullModel`, ``--max-sessions 2``, its own process) while an
attacker sends that message back to back: the victim's frame latency (an append sent
until its audio arrives) and how many frames were late by more than two frame periods.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from urllib.parse import urlsplit

import trio

from realtime.native.wire import ProtocolError, parse_client_message
from realtime.testing.servers import start_server_process
from tests.helpers import REPO, append_msg, noise
from tests.reliability.rawws import RawClient

FLOOD = '{"type":"x","a":[' + ",".join(["{}"] * 1_300_000) + "]}"
FRAMES = 125
FRAME_SECONDS = 0.08

SERVER = """
from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import NullModel
from realtime.testing.servers import serve_engine
engine = Engine(NullModel, capacity=2)
engine.start()
serve_engine(engine, limits=Limits(max_sessions=2, admission_margin=0))
"""


def parse_seconds(repeats: int = 5) -> list[float]:
    """Loop time of one hostile message, each parse on its own."""
    spent = []
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            parse_client_message(FLOOD)
        except ProtocolError:
            pass
        spent.append(time.perf_counter() - started)
    return spent


async def configured(port: int) -> RawClient:
    client = await RawClient.connect("127.0.0.1", port)
    assert (await client.recv_json() or {})["type"] == "session.created"
    await client.send_json({"type": "session.update", "session": {}})
    assert (await client.recv_json() or {})["type"] == "session.updated"
    return client


async def victim(port: int, latencies: list[float], done: trio.Event) -> None:
    client = await configured(port)
    sent: list[float] = []

    async def read() -> None:
        while len(latencies) < FRAMES:
            event = await client.recv_json(60)
            assert event is not None
            if event["type"] == "response.audio.delta":
                latencies.append(time.perf_counter() - sent[len(latencies)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        frame = append_msg(noise(1280))
        start = trio.current_time()
        for n in range(FRAMES):
            await trio.sleep_until(start + n * FRAME_SECONDS)
            sent.append(time.perf_counter())
            await client.send_json(frame)
    done.set()
    await client.aclose()


async def attacker(port: int, done: trio.Event, sent: list[int]) -> None:
    client = await configured(port)
    while not done.is_set():
        await client.send_json(FLOOD)
        answer = await client.recv_json(60)
        assert answer is not None and answer["type"] == "error", answer
        sent.append(1)
    await client.aclose()


async def beside(port: int, hostile: bool) -> tuple[list[float], int]:
    latencies: list[float] = []
    sent: list[int] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(victim, port, latencies, done)
        if hostile:
            nursery.start_soon(attacker, port, done, sent)
    return latencies, len(sent)


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    late = sum(1 for x in latencies if x > 2 * FRAME_SECONDS)
    return (
        f"p50 {statistics.median(latencies) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"late by more than two frame periods: {late} of {len(latencies)}"
    )


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks.hostile_json").parse_args(argv)
    spent = parse_seconds()
    print(
        f"one hostile message ({len(FLOOD) / 1e6:.1f} MB, 1.3 M values): "
        f"median {statistics.median(spent) * 1000:.1f} ms, max {max(spent) * 1000:.1f} ms "
        "of the event loop"
    )
    with start_server_process(argv=[sys.executable, "-c", SERVER], cwd=REPO, name="hostile") as s:
        port = urlsplit(s.http).port
        assert port is not None
        alone, _ = trio.run(beside, port, False)
        print(f"victim alone: {summary(alone)}")
        flooded, count = trio.run(beside, port, True)
        print(f"victim beside {count} hostile messages: {summary(flooded)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
