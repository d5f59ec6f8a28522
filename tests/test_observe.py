"""Observers: each hook reaches exactly the observers that override it."""

from __future__ import annotations

import pytest

from realtime.observe import HOOKS, Observer, Observers, SessionReport


class Frames(Observer):
    def __init__(self) -> None:
        self.latencies: list[float] = []

    def frame_sent(self, latency: float) -> None:
        self.latencies.append(latency)


class Ends(Observer):
    def __init__(self) -> None:
        self.ends: list[str] = []

    def session_ended(self, report: SessionReport) -> None:
        self.ends.append(report.session_id)

    def frame_sent(self, latency: float) -> None:
        self.ends.append(f"frame {latency}")


def test_each_hook_reaches_exactly_its_observers() -> None:
    frames, ends = Frames(), Ends()
    both = Observers((frames, ends))
    report = SessionReport("sess_a", "done", 1.0, 2, (0.01,), 1000, "response done")
    both.frame_sent(0.5)
    both.session_ended(report)
    both.hop("slice_submitted", 0.0)  # nobody overrides it: the base no-op
    assert frames.latencies == [0.5]
    assert ends.ends == ["frame 0.5", "sess_a"]
    one = Observers((frames, Observer()))
    assert one.frame_sent == frames.frame_sent  # one observer: called directly
    assert "frame_sent" in HOOKS and "session_ended" in HOOKS


def test_a_report_derives_its_realtime_factor() -> None:
    report = SessionReport("s", "done", 1.0, 10, (0.04,) * 10, 1000, "")
    assert report.audio_seconds == pytest.approx(0.8)
    assert report.realtime_factor == pytest.approx(0.5)
    assert SessionReport("s", "done", 1.0, 0, (), None, "").realtime_factor is None
