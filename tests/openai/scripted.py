"""The OpenAI tests' scripted conversation: :func:`realtime.testing.fake.partner` replies,
plus a tool call on the function channel (no weights)."""

from __future__ import annotations

from collections import deque

import attrs
import numpy as np

from realtime.models.base import Samples
from realtime.testing.fake import VOICED_RMS, Cue, FakeModel, Reply, Scene, partner, say

CALL = '<SPECIAL_20>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<SPECIAL_21>'


def call_then_say(*tokens: str | None) -> Reply:
    """A tool call on the function channel (in three pieces), a pad, then speech."""
    pieces = (CALL[:20], CALL[20:50], CALL[50:])
    return Reply((*(Cue(function=p) for p in pieces), Cue(), *say(*tokens).cues))


def scripted(*replies: Reply) -> FakeModel:
    """A fake model that answers each time the user goes quiet with the next reply."""
    return FakeModel(partner(replies), model_id="scripted-voicechat", path=None)


INTERJECT_AFTER = 2
"""Voiced frames the talking-over model hears before it interjects."""


def talking_over(interjection: Reply, *replies: Reply) -> FakeModel:
    """:func:`scripted`, but the model also says ``interjection`` over the user's voice
    (after ``INTERJECT_AFTER`` voiced frames of each user turn): what the demo
    checkpoint does with noise, and what a turn-taking rule must not mistake for the
    answer the client asked for."""
    options = partner(replies)
    answers = options.scene
    assert answers is not None

    def scene() -> Scene:
        answer = answers()
        voiced = 0
        playing: deque[Cue] = deque()

        def cue(index: int, heard: Samples) -> Cue:
            nonlocal voiced
            said = answer(index, heard)
            if float(np.sqrt(np.mean(np.square(heard, dtype=np.float64)))) > VOICED_RMS:
                voiced += 1
                if voiced == INTERJECT_AFTER:
                    playing.extend(interjection.cues)
            else:
                voiced = 0
            if not playing:
                return said
            return attrs.evolve(playing.popleft(), transcript=said.transcript)

        return cue

    return FakeModel(attrs.evolve(options, scene=scene), model_id="scripted-voicechat", path=None)
