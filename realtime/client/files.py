"""Send a recorded question through ``/v1/realtime`` and collect the spoken answer:
:func:`run_file_client`, the file client's session (``examples/voicechat_file_client.py``
is its command line; ``realtime generate`` gives the same answer offline).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import attrs
import numpy as np
import trio

from realtime.audio import pcm16_to_float, prepare_input
from realtime.client import (
    AudioDelta,
    ClientError,
    RealtimeClient,
    ResponseCancelled,
    ResponseDone,
    ServerBusy,
    ServerClosed,
    SessionUpdated,
    append_message,
    connect,
)
from realtime.client.cli import (
    OPEN_TIMEOUT,
    PCM16,
    AudioDeltaChecker,
    Event,
    FrameFramer,
    LinkNotices,
    TranscriptPrinter,
    open_session,
)
from realtime.models.base import VOICECHAT_FIGURES, Samples


@attrs.frozen(slots=True, eq=False)
class InputAudio:
    """A file's audio as read: prepared only once ``session.updated`` has named the
    server's input rate, so it is resampled once, straight from the source."""

    samples: Samples
    sample_rate: int
    extra_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        """What is sent: the file plus the silence appended."""
        return len(self.samples) / self.sample_rate + self.extra_seconds

    def at(self, rate: int) -> PCM16:
        return prepare_input(
            self.samples, self.sample_rate, extra_seconds=self.extra_seconds, to_rate=rate
        )


def _pcm_at(audio: PCM16 | InputAudio, rate: int) -> PCM16:
    """The input at the server's rate; bare PCM16 is VoiceChat's 16 kHz, sent as is
    to a server at that rate."""
    if isinstance(audio, InputAudio):
        return audio.at(rate)
    if rate == VOICECHAT_FIGURES.input_sample_rate:
        return audio
    return prepare_input(pcm16_to_float(audio), VOICECHAT_FIGURES.input_sample_rate, to_rate=rate)


def _messages(pcm: PCM16, conn: RealtimeClient) -> list[str]:
    """One append per model step, at the server's frame size and rate."""
    framer = FrameFramer(conn.frame_samples)
    frames = framer.push(pcm)
    tail = framer.flush()
    if tail.size:
        frames.append(tail)
    return [append_message(f, conn.input_sample_rate) for f in frames]


@dataclass
class FileClientResult:
    """What one run produced, plus the figures the script prints."""

    pcm: PCM16
    frames: int
    session_id: str | None
    model: str | None
    texts: dict[str, str]
    frames_sent: int
    seconds_to_ready: float
    seconds_to_first_audio: float | None
    seconds_total: float
    event_counts: dict[str, int] = field(default_factory=dict)
    sample_rate: int = VOICECHAT_FIGURES.output_sample_rate
    """The answer's rate, as the server announced it."""
    frame_seconds: float = VOICECHAT_FIGURES.frame_seconds
    """One append's length: the served model's step."""

    @property
    def audio_seconds(self) -> float:
        return self.pcm.size / self.sample_rate

    @property
    def real_time_factor(self) -> float:
        """Wall time per second of input fed; below 1 keeps up with live speech."""
        fed = self.frames_sent * self.frame_seconds
        return self.seconds_total / fed if fed else float("nan")


class _Progress:
    """How far the model has got, so a fast sender stays a bounded distance ahead.

    The server refuses input queued beyond ``--max-pending-audio-seconds``; the
    model emits one audio frame per input frame, so the highest ``frame_index``
    seen tells how much of what was sent has been run.
    """

    def __init__(self) -> None:
        self.done_frames = 0
        self._changed = trio.Event()

    def advance(self, frame_index: int) -> None:
        if frame_index + 1 > self.done_frames:
            self.done_frames = frame_index + 1
            self._changed.set()
            self._changed = trio.Event()

    async def wait_until(self, frames: int) -> None:
        while self.done_frames < frames:
            await self._changed.wait()


def _nonempty_audio(audio: PCM16 | InputAudio) -> PCM16 | InputAudio:
    """``audio`` as the client sends it (PCM as int16); :class:`ClientError` when empty."""
    if isinstance(audio, InputAudio):
        empty = audio.samples.shape[0] == 0
    else:
        audio = np.asarray(audio, dtype=np.int16)
        empty = audio.ndim != 1 or audio.size == 0
    if empty:
        raise ClientError("input audio is empty")
    return audio


async def run_file_client(
    url: str,
    audio: PCM16 | InputAudio,
    *,
    system_prompt: str | None = None,
    seed: int = 0,
    realtime: bool = False,
    api_key: str | None = None,
    origin: str | None = None,
    resume: bool = True,
    on_ready: Callable[[SessionUpdated], None] | None = None,
    on_event: Callable[[Event], None] | None = None,
    printer: TranscriptPrinter | None = None,
    max_ahead_seconds: float = 8.0,
    event_timeout: float = 60.0,
    open_timeout: float = OPEN_TIMEOUT,
) -> FileClientResult:
    """Send ``audio`` through one session; return the answer's audio.

    ``audio`` is an :class:`InputAudio` (prepared at the rate ``session.updated``
    names) or mono PCM16 at VoiceChat's 16 kHz (resampled for a server at another
    rate). Appends are the server's frames; sending runs concurrently with receiving:
    as fast as the server takes it (but at most ``max_ahead_seconds`` ahead of the
    model), or one frame per model step with ``realtime``. ``on_ready`` runs once the
    session is configured, before any audio goes out. Raises :class:`ClientError` on
    any failure to get a session (none opened within ``open_timeout`` seconds: the
    server reads the system prompt first), server error, early close, protocol
    violation, or ``event_timeout`` seconds without an event once it is open.
    With ``resume`` (the default) a dropped connection is resumed where the server
    offers it (:func:`realtime.client.connect`): the answer is the same as without
    the drop.
    """
    audio = _nonempty_audio(audio)
    started = time.perf_counter()
    progress = _Progress()
    chunks: list[PCM16] = []
    counts: dict[str, int] = {}
    first_audio: float | None = None
    printer = printer or TranscriptPrinter()

    def seen(event: Event) -> None:
        counts[event["type"]] = counts.get(event["type"], 0) + 1
        if on_event is not None:
            on_event(event)

    async with connect(
        url, api_key=api_key, origin=origin, resume=resume, on_link=LinkNotices()
    ) as conn:
        updated = await open_session(conn, open_timeout, system_prompt=system_prompt, seed=seed)
        assert conn.created is not None
        seen(conn.created.raw)
        seen(updated.raw)
        checker = AudioDeltaChecker.of(conn)
        messages = _messages(_pcm_at(audio, conn.input_sample_rate), conn)
        step = conn.frame_seconds
        max_ahead = max(1, int(max_ahead_seconds / step))
        ready = time.perf_counter() - started
        if on_ready is not None:
            on_ready(updated)
        sent = 0

        async def send_audio() -> None:
            nonlocal sent
            t0 = trio.current_time()
            try:
                for i, message in enumerate(messages):
                    if realtime:
                        await trio.sleep_until(t0 + i * step)
                    else:
                        await progress.wait_until(i - max_ahead)
                    await conn.send_raw(message)
                    sent = i + 1
                await conn.commit()
            except (ServerClosed, ServerBusy):
                pass  # the receiver reports why the server closed

        failure: ClientError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_audio)
            try:
                while True:
                    try:
                        with trio.fail_after(event_timeout):
                            event = await conn.receive()
                    except trio.TooSlowError:
                        raise ClientError(
                            f"no event from the server for {event_timeout:g} s (sent "
                            f"{sent}/{len(messages)} appends); it never sent response.done"
                        ) from None
                    seen(event.raw)
                    index = event.raw.get("frame_index")
                    if isinstance(index, int):
                        progress.advance(index)
                    if isinstance(event, AudioDelta):
                        chunks.append(checker.check(event))
                        if first_audio is None:
                            first_audio = time.perf_counter() - started
                    elif isinstance(event, ResponseDone):
                        break
                    elif isinstance(event, ResponseCancelled):
                        raise ClientError("server cancelled the response")
                    else:
                        printer.feed(event)
            except ClientError as exc:
                failure = exc  # raised below, outside the nursery, so not as a group
            finally:
                printer.finish()
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    answer = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return FileClientResult(
        pcm=answer,
        frames=checker.frames,
        session_id=updated.session_id,
        model=updated.model,
        texts=dict(printer.texts),
        frames_sent=sent,
        seconds_to_ready=ready,
        seconds_to_first_audio=first_audio,
        seconds_total=time.perf_counter() - started,
        event_counts=counts,
        sample_rate=checker.sample_rate,
        frame_seconds=step,
    )
