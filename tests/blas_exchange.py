"""``python -m tests.blas_exchange CHECKPOINT``: the frame step under a system OpenBLAS.

Run in a process of its own by tests/test_cpu_blas.py (the BLAS is chosen once per
process, before MLX loads). Prints one JSON object: whether our step alone is still
mlx-vlm's bit for bit, and how three batched conversations compare with their solo
runs (text, transcript and audio codes equal; the largest sample difference).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from realtime.cpu_blas import OPENBLAS, active, install_from


def main(checkpoint: str) -> dict[str, Any]:
    install_from(OPENBLAS)  # before anything below imports MLX

    from realtime.models import load_model
    from realtime.models.base import AudioDelta, ModelEvent, ModelSession, open_session
    from realtime.models.voicechat.model import VoiceChatModel
    from tests.engine.test_isolation import digest
    from tests.models.voicechat.test_step import mlx_vlm_digest
    from tests.models_fixtures import noise, push_all, speechlike

    model = load_model(checkpoint)
    assert isinstance(model, VoiceChatModel)
    frames = 16
    audio = [
        np.concatenate([noise(frames - 8, seed=3 + k, level=0.5), speechlike(8)]) for k in range(3)
    ]

    def opened(k: int) -> ModelSession:
        return open_session(model, system_prompt=None, seed=k + 1, max_streaming_seconds=None)

    solo = [push_all(opened(k), audio[k], 1280) for k in range(3)]
    alone_is_mlx_vlm = digest(solo[0]) == mlx_vlm_digest(model, 1, None, audio[0], 1280)

    sessions = [opened(k) for k in range(3)]
    batched: list[list[ModelEvent]] = [[] for _ in range(3)]
    for f in range(frames):
        pieces = [(s, audio[k][f * 1280 : (f + 1) * 1280], 16000) for k, s in enumerate(sessions)]
        for k, result in enumerate(model.step(pieces)):
            assert not isinstance(result, Exception), result
            batched[k] += result
    for k, s in enumerate(sessions):
        batched[k] += s.flush(True)

    def without_samples(events: list[ModelEvent]) -> list[Any]:
        return [e[:3] if e[0] == "audio" else e for e in digest(events)]

    def samples(events: list[ModelEvent]) -> list[np.ndarray]:
        return [e.samples for e in events if isinstance(e, AudioDelta)]

    return {
        "blas": active().name,
        "alone_is_mlx_vlm": alone_is_mlx_vlm,
        "batched_rows_equal_but_samples": [
            without_samples(batched[k]) == without_samples(solo[k]) for k in range(3)
        ],
        "batched_rows_bit_identical": [digest(batched[k]) == digest(solo[k]) for k in range(3)],
        "max_sample_difference": max(
            float(np.abs(a - b).max())
            for k in range(3)
            for a, b in zip(samples(batched[k]), samples(solo[k]), strict=True)
        ),
        "audio_frames": [len(samples(batched[k])) for k in range(3)],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
