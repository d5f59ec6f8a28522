"""Prompts read into the model before the server says it is ready (``--warm-prompt``).

An agent's instructions and tools are one system prompt, the same for every
conversation; its first conversation would read it through the model token by token.
Warmed here at start (seed 0, the OpenAI endpoint's seed and the native default), that
conversation finds it in the model's prompt cache and opens as fast as a cached one.

A text file is a native ``session.system_prompt`` (one trailing newline dropped, as
editors add it); a ``.json`` file is an OpenAI ``session`` object (or a whole
``session.update`` event) whose ``instructions`` and ``tools`` become the prompt exactly
as ``/openai/v1/realtime`` renders them (:func:`realtime.openai.session.system_prompt`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from realtime.limits import Limits
from realtime.models.base import RealtimeModel, open_session
from realtime.models.prompt_cache import CachesPrompts, KeepsStates

log = logging.getLogger("realtime.warm")

WARM_PROMPT_ENV: Final = "REALTIME_WARM_PROMPT"
"""``--warm-prompt`` as an environment setting: files separated by the path separator."""

WARM_SEED: Final = 0


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
    """One file to warm: a native prompt's text, or an OpenAI session object."""

    source: str
    text: str | None = None
    session: Mapping[str, Any] | None = None


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


def read_warm_prompt(path: str | os.PathLike[str]) -> WarmPrompt:
    """The file's prompt; ValueError (one line, naming the file) when it cannot be."""
    name = os.fspath(path)
    try:
        raw = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the warm prompt {name}: {exc}") from None
    if not name.lower().endswith(".json"):
        text = raw[:-2] if raw.endswith("\r\n") else raw.removesuffix("\n")
        if not text.strip():
            raise ValueError(f"the warm prompt {name} is blank")
        return WarmPrompt(name, text=text)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"the warm prompt {name} is not JSON: {exc}") from None
    if isinstance(value, dict) and value.get("type") == "session.update":
        value = value.get("session")
    if not isinstance(value, dict):
        raise ValueError(
            f"the warm prompt {name} must hold an OpenAI session object "
            '({"instructions": ..., "tools": [...]}) or a session.update event'
        )
    return WarmPrompt(name, session=value)


def read_warm_prompts(paths: Sequence[str | os.PathLike[str]]) -> tuple[WarmPrompt, ...]:
    return tuple(read_warm_prompt(path) for path in paths)


def warm_prompts_from_env(environ: Mapping[str, str]) -> tuple[WarmPrompt, ...]:
    raw = environ.get(WARM_PROMPT_ENV, "")
    return read_warm_prompts([p for p in raw.split(os.pathsep) if p.strip()])


def system_prompt_of(prompt: WarmPrompt, model: RealtimeModel, limits: Limits) -> str | None:
    """The system prompt a conversation opens with, checked as its endpoint checks it
    (the token limit, and the OpenAI session's fields); ValueError when refused."""
    from realtime.limits import prompt_refusal
    from realtime.openai import events as ev
    from realtime.openai import session as sess

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
