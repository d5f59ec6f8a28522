"""Sound devices for a live client: PortAudio through sounddevice, behind two small
seams (:class:`AudioInput`, :class:`AudioOutput`) so a session can be driven with
numpy arrays instead of a sound card.

PortAudio calls the callbacks on its own threads; they only copy data and hand it
on (input) or read a lock-guarded buffer (output), so they never block on the
network or an event loop. Every blocking device call (start, stop) runs off the trio
thread through :func:`device_call`, bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, Protocol, TextIO, cast

import numpy as np
import trio

from realtime.client.playback import JitterBuffer
from realtime.models.base import VOICECHAT_FIGURES, Samples

FRAME_SECONDS: Final = VOICECHAT_FIGURES.frame_seconds
"""The capture block: VoiceChat's 80 ms step (devices open before there is a session)."""


Deliver = Callable[[Samples], None]
"""Called by an input with each captured block, (frames,) or (frames, channels), on
any thread; it must return at once."""


class EchoPath(Protocol):
    """What the devices tell an echo canceller (:class:`realtime.client.echo.EchoCanceller`):
    what the speaker plays, what the microphone heard, and their latencies."""

    output_latency: float
    input_latency: float

    def played(self, samples: Samples, rate: int) -> None: ...

    def clean(self, block: Samples) -> Samples: ...


ECHO_BLOCK_SECONDS: Final = 0.01
"""The output callback's block while a canceller listens: the far end every 10 ms."""


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


PREFERRED_RATES: Final = {
    "input": VOICECHAT_FIGURES.input_sample_rate,
    "output": VOICECHAT_FIGURES.output_sample_rate,
}
"""VoiceChat's rates, asked of a device first. The devices open before there is a
session, so this is only a preference: audio is resampled to and from whatever rates
``session.updated`` states."""


def _choose_rate(
    sd: ModuleType, device: str | int | None, kind: str, requested: int | None
) -> tuple[int, str | None, str]:
    """The ``kind`` ("input" or "output") device's rate, its notice and its name."""
    info = sd.query_devices(device, kind)
    rate, notice = pick_rate(
        sd.check_input_settings if kind == "input" else sd.check_output_settings,
        device,
        requested=requested,
        preferred=PREFERRED_RATES[kind],
        default=info["default_samplerate"],
        what=kind,
    )
    return rate, notice, str(info["name"])


def _close_stream(stream: Any) -> None:
    """Stop and close a PortAudio stream; blocks (see :func:`device_call`)."""
    if stream is not None:
        stream.stop()
        stream.close()


def _mono_stream(
    kind: Callable[..., Any],
    device: str | int | None,
    rate: int,
    blocksize: int,
    echo: object | None,
    callback: Callable[..., None],
) -> Any:
    """An unstarted mono float32 PortAudio stream (``sd.InputStream`` or ``OutputStream``):
    high latency for steady playback, low while an echo canceller needs both ends in step."""
    return kind(
        device=device,
        samplerate=rate,
        channels=1,
        dtype="float32",
        blocksize=blocksize,
        latency="high" if echo is None else "low",
        callback=callback,
    )


class SoundDeviceInput:
    """A PortAudio input stream delivering ~80 ms mono float32 blocks."""

    def __init__(self, sd: ModuleType, device: str | int | None, rate: int | None = None) -> None:
        self._sd = sd
        self._device = device
        self._rate, self.notice, self.name = _choose_rate(sd, device, "input", rate)
        self._stream: Any = None
        self.echo: EchoPath | None = None
        """Cleans each block of the speaker's echo before it is delivered, when set."""

    @property
    def sample_rate(self) -> int:
        return self._rate

    def start(self, deliver: Deliver) -> None:
        echo = self.echo

        def callback(indata: Any, frames: int, time: Any, status: Any) -> None:
            deliver(indata[:, 0] if echo is None else echo.clean(indata[:, 0]))

        self._stream = _mono_stream(
            self._sd.InputStream,
            self._device,
            self._rate,
            int(self._rate * FRAME_SECONDS),
            echo,
            callback,
        )
        if echo is not None:
            echo.input_latency = float(getattr(self._stream, "latency", 0.0))
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
        chosen, self.notice, self.name = _choose_rate(sd, device, "output", rate)
        super().__init__(
            chosen,
            JitterBuffer(
                int(buffer_seconds * chosen), int(prebuffer_seconds * chosen), sample_rate=chosen
            ),
        )
        self._stream: Any = None
        self.echo: EchoPath | None = None
        """Told what is played, 10 ms a callback, when set."""

    def start(self) -> None:
        echo, rate = self.echo, self._rate

        def callback(outdata: Any, frames: int, time: Any, status: Any) -> None:
            samples = self.buffer.pull(frames)
            outdata[:, 0] = samples
            if echo is not None:
                echo.played(samples, rate)

        blocksize = 0 if echo is None else int(self._rate * ECHO_BLOCK_SECONDS)
        self._stream = _mono_stream(
            self._sd.OutputStream, self._device, self._rate, blocksize, echo, callback
        )
        if echo is not None:
            echo.output_latency = float(getattr(self._stream, "latency", 0.0))
        self._stream.start()

    def stop(self) -> None:
        stream, self._stream = self._stream, None
        _close_stream(stream)


def device_arg(text: str | None) -> str | int | None:
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


class StreamResampler:
    """Chunk-by-chunk resampling without clicks at chunk edges.

    ``realtime.audio.resample`` resamples a whole signal at once; a live stream
    arrives in 80 ms pieces and resampling each piece alone would put an edge
    artefact every 80 ms, so this keeps soxr's filter state between chunks.
    """

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream: Any = None
        if from_rate != to_rate:
            import soxr

            self._stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32")

    def process(self, samples: Samples, *, last: bool = False) -> Samples:
        x = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return x
        out = self._stream.resample_chunk(x, last=last)
        return np.asarray(out, dtype=np.float32)
