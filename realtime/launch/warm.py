"""Prompts read into the model before the server says it is ready (``--warm-prompt``).

An agent's instructions and tools are one system prompt, the same for every
conversation; its first conversation would read it through the model token by token.
Warmed here at start (seed 0, the OpenAI endpoint's seed and the native default), that
conversation finds it in the model's prompt cache and opens as fast as a cached one.

A text file is a native ``session.system_prompt`` (one trailing newline dropped, as
editors add it); a ``.json`` file is an OpenAI ``session`` object (or a whole
``session.update`` event) whose ``instructions`` and ``tools`` become the prompt exactly
as ``/openai/v1/realtime`` renders them (:func:`realtime.openai.session.system_prompt`),
or a Live ``session.start`` event, rendered as ``/openai/v1/live/sessions`` renders it
(:func:`realtime.live.prompt.system_prompt`).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from realtime import jsonbounds
from realtime.limits import Limits
from realtime.models.base import RealtimeModel, open_session
from realtime.models.prompt_cache import CachesPrompts, KeepsStates

log = logging.getLogger(__name__)

WARM_PROMPT_ENV: Final = "REALTIME_WARM_PROMPT"
"""``--warm-prompt`` as an environment setting: files separated by the path separator."""

WARM_SEED: Final = 0
MAX_WARM_PROMPT_BYTES: Final = Limits().max_message_bytes
"""A warm-prompt file's bound when none is given: the default ``--max-message-bytes``."""


@attrs.frozen(slots=True)
class Keeping:
    """Prompt states beyond the process (``--state-cache-dir``, ``--build-ahead``): the
    directory their files are kept in (``None``: none on disk), and whether the default
    seed's voice chain is built ahead of need, at idle priority, to
    ``--max-system-prompt-tokens`` (:class:`~realtime.models.prompt_cache.KeepsStates`).
    The default keeps nothing: the server's launchers ask for both."""

    directory: Path | None = None
    build_ahead: bool = False


NO_KEEPING: Final = Keeping()
"""Nothing on disk and nothing built ahead (tests and tools that load a model)."""


@attrs.frozen(slots=True)
class WarmPrompt:
    """One file to warm: a native prompt's text, an OpenAI Realtime session object, or a
    Live session configuration."""

    source: str
    text: str | None = None
    session: Mapping[str, Any] | None = None
    live: Mapping[str, Any] | None = None


def keeping_from(
    directory: str | None, build_ahead: bool | None, environ: Mapping[str, str]
) -> Keeping:
    """What ``--state-cache-dir`` and ``--build-ahead`` ask for (``None``: unset, then
    ``REALTIME_STATE_CACHE_DIR`` and ``REALTIME_BUILD_AHEAD`` decide; both default on);
    ValueError for a bad switch."""
    from realtime.limits import BUILD_AHEAD_ENV, switch_from_env
    from realtime.models.state_files import STATE_CACHE_DIR_ENV, state_dir_from

    if directory is None:
        directory = environ.get(STATE_CACHE_DIR_ENV)
    if build_ahead is None:
        build_ahead = switch_from_env(environ, BUILD_AHEAD_ENV)
    return Keeping(state_dir_from(directory), build_ahead is not False)


def read_warm_prompt(
    path: str | os.PathLike[str], max_bytes: int = MAX_WARM_PROMPT_BYTES
) -> WarmPrompt:
    """The file's prompt; ValueError (one line, naming the file) when it cannot be.

    Read within bounds before anything is built: a regular file of at most
    ``max_bytes`` (``--max-message-bytes``: no client could send a larger prompt),
    UTF-8, and a ``.json`` file within the bounds a client's event is held to
    (:func:`realtime.jsonbounds.load`); an OpenAI session's fields are checked here
    too, as ``/openai/v1/realtime`` checks them, so a bad file is refused before the
    model loads (only the token count waits for the model's tokenizer)."""
    name = os.fspath(path)
    raw = _read_text(name, max_bytes)
    if not name.lower().endswith(".json"):
        text = raw[:-2] if raw.endswith("\r\n") else raw.removesuffix("\n")
        if not text.strip():
            raise ValueError(f"the warm prompt {name} is blank")
        return WarmPrompt(name, text=text)
    try:
        value = jsonbounds.load(raw)
    except jsonbounds.Refused as exc:
        raise ValueError(f"the warm prompt {name} {exc}") from None
    if isinstance(value, dict) and value.get("type") == "session.start":
        live = value.get("session")
        if not isinstance(live, dict):
            raise ValueError(f"the warm prompt {name}: a session.start event needs a 'session'")
        prompt = WarmPrompt(name, live=live)
        _live_prompt_text(prompt, live)  # refused before the model loads
        return prompt
    if isinstance(value, dict) and value.get("type") == "session.update":
        value = value.get("session")
    if not isinstance(value, dict):
        raise ValueError(
            f"the warm prompt {name} must hold an OpenAI session object "
            '({"instructions": ..., "tools": [...]}) or a session.update event'
        )
    prompt = WarmPrompt(name, session=value)
    _check_session(prompt)
    return prompt


def _read_text(name: str, max_bytes: int) -> str:
    """The file's text, read no further than ``max_bytes`` + 1 whatever it is."""
    try:
        info = os.stat(name)
        if not stat.S_ISREG(info.st_mode):
            what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ValueError(f"cannot read the warm prompt {name}: it is {what}")
        if info.st_size > max_bytes:
            raise ValueError(_too_large(name, info.st_size, max_bytes))
        with open(name, "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the warm prompt {name}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew since stat
        raise ValueError(_too_large(name, len(data), max_bytes))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the warm prompt {name} is not UTF-8 text: {exc}") from None


def _too_large(name: str, size: int, max_bytes: int) -> str:
    return (
        f"the warm prompt {name} is {size} bytes, over the {max_bytes}-byte limit "
        "(--max-message-bytes: no client could send a longer prompt)"
    )


def _check_session(prompt: WarmPrompt) -> None:
    """An OpenAI session's fields, checked as the endpoint checks them (the token count
    aside: it needs the model, :func:`system_prompt_of`)."""
    from realtime.openai import events as ev
    from realtime.openai import session as sess

    merged = sess.updated(
        ev.default_session("warm", "warm"),
        dict(prompt.session or {}),
        applied=None,
        max_prompt_tokens=1 << 62,
        count_tokens=len,
    )
    if isinstance(merged, ev.Invalid):
        raise ValueError(f"warm prompt {prompt.source}: {merged.param}: {merged.message}")


def read_warm_prompts(
    paths: Sequence[str | os.PathLike[str]], max_bytes: int = MAX_WARM_PROMPT_BYTES
) -> tuple[WarmPrompt, ...]:
    return tuple(read_warm_prompt(path, max_bytes) for path in paths)


def warm_prompts_from_env(
    environ: Mapping[str, str], max_bytes: int = MAX_WARM_PROMPT_BYTES
) -> tuple[WarmPrompt, ...]:
    raw = environ.get(WARM_PROMPT_ENV, "")
    return read_warm_prompts([p for p in raw.split(os.pathsep) if p.strip()], max_bytes)


def system_prompt_of(prompt: WarmPrompt, model: RealtimeModel, limits: Limits) -> str | None:
    """The system prompt a conversation opens with, checked as its endpoint checks it
    (the token limit, and the OpenAI session's fields); ValueError when refused."""
    from realtime.limits import prompt_refusal
    from realtime.openai import events as ev
    from realtime.openai import session as sess

    if prompt.live is not None:
        return _live_prompt(prompt, prompt.live, model, limits)
    if prompt.session is None:
        refusal = prompt_refusal(
            prompt.text,
            limits.max_system_prompt_tokens,
            model.count_tokens,
            field="the system prompt",
        )
        if refusal is not None:
            raise ValueError(f"warm prompt {prompt.source}: {refusal}")
        return prompt.text
    merged = sess.updated(
        ev.default_session("warm", model.model_id),
        dict(prompt.session),
        applied=None,
        max_prompt_tokens=limits.max_system_prompt_tokens,
        count_tokens=model.count_tokens,
    )
    if isinstance(merged, ev.Invalid):
        raise ValueError(f"warm prompt {prompt.source}: {merged.param}: {merged.message}")
    return sess.system_prompt(merged)


def _live_prompt_text(prompt: WarmPrompt, session: Mapping[str, Any]) -> str | None:
    """A Live session's prompt as the Live endpoint renders it; ValueError for a
    configuration the endpoint would refuse."""
    from realtime.live.config import parse_config
    from realtime.live.prompt import system_prompt
    from realtime.openai import events as ev

    config = parse_config(session)
    if isinstance(config, ev.Invalid):
        raise ValueError(f"warm prompt {prompt.source}: {config.param}: {config.message}")
    return system_prompt(config)


def _live_prompt(
    prompt: WarmPrompt, session: Mapping[str, Any], model: RealtimeModel, limits: Limits
) -> str | None:
    """A Live session's prompt, checked as the Live endpoint checks it (its length too)."""
    from realtime.limits import prompt_refusal

    text = _live_prompt_text(prompt, session)
    refusal = prompt_refusal(
        text,
        limits.max_system_prompt_tokens,
        model.count_tokens,
        field="the instructions with the startup input and the delegate tool",
    )
    if refusal is not None:
        raise ValueError(f"warm prompt {prompt.source}: {refusal}")
    return text


def prepare_model(
    model: RealtimeModel,
    limits: Limits,
    prompts: Sequence[WarmPrompt],
    keeping: Keeping = NO_KEEPING,
) -> None:
    """Bound the model's prompt cache, keep its states as ``keeping`` says, and warm
    ``prompts`` into it (on the engine thread, before the engine is ready). ValueError
    for a prompt the server would refuse, or a model that keeps no prompt states."""
    if isinstance(model, CachesPrompts):
        model.set_prompt_cache_bytes(limits.prompt_cache_bytes)
    elif prompts:
        raise ValueError(f"{model.model_id} keeps no prompt states to warm")
    if isinstance(model, KeepsStates):
        ahead = limits.max_system_prompt_tokens if keeping.build_ahead else 0
        model.keep_states(
            keeping.directory, limits.state_cache_bytes, ahead_seed=WARM_SEED, ahead_tokens=ahead
        )
        if keeping.directory is not None and limits.state_cache_bytes > 0:
            log.info(
                "prompt states are kept in %s (at most %d bytes, --state-cache-dir)",
                keeping.directory,
                limits.state_cache_bytes,
            )
    warmed = 0
    for prompt in prompts:
        text = system_prompt_of(prompt, model, limits)
        started = time.perf_counter()
        session = open_session(
            model, system_prompt=text, seed=WARM_SEED, max_streaming_seconds=None
        )
        session.cancel()
        model.clear_cache()
        tokens = model.count_tokens(text) if text is not None else 0
        warmed += tokens
        log.info(
            "warmed prompt %s (%d tokens) in %.1f s",
            prompt.source,
            tokens,
            time.perf_counter() - started,
        )
    if not isinstance(model, CachesPrompts):
        return
    # What warming left is kept for good: no client's openings can evict it.
    model.pin_prompt_cache()
    figures = model.prompt_cache_figures()
    if warmed and figures.bytes == 0:
        log.warning("no warmed prompt fits --prompt-cache-bytes %d", figures.max_bytes)


def preparing(
    loader: Callable[[], RealtimeModel],
    limits: Limits,
    prompts: Sequence[WarmPrompt] = (),
    keeping: Keeping = NO_KEEPING,
) -> Callable[[], RealtimeModel]:
    """``loader`` followed by :func:`prepare_model`: what the engine thread runs, so
    ``/ready`` answers 200 only once the prompts are warm."""

    def load() -> RealtimeModel:
        model = loader()
        prepare_model(model, limits, prompts, keeping)
        return model

    return load


__all__ = [
    "NO_KEEPING",
    "WARM_PROMPT_ENV",
    "Keeping",
    "WarmPrompt",
    "keeping_from",
    "prepare_model",
    "preparing",
    "read_warm_prompts",
    "warm_prompts_from_env",
]
