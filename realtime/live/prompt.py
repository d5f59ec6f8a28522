"""What VoiceChat is opened with for a Live session: the instructions, the startup
history, and one ``delegate`` tool in VoiceChat's own tool format.

VoiceChat has one function channel and was trained on declared tools
(:func:`realtime.models.voicechat.tools.render_prompt`); the Live API hands work to the
application through delegations. So a Live session declares one tool: the model calls
``delegate`` when it wants the application to act, and the application's answer
(commentary, thinking, instructions) comes back on the tool-result channel
(:func:`realtime.models.base.context_feed`).
"""

from __future__ import annotations

from typing import Any, Final

from realtime.live.config import LiveConfig, history_text
from realtime.models.base import DELEGATE_TOOL
from realtime.models.voicechat.tools import render_prompt

DELEGATE: Final[dict[str, Any]] = {
    "name": DELEGATE_TOOL,
    "description": (
        "Hand a task to the application: anything you cannot do or know yourself (look "
        "something up, act, check). Its answer comes back as a tool result: relay a "
        "commentary to the user in your own words; thinking is for you only."
    ),
    "parameters": {
        "type": "object",
        "properties": {"task": {"type": "string", "description": "what to do, in a sentence"}},
        "required": ["task"],
    },
}


def system_prompt(config: LiveConfig) -> str | None:
    """The prompt the model reads before it hears the user."""
    parts = [config.instructions or ""]
    if config.history:
        parts.append("Conversation so far:\n" + history_text(config.history))
    text = "\n\n".join(p for p in parts if p)
    return render_prompt(text or None, [DELEGATE])
