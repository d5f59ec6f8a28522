"""Call recordings (``--record DIR``) within their bound
at every moment, what a client sends recorded as the server took it, and no
conversation's recording deleted to make room for an attacker's.

Before: ``--record-max-bytes`` was applied only when a recording ended and client
messages were recorded whole (40 refused 1 MiB junk messages put 42 MB into a
directory bounded at 3 MB; when the attacker left, oldest-first deletion removed every
other conversation's recordings, 0 of 9 files left); and the recorder parsed every
client message again, so a 100,000-deep one raised ``RecursionError`` on its worker
thread and the session closed 1011 with a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import attrs
import pytest
import trio

from realtime.engine.facade import Engine
from realtime.telemetry.recording import Recording, share_of
from tests.helpers import connect, running_server
from tests.telemetry.test_recording import files_of, of, recorded_session

SUFFIXES = (".wav", ".jsonl", ".md")


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def recorded_bytes(directory: Path) -> int:
    total = 0
    for entry in os.scandir(directory):
        if entry.name.endswith(SUFFIXES):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # deleted between the listing and the stat
                continue
    return total


async def test_a_deeply_nested_message_is_one_refused_line_not_a_crash(
    engine: Engine, tmp_path: Path
) -> None:
    """Finding 7: the session goes on (a ping answered, then a normal close), and the
    message is one line: why it was refused and its first 256 characters."""
    deep = "[" * 100_000 + "]" * 100_000
    async with running_server(engine) as server:
        server.state.recording = Recording(tmp_path, 10**9)
        async with connect(server.url) as client:
            assert (await client.recv())["type"] == "session.created"
            await client.send(deep)
            assert (await client.recv())["type"] == "error"
            await client.send({"type": "session.ping"})
            assert (await client.recv())["type"] == "session.pong"
        [stem] = await files_of(tmp_path)
    lines = [json.loads(line) for line in of(stem, ".jsonl").read_text().splitlines()]
    [refused] = [line for line in lines[1:] if line["from"] == "client" and "refused" in line]
    assert refused["text"] == deep[:256] and refused["chars"] == len(deep)
    assert "JSON values" in refused["refused"]
    last = [line for line in lines[1:] if line["from"] == "client"][-1]
    assert json.loads(last["text"]) == {"type": "session.ping"} and "refused" not in last


async def test_an_attacker_stays_within_its_share_and_deletes_no_other_recording(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 3, through a real server: three conversations recorded (9 files), then an
    attacker sends the red team's 40 refused 1 MiB messages and 2,000 pings. The
    directory never holds more than the bound (sampled every 5 ms), the attacker's
    recording stops at its share, and all 9 files of the others are still there."""
    caplog.set_level(logging.INFO)
    attack = await junk_beside_recordings(engine, tmp_path)
    assert attack.victims_left == 9, attack  # before: 0 of 9 left
    assert attack.most <= attack.bound, attack  # before: 42 MB in a 3 MB bound
    assert attack.written <= attack.share, attack
    assert "share of" in (tmp_path / (attack.attacker + ".md")).read_text()
    stopped = [r.getMessage() for r in caplog.records if "stopped at" in r.getMessage()]
    assert len(stopped) == 1 and attack.attacker in stopped[0], stopped


@attrs.frozen
class JunkAttack:
    most: int
    """The most the directory held while the attacker sent (sampled every 5 ms)."""
    bound: int
    share: int
    victims_left: int
    """Of the other conversations' 9 files."""
    attacker: str
    written: int
    """What the attacker's recording holds."""


async def junk_beside_recordings(engine: Engine, tmp_path: Path) -> JunkAttack:
    """Three conversations recorded (9 files), then an attacker sends the red team's 40
    refused 1 MiB messages and 2,000 pings, the bound six recordings' worth and the
    share a third of it (``--max-sessions 2``)."""
    async with running_server(engine) as server:
        server.state.recording = Recording(tmp_path, 10**9)
        await recorded_session(server)
        [probe] = await files_of(tmp_path)
        one = sum(of(probe, suffix).stat().st_size for suffix in SUFFIXES)
        for suffix in SUFFIXES:
            of(probe, suffix).unlink()
        bound = 6 * one
        share = share_of(bound, 2)  # --max-sessions 2: a third of the bound each
        server.state.recording = Recording(tmp_path, bound, share)
        for _ in range(3):
            await recorded_session(server)
        await files_of(tmp_path, 3)
        victims = names(tmp_path)
        assert len(victims) == 9

        most = 0
        attacking = True

        async def watch() -> None:
            nonlocal most
            while attacking:
                most = max(most, recorded_bytes(tmp_path))
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with connect(server.url) as client:
                assert (await client.recv())["type"] == "session.created"
                junk = "x" * (1 << 20)
                for _ in range(40):
                    await client.send(junk)
                    assert (await client.recv())["type"] == "error"
                for _ in range(2000):
                    await client.send({"type": "session.ping"})
                    assert (await client.recv())["type"] == "session.pong"
            await files_of(tmp_path, 4)
            attacking = False
        most = max(most, recorded_bytes(tmp_path))
    left = names(tmp_path)
    [attacker] = sorted({n.split(".")[0] for n in left} - {v.split(".")[0] for v in victims})
    written = sum((tmp_path / (attacker + suffix)).stat().st_size for suffix in SUFFIXES)
    return JunkAttack(most, bound, share, len(set(victims) & set(left)), attacker, written)
