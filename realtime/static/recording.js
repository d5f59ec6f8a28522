// The call kept for its downloads: both sides' audio on the model's timeline, each
// turn's span, and the WAV, JSON and Markdown made of them.

import { ASSISTANT_TAIL_MS, RECORD_LIMIT_MS, USER_LEAD_MS, formatFunction } from "./format.js";

export class Recording {
  constructor(format) {
    this.format = format;
    this.limit = Math.floor(RECORD_LIMIT_MS / format.frameMs);
    this.mic = [];
    this.model = [];
  }

  get empty() {
    return this.mic.length === 0 && this.model.length === 0;
  }

  addMic(pcm) {
    if (this.mic.length < this.limit) this.mic.push(pcm);
  }

  addModel(index, pcm) {
    if (index < this.limit) this.model[index] = pcm;
  }

  wav() {
    return new Blob([conversationWav(this.mic, this.model, this.format)], { type: "audio/wav" });
  }

  // Frames [first, end) of one channel, one after the other (a missing one as silence).
  span(role, first, end) {
    const frames = role === "user" ? this.mic : this.model;
    const size = role === "user" ? this.format.frameSamples : this.format.outputFrameSamples;
    const out = new Int16Array(Math.max(0, end - first) * size);
    for (let k = first; k < end; k++) if (frames[k]) out.set(frames[k].subarray(0, size), (k - first) * size);
    return out;
  }
}

// The frames [first, end) a turn's replay plays: a user turn from a little before its
// first word (transcription follows speech) to its last; an answer from its first
// token to a little after its last (speech follows text). null: nothing recorded.
export function turnSpan(turn, frameMs, micFrames, modelFrames) {
  if (!Number.isInteger(turn.frame) || turn.frame < 0 || !(frameMs > 0)) return null;
  const last = Number.isInteger(turn.last) ? turn.last : turn.frame;
  let first;
  let end;
  if (turn.role === "user") {
    first = Math.max(0, turn.frame - Math.round(USER_LEAD_MS / frameMs));
    end = Math.min(micFrames, last + 1);
  } else {
    first = turn.frame;
    end = Math.min(modelFrames, last + 1 + Math.round(ASSISTANT_TAIL_MS / frameMs));
  }
  return end > first ? { first, end } : null;
}

function writeWavHeader(view, frames, rate, channels = 2) {
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  const block = 2 * channels;
  text(0, "RIFF");
  view.setUint32(4, 36 + frames * block, true);
  text(8, "WAVE");
  text(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, channels, true);
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * block, true);
  view.setUint16(32, block, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, frames * block, true);
}

// Mono PCM16 WAV of `pcm` (Int16Array) at `rate`.
export function monoWav(pcm, rate) {
  const bytes = new ArrayBuffer(44 + pcm.length * 2);
  const view = new DataView(bytes);
  writeWavHeader(view, pcm.length, rate, 1);
  for (let i = 0; i < pcm.length; i++) view.setInt16(44 + i * 2, pcm[i], true);
  return bytes;
}

// Stereo PCM16 WAV at the output rate: left = microphone (at the input rate, linearly
// resampled), right = model, both on the model's frame timeline (frame k at k frames).
export function conversationWav(mic, model, format) {
  const { frameSamples, outputFrameSamples: outFrame, inputRate, outputRate } = format;
  const n = Math.max(mic.length, model.length) * outFrame;
  const input = new Float32Array(mic.length * frameSamples);
  mic.forEach((f, k) => input.set(f, k * frameSamples));
  const bytes = new ArrayBuffer(44 + n * 4);
  const view = new DataView(bytes);
  writeWavHeader(view, n, outputRate);
  const step = inputRate / outputRate;
  for (let j = 0; j < n; j++) {
    const p = j * step;
    const i = Math.floor(p);
    const a = i < input.length ? input[i] : 0;
    const b = i + 1 < input.length ? input[i + 1] : 0;
    view.setInt16(44 + j * 4, Math.round(a + (b - a) * (p - i)), true);
    const frame = model[Math.floor(j / outFrame)];
    view.setInt16(46 + j * 4, frame ? frame[j % outFrame] || 0 : 0, true);
  }
  return bytes;
}

const turnStart = (t, frameMs) => (t.frame >= 0 ? (t.frame * frameMs) / 1000 : null);

// `c`: {model, sessionId, started, frameMs, turns, fn, figures} of a finished call.
export function conversationRecord(c) {
  return {
    model: c.model,
    session_id: c.sessionId || null,
    started: c.started,
    frame_ms: c.frameMs,
    turns: c.turns.map((t) => ({ role: t.role, start_s: turnStart(t, c.frameMs), text: t.text.trim() })),
    function_channel: c.fn,
    figures: { ...c.figures },
  };
}

export function conversationMarkdown(c) {
  const lines = [`# Conversation with ${c.model || "the model"}`, ""];
  lines.push(`Session \`${c.sessionId || "?"}\`, started ${c.started}.`, "");
  for (const t of c.turns) {
    const start = turnStart(t, c.frameMs);
    const at = start === null ? "" : ` (${start.toFixed(1)} s)`;
    lines.push(`**${t.role === "user" ? "You" : "Assistant"}**${at}: ${t.text.trim()}`, "");
  }
  if (c.fn.trim()) lines.push("## Function channel", "", "```", formatFunction(c.fn), "```", "");
  return lines.join("\n");
}

