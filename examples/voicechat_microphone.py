"""Talk to the model live: microphone in, speaker out, text printed as it arrives.

    python examples/voicechat_microphone.py ws://127.0.0.1:8080/v1/realtime \\
        [--system-prompt TEXT] [--seed N] [--api-key KEY] [--origin ORIGIN] \\
        [--input-device NAME] [--output-device NAME]
    python examples/voicechat_microphone.py --list-devices

The first Ctrl-C sends ``input_audio_buffer.commit`` and waits for
``response.done`` and for the speaker to play what is buffered; a second Ctrl-C
quits at once. There is no echo cancellation: use headphones, or the model hears
itself.

Device I/O sits behind two small seams (:class:`AudioInput`, :class:`AudioOutput`)
so tests drive :func:`run_microphone_client` with numpy arrays instead of a sound
card. PortAudio calls our callbacks on its own threads; they only copy data and
hand it to trio with ``TrioToken.run_sync_soon`` (input) or read a lock-guarded
buffer (output), so they never block on the network or the event loop. The
protocol goes through :mod:`realtime.client`; failing to get a session exits with
the code ``--help`` lists for it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TextIO, cast

import numpy as np
import trio

if importlib.util.find_spec("realtime") is None:  # a script run from an uninstalled checkout
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (
    CHANNELS,
    EXIT_EPILOG,
    EXIT_USAGE,
    FRAME_SECONDS,
    PCM16,
    AudioDeltaChecker,
    FrameFramer,
    StreamResampler,
    TranscriptPrinter,
    report,
)
from _playback import JitterBuffer as JitterBuffer  # re-exported for the tests

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
    TextDelta,
    TranscriptDelta,
    connect,
)
from realtime.models.base import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE, Samples

ECHO_WARNING = (
    "warning: there is no echo cancellation; use headphones or the model will hear itself"
)

Deliver = Callable[[Samples], None]
"""Called by an input with each captured block, (frames,) or (frames, channels), on
any thread; it must return at once."""


class AudioInput(Protocol):
    """Where speech comes from: a microphone, or arrays in tests."""

    @property
    def sample_rate(self) -> int: ...

    def start(self, deliver: Deliver) -> None:
        """Begin calling ``deliver`` with captured blocks (about 80 ms each)."""
        ...

    def stop(self) -> None: ...


class AudioOutput(Protocol):
    """Where the answer goes: a speaker through a jitter buffer, or a list in tests."""

    @property
    def sample_rate(self) -> int: ...

    def start(self) -> None: ...

    def play(self, samples: Samples) -> int:
        """Queue mono float32 at ``sample_rate`` without blocking; returns samples dropped."""
        ...

    def finish(self) -> None:
        """No more audio will come: play out what is queued, even below the prebuffer."""
        ...

    def pending_seconds(self) -> float:
        """Audio queued but not yet played (the drain waits for 0)."""
        ...

    def stop(self) -> None: ...


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
    """Seconds from sending an 80 ms frame to receiving the answer frame of the same index."""
    abandoned_device_calls: int = 0

    def summary(self, sample_rate: int | None = None) -> str:
        """One line for the end of a session: frames, underruns, round-trip latency."""
        rate = sample_rate or 1
        trips = sorted(self.round_trips)
        if trips:
            median = trips[len(trips) // 2] * 1000
            p95 = trips[min(len(trips) - 1, int(len(trips) * 0.95))] * 1000
            rtt = f"round-trip latency median {median:.0f} ms, p95 {p95:.0f} ms"
        else:
            rtt = "round-trip latency n/a"
        parts = [
            f"sent {self.frames_sent} frames",
            f"received {self.audio_frames} audio frames",
            f"{self.underruns} underruns",
            rtt,
        ]
        if sample_rate and (self.skipped_samples or self.dropped_samples):
            parts.append(
                f"caught up {self.skipped_samples / rate * 1000:.0f} ms, "
                f"dropped {self.dropped_samples / rate * 1000:.0f} ms"
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
        text = (self._run[1] if self._run else "") + event.delta.replace("\n", " ")
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


async def device_call(fn: Callable[[], None], seconds: float) -> bool:
    """Run a blocking audio-device call (start, stop) off the trio thread, bounded.

    True when it returned in time. Otherwise the call is abandoned: its worker
    thread stays blocked inside PortAudio (a stalled device's ``stop()`` may never
    return) while the client goes on and exits; that one thread is the only one
    this client leaves behind, and only in that case.
    """
    with trio.move_on_after(seconds):
        await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
        return True
    return False


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
    out: TextIO | None = None,
    err: TextIO | None = None,
    drain_timeout: float = 10.0,
    event_timeout: float = 60.0,
    meter: bool = False,
    stall_seconds: float = STALL_SECONDS,
    device_stop_seconds: float = DEVICE_STOP_SECONDS,
) -> MicrophoneResult:
    """One live session: capture -> 80 ms appends, deltas -> ``sink``, text -> ``out``.

    The first item on ``interrupts`` commits: what was captured goes out, then the
    commit, and only then are the devices stopped (off the trio thread, abandoned
    after ``device_stop_seconds``); the server flushes and ends with
    ``response.done``, then the sink drains. A second item raises
    :class:`Interrupted`. Server errors and early closes raise :class:`ClientError`.
    No audio-device call ever runs on the trio thread.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    console = Console(out, err, meter=meter)
    checker = AudioDeltaChecker()
    to_model = StreamResampler(source.sample_rate, INPUT_SAMPLE_RATE)
    to_device = StreamResampler(OUTPUT_SAMPLE_RATE, sink.sample_rate)
    framer = FrameFramer()
    captured_send, captured_recv = trio.open_memory_channel[Samples](64)
    token = trio.lowlevel.current_trio_token()
    commit_requested = trio.Event()
    state = {
        "frames_sent": 0,
        "dropped_blocks": 0,
        "dropped_samples": 0,
        "interrupted": 0,
        "stalls": 0,
        "abandoned": 0,
    }
    levels = {"in": -100.0, "out": -100.0}
    last_block = [trio.current_time()]
    sent_at: dict[int, float] = {}
    round_trips: list[float] = []
    waiting: list[trio.CancelScope] = []
    stopped = {"source": False, "sink": False}

    def accept_block(block: Samples) -> None:  # runs in trio, scheduled by deliver
        if commit_requested.is_set():
            return  # captured after Ctrl-C: not part of the question
        last_block[0] = trio.current_time()
        try:
            captured_send.send_nowait(block)
        except trio.WouldBlock:
            state["dropped_blocks"] += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def deliver(block: Samples) -> None:  # runs on the audio thread: copy and hand over
        data = np.array(block, dtype=np.float32, copy=True)
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(accept_block, data)

    async def send_pcm(conn: RealtimeClient, samples: Samples, *, last: bool = False) -> None:
        pcm = float_to_pcm16(to_model.process(samples, last=last))
        for frame in framer.push(pcm):
            sent_at[state["frames_sent"]] = trio.current_time()
            await conn.append(frame)
            state["frames_sent"] += 1

    async def stop_device(which: str, fn: Callable[[], None]) -> None:
        if stopped[which]:
            return
        stopped[which] = True
        with trio.CancelScope(shield=True):  # bounded by its own timeout
            returned = await device_call(fn, device_stop_seconds)
        if not returned:
            state["abandoned"] += 1
            console.note(
                f"warning: the {'input' if which == 'source' else 'output'} device did not "
                f"stop within {device_stop_seconds:g} s; abandoned it"
            )

    async def capture(conn: RealtimeClient) -> None:
        """Send every whole 80 ms frame as it fills; on commit send the rest and commit,
        then stop the input device."""
        while not commit_requested.is_set():
            with trio.CancelScope() as scope:
                waiting.append(scope)
                try:
                    block = await captured_recv.receive()
                except trio.EndOfChannel:
                    break
                finally:
                    waiting.remove(scope)
            if scope.cancelled_caught:
                break
            mono = to_mono(block)
            levels["in"] = level_dbfs(mono)
            await send_pcm(conn, mono)
        while True:  # audio captured before the interrupt still belongs to the question
            try:
                block = captured_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            await send_pcm(conn, to_mono(block))
        await send_pcm(conn, np.zeros(0, np.float32), last=True)
        partial = framer.flush()
        if partial.size:
            sent_at[state["frames_sent"]] = trio.current_time()
            await conn.append(partial)
            state["frames_sent"] += 1
        await conn.commit()
        console.note("[committed: waiting for the end of the answer]")
        await stop_device("source", source.stop)

    async def watch_input() -> None:
        """Say so when the input device delivers nothing for ``stall_seconds``."""
        stalled = False
        while not commit_requested.is_set():
            await trio.sleep(min(0.1, stall_seconds / 4))
            quiet = trio.current_time() - last_block[0]
            if not stalled and quiet >= stall_seconds:
                stalled = True
                state["stalls"] += 1
                console.note(
                    f"warning: the input device has delivered no audio for {quiet:.1f} s "
                    "(stalled, muted or unplugged?); Ctrl-C commits what was captured"
                )
            elif stalled and quiet < stall_seconds:
                stalled = False
                console.note("input device delivering again")

    async def draw_meter() -> None:
        while True:
            figures = [f"in {_bar(levels['in'])} {levels['in']:4.0f} dB"]
            figures.append(f"out {_bar(levels['out'])}")
            buffer = getattr(sink, "buffer", None)
            if isinstance(buffer, JitterBuffer) and buffer.sample_rate:
                figures.append(
                    f"playback {buffer.latency_seconds() * 1000:3.0f} ms "
                    f"(target {buffer.target_seconds() * 1000:.0f}, "
                    f"{buffer.underruns} underruns)"
                )
            if round_trips:
                figures.append(f"rtt {round_trips[-1] * 1000:.0f} ms")
            console.figures = " | ".join(figures)
            console.draw()
            await trio.sleep(0.2)

    async def watch_interrupts(nursery: trio.Nursery) -> None:
        count = 0
        async for _ in interrupts:
            count += 1
            if count == 1:
                commit_requested.set()
                for scope in list(waiting):
                    scope.cancel()
            else:
                state["interrupted"] = 1
                nursery.cancel_scope.cancel()
                return

    async def quiet_capture(conn: RealtimeClient) -> None:
        with contextlib.suppress(ServerClosed, ServerBusy):  # the receiver reports why
            await capture(conn)

    def on_audio(event: AudioDelta, pcm: PCM16) -> None:
        started = sent_at.pop(event.frame_index, None)
        if started is not None:
            round_trips.append(trio.current_time() - started)
        levels["out"] = level_dbfs(pcm16_to_float(pcm))

    print(ECHO_WARNING, file=err, flush=True)
    done = False
    failure: ClientError | None = None
    async with connect(url, api_key=api_key, origin=origin) as conn:
        with trio.fail_after(event_timeout):
            await conn.configure(system_prompt=system_prompt, seed=seed)
        print("[connected: speak now; Ctrl-C to finish, twice to quit]", file=err, flush=True)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_interrupts, nursery)
                if not await device_call(sink.start, DEVICE_START_SECONDS):
                    raise ClientError("the output device did not start")
                if not await device_call(partial(source.start, deliver), DEVICE_START_SECONDS):
                    raise ClientError("the input device did not start")
                last_block[0] = trio.current_time()
                nursery.start_soon(quiet_capture, conn)
                nursery.start_soon(watch_input)
                if meter:
                    nursery.start_soon(draw_meter)
                try:
                    done = await _receive_until_done(
                        conn, sink, checker, console, to_device, state, event_timeout, on_audio
                    )
                    sink.play(to_device.process(np.zeros(0, np.float32), last=True))
                    sink.finish()
                    with trio.move_on_after(drain_timeout):
                        # The audio thread empties the buffer; polling keeps it lock-only.
                        while sink.pending_seconds() > 0:  # noqa: ASYNC110
                            await trio.sleep(0.02)
                except ClientError as exc:
                    failure = exc
                finally:
                    console.finish()
                nursery.cancel_scope.cancel()
        finally:
            captured_send.close()
            with trio.CancelScope(shield=True):
                await stop_device("source", source.stop)
                await stop_device("sink", sink.stop)
    if state["interrupted"]:
        raise Interrupted
    if failure is not None:
        raise failure
    if state["dropped_blocks"]:
        print(
            f"warning: {state['dropped_blocks']} captured blocks were dropped "
            "(the network could not keep up)",
            file=err,
        )
    buffer = getattr(sink, "buffer", None)
    jitter = buffer if isinstance(buffer, JitterBuffer) else None
    return MicrophoneResult(
        frames_sent=state["frames_sent"],
        audio_frames=checker.frames,
        dropped_samples=state["dropped_samples"],
        texts=dict(console.texts),
        committed=commit_requested.is_set(),
        done=done,
        underruns=jitter.underruns if jitter is not None else 0,
        skipped_samples=jitter.skipped if jitter is not None else 0,
        input_stalls=state["stalls"],
        round_trips=round_trips,
        abandoned_device_calls=state["abandoned"],
    )


async def _receive_until_done(
    conn: RealtimeClient,
    sink: AudioOutput,
    checker: AudioDeltaChecker,
    console: Console,
    to_device: StreamResampler,
    state: dict[str, int],
    event_timeout: float,
    on_audio: Callable[[AudioDelta, PCM16], None],
) -> bool:
    """Play and print events until ``response.done`` (True) or ``response.cancelled``."""
    while True:
        try:
            with trio.fail_after(event_timeout):
                event = await conn.receive()
        except trio.TooSlowError:
            raise ClientError(f"no event from the server for {event_timeout:g} s") from None
        if isinstance(event, AudioDelta):
            pcm = checker.check(event)
            on_audio(event, pcm)
            dropped = sink.play(to_device.process(pcm16_to_float(pcm)))
            if dropped:
                console.note(
                    f"warning: playback buffer full, dropped "
                    f"{dropped / sink.sample_rate:.2f} s of the oldest audio"
                )
                state["dropped_samples"] += dropped
        elif isinstance(event, ResponseDone | ResponseCancelled):
            return isinstance(event, ResponseDone)
        else:
            console.feed(event)


# --- sounddevice implementations of the seams -------------------------------------


class AudioUnavailable(Exception):
    """No PortAudio or no usable device: a one-line message and exit 2."""


def load_sounddevice() -> ModuleType:
    """Import sounddevice, turning a missing PortAudio library into AudioUnavailable."""
    try:
        import sounddevice
    except OSError as exc:  # raised by sounddevice itself when libportaudio is absent
        raise AudioUnavailable(
            f"audio is unavailable: {exc} (install PortAudio, e.g. "
            "'apt-get install libportaudio2' or 'brew install portaudio')"
        ) from None
    except ImportError:
        raise AudioUnavailable(
            "audio is unavailable: the sounddevice package is not installed "
            "(pip install 'realtime[clients]')"
        ) from None
    return cast(ModuleType, sounddevice)


def pick_rate(
    check: Callable[..., None],
    device: Any,
    *,
    requested: int | None,
    preferred: int,
    default: float,
    what: str,
) -> tuple[int, str | None]:
    """The device's rate and, when it is not the one asked for, a notice saying why.

    ``requested`` (a ``--*-rate`` flag) first, then the model's own rate
    (``preferred``), then the device's default; audio is resampled to and from
    the model's rates whichever is used.
    """

    def takes(rate: float) -> bool:
        try:
            check(device=device, samplerate=rate, channels=1, dtype="float32")
            return True
        except Exception:
            return False

    if requested is not None:
        if takes(requested):
            return requested, None
        fallback = preferred if takes(preferred) else int(default)
        return fallback, (
            f"the {what} device does not support {requested} Hz; using {fallback} Hz "
            f"(resampled to and from the model's {preferred} Hz automatically)"
        )
    if takes(preferred):
        return preferred, None
    return int(default), None


def _close_stream(stream: Any) -> None:
    """Stop and close a PortAudio stream; blocks (see :func:`device_call`)."""
    if stream is not None:
        stream.stop()
        stream.close()


class SoundDeviceInput:
    """A PortAudio input stream delivering ~80 ms mono float32 blocks."""

    def __init__(self, sd: ModuleType, device: str | int | None, rate: int | None = None) -> None:
        self._sd = sd
        self._device = device
        info = sd.query_devices(device, "input")
        self._rate, self.notice = pick_rate(
            sd.check_input_settings,
            device,
            requested=rate,
            preferred=INPUT_SAMPLE_RATE,
            default=info["default_samplerate"],
            what="input",
        )
        self.name = str(info["name"])
        self._stream: Any = None

    @property
    def sample_rate(self) -> int:
        return self._rate

    def start(self, deliver: Deliver) -> None:
        def callback(indata: Any, frames: int, time: Any, status: Any) -> None:
            deliver(indata[:, 0])

        self._stream = self._sd.InputStream(
            device=self._device,
            samplerate=self._rate,
            channels=1,
            dtype="float32",
            blocksize=int(self._rate * FRAME_SECONDS),
            callback=callback,
        )
        self._stream.start()

    def stop(self) -> None:
        """Blocks until PortAudio has stopped the stream (forever on some stalled
        devices): the client calls it through :func:`device_call`."""
        stream, self._stream = self._stream, None
        _close_stream(stream)


class BufferedOutput:
    """An :class:`AudioOutput` fed through a :class:`JitterBuffer`; a subclass starts and
    stops whatever pulls from the buffer (a PortAudio callback, a thread in tests)."""

    def __init__(self, sample_rate: int, buffer: JitterBuffer) -> None:
        self._rate = sample_rate
        self.buffer = buffer

    @property
    def sample_rate(self) -> int:
        return self._rate

    def play(self, samples: Samples) -> int:
        return self.buffer.push(samples)

    def finish(self) -> None:
        self.buffer.finish()

    def pending_seconds(self) -> float:
        return self.buffer.buffered / self._rate


class SoundDeviceOutput(BufferedOutput):
    """A PortAudio output stream fed from an adaptive :class:`JitterBuffer`."""

    def __init__(
        self,
        sd: ModuleType,
        device: str | int | None,
        rate: int | None = None,
        *,
        buffer_seconds: float = 3.0,
        prebuffer_seconds: float = 0.16,
    ) -> None:
        self._sd = sd
        self._device = device
        info = sd.query_devices(device, "output")
        chosen, self.notice = pick_rate(
            sd.check_output_settings,
            device,
            requested=rate,
            preferred=OUTPUT_SAMPLE_RATE,
            default=info["default_samplerate"],
            what="output",
        )
        super().__init__(
            chosen,
            JitterBuffer(
                int(buffer_seconds * chosen), int(prebuffer_seconds * chosen), sample_rate=chosen
            ),
        )
        self.name = str(info["name"])
        self._stream: Any = None

    def start(self) -> None:
        def callback(outdata: Any, frames: int, time: Any, status: Any) -> None:
            outdata[:, 0] = self.buffer.pull(frames)

        self._stream = self._sd.OutputStream(
            device=self._device,
            samplerate=self._rate,
            channels=1,
            dtype="float32",
            callback=callback,
        )
        self._stream.start()

    def stop(self) -> None:
        stream, self._stream = self._stream, None
        _close_stream(stream)


def _device_arg(text: str | None) -> str | int | None:
    """Device by index when numeric, else by (a unique part of) its name, as
    sounddevice matches it; ``--list-devices`` shows both."""
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text


def list_devices(sd: ModuleType, out: TextIO) -> None:
    devices = sd.query_devices()
    if len(devices) == 0:
        raise AudioUnavailable("no audio devices found")
    print(devices, file=out)


async def _forward_signals(signals: Any, send: trio.MemorySendChannel[None]) -> None:
    """SIGINT -> an item on the interrupt channel (so Ctrl-C commits, not crashes)."""
    async for _ in signals:
        send.send_nowait(None)


def _rate(text: str) -> int:
    value = int(text)
    if not 8000 <= value <= 384_000:
        raise argparse.ArgumentTypeError("expected a sample rate in Hz (8000..384000)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="voicechat_microphone.py",
        description="Live conversation over /v1/realtime: microphone in, speaker out.",
        epilog=EXIT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", metavar="URL", nargs="?", help="ws://HOST:PORT/v1/realtime")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--origin", default=None, help="send this Origin header (browser-like)")
    p.add_argument("--input-device", default=None, metavar="NAME|INDEX", help="see --list-devices")
    p.add_argument("--output-device", default=None, metavar="NAME|INDEX", help="see --list-devices")
    p.add_argument(
        "--input-rate",
        type=_rate,
        default=None,
        metavar="HZ",
        help="capture rate (default: 16000 when the device takes it, else its own)",
    )
    p.add_argument(
        "--output-rate",
        type=_rate,
        default=None,
        metavar="HZ",
        help="playback rate (default: 22050 when the device takes it, else its own)",
    )
    p.add_argument(
        "--meter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a live level/latency line (default: on when stderr is a terminal)",
    )
    p.add_argument("--list-devices", action="store_true", help="list audio devices and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.list_devices and not args.url:
        parser.error("URL is required (or --list-devices)")
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    try:
        sd = load_sounddevice()
        if args.list_devices:
            list_devices(sd, sys.stdout)
            return 0
        try:
            source = SoundDeviceInput(sd, _device_arg(args.input_device), args.input_rate)
            sink = SoundDeviceOutput(sd, _device_arg(args.output_device), args.output_rate)
        except (ValueError, sd.PortAudioError) as exc:
            raise AudioUnavailable(f"no usable audio device: {exc} (see --list-devices)") from None
    except AudioUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for notice in (source.notice, sink.notice):
        if notice:
            print(f"note: {notice}", file=sys.stderr)
    print(
        f"input: {source.name} at {source.sample_rate} Hz; "
        f"output: {sink.name} at {sink.sample_rate} Hz",
        file=sys.stderr,
    )
    meter = args.meter if args.meter is not None else sys.stderr.isatty()

    async def session() -> MicrophoneResult:
        send, recv = trio.open_memory_channel[None](math.inf)
        failure: Exception | None = None
        result: MicrophoneResult | None = None
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_forward_signals, signals, send)
                try:
                    result = await run_microphone_client(
                        args.url,
                        source,
                        sink,
                        recv,
                        system_prompt=args.system_prompt,
                        seed=args.seed,
                        api_key=args.api_key,
                        origin=args.origin,
                        meter=meter,
                    )
                except (ClientError, Interrupted) as exc:
                    failure = exc  # re-raised outside the nursery: no ExceptionGroup
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        assert result is not None
        return result

    try:
        result = trio.run(session)
    except Interrupted:
        print("\nquit", file=sys.stderr)
        return 130
    except ClientError as exc:
        return report(exc)
    except KeyboardInterrupt:
        return 130
    print(result.summary(sink.sample_rate), file=sys.stderr, flush=True)
    code = 0 if result.done else 1
    if result.abandoned_device_calls:
        # A device call is still blocked inside PortAudio: its atexit teardown
        # (Pa_Terminate) could block as well, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
