"""The engine's scheduler and admission rule as pure logic: times are passed in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from realtime.admission import MIN_SAMPLES, StepTimes, admits, sessions_within
from realtime.scheduler import Scheduler

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
