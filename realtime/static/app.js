// The browser client for /v1/realtime: mic -> PCM16 frame appends, answer audio ->
// speakers through an adaptive jitter buffer. The page is a conversation first (both
// parties' turns, each replayable when the call ends); the live figures, the
// function channel, the errors and the event log sit in a Diagnostics section.
// No external resources, no build step: plain ES modules, imported by the browser as
// they are (format.js: figures and pure helpers; net.js: HTTP probes, the socket's
// address; watches.js; recording.js: the downloads; views.js: the page's units;
// call.js: one call, its phases in one table, CALL_STATES; this module: the App).
//
// One App holds the page's state, split into small units that each keep their own:
// Figures (the live numbers and their rendering), StatusView (state, banners,
// errors), EventLog, Transcript, Downloads, Waveform, ServedModel, and per call a
// Call (the WebSocket session), its CallAudio (capture and playback nodes), Timing,
// Recording, MicWatch (a silent microphone) and, after Stop, AnswerWatch (has the
// answer ended?). The frame and the rates are the server's, from session.updated
// (sessionFormat); nothing before that message needs them.
//
// Stop ends the user's turn, not the call: the microphone goes off, the page goes on
// sending silence at the frame pace so the model can finish its answer, and commits
// once the answer has gone quiet or the bound (10 s by default) has passed; the
// server then answers response.done. A second Stop cuts the answer (response.cancel).


import { Call, CallAudio, MicError } from "./call.js";
import { DASH, RETRY_DEFAULT_S, RETRY_LIMIT_MS, answerLimitSeconds, readyReason, sessionUpdate } from "./format.js";
import { CallSocket, listMics, probeModels, probeReady, realtimeUrl, subprotocols } from "./net.js";
import { $, Downloads, EventLog, Figures, ServedModel, StatusView, Transcript, Waveform, makeMeters } from "./views.js";

// The page's pure units, as tests import them from the module the page runs.
export { ANSWER_LIMIT_S, ANSWER_QUIET_MS, ASSISTANT_TAIL_MS, DEFAULT_FORMAT, MIC_SILENT_DB, MIC_WARN_MS, OUTPUT_QUIET_DB, RETRY_DEFAULT_S, TURN_GAP_MS, USER_LEAD_MS, answerLimitSeconds, base64ToInt16, bytesToBase64, formatFunction, levelDb, median, parseRetryAfter, readyReason, sentence, sessionFormat, sessionUpdate, summarize } from "./format.js";
export { Recording, conversationMarkdown, conversationRecord, conversationWav, monoWav, turnSpan } from "./recording.js";
export { EventLog } from "./views.js";
export { AnswerWatch, MicWatch, Timing } from "./watches.js";
export { CALL_STATES, advance } from "./call.js";

function findElements() {
  const ids = {
    form: "settings", settingsPanel: "settings-panel", settingsSummary: "settings-summary",
    apiKey: "api-key", mic: "mic", micRefresh: "mic-refresh",
    echo: "echo", echoApplied: "echo-applied", prompt: "system-prompt", seed: "seed",
    answerLimit: "answer-limit",
    preview: "update-preview", volume: "volume", volumeValue: "volume-value",
    start: "start", stop: "stop", hint: "hint", state: "state", model: "model", demo: "demo-banner",
    demoName: "demo-name", notice: "notice", noticeTitle: "notice-title",
    noticeText: "notice-text", retry: "retry", retryCancel: "retry-cancel",
    micWarning: "mic-warning", micWarningTitle: "mic-warning-title", micWarningText: "mic-warning-text",
    diagnostics: "diagnostics", diagSummary: "diag-summary", figuresNote: "figures-note",
    stats: "stats", statFrames: "stat-frames",
    statRtt: "stat-rtt", statLatency: "stat-latency", statRtf: "stat-rtf",
    statUnderruns: "stat-underruns", statCaughtUp: "stat-caught-up", statDropped: "stat-dropped",
    statSession: "stat-session",
    conversation: "conversation", conversationEmpty: "conversation-empty",
    user: "user-transcript", assistant: "assistant-text", fn: "function-text",
    errors: "errors", log: "log", logCount: "log-count", downloads: "downloads",
    downloadWav: "download-wav", downloadMd: "download-md", downloadJson: "download-json",
    wave: "wave",
  };
  return Object.freeze(Object.fromEntries(Object.entries(ids).map(([k, id]) => [k, $(id)])));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class App {
  constructor(ui) {
    this.ui = ui;
    this.figures = new Figures(ui);
    this.status = new StatusView(ui, this.figures);
    this.log = new EventLog(ui.log, ui.logCount);
    this.transcript = new Transcript(ui);
    this.downloads = new Downloads(ui);
    this.waveform = new Waveform(ui.wave);
    this.model = new ServedModel(ui, this.status);
    this.call = null; // the one live call
    this.waiting = null; // {cancelled} while Try again waits for a free conversation
    this.keyTimer = 0;
  }

  get volume() {
    return Number(this.ui.volume.value) / 100;
  }

  get key() {
    return this.ui.apiKey.value.trim();
  }

  showSettings() {
    const { ui } = this;
    ui.preview.textContent = JSON.stringify(sessionUpdate(ui.prompt.value, ui.seed.value));
    const mic = ui.mic.selectedOptions[0] ? ui.mic.selectedOptions[0].textContent : "System default";
    const limit = answerLimitSeconds(ui.answerLimit.value);
    ui.settingsSummary.textContent = [
      mic === "System default" ? "default microphone" : mic,
      `echo cancellation ${ui.echo.checked ? "on" : "off"}`,
      `seed ${sessionUpdate("", ui.seed.value).session.seed}`,
      ui.prompt.value.trim() ? "system prompt set" : null,
      limit ? `answer up to ${limit} s after Stop` : "Stop ends at once",
    ]
      .filter(Boolean)
      .join(" · ");
    this.status.limitS = limit;
  }

  resetView() {
    this.figures.reset();
    this.status.clearErrors();
    this.transcript.reset();
    delete this.ui.stats.dataset.closeCode;
    delete this.ui.stats.dataset.finishedBy;
    delete this.ui.stats.dataset.stopFrame;
    this.ui.statSession.textContent = DASH;
    this.status.notice(null);
    this.downloads.clear();
    this.figures.render();
  }

  async start() {
    if (this.call || this.waiting) return;
    this.resetView();
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      this.status.set("nomic", "no microphone");
      this.status.notice("nomic", "The microphone needs a secure page.", "Open it from localhost or over HTTPS.");
      return;
    }
    this.status.set("connecting", "opening microphone…");
    let audio = null;
    try {
      audio = await CallAudio.open(this.ui.mic.value, this.ui.echo.checked, this.volume);
      this.ui.echoApplied.textContent = audio.echoReport();
      listMics(this.ui.mic).catch(() => {});
      await audio.resume();
      this.ui.stats.dataset.sampleRate = String(audio.ctx.sampleRate);
      this.status.set("connecting", "connecting…");
      this.connect(audio);
    } catch (err) {
      if (err instanceof MicError && this.micProblem(err.cause)) return;
      this.status.error(err && err.message ? err.message : String(err));
      this.status.set("error", "could not start");
      this.call = null;
      if (audio) {
        audio.stopCapture();
        audio.close();
      }
    }
  }

  connect(audio) {
    let ws;
    try {
      ws = new CallSocket(realtimeUrl(), subprotocols(this.key));
    } catch (err) {
      throw new Error(`cannot open the WebSocket (is the API key a plain token?): ${err.message}`);
    }
    this.call = new Call(this, audio, ws);
    this.log.startClock(performance.now());
    this.log.event("→", "connect", realtimeUrl());
    this.waveform.start(() => (this.call ? [this.call.audio.micAnalyser, this.call.audio.outAnalyser] : null));
  }

  micProblem(err) {
    const name = err && err.name;
    if (name === "NotAllowedError" || name === "SecurityError") {
      this.status.set("denied", "microphone blocked");
      this.status.notice("denied", "Microphone permission denied.", "Allow the microphone for this page (the icon in the address bar) and press Start again.");
    } else if (name === "NotFoundError" || name === "OverconstrainedError" || name === "NotReadableError") {
      this.status.set("nomic", "no microphone");
      this.status.notice("nomic", "No usable microphone.",
        name === "NotReadableError"
          ? "The microphone is in use by another program or failed to start."
          : "Plug one in, or pick another in the Microphone list under Settings.");
    } else {
      return false;
    }
    this.status.error(`microphone: ${name}: ${err.message || ""}`);
    return true;
  }

  stop() {
    if (this.waiting) this.cancelWait();
    else if (this.call) this.call.stop();
  }

  // Try again: wait for /ready to say a conversation is free (it or a balancer in
  // front may say when to ask again: Retry-After), then start. Bounded by RETRY_LIMIT_MS.
  async retry() {
    if (this.call || this.waiting) return;
    const waiting = { cancelled: false };
    this.waiting = waiting;
    const { status, ui } = this;
    const give = (fn) => {
      if (this.waiting === waiting) this.waiting = null;
      fn();
    };
    status.notice(null);
    status.set("waiting", "waiting for a free conversation");
    const deadline = performance.now() + RETRY_LIMIT_MS;
    for (let attempt = 1; ; attempt++) {
      const ready = await probeReady(this.key);
      if (waiting.cancelled) return;
      if (ready.status === 200 || ready.status === 404) {
        give(() => this.start()); // 404: no /ready here (an older server or a proxy)
        return;
      }
      if (ready.status === 401) {
        give(() => {
          status.set("unauthorized", "wrong API key");
          this.model.load();
        });
        return;
      }
      if (ready.status === 0) {
        give(() => {
          status.set("gone", "server unreachable");
          status.gone();
        });
        return;
      }
      const given = ready.retryAfter;
      const seconds = Math.max(1, Math.min(60, given == null ? RETRY_DEFAULT_S : given));
      ui.stats.dataset.retryAfterS = String(seconds);
      if (performance.now() + seconds * 1000 > deadline) {
        give(() => {
          status.set("busy", "busy: no free conversation");
          status.notice("busy", "The server is still full.", `No conversation came free in ${RETRY_LIMIT_MS / 60000} minutes. ${readyReason(ready.reason)}`, ["retry"]);
        });
        return;
      }
      const why = readyReason(ready.reason) || `It answered HTTP ${ready.status}.`;
      const source = given == null ? "" : " (as its Retry-After says)";
      for (let left = seconds; left > 0; left--) {
        status.notice("waiting", "The server is full.", `${why} Trying again in ${left} s${source}; attempt ${attempt}.`, ["cancel"]);
        await sleep(1000);
        if (waiting.cancelled) return;
      }
    }
  }

  cancelWait() {
    if (!this.waiting) return;
    this.waiting.cancelled = true;
    this.waiting = null;
    this.status.set("busy", "busy: no free conversation");
    this.status.notice("busy", "Stopped waiting.", "The server was full. Try again when you like.", ["retry"]);
  }

  async closed(call, event) {
    if (this.call !== call) return;
    this.call = null;
    call.dispose();
    call.audio.stopCapture();
    const { values } = this.figures;
    this.figures.ended();
    this.log.stopClock();
    this.log.event("×", "close", `code ${event.code}${event.reason ? " " + event.reason : ""}`);
    this.ui.stats.dataset.closeCode = String(event.code);
    // Let queued speech finish (none after a cut), then release the audio device.
    const queued = call.cutting ? 0 : Math.max(0, values.bufferedMs || 0);
    call.audio.close(queued + 500).then(() => this.figures.playbackClosed(call.audio));
    if (call.recording && !call.recording.empty) {
      this.downloads.offer(call.recording, call.conversation());
      this.transcript.attachAudio(call.recording);
    }
    await this.explainClose(call, event);
    this.figures.schedule();
  }

  async explainClose(call, event) {
    const { status } = this;
    if (event.resumeError) {
      const { code, message } = event.resumeError;
      status.set("error", "connection lost");
      status.notice("error", "The connection was lost.", code === "resync_required" ? "The server no longer holds what the page missed; start a new conversation." : "The conversation could not be resumed; start a new one.");
      status.error(`could not resume the conversation (${code}: ${message})`);
    } else if (event.code === 1013 || call.busy) {
      // The close reason is the server's message too (shortened to fit a close frame).
      status.busy(call.busyMessage || event.reason);
      const why = event.reason ? `: ${event.reason}` : ", try again later";
      if (!call.busy) status.error(`server busy (1013)${why}`);
    } else if (event.code === 1006 && call.state === "connecting") {
      await this.explainRefusal();
    } else if (event.code === 1006) {
      const gone = (await probeModels(this.key)).status === 0;
      status.set(gone ? "gone" : "error", gone ? "server gone" : "connection lost");
      status.notice(gone ? "gone" : "error", gone ? "The server went away." : "The connection was lost.",
        gone ? "The session ended when the server stopped." : "The network dropped the connection.");
      status.error(`connection lost (code 1006)${gone ? ": the server is gone" : ""}`);
    } else if (call.state === "done" && event.code === 1000) {
      status.set("closed", call.cutting ? "finished: the answer was cut" : "finished");
    } else if (event.code === 1000 || event.code === 1005) {
      status.set("closed", "closed");
    } else {
      const why = event.reason ? `: ${event.reason}` : "";
      status.error(`connection closed (code ${event.code})${why}`);
      status.set("error", `closed (${event.code})`);
    }
  }

  // Browsers hide the HTTP status of a refused upgrade: ask /v1/models and /ready why.
  async explainRefusal() {
    const { status } = this;
    status.set("connecting", "checking why…");
    const probe = await probeModels(this.key);
    if (probe.status === 401) {
      status.set("unauthorized", "wrong API key");
      this.ui.settingsPanel.open = true;
      status.notice("unauthorized", "Wrong or missing API key.", "The server refused the key (HTTP 401). Enter the key it was started with (--api-key) under Settings.");
      status.error("could not connect: missing or wrong API key (HTTP 401)");
      return;
    }
    if (probe.status === 0) {
      status.set("gone", "server unreachable");
      status.gone();
      status.error("could not connect: the server is unreachable");
      return;
    }
    const ready = await probeReady(this.key);
    if (ready.status === 503) {
      // Refused before the upgrade (HTTP 503 from the server or a balancer in front).
      status.set("busy", "busy: the server is full");
      const when = ready.retryAfter == null ? "" : ` It asks to come back in ${ready.retryAfter} s.`;
      status.notice("busy", "The server is full.", `${readyReason(ready.reason) || "It takes no new conversation now."}${when} Try again waits for a free one.`, ["retry"]);
      status.error(`could not connect: the server is full (/ready: 503${ready.reason ? " " + ready.reason : ""})`);
      return;
    }
    status.set("error", "refused");
    status.notice("error", "The server refused the WebSocket.", "The key is fine and the server has room, so the page's Origin is probably not allowed (start the server with --allowed-origin); behind a balancer that was full a moment ago, Try again.", ["retry"]);
    status.error("could not connect: the server refused the WebSocket upgrade (Origin not allowed?)");
  }

  wire() {
    const { ui } = this;
    const mics = () => listMics(ui.mic).catch(() => {});
    ui.form.addEventListener("submit", (e) => e.preventDefault());
    ui.start.addEventListener("click", () => this.start());
    ui.stop.addEventListener("click", () => this.stop());
    ui.retry.addEventListener("click", () => this.retry());
    ui.retryCancel.addEventListener("click", () => this.cancelWait());
    ui.apiKey.addEventListener("input", () => {
      clearTimeout(this.keyTimer);
      this.keyTimer = setTimeout(() => this.model.load(), 400);
    });
    for (const el of [ui.prompt, ui.seed, ui.answerLimit, ui.mic, ui.echo]) {
      el.addEventListener("input", () => this.showSettings());
      el.addEventListener("change", () => this.showSettings());
    }
    ui.volume.addEventListener("input", () => {
      ui.volumeValue.textContent = `${ui.volume.value} %`;
      if (this.call) this.call.audio.setVolume(this.volume);
    });
    ui.micRefresh.addEventListener("click", mics);
    if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
      navigator.mediaDevices.addEventListener("devicechange", mics);
    }
    window.addEventListener("beforeunload", () => {
      if (this.call) this.call.ws.close(1000, "page closed");
    });
  }

  boot() {
    this.wire();
    this.status.set("idle", "idle");
    this.showSettings();
    this.figures.render();
    listMics(this.ui.mic).catch(() => {});
    this.model.load();
  }
}

// The page's one App. A test page that imports this module for its pure units (and
// has no settings form) gets none.
if ($("settings")) {
  makeMeters();
  new App(findElements()).boot();
}
