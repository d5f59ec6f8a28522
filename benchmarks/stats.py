"""Small statistics helpers: percentiles over timing samples."""

from __future__ import annotations

from collections.abc import Sequence
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
