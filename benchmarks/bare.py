"""Row 1: the model alone, no server, with the engine's thread discipline.

Both the load and every step run on one dedicated thread (MLX ties streams to
their thread), and the clock is read on that thread around each call, so the
figure is the model's own step time and nothing else. It is measured twice:
back to back (the unpaced ceiling) and paced at one frame per 80 ms, because a
model that idles between frames steps slower (cold caches, sleeping cores),
and the paced row's overhead must be measured against the same regime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.stats import summarize
from benchmarks.wire import Float32
from realtime.models.base import ModelFigures, open_session

WARMUP_FRAMES = 10


def _time_pushes(
    push: Callable[[Float32], object], frames: list[Float32], period: float = 0.0
) -> list[float]:
    """Step time of each push; with ``period``, frames start that far apart (a paced
    client), so the model idles between frames as it does behind a real-time stream."""
    times: list[float] = []
    origin = time.perf_counter()
    for i, frame in enumerate(frames):
        if period:
            delay = origin + i * period - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        started = time.perf_counter()
        push(frame)
        times.append(time.perf_counter() - started)
    return times


_Run = Callable[..., tuple[list[float], float]]


def _session_run(
    open_session: Callable[[], Any],
    clear_cache: Callable[[], None],
    rate: int,
    chunks: list[Float32],
    period: float = 0.0,
) -> tuple[list[float], float]:
    """``chunks`` through one fresh session: each step's time and the wall time of
    all. The session is then cancelled and the cache cleared, so no run inherits
    another's state."""
    session = open_session()
    started = time.perf_counter()
    times = _time_pushes(lambda f: session.push_audio(f, sample_rate=rate), chunks, period)
    wall = time.perf_counter() - started
    session.cancel()
    clear_cache()
    return times, wall


def _step_ms(times: list[float]) -> dict[str, Any]:
    return summarize([t * 1e3 for t in times]).to_dict()


def _unpaced(run: _Run, frames: list[Float32], warmup: list[Float32]) -> dict[str, Any]:
    """Back-to-back step times and frames per second, after a warm-up run."""
    run(warmup)
    times, wall = run(frames)
    return {"step_ms": _step_ms(times), "fps": len(frames) / wall}


def _raw(
    path: Path, frames: list[Float32], warmup: list[Float32], figures: ModelFigures
) -> dict[str, Any]:
    """mlx-vlm's own streaming session, exactly as its server drives it."""
    import mlx.core as mx
    from mlx_vlm.utils import load

    model, processor = load(str(path), lazy=True, strict=True, trust_remote_code=False)
    chat = model.create_session(processor)
    run = partial(
        _session_run,
        lambda: chat.create_streaming_session(system_prompt=None, seed=0),
        mx.clear_cache,
        figures.input_sample_rate,
    )
    unpaced = _unpaced(run, frames, warmup)
    paced, _ = run(frames, figures.frame_seconds)
    return {"frames": len(frames), **unpaced, "paced_step_ms": _step_ms(paced)}


def _adapter(path: Path, frames: list[Float32], warmup: list[Float32]) -> dict[str, Any]:
    """The same frames through this project's adapter (the seam the engine drives):
    its extra cost is turning MLX events into numpy and Python values."""
    from realtime.models import load_model

    model = load_model(path)
    run = partial(
        _session_run,
        lambda: open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None),
        model.clear_cache,
        model.figures.input_sample_rate,
    )
    return _unpaced(run, frames, warmup)


def _measure(
    path: Path, frames: list[Float32], warmup: list[Float32], figures: ModelFigures
) -> dict[str, Any]:
    import mlx.core as mx  # here, not at import: --cpu-blas must come before MLX loads

    result = _raw(path, frames, warmup, figures)
    mx.clear_cache()
    result["adapter"] = _adapter(path, frames, warmup)
    return result


def bare_model(path: Path, audio: Float32, frames: int, figures: ModelFigures) -> dict[str, Any]:
    """Step ``frames`` frames of ``audio`` (cut by the checkpoint's ``figures``) on one
    dedicated thread."""
    size = figures.frame_samples
    chunks = [audio[i * size : (i + 1) * size] for i in range(frames)]
    warmup = chunks[: min(WARMUP_FRAMES, frames)]
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = _measure(path, chunks, warmup, figures)
        except BaseException as exc:  # reported on the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="bench-model", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    result: dict[str, Any] = box["result"]
    return result
