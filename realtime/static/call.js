// One call: its audio graph (CallAudio) and its WebSocket session (Call), whose
// phases change only along CALL_STATES.

import { DASH, DONE_TIMEOUT_MS, MIC_CHECK_MS, answerLimitSeconds, base64ToInt16, bytesToBase64, levelDb, sessionFormat, sessionUpdate, summarize } from "./format.js";
import { Recording } from "./recording.js";
import { AnswerWatch, MicWatch, Timing } from "./watches.js";

// The call's phases and the only changes between them, in one table: each phase names
// the phases that may follow it. connecting (the socket opening) -> configuring
// (session.created: session.update sent) -> live (session.updated: audio both ways)
// -> finishing (Stop: silence out while the answer finishes) -> committing (the
// commit, or a cut, sent; a cut may follow the commit) -> done (response.done or
// response.cancelled). A dropped connection (no close frame) in a resumable session
// goes to reconnecting, and back to the phase it left once resumed. A call may end
// from any phase (the server ends it, the socket closes, the resume fails).
export const CALL_STATES = Object.freeze({
  connecting: Object.freeze(["configuring", "done"]),
  configuring: Object.freeze(["live", "reconnecting", "done"]),
  live: Object.freeze(["finishing", "committing", "reconnecting", "done"]),
  finishing: Object.freeze(["committing", "reconnecting", "done"]),
  committing: Object.freeze(["committing", "reconnecting", "done"]),
  reconnecting: Object.freeze(["configuring", "live", "finishing", "committing", "done"]),
  done: Object.freeze([]),
});

// The phase `to` after `from`, or an Error naming a change the table does not allow.
export function advance(from, to) {
  if (!(CALL_STATES[from] || []).includes(to)) throw new Error(`a call cannot go from ${from} to ${to}`);
  return to;
}

// getUserMedia refused: the page explains some of these (App.micProblem).
export class MicError extends Error {
  constructor(cause) {
    super(cause && cause.message ? cause.message : String(cause));
    this.cause = cause;
  }
}

// One call's audio graph: microphone -> capture worklet (frames for the appends),
// playback worklet -> volume -> speakers, and an analyser on each side.
export class CallAudio {
  static async open(deviceId, echo, volume) {
    const ctx = new AudioContext({ latencyHint: "interactive" });
    try {
      await ctx.audioWorklet.addModule("/static/audio-worklet.js");
      const stream = await navigator.mediaDevices
        .getUserMedia({
          audio: {
            deviceId: deviceId ? { exact: deviceId } : undefined,
            channelCount: 1,
            echoCancellation: echo,
            noiseSuppression: echo,
            autoGainControl: echo,
          },
        })
        .catch((err) => Promise.reject(new MicError(err)));
      return new CallAudio(ctx, stream, volume);
    } catch (err) {
      ctx.close().catch(() => {});
      throw err;
    }
  }

  constructor(ctx, stream, volume) {
    this.ctx = ctx;
    this.stream = stream;
    this.gain = ctx.createGain();
    this.gain.gain.value = volume;
    this.gain.connect(ctx.destination);
    this.micAnalyser = new AnalyserNode(ctx, { fftSize: 2048 });
    this.outAnalyser = new AnalyserNode(ctx, { fftSize: 2048 });
    this.source = null;
    this.capture = null;
    this.playback = null;
    this.closing = null;
  }

  echoReport() {
    const settings = this.stream.getAudioTracks()[0].getSettings();
    if (settings.echoCancellation === undefined) return "";
    return `Browser reports: echo cancellation ${settings.echoCancellation ? "on" : "off"}.`;
  }

  async resume() {
    if (this.ctx.state === "suspended") await this.ctx.resume();
  }

  // Frames of `format.frameSamples` at `format.inputRate` to onFrame({pcm, levelDb}).
  startCapture(format, onFrame) {
    const { ctx } = this;
    this.source = ctx.createMediaStreamSource(this.stream);
    this.capture = new AudioWorkletNode(ctx, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { targetRate: format.inputRate, frameSamples: format.frameSamples },
    });
    this.capture.port.onmessage = (e) => {
      if (e.data.type === "frame") onFrame(e.data);
    };
    this.source.connect(this.capture);
    this.source.connect(this.micAnalyser);
    // The capture node outputs silence; connecting it keeps it pulled by the graph.
    this.capture.connect(ctx.destination);
  }

  // The microphone off (its tracks stopped), while the capture worklet goes on
  // posting frames of silence at the same pace.
  muteCapture() {
    if (this.capture) this.capture.port.postMessage({ type: "mute" });
    this.releaseMic();
  }

  releaseMic() {
    if (this.source) {
      this.source.disconnect();
      this.source = null;
    }
    for (const track of this.stream.getTracks()) track.stop();
  }

  // The microphone and the capture off for good.
  stopCapture() {
    if (this.capture) {
      this.capture.port.postMessage({ type: "stop" });
      this.capture.disconnect();
      this.capture = null;
    }
    this.releaseMic();
  }

  // Answer audio arrives at `format.outputRate`; the worklet resamples it.
  openPlayback(format, onStats) {
    this.playback = new AudioWorkletNode(this.ctx, "playback-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { inputRate: format.outputRate },
    });
    this.playback.port.onmessage = (e) => {
      if (e.data.type === "stats") onStats(e.data);
    };
    this.playback.connect(this.gain);
    this.playback.connect(this.outAnalyser);
  }

  play(pcm) {
    const samples = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
    this.playback.port.postMessage({ type: "audio", samples }, [samples.buffer]);
  }

  finish() {
    if (this.playback) this.playback.port.postMessage({ type: "finish" });
  }

  // Silence now: what is queued is dropped (the user cut the answer).
  silence() {
    if (this.playback) {
      this.playback.port.postMessage({ type: "reset" });
      this.playback.port.postMessage({ type: "finish" });
    }
  }

  setVolume(volume) {
    this.gain.gain.setTargetAtTime(volume, this.ctx.currentTime, 0.02);
  }

  // Resolves once the audio device is released.
  close(afterMs = 0) {
    if (!this.closing) {
      const { ctx } = this;
      this.closing = new Promise((resolve) => setTimeout(resolve, afterMs)).then(() =>
        ctx.close().catch(() => {}),
      );
    }
    return this.closing;
  }
}

// One WebSocket session: its phase, the server's figures once session.updated has
// come, and the handling of every server event. Phases: connecting, configuring,
// live, finishing (after Stop: silence out, the answer still coming), committing
// (the commit sent), done (response.done or response.cancelled came).
export class Call {
  constructor(app, audio, ws) {
    this.app = app;
    this.audio = audio;
    this.ws = ws;
    this.state = "connecting";
    this.sessionId = null;
    this.busy = false;
    this.busyMessage = ""; // the server's server_busy message
    this.format = null; // from session.updated
    this.timing = null;
    this.recording = null;
    this.micWatch = null;
    this.micTimer = 0;
    this.answer = null; // AnswerWatch, after Stop
    this.answerTimer = 0;
    this.doneTimer = 0;
    this.ending = null; // "done" or "cancelled": how the server ended it
    this.cutting = false; // the second Stop: response.cancel sent
    this.started = new Date().toISOString();
    this.resumeTo = null; // the phase a reconnecting call goes back to
    ws.onmessage = (e) => this.receive(e.data);
    ws.onerror = () => {}; // the details (close code) arrive with onclose
    ws.onclose = (e) => app.closed(this, e);
    ws.onreconnecting = () => this.reconnecting();
    ws.onresumed = () => this.resumed();
  }

  // The phase the call is in, or goes back to once its connection is resumed.
  get phase() {
    return this.state === "reconnecting" ? this.resumeTo : this.state;
  }

  // The connection dropped: the socket reconnects; the microphone's frames are kept
  // for the server, the answer waits.
  reconnecting() {
    if (!this.current) return;
    this.resumeTo = this.state;
    this.enter("reconnecting");
    const { ui } = this.app;
    ui.stats.dataset.drops = String(Number(ui.stats.dataset.drops || 0) + 1);
    this.app.status.set("reconnecting", "connection lost: reconnecting…");
    this.app.log.event("×", "connection lost", "reconnecting");
  }

  resumed() {
    if (!this.current) return;
    this.enter(this.resumeTo);
    const { ui } = this.app;
    ui.stats.dataset.resumes = String(this.ws.resumes);
    this.app.log.event("→", "session.resume", `resumed (${this.ws.resumes})`);
    const labels = { live: "live: speak now", configuring: "configuring" };
    this.app.status.set(this.state, labels[this.state] || "finishing the answer…");
  }

  get current() {
    return this.app.call === this;
  }

  // The next phase, along CALL_STATES only; a change the table does not allow is a bug
  // of the page, shown as an error, and the phase stays.
  enter(to) {
    try {
      this.state = advance(this.state, to);
    } catch (err) {
      this.app.status.error(err.message);
    }
  }

  send(message, silence = false) {
    if (!this.ws.send(JSON.stringify(message))) return false;
    if (message.type === "input_audio_buffer.append") this.app.log.append(this.format.frameMs, silence);
    else this.app.log.event("→", message.type, summarize(message));
    return true;
  }

  receive(data) {
    if (!this.current) return;
    let event;
    try {
      event = JSON.parse(data);
    } catch (err) {
      this.app.status.error(`server sent invalid JSON: ${err.message}`);
      return;
    }
    this.dispatch(event);
  }

  dispatch(event) {
    const { figures, transcript, status, log } = this.app;
    if (event.type !== "response.audio.delta") log.event("←", event.type, summarize(event));
    switch (event.type) {
      case "session.created":
        this.created(event.session || {});
        break;
      case "session.updated":
        this.updated(event.session || {});
        break;
      case "conversation.item.input_audio_transcription.delta":
        figures.values.transcriptDeltas += 1;
        transcript.grow("user", event, event.transcript);
        if (this.answer) this.answer.token(event.frame_index);
        break;
      case "response.text.delta":
        figures.values.textDeltas += 1;
        transcript.grow("assistant", event, event.text);
        if (this.answer) this.answer.token(event.frame_index);
        break;
      case "response.function.delta":
        figures.values.functionDeltas += 1;
        transcript.functionDelta(event);
        if (this.answer) this.answer.token(event.frame_index);
        break;
      case "response.audio.delta":
        this.audioDelta(event);
        break;
      case "input_audio_buffer.committed":
        if (this.state !== "done" && !this.cutting) status.set("committing", "finishing the answer…");
        break;
      case "response.done":
        this.ended("done");
        this.audio.finish();
        status.set("done", "done");
        break;
      case "response.cancelled":
        this.ended("cancelled");
        status.set("done", "cut");
        break;
      case "error":
        this.serverError(event.error || {});
        break;
      default:
        break;
    }
    figures.schedule();
  }

  created(session) {
    const { ui, status } = this.app;
    this.enter("configuring");
    this.sessionId = session.id;
    ui.statSession.textContent = this.sessionId || DASH;
    ui.stats.dataset.sessionId = this.sessionId || "";
    status.set("configuring", "configuring");
    this.send(sessionUpdate(ui.prompt.value, ui.seed.value));
  }

  // The session is ready, with its frame and rates: audio can flow both ways.
  updated(session) {
    const { app, audio } = this;
    this.format = sessionFormat(session);
    app.ui.stats.dataset.frameMs = String(this.format.frameMs);
    this.timing = new Timing(this.format.frameMs);
    this.recording = new Recording(this.format);
    app.transcript.frameMs = this.format.frameMs;
    app.figures.playbackOpened(audio);
    audio.openPlayback(this.format, (msg) => app.figures.playback(msg, audio));
    this.enter("live");
    app.status.set("live", "live: speak now");
    this.micWatch = new MicWatch(performance.now());
    this.micTimer = setInterval(() => this.checkMic(), MIC_CHECK_MS);
    audio.startCapture(this.format, (frame) => this.captured(frame));
  }

  checkMic() {
    if (!this.current || this.phase !== "live" || !this.micWatch) return;
    this.app.status.micWarning(this.micWatch.check(performance.now()));
  }

  // A frame from the capture worklet: the microphone's, or (after Stop) its silence.
  captured(frame) {
    if (!this.current || (this.phase !== "live" && this.phase !== "finishing")) return;
    const silence = frame.silence === true;
    const { figures } = this.app;
    const index = figures.values.appendsSent;
    const sent = this.send(
      { type: "input_audio_buffer.append", audio: bytesToBase64(frame.pcm), sample_rate: this.format.inputRate },
      silence,
    );
    if (!sent) return;
    const now = performance.now();
    this.timing.sent(index, now);
    this.recording.addMic(new Int16Array(frame.pcm));
    figures.values.appendsSent += 1;
    if (silence) {
      figures.values.silenceSent += 1;
    } else if (this.micWatch) {
      figures.values.inputLevelDb = Math.max(-120, frame.levelDb);
      this.micWatch.frame(frame.levelDb, now);
    }
    figures.schedule();
  }

  audioDelta(event) {
    const { figures, status, log } = this.app;
    if (!this.format) {
      status.error("response.audio.delta before session.updated");
      return;
    }
    const now = performance.now();
    const values = figures.values;
    values.audioDeltas += 1;
    const index = event.frame_index;
    if (values.lastFrameIndex !== null && index <= values.lastFrameIndex) {
      status.error(`audio frame_index went backwards (${index})`);
    }
    values.lastFrameIndex = index;
    log.audioFrame(index);
    Object.assign(values, this.timing.answered(index, now));
    const pcm = base64ToInt16(event.delta);
    this.recording.addModel(index, pcm);
    if (this.cutting) return; // the user cut the answer: nothing more is played
    this.audio.play(pcm);
    if (this.answer) {
      this.answer.audio(index, levelDb(pcm));
      this.checkAnswer();
    }
  }

  serverError(err) {
    if (err.code === "server_busy") {
      this.busy = true;
      this.busyMessage = err.message || "";
      this.app.status.busy(this.busyMessage);
    }
    this.app.status.error(`${err.code || "error"}: ${err.message || ""}`);
  }

  // Stop: a live call ends the user's turn and lets the answer finish; during that,
  // a second Stop cuts the answer; a call still setting up is closed.
  stop() {
    if (this.state === "reconnecting") this.ws.close(1000, "stopped by the user");
    else if (this.state === "live") this.finish();
    else if (this.state === "finishing" || this.state === "committing") this.cut();
    else if (this.state !== "done") this.ws.close(1000, "stopped by the user");
  }

  // The microphone off; silence goes on at the frame pace until the answer has gone
  // quiet or the bound has passed; then the commit.
  finish() {
    const { app } = this;
    const limitMs = 1000 * answerLimitSeconds(app.ui.answerLimit.value);
    this.stopMicWatch();
    this.enter("finishing");
    this.audio.muteCapture();
    app.figures.micOff();
    if (limitMs <= 0) {
      this.commit("at once");
      return;
    }
    const now = performance.now();
    const stopFrame = app.figures.values.appendsSent;
    app.ui.stats.dataset.stopFrame = String(stopFrame); // the first frame after Stop
    this.answer = new AnswerWatch(this.format.frameMs, stopFrame, now, limitMs);
    this.answerTimer = setInterval(() => this.checkAnswer(), 200);
    app.status.limitS = limitMs / 1000;
    app.status.set("finishing", "finishing the answer…");
  }

  checkAnswer() {
    if (this.state !== "finishing" || !this.answer) return;
    const verdict = this.answer.verdict(performance.now());
    if (verdict) this.commit(verdict);
  }

  // `why`: "quiet" (the answer went quiet), "limit" (the bound), "at once" (no bound).
  commit(why) {
    clearInterval(this.answerTimer);
    this.answer = null;
    this.enter("committing");
    this.app.ui.stats.dataset.finishedBy = why;
    this.audio.stopCapture();
    this.send({ type: "input_audio_buffer.commit", pad_partial: true });
    this.app.status.set("committing", "finishing the answer…");
    this.expectEnd("response.done");
  }

  // The second Stop: the answer is cut (response.cancel), and what is queued is not played.
  cut() {
    clearInterval(this.answerTimer);
    this.answer = null;
    this.cutting = true;
    this.audio.stopCapture();
    this.audio.silence();
    this.app.ui.stats.dataset.finishedBy = "cut";
    if (!this.send({ type: "response.cancel" })) {
      this.ws.close(1000, "cut by the user");
      return;
    }
    this.enter("committing");
    this.app.status.set("committing", "cutting the answer…");
    this.app.ui.hint.textContent = "Cutting the answer: nothing more of it is played.";
    this.app.ui.stop.disabled = true;
    this.expectEnd("response.cancelled");
  }

  // The server owes `what` and the close; if neither comes, the page closes.
  expectEnd(what) {
    clearTimeout(this.doneTimer);
    this.doneTimer = setTimeout(() => {
      if (!this.current) return;
      this.app.status.error(`no ${what} within ${DONE_TIMEOUT_MS / 1000} s: closing the connection`);
      this.ws.close(1000, "no answer to the commit");
    }, DONE_TIMEOUT_MS);
  }

  ended(how) {
    if (this.state !== "done") this.enter("done");
    this.ending = how;
    clearInterval(this.answerTimer);
    this.answer = null;
    this.stopMicWatch();
  }

  stopMicWatch() {
    clearInterval(this.micTimer);
    this.micWatch = null;
    this.app.status.micWarning(null);
  }

  // Every timer off: the connection has closed.
  dispose() {
    clearInterval(this.answerTimer);
    clearTimeout(this.doneTimer);
    this.stopMicWatch();
  }

  // What the downloads say about this call.
  conversation() {
    const { transcript, figures, model } = this.app;
    return {
      model: model.id,
      sessionId: this.sessionId,
      started: this.started,
      frameMs: this.format.frameMs,
      turns: transcript.turns,
      fn: transcript.fn,
      figures: figures.values,
    };
  }
}

