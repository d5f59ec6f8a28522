"""A live conversation: microphone in, speaker out, text printed as it arrives.

:func:`run_microphone_client` runs one session over the seams of
:mod:`realtime.client.devices` (a sound card, or arrays in tests). A session is a
handful of small units, each with its own state, that :class:`LiveSession` wires
together once ``session.updated`` has said the frame and the rates
(:class:`SessionAudio`): :class:`CaptureQueue` (audio thread -> trio),
:class:`Capture` and :class:`Uplink` (frames out, then the commit), :class:`Downlink`
(answer frames to the speaker, the drain), :class:`StopControl` (the two Ctrl-Cs),
:class:`StallWatch`, :class:`Meter`, :class:`RoundTrips` and :class:`Devices` (bounded
starts and stops). ``examples/voicechat_microphone.py`` is its command line.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO, TypeVar

import numpy as np
import trio

from realtime.audio import float_to_pcm16, pcm16_to_float, to_mono
from realtime.client import (
    AudioDelta,
    ClientError,
    FunctionDelta,
    RealtimeClient,
    ResponseCancelled,
    ResponseDone,
    ServerBusy,
    ServerClosed,
    ServerEvent,
    SessionUpdated,
    TextDelta,
    TranscriptDelta,
    connect,
)
from realtime.client.cli import (
    CHANNELS,
    OPEN_TIMEOUT,
    PCM16,
    AudioDeltaChecker,
    FrameFramer,
    LinkNotices,
    TranscriptPrinter,
    open_session,
)
from realtime.client.devices import (
    AudioInput,
    AudioOutput,
    AudioUnavailable,
    Deliver,
    SoundDeviceInput,
    SoundDeviceOutput,
    StreamResampler,
    device_call,
    load_sounddevice,
)
from realtime.client.echo import echo_canceller
from realtime.client.playback import JitterBuffer
from realtime.models.base import VOICECHAT_FIGURES, Samples

ECHO_WARNING = (
    "warning: there is no echo cancellation; use headphones or the model will hear itself"
)

T = TypeVar("T")


@dataclass(frozen=True)
class SessionAudio:
    """The frame and the rates a session runs at, as its ``session.updated`` states them.

    VoiceChat's figures are only the defaults for a field the server leaves out. The
    output frame is ``session.output_frame_samples`` when the server sends it, else
    the output rate times the input frame's duration.
    """

    frame_samples: int = VOICECHAT_FIGURES.frame_samples
    input_rate: int = VOICECHAT_FIGURES.input_sample_rate
    output_rate: int = VOICECHAT_FIGURES.output_sample_rate
    output_frame_samples: int = VOICECHAT_FIGURES.output_frame_samples

    @classmethod
    def from_session(cls, session: Mapping[str, Any]) -> SessionAudio:
        default = cls()
        frame = _count(session.get("frame_samples"), default.frame_samples)
        rate_in = _count(_rate_of(session.get("input_audio_format")), default.input_rate)
        rate_out = _count(_rate_of(session.get("output_audio_format")), default.output_rate)
        frame_out = _count(session.get("output_frame_samples"), round(rate_out * frame / rate_in))
        return cls(frame, rate_in, rate_out, frame_out)

    @classmethod
    def from_updated(cls, event: SessionUpdated) -> SessionAudio:
        session = event.raw.get("session")
        return cls.from_session(session if isinstance(session, Mapping) else {})


def _count(value: object, default: int) -> int:
    """``value`` when it is a positive integer (a bool is not), else ``default``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return default


def _rate_of(audio_format: object) -> object:
    return audio_format.get("sample_rate") if isinstance(audio_format, Mapping) else None


def _latency_figures(round_trips: Sequence[float]) -> str:
    trips = sorted(round_trips)
    if not trips:
        return "round-trip latency n/a"
    median = trips[len(trips) // 2] * 1000
    p95 = trips[min(len(trips) - 1, int(len(trips) * 0.95))] * 1000
    return f"round-trip latency median {median:.0f} ms, p95 {p95:.0f} ms"


@dataclass
class MicrophoneResult:
    frames_sent: int
    audio_frames: int
    dropped_samples: int
    texts: dict[str, str]
    committed: bool
    done: bool
    underruns: int = 0
    skipped_samples: int = 0
    input_stalls: int = 0
    round_trips: list[float] = field(default_factory=list)
    """Seconds from sending a frame to receiving the answer frame of the same index."""
    abandoned_device_calls: int = 0

    def summary(self, sample_rate: int | None = None) -> str:
        """One line for the end of a session: frames, underruns, round-trip latency."""
        parts = [
            f"sent {self.frames_sent} frames",
            f"received {self.audio_frames} audio frames",
            f"{self.underruns} underruns",
            _latency_figures(self.round_trips),
        ]
        if sample_rate and (self.skipped_samples or self.dropped_samples):
            parts.append(
                f"caught up {self.skipped_samples / sample_rate * 1000:.0f} ms, "
                f"dropped {self.dropped_samples / sample_rate * 1000:.0f} ms"
            )
        if self.input_stalls:
            parts.append(f"input stalled {self.input_stalls}x")
        return "summary: " + "; ".join(parts)


class Interrupted(Exception):
    """The second Ctrl-C: stop now."""


STALL_SECONDS = 1.0
"""An input device that delivers nothing for this long is reported."""

DEVICE_STOP_SECONDS = 2.0
"""How long a device's stop may take before it is abandoned."""

DEVICE_START_SECONDS = 10.0


@dataclass(frozen=True)
class LiveOptions:
    """The bounds and switches of one live session (see :func:`run_microphone_client`)."""

    drain_timeout: float = 10.0
    event_timeout: float = 60.0
    meter: bool = False
    stall_seconds: float = STALL_SECONDS
    device_stop_seconds: float = DEVICE_STOP_SECONDS


def level_dbfs(samples: Samples) -> float:
    """RMS level in dB below full scale (-100 for silence)."""
    x = np.asarray(samples, dtype=np.float32)
    if x.size == 0:
        return -100.0
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
    return max(-100.0, 20.0 * math.log10(rms)) if rms > 0 else -100.0


def _bar(dbfs: float, width: int = 10) -> str:
    filled = max(0, min(width, round((dbfs + 60.0) / 60.0 * width)))
    return "#" * filled + "." * (width - filled)


class Console:
    """The terminal side: transcript lines, notices, and (on a terminal) a meter line.

    Without a meter the transcript grows line by line as in the file client. With
    one, the bottom line is redrawn a few times a second (input and output level,
    playback latency against its target, round-trip latency) and shows the tail of
    the transcript run in progress; each run is printed whole when it ends, so the
    two never write over each other.
    """

    def __init__(self, out: TextIO, err: TextIO, *, meter: bool) -> None:
        self.out, self.err, self.meter = out, err, meter
        self.printer = TranscriptPrinter(out)
        self._run: tuple[str, str] | None = None
        self._drawn = False
        self.figures = ""

    @property
    def texts(self) -> dict[str, str]:
        return self.printer.texts

    def feed(self, event: ServerEvent) -> None:
        if not self.meter:
            self.printer.feed(event)
            return
        if not isinstance(event, TranscriptDelta | TextDelta | FunctionDelta):
            return
        channel = CHANNELS[type(event)]
        self.printer.texts[channel] += event.delta
        if not event.delta:
            return
        if self._run is not None and self._run[0] != channel:
            self._end_run()
        delta = event.delta.replace("\n", " ")
        text = self._run[1] + delta if self._run else delta.lstrip()
        self._run = (channel, text)

    def _end_run(self) -> None:
        if self._run is not None:
            self._clear()
            self.out.write(f"[{self._run[0]}] {self._run[1]}\n")
            self.out.flush()
            self._run = None

    def _clear(self) -> None:
        if self._drawn:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._drawn = False

    def draw(self) -> None:
        if not self.meter:
            return
        line = self.figures
        if self._run is not None:
            tail = self._run[1][-40:]
            line = f"[{self._run[0]}] ...{tail} | {line}"
        self.err.write("\r\x1b[K" + line[:150])
        self.err.flush()
        self._drawn = True

    def note(self, message: str) -> None:
        """A line of its own on stderr (warnings, state changes)."""
        if self.meter:
            self._clear()
        else:
            self.printer.break_line()
        print(message, file=self.err, flush=True)
        if self.meter:
            self.draw()

    def finish(self) -> None:
        if self.meter:
            self._end_run()
            self._clear()
        else:
            self.printer.finish()


def jitter_of(sink: AudioOutput) -> JitterBuffer | None:
    """The sink's jitter buffer, when it has one: the meter and the summary read it."""
    buffer = getattr(sink, "buffer", None)
    return buffer if isinstance(buffer, JitterBuffer) else None


# --- the units of one live session ----------------------------------------------------


class RoundTrips:
    """When each frame went out, by its index, and the seconds until the answer frame
    with the same ``frame_index`` came back."""

    def __init__(self) -> None:
        self._sent_at: dict[int, float] = {}
        self.seconds: list[float] = []

    def sent(self, index: int, now: float) -> None:
        self._sent_at[index] = now

    def answered(self, index: int, now: float) -> None:
        started = self._sent_at.pop(index, None)
        if started is not None:
            self.seconds.append(now - started)


class StopControl:
    """The turn: the first interrupt commits (and wakes whatever waits for captured
    audio), the second quits at once by cancelling the session's scope."""

    def __init__(self) -> None:
        self.commit_requested = trio.Event()
        self.interrupted = False
        self._waiting: set[trio.CancelScope] = set()

    @property
    def committing(self) -> bool:
        return self.commit_requested.is_set()

    def commit(self) -> None:
        self.commit_requested.set()
        for scope in list(self._waiting):
            scope.cancel()

    async def until_commit(self, receive: Callable[[], Awaitable[T]]) -> T | None:
        """``await receive()``; None when the commit comes first."""
        with trio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                return await receive()
            finally:
                self._waiting.discard(scope)
        return None

    async def watch(
        self, interrupts: trio.abc.ReceiveChannel[None], quit_scope: trio.CancelScope
    ) -> None:
        async for _ in interrupts:
            if not self.committing:
                self.commit()
                continue
            self.interrupted = True
            quit_scope.cancel()
            return


class CaptureQueue:
    """Captured blocks from the audio thread into trio, bounded: counts the blocks it
    had to drop, and when the last one came (the stall watch reads it)."""

    def __init__(self, stop: StopControl, size: int = 64) -> None:
        self._send, self._recv = trio.open_memory_channel[Samples](size)
        self._token = trio.lowlevel.current_trio_token()
        self._stop = stop
        self.dropped_blocks = 0
        self.last_block_at = trio.current_time()

    def deliver(self, block: Samples) -> None:
        """On the audio thread: copy and hand over, never block."""
        data = np.array(block, dtype=np.float32, copy=True)
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._accept, data)

    def _accept(self, block: Samples) -> None:  # runs in trio, scheduled by deliver
        if self._stop.committing:
            return  # captured after Ctrl-C: not part of the question
        self.last_block_at = trio.current_time()
        try:
            self._send.send_nowait(block)
        except trio.WouldBlock:
            self.dropped_blocks += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def restart_clock(self) -> None:
        """The device has just started: quiet time counts from now."""
        self.last_block_at = trio.current_time()

    def quiet_seconds(self) -> float:
        return trio.current_time() - self.last_block_at

    async def receive(self) -> Samples | None:
        """The next block; None once closed."""
        try:
            return await self._recv.receive()
        except trio.EndOfChannel:
            return None

    def leftovers(self) -> list[Samples]:
        """What was captured before the commit and not taken yet."""
        blocks: list[Samples] = []
        while True:
            try:
                blocks.append(self._recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return blocks

    def close(self) -> None:
        self._send.close()


class Uplink:
    """Captured audio to the server: resampled to the session's input rate, cut into
    whole frames, each append stamped for the round trip."""

    def __init__(
        self, conn: RealtimeClient, source_rate: int, audio: SessionAudio, trips: RoundTrips
    ) -> None:
        self._conn = conn
        self._resampler = StreamResampler(source_rate, audio.input_rate)
        self._framer = FrameFramer(audio.frame_samples)
        self._trips = trips
        self.frames_sent = 0

    async def send(self, samples: Samples, *, last: bool = False) -> None:
        pcm = float_to_pcm16(self._resampler.process(samples, last=last))
        for frame in self._framer.push(pcm):
            await self._append(frame)

    async def commit(self) -> None:
        """The resampler's tail, the partial frame (the server pads it), the commit."""
        await self.send(np.zeros(0, np.float32), last=True)
        partial = self._framer.flush()
        if partial.size:
            await self._append(partial)
        await self._conn.commit()

    async def _append(self, frame: PCM16) -> None:
        self._trips.sent(self.frames_sent, trio.current_time())
        await self._conn.append(frame)
        self.frames_sent += 1


class Meter:
    """The live figures: input and output level, playback latency against its target,
    the latest round trip."""

    def __init__(self, jitter: JitterBuffer | None, trips: RoundTrips) -> None:
        self.input_db = -100.0
        self.output_db = -100.0
        self._jitter = jitter
        self._trips = trips

    def figures(self) -> str:
        parts = [f"in {_bar(self.input_db)} {self.input_db:4.0f} dB", f"out {_bar(self.output_db)}"]
        jitter = self._jitter
        if jitter is not None and jitter.sample_rate:
            parts.append(
                f"playback {jitter.latency_seconds() * 1000:3.0f} ms "
                f"(target {jitter.target_seconds() * 1000:.0f}, {jitter.underruns} underruns)"
            )
        if self._trips.seconds:
            parts.append(f"rtt {self._trips.seconds[-1] * 1000:.0f} ms")
        return " | ".join(parts)

    async def run(self, console: Console) -> None:
        while True:
            console.figures = self.figures()
            console.draw()
            await trio.sleep(0.2)


class StallWatch:
    """Says so when the input device has delivered nothing for ``seconds``, and again
    when it delivers once more."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.stalls = 0
        self._stalled = False

    def observe(self, quiet: float) -> str | None:
        """The notice for an input quiet for ``quiet`` seconds, when that changes its state."""
        if not self._stalled and quiet >= self.seconds:
            self._stalled = True
            self.stalls += 1
            return (
                f"warning: the input device has delivered no audio for {quiet:.1f} s "
                "(stalled, muted or unplugged?); Ctrl-C commits what was captured"
            )
        if self._stalled and quiet < self.seconds:
            self._stalled = False
            return "input device delivering again"
        return None

    async def run(self, queue: CaptureQueue, stop: StopControl, console: Console) -> None:
        while not stop.committing:
            await trio.sleep(min(0.1, self.seconds / 4))
            message = self.observe(queue.quiet_seconds())
            if message is not None:
                console.note(message)


class Devices:
    """Both audio devices, only ever called off the trio thread: each start bounded (a
    failure is a ClientError), each stop done once and abandoned after ``stop_seconds``."""

    def __init__(
        self, source: AudioInput, sink: AudioOutput, console: Console, stop_seconds: float
    ) -> None:
        self._source, self._sink, self._console = source, sink, console
        self._stop_seconds = stop_seconds
        self._stopped: set[str] = set()
        self.abandoned = 0

    async def start(self, deliver: Deliver) -> None:
        if not await device_call(self._sink.start, DEVICE_START_SECONDS):
            raise ClientError("the output device did not start")
        if not await device_call(partial(self._source.start, deliver), DEVICE_START_SECONDS):
            raise ClientError("the input device did not start")

    async def stop_input(self) -> None:
        await self._stop("input", self._source.stop)

    async def stop_all(self) -> None:
        with trio.CancelScope(shield=True):  # runs on the way out, cancelled or not
            await self.stop_input()
            await self._stop("output", self._sink.stop)

    async def _stop(self, which: str, fn: Callable[[], None]) -> None:
        if which in self._stopped:
            return
        self._stopped.add(which)
        with trio.CancelScope(shield=True):  # bounded by its own timeout
            returned = await device_call(fn, self._stop_seconds)
        if not returned:
            self.abandoned += 1
            self._console.note(
                f"warning: the {which} device did not stop within "
                f"{self._stop_seconds:g} s; abandoned it"
            )


@dataclass(frozen=True)
class Capture:
    """The capture side: blocks to the input meter and the uplink until the commit; then
    what was captured before it, the commit, and the input device's stop."""

    queue: CaptureQueue
    uplink: Uplink
    stop: StopControl
    meter: Meter
    console: Console
    devices: Devices

    async def run(self) -> None:
        with contextlib.suppress(ServerClosed, ServerBusy):  # the receiver reports why
            await self._stream()
            await self._commit()

    async def _stream(self) -> None:
        while not self.stop.committing:
            block = await self.stop.until_commit(self.queue.receive)
            if block is None:
                return
            mono = to_mono(block)
            self.meter.input_db = level_dbfs(mono)
            await self.uplink.send(mono)

    async def _commit(self) -> None:
        for block in self.queue.leftovers():  # captured before the interrupt: still asked
            await self.uplink.send(to_mono(block))
        await self.uplink.commit()
        self.console.note("[committed: waiting for the end of the answer]")
        await self.devices.stop_input()


class Downlink:
    """The playback side: each answer frame checked, metered, resampled from the
    session's output rate to the device's and queued; text to the console; the drain."""

    def __init__(
        self,
        conn: RealtimeClient,
        sink: AudioOutput,
        audio: SessionAudio,
        console: Console,
        meter: Meter,
        trips: RoundTrips,
        event_timeout: float,
    ) -> None:
        self._conn, self._sink, self._console = conn, sink, console
        self._meter, self._trips, self._timeout = meter, trips, event_timeout
        self._resampler = StreamResampler(audio.output_rate, sink.sample_rate)
        self.checker = AudioDeltaChecker(audio.output_frame_samples, audio.output_rate)
        self.dropped_samples = 0

    async def until_done(self) -> bool:
        """Play and print events until ``response.done`` (True) or ``response.cancelled``."""
        while True:
            event = await self._next()
            if isinstance(event, AudioDelta):
                self._play(event)
            elif isinstance(event, ResponseDone | ResponseCancelled):
                return isinstance(event, ResponseDone)
            else:
                self._console.feed(event)

    async def _next(self) -> ServerEvent:
        try:
            with trio.fail_after(self._timeout):
                return await self._conn.receive()
        except trio.TooSlowError:
            raise ClientError(f"no event from the server for {self._timeout:g} s") from None

    def _play(self, event: AudioDelta) -> None:
        pcm = self.checker.check(event)
        self._trips.answered(event.frame_index, trio.current_time())
        samples = pcm16_to_float(pcm)
        self._meter.output_db = level_dbfs(samples)
        dropped = self._sink.play(self._resampler.process(samples))
        if dropped:
            self._console.note(
                f"warning: playback buffer full, dropped "
                f"{dropped / self._sink.sample_rate:.2f} s of the oldest audio"
            )
            self.dropped_samples += dropped

    async def drain(self, seconds: float) -> None:
        """The resampler's tail, then wait (at most ``seconds``) for the device to play
        what is queued."""
        self._sink.play(self._resampler.process(np.zeros(0, np.float32), last=True))
        self._sink.finish()
        with trio.move_on_after(seconds):
            # The audio thread empties the buffer; polling keeps it lock-only.
            while self._sink.pending_seconds() > 0:  # noqa: ASYNC110
                await trio.sleep(0.02)


class LiveSession:
    """One configured connection: its units, the nursery that runs them, its result."""

    def __init__(
        self,
        conn: RealtimeClient,
        audio: SessionAudio,
        source: AudioInput,
        sink: AudioOutput,
        console: Console,
        options: LiveOptions,
    ) -> None:
        self._console, self._options = console, options
        self._jitter = jitter_of(sink)
        self.stop = StopControl()
        self.trips = RoundTrips()
        self.queue = CaptureQueue(self.stop)
        self.meter = Meter(self._jitter, self.trips)
        self.devices = Devices(source, sink, console, options.device_stop_seconds)
        self.uplink = Uplink(conn, source.sample_rate, audio, self.trips)
        self.capture = Capture(
            self.queue, self.uplink, self.stop, self.meter, console, self.devices
        )
        self.stall = StallWatch(options.stall_seconds)
        self.downlink = Downlink(
            conn, sink, audio, console, self.meter, self.trips, options.event_timeout
        )
        self.done = False
        self.failure: ClientError | None = None

    async def run(self, interrupts: trio.abc.ReceiveChannel[None]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.stop.watch, interrupts, nursery.cancel_scope)
                await self.devices.start(self.queue.deliver)
                self.queue.restart_clock()
                nursery.start_soon(self.capture.run)
                nursery.start_soon(self.stall.run, self.queue, self.stop, self._console)
                if self._options.meter:
                    nursery.start_soon(self.meter.run, self._console)
                await self._answer()
                nursery.cancel_scope.cancel()
        finally:
            self.queue.close()
            await self.devices.stop_all()

    async def _answer(self) -> None:
        try:
            self.done = await self.downlink.until_done()
            await self.downlink.drain(self._options.drain_timeout)
        except ClientError as exc:
            self.failure = exc  # raised by result(), once the devices are stopped
        finally:
            self._console.finish()

    def result(self, err: TextIO) -> MicrophoneResult:
        """The summary's figures; raises :class:`Interrupted` or the session's failure."""
        if self.stop.interrupted:
            raise Interrupted
        if self.failure is not None:
            raise self.failure
        if self.queue.dropped_blocks:
            print(
                f"warning: {self.queue.dropped_blocks} captured blocks were dropped "
                "(the network could not keep up)",
                file=err,
            )
        jitter = self._jitter
        return MicrophoneResult(
            frames_sent=self.uplink.frames_sent,
            audio_frames=self.downlink.checker.frames,
            dropped_samples=self.downlink.dropped_samples,
            texts=dict(self._console.texts),
            committed=self.stop.committing,
            done=self.done,
            underruns=jitter.underruns if jitter is not None else 0,
            skipped_samples=jitter.skipped if jitter is not None else 0,
            input_stalls=self.stall.stalls,
            round_trips=self.trips.seconds,
            abandoned_device_calls=self.devices.abandoned,
        )


async def run_microphone_client(
    url: str,
    source: AudioInput,
    sink: AudioOutput,
    interrupts: trio.abc.ReceiveChannel[None],
    *,
    system_prompt: str | None = None,
    seed: int = 0,
    api_key: str | None = None,
    origin: str | None = None,
    resume: bool = True,
    out: TextIO | None = None,
    err: TextIO | None = None,
    drain_timeout: float = 10.0,
    event_timeout: float = 60.0,
    open_timeout: float = OPEN_TIMEOUT,
    meter: bool = False,
    stall_seconds: float = STALL_SECONDS,
    device_stop_seconds: float = DEVICE_STOP_SECONDS,
    echo_cancelled: bool = False,
) -> MicrophoneResult:
    """One live session: capture -> frame appends, deltas -> ``sink``, text -> ``out``.

    The frame and the rates are the ones ``session.updated`` states. The first item
    on ``interrupts`` commits: what was captured goes out, then the commit, and only
    then are the devices stopped (off the trio thread, abandoned after
    ``device_stop_seconds``); the server flushes and ends with ``response.done``,
    then the sink drains. A second item raises :class:`Interrupted`. Server errors,
    early closes and a session not open within ``open_timeout`` seconds raise
    :class:`ClientError`. No audio-device call ever runs on
    the trio thread.
    """
    err = err if err is not None else sys.stderr
    console = Console(out if out is not None else sys.stdout, err, meter=meter)
    options = LiveOptions(
        drain_timeout=drain_timeout,
        event_timeout=event_timeout,
        meter=meter,
        stall_seconds=stall_seconds,
        device_stop_seconds=device_stop_seconds,
    )
    if not echo_cancelled:
        print(ECHO_WARNING, file=err, flush=True)
    async with connect(
        url, api_key=api_key, origin=origin, resume=resume, on_link=LinkNotices(err)
    ) as conn:
        updated = await open_session(conn, open_timeout, system_prompt=system_prompt, seed=seed)
        print("[connected: speak now; Ctrl-C to finish, twice to quit]", file=err, flush=True)
        audio = SessionAudio.from_updated(updated)
        session = LiveSession(conn, audio, source, sink, console, options)
        await session.run(interrupts)
    return session.result(err)


def open_sound_devices(
    input_device: str | int | None,
    output_device: str | int | None,
    input_rate: int | None = None,
    output_rate: int | None = None,
    *,
    echo_cancellation: bool = True,
    noise_suppression: bool = False,
    err: TextIO | None = None,
) -> tuple[SoundDeviceInput, SoundDeviceOutput]:
    """The two PortAudio devices, with an echo canceller between them when asked and
    installed; what was chosen (and why not, where not) said on ``err``.
    :class:`AudioUnavailable` when there is no usable device."""
    err = err if err is not None else sys.stderr
    sd = load_sounddevice()
    try:
        source = SoundDeviceInput(sd, input_device, input_rate)
        sink = SoundDeviceOutput(sd, output_device, output_rate)
    except (ValueError, sd.PortAudioError) as exc:
        raise AudioUnavailable(f"no usable audio device: {exc} (see --list-devices)") from None
    notices = [source.notice, sink.notice]
    if echo_cancellation:
        canceller, why = echo_canceller(source.sample_rate, noise_suppression=noise_suppression)
        source.echo = sink.echo = canceller
        notices.append(why and f"{why}; running without (use headphones)")
    for notice in notices:
        if notice:
            print(f"note: {notice}", file=err)
    cancelling = "on" if source.echo is not None else "off"
    print(
        f"input: {source.name} at {source.sample_rate} Hz; "
        f"output: {sink.name} at {sink.sample_rate} Hz; echo cancellation {cancelling}",
        file=err,
    )
    return source, sink
