"""``realtime generate``: streamed and offline output WAVs, printed deltas, input errors."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import numpy as np
import pytest

from realtime.audio import float_to_pcm16, load_input_wav, pcm16_to_float, write_wav_pcm16
from realtime.launch.offline import stream_slices
from realtime.models.base import AudioDelta, open_session
from realtime.models.voicechat.model import VoiceChatModel
from tests.models_fixtures import noise, run_realtime, speechlike


@pytest.fixture
def input_wav(tmp_path: Path) -> Path:
    """2.05 s of speech-like sound and noise at 24 kHz stereo (resampled and downmixed)."""
    import soundfile

    mono = np.concatenate([speechlike(13), noise(13, level=0.2)])[: int(2.05 * 16000)]
    from realtime.audio import resample

    x = resample(mono, 16000, 24000)
    path = tmp_path / "in.wav"
    soundfile.write(str(path), np.stack([x, x * 0.5], axis=1), 24000, subtype="PCM_16")
    return path


def _generate(cache: Path, wav: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``realtime generate --input WAV --output OUT ARGS``, as a user runs it."""
    return run_realtime(cache, "generate", "--input", str(wav), "--output", str(out), *args)


def _read(path: Path) -> tuple[np.ndarray, int]:
    import soundfile

    info = soundfile.info(str(path))
    assert info.subtype == "PCM_16" and info.channels == 1
    data, rate = soundfile.read(str(path), dtype="int16")
    return np.asarray(data), int(rate)


def test_generate_stream_writes_wav_and_prints(
    demo_cache_dir: Path, demo_model: VoiceChatModel, input_wav: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.wav"
    flags = ["--stream", "--seed", "3", "--system-prompt", "Be brief.", "--extra-seconds", "1"]
    run = _generate(demo_cache_dir, input_wav, out, *flags, "--profile", "--no-demo-turns")
    assert run.returncode == 0, run.stderr
    pcm, rate = _read(out)
    assert rate == 22050
    frames = -(-len(load_input_wav(input_wav, extra_seconds=1.0)) // 1280)
    assert pcm.shape[0] == frames * 1764
    lines = run.stdout.splitlines()
    assert any(line.startswith("[user] ") for line in lines)
    assert any(line.startswith("[assistant] ") for line in lines)
    assert any(line.startswith("profile: ") for line in lines)
    # As the file client prints it: one growing line per run of a channel, none empty.
    labelled = [line for line in lines if line.startswith("[")]
    labels = [line.split("]", 1)[0] + "]" for line in labelled]
    assert all(a != b for a, b in itertools.pairwise(labels)), labels
    assert all(line.split("] ", 1)[1].strip() for line in labelled), labelled
    assert "demo checkpoint" in run.stderr

    # The exact samples the adapter produces for the server's slices of the same input.
    samples = pcm16_to_float(load_input_wav(input_wav, extra_seconds=1.0))
    session = open_session(
        demo_model, system_prompt="Be brief.", seed=3, max_streaming_seconds=None
    )
    audio = []
    for piece in stream_slices(samples):
        audio += [e.samples for e in session.push_audio(piece, 16000) if isinstance(e, AudioDelta)]
    audio += [e.samples for e in session.flush(True) if isinstance(e, AudioDelta)]
    assert float_to_pcm16(np.concatenate(audio)).tobytes() == pcm.tobytes()


def test_generate_offline_writes_wav(
    demo_cache_dir: Path, demo_path: Path, input_wav: Path, tmp_path: Path
) -> None:
    out = tmp_path / "offline.wav"
    run = _generate(demo_cache_dir, input_wav, out, "-m", str(demo_path), "--extra-seconds", "0.5")
    assert run.returncode == 0, run.stderr
    pcm, rate = _read(out)
    assert rate == 22050 and pcm.shape[0] > 0 and pcm.shape[0] % 1764 == 0
    assert "[assistant]" in run.stdout and "[user]" in run.stdout


def test_generate_max_seconds_stops_with_status_1(
    demo_cache_dir: Path, demo_path: Path, input_wav: Path, tmp_path: Path
) -> None:
    out = tmp_path / "short.wav"
    run = _generate(
        demo_cache_dir, input_wav, out, "-m", str(demo_path), "--stream", "--max-seconds", "0.8"
    )
    assert run.returncode == 1, run.stderr
    assert "context limit" in run.stderr
    pcm, _ = _read(out)
    assert pcm.shape[0] == 10 * 1764


@pytest.mark.parametrize("case", ["missing", "not-audio", "output-folder", "empty"])
def test_generate_bad_input_exits_2(
    case: str, demo_cache_dir: Path, demo_path: Path, tmp_path: Path
) -> None:
    wav = tmp_path / "in.wav"
    out = tmp_path / "out.wav"
    if case == "not-audio":
        wav.write_text("this is not a wav file")
    elif case == "output-folder":
        write_wav_pcm16(wav, np.zeros(1600, dtype=np.int16), 16000)
        out = tmp_path / "missing-folder" / "out.wav"
    elif case == "empty":  # 0 samples: an error even with silence appended
        write_wav_pcm16(wav, np.zeros(0, dtype=np.int16), 16000)
    run = _generate(demo_cache_dir, wav, out, "-m", str(demo_path), "--extra-seconds", "2")
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("realtime: error: ")
    if case == "empty":
        assert "is empty" in run.stderr
