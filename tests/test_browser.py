"""The browser client (realtime/static/) in headless Chromium against ``realtime serve``.

Chromium's fake media flags feed a WAV this test writes as the microphone. The
Chromium tests skip when /usr/bin/chromium (or $REALTIME_CHROMIUM) or Playwright
is missing, unless REALTIME_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
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


def _meters(page: Any) -> tuple[int, int]:
    values: list[str] = page.eval_on_selector_all(
        "#meter-in, #meter-out", "els => els.map(e => e.getAttribute('aria-valuenow'))"
    )
    return int(values[0]), int(values[1])


def _wav_header(data: bytes) -> tuple[int, int, int, int]:
    """(channels, sample rate, bits per sample, frames) of a PCM WAV."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    pos, fmt, frames = 12, None, -1
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if chunk == b"fmt ":
            fmt = struct.unpack_from("<HHIIHH", data, pos + 8)
        elif chunk == b"data":
            assert fmt is not None
            frames = size // fmt[4]
            assert pos + 8 + size == len(data)
        pos += 8 + size + (size & 1)
    assert fmt is not None and fmt[0] == 1  # PCM
    return fmt[1], fmt[2], fmt[5], frames


@pytest.mark.browser
@pytest.mark.slow
def test_browser_page_streams_in_headless_chromium(
    demo_server: ServerProcess, browser: _Browser, tmp_path: Path
) -> None:
    artifacts = _artifacts(tmp_path)
    page = browser.new_page()
    page.set_viewport_size({"width": 1100, "height": 900})
    page.goto(demo_server.http + "/")
    # The served model's name, and the demo checkpoint's banner.
    page.wait_for_function("() => document.getElementById('model').dataset.modelId !== ''")
    model_id = page.get_attribute("#model", "data-model-id")
    assert model_id and model_id.startswith("realtime-demo")
    assert page.text_content("#model") == model_id
    assert page.is_visible("#demo-banner") and "noise" in page.text_content("#demo-banner")
    # The placeholder tells what an empty prompt sends: no system_prompt at all.
    assert "no system_prompt" in (page.get_attribute("#system-prompt", "placeholder") or "")
    assert page.text_content("#update-preview") == '{"type":"session.update","session":{"seed":0}}'
    page.screenshot(path=str(artifacts / "browser-idle.png"), full_page=True)

    idle_in, idle_out = _meters(page)  # the meters' floor, before any audio
    page.fill("#system-prompt", "Be concise.")
    page.fill("#seed", "5")
    assert '"system_prompt":"Be concise."' in page.text_content("#update-preview")
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
    assert page.locator("#conversation li.turn").count() >= 1

    # Level meters move: both channels rise above their idle floor and show the live
    # level (steady noise from the demo model may read the same dB for a second).
    seen_in, seen_out = {idle_in}, {idle_out}
    for _ in range(8):
        level_in, level_out = _meters(page)
        seen_in.add(level_in)
        seen_out.add(level_out)
        page.wait_for_timeout(120)
    assert max(seen_in) > -40 and len(seen_in) >= 2, seen_in
    assert max(seen_out) > -60 and len(seen_out) >= 2, seen_out
    # Live figures: round trip by frame_index, playback latency, real-time factor.
    page.wait_for_function(
        "() => { const d = document.getElementById('stats').dataset;"
        " return Number(d.rttMs) >= 0 && Number(d.rtf) > 0 && Number(d.targetMs) > 0; }",
        timeout=10_000,
    )
    figures = _stats(page)
    assert 0 <= float(figures["rttMs"]) < 5000
    assert 0.3 < float(figures["rtf"]) < 2.0
    assert 50 <= float(figures["targetMs"]) <= 600
    assert float(figures["latencyMs"]) < 1500
    assert page.text_content("#stat-rtt").endswith(")") and "ms" in page.text_content("#stat-rtt")
    assert "ms" in page.text_content("#stat-latency")
    assert page.text_content("#stat-rtf").endswith("\u00d7")
    page.click("#log-panel summary")
    log = page.text_content("#log")
    assert "response.audio.delta \u00d7" in log and "session.update" in log
    assert page.locator("#log li").count() <= 300

    # A second tab while the first is live: told 'busy' (server_busy, close 1013).
    second = browser.new_page()
    second.goto(demo_server.http + "/")
    second.click("#start")
    _wait_state(second, "busy", 15_000)
    assert "busy" in second.text_content("#state")
    assert "server_busy" in second.text_content("#errors")
    assert second.is_visible("#notice") and "busy" in second.text_content("#notice")
    _wait_stat(second, "errors", 1)
    second.wait_for_function(
        "() => document.getElementById('stats').dataset.closeCode === '1013'", timeout=10_000
    )

    page.screenshot(path=str(artifacts / "browser-live.png"), full_page=True)
    page.click("#stop")
    _wait_state(page, "closed", 30_000)
    final = _stats(page)
    assert final["closeCode"] == "1000"
    assert int(final["audioDeltas"]) == int(final["lastFrameIndex"]) + 1
    assert int(final["audioDeltas"]) >= int(final["appendsSent"])
    assert "finished" in page.text_content("#state")
    assert page.text_content("#errors").strip() == ""

    # Downloads: a stereo WAV (mic | model) on the frame timeline, and the transcript.
    page.wait_for_selector("#downloads:not([hidden])")
    with page.expect_download() as wav_download:
        page.click("#download-wav")
    wav = Path(wav_download.value.path()).read_bytes()
    channels, rate, bits, frames = _wav_header(wav)
    assert (channels, rate, bits) == (2, 22050, 16)
    assert frames == int(final["audioDeltas"]) * 1764
    pcm = np.frombuffer(wav[44:], dtype="<i2").reshape(-1, 2)
    assert np.abs(pcm[:, 0]).max() > 1000  # the fake microphone's tone
    assert np.abs(pcm[:, 1]).max() > 100  # the model's audio
    with page.expect_download() as md_download:
        page.click("#download-md")
    markdown = Path(md_download.value.path()).read_text()
    assert markdown.startswith(f"# Conversation with {model_id}")
    assert "**You**" in markdown or "**Assistant**" in markdown
    page.screenshot(path=str(artifacts / "browser-finished.png"), full_page=True)

    # With the first session over, the second tab gets the slot.
    second.click("#start")
    _wait_state(second, "live", 15_000)
    _wait_stat(second, "audioDeltas", 2)
    second.click("#stop")
    _wait_state(second, "closed", 30_000)
    second.screenshot(path=str(artifacts / "browser-second-tab.png"), full_page=True)
    assert browser.page_errors == []


# Scripted deliveries of 80 ms frames into realtime/static/jitter.js at 48 kHz,
# pulled in 128-sample render quanta; returns each run's trace
# [t_ms, latency_ms, target_ms, underruns, buffered_ms] every ~10 ms.
JITTER_SCENARIOS = """
async (url) => {
  const { JitterBuffer } = await import(url);
  const rate = 48000, quantum = 128, frame = 3840; // 80 ms at 48 kHz
  const voice = (i) => {  // a voiced 140 Hz buzz with a gliding pitch and a tremolo
    const t = i / rate, f = 140 + 20 * Math.sin(2 * Math.PI * 0.7 * t);
    let x = 0;
    for (let h = 1; h <= 6; h++) x += Math.sin(2 * Math.PI * f * h * t) / h;
    return 0.2 * x * (0.6 + 0.4 * Math.sin(2 * Math.PI * 3 * t));
  };
  function run(arrivals, durationMs) {  // arrivals: [[time_ms, frames], ...] in order
    const jb = new JitterBuffer({ rate });
    const out = new Float32Array(quantum);
    const trace = [];
    let next = 0, produced = 0, tMs = 0, q = 0;
    while (tMs < durationMs) {
      while (next < arrivals.length && arrivals[next][0] <= tMs) {
        const chunk = new Float32Array(arrivals[next][1] * frame);
        for (let i = 0; i < chunk.length; i++) chunk[i] = voice(produced + i);
        produced += chunk.length;
        jb.push(chunk);
        next += 1;
      }
      jb.pull(out);
      q += 1;
      tMs = (q * quantum * 1000) / rate;
      const s = jb.stats();
      if (q % 4 === 0) trace.push([tMs, s.latencyMs, s.targetMs, s.underruns, s.bufferedMs]);
    }
    const s = jb.stats();
    return { trace, underruns: s.underruns, droppedMs: s.droppedMs,
             targetMs: s.targetMs, latencyMs: s.latencyMs };
  }
  let seed = 1;
  const rand = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
  const steady = [], stall = [], bursty = [], fast = [];
  for (let k = 0; k * 80 < 12000; k++) steady.push([20 + k * 80 + 10 * rand(), 1]);
  for (let k = 0; k * 80 < 14000; k++) {  // a 600 ms stall at 5 s, then its backlog
    const t = 20 + k * 80;
    stall.push([t >= 5000 && t < 5600 ? 5600 : t, 1]);
  }
  for (let k = 0; k * 240 < 14000; k++) bursty.push([20 + k * 240 + 40 * rand(), 3]);
  for (let k = 0; k * 78.4 < 14000; k++) fast.push([20 + k * 78.4, 1]);
  return { steady: run(steady, 12000), stall: run(stall, 14000), bursty: run(bursty, 14000),
           fast: run(fast, 14000), stallAt: 5600 };
}
"""


def _recovered_at(trace: list[list[float]], after_ms: float, within_ms: float) -> float:
    """The time from which latency stays within `within_ms` of the target."""
    last_off = after_ms
    for t, latency, target, *_ in trace:
        if t > after_ms and abs(latency - target) > within_ms:
            last_off = t
    return last_off


@pytest.mark.browser
def test_browser_jitter_buffer_scenarios(demo_server: ServerProcess, browser: _Browser) -> None:
    page = browser.new_page()
    page.goto(demo_server.http + "/")
    runs = page.evaluate(JITTER_SCENARIOS, "/static/jitter.js")

    steady = runs["steady"]
    assert steady["underruns"] == 0
    assert all(abs(p[1] - p[2]) <= 50 for p in steady["trace"] if p[0] > 1000)
    assert steady["targetMs"] <= 120

    # One 600 ms stall, then its backlog in one burst: one underrun, the target
    # rises, the excess is cut away within a few seconds, and the target decays.
    stall = runs["stall"]
    assert stall["underruns"] == 1
    burst = runs["stallAt"]
    peak_target = max(p[2] for p in stall["trace"])
    assert peak_target > 120
    assert max(p[1] for p in stall["trace"] if p[0] > burst) > 300  # the backlog arrived
    assert _recovered_at(stall["trace"], burst, 50) - burst <= 3000
    assert stall["targetMs"] < peak_target and abs(stall["latencyMs"] - stall["targetMs"]) <= 50

    # Bursts of three frames every 240 ms: the target settles where bursts fit.
    bursty = runs["bursty"]
    assert bursty["underruns"] <= 2
    late = [p for p in bursty["trace"] if p[0] > 6000]
    assert all(abs(p[1] - p[2]) <= 60 for p in late)
    assert max(p[2] for p in late) <= 400

    # A sender 2 % faster than real time: latency does not accumulate.
    fast = runs["fast"]
    assert fast["underruns"] == 0
    assert all(abs(p[1] - p[2]) <= 50 for p in fast["trace"] if p[0] > 4000)
    assert browser.page_errors == []


@pytest.mark.browser
@pytest.mark.slow
def test_browser_with_api_key(key_server: ServerProcess, browser: _Browser) -> None:
    page = browser.new_page()
    page.goto(key_server.http + "/")  # the page itself needs no key
    page.wait_for_selector('#notice[data-kind="key"]')  # GET /v1/models said 401
    assert "API key" in page.text_content("#notice")
    page.click("#start")
    _wait_state(page, "unauthorized", 15_000)  # no key: the upgrade is refused
    assert "API key" in page.text_content("#notice")
    assert "401" in page.text_content("#errors")
    page.fill("#api-key", API_KEY)
    page.wait_for_function("() => document.getElementById('model').dataset.modelId !== ''")
    assert page.is_hidden("#notice")
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
