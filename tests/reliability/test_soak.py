"""§8 soak: a few hundred sessions of every kind against the demo model.

Normal commits, cancels, abrupt TCP resets, bad messages, busy refusals and stalled
readers, in turn, against one ``realtime serve`` process on the demo checkpoint.
Afterwards the slot is free, /health is ok, the server's descriptors and RSS are
back within a small margin of their warm baseline, and no traceback was logged.
The figures go to stdout (``-s``) for docs/reliability.md.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import trio

from tests.helpers import ahttp, start_realtime_server
from tests.reliability.rawws import RawClient

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="reads the server's descriptors from /proc"
)

SESSIONS = 180
WARMUP = 12
STALL_EVERY = 40
"""Stalled readers cost a couple of seconds each (send timeout, then the abort)."""
FD_MARGIN = 2
RSS_MARGIN_MB = 40.0
SOAK_GUARD_SECONDS = 240.0


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def audio(seconds: float, seed: int) -> str:
    samples = np.random.default_rng(seed).integers(-3000, 3000, int(16000 * seconds))
    data = base64.b64encode(samples.astype("<i2").tobytes()).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": data})


class Soak:
    def __init__(self, port: int, http: str) -> None:
        self.port = port
        self.http = http
        self.outcomes: Counter[str] = Counter()

    async def open(self, *, receive_buffer: int | None = None) -> RawClient:
        client = await RawClient.connect("127.0.0.1", self.port, receive_buffer=receive_buffer)
        assert client.rejected_status is None, client.rejected_body
        return client

    async def configured(self, seed: int, **kwargs: int) -> RawClient:
        client = await self.open(**kwargs)
        assert (await client.recv_json() or {})["type"] == "session.created"
        await client.send_json({"type": "session.update", "session": {"seed": seed}})
        assert (await client.recv_json() or {})["type"] == "session.updated"
        return client

    async def slot_free(self, timeout: float = 15.0) -> None:
        with trio.fail_after(timeout):
            while True:
                status, body = await ahttp("GET", self.http + "/health")
                if status == 200 and not body["session_active"]:
                    return
                await trio.sleep(0.02)

    @staticmethod
    async def answer_ends(client: RawClient, last: str) -> None:
        """The answer ends with a ``last`` event, then the server closes normally."""
        await client.recv_until(last, timeout=30)
        assert await client.drain_to_close() == 1000
        await client.aclose()

    async def normal(self, i: int) -> None:
        client = await self.configured(i)
        await client.send_json(audio(0.32, i))
        await client.send_json({"type": "input_audio_buffer.commit"})
        await self.answer_ends(client, "response.done")

    async def cancel(self, i: int) -> None:
        client = await self.configured(i)
        await client.send_json(audio(2.0, i))
        await client.recv_until("response.audio.delta", timeout=30)
        await client.send_json({"type": "response.cancel"})
        await self.answer_ends(client, "response.cancelled")

    async def reset(self, i: int) -> None:
        client = await self.configured(i)
        await client.send_json(audio(1.0, i))
        if i % 2:
            await client.recv_until("response.audio.delta", timeout=30)
        client.reset()

    async def bad(self, i: int) -> None:
        client = await self.configured(i)
        for frame in (
            "not json",
            '{"type": "nope"}',
            '{"type": "session.ping", "n": ' + "9" * 5000 + "}",
            '{"type": "input_audio_buffer.append", "audio": "!!"}',
            '{"type": "session.update"}',  # a second update
        ):
            await client.send_json(frame)
            event = await client.recv_json()
            assert event is not None and event["type"] == "error", event
            assert event["error"]["code"] == "invalid_request", event
        await client.send_bytes(b"\x00\x01")
        event = await client.recv_json()
        assert event is not None and event["error"]["code"] == "invalid_request", event
        await client.send_json({"type": "input_audio_buffer.commit"})
        await self.answer_ends(client, "response.done")

    async def busy(self, i: int) -> None:
        holder = await self.configured(i)
        other = await self.open()
        event = await other.recv_json()
        assert event is not None and event["error"]["code"] == "server_busy", event
        assert await other.drain_to_close() == 1013
        await other.aclose()
        await holder.send_json({"type": "session.cancel"})
        await holder.recv_until("response.cancelled", timeout=30)
        await holder.aclose()

    async def stalled(self, i: int) -> None:
        client = await self.configured(i, receive_buffer=4096)
        await client.send_json(audio(20.0, i))
        await self.slot_free(timeout=60)  # dropped by the server, not by us
        await client.aclose()


async def test_soak_sessions_faults_descriptors_rss(tmp_path: Path, demo_cache_dir: Path) -> None:
    args = ("--send-timeout", "1", "--send-queue-events", "16", "--idle-timeout", "30")
    with start_realtime_server(*args, log_dir=tmp_path) as server:
        pid = server.proc.pid
        port = urlsplit(server.http).port
        assert port is not None
        soak = Soak(port, server.http)
        kinds: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
            ("normal", soak.normal),
            ("cancel", soak.cancel),
            ("reset", soak.reset),
            ("bad_messages", soak.bad),
            ("busy", soak.busy),
        ]
        for i in range(WARMUP):
            name, run = kinds[i % len(kinds)]
            await run(i)
            await soak.slot_free()
        await trio.sleep(1)
        fd_before, rss_before = descriptors(pid), rss_mb(pid)
        started = time.monotonic()
        with trio.fail_after(SOAK_GUARD_SECONDS):
            for i in range(SESSIONS):
                if i % STALL_EVERY == STALL_EVERY - 1:
                    name, run = "stalled_reader", soak.stalled
                else:
                    name, run = kinds[i % len(kinds)]
                await run(WARMUP + i)
                await soak.slot_free()
                soak.outcomes[name] += 1
        elapsed = time.monotonic() - started
        status, health = await ahttp("GET", server.http + "/health")
        assert status == 200 and health["status"] == "ok" and not health["session_active"]
        with trio.move_on_after(20):  # failure guard
            while descriptors(pid) > fd_before:
                await trio.sleep(0.2)
        fd_after, rss_after = descriptors(pid), rss_mb(pid)
        output = server.output()
    print(
        f"\nsoak: {SESSIONS} sessions in {elapsed:.0f} s {dict(soak.outcomes)}; "
        f"descriptors {fd_before} -> {fd_after}; RSS {rss_before:.0f} -> {rss_after:.0f} MB",
        file=sys.stderr,
    )
    assert "Traceback" not in output, output[-4000:]
    assert fd_after <= fd_before + FD_MARGIN, (fd_before, fd_after)
    assert rss_after <= rss_before + RSS_MARGIN_MB, (rss_before, rss_after)
