"""``python -m benchmarks.batching``: the frame step itself, ours against mlx-vlm's, and batched.

In-process, no server, one thread: the checkpoint loaded once (``load_voicechat``), then
in every round, one after another in an order that alternates between rounds:

* ``mlx-vlm``: mlx-vlm's own ``VoiceChatStreamingSession.push_audio``, one conversation;
* ``ours B=1``: the same conversation (seed, prompt, audio) through this project's frame
  step (``VoiceChatModel.step`` with one row);
* ``ours B=n`` for each ``--batch`` size: n conversations (their own seeds and audio)
  stepped as one batch every frame.

Each variant opens fresh sessions, runs ``--warmup`` frames, then times ``--frames``
frames (each step read around the call). Reported per variant: the median over rounds
of each round's median step (ms per batch), the spread (min-max over rounds), the ms
per conversation-frame (step / B), conversation-frames per second, and how many
conversations would keep real time (``frame time / per-conversation-frame``, floored)
if every frame ran in one batch; plus ``ours B=1 / mlx-vlm``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import checkpoint_parser, model_path, write_json
from benchmarks.sessions import AUDIO_SEED
from benchmarks.stats import command_line, machine
from benchmarks.wire import pcm_to_float, test_pcm
from realtime.models.base import ModelSession, open_session


def _audio(frames: int, size: int, seed: int) -> list[np.ndarray]:
    samples = pcm_to_float(test_pcm(frames * size, seed=seed))
    return [samples[i * size : (i + 1) * size] for i in range(frames)]


def _timed(step: Callable[[int], object], warmup: int, frames: int) -> float:
    """The median step time (s) of ``frames`` steps after ``warmup`` untimed ones."""
    for i in range(warmup):
        step(i)
    times = []
    for i in range(warmup, warmup + frames):
        started = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - started)
    return float(statistics.median(times))


def _mlx_vlm(model: Any, warmup: int, frames: int) -> float:
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.models.voicechat.fused import unfused

    rate = model.figures.input_sample_rate
    audio = _audio(warmup + frames, model.figures.frame_samples, AUDIO_SEED)
    session = VoiceChatStreamingSession(model.runtime, system_prompt=None, seed=0)

    def push(i: int) -> object:
        with unfused():  # mlx-vlm's own graph, without this project's fused modules
            return session.push_audio(audio[i], sample_rate=rate)

    try:
        return _timed(push, warmup, frames)
    finally:
        session.cancel()
        model.clear_cache()


def _ours(model: Any, batch: int, warmup: int, frames: int) -> float:
    rate = model.figures.input_sample_rate
    size = model.figures.frame_samples
    audio = [_audio(warmup + frames, size, AUDIO_SEED + k) for k in range(batch)]
    sessions: list[ModelSession] = [
        open_session(model, system_prompt=None, seed=k, max_streaming_seconds=None)
        for k in range(batch)
    ]

    def step(i: int) -> None:
        results = model.step([(s, audio[k][i], rate) for k, s in enumerate(sessions)])
        for result in results:
            if isinstance(result, Exception):
                raise result

    try:
        return _timed(step, warmup, frames)
    finally:
        for session in sessions:
            session.cancel()
        model.clear_cache()


def measure(
    path: Path, batches: Sequence[int], rounds: int, warmup: int, frames: int
) -> dict[str, Any]:
    from realtime.models import load_model

    model = load_model(path)
    frame_ms = model.figures.frame_ms
    variants: list[tuple[str, Callable[[], float]]] = [
        ("mlx-vlm", lambda: _mlx_vlm(model, warmup, frames)),
        *[
            (f"ours B={b}", (lambda b=b: _ours(model, b, warmup, frames)))
            for b in sorted({1, *batches})
        ],
    ]
    seen: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for name, run in order:
            seen[name].append(run() * 1e3)
            print(f"round {r + 1}/{rounds} {name}: {seen[name][-1]:.1f} ms", file=sys.stderr)
    rows: dict[str, Any] = {}
    for name, values in seen.items():
        batch = 1 if name == "mlx-vlm" else int(name.partition("=")[2])
        step = float(statistics.median(values))
        per = step / batch
        rows[name] = {
            "batch": batch,
            "step_ms_median": step,
            "step_ms_rounds": values,
            "spread_ms": [min(values), max(values)],
            "ms_per_conversation_frame": per,
            "conversation_frames_per_s": 1000.0 / per,
            "realtime_conversations_if_batched": int(frame_ms // step) * batch
            if step <= frame_ms
            else 0,
        }
    ratio = rows["ours B=1"]["step_ms_median"] / rows["mlx-vlm"]["step_ms_median"]
    ratios = [o / m for o, m in zip(seen["ours B=1"], seen["mlx-vlm"], strict=True)]
    return {
        "model": path.name,
        "frame_ms": frame_ms,
        "rounds": rounds,
        "warmup": warmup,
        "frames": frames,
        "variants": rows,
        "ours_b1_over_mlx_vlm": ratio,
        "ours_b1_over_mlx_vlm_rounds": ratios,
        "machine": machine(),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = checkpoint_parser("benchmarks.batching", __doc__)
    parser.add_argument(
        "--batch",
        type=lambda text: [int(b) for b in text.split(",")],
        default=[1, 2, 4, 8, 16],
        help="batch sizes (default 1,2,4,8,16)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed frames (default 5)")
    parser.add_argument("--frames", type=int, default=20, help="timed frames (default 20)")
    parser.add_argument(
        "--cpu-blas",
        metavar="bundled|openblas|PATH",
        help="the CBLAS MLX's Linux CPU backend multiplies with, as realtime serve's "
        "--cpu-blas (default bundled; one per process, so compare BLASes run by run)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from realtime.cpu_blas import install_from
    from realtime.errors import UsageError

    args = build_parser().parse_args(argv)
    if args.rounds < 1 or args.frames < 1 or args.warmup < 0 or min(args.batch) < 1:
        raise SystemExit("--rounds, --frames and --batch must be >= 1, --warmup >= 0")
    try:
        blas = install_from(args.cpu_blas)
    except UsageError as exc:
        raise SystemExit(str(exc)) from None
    path = model_path(args)
    result = measure(path, args.batch, args.rounds, args.warmup, args.frames)
    result["command"] = command_line("benchmarks.batching", argv)
    result["cpu_blas"] = blas.describe()
    print(
        f"{path.name}, CPU BLAS {blas.describe()}, {args.rounds} alternating rounds, "
        "medians (spread over rounds):"
    )
    for name, row in result["variants"].items():
        low, high = row["spread_ms"]
        print(
            f"  {name:10s} step {row['step_ms_median']:7.1f} ms ({low:.1f}-{high:.1f})  "
            f"{row['ms_per_conversation_frame']:6.1f} ms/conversation-frame  "
            f"{row['conversation_frames_per_s']:6.1f} conversation-frames/s  "
            f"real time if batched: {row['realtime_conversations_if_batched']}"
        )
    print(f"  ours B=1 / mlx-vlm: {result['ours_b1_over_mlx_vlm']:.3f}")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
