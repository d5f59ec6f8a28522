"""One conversation's place in a batched frame step (its own module, below the stages
that take it: perception, the resident batch and the step itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from realtime.models.voicechat.keys import SessionKey


class StepRow:
    """One conversation's place in a batched frame: mlx-vlm's streaming session (its
    state), its random key and the frame to run."""

    __slots__ = ("frame", "inner", "key")

    def __init__(self, inner: Any, key: SessionKey, frame: Any) -> None:
        self.inner = inner
        self.key = key
        self.frame = frame


__all__ = ["StepRow"]
