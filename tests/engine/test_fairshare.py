"""The engine's share of time for work that is not a frame, and its real-time check, as
pure rules: times are passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from realtime.engine.fairshare import (
    BURST_FRAMES,
    MAX_SHARE,
    MIN_LATE_SAMPLES,
    MIN_SHARE,
    PATIENCE_FRAMES,
    RECOVERY_FRAMES,
    FrameLateness,
    ShareBucket,
    extra_share,
    fits,
    gap,
    keeps_real_time,
    recovered,
    slice_steps,
)

FRAME = 0.08


def test_the_share_is_what_the_frames_leave_within_bounds() -> None:
    assert extra_share(0.0) == MAX_SHARE  # an idle engine: still the most share
    assert extra_share(0.7) == pytest.approx(0.15)
    assert extra_share(0.8) == MIN_SHARE  # a full engine: openings still progress
    assert extra_share(5.0) == MIN_SHARE


def test_an_idle_bucket_is_full_and_a_slice_may_run() -> None:
    bucket = ShareBucket(FRAME)
    assert bucket.credit(0.0, 0.5) == pytest.approx(0.5 * FRAME * BURST_FRAMES)
    assert bucket.may_run(0.0, 0.5) and bucket.wait(0.0, 0.5) == 0.0


def test_a_slice_dearer_than_the_credit_is_paid_back_in_wall_time() -> None:
    """A 150 ms slice from a 40 ms bucket at share 0.5: 110 ms of debt, paid back in
    220 ms of wall time, so the next slice starts no sooner (the share is the caller's)."""
    bucket = ShareBucket(FRAME)
    bucket.charge(1.0, 0.15, 0.5, contended=True)
    assert bucket.credit(1.0, 0.5) == pytest.approx(0.04 - 0.15)
    assert not bucket.may_run(1.1, 0.5)
    assert bucket.wait(1.0, 0.5) == pytest.approx(0.22, abs=1e-3)
    assert bucket.may_run(1.0 + bucket.wait(1.0, 0.5), 0.5)


def test_work_that_took_nobody_s_time_leaves_the_bucket_full() -> None:
    bucket = ShareBucket(FRAME)
    bucket.charge(1.0, 5.0, 0.5, contended=False)  # a long prefill on a quiet engine
    assert bucket.may_run(1.0, 0.5)


def test_the_credit_never_exceeds_its_cap() -> None:
    bucket = ShareBucket(FRAME)
    bucket.charge(0.0, 0.01, 0.25, contended=True)
    assert bucket.credit(100.0, 0.25) == pytest.approx(0.25 * FRAME * BURST_FRAMES)


@given(
    costs=st.lists(st.floats(0.001, 0.5), min_size=1, max_size=60),
    share=st.floats(MIN_SHARE, MAX_SHARE),
)
def test_slices_run_when_allowed_take_at_most_their_share(costs: list[float], share: float) -> None:
    """Whatever each slice costs, slices that start only when the bucket allows take at
    most ``share`` of the elapsed time, plus the bucket and one slice."""
    bucket = ShareBucket(FRAME)
    now = 0.0
    spent = 0.0
    for cost in costs:
        now += bucket.wait(now, share)
        assert bucket.may_run(now, share)
        now += cost
        spent += cost
        bucket.charge(now, cost, share, contended=True)
    assert spent <= share * now + share * FRAME * BURST_FRAMES + max(costs) + 1e-6


def test_a_slice_fits_when_the_next_frame_still_ends_by_its_deadline() -> None:
    assert fits(0.0, 0.05, None, 0.02)  # no frame expected
    assert fits(0.0, 0.05, 0.08, 0.02)
    assert not fits(0.0, 0.07, 0.08, 0.02)


def test_a_slice_is_cut_to_the_steps_that_fit_the_gap() -> None:
    """An opening's slice of up to four prefill steps: as many as the gap before the next
    frame holds at the measured cost of a step, at least one, all four when no frame is
    expected (nothing streams)."""
    room = gap(0.0, 0.16, 0.02)
    assert room == pytest.approx(0.14)
    assert gap(0.0, None, 0.02) is None
    assert slice_steps(4, None, 0.03) == 4  # nothing streams: whole slices
    assert slice_steps(4, room, 0.03) == 4
    assert slice_steps(4, room, 0.05) == 2
    assert slice_steps(4, room, 0.08) == 1  # a cold step on a loaded machine: one
    assert slice_steps(4, room, 0.3) == 1  # one step cannot be cut: it fits or it waits
    assert slice_steps(4, -0.01, 0.03) == 1  # no room left (it runs after the frames)
    assert slice_steps(4, room, None) == 1  # the step not measured yet: the least


@given(
    st.integers(1, 16),
    st.floats(-1.0, 1.0, allow_nan=False),
    st.floats(1e-4, 1.0, allow_nan=False),
)
def test_a_cut_slice_fits_its_room_unless_it_is_one_step(
    most: int, room: float, per_step: float
) -> None:
    steps = slice_steps(most, room, per_step)
    assert 1 <= steps <= most
    assert steps == 1 or steps * per_step <= room


def test_real_time_is_kept_while_few_frames_are_more_than_a_frame_late() -> None:
    assert keeps_real_time([1.0] * (MIN_LATE_SAMPLES - 1), FRAME)  # too few to tell
    assert keeps_real_time([0.0] * 19 + [1.0], FRAME)  # one in twenty
    assert not keeps_real_time([0.0] * 18 + [0.2] * 2, FRAME)  # one in ten
    assert keeps_real_time([FRAME] * 20, FRAME)


def test_frame_lateness_forgets_frames_past_its_window() -> None:
    lateness = FrameLateness(window=2.0)
    for i in range(MIN_LATE_SAMPLES):
        lateness.add(i * 0.01, 0.5)
    assert not lateness.keeps_real_time(0.1, FRAME)
    assert lateness.keeps_real_time(2.5, FRAME)  # the load went: ready again


def test_a_slice_that_fits_no_gap_waits_until_the_frames_caught_up() -> None:
    lateness = FrameLateness(window=2.0)
    assert recovered(lateness.on_time_for(0.0), 0.0, FRAME)  # nothing late in the window
    lateness.add(1.0, 0.05)
    lateness.add(1.03, -0.02)
    assert lateness.on_time_for(1.05) == pytest.approx(0.05)
    assert not recovered(lateness.on_time_for(1.05), 0.0, FRAME)
    assert recovered(lateness.on_time_for(1.0 + RECOVERY_FRAMES * FRAME), 0.0, FRAME)
    # Frames always late: a slice that has waited long enough runs anyway.
    assert recovered(0.0, PATIENCE_FRAMES * FRAME, FRAME)
