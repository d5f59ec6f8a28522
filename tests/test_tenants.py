"""Tenants: several API keys (``--api-keys-file``, reloaded on SIGHUP), each tenant's own
session limit, label and prompt-cache scope, through a real server on every WebSocket
endpoint; the keys file's rules as pure functions."""

from __future__ import annotations

import base64
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from realtime.engine.facade import Engine
from realtime.errors import UsageError
from realtime.launch.server import engine_for
from realtime.launch.warm import WarmPrompt
from realtime.limits import Limits
from realtime.models.voicechat.model import VoiceChatModel
from realtime.session.close_codes import CLOSE_TRY_AGAIN
from realtime.tenants import DEFAULT_TENANT, Tenant, Tenants, parse_keys, tenants_from
from realtime.testing.fake import FakeModel
from tests.helpers import ahttp, http, running_engine, running_server, start_realtime_server
from tests.models_fixtures import push_all, run_realtime

KEYS = """\
# tenant  key            options
acme      acme-key-1     max_sessions=1
globex    globex-key-2   # no limit of its own

"""
ENDPOINTS = ("/v1/realtime", "/openai/v1/realtime", "/openai/v1/live/sessions")
PREFIXES = {
    "/v1/realtime": "realtime-key.",
    "/openai/v1/realtime": "openai-insecure-api-key.",
    "/openai/v1/live/sessions": "openai-insecure-api-key.",
}


SILENCE = base64.b64encode(bytes(4800)).decode()
"""100 ms of PCM16 at 24 kHz: the OpenAI endpoint opens the model with the first audio."""
LIVE = {"model": "gpt-live-1"}


def tenants(share: bool = False) -> Tenants:
    return Tenants(parse_keys(KEYS), share_prompt_cache=share)


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    """The WebSocket upgrade's ``Authorization: Bearer KEY``."""
    return [(b"authorization", f"Bearer {key}".encode())]


def auth(key: str) -> dict[str, str]:
    """The same header for a plain HTTP request."""
    return {"Authorization": f"Bearer {key}"}


def ws_url(http_url: str, path: str) -> str:
    return http_url.replace("http://", "ws://") + path


# --- the keys file, as pure functions ----------------------------------------------


def test_a_keys_file_names_tenants_keys_and_limits() -> None:
    acme, globex = parse_keys(KEYS)
    assert (acme.name, acme.max_sessions) == ("acme", 1)
    assert (globex.name, globex.max_sessions) == ("globex", None)
    assert "acme-key-1" not in repr(acme)  # neither the key nor its digest is shown
    table = tenants()
    assert table.find(["acme-key-1"]) == acme
    assert table.find(["nope", "globex-key-2"]) == globex
    assert table.find(["acme-key-"]) is None and table.find([]) is None
    assert Tenants.single("k").find(["k"]) == Tenant.of(DEFAULT_TENANT, "k")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "holds no key"),
        ("# only a comment\n\n", "holds no key"),
        ("acme\n", "line 1: expected 'NAME KEY"),
        ("a k\nbad/name k2\n", "line 2: a tenant name"),
        ("a k max_sessions=0\n", "max_sessions must be an integer >= 1"),
        ("a k max_sessions=two\n", "max_sessions must be"),
        ("a k limit=3\n", "unknown option 'limit'"),
        ("a k1\na k2\n", "tenant 'a' is named twice"),
        ("a k\nb k\n", "line 2: this key is another tenant's too"),
        ("a k\u00e9y\n", "printable ASCII"),
    ],
)
def test_a_bad_keys_file_is_one_line_naming_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        parse_keys(text, "keys")
    assert "\n" not in str(info.value)


def test_the_keys_settings(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    assert tenants_from(None, None) is None
    single = tenants_from(None, "k")
    assert single is not None and single.names == (DEFAULT_TENANT,) and single.source is None
    table = tenants_from(str(path), None, share_prompt_cache=True)
    assert table is not None and table.names == ("acme", "globex") and table.source == path
    assert table.seat(parse_keys(KEYS)[0]).prompt_scope is None  # shared on request
    with pytest.raises(UsageError, match="not both"):
        tenants_from(str(path), "k")
    with pytest.raises(UsageError, match="cannot read the keys file"):
        tenants_from(str(tmp_path / "missing"), None)
    (tmp_path / "big").write_bytes(b"a k\n" + b"#" * (1 << 20))
    with pytest.raises(UsageError, match="over 1048576 bytes"):
        tenants_from(str(tmp_path / "big"), None)
    (tmp_path / "binary").write_bytes(b"a \xff\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        tenants_from(str(tmp_path / "binary"), None)


def test_seats_count_by_tenant_and_a_reload_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    table = Tenants.from_file(path)
    acme, globex = parse_keys(KEYS)
    first, second, other = table.seat(acme), table.seat(acme), table.seat(globex)
    assert first.prompt_scope == "acme" and other.prompt_scope == "globex"
    assert first.take() is None
    refusal = second.take()
    assert refusal is not None and "tenant 'acme'" in refusal and "limit of 1" in refusal
    assert other.take() is None and table.open_sessions("globex") == 1
    path.write_text("acme new-acme-key max_sessions=2\n")
    table.reload()
    assert table.find(["acme-key-1"]) is None and table.find(["new-acme-key"]) is not None
    assert table.find(["globex-key-2"]) is None
    assert second.take() is None  # the new limit, the open conversation still counted
    assert table.open_sessions("acme") == 2
    path.write_text("acme\n")
    with pytest.raises(ValueError, match="line 1"):
        table.reload()
    assert table.find(["new-acme-key"]) is not None  # the keys in force are kept
    first.give_back()
    first.give_back()  # idempotent
    second.give_back()
    other.give_back()
    assert table.open_sessions("acme") == table.open_sessions("globex") == 0


# --- through a real server (the fake model) ----------------------------------------


async def test_a_wrong_key_gets_401_on_every_websocket_endpoint(engine: Engine) -> None:
    async with running_server(engine, tenants=tenants()) as server:
        for path in ENDPOINTS:
            prefix = PREFIXES[path]
            for kwargs in (
                {},
                {"extra_headers": bearer("wrong")},
                {"extra_headers": bearer("acme-key-")},
                {"subprotocols": ["realtime", prefix + "wrong"]},
                {"subprotocols": ["realtime", "realtime-key.acme-key-1"]}
                if prefix != "realtime-key."
                else {"subprotocols": ["openai-insecure-api-key.acme-key-1"]},
            ):
                with pytest.raises(ConnectionRejected) as info:
                    async with open_websocket_url(ws_url(server.http, path), **kwargs):
                        pass
                assert info.value.status_code == 401, (path, kwargs)
            for kwargs in (
                {"extra_headers": bearer("globex-key-2")},
                {"subprotocols": ["realtime", prefix + "acme-key-1"]},
            ):
                async with open_websocket_url(ws_url(server.http, path), **kwargs) as ws:
                    if path != "/openai/v1/live/sessions":  # Live greets after session.start
                        created = json.loads(await ws.get_message())
                        assert created["type"] == "session.created", (path, created)
                with trio.fail_after(5):
                    while engine.is_reserved():
                        await trio.sleep(0.01)
        for route in ("/health", "/metrics", "/v1/models"):
            status, _ = await ahttp("GET", server.http + route, headers={"Authorization": "x"})
            assert status == 401
            status, _ = await ahttp("GET", server.http + route, headers=auth("acme-key-1"))
            assert status == 200


async def test_a_tenant_limit_refuses_with_server_busy_and_1013(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """acme may hold one conversation: its second gets the endpoint's ``server_busy``
    naming the tenant's limit and close 1013, on every WebSocket endpoint, while
    globex still gets in; the metrics and the session log name the tenant."""
    caplog.set_level(logging.INFO, logger="realtime.session")
    with running_engine(FakeModel(), capacity=4) as engine:
        async with running_server(engine, tenants=tenants(), limits=Limits(max_sessions=4)) as s:
            url = ws_url(s.http, "/v1/realtime")
            async with open_websocket_url(url, extra_headers=bearer("acme-key-1")) as held:
                assert json.loads(await held.get_message())["type"] == "session.created"
                for path in ENDPOINTS:
                    second = ws_url(s.http, path)
                    async with open_websocket_url(second, extra_headers=bearer("acme-key-1")) as ws:
                        error = json.loads(await ws.get_message())
                        assert error["type"] == "error", error
                        assert error["error"]["code"] == "server_busy"
                        assert "tenant 'acme' has its limit of 1" in error["error"]["message"]
                        with pytest.raises(ConnectionClosed) as closed:
                            await ws.get_message()
                        reason = closed.value.reason
                        assert reason is not None and reason.code == CLOSE_TRY_AGAIN
                async with open_websocket_url(url, extra_headers=bearer("globex-key-2")) as ws:
                    assert json.loads(await ws.get_message())["type"] == "session.created"
                    _, raw = await ahttp("GET", s.http + "/metrics", headers=auth("x1"))
                    assert raw["error"]["code"] == "unauthorized"
                    _, raw = await ahttp("GET", s.http + "/metrics", headers=auth("acme-key-1"))
                    metrics = raw.decode()
                    assert 'realtime_tenant_active_sessions{tenant="acme"} 1.0' in metrics
                    assert 'realtime_tenant_active_sessions{tenant="globex"} 1.0' in metrics
                    assert "realtime_active_sessions 2.0" in metrics
            with trio.fail_after(5):
                while engine.reserved:
                    await trio.sleep(0.01)
            # The seat went back with the session: acme gets in again.
            async with open_websocket_url(url, extra_headers=bearer("acme-key-1")) as ws:
                assert json.loads(await ws.get_message())["type"] == "session.created"
            with trio.fail_after(5):
                while engine.reserved:
                    await trio.sleep(0.01)
            _, raw = await ahttp("GET", s.http + "/metrics", headers=auth("acme-key-1"))
    metrics = raw.decode()
    refused = 'realtime_tenant_connections_refused_total{reason="tenant_limit",tenant="acme"} 3.0'
    assert refused in metrics
    assert 'realtime_connections_refused_total{reason="tenant_limit"} 3.0' in metrics
    assert 'realtime_tenant_sessions_total{outcome="closed",tenant="acme"} 2.0' in metrics
    assert 'realtime_tenant_sessions_total{outcome="closed",tenant="globex"} 1.0' in metrics
    assert 'realtime_tenant_active_sessions{tenant="acme"} 0.0' in metrics
    ended = [r for r in caplog.records if r.getMessage() == "session ended"]
    assert {vars(r)["realtime"]["tenant"] for r in ended} == {"acme", "globex"}
    refusals = [r for r in caplog.records if r.getMessage() == "connection refused"]
    assert [vars(r)["realtime"] for r in refusals] == [
        {"reason": "tenant_limit", "tenant": "acme"}
    ] * 3


@pytest.mark.parametrize("share", [False, True])
async def test_each_tenant_opens_in_its_own_prompt_scope(share: bool) -> None:
    """The tenant's name reaches the model's opening as its prompt-cache scope on every
    endpoint (the shared scope, None, with --share-prompt-cache or without keys)."""
    model = FakeModel()
    with running_engine(model) as engine:
        async with running_server(engine, tenants=tenants(share)) as server:
            for key in ("acme-key-1", "globex-key-2"):
                url = ws_url(server.http, "/v1/realtime")
                async with open_websocket_url(url, extra_headers=bearer(key)) as ws:
                    await ws.get_message()
                    update = {"type": "session.update", "session": {"system_prompt": "Hi."}}
                    await ws.send_message(json.dumps(update))
                    assert json.loads(await ws.get_message())["type"] == "session.updated"
                with trio.fail_after(5):
                    while engine.is_reserved():
                        await trio.sleep(0.01)
            for path, message in (
                ("/openai/v1/realtime", {"type": "input_audio_buffer.append", "audio": SILENCE}),
                ("/openai/v1/live/sessions", {"type": "session.start", "session": LIVE}),
            ):
                opened = len(model.prompt_scopes)
                url = ws_url(server.http, path)
                async with open_websocket_url(url, extra_headers=bearer("globex-key-2")) as ws:
                    await ws.send_message(json.dumps(message))
                    with trio.fail_after(10):
                        while len(model.prompt_scopes) == opened:
                            await trio.sleep(0.01)
                with trio.fail_after(5):
                    while engine.is_reserved():
                        await trio.sleep(0.01)
        async with running_server(engine) as server:
            async with open_websocket_url(ws_url(server.http, "/v1/realtime")) as ws:
                await ws.get_message()
                update = {"type": "session.update", "session": {"system_prompt": "Hi."}}
                await ws.send_message(json.dumps(update))
                assert json.loads(await ws.get_message())["type"] == "session.updated"
    expected = [None] * 4 if share else ["acme", "globex", "globex", "globex"]
    assert model.prompt_scopes == [*expected, None]


# --- the command line ----------------------------------------------------------------


def test_a_bad_keys_file_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "keys"
    bad.write_text("acme key max_sessions=-1\n")
    for args in (
        ["--api-keys-file", str(bad)],
        ["--api-keys-file", str(tmp_path / "missing")],
        ["--api-keys-file", str(bad), "--api-key", "k"],
    ):
        done = run_realtime(tmp_path, "serve", "--port", "0", *args)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if "error" in line]
        assert len(lines) == 1 and lines[0].startswith("realtime: error:"), done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_sighup_reloads_the_keys_without_dropping_connections(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("acme old-key\n")
    with start_realtime_server("--api-keys-file", str(keys), log_dir=tmp_path) as server:
        trio.run(_reload_while_connected, server, keys)
        log = server.output()
    assert "SIGHUP: API keys of 1 tenant(s) reloaded" in log
    assert "SIGHUP: keeping the keys in force: the keys file" in log and "line 1" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_sighup_without_a_keys_file_is_ignored(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``systemctl reload`` of a server with no keys file must not end it."""
    with start_realtime_server(log_dir=tmp_path) as server:
        server.proc.send_signal(signal.SIGHUP)
        trio.run(_wait_for, server, "no --api-keys-file to reload; ignored")
        assert http("GET", server.http + "/health")[0] == 200
        assert server.proc.poll() is None


async def _reload_while_connected(server: Any, keys: Path) -> None:
    async with open_websocket_url(server.url, extra_headers=bearer("old-key")) as held:
        assert json.loads(await held.get_message())["type"] == "session.created"
        await trio.Path(keys).write_text("acme new-key\n")
        server.proc.send_signal(signal.SIGHUP)
        await _wait_for(server, "reloaded")
        assert await status_of(server.http, "old-key") == 401
        assert await status_of(server.http, "new-key") == 200
        await trio.Path(keys).write_text("acme\n")
        server.proc.send_signal(signal.SIGHUP)
        await _wait_for(server, "keeping the keys in force")
        assert await status_of(server.http, "new-key") == 200
        # The conversation opened under the old key is still served.
        update = {"type": "session.update", "session": {"system_prompt": "Hi."}}
        await held.send_message(json.dumps(update))
        with trio.fail_after(60):
            while json.loads(await held.get_message())["type"] != "session.updated":
                pass
    assert server.proc.poll() is None


async def status_of(http_url: str, key: str) -> int:
    status, _ = await ahttp("GET", http_url + "/health", headers=auth(key))
    return status


async def _wait_for(server: Any, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.output():
        assert time.monotonic() < deadline, server.output()[-2000:]
        await trio.sleep(0.05)


# --- the prompt cache's scope (the demo checkpoint) ----------------------------------

A_PROMPT = "You answer for acme only. Keep it short."
WARMED = "You are a helpful voice assistant. Answer briefly."


async def _open_native(http_url: str, key: str, prompt: str) -> None:
    """One native conversation that opens ``prompt`` (seed 0) and leaves."""
    url = ws_url(http_url, "/v1/realtime")
    async with open_websocket_url(url, extra_headers=bearer(key)) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        session = {"seed": 0, "system_prompt": prompt}
        await ws.send_message(json.dumps({"type": "session.update", "session": session}))
        with trio.fail_after(120):
            event = json.loads(await ws.get_message())
        assert event["type"] == "session.updated", event


async def _cache(http_url: str, engine: Engine) -> tuple[int, int]:
    """(hits, misses) from ``/health`` as an authenticated caller, once the engine is free."""
    with trio.fail_after(10):
        while engine.is_reserved():
            await trio.sleep(0.01)
    status, body = await ahttp("GET", http_url + "/health", headers=auth("acme-key-1"))
    assert status == 200, body
    return body["prompt_cache"]["hits"], body["prompt_cache"]["misses"]


@pytest.mark.parametrize("share", [False, True])
async def test_a_tenants_prompt_is_no_hit_for_another_tenant(
    demo_model: VoiceChatModel, share: bool
) -> None:
    """acme opens a prompt cold, then again from the cache; globex's open of the same
    prompt is cold (a miss, so its speed says nothing about acme's prompts) unless the
    operator opted in to sharing (--share-prompt-cache). The warmed prompt is a hit for
    both. ``/health`` shows the cache only with a key."""
    engine = engine_for(lambda: demo_model, Limits(), warm=(WarmPrompt("operator", text=WARMED),))
    engine.start()
    try:
        async with running_server(engine, tenants=tenants(share)) as server:
            hits, misses = await _cache(server.http, engine)  # the warming was a miss
            steps = [
                ("acme-key-1", A_PROMPT, (0, 1)),
                ("globex-key-2", A_PROMPT, (1, 0) if share else (0, 1)),
                ("acme-key-1", A_PROMPT, (1, 0)),
                ("globex-key-2", A_PROMPT, (1, 0)),
                ("acme-key-1", WARMED, (1, 0)),
                ("globex-key-2", WARMED, (1, 0)),
            ]
            for key, prompt, (hit, miss) in steps:
                await _open_native(server.http, key, prompt)
                now = await _cache(server.http, engine)
                assert now == (hits + hit, misses + miss), (key, prompt == WARMED)
                hits, misses = now
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                status, body = await ahttp("GET", server.http + "/health", headers=headers)
                assert status == 401 and "prompt_cache" not in body
    finally:
        engine.shutdown()


def test_openings_in_two_scopes_never_share_and_each_equals_a_cold_open(
    demo_model: VoiceChatModel,
) -> None:
    """Two tenants opening one new prompt and seed at once run a prefill each (joining
    the other's would open sooner: the oracle again); a repeat in one scope is a hit;
    every one of them is, bit for bit, mlx-vlm's constructor's session."""
    from realtime.models.base import open_now
    from tests.engine.test_isolation import LONG_PROMPT, audio_for, digest
    from tests.models.test_prompt_cache import theirs

    demo_model.set_prompt_cache_bytes(1 << 30)
    try:
        expected = theirs(demo_model, 4, LONG_PROMPT)
        openings = [
            demo_model.begin_session(
                system_prompt=LONG_PROMPT, seed=4, max_streaming_seconds=None, prompt_scope=name
            )
            for name in ("acme", "globex")
        ]
        sessions: dict[int, Any] = {}
        while len(sessions) < 2:
            for i, opening in enumerate(openings):
                if i not in sessions and (session := opening.advance()) is not None:
                    sessions[i] = session
        figures = demo_model.prompt_cache_figures()
        assert (figures.misses, figures.shared, figures.hits) == (2, 0, 0)
        again = open_now(
            demo_model.begin_session(
                system_prompt=LONG_PROMPT, seed=4, max_streaming_seconds=None, prompt_scope="acme"
            )
        )
        assert demo_model.prompt_cache_figures().hits == 1
        for session in (*sessions.values(), again):
            assert digest(push_all(session, audio_for(4, 6))) == expected
    finally:
        demo_model.set_prompt_cache_bytes(1 << 30)
