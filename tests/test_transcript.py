"""realtime.transcript: the printed lines of a live transcript."""

from __future__ import annotations

import io

from realtime.transcript import TranscriptPrinter


def test_a_turns_first_delta_loses_its_leading_space() -> None:
    """A turn's first token may carry its word's space (" Hello"); the line does not."""
    out = io.StringIO()
    printer = TranscriptPrinter(out)
    for channel, delta in [("assistant", " Hi"), ("assistant", " there"), ("user", " Yes")]:
        printer.write(channel, delta)
    printer.finish()
    assert out.getvalue() == "[assistant] Hi there\n[user] Yes\n"
    assert printer.texts["assistant"] == " Hi there"  # the channel's text stays as sent
