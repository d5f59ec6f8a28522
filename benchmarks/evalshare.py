"""``python -m benchmarks.evalshare``: how much of a frame step is MLX evaluation.

A step is Python graph building (holding the GIL) plus evaluation in MLX's native
code (which releases it). mlx-vlm's streaming step evaluates through ``mx.eval``
and through ``int(mx.argmax(...))``; both are wrapped here to time the
evaluation they trigger, on the one thread that steps the model, so
``eval share = evaluation time / step time``. mlx-vlm's own per-stage profile
(``profile=True``) is reported too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import model_path, write_json
from benchmarks.wire import test_pcm


def measure(path: Path, frames: int, warmup: int = 10) -> dict[str, Any]:
    import mlx.core as mx

    from realtime.models.base import open_now
    from realtime.models.voicechat.load import load_voicechat
    from realtime.models.voicechat.reference import ReferenceSession

    model = load_voicechat(path)
    size, rate = model.figures.frame_samples, model.figures.input_sample_rate
    opening = model.begin_session(
        system_prompt=None, seed=0, max_streaming_seconds=None, profile=True
    )
    session = open_now(opening)
    assert isinstance(session, ReferenceSession)
    evaluating = [0.0]
    original_eval, original_argmax = mx.eval, mx.argmax

    def timed_eval(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original_eval(*args, **kwargs)
        finally:
            evaluating[0] += time.perf_counter() - started

    def timed_argmax(*args: Any, **kwargs: Any) -> Any:
        result = original_argmax(*args, **kwargs)
        timed_eval(result)  # what int(...) on it would evaluate
        return result

    audio = test_pcm((frames + warmup) * size, seed=5).astype(np.float32) / 32768.0
    steps: list[float] = []
    evals: list[float] = []
    mx.eval, mx.argmax = timed_eval, timed_argmax
    try:
        for i in range(frames + warmup):
            evaluating[0] = 0.0
            started = time.perf_counter()
            session.push_audio(audio[i * size : (i + 1) * size], rate)
            if i >= warmup:
                steps.append(time.perf_counter() - started)
                evals.append(evaluating[0])
    finally:
        mx.eval, mx.argmax = original_eval, original_argmax
    step = np.asarray(steps) * 1e3
    ev = np.asarray(evals) * 1e3
    profile = session.profile_summary(drop_first=warmup)
    return {
        "model": str(path),
        "frames": frames,
        "step_ms_p50": float(np.median(step)),
        "step_ms_p95": float(np.percentile(step, 95)),
        "eval_ms_p50": float(np.median(ev)),
        "eval_share": float(ev.sum() / step.sum()),
        "stages_ms_p50": {
            name: round(float(s["p50_ms"]), 2) for name, s in profile.get("stages", {}).items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.evalshare", description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--size", choices=["tiny", "medium"], default="medium")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    path = model_path(args)
    result = measure(path, args.frames)
    print(json.dumps(result, indent=2))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
