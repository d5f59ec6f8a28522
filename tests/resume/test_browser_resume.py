"""The browser page resumes its call after a network drop: headless Chromium talks to
the demo server through a TCP proxy that cuts the connection mid-answer; the page
shows reconnecting, resumes on its own, and the answer plays on, every frame once.

Skips like tests/test_browser.py when Chromium or Playwright is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.helpers import ServerProcess
from tests.resume.cut_proxy import proxy_thread
from tests.test_browser import _Browser, _open_browser, _speech_mic_wav, _stats, _wait_stat

pytestmark = pytest.mark.slow


@pytest.fixture
def speaking_browser(tmp_path: Path) -> Iterator[_Browser]:
    """Chromium whose fake microphone speaks."""
    yield from _open_browser(_speech_mic_wav, tmp_path)


def _wait_state(page: object, state: str, timeout_ms: int = 30_000) -> None:
    page.wait_for_selector(f'#state[data-state="{state}"]', timeout=timeout_ms)  # type: ignore[attr-defined]


def test_the_page_resumes_after_a_drop_mid_answer(
    demo_server: ServerProcess, speaking_browser: _Browser
) -> None:
    port = int(demo_server.http.rsplit(":", 1)[1])
    with proxy_thread(port) as (proxy, token):
        page = speaking_browser.new_page()
        # Through the proxy the page's origin is the proxy's host:port, which is also
        # the Host the server sees: same origin, no flag needed.
        page.goto(f"http://127.0.0.1:{proxy.port}/")
        page.wait_for_function("() => document.getElementById('model').dataset.modelId !== ''")
        page.click("#start")
        _wait_state(page, "live")
        _wait_stat(page, "audioDeltas", 15)
        assert trio.from_thread.run_sync(proxy.cut, trio_token=token) >= 1
        # The page says so, resumes by itself, and the answer goes on.
        page.wait_for_function(
            "() => document.getElementById('stats').dataset.resumes === '1'", timeout=30_000
        )
        before = int(_stats(page)["audioDeltas"])
        _wait_state(page, "live")
        _wait_stat(page, "audioDeltas", before + 15)
        stats = _stats(page)
        assert stats["drops"] == "1" and stats["errors"] == "0", stats
        # Every frame once, in order: no gap, nothing twice (a frame_index that went
        # backwards would be an error).
        assert int(stats["lastFrameIndex"]) + 1 == int(stats["audioDeltas"]), stats
        page.click("#stop")
        _wait_state(page, "finishing", 15_000)
        page.click("#stop")  # cut the answer: the session ends
        _wait_state(page, "closed", 30_000)
        final = _stats(page)
        assert final["closeCode"] == "1000" and final["errors"] == "0", final
        assert int(final["lastFrameIndex"]) + 1 == int(final["audioDeltas"]), final
        assert speaking_browser.page_errors == []
