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

In a batched step each row draws with its own key; a plain draw (a shape and nothing
else, as the TTS's are) takes each row's raw bits from MLX (``split(key, num)`` is
``bits``) and turns all rows' bits into samples with one chain of MLX's own
operations (``_FROM_BITS``), instead of one chain per row: at 8 rows that was some 800
of the frame's graph nodes. tests/test_voicechat_step.py holds each row to its own
draw alone, bit for bit.
"""

from __future__ import annotations

import math
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import numpy as np

_RUNNING: Final = threading.local()
"""The key of the session now running on this thread (MLX work is per thread), or the
keys of the rows of a batched step, one per conversation in batch order."""

_MARK: Final = "_realtime_session_keys"


class SessionKey:
    """One session's random sequence: ``mx.random.key(seed)``, split once per draw."""

    __slots__ = ("_key",)

    def __init__(self, seed: int) -> None:
        import mlx.core as mx

        self._key: Any = mx.random.key(seed)

    def next(self) -> Any:
        """The key for one draw; the sequence moves on (MLX's ``KeySequence.next``)."""
        import mlx.core as mx

        self._key, sub = mx.random.split(self._key)
        return sub


@contextmanager
def drawing_from(key: SessionKey) -> Iterator[None]:
    """Run the enclosed model calls with ``key`` as the TTS's random sequence."""
    previous = getattr(_RUNNING, "key", None)
    _RUNNING.key = key
    try:
        yield
    finally:
        _RUNNING.key = previous


@contextmanager
def drawing_rows(keys: Sequence[SessionKey]) -> Iterator[None]:
    """Run the enclosed model calls over a batch of rows, one conversation each: a draw
    whose first dimension is the batch gives each row what it alone would have drawn
    with its own key (drawn row by row, then stacked), so a conversation's audio never
    depends on who shares its batch."""
    if len(keys) == 1:
        with drawing_from(keys[0]):
            yield
        return
    previous = getattr(_RUNNING, "key", None)
    _RUNNING.key = tuple(keys)
    try:
        yield
    finally:
        _RUNNING.key = previous


def _uniform_from_bits(bits: Any, low: float, high: float) -> Any:
    """MLX's float32 ``uniform(low, high)`` applied to raw ``bits`` (uint32): the
    operations of ``random::uniform`` in MLX's mlx/random.cpp, in its order, so a
    sample is bit for bit the one MLX draws from the same bits."""
    import mlx.core as mx

    lo = mx.array(low, dtype=mx.float32)
    span = mx.array(high, dtype=mx.float32) - lo
    out = bits / mx.array(np.iinfo(np.uint32).max, dtype=mx.float32)
    out = mx.minimum(out, mx.array(np.nextafter(np.float32(1.0), np.float32(0.0))))
    return span * out + lo


def _normal_from_bits(bits: Any) -> Any:
    """MLX's float32 standard ``normal`` applied to raw ``bits``: ``random::normal``
    (mlx/random.cpp), ``sqrt(2) * erfinv(uniform(nextafter(-1, 0), 1))``."""
    import mlx.core as mx

    low = float(np.nextafter(np.float32(-1.0), np.float32(0.0)))
    samples = mx.erfinv(_uniform_from_bits(bits, low, 1.0))
    return mx.array(math.sqrt(2.0), dtype=mx.float32) * samples


_FROM_BITS: Final[dict[str, Callable[[Any], Any]]] = {
    "uniform": lambda bits: _uniform_from_bits(bits, 0.0, 1.0),
    "normal": _normal_from_bits,
}
"""How a plain float32 draw (no bounds, dtype, loc or scale given) turns bits into
samples, per draw: what lets a batch draw each row's bits with its own key and turn
them into samples once for all rows."""


def _row_bits(key: Any, shape: tuple[int, ...]) -> Any:
    """The uint32 bits MLX's ``bits(shape, key)`` gives: ``split(key, num=n)`` is
    ``bits((n, 2), key)``, and the bits depend on the shape only through its size."""
    import mlx.core as mx

    return mx.random.split(key, num=math.prod(shape) // 2).reshape(shape)


def _keyed(draw: Callable[..., Any], shape_at: int) -> Callable[..., Any]:
    """``draw`` taking the running key(s); its shape is keyword ``shape`` or positional
    argument ``shape_at`` (``uniform(low, high, shape)``, ``normal(shape)``)."""

    def keyed_draw(*args: Any, **kwargs: Any) -> Any:
        key: SessionKey | tuple[SessionKey, ...] | None = getattr(_RUNNING, "key", None)
        if key is None or kwargs.get("key") is not None:
            return draw(*args, **kwargs)
        if isinstance(key, SessionKey):
            kwargs["key"] = key.next()
            return draw(*args, **kwargs)
        import mlx.core as mx

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
        # Plain: the shape alone, by keyword or as the only positional argument.
        plain = (not args_list and set(kwargs) == {"shape"}) or (
            shape_at == 0 and len(args_list) == 1 and not kwargs
        )
        convert = _FROM_BITS.get(draw.__name__)
        if plain and convert is not None and math.prod(row_shape) % 2 == 0:
            # Each row's bits from its own key, turned into samples once for all.
            bits = [_row_bits(row_key.next(), row_shape) for row_key in key]
            return convert(mx.concatenate(bits, axis=0))
        parts = []
        for row_key in key:
            if "shape" in kwargs:
                kwargs["shape"] = row_shape
            else:
                args_list[shape_at] = row_shape
            parts.append(draw(*args_list, **kwargs, key=row_key.next()))
        return mx.concatenate(parts, axis=0)

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
    import mlx.core as mx

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
    from mlx_vlm.models.nemotron_voicechat import tts

    install(tts)


def normal(shape: Sequence[int]) -> Any:
    """A standard-normal draw of ``shape`` from the running key(s), exactly as the
    TTS module's own ``mx.random.normal(shape)`` draws (for the frame step's code
    generation, realtime/models/voicechat_codes.py)."""
    import mlx.core as mx

    return _keyed(mx.random.normal, shape_at=0)(tuple(shape))
