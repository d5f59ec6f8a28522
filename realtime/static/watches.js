// One call's watches: the timing of each frame's round trip, a silent microphone,
// whether an answer has ended after Stop.

import { ANSWER_QUIET_MS, MIC_SILENT_DB, MIC_WARN_MS, OUTPUT_QUIET_DB, RTF_WINDOW_MS, RTT_KEPT, median } from "./format.js";

// Round trips (an append's send -> the audio frame with its frame_index) and the
// real-time factor (audio received over the last 5 s of wall time).
export class Timing {
  constructor(frameMs) {
    this.frameMs = frameMs;
    this.sentAt = [];
    this.rtts = [];
    this.arrivals = [];
    this.firstSent = 0;
  }

  sent(index, now) {
    this.sentAt[index] = now;
    if (!this.firstSent) this.firstSent = now;
  }

  // The figures frame `index` arriving at `now` updates: rttMs and rttMedianMs when
  // its append is known, rtf once a second has passed since the first append.
  answered(index, now) {
    const figures = {};
    const sent = this.sentAt[index];
    if (sent !== undefined) {
      figures.rttMs = now - sent;
      this.rtts.push(figures.rttMs);
      if (this.rtts.length > RTT_KEPT) this.rtts.shift();
      figures.rttMedianMs = median(this.rtts);
    }
    this.arrivals.push(now);
    while (this.arrivals.length && this.arrivals[0] < now - RTF_WINDOW_MS) this.arrivals.shift();
    const span = Math.min(RTF_WINDOW_MS, now - this.firstSent);
    if (span >= 1000) figures.rtf = (this.arrivals.length * this.frameMs) / span;
    return figures;
  }
}

// Is the microphone delivering sound? "nothing": no frame for `afterMs`; "silent":
// frames, but none above `silentDb` for `afterMs`; null: fine.
export class MicWatch {
  constructor(now, { silentDb = MIC_SILENT_DB, afterMs = MIC_WARN_MS } = {}) {
    this.silentDb = silentDb;
    this.afterMs = afterMs;
    this.lastFrame = now;
    this.lastSound = now;
  }

  frame(db, now) {
    this.lastFrame = now;
    if (db > this.silentDb) this.lastSound = now;
  }

  check(now) {
    if (now - this.lastFrame >= this.afterMs) return "nothing";
    if (now - this.lastSound >= this.afterMs) return "silent";
    return null;
  }
}

// After Stop: has the answer ended? Frames from `stopFrame` on answer the silence
// the page sends. The answer is over ("quiet") once `quietMs` of them have come with
// no token on any channel and audio below `quietDb`, and in any case ("limit")
// `limitMs` of wall time after Stop.
export class AnswerWatch {
  constructor(frameMs, stopFrame, stoppedAt, limitMs, { quietMs = ANSWER_QUIET_MS, quietDb = OUTPUT_QUIET_DB } = {}) {
    this.quietFrames = Math.max(1, Math.round(quietMs / frameMs));
    this.quietDb = quietDb;
    this.stopFrame = stopFrame;
    this.deadline = stoppedAt + limitMs;
    this.lastVoice = -1; // the last frame that carried a token or audible audio
    this.lastFrame = -1; // the last answer frame received
  }

  token(frameIndex) {
    if (Number.isInteger(frameIndex)) this.lastVoice = Math.max(this.lastVoice, frameIndex);
  }

  audio(frameIndex, db) {
    this.lastFrame = Math.max(this.lastFrame, frameIndex);
    if (db > this.quietDb) this.lastVoice = Math.max(this.lastVoice, frameIndex);
  }

  verdict(now) {
    const quietFrom = Math.max(this.lastVoice + 1, this.stopFrame);
    if (this.lastFrame + 1 - quietFrom >= this.quietFrames) return "quiet";
    if (now >= this.deadline) return "limit";
    return null;
  }
}

// The audio kept for the download and the turns' replay: microphone frames in
// order, model frames by frame_index, 30 minutes of each at most.
