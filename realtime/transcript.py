"""Live transcript printing shared by ``realtime generate --stream`` and the example
clients: one ``[channel] ...`` line that grows with each delta, a new line only
when the channel changes.

The model interleaves the user transcript, the assistant's text and the function
channel frame by frame; a line per run of one channel keeps them readable, and
empty deltas print nothing (no bare ``[assistant]`` line).
"""

from __future__ import annotations

import sys
from typing import Final, TextIO

CHANNELS: Final = ("user", "assistant", "function")


class TranscriptPrinter:
    """Writes text deltas as they arrive and keeps each channel's full text."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.channel: str | None = None
        self.texts: dict[str, str] = dict.fromkeys(CHANNELS, "")

    def write(self, channel: str, delta: str) -> None:
        """Add ``delta`` to ``channel``: continue its line, or start ``[channel] ``."""
        self.texts[channel] = self.texts.get(channel, "") + delta
        if not delta:
            return
        if channel != self.channel:
            if self.channel is not None:
                self.out.write("\n")
            self.out.write(f"[{channel}] ")
            self.channel = channel
            delta = delta.lstrip()  # a turn's first token may carry the word's space
        self.out.write(delta.replace("\n", " "))
        self.out.flush()

    def break_line(self) -> None:
        """End the open line (before another message); the next delta starts a new one."""
        if self.channel is not None:
            self.out.write("\n")
            self.out.flush()
            self.channel = None

    def finish(self) -> None:
        self.break_line()
