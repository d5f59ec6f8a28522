"""The browser page resumes its call after a network drop: headless Chromium talks to
the demo server through a TCP proxy that cuts the connection mid-answer; the page
shows reconnecting, resumes on its own, and the answer plays on, every frame once.

Skips like tests/static/test_browser.py when Chromium or Playwright is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.helpers import ServerProcess
from tests.resume.cut_proxy import proxy_thread
from tests.static.test_browser import (
    _Browser,
    _evaluate,
    _open_browser,
    _speech_mic_wav,
    _stats,
    _wait_stat,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]


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


NET_UNITS = """
async (url) => {
  const m = await import(url);
  const box = new m.Outbox(10, 5000);
  for (let i = 0; i < 4; i++) box.add("abcd", 0);  // 4 bytes each: two fit
  const kept = box.since(0).length;
  const lost = box.confirm(1);  // the server needs message 2: gone
  const fine = box.confirm(2);
  const aged = new m.Outbox(1000, 5000);
  aged.add("a", 0);
  aged.add("b", 6000);
  const counter = new m.EventCounter(0);
  const acks = [];
  for (let i = 0; i < 130; i++) { const a = counter.received(0); if (a !== null) acks.push(a); }
  acks.push(counter.received(500), counter.received(1000));
  return {
    kept, lost, fine, agedDropped: aged.dropped, acks,
    backoff: [0, 1, 2, 3, 4, 5, 6, 7].map(m.backoffMs),
    urls: [
      m.resumeUrl("ws://h:1/openai/v1/realtime?model=x&resumable=1", "replica2"),
      m.resumeUrl("ws://h:1/v1/realtime?resumable=1", null),
    ],
    offers: [
      m.parseOffer({ token: "t", replica: "r1", grace_seconds: 30 }),
      m.parseOffer({ token: "", grace_seconds: 30 }),
      m.parseOffer({ token: "t", grace_seconds: 0 }),
      m.parseOffer({ token: "t", replica: 5, grace_seconds: 30 }),
    ],
  };
}
"""


def test_the_pages_resume_rules(demo_server: ServerProcess, speaking_browser: _Browser) -> None:
    """net.js's rules are the Python client's (realtime.client.resume)."""
    units = _evaluate(demo_server, speaking_browser, NET_UNITS, "/static/net.js")
    assert units["kept"] == 2 and units["lost"] is False and units["fine"] is True
    assert units["agedDropped"] == 1
    assert units["acks"] == [64, 128, None, 132]  # the second after the ack at 128
    assert units["backoff"] == [0, 250, 500, 1000, 2000, 4000, 4000, 4000]
    assert units["urls"] == [
        "ws://h:1/openai/v1/realtime?model=x&resume=1&replica=replica2",
        "ws://h:1/v1/realtime?resume=1",
    ]
    assert units["offers"] == [{"token": "t", "replica": "r1", "graceMs": 30000}, None, None, None]
    assert speaking_browser.page_errors == []
