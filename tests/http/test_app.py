"""HTTP routes, authentication, the Origin policy and both ways of launching."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionRejected

from realtime.engine.facade import Engine
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import (
    ServerProcess,
    ahttp,
    append_msg,
    connect,
    http,
    noise,
    running_server,
    start_hypercorn_cli,
    start_realtime_server,
)


async def test_chat_routes_answer_501(engine: Engine) -> None:
    async with running_server(engine) as server:
        for route in ("/v1/chat/completions", "/v1/completions"):
            status, body = await ahttp(
                "POST",
                server.http + route,
                body=b"{}",
                headers={"Content-Type": "application/json"},
            )
            assert status == 501
            assert body["error"]["code"] == "not_implemented"
            assert "/v1/realtime" in body["error"]["message"]


async def test_health_and_models(engine: Engine) -> None:
    async with running_server(engine) as server:
        status, body = await ahttp("GET", server.http + "/health")
        assert status == 200
        assert body["model"] == "fake-voicechat" and body["engine_alive"] is True
        assert body["session_active"] is False
        async with connect(server.url) as client:
            await client.recv()
            _, body = await ahttp("GET", server.http + "/health")
            assert body["session_active"] is True
        status, body = await ahttp("GET", server.http + "/v1/models")
        assert status == 200
        assert [m["id"] for m in body["data"]] == ["fake-voicechat"]


async def test_health_is_503_when_the_engine_died() -> None:
    model = FakeModel(FakeOptions(die_on_frame=0))
    engine = Engine(lambda: model)
    engine.start()
    async with running_server(engine) as server:
        async with connect(server.url) as client:
            await client.configure()
            await client.send(append_msg(noise(1280)))
            await client.recv_until("error")
        status, body = await ahttp("GET", server.http + "/health")
        assert status == 503
        assert body["engine_alive"] is False and "SystemExit" in body["reason"]


async def test_api_key_required_on_upgrade(engine: Engine) -> None:
    async with running_server(engine, api_key="s3cret") as server:
        for headers in ([], [("Authorization", "Bearer nope")], [("Authorization", "s3cret")]):
            with pytest.raises(ConnectionRejected) as info:
                async with connect(server.url, extra_headers=headers):
                    pass
            assert info.value.status_code == 401
        assert not engine.is_reserved()
        async with connect(server.url, extra_headers=[("Authorization", "Bearer s3cret")]) as c:
            assert (await c.recv())["type"] == "session.created"
        status, body = await ahttp("GET", server.http + "/health")
        assert status == 401 and body["error"]["code"] == "unauthorized"
        status, _ = await ahttp(
            "GET", server.http + "/health", headers={"Authorization": "Bearer s3cret"}
        )
        assert status == 200
        status, _ = await ahttp("POST", server.http + "/v1/chat/completions", body=b"{}")
        assert status == 401


async def test_key_subprotocol_is_accepted_and_not_echoed(engine: Engine) -> None:
    async with running_server(engine, api_key="s3cret") as server:
        async with connect(server.url, subprotocols=["realtime", "realtime-key.s3cret"]) as c:
            assert c.ws.subprotocol == "realtime"
            assert (await c.recv())["type"] == "session.created"
        with pytest.raises(ConnectionRejected) as info:
            async with connect(server.url, subprotocols=["realtime", "realtime-key.wrong"]):
                pass
        assert info.value.status_code == 401


async def test_disallowed_origin_gets_403(engine: Engine) -> None:
    async with running_server(engine, allowed_origins=["https://app.example"]) as server:
        host = server.http.removeprefix("http://")
        with pytest.raises(ConnectionRejected) as info:
            async with connect(server.url, extra_headers=[("Origin", "https://evil.example")]):
                pass
        assert info.value.status_code == 403
        assert b"--allowed-origin" in (info.value.body or b"")
        for origin in (f"http://{host}", "https://app.example"):
            async with connect(server.url, extra_headers=[("Origin", origin)]) as client:
                assert (await client.recv())["type"] == "session.created"
            with trio.fail_after(2):
                while engine.is_reserved():
                    await trio.sleep(0.01)
    async with running_server(engine, allowed_origins=["*"]) as server:
        async with connect(server.url, extra_headers=[("Origin", "https://any.example")]) as c:
            assert (await c.recv())["type"] == "session.created"


def test_bad_cli_usage_exits_2(tmp_path: Path) -> None:
    for args in (
        ["serve", "--port", "99999"],
        ["serve", "--idle-timeout", "0"],
        ["serve", "-m", str(tmp_path / "missing")],
        ["bogus"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "realtime", *args], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert "error" in result.stderr


@pytest.mark.slow
def test_serve_sigterm_closes_session_1001_and_exits_0(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    with start_realtime_server(log_dir=tmp_path) as server:
        code = trio.run(_hold_session_then_signal, server)
        assert code == 1001
        assert server.proc.wait(30) == 0
        log = server.output()
        assert "stopped" in log and "Traceback" not in log, log


async def _hold_session_then_signal(server: ServerProcess) -> int | None:
    async with connect(server.url) as client:
        await client.configure()
        server.proc.send_signal(signal.SIGTERM)
        return await client.closed_code(timeout=20)


@pytest.mark.slow
def test_hypercorn_cli_launch_serves_health(demo_cache_dir: Path, tmp_path: Path) -> None:
    env = {
        "REALTIME_API_KEY": "k",
        "REALTIME_IDLE_TIMEOUT": "60",
        "REALTIME_MAX_SESSIONS": "3",
        "REALTIME_CACHE_DIR": os.environ["REALTIME_CACHE_DIR"],
    }
    with start_hypercorn_cli(env, tmp_path) as server:
        status, body = http("GET", server.http + "/health", headers={"Authorization": "Bearer k"})
        assert status == 200, body
        assert body["engine_alive"] is True and body["model"].startswith("realtime-demo")
        assert (body["capacity"], body["sessions_active"]) == (3, 0)
        status, _ = http("GET", server.http + "/health")
        assert status == 401
