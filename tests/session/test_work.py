"""The pipeline's backlog (realtime.session.work.Backlog) as a pure value."""

from __future__ import annotations

import numpy as np

from realtime.session import work


def audio(n: int) -> work.RunAudio:
    return work.RunAudio(0, np.zeros(n, np.float32), 16000, 0.0)


def test_the_backlog_owes_until_every_frame_and_event_is_out() -> None:
    b = work.Backlog(idle_from=0.0)
    b.accepted(audio(2560))
    assert b.owes() and b.idle_from is None and b.pending_samples == 2560
    b.submitted(1280)
    b.submitted(1280)
    b.audio_done(0)
    assert (b.pending_samples, b.inflight, b.queued) == (0, 2, 0)
    b.frame_back(1.0)
    b.event_queued()
    b.sending(1.1)
    assert b.sending_since == 1.1 and b.owes()
    b.frame_back(1.2)
    b.sent(1.3)
    assert not b.owes() and b.idle_from == 1.3 and b.sending_since is None


def test_a_dropped_append_returns_its_budget_and_work_finishes() -> None:
    b = work.Backlog(idle_from=0.0)
    b.accepted(audio(1280))
    b.accepted(work.FlushModel(pad_partial=True))
    b.audio_done(1280)  # never ran (e.g. no session open)
    assert b.pending_samples == 0 and b.queued == 1 and b.idle_from is None
    b.finished(2.0)
    assert not b.owes() and b.idle_from == 2.0
