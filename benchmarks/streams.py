"""Rows 2-6: what one client sees through a server (ours or mlx-vlm's).

Every message is encoded before the clock starts, and the client records
``perf_counter`` just before a send and just after a receive, so a figure is
the server's time plus the loopback socket, not the client's JSON work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio

from benchmarks.servers import ServerProcess
from benchmarks.stats import summarize
from benchmarks.wire import (
    AUDIO_DELTA,
    CANCEL,
    COMMIT,
    PING,
    BenchError,
    Client,
    RawClient,
    audio_level_db,
    connect,
    http_get_json,
    update_message,
)

WINDOW_FRAMES: Final = 200
"""Unpaced senders keep at most this many frames (16 s) unanswered: under the
server's 20 s pending-audio limit, far above what the pipeline needs."""
STREAM_TIMEOUT: Final = 300.0
RESPONSIVENESS_TRIGGER: Final = 5
"""The ping and cancel go out when this many frames of the big append have answered."""


async def cancel_and_close(client: Client) -> None:
    await client.send(CANCEL)
    await client.drain_until("response.cancelled", 60)


async def warm_up(url: str, model: str | None, messages: list[str]) -> None:
    """One short session first: model load (mlx-vlm loads on first use), allocator warm-up."""
    async with connect(url, model) as client:
        await client.configure(within=STREAM_TIMEOUT)
        for message in messages:
            await client.send(message)
        await _count_audio(client, len(messages))
        await cancel_and_close(client)


async def _count_audio(
    client: Client, n: int, into: list[float] | None = None, levels: list[float] | None = None
) -> list[float]:
    """Receive times of the next ``n`` audio deltas, appended to ``into`` as they land
    (so a stream that fails midway still shows how far it got); with ``levels``, each
    delta's level in dBFS beside it (decoded after its time is taken)."""
    times: list[float] = [] if into is None else into
    with trio.fail_after(STREAM_TIMEOUT):
        while len(times) < n:
            at, event = await client.recv()
            if event["type"] == AUDIO_DELTA:
                times.append(at)
                if levels is not None:
                    levels.append(audio_level_db(event))
            elif event["type"] == "error":
                raise BenchError(f"server error: {event}")
    return times


CpuClock = Callable[[], float | None]


def _no_cpu() -> float | None:
    return None


def _cpu_per_frame(before: float | None, after: float | None, frames: int) -> float | None:
    """Server CPU ms per frame over the streaming part only (not configure or close)."""
    if before is None or after is None or not frames:
        return None
    return (after - before) * 1e3 / frames


@attrs.define
class PacedTimes:
    """One paced stream's clock readings (``perf_counter``), filled as it runs."""

    sent: list[float] = attrs.Factory(list)
    """Just before each append went out."""
    received: list[float] = attrs.Factory(list)
    """Just as each frame's audio delta landed, in order (the i-th answers the i-th append)."""
    late: list[float] = attrs.Factory(list)
    """Seconds each append left after its due time (the client's own lag)."""
    levels: list[float] | None = None
    """Each audio delta's level in dBFS, in order, when a list is given (the caller asks
    for it: decoding every delta costs the client a little)."""

    def latencies_ms(self) -> list[float]:
        """Append to audio delta, per frame that was answered."""
        return [(r - s) * 1e3 for s, r in zip(self.sent, self.received, strict=False)]


async def paced_stream(
    client: Client, messages: list[str], start: float | None = None, times: PacedTimes | None = None
) -> PacedTimes:
    """Send ``messages[i]`` at trio time ``start + i`` frame times (``session.updated``'s
    frame; ``start`` defaults to now) while receiving every frame's audio delta."""
    out = PacedTimes() if times is None else times
    step = client.conn.frame_seconds
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_count_audio, client, len(messages), out.received, out.levels)
        begin = trio.current_time() if start is None else start
        for i, message in enumerate(messages):
            due = begin + i * step
            await trio.sleep_until(due)
            out.late.append(trio.current_time() - due)
            out.sent.append(await client.send(message))
    return out


async def paced(
    url: str, model: str | None, messages: list[str], cpu: CpuClock = _no_cpu
) -> dict[str, Any]:
    """One frame's append per model step (``session.updated``'s: 80 ms for VoiceChat);
    latency of each append to its audio delta."""
    n = len(messages)
    async with connect(url, model) as client:
        await client.configure(within=STREAM_TIMEOUT)
        cpu_before = cpu()
        times = await paced_stream(client, messages)
        cpu_after = cpu()
        await cancel_and_close(client)
    return {
        "frames": n,
        "latency_ms": summarize(times.latencies_ms()).to_dict(),
        "send_lateness_ms_p99": summarize([x * 1e3 for x in times.late]).p99,
        "server_cpu_ms_per_frame": _cpu_per_frame(cpu_before, cpu_after, n),
        "busy_retries": client.busy_retries,
    }


async def unpaced(
    url: str, model: str | None, messages: list[str], cpu: CpuClock = _no_cpu
) -> dict[str, Any]:
    """Every append as fast as the server takes it (bounded window); frames per second."""
    n = len(messages)
    received: list[float] = []
    first_sent = math.nan
    window = trio.Semaphore(WINDOW_FRAMES)
    async with connect(url, model) as client:
        await client.configure(within=STREAM_TIMEOUT)
        cpu_before = cpu()
        async with trio.open_nursery() as nursery:

            async def receive() -> None:
                with trio.fail_after(STREAM_TIMEOUT):
                    while len(received) < n:
                        at, event = await client.recv()
                        if event["type"] == AUDIO_DELTA:
                            received.append(at)
                            window.release()
                        elif event["type"] == "error":
                            raise BenchError(f"server error: {event}")

            nursery.start_soon(receive)
            for i, message in enumerate(messages):
                await window.acquire()
                at = await client.send(message)
                if i == 0:
                    first_sent = at
        cpu_after = cpu()
        await cancel_and_close(client)
    elapsed = received[-1] - first_sent
    steady = (n - 1) / (received[-1] - received[0]) if n > 1 else math.nan
    return {
        "frames": n,
        "seconds": elapsed,
        "fps": n / elapsed,
        "steady_fps": steady,
        "us_per_frame": elapsed / n * 1e6,
        "server_cpu_ms_per_frame": _cpu_per_frame(cpu_before, cpu_after, n),
        "busy_retries": client.busy_retries,
    }


async def round_trips(url: str, model: str | None, messages: list[str]) -> dict[str, Any]:
    """One append at a time, waiting for its audio: the full per-frame path, unpipelined."""
    times: list[float] = []
    async with connect(url, model) as client:
        await client.configure(within=STREAM_TIMEOUT)
        for message in messages:
            sent = await client.send(message)
            (got,) = await _count_audio(client, 1)
            times.append((got - sent) * 1e6)
        await cancel_and_close(client)
    return {"frames": len(messages), "round_trip_us": summarize(times).to_dict()}


async def responsiveness(url: str, model: str | None, big_append: str) -> dict[str, Any]:
    """A ping and a cancel sent while one big append runs: how soon they are answered,
    and how many frames the model ran after the cancel."""
    deltas: list[tuple[float, int]] = []
    ping_sent = cancel_sent = pong_at = cancelled_at = math.nan
    cancelled_index: int | None = None
    async with connect(url, model) as client:
        await client.configure(within=STREAM_TIMEOUT)
        await client.send(big_append)
        with trio.fail_after(STREAM_TIMEOUT):
            while cancelled_index is None:
                at, event = await client.recv()
                kind = event["type"]
                if kind == AUDIO_DELTA:
                    deltas.append((at, int(event["frame_index"])))
                    if len(deltas) == RESPONSIVENESS_TRIGGER:
                        ping_sent = await client.send(PING)
                        cancel_sent = await client.send(CANCEL)
                elif kind == "session.pong":
                    pong_at = at
                elif kind == "response.cancelled":
                    cancelled_at = at
                    cancelled_index = int(event["frame_index"])
                elif kind == "error":
                    raise BenchError(f"server error: {event}")
    before = [index for at, index in deltas if at < cancel_sent]
    last_before = max(before) if before else -1
    return {
        "trigger_after_frames": RESPONSIVENESS_TRIGGER,
        "pong_ms": (pong_at - ping_sent) * 1e3,
        "cancel_ms": (cancelled_at - cancel_sent) * 1e3,
        "deltas_after_cancel": sum(1 for at, _ in deltas if at > cancel_sent),
        "last_delta_frame_before_cancel": last_before,
        "cancelled_frame_index": cancelled_index,
        "frames_after_cancel": cancelled_index - last_before - 1,
        "busy_retries": client.busy_retries,
    }


async def ping_floor(url: str, model: str | None, pings: int) -> dict[str, Any]:
    """session.ping round trips on a configured, idle session: back to back, then one
    per model step (``session.updated``'s). No model work is involved, so this is the
    floor any frame's latency sits on (client, loopback, the server's WebSocket stack,
    thread wake-ups)."""
    out: dict[str, Any] = {"pings": pings}
    async with connect(url, model) as client:
        await client.configure(within=STREAM_TIMEOUT)
        step = client.conn.frame_seconds
        for name, gap in (("back_to_back_us", 0.0), ("paced_us", step)):
            times: list[float] = []
            for _ in range(pings):
                if gap:
                    await trio.sleep(gap)
                sent = await client.send(PING)
                with trio.fail_after(30):
                    while True:
                        at, event = await client.recv()
                        if event["type"] == "session.pong":
                            break
                times.append((at - sent) * 1e6)
            out[name] = summarize(times[pings // 5 :]).to_dict()
        await cancel_and_close(client)
    return out


# --- row 6: churn -----------------------------------------------------------------


async def _health_active(http: str) -> bool:
    status, body = await http_get_json(http, "/health")
    if status != 200:
        raise BenchError(f"/health answered {status}: {body}")
    return bool(body["session_active"])


async def _normal_session(url: str, audio: str) -> tuple[int, int]:
    """configure, 1 s of audio, commit, response.done: (busy refusals, audio deltas)."""
    busy = 0
    for _ in range(400):
        async with connect(url, None, retry_busy=False) as client:
            with trio.fail_after(30):
                _, first = await client.recv()
            if first["type"] == "error" and first["error"]["code"] == "server_busy":
                busy += 1
                await trio.sleep(0.005)
                continue
            if first["type"] != "session.created":
                raise BenchError(f"expected session.created, got {first}")
            await client.send(update_message(None))
            await client.expect("session.updated", 60)
            await client.send(audio)
            await client.send(COMMIT)
            events = await client.drain_until("response.done", 60)
            return busy, sum(1 for e in events if e["type"] == AUDIO_DELTA)
    raise BenchError("the slot stayed busy for 2 s")


async def _abrupt_session(url: str, audio: str) -> int:
    """Configure, append, wait for the first audio, then drop the TCP stream."""
    busy = 0
    for _ in range(400):
        client = await RawClient.open(url)
        try:
            with trio.fail_after(30):
                first = await client.recv()
                if first["type"] == "error" and first["error"]["code"] == "server_busy":
                    busy += 1
                    await trio.sleep(0.005)
                    continue
                await client.send(update_message(None))
                while (await client.recv())["type"] != "session.updated":
                    pass
                await client.send(audio)
                while (await client.recv())["type"] != AUDIO_DELTA:
                    pass
        finally:
            await client.drop()
        return busy
    raise BenchError("the slot stayed busy for 2 s")


async def churn(
    server: ServerProcess, sessions: int, abrupt_every: int, one_second: str
) -> dict[str, Any]:
    """Sequential sessions, some dropped mid-stream; throughput, RSS and the slot."""
    mb = 1024 * 1024
    rss_start = server.rss_bytes()
    await _normal_session(server.url, one_second)  # warm: first-session allocations
    rss_warm = server.rss_bytes()
    busy = abrupt = deltas = 0
    release_ms: list[float] = []
    started = time.perf_counter()
    for i in range(sessions):
        if abrupt_every and i % abrupt_every == abrupt_every - 1:
            busy += await _abrupt_session(server.url, one_second)
            abrupt += 1
            dropped = time.perf_counter()
            with trio.fail_after(10):
                while await _health_active(server.http):
                    await trio.sleep(0.001)
            release_ms.append((time.perf_counter() - dropped) * 1e3)
        else:
            refused, audio = await _normal_session(server.url, one_second)
            busy += refused
            deltas += audio
    elapsed = time.perf_counter() - started
    active_after = await _health_active(server.http)
    async with connect(server.url, None, retry_busy=False) as client:
        with trio.fail_after(30):
            _, first = await client.recv()
    next_created = first["type"] == "session.created"
    rss_end = server.rss_bytes()
    return {
        "sessions": sessions,
        "abrupt": abrupt,
        "seconds": elapsed,
        "sessions_per_s": sessions / elapsed,
        "audio_deltas": deltas,
        "busy_refusals": busy,
        "release_after_drop_ms": summarize(release_ms).to_dict(),
        "health_session_active_after": active_after,
        "next_connection_created": next_created,
        "slot_free_after": next_created and not active_after,
        "rss_start_mb": rss_start / mb if rss_start else None,
        "rss_warm_mb": rss_warm / mb if rss_warm else None,
        "rss_end_mb": rss_end / mb if rss_end else None,
        "rss_growth_mb": (rss_end - rss_warm) / mb if rss_end and rss_warm else None,
    }
