"""EAR-TTS code generation, ours: the same draws and arithmetic as mlx-vlm's
``RVQEARTTSModel.generate_codes`` in a fraction of the graph.

Each frame the TTS refines its 31 residual codebooks in a few rounds (1, 1, 3, 4 and
22 codebooks): every round embeds the codes chosen so far, samples a residual from
the mixture-of-Gaussians head and quantizes it codebook by codebook. mlx-vlm embeds
the codes by indexing all 31 codebooks again every round (``depthsum_embedding``,
some 250 graph nodes) and rebuilds the code array from 31 slices each round; on this
CPU every node costs some 2-6 µs to run whatever its size (on an accelerator, a kernel
launch), so those bookkeeping nodes were most of the TTS step's time: 2 986 nodes
per frame on the tiny checkpoint, against 1 152 here (counted with ``mx.export_to_dot``).

What changes is only where sums are kept, never their order:

* the embedding of the codes so far is kept as a running sum, adding each chosen
  codebook row as it is chosen: mlx-vlm's ``depthsum_embedding`` adds rows in
  codebook order too, and every codebook not chosen yet adds its zero padding row,
  which leaves a float32 sum bit for bit unchanged (``x + 0.0 == x`` for every
  ``x`` except ``-0.0``, and a sum that starts at ``+0.0`` is never ``-0.0`` in
  round-to-nearest);
* each codebook's squared norms and transposed view are computed once per model,
  with the expressions mlx-vlm evaluates every round; the search works on 2-D vectors
  (MLX multiplies a 3-D array by a matrix as exactly that 2-D product) and doubles by
  ``p + p``, which is ``2.0 * p`` exactly, without broadcasting ``2.0``;
* the frame's full sum is the next frame's code embedding (:func:`previous_sums`),
  so the TTS's input needs no ``depthsum_embedding`` either.

tests/models/voicechat/test_codes.py holds it to mlx-vlm's ``generate_codes`` bit for bit.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar

import mlx.core as mx
from mlx_vlm.models.nemotron_voicechat.tts import _top_p_logits

T = TypeVar("T")


class Codebooks:
    """One TTS model's constants for :func:`generate_codes`: per codebook its rows,
    their transpose and squared norms (materialized once), the rounds' (start, count)
    plan, the dtype mlx-vlm's codes come out in, and the sum of the codec's silence
    (computed on first use)."""

    __slots__ = ("code_dtype", "norms", "plan", "rows", "silence", "transposed", "tts")

    def __init__(self, tts: Any) -> None:

        config = tts.config
        self.tts = tts
        self.rows = [tts.rvq_embs[i] for i in range(config.num_quantizers)]
        # (1, codebook size): one vector's distances subtract them with no broadcast;
        # for more vectors MLX broadcasts a view (the values are the same either way).
        self.norms = [mx.sum(rows * rows, axis=-1)[None] for rows in self.rows]
        self.transposed = [rows.T for rows in self.rows]
        self.plan = rounds(config.num_quantizers, config.num_iterations, config.exponent)
        self.code_dtype = _code_dtype(self.plan, config.num_quantizers)
        self.silence: tuple[Any, Any] | None = None
        mx.eval(*self.rows, *self.norms, *self.transposed)

    def silence_sum(self, tokens: Any) -> Any:
        """The code embedding sum of the codec's silence ``tokens`` (one per codebook)."""

        if self.silence is None or self.silence[0] is not tokens:
            total = self.tts.depthsum_embedding(tokens[None, None, :])
            mx.eval(total)
            self.silence = (tokens, total)
        return self.silence[1]


def rounds(quantizers: int, iterations: int, exponent: float) -> list[tuple[int, int]]:
    """The (first codebook, how many) of each refinement round that quantizes any:
    the masking schedule ``ceil((1 - r**e)**(1/e) * quantizers)`` at ``r = i/iterations``,
    EAR-TTS's, with the empty rounds left out (mlx-vlm skips them too)."""
    masked = [
        math.ceil(((1.0 - (i / iterations) ** exponent) ** (1.0 / exponent)) * quantizers)
        for i in range(iterations)
    ]
    out: list[tuple[int, int]] = []
    start = 0
    for i, still in enumerate(masked):
        count = still - (masked[i + 1] if i + 1 < len(masked) else 0)
        if count:
            out.append((start, count))
            start += count
    return out


def _code_dtype(plan: Sequence[tuple[int, int]], quantizers: int) -> Any:
    """The dtype mlx-vlm's codes end in: it stacks the codes still masked (int32 at
    first) with each round's argmin (uint32), so MLX's promotion decides."""

    dtype = mx.int32
    for _, count in plan:
        if count == quantizers:
            dtype = mx.uint32
        else:
            dtype = mx.stack([mx.zeros((1,), dtype=dtype), mx.zeros((1,), dtype=mx.uint32)]).dtype
    return dtype


class PerModel(Generic[T]):
    """A value built once per loaded module (``build(module)``), e.g. a model's
    constants. Kept by the module's id with the module itself, checked by identity
    (MLX modules are dicts, so they cannot be weak keys; the entry keeps its module
    alive, as the process keeps its model)."""

    __slots__ = ("_build", "_values")

    def __init__(self, build: Callable[[Any], T]) -> None:
        self._build = build
        self._values: dict[int, tuple[Any, T]] = {}

    def __call__(self, module: Any) -> T:
        entry = self._values.get(id(module))
        if entry is None or entry[0] is not module:
            entry = (module, self._build(module))
            self._values[id(module)] = entry
        return entry[1]


codebooks: Final = PerModel(Codebooks)
"""A TTS model's :class:`Codebooks`, built on first use."""


class Compiled:
    """One TTS model's refinement rounds for :func:`generate_codes`, each compiled
    (``mx.compile``): the code embedding, the MoG head with its guidance mix, the
    residual and the round's codebook search. A round's shapes are fixed for a batch
    size, so MLX traces it once per batch size (its compile cache is keyed by the
    inputs' shapes: one entry per bucket) and replays the fused graph every frame.
    The weights are captured as constants of the trace; they never change after
    loading (:mod:`realtime.models.voicechat.cast` runs first). The draws stay
    outside, in the order the head and mlx-vlm draw them, so the keys advance exactly
    as before. ``mx.disable_compile()`` (``--no-compile``) runs the same functions op
    by op: the same bits, a larger graph."""

    __slots__ = ("rounds",)

    def __init__(self, tts: Any) -> None:

        books = codebooks(tts)
        self.rounds: list[Callable[..., list[Any]]] = [
            mx.compile(functools.partial(_round, tts, books, start, count))
            for start, count in books.plan
        ]


compiled: Final = PerModel(Compiled)
"""A TTS model's :class:`Compiled` rounds, traced on first use of each batch size."""


def _round(
    tts: Any,
    books: Codebooks,
    start: int,
    count: int,
    total: Any,
    conditional: Any,
    unconditional: Any,
    uniform: Any,
    noise: Any,
) -> list[Any]:
    """One refinement round: the MoG head's ``infer`` on the codes so far (its
    component drawn with ``uniform``), the residual with ``noise``, and each of the
    round's codebooks' nearest row to what is left of it, taken off it and added to
    ``total``. Returns the new ``total``, then each codebook's pick."""

    config = tts.config
    head = tts.mog_head
    rows, frames = conditional.shape[:2]
    embedded = tts.embed_code(total.reshape(rows, frames, -1))
    x = mx.concatenate([embedded + conditional, embedded + unconditional], axis=0)
    for layer in head.mlp_stack:
        x = layer(x)
    if config.guidance_scale > 0.0:
        cond, uncond = x[:rows], x[rows:]
        x = cond + config.guidance_scale * (cond - uncond)
    logits = _top_p_logits(head.proj_logits(x), config.top_p)
    gumbel = -mx.log(-mx.log(uniform + 1e-8) + 1e-8)
    component = mx.argmax(mx.log(mx.softmax(logits.astype(mx.float32), axis=-1)) + gumbel, axis=-1)
    flat_x = x.reshape(-1, x.shape[-1])
    flat_component = component.reshape(-1)
    mus = head.proj_mus.weight.reshape(head.num_predictions, head.low_rank, -1)[flat_component]
    mu = mx.matmul(mus, flat_x[..., None]).squeeze(-1)
    mu = mx.matmul(head.low_mat[flat_component], mu[..., None]).squeeze(-1)
    logs = mx.maximum(head.proj_logs(x), head.min_log_std)
    mu = mu.reshape(rows, frames, head.out_size) * mx.exp(logs) + head.proj_else(x)
    residual = mu + mx.exp(logs) * noise * config.noise_scale
    # (rows, frames, latent) as rows*frames vectors: MLX multiplies a 3-D array by a
    # matrix as exactly this 2-D product, without its reshapes every codebook.
    residual = residual.reshape(rows * frames, -1)
    picks = []
    for book in range(start, start + count):
        product = mx.matmul(residual, books.transposed[book])
        # product + product: 2.0 * product exactly, without broadcasting 2.0.
        picked = mx.argmin(books.norms[book] - (product + product), axis=-1)
        row = books.rows[book][picked]
        residual = residual - row
        total = total + row
        picks.append(picked)
    return [total, *picks]


def compile_rounds(tts: Any, batch_sizes: Sequence[int]) -> None:
    """Trace and build :class:`Compiled`'s rounds for each of ``batch_sizes`` rows (one
    frame each): a throwaway key per row, the codes of zero hidden states, evaluated
    (the fused kernels are built when first run)."""

    from realtime.models.voicechat.keys import SessionKey, drawing_rows

    width = tts.mog_head.proj_logits.weight.shape[-1]
    for rows in batch_sizes:
        with drawing_rows([SessionKey(row) for row in range(rows)]):
            mx.eval(*generate_codes(tts, mx.zeros((2 * rows, 1, width))))


def generate_codes(tts: Any, hidden: Any) -> tuple[Any, Any]:
    """The codes for ``hidden`` (all conditional rows, then all unconditional ones, as
    mlx-vlm's ``generate_codes`` takes it) and their code embedding's input sum (what
    ``depthsum_embedding`` gives for them), drawing from the running keys."""

    from realtime.models.voicechat.keys import normal, uniform

    config = tts.config
    if hidden.shape[0] % 2:
        raise ValueError("guided generation takes conditional and unconditional rows")
    half = hidden.shape[0] // 2
    conditional, unconditional = hidden[:half], hidden[half:]
    books = codebooks(tts)
    rows, frames = conditional.shape[:2]
    total = mx.zeros((rows * frames, config.latent_size))
    chosen: list[Any] = []
    head = tts.mog_head
    for refine in compiled(tts).rounds:
        # The head's component draw, then the residual's (mlx-vlm's order).
        drawn = uniform((rows, frames, head.num_predictions))
        noise = normal((rows, frames, head.out_size))
        total, *picks = refine(total, conditional, unconditional, drawn, noise)
        chosen.extend(picks)
    codes = mx.stack(chosen, axis=-1).reshape(rows, frames, -1)
    return codes.astype(books.code_dtype), total.reshape(rows, frames, -1)


_SUMS: Final[weakref.WeakKeyDictionary[Any, tuple[Any, Any]]] = weakref.WeakKeyDictionary()
"""Per mlx-vlm streaming session: (the codes its last frame spoke, their sum)."""


def remember(inner: Any, codes: Any, total: Any) -> None:
    """Keep ``total`` as the code embedding sum of ``codes``, the codes ``inner`` will
    read as its previous ones next frame (``inner._previous_code is codes``)."""
    _SUMS[inner] = (codes, total)


def previous_sums(
    tts: Any, inners: Sequence[Any], codes: Sequence[Any | None], silence: Any
) -> Any:
    """The code embedding sums of each row's previous ``codes``, rows stacked: the one
    :func:`remember` kept when that is still the row's code (checked by identity, so a
    code set anywhere else, an opening's or a tool response's, is summed afresh), the
    sum of the codec's ``silence`` tokens for ``None`` (a row whose text ended its
    turn speaks silence next), else ``depthsum_embedding``."""

    books = codebooks(tts)
    parts = []
    for inner, code in zip(inners, codes, strict=True):
        kept = _SUMS.get(inner)
        if code is None:
            parts.append(books.silence_sum(silence))
        elif kept is not None and kept[0] is code:
            parts.append(kept[1])
        else:
            parts.append(tts.depthsum_embedding(code))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)


class _CodecTable:
    """A codec quantizer's codebooks stacked into one table, with the index of each
    codebook's first row there, so one gather reads every codebook's row for a frame."""

    __slots__ = ("offsets", "table")

    def __init__(self, prvq: Any) -> None:

        means = prvq.mus_list
        self.table = mx.concatenate(means, axis=0)
        self.offsets = (mx.arange(len(means)) * means[0].shape[0])[None, :, None]
        mx.eval(self.table, self.offsets)


_codec_table: Final = PerModel(_CodecTable)


def codec_latents(prvq: Any, codes: Any) -> Any:
    """The codec's latents for ``codes`` (rows, codebooks, frames): bit for bit its
    quantizer's ``decode``, which adds the codebooks' rows one by one in codebook
    order (some 150 graph nodes a frame). Here one gather and one cumulative sum
    along the codebooks, MLX's CPU scan adding in that same order; ``+ 0.0`` first
    makes a leading ``-0.0`` what ``0.0 + (-0.0)`` gives. Codebooks that are not
    float32 (where a scan's accumulator could be wider than its element), and any
    device but the CPU (an accelerator's scan may add in another order), take the
    quantizer's own ``decode``."""

    if (
        prvq.mus_list[0].dtype != mx.float32
        or codes.shape[1] != len(prvq.mus_list)
        or mx.default_device() != mx.cpu
    ):
        return prvq.decode(codes)
    table = _codec_table(prvq)
    rows = table.table[codes + table.offsets]
    return mx.cumsum(rows + 0.0, axis=1)[:, -1]
