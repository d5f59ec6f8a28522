"""The frame step's norms and rotary embeddings compiled (``mx.compile``), installed at load.

On MLX's CPU backend ``mx.fast.rms_norm``, ``mx.fast.layer_norm`` and ``mx.fast.rope``
run as their composite fallbacks, a chain of some ten elementwise and reduction nodes
each, and the frame step runs about four hundred of them (every language-model block,
every conformer block's six layer norms, the TTS backbone's four norms, query and key
norms and rotary embeddings per layer). A compiled function fuses each chain's
elementwise run into one ``Compiled...`` kernel; the reductions stay, so each value is
computed by the same operations in the same order, and on the CPU the bits are the
same (``tests/models/voicechat/test_fused.py`` checks every piece against its op-by-op call).

The pieces are installed by swapping each module's class for a subclass whose
``__call__`` runs one shared compiled function, with the module's weights passed as
inputs (one trace per input shape, shared by every layer of that width), so no
mlx-vlm or mlx-audio code is edited and the parameter tree is unchanged. Only a frame
step's shapes take the compiled path (one position along the sequence axis, float32):
a prefill's lengths vary and would trace anew for each, so they run op by op, as does
everything under :func:`unfused` (mlx-vlm's own streaming session, as the benchmarks
measure it) and under ``mx.disable_compile()`` (``--no-compile``).

Left as they are: modules that meet bfloat16 (the character encoder, the gated fusion,
the codec), and the MoG head, whose rounds are compiled whole
(:mod:`realtime.models.voicechat.codes`).
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import mlx.core as mx
import mlx.nn as nn
from mlx_vlm.models.gemma3.language import RMSNorm as OffsetOneRMSNorm
from mlx_vlm.models.nemotron_h.language import MambaRMSNormGated

FUSED_UNDER: Final = (
    "stt_model.llm.",
    "stt_model.perception.",
    "tts_model.tts_model.backbone.",
)
"""The model parts (by module name prefix) whose norms and rotary embeddings are
compiled: the ones that only meet float32 in a frame step."""

_bypass = 0


@contextlib.contextmanager
def unfused() -> Iterator[None]:
    """Every fused module runs its original, op-by-op call while the block runs."""
    global _bypass
    _bypass += 1
    try:
        yield
    finally:
        _bypass -= 1


def _frame(x: Any) -> bool:
    """Whether ``x`` is a frame step's input: one position, float32, not bypassed."""
    return not _bypass and x.ndim >= 3 and x.shape[-2] == 1 and x.dtype == mx.float32


TRACES: Final[Counter[str]] = Counter()
"""How many times each compiled function's Python body ran: once per trace (every call
under ``mx.disable_compile()``), so a test can tell that a frame step traced nothing."""


@mx.compile
def _layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
    TRACES["layer_norm"] += 1
    return mx.fast.layer_norm(x, weight, bias, eps)


@mx.compile
def _rms_norm(x: Any, weight: Any, eps: float) -> Any:
    TRACES["rms_norm"] += 1
    return mx.fast.rms_norm(x, weight, eps)


@mx.compile
def _offset_rms_norm(x: Any, weight: Any, eps: float) -> Any:
    # gemma3's RMSNorm: the weight is an offset from one.
    TRACES["offset_rms_norm"] += 1
    return mx.fast.rms_norm(x, 1.0 + weight, eps)


@mx.compile
def _gated_rms_norm(x: Any, gate: Any, weight: Any, eps: float, group: int) -> Any:
    # mlx-vlm's own call, on a stand-in holding the module's weight and constants.
    TRACES["gated_rms_norm"] += 1
    stand_in = types.SimpleNamespace(weight=weight, eps=eps, group_size=group)
    call: Any = MambaRMSNormGated.__call__
    return call(stand_in, x, gate)


@mx.compile
def _rope(x: Any, offset: Any, dims: int, traditional: bool, base: float, scale: float) -> Any:
    TRACES["rope"] += 1
    return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offset)


_layers: Any = nn  # mlx.nn's layer classes, untyped to mypy
LayerNorm: Any = _layers.LayerNorm
RMSNorm: Any = _layers.RMSNorm
RoPE: Any = _layers.RoPE


def _layer_norm_call(self: Any, x: Any) -> Any:
    if _frame(x):
        return _layer_norm(x, self.weight, self.bias, self.eps)
    return LayerNorm.__call__(self, x)


def _rms_norm_call(self: Any, x: Any) -> Any:
    if _frame(x):
        return _rms_norm(x, self.weight, self.eps)
    return RMSNorm.__call__(self, x)


def _offset_rms_norm_call(self: Any, x: Any) -> Any:
    if _frame(x):
        return _offset_rms_norm(x, self.weight, self.eps)
    call: Any = OffsetOneRMSNorm.__call__
    return call(self, x)


def _gated_rms_norm_call(self: Any, x: Any, gate: Any = None) -> Any:
    if gate is not None and _frame(x) and gate.dtype == mx.float32:
        return _gated_rms_norm(x, gate, self.weight, self.eps, self.group_size)
    return MambaRMSNormGated.__call__(self, x, gate)


def _rope_call(self: Any, x: Any, offset: Any = 0) -> Any:
    # The offset as an array (a batch's per-row offsets already are one): one trace
    # serves every position.
    if _frame(x):
        position = offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
        return _rope(x, position, self.dims, self.traditional, self.base, self.scale)
    return RoPE.__call__(self, x, offset)


def _fused_class(base: Any, call: Callable[..., Any]) -> Any:
    """A subclass of ``base`` (the same parameters) whose call is ``call``."""
    doc = f"``{base.__name__}``, compiled on a frame step's input (op by op otherwise)."
    return type(f"Fused{base.__name__}", (base,), {"__call__": call, "__doc__": doc})


FusedLayerNorm: Final = _fused_class(LayerNorm, _layer_norm_call)
FusedRMSNorm: Final = _fused_class(RMSNorm, _rms_norm_call)
FusedOffsetOneRMSNorm: Final = _fused_class(OffsetOneRMSNorm, _offset_rms_norm_call)
FusedMambaRMSNormGated: Final = _fused_class(MambaRMSNormGated, _gated_rms_norm_call)
FusedRoPE: Final = _fused_class(RoPE, _rope_call)

FUSED: Final[dict[Any, Any]] = {
    LayerNorm: FusedLayerNorm,
    RMSNorm: FusedRMSNorm,
    OffsetOneRMSNorm: FusedOffsetOneRMSNorm,
    MambaRMSNormGated: FusedMambaRMSNormGated,
    RoPE: FusedRoPE,
}
"""Each module class that is fused, and its fused subclass (the same parameters)."""


def _fusible(module: Any) -> bool:
    """Whether ``module`` has what its fused call passes (a layer norm's weight and bias,
    an RMS norm's weight; RoPE's ``base``)."""
    if isinstance(module, LayerNorm):
        return "weight" in module and "bias" in module
    if isinstance(module, RoPE):
        return module.base is not None
    return "weight" in module


def fuse(model: Any, prefixes: Sequence[str] = FUSED_UNDER) -> int:
    """Swap the class of every fusible module under ``prefixes`` (exactly one of
    :data:`FUSED`'s classes, not a subclass of it) for its fused subclass; how many."""
    wanted = tuple(prefixes)
    count = 0
    for name, module in model.named_modules():
        fused = FUSED.get(type(module))
        if fused is not None and f"{name}.".startswith(wanted) and _fusible(module):
            module.__class__ = fused
            count += 1
    return count


def _attention_shapes(model: Any, rows: int) -> Iterator[tuple[Any, tuple[int, ...]]]:
    """Each fused query/key norm and rotary embedding of the TTS backbone with the shape
    it meets in a frame step of ``rows`` rows."""
    for layer in model.tts_model.tts_model.backbone.layers:
        attn = layer.self_attn
        for norm, heads in ((attn.q_norm, attn.n_heads), (attn.k_norm, attn.n_kv_heads)):
            shape = (rows, heads, 1, attn.head_dim)
            yield norm, shape
            yield attn.rope, shape


def frame_inputs(model: Any, batch: int) -> list[tuple[Callable[..., Any], list[Any]]]:
    """Every fused module of ``model`` with zero inputs shaped as a frame step of
    ``batch`` conversations feeds it (the TTS steps two rows per conversation: guided
    and unguided), one per distinct trace."""
    calls: dict[tuple[Any, ...], tuple[Callable[..., Any], list[Any]]] = {}
    tts_rows = 2 * batch
    picked: list[tuple[Any, tuple[int, ...]]] = []
    for name, module in model.named_modules():
        if type(module) not in FUSED.values() or isinstance(module, FusedRoPE):
            continue
        if name.endswith(("q_norm", "k_norm")):
            continue
        rows = tts_rows if name.startswith("tts_model.") else batch
        picked.append((module, (rows, 1, module.weight.shape[0])))
    if isinstance(model.tts_model.tts_model.backbone.layers[0].self_attn.rope, FusedRoPE):
        picked.extend(_attention_shapes(model, tts_rows))
    for module, shape in picked:
        zeros = mx.zeros(shape)
        variants = [[zeros]]
        if isinstance(module, FusedMambaRMSNormGated):
            variants = [[zeros, zeros]]
        elif isinstance(module, FusedRoPE):
            # A batch's rows each at their own position: one offset per row (one
            # conversation's two TTS rows too, when it steps beside rows of other ages).
            variants.append([zeros, mx.zeros((shape[0],), dtype=mx.int32)])
        dims = tuple(getattr(module, k, None) for k in ("eps", "group_size", "dims", "base"))
        for inputs in variants:
            key = (type(module), dims, *(x.shape for x in inputs))
            calls.setdefault(key, (module, inputs))
    return list(calls.values())


def trace(model: Any, batch_sizes: Sequence[int]) -> None:
    """Trace and build every fused piece for frame steps of ``batch_sizes`` (at start,
    so that no conversation pays for it)."""
    for batch in batch_sizes:
        outputs = [module(*inputs) for module, inputs in frame_inputs(model, batch)]
        mx.eval(*outputs)
