"""Helpers for the model and offline tests: test signals, subprocess environments and
the ``realtime`` command run as a user runs it.

The demo checkpoint fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from realtime.models.base import ModelEvent, ModelSession, RealtimeModel

REPO_ROOT = Path(__file__).resolve().parent.parent


def noise(frames: int, seed: int = 3, level: float = 0.1) -> np.ndarray:
    """Deterministic white noise, ``frames`` x 1280 samples, in [-1, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(frames * 1280) * level
    return np.clip(x, -1.0, 0.999).astype(np.float32)


def speechlike(frames: int, seed: int = 3) -> np.ndarray:
    """A voiced, syllable-modulated harmonic tone with a little noise."""
    t = np.arange(frames * 1280) / 16000
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    x = sum(np.sin(k * phase) / k for k in range(1, 8))
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2 * 0.2
    x = x + np.random.default_rng(seed).standard_normal(x.shape[0]) * 0.01
    return np.asarray(x, dtype=np.float32)


def push_all(session: ModelSession, samples: np.ndarray, chunk: int = 1280) -> list[ModelEvent]:
    """Push ``samples`` in ``chunk``-sized pieces, then flush with padding."""
    events: list[ModelEvent] = []
    for start in range(0, samples.shape[0], chunk):
        events += session.push_audio(samples[start : start + chunk], 16000)
    events += session.flush(True)
    return events


def step_rows(
    model: RealtimeModel,
    batch: Sequence[tuple[int, ModelSession, np.ndarray]],
    got: list[list[Any]],
) -> None:
    """One batched step of ``batch`` (row, session, 16 kHz samples); each row's events
    go on ``got[row]``, and a row that failed fails the test."""
    results = model.step([(session, piece, 16000) for _, session, piece in batch])
    for (k, _, _), result in zip(batch, results, strict=True):
        assert not isinstance(result, Exception), result
        got[k] += result


def subprocess_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["REALTIME_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


PYTHON = sys.executable


def run_python(
    *argv: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` from the repository (``env``: its whole environment, else ours);
    its output captured as text, its exit status for the caller to judge."""
    return subprocess.run(
        [PYTHON, *argv], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=timeout
    )


def run_realtime(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m realtime ARGS`` from the repository, with ``cache_dir`` as its cache;
    its output captured as text (the tests read the messages and the exit status)."""
    return run_python("-m", "realtime", *args, env=subprocess_env(cache_dir))
