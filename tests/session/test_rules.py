"""The seam a dialect implements: each dialect has exactly the capabilities it uses."""

from __future__ import annotations

import pytest

from realtime.limits import Limits
from realtime.native.connection import NativeRules
from realtime.openai.connection import OpenAIRules
from realtime.session.rules import (
    CountsText,
    EndsTurns,
    FeedsTools,
    Rules,
    WatchesWrites,
    lacking,
)
from realtime.session.work import FlushModel
from realtime.testing.fake import FakeModel

CAPABILITIES = (EndsTurns, FeedsTools, CountsText, WatchesWrites)


def _has(rules: Rules) -> set[str]:
    return {c.__name__ for c in CAPABILITIES if isinstance(rules, c)}


def test_each_dialect_implements_only_what_it_uses() -> None:
    model = FakeModel()
    native = NativeRules.new(model, Limits(), 0.0)
    openai = OpenAIRules.new(model, Limits(), 0.0)
    assert _has(native) == {"EndsTurns"}  # commit and cancel; no tools, no counting
    assert _has(openai) == {"FeedsTools", "CountsText", "WatchesWrites"}
    for rules in (native, openai):
        for name in ("flushed", "cancelled", "fed", "counted", "sending", "sent"):
            # A capability it lacks is absent, not a method that raises.
            assert hasattr(rules, name) == any(
                name in vars(c) and isinstance(rules, c) for c in CAPABILITIES
            )


def test_work_a_dialect_cannot_answer_is_named_as_its_bug() -> None:
    openai = OpenAIRules.new(FakeModel(), Limits(), 0.0)
    with pytest.raises(TypeError, match="OpenAIRules handed out FlushModel but does not"):
        lacking(openai, FlushModel(pad_partial=False), EndsTurns)
