"""``python -m benchmarks.memory``: the model memory each open conversation holds, and its growth.

With ``--max-sessions`` > 1 a server holds several sessions' caches at once, so what one
conversation costs in memory, at its start and per minute it runs, bounds how many fit.
In-process, no server: the checkpoint loaded with ``load_voicechat``, K sessions opened
with ``models.base.open_session`` (conversation k with seed k + 1 and its own audio), then
``--seconds`` of audio pushed to each in turn, one frame per session per round (the
order the engine runs K paced conversations in). MLX's active memory (buffers in use,
``mx.get_active_memory``; the buffer cache, ``mx.get_cache_memory``, is kept apart) is
read after the load, around every open, and every ``--sample-seconds`` of audio.

Reported: what opening a session adds (and takes), the growth per session per minute of
audio (a least-squares slope over the samples after the first, so the first frames'
one-off work buffers do not count as growth; also end minus first sample), the peak,
and what is left once the sessions are cancelled and the cache is cleared.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from benchmarks.common import checkpoint_parser, model_path, write_json
from benchmarks.servers import rss_bytes
from benchmarks.sessions import AUDIO_SEED
from benchmarks.stats import command_line, summarize
from benchmarks.wire import pcm_to_float, test_pcm
from realtime.models.base import open_session

MB: Final = 1e6


def _memory(mx: Any) -> dict[str, float]:
    """MLX's active, cache and peak memory and the process RSS, in MB, with queued
    work finished first (so the figures are what the work left, not what is pending)."""
    mx.synchronize()
    rss = rss_bytes(os.getpid())
    return {
        "active_mb": mx.get_active_memory() / MB,
        "cache_mb": mx.get_cache_memory() / MB,
        "peak_mb": mx.get_peak_memory() / MB,
        "rss_mb": rss / MB if rss is not None else float("nan"),
    }


def _slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of ``y`` against ``x`` (``None`` with fewer than 2 points)."""
    if len(x) < 2 or float(np.ptp(np.asarray(x))) == 0.0:
        return None
    return float(np.polyfit(np.asarray(x), np.asarray(y), 1)[0])


def measure(
    path: Path,
    sessions: int,
    seconds: float,
    sample_seconds: float,
    *,
    batched: bool = False,
    stagger_seconds: float = 0.0,
) -> dict[str, Any]:
    """Open ``sessions`` sessions on the checkpoint at ``path`` and push ``seconds`` of
    audio to each, reading MLX's memory as it goes: in turn, or (``batched``) every
    started session's frame as one batched step; session k starts ``k x
    stagger_seconds`` into the run, so their ages (and caches) differ."""
    import mlx.core as mx

    from realtime.models.voicechat.load import load_voicechat

    model = load_voicechat(path)
    figures = model.figures
    size, rate = figures.frame_samples, figures.input_sample_rate
    frames = max(1, round(seconds * figures.frames_per_second))
    audio = [pcm_to_float(test_pcm(frames * size, seed=AUDIO_SEED + k)) for k in range(sessions)]
    loaded = _memory(mx)
    mx.reset_peak_memory()
    opened: list[Any] = []
    opens: list[dict[str, float]] = []
    for k in range(sessions):
        before = _memory(mx)
        started = time.perf_counter()
        opened.append(
            open_session(model, system_prompt=None, seed=k + 1, max_streaming_seconds=None)
        )
        after = _memory(mx)
        opens.append(
            {
                "ms": (time.perf_counter() - started) * 1e3,
                "active_mb": after["active_mb"] - before["active_mb"],
                "cache_mb": after["cache_mb"] - before["cache_mb"],
                "peak_above_before_mb": after["peak_mb"] - before["active_mb"],
            }
        )
    every = max(1, round(sample_seconds * figures.frames_per_second))
    stagger = round(stagger_seconds * figures.frames_per_second)
    rounds = frames + stagger * (sessions - 1)
    samples = [{"audio_seconds": 0.0, **_memory(mx)}]
    steps: list[float] = []
    for i in range(rounds):
        rows = []
        for k, session in enumerate(opened):
            f = i - k * stagger
            if 0 <= f < frames:
                rows.append((session, audio[k][f * size : (f + 1) * size], rate))
        if batched:
            started = time.perf_counter()
            for result in model.step(rows):
                if isinstance(result, Exception):
                    raise result
            steps.append((time.perf_counter() - started) * 1e3)
        else:
            for session, chunk, _ in rows:
                started = time.perf_counter()
                session.push_audio(chunk, rate)
                steps.append((time.perf_counter() - started) * 1e3)
        if (i + 1) % every == 0 or i + 1 == rounds:
            samples.append({"audio_seconds": (i + 1) * figures.frame_seconds, **_memory(mx)})
            last = samples[-1]
            print(
                f"memory: {last['audio_seconds']:.1f} s of audio x {sessions}: MLX active "
                f"{last['active_mb']:.1f} MB, cache {last['cache_mb']:.1f} MB, "
                f"RSS {last['rss_mb']:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    peak = mx.get_peak_memory() / MB
    while opened:
        opened.pop().cancel()
    session = None  # the push loop's last reference: nothing may keep a session alive
    gc.collect()
    model.clear_cache()
    closed = _memory(mx)

    minutes = [s["audio_seconds"] / 60 for s in samples]
    active = [s["active_mb"] for s in samples]
    fitted = _slope(minutes[1:], active[1:])
    span = minutes[-1] - minutes[1] if len(minutes) > 2 else 0.0
    first_open = opens[0]["active_mb"]
    return {
        "model": str(path),
        "sessions": sessions,
        "batched": batched,
        "stagger_seconds": stagger * figures.frame_seconds,
        "seconds": frames * figures.frame_seconds,
        "frames_per_session": frames,
        "loaded": loaded,
        "opens": opens,
        "open_active_mb_first": first_open,
        "open_active_mb_others_mean": (
            float(np.mean([o["active_mb"] for o in opens[1:]])) if sessions > 1 else None
        ),
        "open_ms_p50": float(np.median([o["ms"] for o in opens])),
        "after_opens_active_mb": samples[0]["active_mb"],
        "first_interval_active_mb": active[1] - active[0] if len(active) > 1 else None,
        "growth_mb_per_session_minute": None if fitted is None else fitted / sessions,
        "end_minus_first_mb_per_session_minute": (
            (active[-1] - active[1]) / sessions / span if span > 0 else None
        ),
        "end_active_mb": active[-1],
        "held_per_session_mb": (active[-1] - loaded["active_mb"]) / sessions,
        "peak_mb": peak,
        "after_close": closed,
        "left_after_close_mb": closed["active_mb"] - loaded["active_mb"],
        "step_ms": summarize(steps).to_dict(),
        "samples": samples,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = checkpoint_parser("benchmarks.memory", __doc__)
    parser.add_argument(
        "--sessions", type=int, default=2, help="sessions open at once (default %(default)s)"
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="audio per session (default %(default)s)"
    )
    parser.add_argument(
        "--sample-seconds",
        type=float,
        default=5.0,
        help="read the memory every this much audio (default %(default)s)",
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="step every started session's frame as one batched step (else in turn)",
    )
    parser.add_argument(
        "--stagger-seconds",
        type=float,
        default=0.0,
        help="session k starts k x this far into the run (unequal ages; default 0)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.sessions < 1 or args.seconds <= 0 or args.sample_seconds <= 0:
        raise SystemExit("--sessions must be >= 1, --seconds and --sample-seconds > 0")
    if args.stagger_seconds < 0:
        raise SystemExit("--stagger-seconds must be >= 0")
    path = model_path(args)
    result = measure(
        path,
        args.sessions,
        args.seconds,
        args.sample_seconds,
        batched=args.batched,
        stagger_seconds=args.stagger_seconds,
    )
    result["command"] = command_line("benchmarks.memory", argv)

    def f(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    loaded = result["loaded"]
    print(
        f"{result['sessions']} session(s) x {result['seconds']:g} s on {path.name}: "
        f"step ms p50 {result['step_ms']['p50']:.1f}\n"
        f"  loaded: MLX active {loaded['active_mb']:.1f} MB (RSS {loaded['rss_mb']:.0f} MB)\n"
        f"  session open: {f(result['open_ms_p50'], 1)} ms p50; active +"
        f"{f(result['open_active_mb_first'])} MB (first), +"
        f"{f(result['open_active_mb_others_mean'])} MB (each later one)\n"
        f"  first {args.sample_seconds:g} s of audio: active +"
        f"{f(result['first_interval_active_mb'])} MB (all sessions)\n"
        f"  growth per session per minute: {f(result['growth_mb_per_session_minute'])} MB "
        f"(fitted), {f(result['end_minus_first_mb_per_session_minute'])} MB (end - first)\n"
        f"  held per session at the end: {f(result['held_per_session_mb'])} MB; peak "
        f"{result['peak_mb']:.1f} MB; left after close + clear_cache: "
        f"{f(result['left_after_close_mb'])} MB"
    )
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
