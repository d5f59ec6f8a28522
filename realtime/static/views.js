// The page's units, each keeping its own part of the page: the figures, the state and
// its banners, the event log, the transcript and its replays, the downloads, the
// waveform and the served model.

import { ACTIVE, ANSWER_LIMIT_S, DASH, INITIAL_FIGURES, LOG_LIMIT, METER_FLOOR_DB, MIC_SILENT_DB, MIC_WARN_MS, TURN_GAP_MS, fmtMs, formatFunction, sentence } from "./format.js";
import { probeModels } from "./net.js";
import { conversationMarkdown, conversationRecord, monoWav, turnSpan } from "./recording.js";

export const $ = (id) => document.getElementById(id);

// The level meters, one row each from the page's template: ids meter-<which>,
// meter-<which>-db and <which>-label, as Figures.meter reads them.
const METERS = [
  ["in", "Microphone"],
  ["out", "Model"],
];

export function makeMeters() {
  const template = $("meter-row");
  for (const [which, label] of METERS) {
    const row = template.content.firstElementChild.cloneNode(true);
    const [name, meter, db] = row.children;
    name.id = `${which}-label`;
    name.textContent = label;
    meter.id = `meter-${which}`;
    meter.classList.add(which);
    meter.setAttribute("aria-labelledby", name.id);
    db.id = `meter-${which}-db`;
    template.parentNode.insertBefore(row, template);
  }
}


// The live numbers (also mirrored as data-* on #stats for scripts and tests; a
// figure not measured now has no attribute and reads "—") and their rendering, at
// most once per animation frame. `phase`: "none" (no call yet), "active", "ended".
export class Figures {
  constructor(ui) {
    this.ui = ui;
    this.values = { ...INITIAL_FIGURES };
    this.phase = "none";
    this.playbackSource = null; // the CallAudio whose playback reports count
    this.queued = false;
  }

  reset() {
    Object.assign(this.values, INITIAL_FIGURES);
    this.playbackSource = null;
    this.phase = "active";
  }

  schedule() {
    if (this.queued) return;
    this.queued = true;
    const render = () => {
      this.queued = false;
      this.render();
    };
    // Once per frame; a hidden tab gets no animation frames, so a timer there.
    if (document.hidden) setTimeout(render, 100);
    else requestAnimationFrame(render);
  }

  // The playback worklet's report (about 20 a second) from `source`'s worklet.
  // Latency is a figure while audio plays; the target while more is expected.
  playback(msg, source) {
    if (source !== this.playbackSource) return;
    const v = this.values;
    v.bufferedMs = msg.bufferedMs;
    v.latencyMs = msg.playing ? msg.latencyMs : null;
    v.targetMs = msg.finished ? null : msg.targetMs;
    v.underruns = msg.underruns;
    v.caughtUpMs = msg.caughtUpMs;
    v.droppedMs = msg.droppedMs;
    v.stretchedMs = msg.stretchedMs;
    v.outputLevelDb = msg.playing ? Math.max(-120, msg.levelDb) : null;
    this.schedule();
  }

  playbackOpened(source) {
    this.playbackSource = source;
  }

  // The speakers are released: nothing plays, nothing is buffered.
  playbackClosed(source) {
    if (source !== this.playbackSource) return;
    this.playbackSource = null;
    Object.assign(this.values, { bufferedMs: null, latencyMs: null, targetMs: null, outputLevelDb: null });
    this.schedule();
  }

  micOff() {
    this.values.inputLevelDb = null;
    this.schedule();
  }

  // The call is over: what was live is no longer measured; the totals stay.
  ended() {
    this.phase = "ended";
    Object.assign(this.values, { inputLevelDb: null, rttMs: null, rtf: null });
    this.schedule();
  }

  render() {
    const { ui, values: v } = this;
    for (const [key, value] of Object.entries(v)) {
      if (value == null) delete ui.stats.dataset[key];
      else ui.stats.dataset[key] = String(key === "rtf" ? Math.round(value * 100) / 100 : Math.round(value));
    }
    ui.stats.dataset.phase = this.phase;
    const none = this.phase === "none";
    const silence = v.silenceSent ? ` (${v.silenceSent} of silence after Stop)` : "";
    ui.statFrames.textContent = none ? DASH : `${v.appendsSent}${silence} / ${v.audioDeltas}`;
    const median = v.rttMedianMs == null ? "" : ` (median ${fmtMs(v.rttMedianMs)})`;
    ui.statRtt.textContent = v.rttMs == null && !median ? DASH : `${fmtMs(v.rttMs)}${median}`;
    const target = v.targetMs == null ? "" : ` (target ${fmtMs(v.targetMs)})`;
    ui.statLatency.textContent = `${fmtMs(v.latencyMs)}${target}`;
    ui.statRtf.textContent = v.rtf == null ? DASH : `${v.rtf.toFixed(2)}×`;
    ui.statUnderruns.textContent = v.underruns == null ? DASH : String(v.underruns);
    ui.statCaughtUp.textContent = fmtMs(v.caughtUpMs);
    ui.statDropped.textContent = fmtMs(v.droppedMs);
    ui.figuresNote.textContent = {
      none: "No session yet: every figure reads — until it is measured.",
      active: "This session, as it runs. — : not measured now.",
      ended: "The session has ended: its totals stay; what was live reads —.",
    }[this.phase];
    this.meter("in", v.inputLevelDb);
    this.meter("out", v.outputLevelDb);
    const summary = [];
    if (v.rttMs != null) summary.push(`round trip ${fmtMs(v.rttMs)}`);
    if (v.latencyMs != null) summary.push(`playback ${fmtMs(v.latencyMs)}`);
    if (v.errors) summary.push(`${v.errors} error${v.errors === 1 ? "" : "s"}`);
    ui.diagSummary.textContent = summary.length ? `· ${summary.join(" · ")}` : "";
  }

  meter(which, db) {
    const meter = $(`meter-${which}`);
    const active = db != null;
    const value = active ? Math.max(METER_FLOOR_DB, Math.min(0, Math.round(db))) : METER_FLOOR_DB;
    meter.setAttribute("aria-valuenow", String(value));
    meter.setAttribute("aria-valuetext", active ? `${value} dBFS` : "off");
    const fill = (100 * (value - METER_FLOOR_DB)) / -METER_FLOOR_DB;
    meter.firstElementChild.style.width = `${fill}%`;
    meter.dataset.hot = String(value > -6);
    $(`meter-${which}-db`).textContent = active ? `${value} dB` : DASH;
  }
}

const HINTS = {
  idle: "Press Start talking, allow the microphone, and speak. Stop ends your turn; the answer then finishes.",
  connecting: "Connecting…",
  configuring: "Connecting…",
  live: "Speak now. Stop ends your turn and lets the answer finish.",
  finishing: "Your microphone is off; the answer is finishing (up to {limit} s). Stop again cuts it.",
  committing: "The answer is ending. Stop again cuts it.",
  reconnecting: "The connection dropped; the conversation waits while the page reconnects. Stop ends it.",
  waiting: "Waiting for a free conversation; Cancel stops waiting.",
  closed: "The conversation has ended. Play any turn again, or Start talking for a new one.",
  done: "The answer has ended.",
  busy: "The server is full. Try again waits for a free conversation.",
};
const OTHER_HINT = "See the banner above for what happened and what to do.";

// The state badge and the controls it enables, the banners, the error list.
export class StatusView {
  constructor(ui, figures) {
    this.ui = ui;
    this.figures = figures;
    this.limitS = ANSWER_LIMIT_S;
  }

  get noticeKind() {
    return this.ui.notice.dataset.kind;
  }

  set(state, label) {
    const { ui } = this;
    ui.state.dataset.state = state;
    ui.state.textContent = label || state;
    document.body.dataset.state = state;
    const active = ACTIVE.includes(state);
    ui.start.disabled = active;
    ui.stop.disabled = !active;
    ui.stop.textContent =
      state === "finishing" || state === "committing" ? "Cut the answer" : state === "waiting" ? "Cancel" : "Stop";
    for (const el of [ui.apiKey, ui.mic, ui.echo, ui.prompt, ui.seed, ui.answerLimit]) el.disabled = active;
    ui.hint.textContent = (HINTS[state] || OTHER_HINT).replace("{limit}", String(this.limitS));
    if (state !== "live") this.micWarning(null);
    this.figures.render(); // figures and state change together for anyone watching both
  }

  // `actions`: which of the banner's buttons show ("retry", "cancel").
  notice(kind, title, text, actions = []) {
    const { notice } = this.ui;
    this.ui.retry.hidden = !actions.includes("retry");
    this.ui.retryCancel.hidden = !actions.includes("cancel");
    if (!kind) {
      notice.hidden = true;
      delete notice.dataset.kind;
      return;
    }
    notice.dataset.kind = kind;
    this.ui.noticeTitle.textContent = title;
    this.ui.noticeText.textContent = text || "";
    notice.hidden = false;
  }

  // Refused for want of a free conversation (server_busy, close 1013). `message` is
  // the server's own: all of its conversations in use, or at its real-time capacity.
  busy(message) {
    this.set("busy", "busy: no free conversation");
    const why = sentence(message || "no conversation is free; try again later");
    this.notice("busy", "The server is busy.", why, ["retry"]);
  }

  gone() {
    this.notice("gone", "The server cannot be reached.", "Is `realtime serve` still running?");
  }

  // The microphone delivers silence ("silent") or nothing ("nothing"); null: fine.
  micWarning(kind) {
    const { ui } = this;
    const was = ui.micWarning.dataset.kind || null;
    if (kind === was) return;
    if (!kind) {
      ui.micWarning.hidden = true;
      delete ui.micWarning.dataset.kind;
      if (ui.state.dataset.state === "live") ui.state.textContent = "live: speak now";
      return;
    }
    ui.micWarning.dataset.kind = kind;
    const seconds = MIC_WARN_MS / 1000;
    ui.micWarningTitle.textContent =
      kind === "nothing" ? "The microphone delivers no audio." : "The microphone delivers only silence.";
    ui.micWarningText.textContent =
      kind === "nothing"
        ? `Nothing has come from it for ${seconds} s: is it unplugged, or in use by another program? Pick another one under Settings, or press Stop.`
        : `For ${seconds} s it has been below ${MIC_SILENT_DB} dBFS: is it muted, or the wrong device? Pick another one under Settings, or press Stop.`;
    ui.micWarning.hidden = false;
    ui.state.textContent = kind === "nothing" ? "live: no audio from the microphone" : "live: the microphone is silent";
  }

  error(message) {
    this.figures.values.errors += 1;
    const li = document.createElement("li");
    li.textContent = `${new Date().toLocaleTimeString()} ${message}`;
    this.ui.errors.appendChild(li);
    this.figures.schedule();
  }

  clearErrors() {
    this.ui.errors.textContent = "";
  }
}

// The event log: the last LOG_LIMIT entries, runs of appends and of audio deltas
// counted in one line each, times from the call's start.
export class EventLog {
  constructor(list, counter, limit = LOG_LIMIT) {
    this.list = list;
    this.counter = counter;
    this.limit = limit;
    this.count = 0;
    this.appends = null;
    this.audio = null;
    this.t0 = 0;
  }

  startClock(t0) {
    this.t0 = t0;
  }

  stopClock() {
    this.t0 = 0;
  }

  stamp() {
    return this.t0 ? `${((performance.now() - this.t0) / 1000).toFixed(2)}s` : "0.00s";
  }

  entry(text) {
    const li = document.createElement("li");
    li.textContent = text;
    this.list.appendChild(li);
    while (this.list.childElementCount > this.limit) this.list.firstElementChild.remove();
    this.count += 1;
    this.counter.textContent = `(${this.count})`;
    return li;
  }

  event(dir, type, detail) {
    this.appends = null;
    this.audio = null;
    this.entry(`${this.stamp()} ${dir} ${type}${detail ? " " + detail : ""}`);
  }

  // One append of `frameMs`; `silence`: the page's own silence after Stop.
  append(frameMs, silence = false) {
    const what = silence ? "of silence each, after Stop" : "PCM16 each";
    const text = (run) => `${run.t} → input_audio_buffer.append ×${run.n} (${Math.round(frameMs)} ms ${what})`;
    if (this.appends && this.appends.silence !== silence) this.appends = null;
    this.appends = this.grow(this.appends, { silence }, text);
  }

  audioFrame(index) {
    const text = (run) => `${run.t} ← response.audio.delta ×${run.n} (frames ${run.first}–${index})`;
    this.audio = this.grow(this.audio, { first: index }, text);
  }

  // One more in `run` (or a new run with `fields`): its line rewritten in place.
  grow(run, fields, text) {
    if (run) {
      run.n += 1;
      run.li.textContent = text(run);
      return run;
    }
    const fresh = { t: this.stamp(), n: 1, ...fields };
    fresh.li = this.entry(text(fresh));
    return fresh;
  }
}

// A turn's replay button: what it does and how long the audio is.
function replayLabel(seconds) {
  return `▶ replay ${seconds.toFixed(1)} s`;
}

// One replay at a time: a turn's ▶ button plays its audio from a WAV blob.
class Replays {
  constructor() {
    this.playing = null; // {audio, button}
    this.urls = [];
  }

  button(wav, seconds) {
    const url = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
    this.urls.push(url);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "replay secondary small";
    button.dataset.src = url;
    button.dataset.durationMs = String(Math.round(seconds * 1000));
    button.setAttribute("aria-pressed", "false");
    button.textContent = replayLabel(seconds);
    button.title = `Play this turn's audio again (${seconds.toFixed(1)} s long)`;
    button.addEventListener("click", () => this.toggle(button));
    return button;
  }

  toggle(button) {
    const current = this.playing;
    this.stop();
    if (current && current.button === button) return;
    const audio = new Audio(button.dataset.src);
    const done = () => {
      button.setAttribute("aria-pressed", "false");
      button.textContent = replayLabel(Number(button.dataset.durationMs) / 1000);
      if (this.playing && this.playing.audio === audio) this.playing = null;
    };
    audio.addEventListener("ended", done);
    audio.addEventListener("pause", done);
    audio.addEventListener("playing", () => {
      button.setAttribute("aria-pressed", "true");
      button.textContent = "■ stop";
    });
    this.playing = { audio, button };
    audio.play().catch(done);
  }

  stop() {
    if (this.playing) this.playing.audio.pause();
    this.playing = null;
  }

  clear() {
    this.stop();
    for (const url of this.urls) URL.revokeObjectURL(url);
    this.urls = [];
  }
}

// The conversation: each party's words in turns on the model's timeline. A party's
// turn goes on while its words come less than TURN_GAP_MS apart (so in a full-duplex
// call both parties can hold a turn at once); the whole texts so far, and the
// function channel.
export class Transcript {
  constructor(ui) {
    this.ui = ui;
    this.views = { user: ui.user, assistant: ui.assistant };
    this.frameMs = 0; // the session's, once session.updated has come
    this.replays = new Replays();
    this.reset();
  }

  reset() {
    this.user = "";
    this.assistant = "";
    this.fn = "";
    this.turns = [];
    this.open = { user: null, assistant: null };
    this.replays.clear();
    const { ui } = this;
    ui.conversation.textContent = "";
    ui.conversationEmpty.hidden = false;
    for (const el of [ui.user, ui.assistant, ui.fn]) el.textContent = "";
  }

  // A transcript or text delta: `whole` is the text so far when the server sends it.
  grow(role, event, whole) {
    const before = this[role];
    this[role] = whole != null ? whole : before + (event.delta || "");
    const delta = event.delta != null ? event.delta : this[role].slice(before.length);
    this.views[role].textContent = this[role];
    this.addToTurn(role, delta, event.frame_index);
  }

  functionDelta(event) {
    this.fn = event.text != null ? event.text : this.fn + (event.delta || "");
    this.ui.fn.textContent = formatFunction(this.fn);
  }

  addToTurn(role, delta, frameIndex) {
    if (!delta) return;
    const frame = Number.isInteger(frameIndex) ? frameIndex : null;
    const follow = this.atBottom();
    let turn = this.open[role];
    const gap = this.frameMs > 0 ? TURN_GAP_MS / this.frameMs : Infinity;
    if (!turn || (frame !== null && turn.last !== null && frame - turn.last >= gap)) {
      const li = this.turnElement(role, frame);
      turn = { role, frame: frame === null ? -1 : frame, last: frame, text: "", li, el: li.querySelector("p") };
      this.turns.push(turn);
      this.open[role] = turn;
    }
    if (frame !== null) turn.last = Math.max(turn.last === null ? frame : turn.last, frame);
    turn.text += delta;
    turn.el.textContent = turn.text.trimStart();
    if (follow) turn.li.scrollIntoView({ block: "nearest" });
  }

  // Is the end of the conversation in view? Then the newest words are kept in view.
  atBottom() {
    const rect = this.ui.conversation.getBoundingClientRect();
    return rect.bottom <= window.innerHeight + 80;
  }

  turnElement(role, frameIndex) {
    const li = document.createElement("li");
    li.className = `turn ${role}`;
    const head = document.createElement("div");
    head.className = "who";
    const name = document.createElement("span");
    const known = frameIndex !== null && frameIndex >= 0 && this.frameMs > 0;
    const at = known ? ` · at ${((frameIndex * this.frameMs) / 1000).toFixed(1)} s` : "";
    name.textContent = (role === "user" ? "You" : "Assistant") + at;
    if (known) name.title = "When this turn began, counted from the start of the call";
    head.append(name);
    const body = document.createElement("p");
    li.append(head, body);
    this.ui.conversation.appendChild(li);
    this.ui.conversationEmpty.hidden = true;
    return li;
  }

  // The call has ended: each turn gets a button that plays its audio again.
  attachAudio(recording) {
    const { format } = recording;
    for (const turn of this.turns) {
      const span = turnSpan(turn, format.frameMs, recording.mic.length, recording.model.length);
      if (!span) continue;
      const pcm = recording.span(turn.role, span.first, span.end);
      const rate = turn.role === "user" ? format.inputRate : format.outputRate;
      const button = this.replays.button(monoWav(pcm, rate), pcm.length / rate);
      turn.li.querySelector(".who").append(button);
    }
  }
}

// The three download links offered when a call with audio ends.
export class Downloads {
  constructor(ui) {
    this.ui = ui;
    this.links = [ui.downloadWav, ui.downloadMd, ui.downloadJson];
  }

  clear() {
    for (const a of this.links) {
      if (a.href) URL.revokeObjectURL(a.href);
      a.removeAttribute("href");
    }
    this.ui.downloads.hidden = true;
  }

  offer(recording, conversation) {
    this.clear();
    const name = `conversation-${conversation.started.replace(/[:.]/g, "-")}`;
    const json = JSON.stringify(conversationRecord(conversation), null, 2);
    const blobs = [
      [recording.wav(), `${name}.wav`],
      [new Blob([conversationMarkdown(conversation)], { type: "text/markdown" }), `${name}.md`],
      [new Blob([json], { type: "application/json" }), `${name}.json`],
    ];
    blobs.forEach(([blob, file], i) => {
      this.links[i].href = URL.createObjectURL(blob);
      this.links[i].download = file;
    });
    this.ui.downloads.hidden = false;
  }
}

// The two-trace waveform, redrawn every animation frame while `traces()` gives
// analysers (while a call is on).
export class Waveform {
  constructor(canvas) {
    this.canvas = canvas;
    this.traces = () => null;
  }

  start(traces) {
    this.traces = traces;
    this.canvas.hidden = false;
    requestAnimationFrame(() => this.draw());
  }

  // Drawn while a call is on; with no call there is nothing to draw, so it is not shown.
  draw() {
    const { canvas } = this;
    const analysers = this.traces();
    canvas.hidden = !analysers;
    if (!analysers) return;
    const g = canvas.getContext("2d");
    const { width: w, height: h } = canvas;
    g.clearRect(0, 0, w, h);
    const styles = getComputedStyle(document.documentElement);
    g.strokeStyle = styles.getPropertyValue("--line");
    g.beginPath();
    g.moveTo(0, h / 2);
    g.lineTo(w, h / 2);
    g.stroke();
    const colors = [styles.getPropertyValue("--accent"), styles.getPropertyValue("--model")];
    analysers.forEach((analyser, k) => this.trace(g, analyser, colors[k]));
    requestAnimationFrame(() => this.draw());
  }

  trace(g, analyser, color) {
    const { width: w, height: h } = this.canvas;
    const data = new Float32Array(analyser.fftSize);
    analyser.getFloatTimeDomainData(data);
    g.strokeStyle = color;
    g.lineWidth = 1.5;
    g.beginPath();
    for (let x = 0; x < w; x++) {
      const v = data[Math.floor((x / w) * data.length)];
      const y = h / 2 - Math.max(-1, Math.min(1, v * 2)) * (h / 2 - 2);
      if (x === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    }
    g.stroke();
  }
}

// The served model (GET /v1/models) and what the page says about it.
export class ServedModel {
  constructor(ui, status) {
    this.ui = ui;
    this.status = status;
    this.served = null; // {id, demo}
  }

  get id() {
    return this.served ? this.served.id : null;
  }

  async load() {
    const { ui } = this;
    const key = ui.apiKey.value.trim();
    const { status, entry } = await probeModels(key);
    if (status === 200 && entry) {
      this.show(entry);
    } else if (status === 401) {
      ui.model.textContent = "model: API key needed";
      ui.model.dataset.modelId = "";
      ui.settingsPanel.open = true; // the key field is there
      this.status.notice(
        "key",
        key ? "Wrong API key." : "This server needs an API key.",
        key
          ? "The server refused it (HTTP 401). Check the key it was started with (--api-key)."
          : "Enter the key the server was started with (--api-key) under Settings.",
      );
    } else if (status === 0) {
      ui.model.textContent = "model: server unreachable";
      this.status.gone();
    } else {
      ui.model.textContent = `model: HTTP ${status}`;
    }
    return status;
  }

  show(entry) {
    const { ui } = this;
    const demo = entry.demo === true || String(entry.id).startsWith("realtime-demo");
    this.served = { id: entry.id, demo };
    ui.model.textContent = entry.id;
    ui.model.dataset.modelId = entry.id;
    ui.model.title = entry.path ? `${entry.id} (${entry.path})` : entry.id;
    ui.demoName.textContent = entry.id;
    ui.demo.hidden = !demo;
    if (["key", "unauthorized", "gone"].includes(this.status.noticeKind)) this.status.notice(null);
  }
}

