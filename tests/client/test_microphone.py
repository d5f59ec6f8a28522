"""The live client (examples/voicechat_microphone.py) driven through its device seam."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import trio
import trio.testing

from realtime.audio import resample
from realtime.client import (
    AudioDelta,
    ClientError,
    RealtimeClient,
    ResponseDone,
    ServerEvent,
    SessionUpdated,
    TranscriptDelta,
    encode_pcm16,
)
from realtime.client import live as mic
from realtime.client.devices import (
    BufferedOutput,
    SoundDeviceInput,
    SoundDeviceOutput,
    StreamResampler,
    pick_rate,
)
from realtime.client.playback import JitterBuffer
from realtime.engine.facade import Engine
from realtime.models.base import VOICECHAT_FIGURES, Samples
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import REPO, ServerProcess, running_server

SCRIPT = REPO / "examples" / "voicechat_microphone.py"
FRAME_SAMPLES = VOICECHAT_FIGURES.frame_samples
OUTPUT_FRAME_SAMPLES = VOICECHAT_FIGURES.output_frame_samples
OUTPUT_SAMPLE_RATE = VOICECHAT_FIGURES.output_sample_rate


class ArrayInput:
    """A 'microphone' that plays an array from its own thread, like PortAudio does."""

    def __init__(self, audio: Samples, sample_rate: int, block_seconds: float = 0.08) -> None:
        self.audio = audio
        self._rate = sample_rate
        self.block = int(sample_rate * block_seconds)
        self.finished = threading.Event()
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def sample_rate(self) -> int:
        return self._rate

    def start(self, deliver: Callable[[Samples], None]) -> None:
        def run() -> None:
            for i in range(0, len(self.audio), self.block):
                if self.stopped.is_set():
                    return
                deliver(self.audio[i : i + self.block])
                time.sleep(0.002)  # faster than real time, still a separate thread
            self.finished.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()


class ArrayOutput(BufferedOutput):
    """A 'speaker': a real JitterBuffer emptied by a thread at (sped-up) device pace."""

    def __init__(self, sample_rate: int, speed: float = 4.0) -> None:
        super().__init__(
            sample_rate, JitterBuffer(capacity=10 * sample_rate, prebuffer=sample_rate // 10)
        )
        self.pushed: list[Samples] = []
        self.played: list[Samples] = []
        self.speed = speed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        block = self.sample_rate // 100

        def run() -> None:
            while not self._stop.is_set():
                self.played.append(self.buffer.pull(block))
                time.sleep(0.01 / self.speed)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def play(self, samples: Samples) -> int:
        self.pushed.append(np.asarray(samples, np.float32))
        return super().play(samples)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _speech_like(seconds: float, rate: int, channels: int = 2) -> Samples:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.2 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


async def _interrupt_when(
    send: trio.MemorySendChannel[None], ready: threading.Event, times: int = 1
) -> None:
    await trio.to_thread.run_sync(ready.wait, abandon_on_cancel=True)
    for _ in range(times):
        await send.send(None)


async def _drive(
    url: str, source: ArrayInput, sink: ArrayOutput, *, interrupts: int = 1
) -> tuple[mic.MicrophoneResult, str, str]:
    send, recv = trio.open_memory_channel[None](10)
    out, err = io.StringIO(), io.StringIO()
    result: mic.MicrophoneResult | None = None
    quit_: mic.Interrupted | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_interrupt_when, send, source.finished, interrupts)
        try:
            result = await mic.run_microphone_client(
                url, source, sink, recv, system_prompt="Hi.", seed=1, out=out, err=err
            )
        except mic.Interrupted as exc:
            quit_ = exc
        nursery.cancel_scope.cancel()
    if quit_ is not None:
        raise quit_
    assert result is not None
    return result, out.getvalue(), err.getvalue()


async def test_microphone_client_with_fake_devices(engine: Engine, fake_model: FakeModel) -> None:
    """48 kHz stereo 'mic' in, 44.1 kHz 'speaker' out, commit on the first interrupt."""
    source = ArrayInput(_speech_like(1.0, 48_000), 48_000)
    sink = ArrayOutput(44_100)
    async with running_server(engine) as server:
        with trio.fail_after(30):
            result, out, err = await _drive(server.url, source, sink)
    assert result.committed and result.done
    # 1 s at 16 kHz = 12.5 frames: 12 whole appends + 1 padded partial, one answer frame each.
    assert result.frames_sent == 13
    assert result.audio_frames == 13
    assert fake_model.calls_named("flush") == [True]
    pushed = np.concatenate(sink.pushed)
    expected = 13 * OUTPUT_FRAME_SAMPLES * 44_100 / OUTPUT_SAMPLE_RATE
    assert abs(pushed.size - expected) < 64  # resampled 22 050 -> 44 100 Hz
    # The drain played everything that was queued before returning.
    assert sink.buffer.buffered == 0 and sink.buffer.played == pushed.size
    assert sink.buffer.dropped == 0
    # The fake model's audio level follows the input level: non-silent input reached it.
    pushed_frames = fake_model.calls_named("push")
    assert sum(pushed_frames) == 12 * FRAME_SAMPLES + 640
    assert "[assistant] t0 " in out and "[user] u0 " in out
    assert "no echo cancellation" in err and "headphones" in err


async def test_microphone_second_interrupt_quits() -> None:
    model = FakeModel(FakeOptions(frame_delay=0.3))
    eng = Engine(lambda: model)
    eng.start()
    try:
        source = ArrayInput(_speech_like(2.0, 16_000, channels=1), 16_000)
        sink = ArrayOutput(OUTPUT_SAMPLE_RATE)
        async with running_server(eng) as server:
            with trio.fail_after(20), pytest.raises(mic.Interrupted):
                await _drive(server.url, source, sink, interrupts=2)
    finally:
        eng.shutdown()


def test_jitter_buffer_prebuffers_and_counts_underruns() -> None:
    jb = JitterBuffer(capacity=100, prebuffer=30)
    jb.push(np.ones(20, np.float32))
    assert not jb.pull(10).any()  # still below the prebuffer: silence, nothing consumed
    assert jb.buffered == 20
    jb.push(np.full(20, 2.0, np.float32))
    first = jb.pull(30)
    assert first[:20].tolist() == [1.0] * 20 and first[20:].tolist() == [2.0] * 10
    tail = jb.pull(20)
    assert tail[:10].tolist() == [2.0] * 10 and not tail[10:].any()
    assert jb.underruns == 1 and jb.played == 40


def test_jitter_buffer_drops_oldest_on_overflow() -> None:
    jb = JitterBuffer(capacity=10, prebuffer=0)
    assert jb.push(np.arange(6, dtype=np.float32)) == 0
    assert jb.push(np.arange(6, 12, dtype=np.float32)) == 2
    assert jb.pull(10).tolist() == list(range(2, 12))
    assert jb.push(np.arange(15, dtype=np.float32)) == 5
    assert jb.dropped == 7


def test_jitter_buffer_finish_plays_below_prebuffer() -> None:
    jb = JitterBuffer(capacity=100, prebuffer=50)
    jb.push(np.ones(10, np.float32))
    assert not jb.pull(10).any()
    jb.finish()
    assert jb.pull(10).tolist() == [1.0] * 10
    assert jb.underruns == 0


def test_stream_resampler_matches_one_shot_resampling() -> None:
    """80 ms chunks resampled with state == the whole signal resampled at once."""
    x = _speech_like(1.0, 48_000, channels=1)
    stream = StreamResampler(48_000, 16_000)
    chunks = [stream.process(x[i : i + 3840]) for i in range(0, x.size, 3840)]
    chunks.append(stream.process(np.zeros(0, np.float32), last=True))
    chunked = np.concatenate(chunks)
    whole = resample(x, 48_000, 16_000)
    assert abs(chunked.size - whole.size) <= 1
    n = min(chunked.size, whole.size)
    assert np.max(np.abs(chunked[100 : n - 100] - whole[100 : n - 100])) < 1e-3


def _fake_sounddevice(tmp_path: Path, body: str) -> dict[str, str]:
    (tmp_path / "sounddevice.py").write_text(body)
    return {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )


def test_microphone_list_devices_without_portaudio(tmp_path: Path) -> None:
    env = _fake_sounddevice(tmp_path, "raise OSError('PortAudio library not found')\n")
    for args in (["--list-devices"], ["ws://127.0.0.1:9/v1/realtime"]):
        proc = _run(args, env)
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1
        assert "PortAudio library not found" in lines[0] and "install PortAudio" in lines[0]


def test_microphone_without_devices(tmp_path: Path) -> None:
    env = _fake_sounddevice(
        tmp_path,
        "class PortAudioError(Exception): pass\n"
        "def query_devices(device=None, kind=None):\n"
        "    if kind is None: return []\n"
        "    raise PortAudioError('Error querying device -1')\n",
    )
    listed = _run(["--list-devices"], env)
    assert listed.returncode == 2 and "no audio devices found" in listed.stderr
    live = _run(["ws://127.0.0.1:9/v1/realtime"], env)
    assert live.returncode == 2 and "no usable audio device" in live.stderr
    assert "Traceback" not in listed.stderr + live.stderr


def test_microphone_checks_the_url_before_opening_any_device(tmp_path: Path) -> None:
    """A wrong URL is reported (exit 4) even on a machine without PortAudio: the
    devices are never touched."""
    env = _fake_sounddevice(tmp_path, "raise OSError('PortAudio library not found')\n")
    proc = _run(["http://127.0.0.1:8080/v1/realtime"], env)
    assert proc.returncode == 4, proc.stderr
    assert "ws:// or wss://" in proc.stderr and "PortAudio" not in proc.stderr


def test_microphone_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 2 and "URL is required" in proc.stderr


@pytest.mark.slow
async def test_microphone_client_against_demo_server(demo_server: ServerProcess) -> None:
    source = ArrayInput(_speech_like(0.64, 16_000, channels=1), 16_000)
    sink = ArrayOutput(OUTPUT_SAMPLE_RATE, speed=8.0)
    with trio.fail_after(60):
        result, _, _ = await _drive(demo_server.url, source, sink)
    assert result.done and result.frames_sent == 8 and result.audio_frames == 8
    assert sum(p.size for p in sink.pushed) == 8 * OUTPUT_FRAME_SAMPLES


class _FakePortAudio:
    """Stands in for the sounddevice module: streams call back from their own threads."""

    class PortAudioError(Exception):
        pass

    def __init__(self, mic: Samples, rate: int) -> None:
        self.mic = mic
        self.rate = rate
        self.played: list[Samples] = []
        self.opened: list[dict[str, object]] = []

    def query_devices(self, device: object = None, kind: str | None = None) -> object:
        return {"name": f"fake {kind}", "default_samplerate": float(self.rate)}

    def check_input_settings(self, **kwargs: object) -> None:
        if kwargs.get("samplerate") != self.rate:
            raise self.PortAudioError("Invalid sample rate")

    check_output_settings = check_input_settings

    def _stream(self, fake: _FakePortAudio, kind: str, **kwargs: object) -> object:
        fake.opened.append({"kind": kind, **kwargs})
        callback = kwargs["callback"]
        blocksize = int(kwargs.get("blocksize") or 512)  # type: ignore[call-overload]
        stop = threading.Event()

        def run() -> None:
            pos = 0
            while not stop.is_set():
                if kind == "input":
                    block = fake.mic[pos : pos + blocksize]
                    if block.size < blocksize:
                        return
                    pos += blocksize
                    callback(block.reshape(-1, 1), blocksize, None, None)  # type: ignore[operator]
                else:
                    out = np.zeros((blocksize, 1), np.float32)
                    callback(out, blocksize, None, None)  # type: ignore[operator]
                    fake.played.append(out[:, 0].copy())
                time.sleep(0.002)

        class Stream:
            def start(self) -> None:
                self.thread = threading.Thread(target=run, daemon=True)
                self.thread.start()

            def stop(self) -> None:
                stop.set()
                self.thread.join()

            def close(self) -> None:
                pass

        return Stream()

    def InputStream(self, **kwargs: object) -> object:
        return self._stream(self, "input", **kwargs)

    def OutputStream(self, **kwargs: object) -> object:
        return self._stream(self, "output", **kwargs)


async def test_sounddevice_seam_resamples_and_plays(engine: Engine) -> None:
    """The real PortAudio adapters, on a fake PortAudio that only offers 48 kHz."""
    fake = _FakePortAudio(_speech_like(0.5, 48_000, channels=1), 48_000)
    source = SoundDeviceInput(fake, None)  # type: ignore[arg-type]
    sink = SoundDeviceOutput(fake, None)  # type: ignore[arg-type]
    assert source.sample_rate == 48_000 and sink.sample_rate == 48_000  # 16k/22k refused
    send, recv = trio.open_memory_channel[None](1)
    async with running_server(engine) as server:
        async with trio.open_nursery() as nursery:

            async def interrupt_after_capture() -> None:
                while len(fake.opened) < 2:
                    await trio.sleep(0.01)
                await trio.sleep(0.3)  # 0.5 s of mic at ~20x real time has been captured
                await send.send(None)

            nursery.start_soon(interrupt_after_capture)
            with trio.fail_after(30):
                result = await mic.run_microphone_client(
                    server.url, source, sink, recv, out=io.StringIO(), err=io.StringIO()
                )
    assert result.done
    assert [o["kind"] for o in fake.opened] == ["output", "input"]
    assert fake.opened[1]["blocksize"] == 3840  # 80 ms at 48 kHz
    # The fake device delivers whole 80 ms blocks only: 6 of them (0.48 s) -> 6 appends,
    # 6 answer frames played at 48 kHz.
    assert result.frames_sent == 6 and result.audio_frames == 6
    played = np.concatenate(fake.played)
    expected = 6 * OUTPUT_FRAME_SAMPLES * 48_000 / OUTPUT_SAMPLE_RATE
    # Whatever the adaptive buffer left out to catch up (the fake device delivers its
    # input ~20x faster than real time, so the answer lands in a burst) counts too.
    assert abs(int(np.count_nonzero(played)) + sink.buffer.skipped - expected) < 64
    assert sink.buffer.buffered == 0 and sink.buffer.dropped == 0


FAKE_PORTAUDIO_MODULE = """
import threading, time
import numpy as np

class PortAudioError(Exception):
    pass

def query_devices(device=None, kind=None):
    if kind is None:
        return "  0 fake mic, 0 fake speaker"
    return {"name": "fake " + kind, "default_samplerate": 48000.0}

def check_input_settings(**kw):
    if kw.get("samplerate") != 48000:
        raise PortAudioError("Invalid sample rate")

check_output_settings = check_input_settings

class _Stream:
    def __init__(self, kind, callback, blocksize=0, **kw):
        self.kind, self.callback, self.n = kind, callback, blocksize or 480
        self.stopped = threading.Event()
    def start(self):
        threading.Thread(target=self.run, daemon=True).start()
    def run(self):
        t = 0
        while not self.stopped.is_set():
            if self.kind == "input":
                x = 0.2 * np.sin(2 * np.pi * 220 * (t + np.arange(self.n)) / 48000)
                self.callback(x.astype(np.float32).reshape(-1, 1), self.n, None, None)
                t += self.n
            else:
                self.callback(np.zeros((self.n, 1), np.float32), self.n, None, None)
            time.sleep(self.n / 48000)
    def stop(self):
        self.stopped.set()
    def close(self):
        pass

def InputStream(**kw):
    return _Stream("input", **kw)

def OutputStream(**kw):
    return _Stream("output", **kw)
"""


@pytest.mark.parametrize("flags", [(), ("--no-echo-cancellation",)])
async def test_microphone_script_first_ctrl_c_commits(
    engine: Engine, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """The real script and its SIGINT handling, on a fake PortAudio module; echo
    cancellation on by default (LiveKit's SDK is a dev dependency), or off."""
    env = _fake_sounddevice(tmp_path, FAKE_PORTAUDIO_MODULE)
    async with running_server(engine) as server:
        proc = await trio.lowlevel.open_process(
            [sys.executable, str(SCRIPT), server.url, "--system-prompt", "Hi.", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=REPO,
        )
        assert proc.stderr is not None and proc.stdout is not None
        err = b""
        with trio.fail_after(30):
            while b"speak now" not in err:
                err += await proc.stderr.receive_some()
            await trio.sleep(0.5)  # about 6 frames of 'speech'
            proc.send_signal(signal.SIGINT)
            out = b""
            async for chunk in proc.stdout:
                out += chunk
            async for chunk in proc.stderr:
                err += chunk
            code = await proc.wait()
    text = err.decode()
    assert code == 0, text
    assert "committed" in text and "Traceback" not in text
    cancelling = not flags
    assert ("no echo cancellation" in text) is not cancelling and "at 48000 Hz" in text
    assert f"echo cancellation {'on' if cancelling else 'off'}" in text
    sent = int(re.search(r"sent (\d+) frames", text).group(1))  # type: ignore[union-attr]
    received = int(re.search(r"received (\d+) audio frames", text).group(1))  # type: ignore[union-attr]
    assert sent >= 3 and received == sent
    assert "[assistant] t0 " in out.decode()


def test_microphone_script_connection_exit_codes(tmp_path: Path) -> None:
    """Unreachable server and a wrong URL: one error line each, distinct codes, no session."""
    env = _fake_sounddevice(tmp_path, FAKE_PORTAUDIO_MODULE)
    for url, code, needle in (
        ("ws://127.0.0.1:9/v1/realtime", 3, "cannot connect"),
        ("http://127.0.0.1:9/v1/realtime", 4, "ws:// or wss://"),
    ):
        proc = _run([url], env)
        assert proc.returncode == code, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0]
        assert "Traceback" not in proc.stderr and "speak now" not in proc.stderr


# --- the adaptive jitter buffer on scripted delivery (no PortAudio) -----------------

RATE = OUTPUT_SAMPLE_RATE
PULL = 441  # 20 ms device blocks


def _simulate(
    schedule: Callable[[int], int], seconds: float = 12.0
) -> tuple[JitterBuffer, list[tuple[float, float, float]]]:
    """Play ``seconds`` of 20 ms pulls; before pull ``i``, ``schedule(i)`` 80 ms frames
    arrive. Returns the buffer and (time, latency on arrival, target) per arrival."""
    jb = JitterBuffer(3 * RATE, int(0.16 * RATE), sample_rate=RATE)
    seen: list[tuple[float, float, float]] = []
    for i in range(int(seconds * RATE / PULL)):
        frames = schedule(i)
        for _ in range(frames):
            jb.push(np.full(OUTPUT_FRAME_SAMPLES, 0.1, np.float32))
        if frames:
            seen.append((i * PULL / RATE, jb.arrival_latency_seconds(), jb.target_seconds()))
        jb.pull(PULL)
    return jb, seen


def _steady(i: int) -> int:
    return 1 if i % 4 == 0 else 0


def _one_stall(i: int) -> int:
    """Steady, then nothing from 3.0 s to 3.5 s, then the late frames at once."""
    if 150 <= i < 175:
        return 0
    return 7 if i == 175 else _steady(i)


def _bursty(i: int) -> int:
    return 3 if i % 12 == 0 else 0


def test_jitter_buffer_steady_delivery_holds_its_target() -> None:
    jb, seen = _simulate(_steady)
    assert jb.underruns == 0 and jb.skipped == 0 and jb.dropped == 0
    for _, latency, target in seen[5:]:
        assert abs(latency - target) < 0.001 and target == pytest.approx(0.16, abs=0.001)


def test_jitter_buffer_recovers_from_one_stall() -> None:
    """After a stall the late frames land at once; the latency comes back to within
    50 ms of the target within a few seconds, and the target decays back."""
    jb, seen = _simulate(_one_stall)
    assert jb.underruns == 1
    after = [(t, latency, target) for t, latency, target in seen if t >= 3.5]
    assert after[0][1] - after[0][2] > 0.3  # the burst: far above the target
    settled = [abs(latency - target) <= 0.05 for t, latency, target in after if t >= 6.0]
    assert all(settled)
    first_ok = next(t for t, latency, target in after if abs(latency - target) <= 0.05)
    assert first_ok - 3.5 < 3.0, first_ok
    assert jb.target_seconds() == pytest.approx(0.16, abs=0.001)  # decayed to its base
    assert jb.skipped > 0 and jb.dropped == 0
    assert max(latency for _, latency, _ in seen) < 0.7


def test_jitter_buffer_bursty_delivery_does_not_accumulate() -> None:
    jb, seen = _simulate(_bursty)
    assert jb.underruns <= 1
    late = [latency for t, latency, _ in seen if t > 6.0]
    assert max(late) <= 0.16 + 0.05
    assert jb.max_level / RATE < 0.5


def test_jitter_buffer_target_rises_after_underruns_and_is_capped() -> None:
    jb = JitterBuffer(RATE, int(0.1 * RATE), sample_rate=RATE, max_target_seconds=0.3)
    for _ in range(6):
        jb.push(np.ones(int(0.4 * RATE), np.float32))
        while jb.buffered:
            jb.pull(PULL)
        jb.pull(PULL)  # runs dry while playing: an underrun
    assert jb.underruns == 6
    assert jb.target_seconds() == pytest.approx(0.3, abs=0.001)


# --- stalled input, bounded device stop, meter, rates --------------------------------


class StallingInput(ArrayInput):
    """Delivers ``audio`` then nothing, and its stop() never returns: a stalled
    PortAudio input (an unplugged USB microphone)."""

    def __init__(self, audio: Samples, sample_rate: int) -> None:
        super().__init__(audio, sample_rate)
        self.stop_called = threading.Event()
        self._release = threading.Event()

    def stop(self) -> None:
        self.stop_called.set()
        self._release.wait()  # blocks like Pa_StopStream on a stalled device

    def release(self) -> None:
        self._release.set()


async def test_stalled_input_is_reported_and_ctrl_c_still_commits(engine: Engine) -> None:
    source = StallingInput(_speech_like(0.4, 16_000, channels=1), 16_000)
    sink = ArrayOutput(OUTPUT_SAMPLE_RATE)
    send, recv = trio.open_memory_channel[None](1)
    err = io.StringIO()
    try:
        async with running_server(engine) as server, trio.open_nursery() as nursery:

            async def ctrl_c_after_the_stall_warning() -> None:
                while "delivered no audio" not in err.getvalue():
                    await trio.sleep(0.05)
                await send.send(None)

            nursery.start_soon(ctrl_c_after_the_stall_warning)
            started = trio.current_time()
            with trio.fail_after(15):
                result = await mic.run_microphone_client(
                    server.url,
                    source,
                    sink,
                    recv,
                    out=io.StringIO(),
                    err=err,
                    stall_seconds=0.5,
                    device_stop_seconds=0.5,
                )
            elapsed = trio.current_time() - started
    finally:
        source.release()
    text = err.getvalue()
    assert result.done and result.committed and result.input_stalls == 1
    assert result.frames_sent == 5 and result.audio_frames == 5  # 0.4 s: 5 frames
    assert result.abandoned_device_calls == 1 and source.stop_called.is_set()
    assert text.index("committed") < text.index("did not stop within 0.5 s")
    assert elapsed < 8.0


def test_console_meter_line_and_transcript_runs() -> None:
    from realtime.client import TextDelta, TranscriptDelta

    out, err = io.StringIO(), io.StringIO()
    console = mic.Console(out, err, meter=True)
    console.figures = "in ##.. -20 dB"
    console.feed(TranscriptDelta(0, "hel", "hel", {}))
    console.feed(TranscriptDelta(1, "lo", "hello", {}))
    console.draw()
    assert "\r\x1b[K[user] ...hello | in ##.. -20 dB" in err.getvalue()
    console.feed(TextDelta(2, 7, "Hi", "Hi", {}))
    console.finish()
    assert out.getvalue() == "[user] hello\n[assistant] Hi\n"
    assert console.texts["user"] == "hello"


def test_summary_line() -> None:
    result = mic.MicrophoneResult(
        frames_sent=94,
        audio_frames=94,
        dropped_samples=0,
        texts={},
        committed=True,
        done=True,
        underruns=1,
        skipped_samples=2205,
        round_trips=[0.09, 0.1, 0.11, 0.3],
    )
    line = result.summary(22_050)
    assert line.startswith("summary: sent 94 frames; received 94 audio frames; 1 underruns")
    assert "round-trip latency median 110 ms, p95 300 ms" in line and "caught up 100 ms" in line


def test_requested_rate_the_device_refuses_is_resampled_with_a_notice() -> None:
    def only_48k(**kwargs: object) -> None:
        if kwargs["samplerate"] != 48_000:
            raise ValueError("Invalid sample rate")

    rate, notice = pick_rate(
        only_48k, None, requested=44_100, preferred=16_000, default=48_000.0, what="input"
    )
    assert rate == 48_000
    assert notice is not None and "does not support 44100 Hz; using 48000 Hz" in notice
    assert "resampled" in notice
    assert pick_rate(
        only_48k, None, requested=48_000, preferred=16_000, default=48_000.0, what="input"
    ) == (48_000, None)


# --- the session's units, one at a time ---------------------------------------------


def test_session_audio_follows_session_updated() -> None:
    default = mic.SessionAudio()
    assert default == mic.SessionAudio.from_session({})
    assert (default.frame_samples, default.input_rate) == (1280, 16_000)
    assert (default.output_rate, default.output_frame_samples) == (22_050, 1764)
    session = {
        "frame_samples": 320,
        "input_audio_format": {"type": "pcm16", "sample_rate": 8000},
        "output_audio_format": {"type": "pcm16", "sample_rate": 24_000},
    }
    assert mic.SessionAudio.from_session(session) == mic.SessionAudio(320, 8000, 24_000, 960)
    given = mic.SessionAudio.from_session({**session, "output_frame_samples": 1000})
    assert given.output_frame_samples == 1000  # the server's word wins over the arithmetic
    junk = {"frame_samples": True, "input_audio_format": {"sample_rate": "8000"}}
    assert mic.SessionAudio.from_session(junk) == default
    updated = SessionUpdated("sess_1", "m", 320, {"type": "session.updated", "session": session})
    assert mic.SessionAudio.from_updated(updated).input_rate == 8000


def test_round_trips_pair_frames_by_index() -> None:
    trips = mic.RoundTrips()
    trips.sent(0, 10.0)
    trips.sent(1, 10.08)
    trips.answered(1, 10.3)
    trips.answered(1, 10.4)  # answered once only
    trips.answered(7, 10.5)  # never sent
    assert trips.seconds == [pytest.approx(0.22)]


def test_stall_watch_reports_a_stall_once_and_the_recovery() -> None:
    watch = mic.StallWatch(1.0)
    assert watch.observe(0.5) is None
    first = watch.observe(1.2)
    assert first is not None and "no audio for 1.2 s" in first
    assert watch.observe(3.0) is None  # still the same stall
    assert watch.observe(0.1) == "input device delivering again"
    assert watch.observe(0.2) is None
    assert watch.stalls == 1


def test_meter_figures_line() -> None:
    trips = mic.RoundTrips()
    jitter = JitterBuffer(RATE, int(0.16 * RATE), sample_rate=RATE)
    meter = mic.Meter(jitter, trips)
    meter.input_db, meter.output_db = -30.0, -100.0
    assert meter.figures() == (
        "in #####.....  -30 dB | out .......... | playback   0 ms (target 160, 0 underruns)"
    )
    trips.sent(0, 0.0)
    trips.answered(0, 0.125)
    assert mic.Meter(None, trips).figures().endswith("| rtt 125 ms")


async def test_stop_control_first_interrupt_commits_second_quits() -> None:
    stop = mic.StopControl()
    send, recv = trio.open_memory_channel[None](2)
    never: trio.MemoryReceiveChannel[int]
    _, never = trio.open_memory_channel[int](0)
    async with trio.open_nursery() as nursery:
        quit_scope = trio.CancelScope()

        async def watch() -> None:
            with quit_scope:
                await stop.watch(recv, quit_scope)

        nursery.start_soon(watch)
        send.send_nowait(None)
        with trio.fail_after(5):
            assert await stop.until_commit(never.receive) is None  # woken by the commit
        assert stop.committing and not stop.interrupted
        send.send_nowait(None)
    assert stop.interrupted and quit_scope.cancel_called


async def test_capture_queue_hands_over_and_refuses_after_the_commit() -> None:
    stop = mic.StopControl()
    queue = mic.CaptureQueue(stop, size=1)
    thread = threading.Thread(target=queue.deliver, args=(np.ones(4, np.float32),))
    thread.start()
    thread.join()
    with trio.fail_after(5):
        block = await queue.receive()
    assert block is not None and block.tolist() == [1.0] * 4
    queue.deliver(np.zeros(2, np.float32))
    queue.deliver(np.zeros(3, np.float32))  # the queue holds one: this one is dropped
    await trio.testing.wait_all_tasks_blocked()
    assert queue.dropped_blocks == 1
    stop.commit()
    queue.deliver(np.zeros(5, np.float32))  # after Ctrl-C: not part of the question
    await trio.testing.wait_all_tasks_blocked()
    assert [b.size for b in queue.leftovers()] == [2]
    queue.close()
    assert await queue.receive() is None


class _RecordingConnection:
    """What the uplink and downlink see of a RealtimeClient."""

    def __init__(self, events: list[ServerEvent] | None = None) -> None:
        self.appends: list[Samples] = []
        self.commits = 0
        self._events = list(events or [])

    async def append(self, pcm: Samples) -> None:
        self.appends.append(pcm)

    async def commit(self) -> None:
        self.commits += 1

    async def receive(self) -> ServerEvent:
        return self._events.pop(0)


class _ListOutput:
    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.played: list[Samples] = []
        self.finished = False

    def start(self) -> None:
        pass

    def play(self, samples: Samples) -> int:
        self.played.append(samples)
        return 0

    def finish(self) -> None:
        self.finished = True

    def pending_seconds(self) -> float:
        return 0.0

    def stop(self) -> None:
        pass


async def test_uplink_frames_at_the_session_rate_and_frame() -> None:
    conn = _RecordingConnection()
    trips = mic.RoundTrips()
    audio = mic.SessionAudio(320, 8000, 24_000, 960)
    uplink = mic.Uplink(cast(RealtimeClient, conn), 16_000, audio, trips)
    await uplink.send(_speech_like(1.0, 16_000, channels=1))
    await uplink.commit()
    sizes = [a.size for a in conn.appends]
    assert sizes[:-1] == [320] * (len(sizes) - 1) and 0 < sizes[-1] <= 320
    assert abs(sum(sizes) - 8000) <= 16  # 1 s resampled to 8 kHz
    assert uplink.frames_sent == len(sizes) and conn.commits == 1
    trips.answered(len(sizes) - 1, trio.current_time())
    assert len(trips.seconds) == 1  # every append was stamped by its index


def _delta(index: int, samples: int, rate: int) -> AudioDelta:
    pcm = np.full(samples, 1000, np.int16)
    raw = {"type": "response.audio.delta", "frame_index": index, "sample_rate": rate}
    return AudioDelta(index, encode_pcm16(pcm), raw)


async def test_downlink_plays_what_the_session_announced() -> None:
    audio = mic.SessionAudio(320, 8000, 24_000, 960)
    console = mic.Console(io.StringIO(), io.StringIO(), meter=False)
    events: list[ServerEvent] = [
        _delta(0, 960, 24_000),
        TranscriptDelta(0, "hi", "hi", {}),
        _delta(1, 960, 24_000),
        ResponseDone(2, {}),
    ]
    sink = _ListOutput(48_000)
    meter = mic.Meter(None, mic.RoundTrips())
    conn = cast(RealtimeClient, _RecordingConnection(events))
    downlink = mic.Downlink(conn, sink, audio, console, meter, mic.RoundTrips(), 5.0)
    assert await downlink.until_done() is True
    await downlink.drain(1.0)
    assert downlink.checker.frames == 2 and sink.finished
    assert abs(sum(p.size for p in sink.played) - 2 * 960 * 2) < 64  # 24 -> 48 kHz
    assert meter.output_db > -40 and console.texts["user"] == "hi"
    wrong = cast(RealtimeClient, _RecordingConnection([_delta(0, 1764, 22_050)]))
    with pytest.raises(ClientError, match="1764 samples, expected 960"):
        await mic.Downlink(wrong, sink, audio, console, meter, mic.RoundTrips(), 5.0).until_done()


async def test_microphone_client_bounds_the_wait_for_a_slow_open() -> None:
    """A session that does not open within ``open_timeout`` (the server still reads its
    prompt): a ClientError that says so, before any audio is captured."""
    model = FakeModel(FakeOptions(open_delay=1.5))
    eng = Engine(lambda: model)
    eng.start()
    try:
        source = ArrayInput(_speech_like(0.5, 16_000, channels=1), 16_000)
        sink = ArrayOutput(OUTPUT_SAMPLE_RATE)
        send, recv = trio.open_memory_channel[None](1)
        async with running_server(eng) as server:
            with trio.fail_after(20), pytest.raises(ClientError, match=r"within 0\.3 s"):
                await mic.run_microphone_client(
                    server.url, source, sink, recv, open_timeout=0.3, err=io.StringIO()
                )
        del send
    finally:
        eng.shutdown()
