"""§7: the Host header and the Origin's scheme, host and port (DNS rebinding)."""

from __future__ import annotations

import json

import pytest
import trio

from realtime.engine.facade import Engine
from realtime.http.app import ServerState, host_allowed, origin_allowed
from tests.helpers import ahttp, running_server
from tests.reliability.rawws import RawClient

LOOPBACK = ("127.0.0.1",)


@pytest.mark.parametrize(
    "host",
    # None and "": no Host header (HTTP/1.0 health checks); servers hand it on as "".
    [
        "localhost",
        "localhost:8080",
        "127.0.0.1:9",
        "127.3.4.5",
        "[::1]:8080",
        "LOCALHOST",
        None,
        "",
    ],
)
def test_a_loopback_server_answers_loopback_names(host: str | None) -> None:
    assert host_allowed(host, LOOPBACK, ())
    assert host_allowed(host, ("::1",), ())


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8080", "10.0.0.1:8080", " ", "a b", "x@127.0.0.1", "[::2]"],
)
def test_a_loopback_server_refuses_other_names(host: str) -> None:
    assert not host_allowed(host, LOOPBACK, ())


def test_allowed_hosts_add_names_or_name_and_port() -> None:
    assert host_allowed("app.example:8080", LOOPBACK, ("app.example",))
    assert host_allowed("app.example:8080", LOOPBACK, ("app.example:8080",))
    assert not host_allowed("app.example:9090", LOOPBACK, ("app.example:8080",))
    assert host_allowed("anything.example", LOOPBACK, ("*",))
    # A server on a public address answers any name, unless names are listed.
    assert host_allowed("replica-3.internal:8081", ("0.0.0.0",), ())
    assert not host_allowed("evil.example", ("0.0.0.0",), ("app.example",))
    assert host_allowed("localhost:8081", ("0.0.0.0",), ("app.example",))


def test_the_origin_must_match_scheme_host_and_port() -> None:
    host = "127.0.0.1:8080"
    assert origin_allowed(None, host, ())
    assert origin_allowed("http://127.0.0.1:8080", host, ())
    assert origin_allowed("http://127.0.0.1:8080/", host, ())
    assert not origin_allowed("https://127.0.0.1:8080", host, ())  # scheme
    assert not origin_allowed("http://127.0.0.1:8081", host, ())  # port
    assert not origin_allowed("http://localhost:8080", host, ())  # host
    assert not origin_allowed("null", host, ())
    assert origin_allowed("http://a.example", "a.example:80", ())  # default ports
    assert origin_allowed("https://a.example", "a.example", (), "https")
    assert origin_allowed("https://a.example:443", "a.example", (), "wss")
    assert not origin_allowed("http://a.example", "a.example", (), "https")
    assert origin_allowed("https://evil.example", host, ("https://evil.example",))
    assert origin_allowed("https://evil.example", host, ("*",))


async def upgrade(
    port: int, host_header: str, origin: str | None = None
) -> tuple[int | None, dict[str, object]]:
    headers = {"Origin": origin} if origin else {}
    client = await RawClient.connect("127.0.0.1", port, headers=headers, host_header=host_header)
    status, body = client.rejected_status, client.rejected_body
    await client.aclose()
    return status, json.loads(body) if body else {}


async def wait_free(engine: Engine) -> None:
    with trio.fail_after(5):
        while engine.is_reserved():
            await trio.sleep(0.01)


async def test_dns_rebinding_is_refused_on_the_socket_and_http(engine: Engine) -> None:
    async with running_server(engine) as server:
        port = int(server.http.rsplit(":", 1)[1])
        evil = f"evil.example:{port}"
        status, body = await upgrade(port, evil, f"http://{evil}")
        assert status == 403
        error = body["error"]
        assert isinstance(error, dict) and error["code"] == "forbidden_host"
        assert "--allowed-host" in error["message"]
        status, body = await ahttp("GET", server.http + "/health", headers={"Host": evil})
        assert (status, body["error"]["code"]) == (403, "forbidden_host")
        for name in (f"localhost:{port}", f"127.0.0.1:{port}"):
            status, _ = await ahttp("GET", server.http + "/health", headers={"Host": name})
            assert status == 200
            assert (await upgrade(port, name, f"http://{name}"))[0] is None  # accepted
            await wait_free(engine)
        # The right host with the wrong scheme is not the server's own origin.
        status, body = await upgrade(port, f"127.0.0.1:{port}", f"https://127.0.0.1:{port}")
        error = body["error"]
        assert status == 403 and isinstance(error, dict) and error["code"] == "forbidden_origin"


async def test_allowed_host_opens_the_server_to_a_name(engine: Engine) -> None:
    async with running_server(engine) as server:
        state: ServerState = server.state
        state.allowed_hosts = ("voice.example",)
        port = int(server.http.rsplit(":", 1)[1])
        status, _ = await ahttp(
            "GET", server.http + "/health", headers={"Host": f"voice.example:{port}"}
        )
        assert status == 200
        name = f"voice.example:{port}"
        assert (await upgrade(port, name, f"http://{name}"))[0] is None
        await wait_free(engine)


async def test_models_route_names_the_folder_not_the_path(engine: Engine) -> None:
    async with running_server(engine) as server:
        status, body = await ahttp("GET", server.http + "/v1/models")
    assert status == 200
    path = body["data"][0]["path"]
    assert path is None or "/" not in path
