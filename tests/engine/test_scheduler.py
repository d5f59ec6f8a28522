"""The engine's scheduler and admission rule as pure logic: times are passed in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from realtime.engine.admission import (
    MIN_SAMPLES,
    ExtraWork,
    StepTimes,
    admits,
    batched_cost,
    fits,
    frame_cost,
    gather_cost,
    gather_reserve,
    sessions_within,
)
from realtime.engine.scheduler import Entry, Scheduler, gather_until

FRAME = 0.08


def run_order(s: Scheduler[str, str]) -> list[str]:
    return [e.item for e in s.drain()]


def test_each_conversation_runs_in_order_and_the_earliest_deadline_first() -> None:
    s: Scheduler[str, str] = Scheduler()
    s.add_paced("a", "a1", 0.000, FRAME)  # due 0.08
    s.add_paced("b", "b1", 0.010, FRAME)  # due 0.09
    s.add_paced("a", "a2", 0.020, FRAME)  # due 0.16 (a frame after a1)
    s.add_paced("b", "b2", 0.090, FRAME)  # due 0.17
    assert len(s) == 4
    assert run_order(s) == ["a1", "b1", "a2", "b2"]
    assert len(s) == 0 and s.pop() is None


def test_ties_go_to_the_first_to_arrive() -> None:
    s: Scheduler[str, str] = Scheduler()
    for key in "cab":
        s.add(key, key, 1.0)
    assert run_order(s) == ["c", "a", "b"]


def test_a_burst_cannot_starve_a_live_conversation() -> None:
    """Fifty frames handed over at once are due a frame apart: the live conversation's
    frames, arriving in real time, interleave with them one for one."""
    s: Scheduler[str, str] = Scheduler()
    for i in range(50):
        s.add_paced("flood", f"f{i}", 0.0, FRAME)
    order: list[str] = []
    now = 0.0
    for i in range(10):
        s.add_paced("live", f"l{i}", now, FRAME)
        # Run until the live frame has run: it never waits for more than one burst frame.
        ran = []
        while True:
            entry = s.pop()
            assert entry is not None
            ran.append(entry.item)
            if entry.key == "live":
                break
        assert len(ran) <= 2, ran
        order += ran
        now += FRAME
    assert [x for x in order if x.startswith("l")] == [f"l{i}" for i in range(10)]


def test_a_burst_alone_still_runs_back_to_back() -> None:
    s: Scheduler[str, str] = Scheduler()
    for i in range(5):
        s.add_paced("a", f"a{i}", 0.0, FRAME)
    assert [e.due for e in s] == pytest.approx([0.08, 0.16, 0.24, 0.32, 0.40])
    assert run_order(s) == [f"a{i}" for i in range(5)]


def test_pacing_restarts_from_now_after_a_pause_and_forget_drops_it() -> None:
    s: Scheduler[str, str] = Scheduler()
    assert s.add_paced("a", "x", 0.0, FRAME) == pytest.approx(0.08)
    s.pop()
    assert s.add_paced("a", "y", 5.0, FRAME) == pytest.approx(5.08)
    s.forget("a")
    assert s.add_paced("a", "z", 0.0, FRAME) == pytest.approx(0.08)


def test_a_control_command_makes_its_conversation_urgent_but_keeps_its_order() -> None:
    """A flush is due at once: it runs after its own conversation's queued frame, and
    both before another conversation's frame that is due later."""
    s: Scheduler[str, str] = Scheduler()
    s.add_paced("b", "b1", 0.0, FRAME)  # due 0.08
    s.add_paced("a", "a1", 0.01, FRAME)  # due 0.09
    s.add("a", "a-flush", 0.02)  # due 0.02
    urgency = s.urgency("a")
    assert urgency is not None and urgency[1] == 3 and urgency[0] == pytest.approx(0.02)
    assert run_order(s) == ["a1", "a-flush", "b1"]


def test_a_sliced_command_keeps_its_place_at_the_head() -> None:
    s: Scheduler[str, str] = Scheduler()
    s.add("a", "open", 0.0)
    s.add("b", "b1", 0.05)
    first = s.pop()
    assert first is not None and first.item == "open"
    s.add("a", "close", 0.06)  # arrives while the open runs
    s.add_first("a", "open (slice 2)", 0.08)
    assert run_order(s) == ["b1", "open (slice 2)", "close"]


def test_remove_takes_one_conversation_and_nan_is_refused() -> None:
    s: Scheduler[str, str] = Scheduler()
    s.add("a", "a1", 1.0)
    s.add("b", "b1", 2.0)
    s.add("a", "a2", 3.0)
    assert [e.item for e in s.remove("a")] == ["a1", "a2"]
    assert s.remove("a") == [] and len(s) == 1
    with pytest.raises(ValueError):
        s.add("a", "x", math.nan)


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.floats(0, 10), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_any_mix_runs_everything_once_each_conversation_in_order(
    arrivals: list[tuple[str, float, bool]],
) -> None:
    s: Scheduler[str, tuple[str, int]] = Scheduler()
    sent: dict[str, list[int]] = {}
    for n, (key, now, control) in enumerate(sorted(arrivals, key=lambda a: a[1])):
        sent.setdefault(key, []).append(n)
        if control:
            s.add(key, (key, n), now)
        else:
            s.add_paced(key, (key, n), now, FRAME)
    ran: dict[str, list[int]] = {}
    for entry in s.drain():
        ran.setdefault(entry.key, []).append(entry.item[1])
    assert ran == sent


# --- batches ---------------------------------------------------------------------------


def is_frame(entry: Entry[str, str]) -> bool:
    return entry.item.startswith("f-")


def test_a_due_frame_takes_the_head_frame_of_every_other_conversation() -> None:
    s: Scheduler[str, str] = Scheduler()
    s.add_paced("a", "f-a1", 0.00, FRAME)  # due 0.08: the lead
    s.add_paced("a", "f-a2", 0.00, FRAME)  # a's second frame: one per conversation
    s.add_paced("b", "f-b1", 0.05, FRAME)  # due 0.13, taken early
    s.add_paced("c", "f-c1", 5.00, FRAME)  # due in seconds: taken early all the same
    s.add("d", "open", 0.01)  # a head that is not a frame stays
    s.add_paced("d", "f-d1", 0.02, FRAME)  # behind d's open: not a head
    batch = s.pop_batch(is_frame, limit=8)
    assert [e.item for e in batch] == ["open"]  # d's open was due first: it runs alone
    batch = s.pop_batch(is_frame, limit=8)
    assert [e.item for e in batch] == ["f-a1", "f-d1", "f-b1", "f-c1"]  # most urgent first
    assert len(s) == 1 and [e.item for e in s.pop_batch(is_frame, 8)] == ["f-a2"]
    assert s.pop_batch(is_frame, 8) == [] and len(s) == 0


def test_a_batch_is_bounded_and_a_lead_that_does_not_join_runs_alone() -> None:
    s: Scheduler[str, str] = Scheduler()
    for n, key in enumerate("abcde"):
        s.add_paced(key, f"f-{key}", 0.01 * n, FRAME)
    assert [e.item for e in s.pop_batch(is_frame, limit=3)] == ["f-a", "f-b", "f-c"]
    assert [e.item for e in s.pop_batch(is_frame, limit=1)] == ["f-d"]  # 1: time-sliced
    s.add("x", "flush", 0.0)
    assert [e.item for e in s.pop_batch(is_frame, limit=8)] == ["flush"]
    assert [e.item for e in s.pop_batch(is_frame, limit=8)] == ["f-e"]


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.floats(0, 10), st.booleans()),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 8),
)
def test_batches_take_each_conversation_in_order_and_never_delay_the_due_command(
    arrivals: list[tuple[str, float, bool]], limit: int
) -> None:
    """Any mix: the first entry of a batch is what ``pop`` takes; a batch holds at most
    ``limit`` entries, one per conversation, every one a frame when the first is (else
    the first alone); it leaves no other conversation's head frame behind unless it is
    full; everything runs once, each conversation in order."""
    s: Scheduler[str, str] = Scheduler()
    sent: dict[str, list[str]] = {}
    for n, (key, now, control) in enumerate(sorted(arrivals, key=lambda a: a[1])):
        item = f"{'c' if control else 'f'}-{n}"
        sent.setdefault(key, []).append(item)
        if control:
            s.add(key, item, now)
        else:
            s.add_paced(key, item, now, FRAME)
    ran: dict[str, list[str]] = {}
    while len(s):
        size, due = len(s), s.peek()
        batch = s.pop_batch(is_frame, limit)
        lead = batch[0]
        assert lead == due and 1 <= len(batch) <= limit and len(s) == size - len(batch)
        assert len({e.key for e in batch}) == len(batch)
        assert all(is_frame(e) for e in batch[1:])
        if not is_frame(lead):
            assert len(batch) == 1
        elif len(batch) < limit:
            heads: dict[str, Entry[str, str]] = {}
            for entry in s:
                heads.setdefault(entry.key, entry)
            taken = {e.key for e in batch}
            assert all(k in taken or not is_frame(h) for k, h in heads.items())
        for entry in batch:
            ran.setdefault(entry.key, []).append(entry.item)
    assert ran == sent


# --- admission by load ----------------------------------------------------------------


def test_admission_keeps_every_conversation_within_the_margin() -> None:
    # 20 ms steps, 0.75 x 80 ms = 60 ms of engine time a frame: three conversations.
    assert admits(0, 0.020, FRAME, 0.75)
    assert admits(2, 0.020, FRAME, 0.75)
    assert not admits(3, 0.020, FRAME, 0.75)
    assert sessions_within(0.020, FRAME, 0.75) == 3


def test_admission_off_unmeasured_or_alone_always_admits() -> None:
    assert admits(9, 0.5, FRAME, 0.0)  # margin 0: off
    assert admits(9, None, FRAME, 0.75)  # nothing measured yet
    assert admits(0, 1.0, FRAME, 0.75)  # a slow model still serves one conversation
    assert sessions_within(None, FRAME, 0.75) is None
    assert sessions_within(1.0, FRAME, 0.75) == 1


def test_step_times_give_a_p90_of_the_recent_window_once_enough_ran() -> None:
    times = StepTimes(window=100)
    for _ in range(MIN_SAMPLES - 1):
        times.add(0.01)
    assert times.quantile() is None
    times.add(0.01)
    assert times.quantile() == pytest.approx(0.01)
    for i in range(100):
        times.add(0.001 * (i + 1))  # the window now holds 1..100 ms
    assert len(times) == 100
    assert times.quantile() == pytest.approx(0.091)


def test_step_times_are_kept_per_batch_size() -> None:
    times = StepTimes(window=32)
    for _ in range(MIN_SAMPLES):
        times.add(0.030, rows=1)
        times.add(0.034, rows=2)
    for _ in range(MIN_SAMPLES - 1):
        times.add(0.050, rows=4)  # too few to count
    assert times.costs() == pytest.approx({1: 0.030, 2: 0.034})
    assert len(times) == 32  # the window over all sizes
    with pytest.raises(ValueError):
        times.add(0.01, rows=0)


def test_the_batched_cost_is_measured_or_extrapolated_by_a_line() -> None:
    costs = {1: 0.030, 2: 0.034, 4: 0.042}  # 26 ms + 4 ms a row
    assert batched_cost(costs, 2) == 0.034  # measured
    assert batched_cost(costs, 8) == pytest.approx(0.058)  # the least-squares line
    assert batched_cost(costs, 3) == pytest.approx(0.038)  # between 2 and 4
    assert batched_cost({}, 3) is None


def test_a_batch_gathers_at_the_cost_measured_or_else_of_a_smaller_batch() -> None:
    # Nothing measured: no step to leave room for.
    assert gather_cost({}, 2) == 0.0
    # One size measured: a bigger batch is tried at its cost (admission's proportional
    # rule would say 2 x 30 ms and no batch of 2 would ever gather, or be measured).
    assert gather_cost({1: 0.030}, 2) == 0.030
    assert batched_cost({1: 0.030}, 2) == pytest.approx(0.060)
    assert gather_cost({2: 0.040}, 1) == 0.0
    # Measured, or two sizes to fit a line through: the batched cost.
    assert gather_cost({1: 0.030, 2: 0.034}, 2) == 0.034
    assert gather_cost({1: 0.030, 2: 0.034}, 4) == pytest.approx(
        batched_cost({1: 0.030, 2: 0.034}, 4)
    )


def test_a_batch_keeps_its_step_back_only_while_each_could_have_its_own() -> None:
    costs = {1: 0.025, 2: 0.032}
    # Two conversations at 25 ms a step fit in 0.75 x 80 ms: end by the first deadline.
    assert gather_reserve(2, costs, FRAME) == 0.032
    # Three do not (75 ms): gather every frame due before the first one is.
    assert gather_reserve(3, costs, FRAME) == 0.0
    # No one-row step measured yet: gather (the cost is unknown).
    assert gather_reserve(2, {2: 0.032}, FRAME) == 0.0


def test_the_batched_cost_never_falls_below_a_smaller_batch_or_above_a_larger() -> None:
    assert batched_cost({1: 0.040, 2: 0.030}, 3) == pytest.approx(0.030)  # a falling line
    assert batched_cost({1: 0.010, 4: 0.020, 5: 0.080}, 3) == pytest.approx(0.020)
    # One size measured: proportional above it (the time-sliced rule), its cost below.
    assert batched_cost({2: 0.030}, 3) == pytest.approx(0.045)
    assert batched_cost({2: 0.030}, 1) == pytest.approx(0.030)


def test_batched_admission_rises_with_the_cheap_rows_and_falls_back_under_load() -> None:
    """30 ms a step and 4 ms a row; 0.75 x 80 ms = 60 ms of engine time a frame."""
    costs = {1: 0.030, 2: 0.034}
    sliced = [fits(n, frame_cost(n + 1, costs, batched=False), FRAME, 0.75) for n in range(4)]
    assert sliced == [True, True, False, False]  # (open + 1) x 30 ms: two conversations
    batched = [fits(n, frame_cost(n + 1, costs, batched=True), FRAME, 0.75) for n in range(10)]
    assert batched == [True] * 8 + [False] * 2  # 26 + 4 x 9 = 62 ms for nine: eight
    assert frame_cost(3, {2: 0.02}, batched=False) is None  # no single-row step measured
    loaded = {1: 0.030, 2: 0.065}  # the machine got slower: the size running now says so
    assert not fits(2, frame_cost(3, loaded, batched=True), FRAME, 0.75)
    assert fits(2, None, FRAME, 0.75) and fits(0, 1.0, FRAME, 0.75) and fits(5, 1.0, FRAME, 0)


# --- gathering a batch ------------------------------------------------------------------


def test_a_batch_waits_for_the_frames_due_before_its_first_is() -> None:
    # The lead frame is due at 0.08; two others are expected at 0.03 and 0.07.
    assert gather_until(0.08, 0.0, [0.03, 0.07]) == 0.07
    # One expected after the lead is due is not waited for.
    assert gather_until(0.08, 0.0, [0.03, 0.09]) == 0.03
    # None to come (already late, or none streaming): run now.
    assert gather_until(0.08, 0.05, [0.01, 0.04]) is None
    assert gather_until(0.08, 0.0, []) is None
    # Never past the lead's deadline, whatever is expected.
    assert gather_until(0.08, 0.085, [0.09]) is None


def test_a_batch_starts_in_time_to_end_by_its_first_frames_deadline() -> None:
    # A 30 ms step: a frame expected at 0.07 would make the lead 20 ms late; 0.05 not.
    assert gather_until(0.08, 0.0, [0.03, 0.07], step=0.03) == 0.03
    assert gather_until(0.08, 0.0, [0.05, 0.07], step=0.03) == 0.05
    # A step longer than the time left: run now.
    assert gather_until(0.08, 0.0, [0.03], step=0.09) is None


@given(
    st.floats(0, 1),
    st.floats(0, 1),
    st.lists(st.floats(0, 2), max_size=8),
    st.floats(0, 0.2),
)
def test_a_batch_never_waits_past_its_first_frames_deadline(
    due: float, now: float, expected: list[float], step: float
) -> None:
    until = gather_until(due, now, expected, step)
    if until is not None:
        assert now < until <= due - step and until in expected


def test_extra_work_is_never_due_at_once() -> None:
    """An opening's slice or a tool result's step is due a period after it is queued and
    after its conversation's latest frame: a frame that is due sooner runs
    first."""
    s: Scheduler[str, str] = Scheduler()
    assert s.add_extra("a", "open a", 1.0, 0.16) == pytest.approx(1.16)
    s.add_paced("b", "b1", 1.0, FRAME)  # due 1.08
    assert s.add_paced("a", "a1", 1.0, FRAME) == pytest.approx(1.08)
    assert s.add_extra("a", "feed a", 1.0, 0.16) == pytest.approx(1.24)  # after a1
    assert s.add_extra("a", "open a (slice 2)", 1.0, 0.16, first=True) == pytest.approx(1.24)
    assert run_order(s) == ["b1", "open a (slice 2)", "open a", "a1", "feed a"]


def test_work_that_yields_gives_way_to_the_most_urgent_frame() -> None:
    s: Scheduler[str, str] = Scheduler()
    s.add("o", "slice", 0.01)
    s.add("b", "b1", 0.09)
    s.add("a", "a1", 0.08)

    def frames(entry: Entry[str, str]) -> bool:
        return not entry.item.startswith("slice")

    assert s.most_urgent(frames) == Entry("a", "a1", 0.08, 3)
    assert [e.item for e in s.pop_batch(frames, 3, lambda e, f: True)] == ["a1", "b1"]
    assert [e.item for e in s.pop_batch(frames, 3, lambda e, f: True)] == ["slice"]
    s.add("o", "slice 2", 0.01)
    s.add("a", "a2", 0.16)
    assert [e.item for e in s.pop_batch(frames, 3, lambda e, f: False)] == ["slice 2"]


def test_extra_work_counts_per_frame_over_its_window() -> None:
    """Openings, tool results, flushes, cancels and closes: their engine time per frame
    time over the last ``window`` seconds, which admission adds to the frame cost."""
    extra = ExtraWork(window=2.0)
    assert extra.per_frame(0.0, FRAME) == 0.0
    extra.add(0.5, 0.1)
    extra.add(1.0, 0.3)
    assert extra.per_frame(1.0, FRAME) == pytest.approx(0.4 * FRAME / 2.0)
    assert extra.per_frame(2.6, FRAME) == pytest.approx(0.3 * FRAME / 2.0)  # 0.5 is gone
    assert extra.per_frame(3.0, FRAME) == 0.0


def test_held_work_waits_and_the_most_urgent_head_not_held_leads() -> None:
    """Work out of its share of engine time (``held``) waits, even when it is due first;
    with only held work queued nothing runs."""
    s: Scheduler[str, str] = Scheduler()
    s.add("open", "slice", 0.10)
    s.add("b", "close", 0.20)
    held = {"slice"}
    batch = s.pop_batch(lambda e: False, 4, held=lambda e: e.item in held)
    assert [e.item for e in batch] == ["close"]
    assert s.pop_batch(lambda e: False, 4, held=lambda e: e.item in held) == []
    assert len(s) == 1
    assert [e.item for e in s.pop_batch(lambda e: False, 4, held=lambda e: False)] == ["slice"]
