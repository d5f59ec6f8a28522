"""Small helpers every benchmark shares: percentiles over timing samples, the median
of several runs, and what the figures were measured on."""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import numpy as np


@attrs.frozen(slots=True)
class Summary:
    """Percentiles of one timing series (same unit as the input)."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """Summary of ``values``; an empty series gives NaNs so a missing row is visible."""
    if not values:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan)
    arr = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = (float(v) for v in np.percentile(arr, [50, 95, 99]))
    return Summary(
        n=int(arr.size),
        mean=float(arr.mean()),
        p50=p50,
        p95=p95,
        p99=p99,
        min=float(arr.min()),
        max=float(arr.max()),
    )


def median_of(suites: list[dict[str, Any]]) -> dict[str, Any]:
    """The element-wise median of several runs of the same suite (numbers only;
    anything else is taken from the first run)."""
    first = suites[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        values = [s.get(key) for s in suites]
        if isinstance(value, dict) and all(isinstance(v, dict) for v in values):
            out[key] = median_of(values)  # type: ignore[arg-type]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers = [float(v) for v in values if isinstance(v, (int, float))]
            med = float(statistics.median(numbers))
            out[key] = int(med) if isinstance(value, int) and med.is_integer() else med
        else:
            out[key] = value
    return out


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """How this run was asked for, to keep beside its figures: ``python -m MODULE ARGS``
    (``argv`` None: the process's own arguments), quoted so it can be pasted back."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    memory = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mlx": version("mlx"),
        "mlx_vlm": version("mlx-vlm"),
        "trio": version("trio"),
        "hypercorn": version("hypercorn"),
    }
