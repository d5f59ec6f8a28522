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
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TextIO, cast

import numpy as np
import trio

if importlib.util.find_spec("realtime") is None:  # a script run from an uninstalled checkout
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (
    EXIT_EPILOG,
    EXIT_USAGE,
    FRAME_SECONDS,
    AudioDeltaChecker,
    FrameFramer,
    StreamResampler,
    TranscriptPrinter,
    report,
)

from realtime.audio import float_to_pcm16, pcm16_to_float, to_mono
from realtime.client import (
    AudioDelta,
    ClientError,
    RealtimeClient,
    ResponseCancelled,
    ResponseDone,
    ServerBusy,
    ServerClosed,
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


class JitterBuffer:
    """A bounded FIFO between the network (push) and the audio callback (pull).

    Playback starts once ``prebuffer`` samples are queued and re-waits after an
    underrun, so uneven arrival does not turn into crackle. On overflow the
    oldest audio is dropped: late speech is worse than a skip.
    """

    def __init__(self, capacity: int, prebuffer: int) -> None:
        if capacity <= 0 or not 0 <= prebuffer <= capacity:
            raise ValueError("need capacity > 0 and 0 <= prebuffer <= capacity")
        self.capacity = capacity
        self.prebuffer = prebuffer
        self._chunks: deque[Samples] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._playing = False
        self._finished = False
        self.dropped = 0
        self.underruns = 0
        self.played = 0

    def push(self, samples: Samples) -> int:
        """Append; returns how many of the oldest samples were dropped to make room."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        dropped = 0
        with self._lock:
            if x.size > self.capacity:
                dropped += x.size - self.capacity
                x = x[-self.capacity :]
            self._chunks.append(x)
            self._size += x.size
            while self._size > self.capacity:
                excess = self._size - self.capacity
                head = self._chunks[0]
                if head.size <= excess:
                    self._chunks.popleft()
                    self._size -= head.size
                    dropped += head.size
                else:
                    self._chunks[0] = head[excess:]
                    self._size -= excess
                    dropped += excess
            self.dropped += dropped
        return dropped

    def finish(self) -> None:
        with self._lock:
            self._finished = True

    def pull(self, n: int) -> Samples:
        """Exactly ``n`` samples for the device; silence where there is nothing to play."""
        out = np.zeros(n, dtype=np.float32)
        with self._lock:
            if not self._playing:
                if self._size == 0 or (self._size < self.prebuffer and not self._finished):
                    return out
                self._playing = True
            filled = 0
            while filled < n and self._chunks:
                head = self._chunks[0]
                take = min(n - filled, head.size)
                out[filled : filled + take] = head[:take]
                filled += take
                if take == head.size:
                    self._chunks.popleft()
                else:
                    self._chunks[0] = head[take:]
                self._size -= take
            self.played += filled
            if filled < n:
                self._playing = False
                if not self._finished:
                    self.underruns += 1
        return out

    @property
    def buffered(self) -> int:
        with self._lock:
            return self._size


@dataclass
class MicrophoneResult:
    frames_sent: int
    audio_frames: int
    dropped_samples: int
    texts: dict[str, str]
    committed: bool
    done: bool


class Interrupted(Exception):
    """The second Ctrl-C: stop now."""


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
) -> MicrophoneResult:
    """One live session: capture -> 80 ms appends, deltas -> ``sink``, text -> ``out``.

    The first item on ``interrupts`` commits (no more capture; the server flushes
    and ends with ``response.done``, then the sink drains); a second raises
    :class:`Interrupted`. Server errors and early closes raise :class:`ClientError`.
    """
    err = err if err is not None else sys.stderr
    printer = TranscriptPrinter(out)
    checker = AudioDeltaChecker()
    to_model = StreamResampler(source.sample_rate, INPUT_SAMPLE_RATE)
    to_device = StreamResampler(OUTPUT_SAMPLE_RATE, sink.sample_rate)
    framer = FrameFramer()
    captured_send, captured_recv = trio.open_memory_channel[Samples](64)
    token = trio.lowlevel.current_trio_token()
    commit_requested = trio.Event()
    state = {"frames_sent": 0, "dropped_blocks": 0, "dropped_samples": 0, "interrupted": 0}
    waiting: list[trio.CancelScope] = []

    def accept_block(block: Samples) -> None:  # runs in trio, scheduled by deliver
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
            await conn.append(frame)
            state["frames_sent"] += 1

    async def capture(conn: RealtimeClient) -> None:
        """Send every whole 80 ms frame as it fills; on commit send the rest and commit."""
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
            await send_pcm(conn, to_mono(block))
        source.stop()
        while True:  # audio captured before the interrupt still belongs to the question
            try:
                block = captured_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            await send_pcm(conn, to_mono(block))
        await send_pcm(conn, np.zeros(0, np.float32), last=True)
        partial = framer.flush()
        if partial.size:
            await conn.append(partial)
            state["frames_sent"] += 1
        await conn.commit()
        print("\n[committed: waiting for the end of the answer]", file=err, flush=True)

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

    print(ECHO_WARNING, file=err, flush=True)
    done = False
    failure: ClientError | None = None
    async with connect(url, api_key=api_key, origin=origin) as conn:
        with trio.fail_after(event_timeout):
            await conn.configure(system_prompt=system_prompt, seed=seed)
        print("[connected: speak now; Ctrl-C to finish, twice to quit]", file=err, flush=True)
        sink.start()
        source.start(deliver)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_interrupts, nursery)
                nursery.start_soon(quiet_capture, conn)
                try:
                    done = await _receive_until_done(
                        conn, sink, checker, printer, to_device, err, state, event_timeout
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
                    printer.finish()
                nursery.cancel_scope.cancel()
        finally:
            source.stop()
            sink.stop()
            captured_send.close()
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
    return MicrophoneResult(
        frames_sent=state["frames_sent"],
        audio_frames=checker.frames,
        dropped_samples=state["dropped_samples"],
        texts=dict(printer.texts),
        committed=commit_requested.is_set(),
        done=done,
    )


async def _receive_until_done(
    conn: RealtimeClient,
    sink: AudioOutput,
    checker: AudioDeltaChecker,
    printer: TranscriptPrinter,
    to_device: StreamResampler,
    err: TextIO,
    state: dict[str, int],
    event_timeout: float,
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
            dropped = sink.play(to_device.process(pcm16_to_float(pcm)))
            if dropped:
                printer.finish()
                print(
                    f"warning: playback buffer full, dropped "
                    f"{dropped / sink.sample_rate:.2f} s of the oldest audio",
                    file=err,
                    flush=True,
                )
                state["dropped_samples"] += dropped
        elif isinstance(event, ResponseDone | ResponseCancelled):
            return isinstance(event, ResponseDone)
        else:
            printer.feed(event)


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


def _pick_rate(check: Callable[..., None], device: Any, preferred: int, default: float) -> int:
    """The model's own rate when the device takes it, else the device's default."""
    try:
        check(device=device, samplerate=preferred, channels=1, dtype="float32")
        return preferred
    except Exception:
        return int(default)


class SoundDeviceInput:
    """A PortAudio input stream delivering ~80 ms mono float32 blocks."""

    def __init__(self, sd: ModuleType, device: str | int | None) -> None:
        self._sd = sd
        self._device = device
        info = sd.query_devices(device, "input")
        self._rate = _pick_rate(
            sd.check_input_settings, device, INPUT_SAMPLE_RATE, info["default_samplerate"]
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
        if self._stream is not None:
            self._stream.stop()
            self._stream.close()
            self._stream = None


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
    """A PortAudio output stream fed from a :class:`JitterBuffer`."""

    def __init__(
        self,
        sd: ModuleType,
        device: str | int | None,
        *,
        buffer_seconds: float = 3.0,
        prebuffer_seconds: float = 0.16,
    ) -> None:
        self._sd = sd
        self._device = device
        info = sd.query_devices(device, "output")
        rate = _pick_rate(
            sd.check_output_settings, device, OUTPUT_SAMPLE_RATE, info["default_samplerate"]
        )
        super().__init__(
            rate, JitterBuffer(int(buffer_seconds * rate), int(prebuffer_seconds * rate))
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
        if self._stream is not None:
            self._stream.stop()
            self._stream.close()
            self._stream = None


def _device_arg(text: str | None) -> str | int | None:
    """Device by index when numeric, else by (part of its) name, as sounddevice does."""
    if text is None:
        return None
    return int(text) if text.isdigit() else text


def list_devices(sd: ModuleType, out: TextIO) -> None:
    devices = sd.query_devices()
    if len(devices) == 0:
        raise AudioUnavailable("no audio devices found")
    print(devices, file=out)


async def _forward_signals(signals: Any, send: trio.MemorySendChannel[None]) -> None:
    """SIGINT -> an item on the interrupt channel (so Ctrl-C commits, not crashes)."""
    async for _ in signals:
        send.send_nowait(None)


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
    p.add_argument("--input-device", default=None, metavar="NAME", help="name or index")
    p.add_argument("--output-device", default=None, metavar="NAME", help="name or index")
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
            source = SoundDeviceInput(sd, _device_arg(args.input_device))
            sink = SoundDeviceOutput(sd, _device_arg(args.output_device))
        except (ValueError, sd.PortAudioError) as exc:
            raise AudioUnavailable(f"no usable audio device: {exc}") from None
    except AudioUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"input: {source.name} at {source.sample_rate} Hz; "
        f"output: {sink.name} at {sink.sample_rate} Hz",
        file=sys.stderr,
    )

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
    print(
        f"sent {result.frames_sent} frames; received {result.audio_frames} audio frames",
        file=sys.stderr,
    )
    return 0 if result.done else 1


if __name__ == "__main__":
    sys.exit(main())
