"""A random key of its own for each VoiceChat session, so sessions sharing one model
(and one engine thread) never change each other's audio.

mlx-vlm's TTS samples with MLX's global key (``mx.random.uniform`` in the MoG head's
``infer`` and ``mx.random.normal`` in ``generate_codes``, mlx_vlm
``models/nemotron_voicechat/tts.py``), seeded by ``mx.random.seed(seed)`` when a
streaming session opens. Two sessions stepped in turn draw from that one sequence,
so each one's codes depend on the other's frames (measured: 10 of 12 audio frames
differed; the text channels are greedy and stayed equal). MLX's key cannot be saved
and put back (``mx.random.state`` takes no assignment), so instead each session
keeps its own key and the TTS module draws from whichever session is running.

The adaptation is at its narrowest point: mlx-vlm's ``tts`` module gets a namespace
that is ``mlx.core`` in every name except ``random``, whose ``uniform`` and
``normal`` take the running session's next key (``split`` per draw, exactly how MLX
advances its global key, so a session alone gets bit for bit what mlx-vlm gives it).
With no session running (mlx-vlm's own offline ``generate``) they draw from the
global key as before. mlx-vlm's module is otherwise untouched, and nothing is
forked. It goes away once mlx-vlm takes a key per streaming session (a ``key=``
through ``MoGHead.infer`` and ``generate_codes``, kept on the session).

In a batched step the rows' keys are stacked for the step (:class:`RowKeys`) and every
draw is one vmapped call of MLX's own: one ``split`` of all the rows' keys and one draw
with each row's new key (MLX's ``RandomBits`` takes a batch of keys under ``vmap`` and
gives each key what it gives alone), where drawing row by row put some six graph nodes
a row into every draw (at 8 rows, some 280 of a tiny frame's 3 200 nodes; on an
accelerator, as many kernel launches). tests/models/voicechat/test_step.py holds each
row to its own draw alone, bit for bit.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import mlx.core as mx
from mlx_vlm.models.nemotron_voicechat import tts as vlm_tts

_RUNNING: Final = threading.local()
"""The key of the session now running on this thread (MLX work is per thread), or the
keys of the rows of a batched step, one per conversation in batch order."""

_MARK: Final = "_realtime_session_keys"


class SessionKey:
    """One session's random sequence: ``mx.random.key(seed)``, split once per draw."""

    __slots__ = ("_key",)

    def __init__(self, seed: int) -> None:

        self._key: Any = mx.random.key(seed)

    def next(self) -> Any:
        """The key for one draw; the sequence moves on (MLX's ``KeySequence.next``)."""

        self._key, sub = mx.random.split(self._key)
        return sub


def _enter(running: SessionKey | RowKeys) -> SessionKey | RowKeys | None:
    """Make ``running`` the thread's drawing key(s); return the previous ones, whose
    stacked rows (if any) first take their keys back."""
    previous: SessionKey | RowKeys | None = getattr(_RUNNING, "key", None)
    if isinstance(previous, RowKeys):
        previous.close()
    _RUNNING.key = running
    return previous


@contextmanager
def drawing_from(key: SessionKey) -> Iterator[None]:
    """Run the enclosed model calls with ``key`` as the TTS's random sequence."""
    previous = _enter(key)
    try:
        yield
    finally:
        _RUNNING.key = previous


class RowKeys:
    """The keys of a batched step's rows, stacked while they draw: each draw splits all
    of them at once, as each row's :meth:`SessionKey.next` would. The stack is made at
    the first draw and each row takes its advanced key back at :meth:`close` (the end
    of the draws, or a nested drawing context, which then draws from the rows' own
    keys)."""

    __slots__ = ("_keys", "_stacked")

    def __init__(self, keys: Sequence[SessionKey]) -> None:
        self._keys = tuple(keys)
        self._stacked: Any = None

    def __len__(self) -> int:
        return len(self._keys)

    def next(self) -> Any:
        """Every row's key for one draw, (rows, 2); each row's sequence moves on."""

        if self._stacked is None:
            self._stacked = mx.stack([key._key for key in self._keys])
        pairs = _split_rows()(self._stacked)
        self._stacked = pairs[:, 0]
        return pairs[:, 1]

    def close(self) -> None:
        if self._stacked is not None:
            for row, key in enumerate(self._keys):
                key._key = self._stacked[row]
            self._stacked = None


@functools.cache
def _split_rows() -> Callable[[Any], Any]:
    """``mx.random.split`` over a stack of keys, each split as it would be alone."""

    return mx.vmap(lambda key: mx.random.split(key))


@contextmanager
def drawing_rows(keys: Sequence[SessionKey]) -> Iterator[None]:
    """Run the enclosed model calls over a batch of rows, one conversation each: a draw
    whose first dimension is the batch gives each row what it alone would have drawn
    with its own key, so a conversation's audio never depends on who shares its
    batch."""
    if len(keys) == 1:
        with drawing_from(keys[0]):
            yield
        return
    rows = RowKeys(keys)
    previous = _enter(rows)
    try:
        yield
    finally:
        _RUNNING.key = previous
        rows.close()


def _keyed(draw: Callable[..., Any], shape_at: int) -> Callable[..., Any]:
    """``draw`` taking the running key(s); its shape is keyword ``shape`` or positional
    argument ``shape_at`` (``uniform(low, high, shape)``, ``normal(shape)``)."""

    def keyed_draw(*args: Any, **kwargs: Any) -> Any:
        key: SessionKey | RowKeys | None = getattr(_RUNNING, "key", None)
        if key is None or kwargs.get("key") is not None:
            return draw(*args, **kwargs)
        if isinstance(key, SessionKey):
            kwargs["key"] = key.next()
            return draw(*args, **kwargs)

        args_list = list(args)
        if "shape" in kwargs:
            shape = tuple(kwargs["shape"])
        elif len(args_list) > shape_at:
            shape = tuple(args_list[shape_at])
        else:
            raise RuntimeError(f"a batched {draw.__name__} draw must give its shape")
        if not shape or shape[0] != len(key):
            raise RuntimeError(
                f"a {draw.__name__} draw of shape {shape} in a batch of {len(key)} rows"
            )
        row_shape = (1, *shape[1:])
        if "shape" in kwargs:
            kwargs["shape"] = row_shape
        else:
            args_list[shape_at] = row_shape

        def row_draw(row_key: Any) -> Any:
            return draw(*args_list, **kwargs, key=row_key)

        # One draw for every row, each with its own key (MLX's bits take a batch of
        # keys under vmap; the rest of a draw is element by element).
        return mx.vmap(row_draw)(key.next()).reshape(shape)

    keyed_draw.__name__ = draw.__name__
    keyed_draw.__doc__ = draw.__doc__
    return keyed_draw


def _namespace(module: types.ModuleType, **replace: Any) -> types.SimpleNamespace:
    names = {name: getattr(module, name) for name in dir(module) if not name.startswith("__")}
    names.update(replace)
    return types.SimpleNamespace(**names)


def install(tts_module: types.ModuleType) -> None:
    """Give mlx-vlm's TTS module its keyed ``mx`` (once; idempotent)."""
    if getattr(tts_module, _MARK, False):
        return

    current = getattr(tts_module, "mx", None)
    if current is not mx:
        raise RuntimeError(
            f"{tts_module.__name__}.mx is not mlx.core; mlx-vlm changed how its TTS "
            "imports MLX, and per-session random keys need a new adaptation"
        )
    random = _namespace(
        mx.random,
        uniform=_keyed(mx.random.uniform, shape_at=2),
        normal=_keyed(mx.random.normal, shape_at=0),
    )
    setattr(tts_module, "mx", _namespace(mx, random=random))  # noqa: B010
    setattr(tts_module, _MARK, True)


def install_voicechat() -> None:
    """:func:`install` on mlx-vlm's VoiceChat TTS module."""

    install(vlm_tts)


def uniform(shape: Sequence[int]) -> Any:
    """A uniform draw on [0, 1) of ``shape`` from the running key(s), exactly as the
    TTS module's own ``mx.random.uniform(shape=shape)`` draws (the MoG head's component,
    realtime/models/voicechat/codes.py)."""

    return _keyed(mx.random.uniform, shape_at=2)(shape=tuple(shape))


def normal(shape: Sequence[int]) -> Any:
    """A standard-normal draw of ``shape`` from the running key(s), exactly as the
    TTS module's own ``mx.random.normal(shape)`` draws (for the frame step's code
    generation, realtime/models/voicechat/codes.py)."""

    return _keyed(mx.random.normal, shape_at=0)(tuple(shape))
