"""VoiceChat's frame step, ours: one 80 ms frame of one or many conversations at once.

mlx-vlm's ``VoiceChatStreamingSession`` steps one conversation per call and waits on
the device at every stage (perception, each text and function token, the TTS codes,
the codec's samples). This step runs the same network — mlx-vlm's loaded
modules and weights, called stage by stage — over a batch of rows, one per
conversation, with the state of each row kept where mlx-vlm keeps it (the streaming
session object: its caches, token lists and accumulators), so opening, prefill and
every cache stay mlx-vlm's own. It waits on the device twice a frame: for the text
tokens (the TTS's character encoder reads them on the host) and once at the end for
everything else, the user transcript's first RNN-T rounds included; only a row that
emits more symbols in a frame than those rounds cover costs a wait a round more
(``python -m benchmarks.graph`` counts every wait; the figures are in
docs/performance.md).

Rows are combined only where the result stays bit for bit what each row gets alone
(tests/models/voicechat/test_step.py checks every stage against mlx-vlm's own session):

* the log-mel front end runs as one batch for the rows whose sample buffers are laid
  out alike (conversations of equal age, and every conversation fed whole frames from
  its third frame on): :mod:`realtime.models.voicechat.mel`;
* the conformer (:mod:`realtime.models.voicechat.perception`) runs its blocks as one
  batch for every row: attention caches of young conversations (under 70 encoder
  frames; none yet on a first frame) left-padded to the longest and masked;
* the RNN-T runs one batch per round of symbols over the rows still emitting (each
  emits its own number), its predictor's LSTM layers called batch-first;
* every row of a batched frame is a row of its frame batch
  (:mod:`realtime.models.voicechat.batch`), whatever its age, so the language model,
  the TTS and the codec each run once a frame: the language model over the batch's
  Mamba states stacked and attention layers
  (:class:`~realtime.models.voicechat.batch.PaddedKV`: left-padded to the longest,
  masked), a conversation opening this frame included (its states zeros, which the
  layers read as not started);
* the TTS runs as one batch of 2B rows (classifier-free guidance: all conditional
  rows, then all unconditional ones) over the rows whose timeline has started (a first
  frame speaks the codec's silence), its backbone over the batch's (a wrapped sliding
  window kept rotated, written in place) with per-row RoPE offsets, its character
  encoder over groups of rows whose tokens spell equally many characters (no
  padding), its random draws from each row's own key
  (:func:`realtime.models.voicechat.keys.drawing_rows`);
* the codec decodes every row as one batch on the batch's stacked caches (a
  conversation's first frame on zeros, which the codec reads as not started).

The frame batch's cost in memory (every row at the longest row's length while
batched) is in docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import mlx.core as mx
import numpy as np
from mlx_audio.stt.models.nemotron_asr import tokenizer as rnnt_tokenizer
from mlx_audio.stt.models.nemotron_asr.audio import log_mel_spectrogram

from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    ContextLimitReached,
    FunctionDelta,
    ModelEvent,
    ModelFigures,
    Samples,
    UserTranscriptDelta,
)
from realtime.models.voicechat.batch import (
    FrameBatch,
)
from realtime.models.voicechat.codes import (
    PerModel,
    codec_latents,
    generate_codes,
    previous_sums,
    remember,
)
from realtime.models.voicechat.mel import MEL_STATE
from realtime.models.voicechat.perception import groups, perceive, stacked
from realtime.models.voicechat.row import StepRow

REQUIRED_STATE: Final = (
    "_mel_stream",
    "_conformer_stream",
    "_language_cache",
    "_tts_cache",
    "_previous_code",
    "_codec_cache",
    "_text_tokens",
    "_function_tokens",
    "_text",
    "_function",
    "_rnnt",
    "_frame_index",
    "_timeline_index",
    "max_frames",
)
"""The attributes of mlx-vlm's streaming session this step reads and advances (checked
when a session opens, so an mlx-vlm that renames one fails there, clearly)."""


RNNT_STATE: Final = ("last_token", "hidden", "tokens", "text")
"""The attributes of mlx-vlm's RNN-T state (``_RNNTState``) :func:`_transcribe` advances."""


def check_state(inner: Any) -> None:
    """Raise RuntimeError if ``inner`` lacks what :func:`step_frames` advances (an
    mlx-vlm this step was not written for, or a session opened without caches)."""
    missing = [name for name in REQUIRED_STATE if not hasattr(inner, name)]
    rnnt = getattr(inner, "_rnnt", None)
    missing += [
        f"_rnnt.{name}" for name in RNNT_STATE if rnnt is not None and not hasattr(rnnt, name)
    ]
    mel = getattr(inner, "_mel_stream", None)
    missing += [
        f"_mel_stream.{name}" for name in MEL_STATE if mel is not None and not hasattr(mel, name)
    ]
    if missing or inner._language_cache is None or inner._conformer_stream is None:
        raise RuntimeError(
            "mlx-vlm's streaming session lacks the state the frame step advances "
            f"({', '.join(missing) or 'its language or perception cache'}); "
            "this mlx-vlm version is not supported"
        )


def _language(rows: Sequence[StepRow], fused: Any, batch: FrameBatch | None) -> tuple[Any, Any]:
    """The language model over ``rows`` (the frame batch's rows on its state, else one
    row on its own caches), each row's caches advanced; the text and function logits
    of the new position, (rows, vocabulary) each."""

    model = rows[0].inner.model.stt_model
    cache = rows[0].inner._language_cache if batch is None else batch.views(batch.language)
    output = model(fused, cache=cache)
    return output.text_logits[:, -1], output.function_logits[:, -1]


def _subwords(tts: Any, ids: Any) -> Any:
    """The TTS's conditioning for each row's text token: its character encoder over
    groups of rows whose tokens spell equally many characters (no padding, so each row
    gets what it gets alone)."""

    encoder = tts.embed_subword
    table = encoder._subword_to_chars
    spelled = [len(table.get(int(token), ())) if table is not None else 0 for token in ids]
    if len(ids) == 1:
        current = mx.array([[ids[0]]], dtype=mx.int32)
        return encoder(current, _kept(current.shape))
    parts: list[Any] = [None] * len(ids)
    for members in groups(range(len(ids)), lambda i: spelled[i]):
        current = mx.array([[ids[i]] for i in members], dtype=mx.int32)
        out = encoder(current, _kept(current.shape))
        for position, i in enumerate(members):
            parts[i] = out[position : position + 1]
    return mx.concatenate(parts, axis=0)


def _kept(shape: tuple[int, ...]) -> Any:
    """A subword mask keeping every token, as data (the character encoder reads its
    mask on the host: a mask built by an MLX op would be a wait on the device)."""
    return mx.array(np.ones(shape, dtype=np.bool_))


def _tts(
    rows: Sequence[StepRow],
    ids: list[int],
    previous: list[Any | None],
    silence: Any,
    batch: FrameBatch | None,
) -> tuple[Any, Any]:
    """One EAR-TTS step for ``rows``: mlx-vlm's ``RVQEARTTSModel.step`` with guidance,
    its conditioning built per group of rows, its backbone over every row's own caches
    and its codes from :func:`realtime.models.voicechat.codes.generate_codes`;
    ``previous`` is each row's previous codes (None: silence, its text ended the turn).
    The new codes, (rows, 1, codebooks), and their code embedding sums."""

    from realtime.models.voicechat.keys import drawing_rows

    tts = rows[0].inner.model.tts_model.tts_model
    sums = previous_sums(tts, [row.inner for row in rows], previous, silence)
    code_embed = tts.embed_code(sums)
    code_embed = mx.concatenate([code_embed, code_embed], axis=0)
    cond = _subwords(tts, ids)
    null = mx.broadcast_to(tts.null_emb, cond.shape)
    inputs = tts.gated_fusion_audio_text(code_embed, mx.concatenate([cond, null], axis=0))
    cache = rows[0].inner._tts_cache if batch is None else batch.tts
    hidden = tts.backbone(None, inputs_embeds=inputs, cache=cache)
    with drawing_rows([row.key for row in rows]):
        return generate_codes(tts, hidden)


def _codec(rows: Sequence[StepRow], clean: Any, batch: FrameBatch | None) -> list[Any]:
    """Each row's samples for its codes: the codec's streaming decode (``decode_step``:
    its quantizer's latents, here :func:`~realtime.models.voicechat.codes.codec_latents`,
    then ``decode_latents``), over the frame batch's stacked caches (else one row's
    own)."""

    codec = rows[0].inner.model.tts_model.audio_codec
    cache = rows[0].inner._codec_cache if batch is None else batch.codec_view
    if cache is None:  # as mlx-audio's decode_step: a stream decodes on its own cache
        raise ValueError("the codec's streaming decode requires a per-stream cache")
    out = codec.decode_latents(codec_latents(codec.prvq, clean.transpose(0, 2, 1)), cache=cache)
    return [out[i, 0] for i in range(len(rows))]


def _predict(lstm: Any, inputs: Any, hidden: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """The RNN-T prediction network's LSTM layers over ``inputs`` (rows, 1, width), each
    row one step on its own state: mlx-audio's wrapper hands MLX's ``nn.LSTM`` its
    input time-major, which MLX reads as (batch, time), so it steps one row only (for
    one row the two layouts are the same array). Returns the top layer's output and
    the new (h, c), each (layers, rows, width), as the wrapper does."""

    outputs = inputs
    next_h: list[Any] = []
    next_c: list[Any] = []
    for layer, cell in enumerate(lstm.lstm):
        all_h, all_c = cell(
            outputs,
            hidden=None if hidden is None else hidden[0][layer],
            cell=None if hidden is None else hidden[1][layer],
        )
        outputs = all_h
        next_h.append(all_h[:, -1])
        next_c.append(all_c[:, -1])
    return outputs, (mx.stack(next_h, axis=0), mx.stack(next_c, axis=0))


@attrs.frozen(slots=True)
class _Round:
    """One greedy RNN-T round built for the rows still emitting (``active``): each
    one's best symbol (``picks``, stacked, not yet read) and the predictor state it
    would move to."""

    active: list[int]
    picks: Any
    proposed: dict[int, tuple[Any, Any]]


def _rnnt_round(rows: Sequence[StepRow], encoded: Sequence[Any], active: list[int]) -> _Round:
    """Build one round for ``active``: the prediction network and joint once for every
    such row, rows whose predictor has no state yet (a conversation's first symbols)
    as a group of their own, as mlx-vlm starts that state (no recurrent term); a
    blank's input is the zero embedding mlx-vlm uses."""

    first = rows[0].inner
    stt = first.model.stt_model
    embed, lstm = stt.rnnt_decoder.prediction["embed"], stt.rnnt_decoder.prediction["dec_rnn"]
    blank = first.model.config.rnnt_blank_id
    states = [row.inner._rnnt for row in rows]
    chosen: dict[int, Any] = {}
    proposed: dict[int, tuple[Any, Any]] = {}
    for members in groups(active, lambda i: states[i].hidden is None):
        inputs = [
            embed(mx.array([[states[i].last_token]], dtype=mx.int32))
            if states[i].last_token != blank
            else mx.zeros((1, 1, lstm.hidden_size))
            for i in members
        ]
        hidden = states[members[0]].hidden
        if hidden is not None and len(members) > 1:
            hidden = tuple(
                mx.concatenate([states[i].hidden[part] for i in members], axis=1)
                for part in range(2)
            )
        prediction, (h, c) = _predict(
            lstm, inputs[0] if len(members) == 1 else mx.concatenate(inputs, axis=0), hidden
        )
        frames = (
            encoded[members[0]]
            if len(members) == 1
            else mx.concatenate([encoded[i] for i in members], axis=0)
        )
        logits = stt.rnnt_joint(frames, prediction.astype(frames.dtype))
        best = mx.argmax(logits.reshape(len(members), -1), axis=-1)
        for position, i in enumerate(members):
            chosen[i] = best[position]
            proposed[i] = (h[:, position : position + 1], c[:, position : position + 1])
    return _Round(active, mx.stack([chosen[i] for i in active]), proposed)


SPECULATIVE_ROUNDS: Final = 2
"""RNN-T rounds built into every frame's final evaluation: the first for every row, then
rounds that assume each row's previous pick was a symbol. A frame whose rows emit fewer
symbols than this waits for none of its transcript; each further round is a wait."""


def _early_rounds(rows: Sequence[StepRow], encoded: Sequence[Any]) -> list[_Round]:
    """The frame's first RNN-T rounds for every row (none: the model has no RNN-T),
    built before the frame's final evaluation and evaluated with it: the first round,
    then each next one speculatively, from the state every row would be in had its
    previous pick been a symbol (a row whose pick was blank ignores what follows)."""
    config = rows[0].inner.model.config
    if not config.rnnt_vocabulary:
        return []
    everyone = list(range(len(rows)))
    built = [_rnnt_round(rows, encoded, everyone)]
    for _ in range(1, min(SPECULATIVE_ROUNDS, config.audio_config.max_symbols)):
        built.append(_round_after(rows, encoded, built[-1]))
    return built


def _round_after(rows: Sequence[StepRow], encoded: Sequence[Any], previous: _Round) -> _Round:
    """The round after ``previous`` for all of its rows, each as if its pick there was a
    symbol: that symbol's embedding in, the predictor state it proposed (cast as
    :func:`_take_round` stores it) carried; the same network as :func:`_rnnt_round`,
    one batch, nothing read on the host."""

    stt = rows[0].inner.model.stt_model
    embed, lstm = stt.rnnt_decoder.prediction["embed"], stt.rnnt_decoder.prediction["dec_rnn"]
    active = previous.active
    dtype = encoded[active[0]].dtype
    hidden = tuple(
        stacked([previous.proposed[i][part].astype(dtype) for i in active], axis=1)
        for part in range(2)
    )
    prediction, (h, c) = _predict(lstm, embed(previous.picks.reshape(len(active), 1)), hidden)
    frames = stacked([encoded[i] for i in active])
    logits = stt.rnnt_joint(frames, prediction.astype(frames.dtype))
    picks = mx.argmax(logits.reshape(len(active), -1), axis=-1)
    proposed = {
        i: (h[:, position : position + 1], c[:, position : position + 1])
        for position, i in enumerate(active)
    }
    return _Round(active, picks, proposed)


def _take_round(
    rows: Sequence[StepRow],
    encoded: Sequence[Any],
    built: _Round,
    emitted: list[int],
    active: Sequence[int],
) -> list[int]:
    """Apply a round's picks to the ``active`` rows' RNN-T states (a blank or
    ``max_symbols`` ends a row's frame; a speculative round's other rows are ignored);
    the rows still emitting."""

    config = rows[0].inner.model.config
    blank, limit = config.rnnt_blank_id, config.audio_config.max_symbols
    values = np.asarray(built.picks).reshape(-1).tolist()
    wanted = set(active)
    still: list[int] = []
    for i, token in zip(built.active, values, strict=True):
        if i not in wanted or token == blank:
            continue
        state = rows[i].inner._rnnt
        state.last_token = token
        dtype = encoded[i].dtype
        state.hidden = tuple(value.astype(dtype) for value in built.proposed[i])
        if not rnnt_tokenizer.is_special_token(token, config.rnnt_vocabulary):
            state.tokens.append(token)
        emitted[i] += 1
        if emitted[i] < limit:
            still.append(i)
    return still


def _transcribe(
    rows: Sequence[StepRow], encoded: Sequence[Any], early: Sequence[_Round]
) -> list[tuple[str, str] | None]:
    """Each row's user-transcript update for its encoder frame, as mlx-vlm's
    ``_RNNTState.step`` gives it, with the rows' greedy RNN-T steps batched: the
    ``early`` rounds (:func:`_early_rounds`, already evaluated), then a round for every
    row still emitting (one wait on the device each, not one per row) until each
    row's blank or ``max_symbols``."""

    if not early:
        return [None] * len(rows)
    vocabulary = rows[0].inner.model.config.rnnt_vocabulary
    states = [row.inner._rnnt for row in rows]
    before = [len(state.tokens) for state in states]
    emitted = [0] * len(rows)
    active = list(range(len(rows)))
    for built in early:
        if not active:
            break
        active = _take_round(rows, encoded, built, emitted, active)
    while active:
        built = _rnnt_round(rows, encoded, active)
        active = _take_round(rows, encoded, built, emitted, active)
    out: list[tuple[str, str] | None] = []
    for state, count in zip(states, before, strict=True):
        if len(state.tokens) == count:
            out.append(None)
            continue
        updated = rnnt_tokenizer.decode(state.tokens, vocabulary).strip()
        delta = updated[len(state.text) :] if updated.startswith(state.text) else updated
        state.text = updated
        out.append((delta, updated))
    return out


def _conformer_state(inner: Any) -> list[Any]:
    stream = inner._conformer_stream
    state = [stream.mel_cache, *stream.attn_cache, *stream.conv_cache]
    return [value for value in state if value is not None]


def step_frames(rows: Sequence[StepRow], figures: ModelFigures) -> list[list[ModelEvent]]:
    """Run one whole frame of each row (as mlx-vlm's ``_step_audio_frame`` would) and
    return each row's events. The caller keeps rows at their ``max_streaming_seconds``
    out (ContextLimitReached here, before any work, if one is not); any other exception
    means every row's state may be partly advanced."""

    for row in rows:
        inner = row.inner
        if inner.max_frames is not None and inner._frame_index >= inner.max_frames:
            raise ContextLimitReached(
                f"stream exceeded the configured {inner.max_frames}-frame context"
            )
    held = [row.seat.batch for row in rows if isinstance(row.seat.batch, FrameBatch)]
    batch = held[0] if held else FrameBatch()
    order = batch.arrange([row.seat for row in rows])
    if order is None:
        return _step(rows, figures, None)
    try:
        out = _step([rows[k] for k in order], figures, batch)
    except BaseException:
        # The batch holds only this step's rows; their states may be partly advanced
        # (the caller fails them all), so nothing is written back.
        batch.drop()
        raise
    # A row made for this call only leaves with it.
    batch.release([row.seat for row in rows if not row.seat.lasting])
    events: list[list[ModelEvent]] = [[] for _ in rows]
    for position, k in enumerate(order):
        events[k] = out[position]
    return events


def _step(
    rows: Sequence[StepRow], figures: ModelFigures, batch: FrameBatch | None
) -> list[list[ModelEvent]]:
    """:func:`step_frames` for ``rows``: the frame batch's rows first, in its order,
    on its state (``batch``), the others on their own caches (all: None)."""
    first = rows[0].inner
    # Perception (batched where the rows' streaming states allow); the language
    # model's input for every row at once.
    encoded, projected = perceive(rows, batch)
    fresh = [row.inner._timeline_index == 0 for row in rows]
    """A session opened with no system prompt has run no timeline step yet: its first
    frame reads pad on both channels and speaks the codec's silence (no TTS step)."""
    text_logits, function_logits = _language(rows, _language_input(rows, projected, fresh), batch)
    text_ids = mx.argmax(text_logits, axis=-1)
    function_ids = mx.argmax(function_logits, axis=-1)
    mx.async_eval(text_ids, function_ids)  # type: ignore[no-untyped-call]

    # The text ids are read now (the TTS's character encoder spells them on the host);
    # the function ids only once the frame's final evaluation has run.
    texts = [int(t) for t in np.asarray(text_ids).reshape(-1)]
    codes, spoken = _speak(rows, texts, fresh, batch)
    clean = first.parent._replace_control_codes(codes)
    samples = _codec(rows, clean, batch)
    # The batch's rows' attention and convolution caches are stacked (their own are stale).
    conformer = None if batch is None else batch.conformer
    state: list[Any] = [] if conformer is None else conformer.arrays()
    for position, row in enumerate(rows):
        own = _conformer_state(row.inner)
        state += own[:1] if conformer is not None and position < len(conformer.lengths) else own
    # The user transcript's first rounds ride on the final evaluation; only rows that
    # emitted a symbol in each of them run more rounds (a wait each), after it.
    early = _early_rounds(rows, encoded)
    mx.eval(
        codes,
        clean,
        function_ids,
        *samples,
        *state,
        *(built.picks for built in early),
    )
    functions = [int(f) for f in np.asarray(function_ids).reshape(-1)]
    heard = _transcribe(rows, encoded, early)

    clean_rows = np.asarray(clean).reshape(len(rows), -1)
    eos = first.config.eos_token_id
    out: list[list[ModelEvent]] = []
    for i, row in enumerate(rows):
        inner = row.inner
        index = inner._frame_index
        inner._text_tokens.append(texts[i])
        inner._function_tokens.append(functions[i])
        if i in spoken:
            inner._previous_code = spoken[i]
        inner._timeline_index += 1
        inner._frame_index += 1
        events = _text_events(inner, index, heard[i], texts[i], functions[i])
        events.append(
            AudioDelta(
                frame_index=index,
                samples=_samples(samples[i], figures),
                audio_codes=tuple(int(c) for c in clean_rows[i].tolist()),
                sample_rate=figures.output_sample_rate,
                end_of_turn=texts[i] == eos,
            )
        )
        out.append(events)
    return out


def _language_input(rows: Sequence[StepRow], projected: Sequence[Any], fresh: list[bool]) -> Any:
    """The language model's input for every row: its previous text and function tokens'
    embeddings (pad for a fresh row) fused with its audio projection."""

    first = rows[0].inner
    model, config = first.model, first.config
    pad = config.pad_token_id

    def previous(tokens: Callable[[Any], list[int]]) -> Any:
        return mx.array(
            [[pad if new else tokens(row.inner)[-1]] for row, new in zip(rows, fresh, strict=True)],
            dtype=mx.int32,
        )

    previous_text = previous(lambda inner: inner._text_tokens)
    previous_function = previous(lambda inner: inner._function_tokens)
    audio = projected[0] if len(rows) == 1 else mx.concatenate(list(projected), axis=0)
    return (
        model.stt_model.embed_tokens(previous_text)
        + audio
        + config.function_channel_weight * model.stt_model.embed_tokens(previous_function)
    )


def _speak(
    rows: Sequence[StepRow], texts: list[int], fresh: list[bool], batch: FrameBatch | None
) -> tuple[Any, dict[int, Any]]:
    """Every row's codes for this frame, (rows, 1, codebooks): the TTS's for the rows
    that speak (all but fresh ones, whose first frame is the codec's silence; the
    frame batch's rows, which lead, on its state, the others on their own caches),
    and those rows' codes by row."""

    first = rows[0].inner
    config = first.config
    silence_tokens = first.model.tts_model.codec_silence_tokens
    if batch is None:
        part = [i for i, new in enumerate(fresh) if not new]
    else:  # the TTS's own order (every row whose timeline started)
        position = {id(row.seat): i for i, row in enumerate(rows)}
        part = [position[id(seat)] for seat in batch.voices]
    spoken: dict[int, Any] = {}
    if part:
        codes_now, sums = _tts(
            [rows[i] for i in part],
            [texts[i] for i in part],
            [
                None if texts[i] == config.eos_token_id else rows[i].inner._previous_code
                for i in part
            ],
            silence_tokens,
            batch,
        )
        for n, i in enumerate(part):
            spoken[i] = codes_now[n : n + 1]
            remember(rows[i].inner, spoken[i], sums[n : n + 1])
        if part == list(range(len(rows))):
            return codes_now, spoken
    silence = silence_tokens[None, None, :].astype(mx.int32)
    codes = mx.concatenate([spoken.get(i, silence) for i in range(len(rows))], axis=0)
    return codes, spoken


def _text_events(
    inner: Any, index: int, heard: tuple[str, str] | None, text: int, function: int
) -> list[ModelEvent]:
    """A row's user transcript, assistant text and function channel events for frame
    ``index``, in that order (its tokens already appended to its channels' decoders)."""
    events: list[ModelEvent] = []
    if heard is not None:
        events.append(UserTranscriptDelta(frame_index=index, delta=heard[0], transcript=heard[1]))
    update = inner._text.append(text)
    if update is not None:
        events.append(
            AssistantTextDelta(frame_index=index, token_id=text, delta=update[0], text=update[1])
        )
    update = inner._function.append(function)
    if update is not None:
        events.append(
            FunctionDelta(frame_index=index, token_id=function, delta=update[0], text=update[1])
        )
    return events


def float_samples(samples: Any) -> Samples:
    """The model's output samples as 1-D float32 numpy.

    A float32 MLX array is viewed, not copied (read-only; the view keeps the MLX
    buffer alive, and MLX never writes an array it has returned): the copy cost
    ~100 µs a frame right after the model step, on every frame's way to the client
    (a fresh buffer, filled by MLX moments before, copied cold). Anything else
    (another dtype, a list) is converted.
    """

    if isinstance(samples, mx.array) and samples.dtype == mx.float32:
        view: Samples = np.asarray(samples).reshape(-1)
        view.flags.writeable = False
        return view
    return np.array(samples, dtype=np.float32).reshape(-1)


def _samples(samples: Any, figures: ModelFigures) -> Samples:
    view = float_samples(samples)
    if view.shape[0] != figures.output_frame_samples:
        raise RuntimeError(
            f"the codec returned {view.shape[0]} samples for a frame, "
            f"not {figures.output_frame_samples}"
        )
    return view


def _encoded_silence(model: Any) -> Any:
    """The perception of one second of silence, frame 0: the user-audio input of every
    inserted tool-response step, as NVIDIA's wrapper feeds it."""

    config = model.config
    zeros = mx.zeros((int(config.input_sample_rate),), dtype=mx.float32)
    mel = log_mel_spectrogram(zeros, config.audio_config.preprocessor)
    projected, _, _ = model.stt_model.perception(mel, mx.array([mel.shape[1]], mx.int32))
    silence = projected[:, :1]
    mx.eval(silence)
    return silence


_silence: Final = PerModel(_encoded_silence)
"""Each loaded model's encoded silence, built on first use."""


def pad_tts_step(inner: Any, pad: int) -> Any:
    """The TTS's step on PAD in a timeline step nothing is heard in (its cache follows
    the timeline): its codes, kept as the next step's previous ones. Run under the
    row's key (``drawing_from``)."""
    current = mx.array([[pad]], dtype=mx.int32)
    out = inner.model.tts_model.tts_model.step(
        inner._previous_code, current, _kept(current.shape), inner._tts_cache, guidance=True
    )
    inner._previous_code = out.codes
    return out.codes


def inserted_step(row: StepRow, forced_function: int | None) -> int:
    """One timeline step that consumes no audio, as the model was trained to take a
    tool's response (NVIDIA's function-calling insertions): user audio is encoded
    silence, the agent text channel PAD, the function channel's next input
    ``forced_function`` (a response token) or, when None, the token the model predicts
    (after the response it is trained to say ``<SPECIAL_22>``, end of response); the TTS
    steps on PAD (its cache follows the timeline) and nothing is heard. Returns the
    function token recorded."""

    from realtime.models.voicechat.keys import drawing_from

    inner = row.inner
    row.seat.release()
    model, config = inner.model, inner.config
    pad = config.pad_token_id
    started = inner._timeline_index > 0
    previous_text = inner._text_tokens[-1] if started else pad
    previous_function = inner._function_tokens[-1] if started else pad
    fused = (
        model.stt_model.embed_tokens(mx.array([[previous_text]], dtype=mx.int32))
        + _silence(model)
        + config.function_channel_weight
        * model.stt_model.embed_tokens(mx.array([[previous_function]], dtype=mx.int32))
    )
    output = model.stt_model(fused, cache=inner._language_cache)
    function_id = mx.argmax(output.function_logits[:, -1], axis=-1)
    pending = [function_id]
    if started:
        with drawing_from(row.key):
            pending.append(pad_tts_step(inner, pad))
    mx.eval(*pending)
    recorded = (
        int(np.asarray(function_id).reshape(-1)[0])
        if forced_function is None
        else int(forced_function)
    )
    inner._text_tokens.append(pad)
    inner._function_tokens.append(recorded)
    inner._timeline_index += 1
    return recorded
