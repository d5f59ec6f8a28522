"""``python -m benchmarks.graph``: the counts of an evaluated graph, and a frame step's."""

from __future__ import annotations

import io

import mlx.core as mx
import numpy as np

from benchmarks.graph import Probe, Weight, count_dot, measure_shape, prime, probing
from realtime.models.voicechat.model import VoiceChatModel


def test_a_graph_is_counted_by_kind_and_its_weight_reads() -> None:
    weight = mx.ones((4, 8), dtype=mx.bfloat16)
    x = mx.ones((8,))
    mx.eval(weight, x)
    y = (weight.T.astype(mx.float32).T @ x).reshape(2, 2)[0] + (weight @ x.astype(mx.bfloat16))[:2]
    buffer = io.StringIO()
    mx.export_to_dot(buffer, y, w0=weight)
    counts = count_dot(buffer.getvalue(), {"w0": Weight(64, 2)})
    # Casts: the weight, x, the second product; compute: those, two products, the
    # gather of [0], the sum; views: the products' expand and squeeze, the reshape, the
    # [0] squeeze, the slice. The weight is read twice, its float32 copy (cast through a
    # transpose) once more.
    assert counts.astype == 3
    assert counts.compute == 3 + 2 + 1 + 1
    assert counts.views == 2 + 2 * 2 + 1 + 1 + 1  # and the cast's two transposes
    assert counts.weight_bytes == 64 + 2 * 128 + 64


def test_waits_are_evaluations_that_had_work() -> None:
    a = mx.ones((3,))
    mx.eval(a)
    probe = Probe({}, graphs=True)
    originals = (mx.eval, np.asarray, mx.array.item)
    with probing(probe):
        mx.eval(a)  # nothing to run
        b = a + 1
        mx.async_eval(b)  # type: ignore[no-untyped-call]  # submitted, not a wait
        assert np.asarray(b).tolist() == [2.0, 2.0, 2.0]  # waits for it
        assert (a * 2).sum().item() == 6.0
        np.asarray(b)  # read already
    assert (mx.eval, np.asarray, mx.array.item) == originals
    assert probe.waits == 2
    assert probe.counts.compute == 3  # add, multiply, sum


def test_a_frame_step_is_counted_exactly(demo_model: VoiceChatModel) -> None:
    """One frame each of mlx-vlm's session and ours at B=1 and B=2 (tiny): counts are
    whole numbers per step, and the same when measured again."""
    prime(demo_model, 2)
    theirs = measure_shape(demo_model, "mlx-vlm B=1", warm=1, frames=1)
    ours = measure_shape(demo_model, "B=1", warm=1, frames=1)
    two = measure_shape(demo_model, "B=2", warm=1, frames=1)
    for figures in (theirs, ours, two):
        assert figures.waits >= 1 and figures.compute > 0 and figures.views > 0
        assert figures.waits == int(figures.waits) and figures.astype == int(figures.astype)
        assert figures.weight_mb > 0 and figures.host_ms > 0
    assert ours.compute < theirs.compute
    assert two.rows == 2 and two.compute > ours.compute
    again = measure_shape(demo_model, "B=1", warm=1, frames=1)
    assert (again.waits, again.compute, again.views, again.astype, again.weight_mb) == (
        ours.waits,
        ours.compute,
        ours.views,
        ours.astype,
        ours.weight_mb,
    )
