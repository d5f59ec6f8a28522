"""The WAV file client (examples/voicechat_file_client.py), in-process and as a script."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import trio
import trio_websocket

from realtime.audio import load_input_wav, write_wav_pcm16
from realtime.client import ClientError, ServerBusy
from realtime.client import files as fc
from realtime.client.cli import TranscriptPrinter
from realtime.engine.facade import Engine
from realtime.models.base import VOICECHAT_FIGURES
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import REPO, ServerProcess, connect, running_server, start_realtime_server
from tests.models_fixtures import run_python

SCRIPT = REPO / "examples" / "voicechat_file_client.py"
FRAME_SAMPLES = VOICECHAT_FIGURES.frame_samples
OUTPUT_FRAME_SAMPLES = VOICECHAT_FIGURES.output_frame_samples
OUTPUT_SAMPLE_RATE = VOICECHAT_FIGURES.output_sample_rate


def _tone_wav(path: Path, seconds: float = 1.0, rate: int = 24_000) -> Path:
    """A stereo 24 kHz tone, so the client's resample + downmix path is exercised."""
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    soundfile.write(str(path), np.stack([x, 0.5 * x], axis=1), rate, subtype="PCM_16")
    return path


def _expected_frames(pcm_samples: int) -> int:
    return -(-pcm_samples // FRAME_SAMPLES)  # the partial tail is padded on commit


def _run_script(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return run_python(str(SCRIPT), *args, timeout=timeout)


def _generate_stream(wav: Path, output: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``realtime generate --stream`` on one WAV: the offline bytes a socket run must equal."""
    return run_python(
        "-m",
        "realtime",
        "generate",
        "--stream",
        "--input",
        str(wav),
        "--output",
        str(output),
        *flags,
    )


async def test_file_client_in_process_collects_every_frame(engine: Engine) -> None:
    pcm = (np.random.default_rng(1).standard_normal(5 * FRAME_SAMPLES + 300) * 3000).astype(
        np.int16
    )
    seen: list[str] = []
    out = io.StringIO()
    async with running_server(engine) as server:
        result = await fc.run_file_client(
            server.url,
            pcm,
            system_prompt="Be brief.",
            seed=7,
            on_event=lambda e: seen.append(e["type"]),
            printer=TranscriptPrinter(out),
            max_ahead_seconds=0.2,  # force the flow-control window to engage
        )
    frames = _expected_frames(pcm.size)
    assert result.frames == frames
    assert result.pcm.size == frames * OUTPUT_FRAME_SAMPLES
    assert result.frames_sent == 6
    assert seen[:2] == ["session.created", "session.updated"]
    # The padded last frame: its audio first, then its text and transcript, then done.
    assert seen[-4:] == [
        "response.audio.delta",
        "response.text.delta",
        "conversation.item.input_audio_transcription.delta",
        "response.done",
    ]
    assert "input_audio_buffer.committed" in seen
    assert result.texts["assistant"].startswith("t0 t1 ")
    assert result.texts["user"].startswith("u0 u1 ")
    assert "[assistant] t0 " in out.getvalue() and "[user] u0 " in out.getvalue()
    assert result.model == "fake-voicechat"
    assert result.session_id is not None and result.session_id.startswith("sess_")


async def test_file_client_realtime_pacing_takes_80ms_per_frame(engine: Engine) -> None:
    pcm = np.zeros(4 * FRAME_SAMPLES, dtype=np.int16)
    async with running_server(engine) as server:
        start = trio.current_time()
        result = await fc.run_file_client(server.url, pcm, realtime=True, printer=None)
        elapsed = trio.current_time() - start
    assert result.frames == 4
    # Four appends paced 80 ms apart: the last leaves no earlier than 3 x 80 ms.
    assert elapsed >= 0.24


async def test_file_client_reports_server_error() -> None:
    model = FakeModel(FakeOptions(fail_on_frame=2))
    eng = Engine(lambda: model)
    eng.start()
    try:
        async with running_server(eng) as server:
            with pytest.raises(ClientError, match="server error inference_error"):
                await fc.run_file_client(server.url, np.zeros(8 * FRAME_SAMPLES, np.int16))
    finally:
        eng.shutdown()


async def test_file_client_reports_busy_server(engine: Engine) -> None:
    async with running_server(engine) as server, connect(server.url) as holder:
        await holder.configure()
        with pytest.raises(ServerBusy, match="another session is active"):
            await fc.run_file_client(server.url, np.zeros(FRAME_SAMPLES, np.int16))


async def test_file_client_script_reports_missing_key(engine: Engine, tmp_path: Path) -> None:
    wav = _tone_wav(tmp_path / "in.wav", 0.3)
    async with running_server(engine, api_key="sekrit") as server:
        proc = await trio.run_process(
            [sys.executable, str(SCRIPT), server.url, str(wav), str(tmp_path / "out.wav")],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        ok = await trio.run_process(
            [
                sys.executable,
                str(SCRIPT),
                server.url,
                str(wav),
                str(tmp_path / "ok.wav"),
                "--api-key",
                "sekrit",
                "--extra-seconds",
                "0",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    err = proc.stderr.decode()
    assert proc.returncode == 5, err
    assert "HTTP 401" in err and "--api-key" in err
    assert "Traceback" not in err and "sending" not in err
    assert not (tmp_path / "out.wav").exists()
    assert ok.returncode == 0, ok.stderr.decode()


def test_file_client_usage_errors(tmp_path: Path) -> None:
    missing = _run_script("ws://127.0.0.1:9/v1/realtime", str(tmp_path / "nope.wav"), "o.wav")
    assert missing.returncode == 2
    assert "input file not found" in missing.stderr
    wav = _tone_wav(tmp_path / "in.wav", 0.1)
    bad_seed = _run_script("ws://127.0.0.1:9/v1/realtime", str(wav), "o.wav", "--seed", "-1")
    assert bad_seed.returncode == 2
    refused = _run_script("ws://127.0.0.1:9/v1/realtime", str(wav), str(tmp_path / "o.wav"))
    assert refused.returncode == 3
    assert "cannot connect" in refused.stderr and "Traceback" not in refused.stderr
    http = _run_script("http://127.0.0.1:9/v1/realtime", str(wav), str(tmp_path / "o.wav"))
    assert http.returncode == 4 and "ws:// or wss://" in http.stderr
    assert "exit status" in _run_script("--help").stdout


async def test_file_client_script_exit_codes(engine: Engine, tmp_path: Path) -> None:
    """Each way of not getting a session: one line, its own exit code, before 'sending'."""
    wav = _tone_wav(tmp_path / "in.wav", 0.2)
    out = str(tmp_path / "out.wav")

    async def script(url: str, *extra: str) -> tuple[int, str]:
        proc = await trio.run_process(
            [sys.executable, str(SCRIPT), url, str(wav), out, *extra],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        return proc.returncode, proc.stderr.decode()

    async with running_server(engine, allowed_origins=["https://app.example"]) as server:
        wrong_path = server.url.replace("/v1/realtime", "/v1/nope")
        results = {"wrong path": await script(wrong_path)}
        results["origin"] = await script(server.url, "--origin", "https://evil.example")
        async with connect(server.url) as holder:
            await holder.configure()
            results["busy"] = await script(server.url)
    expected = {
        "wrong path": (4, "the endpoint is ws://HOST:PORT/v1/realtime"),
        "origin": (6, "HTTP 403"),
        "busy": (7, "--retry N"),
    }
    for name, (code, needle) in expected.items():
        rc, err = results[name]
        assert rc == code, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "<html" not in err.lower(), (name, err)
    assert not await trio.Path(out).exists()


@pytest.mark.slow
def test_file_client_round_trip(demo_server: ServerProcess, tmp_path: Path) -> None:
    wav = _tone_wav(tmp_path / "question.wav", 1.0)
    out_wav = tmp_path / "answer.wav"
    events = tmp_path / "events.jsonl"
    proc = _run_script(
        demo_server.url,
        str(wav),
        str(out_wav),
        "--extra-seconds",
        "0.5",
        "--system-prompt",
        "Be concise.",
        "--events",
        str(events),
    )
    assert proc.returncode == 0, proc.stderr
    frames = _expected_frames(load_input_wav(wav, extra_seconds=0.5).size)
    data, rate = soundfile.read(str(out_wav), dtype="int16")
    assert rate == OUTPUT_SAMPLE_RATE
    assert data.shape == (frames * OUTPUT_FRAME_SAMPLES,)
    logged = [json.loads(line) for line in events.read_text().splitlines()]
    audio = [e for e in logged if e["type"] == "response.audio.delta"]
    assert len(audio) == frames
    assert all(e["delta"] == OUTPUT_FRAME_SAMPLES for e in audio)  # payloads as sample counts
    assert [e["frame_index"] for e in audio] == sorted({e["frame_index"] for e in audio})
    assert logged[-1]["type"] == "response.done"
    assert "real-time factor" in proc.stderr


@pytest.mark.slow
def test_stream_cli_equals_socket_bytes(demo_server: ServerProcess, tmp_path: Path) -> None:
    """The acceptance check: WAV through the socket == ``realtime generate --stream``."""
    wav = _tone_wav(tmp_path / "q.wav", 0.8)
    via_socket = tmp_path / "socket.wav"
    offline = tmp_path / "offline.wav"
    common = ["--system-prompt", "One sentence.", "--seed", "3", "--extra-seconds", "0.5"]
    proc = _run_script(demo_server.url, str(wav), str(via_socket), *common)
    assert proc.returncode == 0, proc.stderr
    gen = _generate_stream(wav, offline, *common)
    assert gen.returncode == 0, gen.stderr
    assert via_socket.read_bytes() == offline.read_bytes()


def test_written_wav_is_the_delta_bytes(tmp_path: Path) -> None:
    """PCM16 deltas are written unchanged (no float round trip)."""
    pcm = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    path = tmp_path / "x.wav"
    write_wav_pcm16(path, pcm, OUTPUT_SAMPLE_RATE)
    back, _ = soundfile.read(str(path), dtype="int16")
    assert back.tolist() == pcm.tolist()


async def test_file_client_reports_early_close() -> None:
    """A server that closes (1011) after configuring, without response.done."""

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.send_message(json.dumps({"type": "session.created", "session": {"id": "s"}}))
        await ws.get_message()
        await ws.send_message(json.dumps({"type": "session.updated", "session": {"id": "s"}}))
        await ws.get_message()
        await ws.aclose(1011, "engine died")

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        with pytest.raises(ClientError) as caught:
            await fc.run_file_client(url, np.zeros(3 * FRAME_SAMPLES, np.int16))
        nursery.cancel_scope.cancel()
    message = str(caught.value)
    assert "closed the connection before response.done" in message
    assert "1011" in message and "engine died" in message


@pytest.mark.parametrize("order", ["close-first", "created-then-close", "error-then-close"])
async def test_file_client_busy_race_is_one_line_exit_7(order: str, tmp_path: Path) -> None:
    """A 1013 close may come before, after or instead of session.created and beat the
    client's session.update; each way it is 'busy' (exit 7), one line, before 'sending'."""
    wav = _tone_wav(tmp_path / "in.wav", 0.2)

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        if order == "created-then-close":
            await ws.send_message(json.dumps({"type": "session.created", "session": {"id": "s"}}))
        elif order == "error-then-close":
            error = {"code": "server_busy", "message": "another session is active"}
            await ws.send_message(json.dumps({"type": "error", "event_id": "e", "error": error}))
        await ws.aclose(1013, "busy")

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        for _ in range(3):
            proc = await trio.run_process(
                [sys.executable, str(SCRIPT), url, str(wav), str(tmp_path / "out.wav")],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            err = proc.stderr.decode()
            assert proc.returncode == 7, err
            assert len(err.strip().splitlines()) == 1 and "busy" in err, err
            assert "sending" not in err and "Traceback" not in err
        nursery.cancel_scope.cancel()


def test_file_client_refuses_empty_input(tmp_path: Path) -> None:
    wav = tmp_path / "empty.wav"
    write_wav_pcm16(wav, np.zeros(0, dtype=np.int16), 16_000)
    run = _run_script(
        "ws://127.0.0.1:9/v1/realtime", str(wav), str(tmp_path / "o.wav"), "--extra-seconds", "3"
    )
    assert run.returncode == 2
    assert "is empty" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_concurrent_file_clients_each_equal_generate_stream(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    """Two conversations at once on one ``--max-sessions 2`` server, different seeds,
    prompts and lengths: each WAV is the bytes of ``realtime generate --stream`` alone."""
    runs = [
        (_tone_wav(tmp_path / "a.wav", 0.9), ["--system-prompt", "One sentence.", "--seed", "4"]),
        (_tone_wav(tmp_path / "b.wav", 0.6, rate=16_000), ["--seed", "9"]),
    ]
    # Admission off: the start-up measurement would refuse the second on a slow machine.
    with start_realtime_server(
        "--max-sessions", "2", "--admission-margin", "0", log_dir=tmp_path
    ) as server:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(SCRIPT),
                    server.url,
                    str(wav),
                    str(tmp_path / f"s{i}.wav"),
                    *flags,
                    "--extra-seconds",
                    "0.5",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for i, (wav, flags) in enumerate(runs)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    for i, (wav, flags) in enumerate(runs):
        offline = tmp_path / f"g{i}.wav"
        gen = _generate_stream(wav, offline, *flags, "--extra-seconds", "0.5")
        assert gen.returncode == 0, gen.stderr
        assert (tmp_path / f"s{i}.wav").read_bytes() == offline.read_bytes(), flags


async def test_retrying_busy_waits_as_told_then_gives_up(autojump_clock: object) -> None:
    """Retry-After when the server sent one, else 1, 2, 4 ... s; the last busy raised."""
    from realtime.client import BusyUpgrade
    from realtime.client.cli import retrying_busy

    attempts: list[float] = []

    async def busy_twice() -> str:
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise BusyUpgrade(503, "", "server busy (HTTP 503)", 5.0)
        if len(attempts) == 2:
            raise ServerBusy("server busy: all 2 conversations are in use [code 1013]")
        return "served"

    err = io.StringIO()
    assert await retrying_busy(busy_twice, 3, err) == "served"
    assert [round(b - a, 3) for a, b in itertools.pairwise(attempts)] == [5.0, 2.0]
    assert err.getvalue().count("retrying in") == 2
    attempts.clear()

    async def always_busy() -> str:
        attempts.append(trio.current_time())
        raise ServerBusy("server busy")

    with pytest.raises(ServerBusy):
        await retrying_busy(always_busy, 2, io.StringIO())
    assert len(attempts) == 3


async def test_file_client_retry_waits_for_the_busy_server(tmp_path: Path) -> None:
    """``--retry 5``: refused while another conversation holds the one slot, served once
    it ends, exit 0; without --retry the same client exits 7 at once."""
    wav = _tone_wav(tmp_path / "q.wav", 0.3)
    engine = Engine(lambda: FakeModel())
    engine.start()
    try:
        async with running_server(engine) as server:
            async with connect(server.url) as holder:
                await holder.configure()
                once = await trio.to_thread.run_sync(
                    lambda: _run_script(server.url, str(wav), str(tmp_path / "a.wav"))
                )
                assert once.returncode == 7, once.stderr

                # The holder leaves once the retrying client has been refused (it says
                # so on stderr), however long the script takes to start on a busy machine.
                command = [sys.executable, str(SCRIPT), server.url, str(wav)]
                command += [str(tmp_path / "b.wav"), "--retry", "5"]
                process = await trio.lowlevel.open_process(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO
                )
                assert process.stderr is not None
                said = b""
                with trio.fail_after(60):
                    while b"retrying in" not in said:
                        chunk = await process.stderr.receive_some()
                        assert chunk, said.decode()
                        said += chunk
                    await holder.ws.aclose()
                    async for chunk in process.stderr:
                        said += chunk
                    returncode = await process.wait()
    finally:
        engine.shutdown()
    assert returncode == 0, said.decode()
    assert "retrying in 1 s (1 of 5)" in said.decode()


def test_every_client_flag_has_help() -> None:
    import runpy

    for script in ("voicechat_file_client.py", "voicechat_microphone.py"):
        parser = runpy.run_path(str(REPO / "examples" / script))["build_parser"]()
        for action in parser._actions:
            assert action.help, (parser.prog, action.option_strings or action.dest)


async def test_file_client_waits_for_a_slow_open_within_its_bound(tmp_path: Path) -> None:
    """A server still reading a long system prompt holds session.updated
    back. The client waits for it up to ``open_timeout`` (not ``event_timeout``, which
    raised a raw ``trio.TooSlowError`` after 60 s), and past it says so in one line,
    exit 1, never a traceback."""
    model = FakeModel(FakeOptions(open_delay=1.5))
    eng = Engine(lambda: model)
    eng.start()
    try:
        async with running_server(eng) as server:
            pcm = np.zeros(2 * FRAME_SAMPLES, np.int16)
            with pytest.raises(ClientError, match=r"did not open within 0\.3 s .*--open-timeout"):
                await fc.run_file_client(server.url, pcm, open_timeout=0.3)
            # A wait longer than any event's is fine while the session opens.
            result = await fc.run_file_client(server.url, pcm, event_timeout=0.5)
            assert result.frames == 2 and result.seconds_to_ready >= 1.5
            wav = _tone_wav(tmp_path / "in.wav", 0.2)
            out = str(tmp_path / "out.wav")
            proc = await trio.run_process(
                [sys.executable, str(SCRIPT), server.url, str(wav), out, "--open-timeout", "0.3"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    finally:
        eng.shutdown()
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    (line,) = err.strip().splitlines()
    assert (
        line.startswith("error: the session did not open within 0.3 s") and "Traceback" not in err
    )
    assert not (tmp_path / "out.wav").exists()
    bad = _run_script("ws://127.0.0.1:9/v1/realtime", str(wav), "o.wav", "--open-timeout", "0")
    assert bad.returncode == 2 and "expected seconds > 0" in bad.stderr
