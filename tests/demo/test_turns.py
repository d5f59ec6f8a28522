"""The demo's turn-taking (realtime/demo/turns.py): the pure policy, the wrapper on the
demo checkpoint, and both endpoints on a real Hypercorn server. Everything is counted in
model frames, never in wall-clock time."""

from __future__ import annotations

import base64
import json
import math
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import soundfile
import trio
from trio_websocket import open_websocket_url

from realtime.audio import pcm16_to_float, prepare_input, read_wav
from realtime.demo.turns import (
    SILENT_DB,
    DemoTurnModel,
    DemoTurnSession,
    Hear,
    Plan,
    Script,
    TurnRules,
    TurnState,
    decide,
    declared_tool,
    demo_turns,
    example_value,
    frame_energy_db,
    initial_state,
    reply_text,
    voice_envelope,
)
from realtime.engine.facade import Engine
from realtime.launch.server import model_loader
from realtime.models import base
from realtime.models.voicechat.model import VoiceChatModel
from tests.helpers import append_msg, connect, running_server
from tests.models_fixtures import speechlike

RULES = TurnRules()
FRAME = base.VOICECHAT_FIGURES.frame_samples
ANSWER = (300, 301, 302, 303)
SPOKEN = "what is the weather like today"
WITHIN_A_SECOND = 13
"""Frames from the end of speech to the answer's first token: about a second."""


def script(seconds: float) -> Sequence[int]:
    return ANSWER


def run(
    energies: Sequence[float],
    rules: TurnRules = RULES,
    state: TurnState | None = None,
    answer: Script = script,
) -> tuple[TurnState, list[Plan]]:
    state = state or initial_state(rules)
    plans = []
    for energy in energies:
        state, plan = decide(rules, state, energy, answer)
        plans.append(plan)
    return state, plans


def energies_of(samples: np.ndarray[Any, Any]) -> list[float]:
    return [
        frame_energy_db(samples[i : i + FRAME]) for i in range(0, samples.size - FRAME + 1, FRAME)
    ]


def white(seconds: float, level: float, seed: int = 0) -> np.ndarray[Any, Any]:
    x = np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * level
    return np.clip(x, -1, 1).astype(np.float32)


def silence(seconds: float) -> np.ndarray[Any, Any]:
    return np.zeros(int(seconds * 16000), np.float32)


SPEECH = [-22.0, -16.0, -20.0, -27.0, -18.0, -15.0, -24.0, -19.0, -30.0, -17.0, -21.0, -16.0]
"""Energies of 12 frames of speech: syllables a few dB apart, never steady."""


def answers(plans: Sequence[Plan]) -> list[float]:
    return [p.heard_seconds for p in plans if p.heard_seconds is not None]


def heard(plans: Sequence[Plan]) -> list[Plan]:
    return [p for p in plans if p.hear is not Hear.NOTHING or p.token is not None or p.speak]


# --- the policy, as pure functions ---------------------------------------------------------


def test_speech_then_silence_gets_one_answer_after_the_endpoint() -> None:
    _, plans = run([SILENT_DB] * 5 + SPEECH + [SILENT_DB] * 30)
    first, last = 5, 5 + len(SPEECH) - 1
    assert answers(plans) == [pytest.approx(len(SPEECH) * 0.08)]
    # Speech is confirmed after three frames; every later frame of it is heard.
    assert plans[first + 2].hear is Hear.STARTED
    assert all(p.hear is Hear.VOICED for p in plans[first + 3 : last + 1])
    # The user's turn ends 7 frames (560 ms) below the threshold, the answer follows:
    # one token a frame, then the end frame.
    ended = last + RULES.end_frames
    assert plans[ended].heard_seconds is not None
    said = plans[ended + 1 : ended + 1 + len(ANSWER)]
    assert [p.token for p in said] == list(ANSWER) and all(p.speak for p in said)
    end = plans[ended + 1 + len(ANSWER)]
    assert end == Plan(speak=True, end_of_turn=True)
    assert sum(p.end_of_turn for p in plans) == 1
    assert all(p == Plan() for p in plans[ended + 2 + len(ANSWER) :])
    assert ended + 1 - last <= WITHIN_A_SECOND


@pytest.mark.parametrize("level", [0.003, 0.05, 0.3, 0.9])
def test_white_noise_alone_never_counts_as_speech(level: float) -> None:
    _, plans = run(energies_of(white(8.0, level)))
    assert heard(plans) == [] and answers(plans) == []


@pytest.mark.parametrize("onset", [1.0, 1.03])  # on a frame boundary, and inside a frame
def test_loud_noise_that_starts_suddenly_is_not_speech(onset: float) -> None:
    _, plans = run(energies_of(np.concatenate([silence(onset), white(6.0, 0.5)])))
    assert heard(plans) == []


def test_a_wavering_noise_is_learned_within_the_floors_memory() -> None:
    """A noise that moves a few dB from frame to frame is never steady. Heard after a
    steady noise it stays under the threshold, 9 dB over the floor; opening a session
    it may count as speech once, until the floor's memory (3 s) has learned it."""
    waver = [-30.0 + 6.0 * abs(math.sin(i * 1.3)) for i in range(150)]
    _, plans = run([-30.0] * 10 + waver)
    assert heard(plans) == []
    _, plans = run(waver)
    started = [i for i, p in enumerate(plans) if p.hear is Hear.STARTED]
    assert len(started) <= 1 and len(answers(plans)) <= 1
    assert not heard(plans[RULES.memory_frames + RULES.end_frames + 2 * len(ANSWER) :])


def test_loud_steady_noise_then_speech_gets_an_answer() -> None:
    noise = white(8.0, 0.05, seed=1)  # -26 dBFS
    mixed = noise.copy()
    voice = 2.0 * speechlike(20)
    mixed[32000 : 32000 + voice.size] += voice
    _, plans = run(energies_of(mixed))
    assert len(answers(plans)) == 1
    started = [i for i, p in enumerate(plans) if p.hear is Hear.STARTED]
    assert len(started) == 1 and 25 <= started[0] <= 29  # speech begins at frame 25
    assert [p.token for p in plans if p.token is not None] == list(ANSWER)


def test_speech_over_the_answer_cuts_it_and_is_answered_in_turn() -> None:
    long = tuple(range(300, 310))
    state, plans = run(SPEECH + [SILENT_DB] * (RULES.end_frames + 3), answer=lambda s: long)
    assert state.answering and [p.token for p in plans if p.token is not None] == [300, 301, 302]
    state, more = run(SPEECH + [SILENT_DB] * 30, state=state, answer=lambda s: long)
    cut = next(i for i, p in enumerate(more) if p.hear is Hear.STARTED)
    assert cut == RULES.onset_frames - 1
    assert more[cut] == Plan(hear=Hear.STARTED, end_of_turn=True, interrupted=True)
    # Until speech was confirmed the answer went on (talked over, as the real model
    # is); then it is the user's turn, and the rest of the answer is never said.
    assert [p.token for p in more[:cut]] == [303, 304]
    assert all(p.token is None and not p.speak for p in more[cut : len(SPEECH)])
    assert len(answers(more)) == 1
    assert [p.token for p in more if p.token is not None][2:] == list(long)
    assert sum(p.end_of_turn for p in more) == 2  # the cut answer's end, the new one's


def test_speech_before_the_first_token_cuts_nothing_that_was_said() -> None:
    state, _ = run(SPEECH + [SILENT_DB] * RULES.end_frames)
    assert state.answering
    _, more = run(SPEECH[:3], state=state)
    assert more[0].token == ANSWER[0]
    assert more[2] == Plan(hear=Hear.STARTED, end_of_turn=True, interrupted=True)


def test_speech_during_the_user_turns_pause_continues_it() -> None:
    gap = [SILENT_DB] * (RULES.end_frames - 1)
    _, plans = run(SPEECH + gap + SPEECH + [SILENT_DB] * 30)
    assert answers(plans) == [pytest.approx((2 * len(SPEECH) + len(gap)) * 0.08)]


def test_a_short_sound_opens_no_turn() -> None:
    _, plans = run([SILENT_DB, -15.0, -25.0, SILENT_DB, SILENT_DB] * 10)
    assert heard(plans) == []


def test_an_empty_script_says_nothing() -> None:
    state = initial_state(RULES)
    for energy in SPEECH + [SILENT_DB] * 20:
        state, plan = decide(RULES, state, energy, lambda s: ())
        assert plan.token is None and not plan.speak and not plan.end_of_turn
    assert not state.answering and not state.hearing


def test_the_policy_is_pure() -> None:
    state, _ = run(SPEECH[:5])
    again = [decide(RULES, state, -18.0, script) for _ in range(3)]
    assert again[0] == again[1] == again[2]
    assert run(SPEECH + [SILENT_DB] * 20) == run(SPEECH + [SILENT_DB] * 20)


def test_speech_counts_in_frames_of_the_models_length() -> None:
    rules = TurnRules(frame_seconds=0.04)
    assert (rules.onset_frames, rules.end_frames, rules.steady_frames) == (6, 14, 8)
    assert (RULES.onset_frames, RULES.end_frames, RULES.steady_frames) == (3, 7, 4)
    assert (RULES.onset_gap_frames, RULES.memory_frames) == (2, 38)


def test_bad_input_is_refused_clearly() -> None:
    state = initial_state(RULES)
    for energy in (math.nan, math.inf, "loud", True):
        with pytest.raises(ValueError, match="energy_db"):
            decide(RULES, state, energy, script)  # type: ignore[arg-type]
    assert decide(RULES, state, -math.inf, script)[0].floor_db == SILENT_DB
    with pytest.raises(ValueError, match="margin_db"):
        TurnRules(margin_db=0.0)
    with pytest.raises(ValueError, match="min_speech_db"):
        TurnRules(min_speech_db=3.0)
    with pytest.raises(ValueError, match="frame_seconds"):
        TurnRules(frame_seconds=math.nan)
    state, _ = run(SPEECH)
    for bad in ((-1,), ("x",), (True,)):
        with pytest.raises(ValueError, match="script's tokens"):
            later = state
            for _ in range(RULES.end_frames):
                later, _ = decide(RULES, later, SILENT_DB, lambda s, bad=bad: bad)  # type: ignore[misc]


def test_the_demo_hears_its_own_voice_as_speech_and_not_its_raw_noise() -> None:
    """The answer's echo (at -20 dBFS) comes back into the microphone two frames in:
    the network's raw voice, steady noise, is learned as noise; shaped by the voice's
    envelope it rises and falls as speech does and cuts the answer short."""
    long_answer = tuple(range(300, 330))
    question = [SILENT_DB] * 5 + SPEECH + [SILENT_DB] * RULES.end_frames
    state, plans = run(question, answer=lambda s: long_answer)
    assert plans[-1].heard_seconds is not None and state.answering
    noise = white(3.0, 0.1, seed=4)  # -20 dBFS
    voice = noise * voice_envelope(0, noise.size, 16000)
    for echo, cut in ((noise, False), (voice, True)):
        energies = [SILENT_DB] * 2 + energies_of(echo)
        _, plans = run(energies, state=state, answer=lambda s: long_answer)
        assert any(p.interrupted for p in plans) is cut, energies
    frames = energies_of(voice)
    spreads = [max(frames[i : i + 4]) - min(frames[i : i + 4]) for i in range(len(frames) - 3)]
    assert min(spreads) > RULES.steady_db  # never steady: no 4 frames within 2 dB


def test_voice_envelope() -> None:
    gains = voice_envelope(0, 22050, 22050)
    assert gains.dtype == np.float32 and gains[0] == pytest.approx(0.1)
    assert gains.max() == pytest.approx(1.0, abs=1e-6) and gains.min() >= 0.1 - 1e-6
    np.testing.assert_allclose(voice_envelope(1000, 500, 22050), gains[1000:1500])


def test_frame_energy() -> None:
    assert frame_energy_db(np.zeros(FRAME, np.float32)) == SILENT_DB
    assert frame_energy_db(np.ones(FRAME, np.float32)) == pytest.approx(0.0)
    assert frame_energy_db(np.full(FRAME // 2, 0.5, np.float32), FRAME) == pytest.approx(
        10 * math.log10(0.125)
    )
    with pytest.raises(ValueError, match="mono"):
        frame_energy_db(np.zeros((2, FRAME), np.float32))
    with pytest.raises(ValueError, match="finite"):
        frame_energy_db(np.full(FRAME, np.inf, np.float32))


# --- the wrapper on a stand-in network (no MLX): rows, batching, failures --------------------


class _Session:
    """Cuts its input into frames as mlx-vlm does; each frame: a random text delta (to be
    dropped) and audio of ones."""

    def __init__(self, fail: bool = False) -> None:
        self.pending = 0
        self.frame = 0
        self.fail = fail

    def push_audio(self, samples: base.Samples, sample_rate: int) -> list[base.ModelEvent]:
        if self.fail:
            raise base.InferenceError("this row fails")
        self.pending += samples.shape[0]
        events: list[base.ModelEvent] = []
        while self.pending >= FRAME:
            self.pending -= FRAME
            events += self._frame()
        return events

    def _frame(self) -> list[base.ModelEvent]:
        i, self.frame = self.frame, self.frame + 1
        ones = np.ones(base.VOICECHAT_FIGURES.output_frame_samples, np.float32)
        return [
            base.AssistantTextDelta(i, 77, "x", "x"),
            base.FunctionDelta(i, 78, "y", "y"),
            base.AudioDelta(i, ones, (5,) * 31, end_of_turn=i % 3 == 0),
        ]

    def flush(self, pad_partial: bool) -> list[base.ModelEvent]:
        events = self._frame() if pad_partial and self.pending else []
        self.pending = 0
        return [*events, base.Done(self.frame)]

    def cancel(self) -> list[base.ModelEvent]:
        return []


class _Opening:
    def __init__(self, session: _Session) -> None:
        self.session = session

    def advance(self) -> _Session:
        return self.session

    def abandon(self) -> None:
        pass


class _Network:
    model_id = "stand-in"
    path = None
    figures: base.ModelFigures = base.VOICECHAT_FIGURES

    def __init__(self) -> None:
        self.calls: list[list[base.Frame]] = []
        self.next_fails = False

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
    ) -> _Opening:
        fail, self.next_fails = self.next_fails, False
        return _Opening(_Session(fail))

    def step(self, frames: Sequence[base.Frame]) -> list[base.RowResult]:
        self.calls.append(list(frames))
        return base.step_each(frames)

    def count_tokens(self, text: str) -> int:
        return len(text)

    def clear_cache(self) -> None:
        pass


@attrs.frozen
class _Letters:
    """A speller: one id per character, above the special ids."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 100 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 100) for i in ids)


SILENCE_CODES = tuple(range(31))


def _wrapped() -> tuple[DemoTurnModel, _Network]:
    network = _Network()
    return DemoTurnModel(network, _Letters(), SILENCE_CODES), network


def _frames(samples: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
    return [samples[i : i + FRAME] for i in range(0, samples.size, FRAME)]


def test_rows_step_in_one_inner_call_and_are_rewritten() -> None:
    model, network = _wrapped()
    talker = base.open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    quiet = base.open_session(model, system_prompt=None, seed=1, max_streaming_seconds=None)
    speech = np.concatenate([speechlike(12), silence(3.0)])
    events: list[list[base.ModelEvent]] = [[], []]
    for piece in _frames(speech):
        rows = model.step([(talker, piece, 16000), (quiet, np.zeros(FRAME, np.float32), 16000)])
        for mine, row in zip(events, rows, strict=True):
            assert not isinstance(row, Exception)
            mine += row
    assert len(network.calls) == len(_frames(speech))
    assert all(len(call) == 2 for call in network.calls)
    assert isinstance(talker, DemoTurnSession) and isinstance(quiet, DemoTurnSession)
    assert [row[0] for row in network.calls[0]] == [talker.inner, quiet.inner]
    said = [e for e in events[0] if isinstance(e, base.AssistantTextDelta)]
    assert "".join(e.delta for e in said) == reply_text(12 * 0.08)
    assert said[-1].text == reply_text(12 * 0.08)
    assert [e.token_id for e in said] == _Letters().encode(reply_text(12 * 0.08))
    assert not [e for e in events[0] + events[1] if isinstance(e, base.FunctionDelta)]
    heard = [e for e in events[0] if isinstance(e, base.UserTranscriptDelta)]
    assert heard[0].delta == "(demo) speech" and heard[-1].transcript.startswith("(demo) speech.")
    # The quiet one hears nothing and says nothing: silence, the codec's silence codes.
    audio = [e for e in events[1] if isinstance(e, base.AudioDelta)]
    assert len(audio) == len(_frames(speech))
    assert all(not a.samples.any() and a.audio_codes == SILENCE_CODES for a in audio)
    assert not any(a.end_of_turn for a in audio)
    assert all(isinstance(e, base.AudioDelta) for e in events[1])
    # The talker's answer plays the network's audio; its end frame ends the turn.
    spoken = [e for e in events[0] if isinstance(e, base.AudioDelta) and e.samples.any()]
    assert [a.frame_index for a in spoken] == list(
        range(said[0].frame_index, said[-1].frame_index + 2)
    )
    assert [
        a.frame_index for a in events[0] if isinstance(a, base.AudioDelta) and a.end_of_turn
    ] == [said[-1].frame_index + 1]
    # ... shaped as a voice rises and falls, from the answer's first sample.
    played = np.concatenate([a.samples for a in spoken])
    rate = base.VOICECHAT_FIGURES.output_sample_rate
    np.testing.assert_array_equal(played, voice_envelope(0, played.size, rate))


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "examples": ["Paris"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "default": 3},
            "alerts": {"type": ["boolean", "null"]},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        },
        "required": ["city"],
    },
}


def test_a_session_with_tools_answers_a_turn_with_a_call_then_the_result() -> None:
    """The call is VoiceChat's own format on the function channel, complete on the frame
    the user's turn ends, so the OpenAI dialect's reader takes it whole; the demo says
    nothing until the tool's result comes back, and that answer calls nothing."""
    from realtime.models.voicechat.tools import CallReader, render_prompt

    model, _ = _wrapped()
    other = {"type": "function", "name": "second", "parameters": {"type": "object"}}
    prompt = render_prompt("Be brief.", [WEATHER, other])
    session = base.open_session(model, system_prompt=prompt, seed=0, max_streaming_seconds=None)
    events: list[base.ModelEvent] = []
    for piece in _frames(np.concatenate([speechlike(12), silence(3.0)])):
        events += session.push_audio(piece, 16000)
    calls = [e for e in events if isinstance(e, base.FunctionDelta)]
    said = [e for e in events if isinstance(e, base.AssistantTextDelta)]
    assert calls and not said and len({e.frame_index for e in calls}) == 1
    assert not [e for e in events if isinstance(e, base.AudioDelta) and e.samples.any()]
    reader = CallReader()
    taken = [call for e in calls for call in reader.push(e.delta)]
    arguments = {"city": "Paris", "unit": "celsius", "days": 3, "alerts": True}
    assert [(name, json.loads(args)) for name, args in taken] == [
        ("get_weather", {**arguments, "where": {"lat": 1.0}})
    ]
    assert calls[-1].text.startswith("<TOOLCALL>") and calls[-1].text.endswith("</TOOLCALL>")
    assert isinstance(session, DemoTurnSession)
    session.answer("(demo) The tool said: sunny")
    after = [e for piece in _frames(silence(3.0)) for e in session.push_audio(piece, 16000)]
    assert not [e for e in after if isinstance(e, base.FunctionDelta)]
    words = "".join(e.delta for e in after if isinstance(e, base.AssistantTextDelta))
    assert words == "(demo) The tool said: sunny"


@pytest.mark.parametrize(
    "prompt",
    [
        None,
        "Be brief.",
        "<AVAILABLE_TOOLS>not json</AVAILABLE_TOOLS>",
        "<AVAILABLE_TOOLS>[{}]</AVAILABLE_TOOLS>",
    ],
)
def test_no_tool_declared_no_call(prompt: str | None) -> None:
    assert declared_tool(prompt) is None


def test_example_values_of_a_schema() -> None:
    assert example_value({"type": "string", "default": "x"}) == "x"
    assert example_value({"const": 4}) == 4
    assert example_value({"type": "array"}) == []
    assert example_value({"properties": {"a": {"type": "integer"}}}) == {"a": 1}
    assert example_value("nonsense") == "example"


def test_a_failing_row_keeps_its_error_and_the_others_their_frame() -> None:
    model, network = _wrapped()
    good = base.open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    network.next_fails = True
    bad = base.open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    piece = np.zeros(FRAME, np.float32)
    first, second = model.step([(good, piece, 16000), (bad, piece, 16000)])
    assert isinstance(second, base.InferenceError)
    assert not isinstance(first, Exception) and [type(e) for e in first] == [base.AudioDelta]
    with pytest.raises(TypeError, match="not a session of this demo model"):
        model.step([(_Session(), piece, 16000)])


def test_partial_frames_and_a_padded_flush_meet_their_audio() -> None:
    model, _ = _wrapped()
    session = base.open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    samples = np.concatenate([speechlike(12), silence(4.0)])[: 50 * FRAME + 300]
    events: list[base.ModelEvent] = []
    for start in range(0, samples.size, 1000):  # slices that are not frames
        events += session.push_audio(samples[start : start + 1000], 16000)
    events += session.flush(True)
    audio = [e for e in events if isinstance(e, base.AudioDelta)]
    assert [a.frame_index for a in audio] == list(range(51))
    assert isinstance(events[-1], base.Done)
    assert [e.delta for e in events if isinstance(e, base.AssistantTextDelta)]


def test_the_wrapper_checks_what_it_is_given() -> None:
    with pytest.raises(ValueError, match="silence_codes"):
        DemoTurnModel(_Network(), _Letters(), (0,) * 3)
    with pytest.raises(ValueError, match="cannot spell"):

        @attrs.frozen
        class Specials(_Letters):
            def encode(self, text: str) -> list[int]:
                return [base.VOICECHAT_FIGURES.eos_token_id]

        DemoTurnModel(_Network(), Specials(), SILENCE_CODES)
    with pytest.raises(ValueError, match="frames"):
        DemoTurnModel(_Network(), _Letters(), SILENCE_CODES, TurnRules(frame_seconds=0.04))
    with pytest.raises(TypeError, match="VoiceChat"):
        demo_turns(_Network())


# --- the demo checkpoint itself -------------------------------------------------------------


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray[Any, Any]:
    """espeak-ng saying SPOKEN, at 16 kHz as the model hears it."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = tmp_path_factory.mktemp("espeak") / "spoken.wav"
    subprocess.run([espeak, "-w", str(wav), SPOKEN], check=True, timeout=60)
    audio, rate = read_wav(wav)
    return pcm16_to_float(prepare_input(audio, rate, extra_seconds=0.0, to_rate=16000))


def _last_speech_frame(samples: np.ndarray[Any, Any]) -> int:
    return max(i for i, e in enumerate(energies_of(samples)) if e > -60)


def _stream(model: DemoTurnModel, samples: np.ndarray[Any, Any]) -> list[base.ModelEvent]:
    session = base.open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    events: list[base.ModelEvent] = []
    for piece in _frames(samples):
        (row,) = model.step([(session, piece, 16000)])
        assert not isinstance(row, Exception)
        events += row
    return events + session.flush(True)


@pytest.fixture(scope="module")
def wrapped_demo(demo_model: VoiceChatModel) -> DemoTurnModel:
    return demo_turns(demo_model)


@pytest.mark.slow
def test_the_demo_answers_espeak_speech(
    wrapped_demo: DemoTurnModel, spoken: np.ndarray[Any, Any]
) -> None:
    samples = np.concatenate([spoken, silence(2.0)])
    events = _stream(wrapped_demo, samples)
    end = _last_speech_frame(spoken)
    said = [e for e in events if isinstance(e, base.AssistantTextDelta)]
    text = "".join(e.delta for e in said)
    assert text.startswith("(demo) I heard you for ") and text.endswith(" s."), text
    assert [e.token_id for e in said] == wrapped_demo.speller.encode(text)
    frames = [e.frame_index for e in said]
    assert frames == list(range(frames[0], frames[0] + len(said)))  # a token a frame
    assert 0 < frames[0] - end <= WITHIN_A_SECOND
    audio = [e for e in events if isinstance(e, base.AudioDelta)]
    assert [a.frame_index for a in audio] == list(range(len(_frames(samples))))
    assert [a.frame_index for a in audio if a.end_of_turn] == [frames[-1] + 1]
    answer = range(frames[0], frames[-1] + 2)
    silence_codes = wrapped_demo.silence_codes
    for a in audio:
        if a.frame_index in answer:
            assert np.abs(a.samples).max() > 0.01  # the network's random voice
        else:
            assert not a.samples.any() and a.audio_codes == silence_codes
    assert not [e for e in events if isinstance(e, base.FunctionDelta)]
    heard = [e for e in events if isinstance(e, base.UserTranscriptDelta)]
    assert heard and all(e.frame_index <= end for e in heard)


def test_the_demo_says_nothing_to_noise(wrapped_demo: DemoTurnModel) -> None:
    events = _stream(wrapped_demo, white(2.0, 0.1))
    assert not [e for e in events if not isinstance(e, (base.AudioDelta, base.Done))]
    audio = [e for e in events if isinstance(e, base.AudioDelta)]
    assert audio and not any(a.samples.any() or a.end_of_turn for a in audio)


def test_only_the_demo_is_wrapped(demo_path: Path) -> None:
    """``model_loader``: the demo with its turns unless told otherwise; a checkpoint
    named with -m as it is (and a demo-turns choice with -m is a usage error)."""
    from realtime.errors import UsageError

    assert isinstance(model_loader(None, None)(), DemoTurnModel)
    assert isinstance(model_loader(None, None, demo_turns=False)(), VoiceChatModel)
    assert isinstance(model_loader(str(demo_path), None)(), VoiceChatModel)
    with pytest.raises(UsageError, match="demo model only"):
        model_loader(str(demo_path), None, demo_turns=True)


# --- both endpoints, on a real server -------------------------------------------------------


async def _native(url: str, samples: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
    async with connect(url) as client:
        await client.configure(seed=0)
        for start in range(0, samples.size, 8 * FRAME):
            await client.send(append_msg(samples[start : start + 8 * FRAME]))
        await client.send({"type": "input_audio_buffer.commit"})
        return await client.recv_until("response.done", timeout=60)


async def _openai(http: str, samples: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
    url = http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
    pcm = prepare_input(samples, 16000, extra_seconds=0.0, to_rate=24000).astype("<i2").tobytes()
    seen: list[dict[str, Any]] = []
    async with open_websocket_url(url) as ws:

        async def until(type_: str) -> dict[str, Any]:
            with trio.fail_after(60):
                while True:
                    event: dict[str, Any] = json.loads(await ws.get_message())
                    seen.append(event)
                    assert event["type"] != "error", event
                    if event["type"] == type_:
                        return event

        await until("session.created")
        await ws.send_message(
            json.dumps({"type": "session.update", "session": {"type": "realtime"}})
        )
        await until("session.updated")
        for start in range(0, len(pcm), 9600):
            audio = base64.b64encode(pcm[start : start + 9600]).decode()
            await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        await until("response.done")
    return seen


@pytest.mark.slow
async def test_both_endpoints_answer_speech_on_the_demo(
    demo_path: Path, spoken: np.ndarray[Any, Any]
) -> None:
    engine = Engine(model_loader(None, None))
    engine.start()
    samples = np.concatenate([spoken, silence(2.0)])
    try:
        async with running_server(engine) as server:
            native = await _native(server.url, samples)
            openai = await _openai(server.http, samples)
    finally:
        engine.shutdown()
    text = "".join(e["delta"] for e in native if e["type"] == "response.text.delta")
    assert text.startswith("(demo) I heard you for "), text
    audio = [e for e in native if e["type"] == "response.audio.delta"]
    loud = [
        e["frame_index"]
        for e in audio
        if np.abs(np.frombuffer(base64.b64decode(e["delta"]), "<i2")).max() > 0
    ]
    first_text = min(e["frame_index"] for e in native if e["type"] == "response.text.delta")
    assert loud and loud[0] == first_text and 0 < first_text - _last_speech_frame(spoken) <= 13
    assert len(audio) == len(_frames(samples))
    types = [e["type"] for e in openai]
    assert "input_audio_buffer.speech_started" in types
    assert "input_audio_buffer.committed" in types
    spoken_back = "".join(
        e["delta"] for e in openai if e["type"] == "response.output_audio_transcript.delta"
    )
    assert spoken_back.startswith("(demo) I heard you for "), types
    assert [e for e in openai if e["type"] == "response.output_audio.delta"]
    done = openai[-1]["response"]
    assert done["status"] == "completed", done


def test_the_demo_turns_flags(
    demo_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--[no-]demo-turns`` names the demo's choice; with -m it is a usage error."""
    from realtime.launch.cli import main

    assert main(["serve", "-m", str(demo_path), "--no-demo-turns"]) == 2
    assert "demo model only" in capsys.readouterr().err
    wav = tmp_path / "in.wav"
    soundfile.write(str(wav), np.zeros(1600, np.float32), 16000, subtype="PCM_16")
    out = tmp_path / "out.wav"
    argv = ["generate", "--stream", "--input", str(wav), "--output", str(out)]
    assert main([*argv, "-m", str(demo_path), "--demo-turns"]) == 2
    assert "demo model only" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_stream_on_the_demo_takes_its_turns(
    demo_cache_dir: Path,
    spoken: np.ndarray[Any, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``realtime generate --stream`` without -m answers as the socket does (the socket's
    bytes equal its own: tests/client/test_files.py)."""
    from realtime.launch.cli import main

    wav = tmp_path / "spoken.wav"
    soundfile.write(str(wav), spoken, 16000, subtype="PCM_16")
    out = tmp_path / "out.wav"
    argv = ["generate", "--stream", "--input", str(wav), "--output", str(out)]
    assert main([*argv, "--extra-seconds", "1"]) == 0  # the answer's first tokens
    printed = capsys.readouterr().out
    assert "[assistant] (demo) I" in printed, printed
    assert "[user] (demo) speech" in printed


def test_the_demo_turns_pass_the_engines_slice_sizes_to_the_network() -> None:
    """The engine cuts an opening's slices to the gap between other conversations'
    frames; the demo's turn layer hands each size to the network's opening."""
    from realtime.testing.fake import FakeModel, FakeOptions

    inner = FakeModel(FakeOptions(prefill_token_delay=1e-4, prefill_steps_per_slice=4))
    model = DemoTurnModel(inner, _Letters(), SILENCE_CODES)
    opening = model.begin_session(system_prompt="p" * 10, seed=0, max_streaming_seconds=None)
    assert isinstance(opening, base.SizedSlices) and opening.most_steps == 4
    assert opening.advance_steps(1) is None and opening.steps_run == 1
    assert opening.advance_steps(3) is None and opening.steps_run == 3
    assert opening.advance_steps(4) is None and opening.steps_run == 4
    assert opening.advance_steps(4) is None and opening.steps_run == 2
    assert isinstance(opening.advance_steps(4), DemoTurnSession)
    assert inner.openings[-1].asked == [1, 3, 4, 4, 4]
