"""One conversation's place in a batched frame step (its own module, below the stages
that take it: perception, the frame batch and the step itself)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from realtime.models.voicechat.keys import SessionKey


class Holder(Protocol):
    """What holds a seat's rows: the frame batch (:mod:`realtime.models.voicechat.batch`),
    named here by what a seat asks of it, so this module names no stage above it."""

    def release(self, seats: Sequence[Seat]) -> None: ...


class Seat:
    """A conversation's handle on the frame batch that holds its state: its mlx-vlm
    streaming session and that batch (None: its own caches are current). A session
    keeps one for its life (``lasting``); every path that reads the session's own
    caches alone calls :meth:`release` first."""

    __slots__ = ("batch", "inner", "lasting")

    def __init__(self, inner: Any, *, lasting: bool = True) -> None:
        self.inner = inner
        self.batch: Holder | None = None
        self.lasting = lasting
        """False: a row made for one call (it never joins a batch, which would hold
        it past the call)."""

    def release(self) -> None:
        """Write this conversation's rows back to its own caches and leave its batch."""
        if self.batch is not None:
            self.batch.release([self])


class StepRow:
    """One conversation's place in a batched frame: mlx-vlm's streaming session (its
    state), its random key, the frame to run and its :class:`Seat` (a row given none
    gets one for this call only)."""

    __slots__ = ("frame", "key", "seat")

    def __init__(self, inner: Any, key: SessionKey, frame: Any, seat: Seat | None = None) -> None:
        self.seat = Seat(inner, lasting=False) if seat is None else seat
        self.key = key
        self.frame = frame

    @property
    def inner(self) -> Any:
        return self.seat.inner


__all__ = ["Seat", "StepRow"]
