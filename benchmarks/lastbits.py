"""``python -m benchmarks.lastbits``: where batched rows stop being their solo runs' bits.

On the CPU every row of a batched step is bit for bit its conversation's solo run
(tested). On a GPU, MLX switches quantized matmul kernels as the rows grow (``qmv`` for a
few rows, ``qmm`` past them), which sums in another order: this runs B conversations as
one batch for ``--frames`` frames and each alone, and reports per batch size how many
rows differ, from which frame, and the largest difference in their audio samples; then
one conversation with the step's compiled pieces against the same run op by op (MLX's
CUDA backend compiles with fused multiply-adds, so a GPU may round those differently).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.graph import noise_audio


def _run(model: Any, seeds: Sequence[int], frames: int) -> list[list[Any]]:
    """Each seed's conversation stepped together, frame by frame: per row, per frame,
    (text and function ids, audio codes, samples)."""
    from realtime.models.base import AudioDelta, open_session

    sessions = [
        open_session(model, system_prompt=None, seed=seed, max_streaming_seconds=None)
        for seed in seeds
    ]
    audio = [noise_audio(seed, frames) for seed in seeds]
    out: list[list[Any]] = [[] for _ in seeds]
    for f in range(frames):
        batch = [
            (s, a[f * 1280 : (f + 1) * 1280], 16000) for s, a in zip(sessions, audio, strict=True)
        ]
        for k, result in enumerate(model.step(batch)):
            if isinstance(result, Exception):
                raise result
            tokens = tuple(
                getattr(e, "token_id", None) for e in result if not isinstance(e, AudioDelta)
            )
            sound = [e for e in result if isinstance(e, AudioDelta)]
            codes = tuple(c for e in sound for c in e.audio_codes)
            samples = np.concatenate([e.samples for e in sound]) if sound else np.zeros(0)
            out[k].append((tokens, codes, samples))
    return out


def _differences(mine: Sequence[Any], alone: Sequence[Any]) -> tuple[int | None, float]:
    """The first frame where one row's run differs from another's, and the largest
    difference in their audio samples."""
    first, largest = None, 0.0
    for f, (a, b) in enumerate(zip(mine, alone, strict=True)):
        if a[:2] != b[:2] or a[2].tobytes() != b[2].tobytes():
            first = f if first is None else first
            if a[2].shape == b[2].shape:
                largest = max(largest, float(np.max(np.abs(a[2] - b[2]), initial=0)))
    return first, largest


def compare(model: Any, rows: int, frames: int) -> dict[str, Any]:
    """``rows`` conversations batched against each run alone."""
    seeds = list(range(rows))
    batched = _run(model, seeds, frames)
    differing, first, largest = 0, None, 0.0
    for k, seed in enumerate(seeds):
        (solo,) = _run(model, [seed], frames)
        row_first, row_largest = _differences(batched[k], solo)
        largest = max(largest, row_largest)
        if row_first is not None:
            differing += 1
            first = row_first if first is None else min(first, row_first)
    return {
        "rows": rows,
        "frames": frames,
        "rows_differing": differing,
        "first_frame_differing": first,
        "largest_sample_difference": largest,
    }


def compare_compiled(model: Any, frames: int) -> dict[str, Any]:
    """One conversation with the step's compiled pieces (the TTS rounds, the fused norms
    and rotary embeddings) against the same run op by op (``mx.disable_compile``): on
    the CPU the same bits (tested); a GPU's compiled kernels use fused multiply-adds."""
    import mlx.core as mx

    (compiled,) = _run(model, [0], frames)
    mx.disable_compile()
    try:
        (plain,) = _run(model, [0], frames)
    finally:
        mx.enable_compile()
    first, largest = _differences(compiled, plain)
    return {
        "frames": frames,
        "first_frame_differing": first,
        "largest_sample_difference": largest,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lastbits", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="VoiceChat checkpoint")
    parser.add_argument("--batch", default="2,8,16,32", help="batch sizes (comma-separated)")
    parser.add_argument("--frames", type=int, default=6, help="frames each conversation")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        sizes = [int(part) for part in args.batch.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2 or args.frames < 1:
        print("--batch takes sizes of 2 or more, --frames at least 1", file=sys.stderr)
        return 2
    from realtime.models import load_model

    model = load_model(args.model)
    results = []
    for rows in sizes:
        result = compare(model, rows, args.frames)
        results.append(result)
        print(
            f"B={rows}: {result['rows_differing']} of {rows} rows differ from their solo run"
            f" (first at frame {result['first_frame_differing']}, largest sample"
            f" difference {result['largest_sample_difference']:.3g})",
            flush=True,
        )
    same = compare_compiled(model, args.frames)
    print(
        "B=1 compiled against op by op: "
        + (
            "the same bits"
            if same["first_frame_differing"] is None
            else f"differs from frame {same['first_frame_differing']} (largest sample"
            f" difference {same['largest_sample_difference']:.3g})"
        ),
        flush=True,
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"batched": results, "compiled": same}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
