"""The browser client (realtime/static/) in headless Chromium against ``realtime serve``.

Chromium's fake media flags feed a WAV this test writes as the microphone. The
Chromium tests skip when /usr/bin/chromium (or $REALTIME_CHROMIUM) or Playwright
is missing, unless REALTIME_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import base64
import json
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
    # The banner gives the server's own reason (which limit was met), not a fixed text.
    told = second.text_content("#errors").split("server_busy: ", 1)[1].strip()
    assert told and told[0].upper() + told[1:] in second.text_content("#notice-text")
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


def _evaluate(server: ServerProcess, browser: _Browser, script: str, module: str) -> Any:
    """``script`` (an async function of a module's URL) run on the served page."""
    page = browser.new_page()
    page.goto(server.http + "/")
    return page.evaluate(script, module)


@pytest.mark.browser
def test_browser_jitter_buffer_scenarios(demo_server: ServerProcess, browser: _Browser) -> None:
    runs = _evaluate(demo_server, browser, JITTER_SCENARIOS, "/static/jitter.js")

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


# The page's pure units, imported from the module the page itself runs.
APP_UNITS = """
async (url) => {
  const m = await import(url);
  const formats = {
    empty: m.sessionFormat(undefined),
    computed: m.sessionFormat({ frame_samples: 320, input_audio_format: { sample_rate: 8000 },
                                output_audio_format: { sample_rate: 24000 } }),
    given: m.sessionFormat({ frame_samples: 1280, output_frame_samples: 1000 }),
    junk: m.sessionFormat({ frame_samples: "1280", input_audio_format: { sample_rate: -1 } }),
  };
  const timing = new m.Timing(40);
  timing.sent(0, 1000);
  timing.sent(1, 1040);
  const first = timing.answered(0, 1100);
  const unknown = timing.answered(7, 2100);
  const format = formats.computed;
  const mic = [new Int16Array(320).fill(1000), new Int16Array(320).fill(1000)];
  const model = [new Int16Array(960).fill(-7), undefined, new Int16Array(960).fill(9)];
  const wav = new Uint8Array(m.conversationWav(mic, model, format));
  const recording = new m.Recording({ ...format, frameMs: 600000 });  // 3 frames in 30 min
  for (let i = 0; i < 5; i++) recording.addMic(new Int16Array(1));
  recording.addModel(2, new Int16Array(1));
  recording.addModel(3, new Int16Array(1));
  const list = document.createElement("ol"), counter = document.createElement("small");
  const log = new m.EventLog(list, counter, 3);
  for (let i = 0; i < 4; i++) log.append(40);
  log.audioFrame(5);
  log.audioFrame(6);
  log.event("←", "session.pong", "");
  log.event("←", "session.pong", "");
  return {
    formats, first, unknown,
    wav: Array.from(wav),
    micFirst: new DataView(wav.buffer).getInt16(44, true),
    modelFrames: [0, 960, 1920].map((j) => new DataView(wav.buffer).getInt16(46 + j * 4, true)),
    recorded: [recording.mic.length, recording.model.length, recording.empty],
    log: [...list.children].map((li) => li.textContent.replace(/^\\S+ /, "")),
    logCount: counter.textContent,
    fn: m.formatFunction('{"a": 1}\\nnot json'),
    update: m.sessionUpdate("  Hi. ", "-3"),
    sentences: [m.sentence("all 2 conversations are in use; try again"), m.sentence(" Full! "),
                m.sentence("")],
  };
}
"""


@pytest.mark.browser
def test_browser_app_units(demo_server: ServerProcess, browser: _Browser) -> None:
    units = _evaluate(demo_server, browser, APP_UNITS, "/static/app.js")
    formats = units["formats"]
    assert formats["empty"] == {
        "frameSamples": 1280,
        "inputRate": 16000,
        "outputRate": 22050,
        "outputFrameSamples": 1764,
        "frameMs": 80,
    }
    assert formats["computed"]["outputFrameSamples"] == 960 and formats["computed"]["frameMs"] == 40
    assert formats["given"]["outputFrameSamples"] == 1000  # the server's word wins
    assert formats["junk"] == formats["empty"]
    assert units["first"] == {"rttMs": 100, "rttMedianMs": 100}
    assert units["unknown"] == {"rtf": pytest.approx(2 * 40 / 1100)}  # no rtt: never sent
    # Three output frames of 960 at 24 kHz; the microphone resampled from 8 kHz.
    assert _wav_header(bytes(units["wav"])) == (2, 24_000, 16, 3 * 960)
    assert units["micFirst"] == 1000 and units["modelFrames"] == [-7, 0, 9]
    assert units["recorded"] == [3, 3, False]
    assert units["log"] == [
        "\u2190 response.audio.delta \u00d72 (frames 5\u20136)",
        "\u2190 session.pong",
        "\u2190 session.pong",
    ]
    assert units["logCount"] == "(4)"  # entries made; the list keeps the last 3
    assert units["fn"] == '{\n  "a": 1\n}\nnot json'  # pretty-printed line by line
    assert units["update"] == {
        "type": "session.update",
        "session": {"system_prompt": "Hi.", "seed": 0},
    }
    assert units["sentences"] == ["All 2 conversations are in use; try again.", "Full!", ""]
    assert browser.page_errors == []


class _FiguresServer:
    """Stands in for the server behind the page's WebSocket, announcing other figures
    than VoiceChat's in session.updated: 40 ms frames of 320 samples at 8 kHz in,
    24 kHz out (no output_frame_samples: the page works out 960)."""

    FRAME, IN_RATE, OUT_RATE, OUT_FRAME = 320, 8_000, 24_000, 960

    def __init__(self) -> None:
        self.appends: list[tuple[int, int]] = []  # (sample_rate, samples) of each append
        self.committed = False
        self._ws: Any = None

    def route(self, ws: Any) -> None:
        self._ws = ws
        ws.on_message(self._on_message)
        self._send({"type": "session.created", "session": {"id": "sess_figures"}})

    def _send(self, event: dict[str, Any]) -> None:
        self._ws.send(json.dumps(event))

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        if event["type"] == "session.update":
            session = {
                "id": "sess_figures",
                "frame_samples": self.FRAME,
                "input_audio_format": {"type": "pcm16", "sample_rate": self.IN_RATE},
                "output_audio_format": {"type": "pcm16", "sample_rate": self.OUT_RATE},
            }
            self._send({"type": "session.updated", "session": session})
        elif event["type"] == "input_audio_buffer.append":
            self._answer(event)
        elif event["type"] == "input_audio_buffer.commit":
            self.committed = True
            self._send({"type": "input_audio_buffer.committed"})
            self._send({"type": "response.done", "frame_index": len(self.appends)})
            self._ws.close(code=1000)

    def _answer(self, append: dict[str, Any]) -> None:
        index = len(self.appends)
        self.appends.append((append["sample_rate"], len(base64.b64decode(append["audio"])) // 2))
        t = np.arange(self.OUT_FRAME) / self.OUT_RATE
        tone = (3000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
        delta = base64.b64encode(tone).decode()
        audio = {"frame_index": index, "delta": delta, "sample_rate": self.OUT_RATE}
        self._send({"type": "response.audio.delta", **audio})
        if index == 2:  # a turn at frame 25: 1.0 s on a 40 ms timeline
            transcript = {"frame_index": 25, "delta": "hello", "transcript": "hello"}
            self._send({"type": "conversation.item.input_audio_transcription.delta", **transcript})


@pytest.mark.browser
def test_browser_page_follows_the_session_figures(
    demo_server: ServerProcess, browser: _Browser
) -> None:
    """Appends, the answer's playback, the timeline and the download all use the frame
    and the rates session.updated states, not VoiceChat's."""
    server = _FiguresServer()
    page = browser.new_page()
    page.route_web_socket("**/v1/realtime", server.route)
    page.goto(demo_server.http + "/")
    page.click("#start")
    _wait_state(page, "live", 15_000)
    _wait_stat(page, "audioDeltas", 6, 15_000)
    page.click("#stop")
    _wait_state(page, "closed", 15_000)
    assert "finished" in page.text_content("#state") and server.committed
    assert server.appends and all(a == (server.IN_RATE, server.FRAME) for a in server.appends)
    assert "(40 ms PCM16 each)" in page.text_content("#log")
    assert "You · 1.0 s" in page.text_content("#conversation")
    final = _stats(page)
    assert int(final["audioDeltas"]) == len(server.appends) == int(final["lastFrameIndex"]) + 1
    page.wait_for_selector("#downloads:not([hidden])")
    with page.expect_download() as wav_download:
        page.click("#download-wav")
    wav = Path(wav_download.value.path()).read_bytes()
    assert _wav_header(wav) == (2, server.OUT_RATE, 16, len(server.appends) * server.OUT_FRAME)
    with page.expect_download() as json_download:
        page.click("#download-json")
    record = json.loads(Path(json_download.value.path()).read_text())
    assert record["frame_ms"] == 40 and record["turns"][0]["start_s"] == 1.0
    assert page.text_content("#errors").strip() == ""
    assert browser.page_errors == []
