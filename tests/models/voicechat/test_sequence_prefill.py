"""The sequence prefill (``--prefill sequence``): a prompt's language-model part read in
chunks of many tokens a forward pass. A chunk of one token is the step read bit for bit;
a longer chunk opens, streams and is stopped like the step read, in fewer slices, and
its states are cached (in memory and on disk) apart from the step read's, since their
last bits differ (demo checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from realtime.launch.cli import build_parser
from realtime.models.base import AudioDelta, PromptUse, open_session
from realtime.models.prompt_cache import STEP_READ, PrefillRead, prefill_read_from
from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.prompt import LanguageKey, _language_name, prompt_ids
from realtime.models.voicechat.session import VoiceChatSession
from tests.engine.test_isolation import LONG_PROMPT, audio_for, digest
from tests.models_fixtures import noise, push_all

# --- the setting (no model) ---------------------------------------------------------


def test_the_setting_reads_step_sequence_and_a_chunk() -> None:
    assert prefill_read_from(None) == prefill_read_from("") == prefill_read_from("step")
    assert prefill_read_from("step") == STEP_READ and STEP_READ.tag is None
    assert prefill_read_from("sequence") == PrefillRead("sequence")
    assert prefill_read_from("Sequence:32") == PrefillRead("sequence", 32)
    assert PrefillRead("sequence", 32).tag == "sequence-32"
    assert prefill_read_from("sequence:") == PrefillRead("sequence")
    for bad in ("steps", "sequence:x", "sequence:0", "sequence:99999", "step:4"):
        with pytest.raises(ValueError):
            prefill_read_from(bad)


def test_serve_takes_the_flag_and_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_parser().parse_args(["serve"]).prefill == STEP_READ
    args = build_parser().parse_args(["serve", "--prefill", "sequence:16"])
    assert args.prefill == PrefillRead("sequence", 16)
    monkeypatch.setenv("REALTIME_PREFILL", "sequence")
    assert build_parser().parse_args(["serve"]).prefill == PrefillRead("sequence")
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--prefill", "parallel"])
    assert exit_info.value.code == 2
    assert "--prefill is 'step', 'sequence' or 'sequence:N'" in capsys.readouterr().err


def test_a_sequence_reads_files_are_named_apart() -> None:
    ids = (1, 2, 3)
    step = _language_name(ids)
    assert step.startswith("language/")  # the step read's names are as they were
    assert _language_name(ids, None, "sequence-64").startswith("language-sequence-64/")
    assert (
        len(
            {
                step,
                _language_name(ids, None, "sequence-64"),
                _language_name(ids, None, "sequence-8"),
            }
        )
        == 3
    )


# --- on the model -------------------------------------------------------------------


def reading(demo_model: VoiceChatModel, read: PrefillRead) -> VoiceChatModel:
    """The demo checkpoint (its loaded weights) as a model whose openings read ``read``."""
    return VoiceChatModel(
        demo_model.runtime, Path(demo_model.path), demo_model.figures, prefill=read
    )


@pytest.fixture
def step_model(demo_model: VoiceChatModel) -> Iterator[VoiceChatModel]:
    yield reading(demo_model, STEP_READ)


def opened(model: VoiceChatModel, seed: int, prompt: str) -> VoiceChatSession:
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    assert isinstance(session, VoiceChatSession)
    return session


def slices_to_open(model: VoiceChatModel, seed: int, prompt: str) -> tuple[int, VoiceChatSession]:
    opening = model.begin_session(system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    slices = 1
    while (session := opening.advance()) is None:
        slices += 1
    assert isinstance(session, VoiceChatSession)
    return slices, session


def test_a_chunk_of_one_token_is_the_step_read_bit_for_bit(
    demo_model: VoiceChatModel, step_model: VoiceChatModel
) -> None:
    """Each language-model call of a one-token chunk is the step read's own call on the
    same input bits, so the session's every output is the same."""
    expected = digest(push_all(opened(step_model, 3, LONG_PROMPT), audio_for(3, 6)))
    single = reading(demo_model, PrefillRead("sequence", 1))
    assert digest(push_all(opened(single, 3, LONG_PROMPT), audio_for(3, 6))) == expected


def test_a_sequence_read_opens_in_fewer_slices_streams_and_is_cached_apart(
    demo_model: VoiceChatModel, step_model: VoiceChatModel
) -> None:
    """With the seed's voice chain long enough (a step read of the prompt ran first, in
    a model sharing the chain's store), a sequence read of a 100-token prompt takes a
    slice to begin, one a chunk and one to open; it streams audio; its state is a hit for the
    sequence read and a miss for the step read, and the reverse."""
    tokens = step_model.count_tokens(LONG_PROMPT)
    opened(step_model, 3, LONG_PROMPT)  # builds seed 3's chain and the step read's part
    chunked = PrefillRead("sequence", 16)
    step_model._prompts.read = chunked  # the same store: the chain is shared
    slices, session = slices_to_open(step_model, 3, LONG_PROMPT)
    assert session.prompt_use == PromptUse(tokens=tokens, cached=0)  # a miss: keyed apart
    # The lookup, one slice a chunk, then the session opens in a slice of its own.
    assert slices == 2 + -(-tokens // 16)
    events = push_all(session, audio_for(3, 6))
    assert sum(isinstance(e, AudioDelta) for e in events) >= 5
    keys = [k for k in step_model._prompts.store.held() if isinstance(k, LanguageKey)]
    assert sorted(str(k.read) for k in keys) == ["None", "sequence-16"]
    again = opened(step_model, 3, LONG_PROMPT)
    assert again.prompt_use == PromptUse(tokens=tokens, cached=tokens)  # its own hit
    assert digest(push_all(again, audio_for(3, 6))) == digest(events)
    step_model._prompts.read = STEP_READ
    back = opened(step_model, 3, LONG_PROMPT)  # the step read's own entry, not the other
    assert back.prompt_use.cached == tokens
    figures = step_model.prompt_cache_figures()
    assert (figures.hits, figures.misses) == (2, 2)


def test_a_sequence_read_is_stopped_between_chunks_and_opens_again(
    demo_model: VoiceChatModel,
) -> None:
    """Abandoned after two chunks, nothing of its language part is kept; the next
    opening of the prompt reads it whole and streams."""
    model = reading(demo_model, PrefillRead("sequence", 8))
    opening = model.begin_session(system_prompt=LONG_PROMPT, seed=4, max_streaming_seconds=None)
    for _ in range(3):
        assert opening.advance() is None
    opening.abandon()
    assert not model._prompts.pending
    assert not [k for k in model._prompts.store.held() if isinstance(k, LanguageKey)]
    session = opened(model, 4, LONG_PROMPT)
    assert session.prompt_use.cached == 0
    assert any(isinstance(e, AudioDelta) for e in push_all(session, audio_for(4, 3)))


def test_a_sequence_reads_state_file_is_not_a_step_reads(
    demo_model: VoiceChatModel, tmp_path: Path
) -> None:
    """On a shared state directory, a server restarted with the other read does not
    take the file of the first's: each reads and writes its own."""
    sequence = reading(demo_model, PrefillRead("sequence", 16))
    sequence.keep_states(tmp_path, 1 << 30, ahead_seed=0, ahead_tokens=0)
    opened(sequence, 5, LONG_PROMPT)
    while sequence.ahead(0, quiet=True).more:
        pass
    files = sequence._files
    assert files is not None
    ids = tuple(prompt_ids(demo_model.runtime, LONG_PROMPT))
    assert files.exists(_language_name(ids, None, "sequence-16"))
    assert not files.exists(_language_name(ids))
    step = reading(demo_model, STEP_READ)
    step.keep_states(tmp_path, 1 << 30, ahead_seed=0, ahead_tokens=0)
    assert opened(step, 5, LONG_PROMPT).prompt_use.cached == 0  # the chain, not the part
    again = reading(demo_model, PrefillRead("sequence", 16))
    again.keep_states(tmp_path, 1 << 30, ahead_seed=0, ahead_tokens=0)
    assert opened(again, 5, LONG_PROMPT).prompt_use.cached > 0  # its own file


# --- a tool result's feed ---------------------------------------------------------


def fed(model: VoiceChatModel, output: str) -> tuple[list[Any], int, VoiceChatSession]:
    """A session that heard two frames, then was fed ``output`` whole: the events of
    its next two frames, and the slices the feed took."""
    session = opened(model, 2, "Be brief.")
    x = noise(6)
    session.push_audio(x[:2560], 16000)
    feed = session.begin_tool_result(model.tool_input(output))
    slices = 1
    while not feed.advance():
        slices += 1
    assert session._inner._function_tokens[-1] == feed.closed_with
    return digest(session.push_audio(x[2560:], 16000)), slices, session


def test_a_tool_result_is_fed_a_few_steps_a_slice_and_a_chunk_of_one_is_the_step_feed(
    demo_model: VoiceChatModel, step_model: VoiceChatModel
) -> None:
    """The feed's language-model inputs never depend on its outputs: the sequence read's
    sessions feed a tool result four inserted steps a slice (their language model's in
    one pass), leaving the same timeline (tokens, index); with a chunk of one it is the
    step feed bit for bit."""
    output = '{"temperature": 21, "unit": "C"}'
    expected, step_slices, step_session = fed(step_model, output)
    single = reading(demo_model, PrefillRead("sequence", 1))
    assert fed(single, output)[:2] == (expected, step_slices)
    chunked = reading(demo_model, PrefillRead("sequence", 64))
    events, slices, session = fed(chunked, output)
    assert slices == -(-step_slices // 4)  # four inserted steps a slice
    inner, theirs = session._inner, step_session._inner
    assert inner._timeline_index == theirs._timeline_index
    assert inner._text_tokens == theirs._text_tokens
    assert inner._function_tokens[:-1] == theirs._function_tokens[:-1]
    assert [e[0] for e in events] == [e[0] for e in expected]  # the frames go on


def test_the_loader_hands_the_read_to_the_model(demo_path: Path) -> None:
    """``realtime serve --prefill`` reaches the loaded model (the demo's wrapper too)."""
    from realtime.launch.server import model_loader
    from realtime.models import load_model

    read = PrefillRead("sequence", 8)
    loaded = load_model(demo_path, prefill=read)
    assert isinstance(loaded, VoiceChatModel) and loaded._prompts.read == read
    assert isinstance(load_model(demo_path), VoiceChatModel)
    assert load_model(demo_path)._prompts.read == STEP_READ  # type: ignore[attr-defined]
    wrapped: Any = model_loader(None, None, prefill=read)()
    assert wrapped.inner._prompts.read == read
