"""The WebSocket close codes the server uses, what each one means to a client, and
the close decision both dialects' state machines hand the plumbing.

One table for both dialects' state machines, the plumbing and the client library.
"""

from __future__ import annotations

from typing import Final

import attrs


@attrs.frozen(slots=True)
class Close:
    """Close the WebSocket with ``code`` after every event already queued, or at once
    (``now``: the client stopped reading; release first, then close). A close ``now``
    may follow one already decided: the client read nothing while it waited."""

    code: int
    reason: str
    now: bool = False


CLOSE_NORMAL: Final = 1000
"""The session ended as asked: committed and answered, or cancelled."""
CLOSE_GOING_AWAY: Final = 1001
"""The server is shutting down (after its drain)."""
CLOSE_POLICY: Final = 1008
"""A timeout (configure, idle) or a client that stopped reading."""
CLOSE_TOO_BIG: Final = 1009
"""A message far over the size limit (cut off by Hypercorn)."""
CLOSE_INTERNAL: Final = 1011
"""The model failed or the engine stopped."""
CLOSE_TRY_AGAIN: Final = 1013
"""Another session holds this server's one slot."""

CLOSE_CODE_NAMES: Final = {
    CLOSE_NORMAL: "normal closure",
    CLOSE_GOING_AWAY: "going away",
    CLOSE_POLICY: "policy violation (timeout or limit)",
    CLOSE_TOO_BIG: "message too big",
    CLOSE_INTERNAL: "server error",
    CLOSE_TRY_AGAIN: "server busy, try again later",
}
