"""Limits, shared by the CLI, the app, the connection lifecycle and the shutdown.

Each field says, in its metadata, how a user sets it: its help text, its kind of
number and whether 0 is allowed. The ``realtime serve`` flags (``--idle-timeout``)
and the environment settings of ``realtime.asgi`` (``REALTIME_IDLE_TIMEOUT``) are
made from those fields, so a new limit is one field here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import attrs

_SETTING = "realtime.setting"

MAX_CHARS_PER_TOKEN: Final = 64
"""No token of a real tokenizer spans more characters: a longer prompt is refused
without tokenizing it (tokenizing megabytes would stall every connection)."""

PROMPT_CACHE_BYTES: Final = 4 << 30
"""4 GiB of prompt states by default: one 4,096-token agent prompt of the real 11B
(mostly its TTS caches) with room to spare, thousands on the demo checkpoints
(docs/performance.md, "Opening a conversation", has the estimate per token)."""


STATE_CACHE_BYTES: Final = 4 << 30
"""4 GiB of prompt-state files by default (``--state-cache-dir``)."""


@attrs.frozen(slots=True)
class Setting:
    """How a user sets one limit: a flag, an environment variable, a checked number."""

    name: str
    kind: type[int] | type[float]
    help: str
    default: int | float
    zero_allowed: bool = False

    @property
    def flag(self) -> str:
        """The ``realtime serve`` option, e.g. ``--idle-timeout``."""
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """The environment variable ``realtime.asgi`` reads, e.g. ``REALTIME_IDLE_TIMEOUT``."""
        return "REALTIME_" + self.name.upper()

    @property
    def bound(self) -> str:
        return ">= 0" if self.zero_allowed else "> 0"

    @property
    def requirement(self) -> str:
        """What a valid value is, in words: ``an integer > 0``, ``a number >= 0``."""
        noun = "an integer" if self.kind is int else "a number"
        return f"{noun} {self.bound}"

    def convert(self, text: str) -> int | float:
        """The text as this setting's kind of number; ValueError when it is not one."""
        return self.kind(text)

    def allows(self, value: object) -> bool:
        """Whether ``value`` is of the right kind, finite and within the bound."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        return value >= 0 if self.zero_allowed else value > 0

    def parse(self, text: str) -> int | float:
        """Convert and check; ValueError ``expected <requirement>, got '<text>'``."""
        try:
            value = self.convert(text)
        except ValueError:
            value = None
        if not self.allows(value):
            raise ValueError(f"expected {self.requirement}, got {text!r}")
        assert value is not None
        return value


def _check(_instance: object, field: attrs.Attribute[Any], value: object) -> None:
    spec = setting(field)
    if not spec.allows(value):
        raise ValueError(f"{spec.name} must be {spec.requirement}, got {value!r}")


def _limit(
    kind: type[int] | type[float], default: int | float, help: str, *, zero_allowed: bool = False
) -> Any:
    """A Limits field carrying what the CLI and the environment need to set it."""
    meta = {_SETTING: {"kind": kind, "help": help, "zero_allowed": zero_allowed}}
    return attrs.field(default=default, validator=_check, metadata=meta)


@attrs.frozen(slots=True)
class Limits:
    max_sessions: int = _limit(
        int,
        1,
        "conversations served at once on the one model engine (both endpoints share "
        "them); the next client gets server_busy and close 1013",
    )
    """Conversations at once (1: the seed's rule). More share the engine thread, each
    isolated bit for bit, scheduled by frame deadline (realtime.engine.scheduler)."""
    admission_margin: float = _limit(
        float,
        0.75,
        "with --max-sessions > 1, also refuse a conversation when the engine's measured "
        "step time says the open ones would pass this fraction of a frame's time; "
        "0 turns this off",
        zero_allowed=True,
    )
    """Admission by load: a new conversation is refused (server_busy, 1013; /ready 503)
    when ``(open + 1) x p90 step time > margin x frame time`` (realtime.engine.admission),
    or while the admitted ones fall behind (realtime.engine.fairshare.FrameLateness)."""
    max_message_bytes: int = _limit(int, 4 * 1024 * 1024, "largest client message accepted")
    """Largest client message; larger ones get an ``invalid_request`` error."""
    max_pending_audio_seconds: float = _limit(
        float,
        20.0,
        "input audio queued ahead of the model before appends are refused",
    )
    """Input audio accepted but not yet run by the model; more is refused."""
    configure_timeout: float = _limit(float, 30.0, "seconds to wait for session.update")
    """No ``session.update`` within this many seconds: error and close 1008."""
    idle_timeout: float = _limit(float, 120.0, "seconds without a client message before closing")
    """No client message for this many seconds: close 1008."""
    send_timeout: float = _limit(
        float, 10.0, "seconds a client may stop reading before it is dropped"
    )
    """A client that reads nothing for this long while events wait is dropped (1008)."""
    send_queue_events: int = _limit(int, 256, "outgoing events buffered per connection")
    """Outgoing events buffered per connection before the model waits for the client."""
    max_system_prompt_tokens: int = _limit(
        int,
        4096,
        "longest system prompt accepted (session.system_prompt; on the OpenAI endpoint "
        "the instructions with the declared tools), in the model's tokens",
    )
    """Opening a session prefills the prompt one model step per token, so its length is
    session-open time: longer prompts are refused before any model work
    (:func:`prompt_refusal`)."""
    live_max_seconds: float = _limit(
        float,
        3600.0,
        "longest Live API session (/openai/v1/live/sessions) in seconds of its timeline; "
        "then session.closed with reason expired",
    )
    """A Live session's ``expires_at``: its timeline (model frames) stops there."""
    prompt_cache_bytes: int = _limit(
        int,
        PROMPT_CACHE_BYTES,
        "memory kept for the states system prompts leave in the model, so a prompt seen "
        "before (or warmed at start) opens at once; least recently used first "
        "out; 0 keeps none",
        zero_allowed=True,
    )
    """The model's prompt-state cache (realtime.models.prompt_cache): a hit opens a
    conversation bit for bit as a cold open would, in one engine slice."""
    state_cache_bytes: int = _limit(
        int,
        STATE_CACHE_BYTES,
        "disk kept for prompt states in --state-cache-dir, so prompts seen before and the "
        "voice chain built ahead survive a restart; least recently used first out; 0 "
        "keeps none",
        zero_allowed=True,
    )
    """The state files (realtime.models.state_files): read back bit for bit, or ignored."""
    max_step_seconds: float = _limit(
        float,
        30.0,
        "seconds one model call may make no progress before the engine is declared hung "
        "and the process exits for its supervisor to restart it",
    )
    """A model call stuck this long: /health 503, clients get errors, exit code 3."""
    drain_timeout: float = _limit(
        float,
        0.0,
        "on SIGTERM, refuse new conversations and let the open one finish for up to this "
        "many seconds before closing it with 1001; 0 closes at once",
        zero_allowed=True,
    )
    """SIGTERM drain: ``/ready`` and new upgrades answer 503 while the open conversation
    may finish for this long (0: no drain)."""
    shutdown_timeout: float = _limit(
        float,
        5.0,
        "seconds open connections get to close on shutdown before their sockets are aborted",
    )
    """After the drain: connections are told to close (1001); any still open after this
    many seconds (a client that reads nothing) has its TCP connection aborted, so the
    process always exits within about this bound."""
    max_connections: int = _limit(
        int,
        0,
        "open TCP connections (HTTP and WebSocket) before new ones get HTTP 503; "
        "0 sizes it from the process's descriptor limit (ulimit -n)",
        zero_allowed=True,
    )
    """Past this many open connections a new one is answered 503 and closed before any
    request is read, so descriptors never run out under a live session (0: a third of
    the descriptors left free at start, less a reserve; see realtime.http.guard)."""

    resume_grace: float = _limit(
        float,
        30.0,
        "seconds a resumable conversation (resumable=1) waits for its client after its "
        "connection drops, holding its slot with its timeline paused; 0 turns resume off",
        zero_allowed=True,
    )
    """A detached session keeps its slot this long (docs/resume.md); then it ends with
    outcome ``resume_expired``."""
    resume_journal_bytes: int = _limit(
        int,
        8 * 1024 * 1024,
        "bytes of events a resumable conversation keeps until its client acknowledges "
        "them; a resume that needs an event dropped past this gets resync_required",
    )
    """The replay journal's byte bound (realtime.session.resume.Journal)."""
    resume_journal_seconds: float = _limit(
        float,
        60.0,
        "seconds an unacknowledged event of a resumable conversation is kept for a replay",
    )
    """The replay journal's age bound."""


BATCH_FRAMES_ENV: Final = "REALTIME_BATCH_FRAMES"
"""``--batch-frames`` / ``--no-batch-frames`` as an environment setting (``realtime.asgi``;
the flag's default for ``realtime serve``). A switch, not a number, so it is no
:class:`Limits` field: :func:`batching` decides it with ``max_sessions``."""

_SWITCH: Final = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


BUILD_AHEAD_ENV: Final = "REALTIME_BUILD_AHEAD"
"""``--build-ahead`` / ``--no-build-ahead`` as an environment setting (on unless set
off; :class:`realtime.warm.Keeping`)."""


def switch_from_env(environ: Mapping[str, str], name: str) -> bool | None:
    """The environment variable ``name`` as a switch (``None``: unset or empty, the
    default applies); ValueError with a one-line message naming the variable."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return _SWITCH[raw.lower()]
    except KeyError:
        raise ValueError(
            f"{name} must be one of 1, 0, true, false, yes, no, on, off; got {raw!r}"
        ) from None


def batch_frames_from_env(environ: Mapping[str, str]) -> bool | None:
    """``REALTIME_BATCH_FRAMES`` as a switch (:func:`switch_from_env`)."""
    return switch_from_env(environ, BATCH_FRAMES_ENV)


def batching(batch_frames: bool | None, max_sessions: int) -> bool:
    """Whether the frames that are due run as one batched model step: as asked, else on
    exactly when more than one conversation may run (one conversation steps alone, the
    seed's behaviour)."""
    return max_sessions > 1 if batch_frames is None else batch_frames


def message_size(frame: str | bytes, limit: int) -> int:
    """A client message's size as ``max_message_bytes`` counts it, on both endpoints:
    bytes, UTF-8 for text (a character may be four). Exact whenever it may matter: a
    text that cannot reach ``limit`` even at four bytes a character is not encoded."""
    if isinstance(frame, (bytes, bytearray)):
        return len(frame)
    if len(frame) * 4 <= limit or frame.isascii():
        return len(frame)
    return len(frame.encode("utf-8", "surrogatepass"))


def prompt_refusal(
    prompt: str | None, limit: int, count_tokens: Callable[[str], int], *, field: str
) -> str | None:
    """Why a system prompt is over ``limit`` tokens of ``count_tokens`` (the model's
    tokenizer), or ``None`` when it fits; ``field`` names it in the message. Decided
    before any model work, and cheaply: a prompt of few bytes is not tokenized, nor
    one too long for any tokenizer to bring within the limit."""
    if prompt is None or len(prompt.encode("utf-8")) + 2 <= limit:
        return None  # a token is at least one byte: it fits without counting
    why = "opening a session runs one model step per prompt token"
    if len(prompt) > limit * MAX_CHARS_PER_TOKEN:
        return (
            f"{field} of {len(prompt)} characters is far longer than the {limit}-token "
            f"limit (--max-system-prompt-tokens); {why}"
        )
    try:
        tokens = count_tokens(prompt)
    except Exception as exc:  # the tokenizer refused the text
        return f"{field} cannot be tokenized: {type(exc).__name__}: {exc}"
    if tokens <= limit:
        return None
    return (
        f"{field} is {tokens} tokens, over the {limit}-token limit "
        f"(--max-system-prompt-tokens); {why}"
    )


def setting(field: attrs.Attribute[Any]) -> Setting:
    """The user-facing description of one Limits field."""
    meta = field.metadata[_SETTING]
    return Setting(
        name=field.name,
        kind=meta["kind"],
        help=meta["help"],
        default=cast("int | float", field.default),
        zero_allowed=meta["zero_allowed"],
    )


def limit_settings() -> tuple[Setting, ...]:
    """Every limit, in field order: what the CLI and the environment loop over."""
    return tuple(setting(field) for field in attrs.fields(Limits))


def limits_from(values: Mapping[str, int | float]) -> Limits:
    """Limits with the given fields changed from the defaults (checked by the fields)."""
    return Limits(**cast("dict[str, Any]", values))


def limits_from_env(environ: Mapping[str, str]) -> Limits:
    """Limits from ``REALTIME_<FIELD>`` variables; unset ones keep their defaults.

    Raises ValueError with a one-line message naming the variable.
    """
    values: dict[str, int | float] = {}
    for spec in limit_settings():
        raw = environ.get(spec.env)
        if raw is None:
            continue
        try:
            value = spec.convert(raw)
        except ValueError:
            raise ValueError(f"{spec.env} must be a number, got {raw!r}") from None
        if not spec.allows(value):
            raise ValueError(f"{spec.env} must be {spec.bound}, got {raw!r}")
        values[spec.name] = value
    return limits_from(values)
