"""The browser client (realtime/static/) in headless Chromium against ``realtime serve``.

Chromium's fake media flags feed a WAV this test writes as the microphone. The
Chromium tests skip when /usr/bin/chromium (or $REALTIME_CHROMIUM) or Playwright
is missing, unless REALTIME_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import trio_websocket

from tests.helpers import REPO, ServerProcess, start_realtime_server

STATIC = REPO / "realtime" / "static"
CHROMIUM = Path(os.environ.get("REALTIME_CHROMIUM", "/usr/bin/chromium"))
API_KEY = "test-key-0123"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


def _need_browser() -> Any:
    """The Playwright sync API, or skip (fail under REALTIME_REQUIRE_BROWSER=1)."""
    problems = []
    if not CHROMIUM.exists():
        problems.append(f"{CHROMIUM} not found (apt-get install chromium)")
    sync_api: Any = None
    try:
        from playwright import sync_api
    except ImportError:
        problems.append("playwright is not installed (pip install playwright)")
    if problems:
        reason = "browser test needs Chromium and Playwright: " + "; ".join(problems)
        if os.environ.get("REALTIME_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return sync_api


def _artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("REALTIME_TEST_ARTIFACTS")
    path = Path(root) if root else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fake_mic_wav(path: Path) -> Path:
    """Four seconds of a warbling tone plus a little noise at 48 kHz (Chromium loops it)."""
    rate = 48_000
    t = np.arange(4 * rate) / rate
    tone = 0.25 * np.sin(2 * np.pi * (300 + 80 * np.sin(2 * np.pi * 2 * t)) * t)
    x = tone + 0.01 * np.random.default_rng(0).standard_normal(t.size)
    soundfile.write(str(path), x.astype(np.float32), rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def key_server(
    tmp_path_factory: pytest.TempPathFactory, demo_cache_dir: Path
) -> Iterator[ServerProcess]:
    with start_realtime_server(
        "--api-key", API_KEY, log_dir=tmp_path_factory.mktemp("key-server")
    ) as server:
        yield server


class _Browser:
    def __init__(self, sync_api: Any, mic_wav: Path, profile: Path) -> None:
        self._pw = sync_api.sync_playwright().start()
        self.context = self._pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={mic_wav}"],
        )
        self.page_errors: list[str] = []

    def new_page(self) -> Any:
        page = self.context.new_page()
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))
        return page

    def close(self) -> None:
        self.context.close()
        self._pw.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[_Browser]:
    sync_api = _need_browser()
    profile = Path(tempfile.mkdtemp(prefix="realtime-chromium-"))
    b = _Browser(sync_api, _fake_mic_wav(tmp_path / "mic.wav"), profile)
    try:
        yield b
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)


def _stats(page: Any) -> dict[str, str]:
    result: dict[str, str] = page.eval_on_selector("#stats", "e => ({...e.dataset})")
    return result


def _wait_stat(page: Any, name: str, at_least: int, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(
        f"() => Number(document.getElementById('stats').dataset.{name}) >= {at_least}",
        timeout=timeout_ms,
    )


def _wait_state(page: Any, state: str, timeout_ms: int = 30_000) -> None:
    page.wait_for_selector(f'#state[data-state="{state}"]', timeout=timeout_ms)


@pytest.mark.browser
@pytest.mark.slow
def test_browser_page_streams_in_headless_chromium(
    demo_server: ServerProcess, browser: _Browser, tmp_path: Path
) -> None:
    page = browser.new_page()
    page.goto(demo_server.http + "/")
    page.fill("#system-prompt", "Be concise.")
    page.fill("#seed", "5")
    page.click("#start")
    _wait_state(page, "live")
    _wait_stat(page, "audioDeltas", 12)
    stats = _stats(page)
    assert stats["sessionId"].startswith("sess_")
    assert int(stats["appendsSent"]) >= 12
    assert int(stats["inputLevelDb"]) > -40  # the fake microphone's tone reached the encoder
    page.wait_for_function(
        "() => { const d = document.getElementById('stats').dataset;"
        " return Number(d.transcriptDeltas) + Number(d.textDeltas) > 0; }",
        timeout=30_000,
    )
    # The demo model speaks noise and writes gibberish: some text must be on screen.
    shown = page.text_content("#user-transcript") + page.text_content("#assistant-text")
    assert shown.strip()

    # A second tab while the first is live: told 'busy' (server_busy, close 1013).
    second = browser.new_page()
    second.goto(demo_server.http + "/")
    second.click("#start")
    _wait_state(second, "busy", 15_000)
    assert "busy" in second.text_content("#state")
    assert "server_busy" in second.text_content("#errors")
    _wait_stat(second, "errors", 1)
    second.wait_for_function(
        "() => document.getElementById('stats').dataset.closeCode === '1013'", timeout=10_000
    )

    page.screenshot(path=str(_artifacts(tmp_path) / "browser-live.png"), full_page=True)
    page.click("#stop")
    _wait_state(page, "closed", 30_000)
    final = _stats(page)
    assert final["closeCode"] == "1000"
    assert int(final["audioDeltas"]) == int(final["lastFrameIndex"]) + 1
    assert int(final["audioDeltas"]) >= int(final["appendsSent"])
    assert "finished" in page.text_content("#state")
    assert page.text_content("#errors").strip() == ""
    page.screenshot(path=str(_artifacts(tmp_path) / "browser-finished.png"), full_page=True)

    # With the first session over, the second tab gets the slot.
    second.click("#start")
    _wait_state(second, "live", 15_000)
    _wait_stat(second, "audioDeltas", 2)
    second.click("#stop")
    _wait_state(second, "closed", 30_000)
    second.screenshot(path=str(_artifacts(tmp_path) / "browser-second-tab.png"), full_page=True)
    assert browser.page_errors == []


@pytest.mark.browser
@pytest.mark.slow
def test_browser_with_api_key(key_server: ServerProcess, browser: _Browser) -> None:
    page = browser.new_page()
    page.goto(key_server.http + "/")  # the page itself needs no key
    page.click("#start")
    _wait_state(page, "error", 15_000)  # no key: the upgrade is refused
    assert page.text_content("#errors").strip()
    page.fill("#api-key", API_KEY)
    page.click("#start")
    _wait_state(page, "live", 15_000)
    _wait_stat(page, "audioDeltas", 2)
    page.click("#stop")
    _wait_state(page, "closed", 30_000)
    assert browser.page_errors == []


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.refs.append(value)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


EXTERNAL_URL = re.compile(rb"""(?:https?|wss?)://(?!(?:127\.0\.0\.1|localhost)[:/])[^\s"'`)]+""")


def test_browser_page_served_offline(demo_server: ServerProcess) -> None:
    status, ctype, index = _get(demo_server.http + "/")
    assert status == 200 and "text/html" in ctype
    assert index == (STATIC / "index.html").read_bytes()
    parser = _Refs()
    parser.feed(index.decode())
    local = [r for r in parser.refs if not r.startswith("data:")]
    assert "/static/app.js" in local and "/static/style.css" in local
    files = sorted(p.name for p in STATIC.iterdir() if p.is_file())
    assert {"index.html", "app.js", "audio-worklet.js", "style.css"} <= set(files)
    for ref in local:
        assert ref.startswith("/static/"), f"index.html refers to {ref!r}"
        assert ref.removeprefix("/static/") in files
    for name in files:
        status, ctype, body = _get(f"{demo_server.http}/static/{name}")
        assert status == 200, name
        assert body == (STATIC / name).read_bytes(), name
        if name.endswith(".js"):  # module scripts and worklets need a JavaScript MIME type
            assert "javascript" in ctype, (name, ctype)
        found = EXTERNAL_URL.findall(body)
        assert not found, f"{name} refers to external URLs: {found}"
    # The worklet module the page loads at run time is among the served files.
    assert b'addModule("/static/audio-worklet.js")' in (STATIC / "app.js").read_bytes()


async def test_browser_key_subprotocol_accepted(key_server: ServerProcess) -> None:
    async with trio_websocket.open_websocket_url(
        key_server.url, subprotocols=["realtime", f"realtime-key.{API_KEY}"]
    ) as ws:
        assert ws.subprotocol == "realtime"  # never the key
        assert b"realtime-key" not in b"".join(v for _, v in ws.handshake_headers)
        first = await ws.get_message()
        assert '"session.created"' in first
    for offered in (["realtime", "realtime-key.wrong"], ["realtime"]):
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with trio_websocket.open_websocket_url(key_server.url, subprotocols=offered):
                pass
        assert rejected.value.status_code == 401
    # The page and its files are public; the API is not.
    assert _get(key_server.http + "/")[0] == 200
    assert _get(key_server.http + "/static/app.js")[0] == 200
    assert _get(key_server.http + "/v1/models")[0] == 401
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert _get(key_server.http + "/v1/models", auth)[0] == 200
