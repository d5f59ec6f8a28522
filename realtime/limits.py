"""Per-connection limits, shared by the CLI, the app and the connection lifecycle."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class Limits:
    max_message_bytes: int = 4 * 1024 * 1024
    """Largest client message; larger ones get an ``invalid_request`` error."""
    max_pending_audio_seconds: float = 20.0
    """Input audio accepted but not yet run by the model; more is refused."""
    configure_timeout: float = 30.0
    """No ``session.update`` within this many seconds: error and close 1008."""
    idle_timeout: float = 120.0
    """No client message for this many seconds: close 1008."""
    send_timeout: float = 10.0
    """A client that reads nothing for this long while events wait is dropped (1008)."""
    send_queue_events: int = 256
    """Outgoing events buffered per connection before the model waits for the client."""
