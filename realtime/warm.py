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
from realtime.models.prompt_cache import CachesPrompts

log = logging.getLogger("realtime.warm")

WARM_PROMPT_ENV: Final = "REALTIME_WARM_PROMPT"
"""``--warm-prompt`` as an environment setting: files separated by the path separator."""

WARM_SEED: Final = 0


@attrs.frozen(slots=True)
class WarmPrompt:
    """One file to warm: a native prompt's text, an OpenAI Realtime session object, or a
    Live session configuration."""

    source: str
    text: str | None = None
    session: Mapping[str, Any] | None = None
    live: Mapping[str, Any] | None = None


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
    if isinstance(value, dict) and value.get("type") == "session.start":
        live = value.get("session")
        if not isinstance(live, dict):
            raise ValueError(f"the warm prompt {name}: a session.start event needs a 'session'")
        return WarmPrompt(name, live=live)
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


def _live_prompt(
    prompt: WarmPrompt, session: Mapping[str, Any], model: RealtimeModel, limits: Limits
) -> str | None:
    """A Live session's prompt, checked as the Live endpoint checks it."""
    from realtime.limits import prompt_refusal
    from realtime.live.config import parse_config
    from realtime.live.prompt import system_prompt
    from realtime.openai import events as ev

    config = parse_config(session)
    if isinstance(config, ev.Invalid):
        raise ValueError(f"warm prompt {prompt.source}: {config.param}: {config.message}")
    text = system_prompt(config)
    refusal = prompt_refusal(
        text,
        limits.max_system_prompt_tokens,
        model.count_tokens,
        field="the instructions with the startup input and the delegate tool",
    )
    if refusal is not None:
        raise ValueError(f"warm prompt {prompt.source}: {refusal}")
    return text


def prepare_model(model: RealtimeModel, limits: Limits, prompts: Sequence[WarmPrompt]) -> None:
    """Bound the model's prompt cache and warm ``prompts`` into it (on the engine
    thread, before the engine is ready). ValueError for a prompt the server would
    refuse, or a model that keeps no prompt states."""
    if isinstance(model, CachesPrompts):
        model.set_prompt_cache_bytes(limits.prompt_cache_bytes)
    elif prompts:
        raise ValueError(f"{model.model_id} keeps no prompt states to warm")
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
    loader: Callable[[], RealtimeModel], limits: Limits, prompts: Sequence[WarmPrompt] = ()
) -> Callable[[], RealtimeModel]:
    """``loader`` followed by :func:`prepare_model`: what the engine thread runs, so
    ``/ready`` answers 200 only once the prompts are warm."""

    def load() -> RealtimeModel:
        model = loader()
        prepare_model(model, limits, prompts)
        return model

    return load


__all__ = [
    "WARM_PROMPT_ENV",
    "WarmPrompt",
    "prepare_model",
    "preparing",
    "read_warm_prompts",
    "warm_prompts_from_env",
]
