"""``--record DIR``: a session's WAV, JSONL and transcript checked against what its
client received, the byte bound, and a full disk (the session goes on, one log line)."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from realtime.engine.facade import Engine
from realtime.errors import UsageError
from realtime.launch import server as server_module
from realtime.telemetry.recording import Recording, enforce_bound, message_record
from realtime.testing.fake import FakeModel
from tests.helpers import Server, append_msg, connect, noise, running_server

FRAMES = 4


async def recorded_session(server: Server) -> list[dict[str, Any]]:
    """One native conversation (``FRAMES`` frames, then commit): what its client got."""
    async with connect(server.url) as client:
        got = [await client.recv()]
        await client.send({"type": "session.update", "session": {}})
        got.append(await client.recv())
        await client.send(append_msg(noise(1280 * FRAMES)))
        await client.send({"type": "input_audio_buffer.commit", "pad_partial": False})
        got += await client.recv_until("response.done")
        assert await client.closed_code() == 1000
    return got


async def files_of(directory: Path, sessions: int = 1) -> list[Path]:
    """The stems of the recordings once ``sessions`` of them are complete."""
    with trio.fail_after(10):
        while len(stems := sorted(directory.glob("*.md"))) < sessions:  # noqa: ASYNC240
            await trio.sleep(0.02)
    return [stem.parent / stem.name.removesuffix(".md") for stem in stems]


def of(stem: Path, suffix: str) -> Path:
    return stem.parent / (stem.name + suffix)


async def test_a_recording_matches_the_session(
    engine: Engine, fake_model: FakeModel, tmp_path: Path
) -> None:
    figures = fake_model.figures
    async with running_server(engine) as server:
        server.state.recording = Recording(tmp_path, 10**9)
        got = await recorded_session(server)
        [stem] = await files_of(tmp_path)
    session_id = got[0]["session"]["id"]
    assert stem.name.endswith(session_id)

    # The WAV: stereo PCM16 at the model's output rate, one output frame per model frame;
    # the right channel is exactly the audio the client got.
    with wave.open(str(of(stem, ".wav"))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (2, 2)
        assert wav.getframerate() == figures.output_sample_rate
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, 2)
    deltas = [e for e in got if e["type"] == "response.audio.delta"]
    assert len(deltas) == FRAMES and pcm.shape[0] == FRAMES * figures.output_frame_samples
    sent = np.concatenate([np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in deltas])
    assert np.abs(pcm[:, 1].astype(int) - sent.astype(int)).max() <= 1
    # The left channel is the input, as loud as it was sent (0.1 RMS noise).
    assert 0.05 < float(np.sqrt(np.mean((pcm[:, 0] / 32767.0) ** 2))) < 0.15

    # The JSONL: a header, then every message either way, in order, with its time.
    lines = [json.loads(line) for line in of(stem, ".jsonl").read_text().splitlines()]
    assert lines[0]["session_id"] == session_id
    server_side = [line["event"] for line in lines[1:] if line["from"] == "server"]
    assert [e["type"] for e in server_side] == [e["type"] for e in got]
    assert [e.get("event_id") for e in server_side] == [e.get("event_id") for e in got]
    # A client's messages as the server took them: their text, never parsed again.
    client_side = [json.loads(line["text"]) for line in lines[1:] if line["from"] == "client"]
    assert [m["type"] for m in client_side] == [
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
    ]
    times = [line["t"] for line in lines[1:]]
    assert times == sorted(times)
    assert client_side[1]["audio"] == f"<{1280 * FRAMES * 2} bytes of audio: see the WAV>"

    # The transcript: the user's words and the assistant's, as the client got them.
    text = of(stem, ".md").read_text()
    said = "".join(e["delta"] for e in got if e["type"] == "response.text.delta").strip()
    heard = "".join(
        e["delta"] for e in got if e["type"].endswith("input_audio_transcription.delta")
    ).strip()
    # Full duplex: both speak on the same frames, so their pieces interleave.
    pieces = [line.split("): ", 1) for line in text.splitlines() if line.startswith("**")]
    assistant = " ".join(p[1] for p in pieces if p[0].startswith("**Assistant**"))
    user = " ".join(p[1] for p in pieces if p[0].startswith("**User**"))
    assert said and assistant.split() == said.split()
    assert heard and user.split() == heard.split()


def test_message_record_keeps_text_and_replaces_audio() -> None:
    transcript = {"type": "conversation.item.input_audio_transcription.delta", "delta": "x" * 99}
    assert message_record(1.0, "server", json.dumps(transcript))["event"] == transcript
    assert message_record(0.5, "client", b"\x00\x01") == {
        "t": 0.5,
        "from": "client",
        "binary_bytes": 2,
    }
    assert message_record(0.0, "client", "not json")["text"] == "not json"


def test_the_byte_bound_deletes_the_oldest_whole_recordings(tmp_path: Path) -> None:
    stems = [f"20261203T1400{s:02d}_000000Z-sess_{s}" for s in range(4)]
    for stem in stems:
        for suffix, size in ((".wav", 600), (".jsonl", 300), (".md", 100)):
            (tmp_path / (stem + suffix)).write_bytes(b"x" * size)
    (tmp_path / "notes.txt").write_bytes(b"x" * 5000)  # not a recording: never touched
    assert enforce_bound(tmp_path, 2500) == stems[:2]
    left = sorted(p.name for p in tmp_path.iterdir())
    kept = [f"{s}{x}" for s in stems[2:] for x in (".jsonl", ".md", ".wav")]
    assert left == sorted(["notes.txt", *kept])
    assert enforce_bound(tmp_path, 2000) == []


async def test_the_server_keeps_recordings_within_the_bound(engine: Engine, tmp_path: Path) -> None:
    async with running_server(engine) as server:
        server.state.recording = Recording(tmp_path, 10**9)
        await recorded_session(server)
        [first] = await files_of(tmp_path)
        one = sum(of(first, s).stat().st_size for s in (".wav", ".jsonl", ".md"))
        server.state.recording = Recording(tmp_path, one + one // 2)
        await recorded_session(server)
        with trio.fail_after(10):
            while of(first, ".md").exists():  # the last of its files deleted
                await trio.sleep(0.02)
        [second] = await files_of(tmp_path)
    assert second != first and of(second, ".wav").exists()


async def test_a_full_disk_stops_the_recording_not_the_session(
    engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The WAV goes to /dev/full (every write fails with ENOSPC, as on a full disk)."""
    if not os.path.exists("/dev/full"):  # noqa: ASYNC240
        pytest.skip("no /dev/full on this system")
    real_open = wave.open

    def full(path: str, mode: str) -> Any:
        return real_open("/dev/full", mode) if mode == "wb" else real_open(path, mode)

    monkeypatch.setattr("realtime.telemetry.recording.wave.open", full)
    caplog.set_level(logging.INFO)
    async with running_server(engine) as server:
        server.state.recording = Recording(tmp_path, 10**9)
        got = await recorded_session(server)
        with trio.fail_after(10):
            while not [r for r in caplog.records if r.name == "realtime.telemetry.recording"]:
                await trio.sleep(0.02)
        await trio.sleep(0.2)
    assert got[-1]["type"] == "response.done"
    stopped = [r.getMessage() for r in caplog.records if r.name == "realtime.telemetry.recording"]
    assert len(stopped) == 1 and "No space left on device" in stopped[0], stopped
    assert "the session goes on" in stopped[0]


def test_a_folder_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    """``serve --record DIR`` checks DIR before the model loads (exit 2, one line)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    args = argparse.Namespace(record=str(blocker / "calls"), record_max_bytes=1)
    with pytest.raises(UsageError, match="cannot record to"):
        server_module._recording(args)
    args.record = str(tmp_path / "calls")
    made = server_module._recording(args)
    assert made is not None and made.directory.is_dir()
    args.record = None
    assert server_module._recording(args) is None


def test_claims_keep_the_bound_and_the_share_and_never_delete_a_live_recording(
    tmp_path: Path,
) -> None:
    """The accounts behind ``--record-max-bytes`` (pure bookkeeping, files of a given
    size): a conversation's share, room made from finished recordings only, oldest first."""
    old = [f"20261203T1400{s:02d}_000000Z-sess_{s}" for s in range(3)]
    for stem in old:
        (tmp_path / (stem + ".wav")).write_bytes(b"x" * 300)
    recording = Recording(tmp_path, 1000, share=400)
    live = ["20261203T150000_000000Z-sess_a", "20261203T150001_000000Z-sess_b"]
    assert recording.claim(live[0], 100)  # 900 + 100: fits as it is
    assert sorted(p.name.split(".")[0] for p in tmp_path.iterdir()) == old
    assert recording.claim(live[0], 100)  # 1,100: the oldest finished one goes
    assert not (tmp_path / (old[0] + ".wav")).exists()
    assert not recording.claim(live[0], 250)  # 450 > its share of 400
    assert not recording.claim(live[0], 150, keep=100)  # the share less what it keeps
    assert recording.claim(live[0], 150) and recording.room(live[0]) == 50
    assert recording.claim(live[1], 400)  # deletes the other two finished ones
    assert list(tmp_path.iterdir()) == []
    recording.finished(live[0])  # 350 finished, 400 live
    assert not recording.claim(live[1], 1)  # at its share
    (tmp_path / (live[0] + ".wav")).write_bytes(b"x" * 350)
    more = ["20261203T150002_000000Z-sess_c", "20261203T150003_000000Z-sess_d"]
    assert recording.claim(more[0], 300)  # 1,050: the finished one goes, never a live one
    assert not (tmp_path / (live[0] + ".wav")).exists()
    assert not recording.claim(more[1], 301)  # live ones only, 1,001: refused
    assert recording.claim(more[1], 300)  # exactly the bound
