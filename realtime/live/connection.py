"""``/openai/v1/live/sessions``: the Live dialect's rules on the one session pipeline."""

from __future__ import annotations

from typing import ClassVar

from realtime.live.rules import LiveRules
from realtime.session.pipeline import Connection
from realtime.session.rules import DialectFactory


class LiveConnection(Connection):
    """Runs one client's Live session; ``run`` returns when it is over."""

    dialect: ClassVar[DialectFactory] = LiveRules.new
