"""Call recordings (``realtime serve --record DIR``): opt-in, never on by default.

Per session three files in DIR, named ``STARTED-SESSION_ID`` (UTC, so they sort by
age): a stereo WAV at the model's output rate with the user on the left and the model
on the right, frame by frame on the model's timeline (each model frame's input, as the
model heard it, beside the audio it made); ``.jsonl``, every WebSocket message either
way with its time (audio payloads replaced by their size: the audio is in the WAV);
``.md``, a transcript of the user, the assistant, its tool calls and their results,
from the model's own channels (the same for both endpoints).

Nothing is written on the event loop. The connection hands each item over with a
non-blocking call (:meth:`Recorder.event`, :meth:`Recorder.frame`,
:meth:`Recorder.tool_result`) into a bounded list; the session's writer task hands
what has gathered to a worker thread (``trio.to_thread.run_sync`` under one
``CapacityLimiter`` for the whole server) that encodes and writes it. A slow disk
makes the list fill, and then items are dropped (one log line) rather than a frame
waiting; a failing disk (full, gone) stops that session's recording with one log
line, and the session goes on. When a recording ends, the oldest recordings are
deleted until DIR holds at most ``--record-max-bytes``.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import re
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Final, Literal

import attrs
import numpy as np
import trio

from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    ModelEvent,
    ModelFigures,
    Samples,
    UserTranscriptDelta,
)

log = logging.getLogger("realtime.telemetry.recording")

MAX_PENDING: Final = 4096
"""Items waiting for the writer, per session (a few seconds of a busy conversation);
past it, items are dropped rather than held in memory or waited for."""
SUFFIXES: Final = (".wav", ".jsonl", ".md")
_NAME: Final = re.compile(r"^(\d{8}T\d{6}_\d{6}Z-[A-Za-z0-9_]+)\.(wav|jsonl|md)$")
_AUDIO_FIELDS: Final = ("audio", "delta")
"""Fields that carry base64 audio in the events that carry audio (:func:`_carries_audio`)."""

Direction = Literal["client", "server"]
Speaker = Literal["user", "assistant", "tool call", "tool result"]


@attrs.frozen(slots=True)
class _Message:
    at: float
    direction: Direction
    data: str | bytes


@attrs.frozen(slots=True)
class _Frame:
    at: float
    heard: Samples
    events: tuple[ModelEvent, ...]


@attrs.frozen(slots=True)
class _ToolResult:
    at: float
    output: str


_Item = _Message | _Frame | _ToolResult


class Recording:
    """``--record DIR`` for the whole server: where, the byte bound, the one worker."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.limiter = trio.CapacityLimiter(1)
        """One worker thread for every session's writes (and the byte bound's deletes)."""

    def session(self, session_id: str, figures: ModelFigures) -> Recorder:
        return CallRecorder(self, session_id, figures)


class Recorder:
    """What the connection calls; this base records nothing (the default)."""

    def event(self, direction: Direction, data: str | bytes) -> None:
        """A WebSocket message, received (``client``) or handed to the socket."""

    def frame(self, heard: Samples, events: Sequence[ModelEvent]) -> None:
        """One model frame: the input it ran on and what it made."""

    def tool_result(self, output: str) -> None:
        """A tool's output the model took."""

    async def writer(self) -> None:
        """The session's writer task (runs until cancelled)."""

    async def close(self) -> None:
        """Write what is left and finish the files (the session is over)."""


class CallRecorder(Recorder):
    def __init__(self, recording: Recording, session_id: str, figures: ModelFigures) -> None:
        self._recording = recording
        self._started = trio.current_time()
        wall = datetime.datetime.now(datetime.UTC)
        stem = f"{wall:%Y%m%dT%H%M%S_%f}Z-{session_id}"
        self._files = _Files(recording.directory / stem, session_id, wall, figures)
        self._pending: list[_Item] = []
        self._gathered = trio.Event()
        self._dropped = 0
        self._closed = False

    def _put(self, item: _Item) -> None:
        if self._closed or self._files.failed:
            return
        if len(self._pending) >= MAX_PENDING:
            if not self._dropped:
                log.warning(
                    "recording %s: the disk is behind; dropping what it cannot take",
                    self._files.stem.name,
                )
            self._dropped += 1
            return
        self._pending.append(item)
        self._gathered.set()

    def _now(self) -> float:
        return trio.current_time() - self._started

    def event(self, direction: Direction, data: str | bytes) -> None:
        self._put(_Message(self._now(), direction, data))

    def frame(self, heard: Samples, events: Sequence[ModelEvent]) -> None:
        self._put(_Frame(self._now(), heard.copy(), tuple(events)))

    def tool_result(self, output: str) -> None:
        self._put(_ToolResult(self._now(), output))

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._gathered = trio.Event()
        if batch:
            await trio.to_thread.run_sync(self._files.write, batch, limiter=self._recording.limiter)

    async def writer(self) -> None:
        while True:
            await self._gathered.wait()
            await self._flush()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        recording = self._recording

        def finish(batch: list[_Item]) -> None:
            self._files.write(batch)
            self._files.finish()
            enforce_bound(recording.directory, recording.max_bytes)

        batch, self._pending = self._pending, []
        # Abandoned if the caller gives up waiting (a stuck disk): the thread goes on.
        await trio.to_thread.run_sync(
            finish, batch, limiter=recording.limiter, abandon_on_cancel=True
        )


@attrs.define(slots=True, eq=False)
class _Files:
    """One session's three files, written on the worker thread only."""

    stem: Path
    session_id: str
    wall: datetime.datetime
    figures: ModelFigures
    failed: bool = attrs.field(default=False, init=False)
    _wav: wave.Wave_write | None = attrs.field(default=None, init=False)
    _jsonl: IO[str] | None = attrs.field(default=None, init=False)
    _lines: list[tuple[float, Speaker, str]] = attrs.field(factory=list, init=False)

    def path(self, suffix: str) -> Path:
        return self.stem.parent / (self.stem.name + suffix)

    def write(self, batch: list[_Item]) -> None:
        if self.failed:
            return
        try:
            self._open()
            assert self._wav is not None and self._jsonl is not None
            for item in batch:
                if isinstance(item, _Message):
                    record = message_record(item.at, item.direction, item.data)
                    self._jsonl.write(json.dumps(record) + "\n")
                elif isinstance(item, _Frame):
                    self._wav.writeframes(stereo_frame(item.heard, item.events, self.figures))
                    self._lines += transcript_lines(item.at, item.events)
                else:
                    self._lines.append((item.at, "tool result", item.output))
            self._jsonl.flush()
        except OSError as exc:
            self._fail(exc)

    def _open(self) -> None:
        if self._wav is not None:
            return
        self.stem.parent.mkdir(parents=True, exist_ok=True)
        # Open for the session's life, closed in finish (or on failure).
        wav = wave.open(str(self.path(".wav")), "wb")  # noqa: SIM115
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(self.figures.output_sample_rate)
        self._wav = wav
        self._jsonl = self.path(".jsonl").open("w", encoding="utf-8")
        header = {
            "session_id": self.session_id,
            "started": self.wall.isoformat(),
            "wav": self.path(".wav").name,
        }
        self._jsonl.write(json.dumps(header) + "\n")

    def finish(self) -> None:
        try:
            if self._wav is not None:
                self._wav.close()
            if self._jsonl is not None:
                self._jsonl.close()
            if not self.failed and self._wav is not None:
                text = transcript_markdown(self.session_id, self.wall, self._lines)
                self.path(".md").write_text(text, encoding="utf-8")
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        if not self.failed:
            log.warning("recording %s stopped: %s; the session goes on", self.stem.name, exc)
        self.failed = True


# --- what each file holds (pure) ----------------------------------------------------------


def message_record(at: float, direction: Direction, data: str | bytes) -> dict[str, Any]:
    """One JSONL line: the message as JSON, its base64 audio replaced by the byte count."""
    record: dict[str, Any] = {"t": round(at, 4), "from": direction}
    if isinstance(data, bytes):
        record["binary_bytes"] = len(data)
        return record
    try:
        event = json.loads(data)
    except ValueError:
        record["text"] = data
        return record
    if isinstance(event, dict) and _carries_audio(str(event.get("type", ""))):
        for name in _AUDIO_FIELDS:
            value = event.get(name)
            if isinstance(value, str):
                event[name] = f"<{_b64_bytes(value)} bytes of audio: see the WAV>"
    record["event"] = event
    return record


def _carries_audio(kind: str) -> bool:
    """Audio appends and audio deltas of every endpoint (not transcript deltas)."""
    return kind in ("input_audio_buffer.append", "session.input_audio.append") or kind.endswith(
        "audio.delta"
    )


def _b64_bytes(text: str) -> int:
    try:
        return len(base64.b64decode(text, validate=False))
    except ValueError:
        return len(text)


def _pcm16(samples: Samples) -> np.ndarray[Any, np.dtype[np.int16]]:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")


def stereo_frame(heard: Samples, events: Sequence[ModelEvent], figures: ModelFigures) -> bytes:
    """One model frame as stereo PCM16 at the output rate: left, the input frame the
    model ran on (resampled linearly); right, the audio it made (silence if none)."""
    n = figures.output_frame_samples
    heard = np.asarray(heard, dtype=np.float32)
    left = np.zeros(n, np.float32)
    if heard.shape[0]:
        span = heard.shape[0] * figures.output_sample_rate / figures.input_sample_rate
        positions = np.arange(n) * heard.shape[0] / span
        left = np.interp(positions, np.arange(heard.shape[0]), heard, right=0.0).astype(np.float32)
    right = np.zeros(n, np.float32)
    for event in events:
        if isinstance(event, AudioDelta):
            made = np.asarray(event.samples, dtype=np.float32)[:n]
            right[: made.shape[0]] = made
    both = np.empty(2 * n, np.float32)
    both[0::2], both[1::2] = left, right
    return _pcm16(both).tobytes()


def transcript_lines(at: float, events: Sequence[ModelEvent]) -> list[tuple[float, Speaker, str]]:
    lines: list[tuple[float, Speaker, str]] = []
    for event in events:
        if isinstance(event, UserTranscriptDelta) and event.delta:
            lines.append((at, "user", event.delta))
        elif isinstance(event, AssistantTextDelta) and event.delta:
            lines.append((at, "assistant", event.delta))
        elif isinstance(event, FunctionDelta) and event.delta:
            lines.append((at, "tool call", event.delta))
    return lines


def transcript_markdown(
    session_id: str, wall: datetime.datetime, lines: Sequence[tuple[float, Speaker, str]]
) -> str:
    """Consecutive pieces of one speaker as one paragraph, with the time it began."""
    out = [f"# Session {session_id}", "", f"Started {wall.isoformat()}.", ""]
    merged: list[tuple[float, Speaker, str]] = []
    for at, speaker, text in lines:
        if merged and merged[-1][1] == speaker and speaker != "tool result":
            first, _, said = merged[-1]
            merged[-1] = (first, speaker, said + text)
        else:
            merged.append((at, speaker, text))
    for at, speaker, text in merged:
        body = text.strip()
        if speaker in ("tool call", "tool result"):
            body = f"`{body}`"
        out.append(f"**{speaker.capitalize()}** ({at:.2f} s): {body}")
        out.append("")
    return "\n".join(out)


def enforce_bound(directory: Path, max_bytes: int) -> list[str]:
    """Delete whole recordings, oldest first, until ``directory`` holds at most
    ``max_bytes`` of them; the names deleted. Other files are never touched."""
    sizes: dict[str, int] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            sizes[match.group(1)] = sizes.get(match.group(1), 0) + entry.stat().st_size
    total = sum(sizes.values())
    deleted = []
    for stem in sorted(sizes):
        if total <= max_bytes:
            break
        for suffix in SUFFIXES:
            try:
                (directory / (stem + suffix)).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("recording %s: could not delete it: %s", stem, exc)
        total -= sizes[stem]
        deleted.append(stem)
    if deleted:
        log.info("recordings: deleted %d oldest to stay within %d bytes", len(deleted), max_bytes)
    return deleted
