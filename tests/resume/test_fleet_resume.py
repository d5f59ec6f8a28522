"""Resumable conversations through the fleet: two demo replicas started with
``--replica-id`` equal to their HAProxy server names, behind the shipped
``deploy/haproxy/haproxy.cfg``, and a TCP proxy in front that cuts the client's
connection mid-answer. The resume (``?resume=1&replica=NAME``) reaches the replica that
holds the conversation (HAProxy's ``use-server``; its log names the server), and the
answer equals one with no drop, bit for bit.

Skips like tests/test_fleet.py without ``haproxy``.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import trio

from realtime.client import AudioDelta, ResponseDone, connect
from realtime.models.base import VOICECHAT_FIGURES
from realtime.testing.servers import ServerProcess
from tests.helpers import start_realtime_server
from tests.resume.cut_proxy import CutProxy, cut_proxy
from tests.test_fleet import (
    free_port,
    in_conversations,
    port_of,
    render_config,
    run_haproxy,
    wait_for,
)

pytestmark = pytest.mark.slow

FRAME = VOICECHAT_FIGURES.frame_samples


async def start_named_fleet(
    stack: contextlib.ExitStack, tmp: Path, *serve_args: str
) -> tuple[list[ServerProcess], int, Path]:
    """Two replicas named replica1 and replica2 (``--replica-id``, as the config's
    server names) behind the shipped config: the replicas, the front's port and
    HAProxy's log."""
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
    return replicas, front, log


async def _answer(
    url: str,
    pcm: npt.NDArray[np.int16],
    cut_at: tuple[int, ...] = (),
    proxy: CutProxy | None = None,
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
                        proxy.cut()
                elif isinstance(event, ResponseDone):
                    break
        resumes = conn.resumes
    return b"".join(chunks), replica, resumes


async def test_a_resume_through_haproxy_lands_on_its_replica_bit_for_bit(tmp_path: Path) -> None:
    pcm = (np.random.default_rng(11).standard_normal(24 * FRAME) * 3000).astype(np.int16)
    with contextlib.ExitStack() as stack:
        _, front, log = await start_named_fleet(stack, tmp_path)
        url = f"ws://127.0.0.1:{front}/v1/realtime"
        clean, _, _ = await _answer(url, pcm)
        async with cut_proxy(front) as proxy:
            dropped, replica, resumes = await _answer(
                f"ws://127.0.0.1:{proxy.port}/v1/realtime", pcm, cut_at=(5, 14), proxy=proxy
            )
        assert replica in ("replica1", "replica2") and resumes == 2
        assert dropped == clean  # bit for bit, with two drops
        await trio.sleep(0.5)  # HAProxy logs a request once it ends
    # HAProxy sent both resumes to the server the conversation's replica id names.
    lines = [line for line in log.read_text().splitlines() if "resume=1" in line]
    assert len(lines) == 2, log.read_text()
    for line in lines:
        assert f"replica={replica}" in line
        assert re.search(rf"conversations/{replica}\b", line), line
