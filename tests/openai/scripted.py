"""The OpenAI tests' scripted conversation: :func:`realtime.models.fake.partner` replies,
plus a tool call on the function channel (no weights)."""

from __future__ import annotations

from realtime.models.fake import Cue, FakeModel, Reply, partner, say

CALL = '<SPECIAL_20>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<SPECIAL_21>'


def call_then_say(*tokens: str | None) -> Reply:
    """A tool call on the function channel (in three pieces), a pad, then speech."""
    pieces = (CALL[:20], CALL[20:50], CALL[50:])
    return Reply((*(Cue(function=p) for p in pieces), Cue(), *say(*tokens).cues))


def scripted(*replies: Reply) -> FakeModel:
    """A fake model that answers each time the user goes quiet with the next reply."""
    return FakeModel(partner(replies), model_id="scripted-voicechat", path=None)
