"""Tenants: who holds which API key, how many conversations each may hold, and which
prompt-cache scope each opens in.

One ``--api-key`` is the one-tenant case (:data:`DEFAULT_TENANT`); ``--api-keys-file``
names several, one ``NAME KEY [max_sessions=N]`` a line, reloaded on SIGHUP
(:meth:`Tenants.reload`). A key is found by comparing its digest with every key's
digest, each comparison in constant time and none skipped, so how long a lookup takes
says nothing about which key (or how much of one) a guess matched.

Everything here runs on the trio thread (the upgrade check, the session's seat), so
the counts need no lock. Only :mod:`realtime.errors` is imported: the HTTP layer and
the session lifetime both use this module.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from realtime.errors import UsageError

DEFAULT_TENANT: Final = "default"
"""The tenant ``--api-key`` (``REALTIME_API_KEY``) names."""
MAX_KEYS_FILE_BYTES: Final = 1 << 20
"""A keys file larger than this is refused unread (it is a list of names and keys)."""
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A tenant's name: it is a metrics label and a log field, so plain and short."""
KEY_PATTERN: Final = re.compile(r"[!-~]{1,512}")
"""A key: printable ASCII without spaces (it travels in a header and a subprotocol)."""


@attrs.frozen(slots=True)
class Tenant:
    """One key's holder: its name (metrics, logs, the prompt cache's scope) and its own
    bound on conversations at once (None: only the server's ``--max-sessions``)."""

    name: str
    digest: bytes = attrs.field(repr=False)
    """SHA-256 of the key: what lookups compare (never the key itself)."""
    max_sessions: int | None = None

    @classmethod
    def of(cls, name: str, key: str, max_sessions: int | None = None) -> Tenant:
        return cls(name, _digest(key), max_sessions)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def parse_keys(text: str, source: str = "keys file") -> tuple[Tenant, ...]:
    """The tenants of a keys file's text: ``NAME KEY [max_sessions=N]`` a line; blank
    lines and ``#`` comments (a whole line, or from a field that starts with ``#``)
    are skipped. ValueError naming the line for anything else: a malformed name or key,
    an unknown option, a name or key given twice, or no key at all."""
    tenants: list[Tenant] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        comment = next((i for i, f in enumerate(fields) if f.startswith("#")), len(fields))
        fields = fields[:comment]
        if not fields:
            continue
        where = f"{source} line {number}"
        if len(fields) < 2:
            raise ValueError(f"{where}: expected 'NAME KEY [max_sessions=N]'")
        name, key, *options = fields
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(
                f"{where}: a tenant name is 1 to 64 letters, digits, '_', '.' or '-' "
                "(starting with a letter or digit)"
            )
        if not KEY_PATTERN.fullmatch(key):
            raise ValueError(f"{where}: a key is 1 to 512 printable ASCII characters")
        max_sessions: int | None = None
        for option in options:
            option_name, _, value = option.partition("=")
            if option_name != "max_sessions":
                raise ValueError(f"{where}: unknown option {option_name!r} (max_sessions=N)")
            if not value.isdecimal() or not 1 <= int(value) <= 1_000_000:
                raise ValueError(f"{where}: max_sessions must be an integer >= 1")
            max_sessions = int(value)
        digest = _digest(key)
        if name in names:
            raise ValueError(f"{where}: tenant {name!r} is named twice")
        if digest in digests:
            raise ValueError(f"{where}: this key is another tenant's too")
        names.add(name)
        digests.add(digest)
        tenants.append(Tenant(name, digest, max_sessions))
    if not tenants:
        raise ValueError(f"{source} holds no key (one 'NAME KEY' a line)")
    return tuple(tenants)


def read_keys_file(path: Path) -> tuple[Tenant, ...]:
    """:func:`parse_keys` of the file at ``path``; ValueError (one line) when it cannot
    be read, is too large, is not UTF-8 text or is malformed."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_KEYS_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the keys file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_KEYS_FILE_BYTES:
        raise ValueError(f"the keys file {path} is over {MAX_KEYS_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"the keys file {path} is not UTF-8 text") from None
    return parse_keys(text, f"the keys file {path}")


class Tenants:
    """The keys in force and each tenant's conversations open now.

    ``share_prompt_cache``: every tenant opens in one prompt-cache scope (the operator
    opted in); otherwise each tenant's is its own name (:meth:`prompt_scope`)."""

    def __init__(
        self,
        tenants: Sequence[Tenant],
        *,
        source: Path | None = None,
        share_prompt_cache: bool = False,
    ) -> None:
        if not tenants:
            raise ValueError("no tenant: at least one key is needed")
        self._tenants = tuple(tenants)
        self.source = source
        """The keys file (:meth:`reload` reads it again), or None for ``--api-key``."""
        self.share_prompt_cache = share_prompt_cache
        self._open: dict[str, int] = {}

    @classmethod
    def single(cls, key: str, *, share_prompt_cache: bool = False) -> Tenants:
        """``--api-key KEY``: one tenant, :data:`DEFAULT_TENANT`."""
        return cls([Tenant.of(DEFAULT_TENANT, key)], share_prompt_cache=share_prompt_cache)

    @classmethod
    def from_file(cls, path: Path, *, share_prompt_cache: bool = False) -> Tenants:
        """``--api-keys-file PATH``; ValueError (one line) for a bad file."""
        return cls(read_keys_file(path), source=path, share_prompt_cache=share_prompt_cache)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tenant.name for tenant in self._tenants)

    def find(self, candidates: Iterable[str]) -> Tenant | None:
        """The tenant whose key is one of ``candidates`` (the first candidate that is
        someone's key), or None. Every candidate is compared with every key, by
        digest and in constant time, whatever matched earlier."""
        found: Tenant | None = None
        for candidate in candidates:
            digest = _digest(candidate)
            for tenant in self._tenants:
                if hmac.compare_digest(digest, tenant.digest) and found is None:
                    found = tenant
        return found

    def reload(self) -> tuple[Tenant, ...]:
        """Read the keys file again and put its keys in force; ValueError (and the keys
        in force kept) when it is bad. Open conversations are untouched, and keep
        counting against their tenant's limit by name."""
        if self.source is None:
            raise ValueError("no keys file to reload (the key came from --api-key)")
        self._tenants = read_keys_file(self.source)
        return self._tenants

    def open_sessions(self, name: str) -> int:
        return self._open.get(name, 0)

    def seat(self, tenant: Tenant) -> Seat:
        """One connection's place in ``tenant``'s share (taken by :meth:`Seat.take`)."""
        scope = None if self.share_prompt_cache else tenant.name
        return Seat(tenant.name, scope, self)

    def _limit(self, name: str) -> int | None:
        """The limit in force now for ``name`` (a reload may have changed or removed it)."""
        for tenant in self._tenants:
            if tenant.name == name:
                return tenant.max_sessions
        return None

    def _take(self, name: str) -> str | None:
        limit = self._limit(name)
        held = self._open.get(name, 0)
        if limit is not None and held >= limit:
            plural = "" if limit == 1 else "s"
            return (
                f"tenant {name!r} has its limit of {limit} conversation{plural} open; "
                "try again when one ends"
            )
        self._open[name] = held + 1
        return None

    def _give_back(self, name: str) -> None:
        held = self._open.get(name, 0) - 1
        if held > 0:
            self._open[name] = held
        else:
            self._open.pop(name, None)


def share_from_env(env: Mapping[str, str]) -> bool:
    """``REALTIME_SHARE_PROMPT_CACHE`` (``1``/``true``/``yes``): ``--share-prompt-cache``."""
    return env.get("REALTIME_SHARE_PROMPT_CACHE", "").strip().lower() in ("1", "true", "yes")


def tenants_from(
    keys_file: str | None, api_key: str | None, *, share_prompt_cache: bool = False
) -> Tenants | None:
    """The tenants ``--api-keys-file`` (read now) or ``--api-key`` name (the same
    settings under the Hypercorn CLI: ``REALTIME_API_KEYS_FILE``, ``REALTIME_API_KEY``);
    None when neither is given. UsageError (exit 2) for both, or a bad file."""
    if keys_file is not None and api_key is not None:
        raise UsageError("give --api-key or --api-keys-file, not both")
    if keys_file is not None:
        try:
            return Tenants.from_file(
                Path(keys_file).expanduser(), share_prompt_cache=share_prompt_cache
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if api_key is not None:
        return Tenants.single(api_key, share_prompt_cache=share_prompt_cache)
    return None


@attrs.define(slots=True)
class Seat:
    """One connection's tenant: its name (metrics, the session log), the prompt-cache
    scope its openings use (None: the shared scope), and its hold on one of the
    tenant's conversations while the session runs."""

    name: str
    prompt_scope: str | None
    _tenants: Tenants
    _held: bool = False

    def take(self) -> str | None:
        """Hold one of the tenant's conversations; the refusal's message when the
        tenant already holds its limit (then nothing is held)."""
        if self._held:
            return None
        refusal = self._tenants._take(self.name)
        self._held = refusal is None
        return refusal

    def give_back(self) -> None:
        """Let the conversation go (idempotent)."""
        if self._held:
            self._held = False
            self._tenants._give_back(self.name)


__all__ = [
    "DEFAULT_TENANT",
    "Seat",
    "Tenant",
    "Tenants",
    "parse_keys",
    "read_keys_file",
    "share_from_env",
    "tenants_from",
]
