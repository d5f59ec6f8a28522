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
line, and the session goes on.

The byte bound holds at every moment, not only when a recording ends: every write is
counted before it is made (:meth:`Recording.claim`). A conversation may write at most
its share, ``--record-max-bytes`` / (``--max-sessions`` + 1); the one that would go past
it stops recording (one log line; its transcript says so) and the session goes on.
Room for a write is made by deleting finished recordings, oldest first, never one that
is still being written, so a conversation can displace at most its share of older
recordings, and a share's worth of them always survives whatever the live ones do.
What a client sends is recorded as the server took it, never parsed again here: a
message the server refused is one line (why, and its first characters), an accepted
one its text with the audio payload replaced by its size, cut at
``MAX_MESSAGE_CHARS``.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import re
import wave
from collections.abc import Container, Sequence
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

log = logging.getLogger(__name__)

MAX_PENDING: Final = 4096
"""Items waiting for the writer, per session (a few seconds of a busy conversation);
past it, items are dropped rather than held in memory or waited for."""
SUFFIXES: Final = (".wav", ".jsonl", ".md")
_NAME: Final = re.compile(r"^(\d{8}T\d{6}_\d{6}Z-[A-Za-z0-9_]+)\.(wav|jsonl|md)$")
_AUDIO_FIELDS: Final = ("audio", "delta")
"""Fields that carry base64 audio in the events that carry audio (:func:`_carries_audio`)."""
_AUDIO_PAYLOAD: Final = re.compile(r'("audio"\s*:\s*")([A-Za-z0-9+/]*={0,2})"')
"""An accepted audio append's payload, found in its text (both endpoints name it so)."""
REFUSED_CHARS: Final = 256
"""How much of a refused client message its line keeps."""
MAX_MESSAGE_CHARS: Final = 256 * 1024
"""How much of an accepted client message (its audio replaced) its line keeps."""
WAV_HEADER_BYTES: Final = 44
TRANSCRIPT_RESERVE: Final = 2048
"""Bytes of each share the WAV and JSONL leave for the transcript, so a recording
stopped at its share still says so (its transcript is cut to what is left)."""

Direction = Literal["client", "server"]
Speaker = Literal["user", "assistant", "tool call", "tool result"]


@attrs.frozen(slots=True)
class _Message:
    at: float
    direction: Direction
    data: str | bytes


@attrs.frozen(slots=True)
class _Received:
    """A client message and what the server made of it (``refused``: why not)."""

    at: float
    data: str | bytes
    refused: str | None
    chars: int


@attrs.frozen(slots=True)
class _Frame:
    at: float
    heard: Samples
    events: tuple[ModelEvent, ...]


@attrs.frozen(slots=True)
class _ToolResult:
    at: float
    output: str


_Item = _Message | _Received | _Frame | _ToolResult


class Recording:
    """``--record DIR`` for the whole server: where, the byte bound, each conversation's
    share of it, the one worker. The accounts are kept on the worker thread only
    (every call below runs under ``limiter``)."""

    def __init__(self, directory: Path, max_bytes: int, share: int | None = None) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.share = max_bytes if share is None else min(share, max_bytes)
        """What one conversation may write (:func:`share_of`)."""
        self.limiter = trio.CapacityLimiter(1)
        """One worker thread for every session's writes (and the byte bound's deletes)."""
        self._live: dict[str, int] = {}
        """Bytes written so far by each recording still being written."""
        self._live_total = 0
        self._finished: dict[str, int] | None = None
        """Bytes of each finished recording in DIR (read from DIR when first needed)."""
        self._finished_total = 0

    def session(self, session_id: str, figures: ModelFigures) -> Recorder:
        return CallRecorder(self, session_id, figures)

    def claim(self, stem: str, size: int, keep: int = 0) -> bool:
        """Whether the live recording ``stem`` may write ``size`` more bytes now (then
        they are counted). No, past its share (less ``keep``, kept for its transcript);
        else room is made by deleting finished recordings, oldest first, and no if even
        that is not enough."""
        written = self._live.get(stem, 0)
        if written + size + keep > self.share:
            return False
        finished = self._finished_sizes()
        if self._finished_total + self._live_total + size > self.max_bytes:
            # Read DIR again (an operator may have deleted some), then delete.
            finished = self._read_finished()
            room = self.max_bytes - self._live_total - size
            for old in _delete_oldest(self.directory, finished, room):
                self._finished_total -= finished.pop(old)
            if self._finished_total + self._live_total + size > self.max_bytes:
                return False
        self._live[stem] = written + size
        self._live_total += size
        return True

    def room(self, stem: str) -> int:
        """What the live recording ``stem`` may still write within its share."""
        return max(0, self.share - self._live.get(stem, 0))

    def finished(self, stem: str) -> None:
        """The recording ``stem`` is complete: from now on it may be deleted."""
        if stem in self._live:
            finished = self._finished_sizes()  # read while ``stem`` is still left out
            size = self._live.pop(stem)
            self._live_total -= size
            finished[stem] = size
            self._finished_total += size

    def _finished_sizes(self) -> dict[str, int]:
        return self._finished if self._finished is not None else self._read_finished()

    def _read_finished(self) -> dict[str, int]:
        self._finished = _sizes(self.directory, exclude=self._live)
        self._finished_total = sum(self._finished.values())
        return self._finished


def share_of(max_bytes: int, conversations: int) -> int:
    """One conversation's share of ``--record-max-bytes``: with ``conversations`` at
    once, a share's worth of finished recordings is left whatever the live ones write."""
    return max_bytes // (max(1, conversations) + 1)


class Recorder:
    """What the connection calls; this base records nothing (the default)."""

    def event(self, direction: Direction, data: str | bytes) -> None:
        """A WebSocket message handed to the socket (``server``; a ``client`` one is
        recorded by :meth:`received`)."""

    def received(self, data: str | bytes, refused: str | None) -> None:
        """A client message, once the server has taken it (``refused``: why it did not)."""

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
        self._files = _Files(recording.directory / stem, session_id, wall, figures, recording)
        self._pending: list[_Item] = []
        self._gathered = trio.Event()
        self._dropped = 0
        self._closed = False

    def _put(self, item: _Item) -> None:
        if self._closed or self._files.failed or self._files.stopped:
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

    def received(self, data: str | bytes, refused: str | None) -> None:
        # A refused message is held only as far as its line keeps it.
        kept = data[:REFUSED_CHARS] if refused is not None else data
        self._put(_Received(self._now(), kept, refused, len(data)))

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
    recording: Recording
    failed: bool = attrs.field(default=False, init=False)
    stopped: float | None = attrs.field(default=None, init=False)
    """When the recording reached its share (or the bound) and stopped."""
    _wav: wave.Wave_write | None = attrs.field(default=None, init=False)
    _jsonl: IO[str] | None = attrs.field(default=None, init=False)
    _lines: list[tuple[float, Speaker, str]] = attrs.field(factory=list, init=False)

    def path(self, suffix: str) -> Path:
        return self.stem.parent / (self.stem.name + suffix)

    def write(self, batch: list[_Item]) -> None:
        if self.failed or self.stopped is not None:
            return
        try:
            if not self._open():
                return
            assert self._wav is not None and self._jsonl is not None
            for item in batch:
                if isinstance(item, _Frame):
                    pcm = stereo_frame(item.heard, item.events, self.figures)
                    if not self._claim(len(pcm), item.at):
                        break
                    self._wav.writeframes(pcm)
                    self._lines += transcript_lines(item.at, item.events)
                    continue
                if isinstance(item, _ToolResult):
                    self._lines.append((item.at, "tool result", item.output))
                    continue
                if isinstance(item, _Message):
                    record = message_record(item.at, item.direction, item.data)
                else:
                    record = client_record(item.at, item.data, item.refused, item.chars)
                line = json.dumps(record) + "\n"
                if not self._claim(_utf8_bytes(line), item.at):
                    break
                self._jsonl.write(line)
            self._jsonl.flush()
        except OSError as exc:
            self._fail(exc)

    def _claim(self, size: int, at: float) -> bool:
        """Count ``size`` bytes against the bounds before writing them; past them the
        recording stops here (one log line), and the session goes on."""
        if self.recording.claim(self.stem.name, size, keep=TRANSCRIPT_RESERVE):
            return True
        if self.stopped is None:
            self.stopped = at
            log.warning(
                "recording %s stopped at %.1f s: it reached its share of %d bytes of "
                "--record-max-bytes; the session goes on",
                self.stem.name,
                at,
                self.recording.share,
            )
        return False

    def _open(self) -> bool:
        if self._wav is not None:
            return True
        header = {
            "session_id": self.session_id,
            "started": self.wall.isoformat(),
            "wav": self.path(".wav").name,
        }
        first = json.dumps(header) + "\n"
        if not self._claim(WAV_HEADER_BYTES + _utf8_bytes(first), 0.0):
            return False
        self.stem.parent.mkdir(parents=True, exist_ok=True)
        # Open for the session's life, closed in finish (or on failure).
        wav = wave.open(str(self.path(".wav")), "wb")  # noqa: SIM115
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(self.figures.output_sample_rate)
        self._wav = wav
        self._jsonl = self.path(".jsonl").open("w", encoding="utf-8")
        self._jsonl.write(first)
        return True

    def finish(self) -> None:
        try:
            if self._wav is not None:
                self._wav.close()
            if self._jsonl is not None:
                self._jsonl.close()
            if not self.failed and self._wav is not None:
                text = transcript_markdown(self.session_id, self.wall, self._lines)
                if self.stopped is not None:
                    text += _stopped_note(self.stopped, self.recording.share)
                data = _cut_to(text.encode("utf-8"), self.recording.room(self.stem.name))
                if data and self.recording.claim(self.stem.name, len(data)):
                    self.path(".md").write_bytes(data)
        except OSError as exc:
            self._fail(exc)
        finally:
            self.recording.finished(self.stem.name)

    def _fail(self, exc: OSError) -> None:
        if not self.failed:
            log.warning("recording %s stopped: %s; the session goes on", self.stem.name, exc)
        self.failed = True


# --- what each file holds (pure) ----------------------------------------------------------


def client_record(at: float, data: str | bytes, refused: str | None, chars: int) -> dict[str, Any]:
    """One JSONL line for a client message, as the server took it and never parsed
    again: a refused one as why and its first ``REFUSED_CHARS`` characters, an accepted
    one as its text, its audio payload replaced by the byte count, cut at
    ``MAX_MESSAGE_CHARS`` (``chars``: the whole message's length)."""
    record: dict[str, Any] = {"t": round(at, 4), "from": "client"}
    if isinstance(data, bytes):
        record["binary_bytes"] = chars
    elif refused is not None:
        record["text"] = data[:REFUSED_CHARS]
        record["chars"] = chars
    else:
        text = _without_audio(data)
        record["text"] = text[:MAX_MESSAGE_CHARS]
        if len(text) > MAX_MESSAGE_CHARS:
            record["chars"] = chars
    if refused is not None:
        record["refused"] = refused[:REFUSED_CHARS]
    return record


def _without_audio(text: str) -> str:
    """An accepted message's text with its audio payload replaced by its size."""

    def size(found: re.Match[str]) -> str:
        payload = found.group(2)
        count = len(payload) * 3 // 4 - payload.count("=")
        return f'{found.group(1)}<{count} bytes of audio: see the WAV>"'

    return _AUDIO_PAYLOAD.sub(size, text, count=1)


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _cut_to(data: bytes, room: int) -> bytes:
    """``data``, cut (at a character) to ``room`` bytes with a note when it is longer."""
    if len(data) <= room:
        return data
    note = b"\n\n(cut here: the recording's share of --record-max-bytes is full)\n"
    if room <= len(note):
        return b""
    return data[: room - len(note)].decode("utf-8", "ignore").encode("utf-8") + note


def _stopped_note(at: float, share: int) -> str:
    return (
        f"\n(Recording stopped at {at:.2f} s: this conversation reached its share of "
        f"{share} bytes of --record-max-bytes; the conversation went on.)\n"
    )


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
    return _delete_oldest(directory, _sizes(directory), max_bytes)


def _sizes(directory: Path, exclude: Container[str] = ()) -> dict[str, int]:
    """The bytes of each recording in ``directory`` by its name (not ``exclude``'s)."""
    sizes: dict[str, int] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return sizes
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and match.group(1) not in exclude:
            try:
                if entry.is_file():
                    sizes[match.group(1)] = sizes.get(match.group(1), 0) + entry.stat().st_size
            except OSError:
                continue
    return sizes


def _delete_oldest(directory: Path, sizes: dict[str, int], max_bytes: int) -> list[str]:
    """Delete the recordings of ``sizes``, oldest first, until they hold at most
    ``max_bytes``; the names deleted."""
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
