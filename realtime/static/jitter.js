// An adaptive jitter buffer for streamed speech, in plain JavaScript with no
// browser APIs, so the playback AudioWorklet and a test page both import it.
//
// push() queues audio as it arrives; pull(out) fills one render quantum.
// - Playback starts (and restarts after running dry) once `targetMs` is queued.
// - Each underrun raises the target by `stepMs` (up to `maxTargetMs`).
// - After `holdMs` without an underrun, the target decays by `decayMsPerS` towards
//   `minTargetMs`, never below what the recent low-water mark shows is safe.
// - When the smoothed buffered latency sits above the target (a burst after a
//   stall, a sender slightly faster than real time), playback catches up by
//   cutting one pitch-period-sized piece at a time with a short cross-fade at the
//   best-matching lag (a SOLA time compression): at most `maxSpeedup` (25 %)
//   faster, in proportion to the excess. Above `hardLimitMs` it jumps straight
//   back to the target. So latency never accumulates.
// - What it removes is counted apart: `caughtUpMs` (pieces cut by catching up; the
//   audio around them plays, a little faster) and `droppedMs` (audio discarded whole:
//   a jump above `hardLimitMs`, or the oldest audio past `capacityMs`).
// - It watches how unevenly the audio arrives (each push's arrival on the pull
//   clock against its place in the stream) and keeps the target at least at the
//   `jitterQuantile` of that lateness over the last `jitterWindowMs`, plus
//   `safetyMs`: on a busy machine the target rises before the first underrun
//   instead of after it, and falls back once delivery is even again.
// - When it sits below the target (bursty delivery drained it), playback slows
//   down by repeating a piece the same way, at most `maxSlowdown` (10 %), so the
//   margin the target stands for is really there before the next gap.

export const JITTER_DEFAULTS = Object.freeze({
  rate: 48000, // samples per second of what is pushed and pulled
  // Initial target (and prebuffer): above the lateness a loaded machine's first frames
  // show, before the lateness estimate has any to go on; it decays once delivery is
  // steady, and the call starts with the user's turn (silence plays), not an answer.
  targetMs: 200,
  minTargetMs: 100,
  maxTargetMs: 600,
  stepMs: 80, // target increase per underrun
  holdMs: 3000, // steady time before the target decays
  decayMsPerS: 25,
  safetyMs: 25, // low-water margin kept when the target decays
  deadbandMs: 15, // excess tolerated before catching up
  catchupMs: 500, // speed change = excess / catchupMs, capped below
  maxSpeedup: 0.25,
  maxSlowdown: 0.1,
  hardLimitMs: 1200, // above this, jump back to the target at once
  capacityMs: 4000, // storage; the oldest audio is dropped beyond it
  smoothingMs: 200, // time constant of the latency estimate
  overlapMs: 5, // cross-fade length of a cut
  minCutMs: 2.5, // shortest and longest piece cut out (pitch periods)
  maxCutMs: 12.5,
  fadeMs: 3, // fade in/out around gaps
  jitterWindowMs: 8000, // arrivals remembered for the lateness estimate (0: off)
  jitterQuantile: 0.9, // the lateness the target covers (a lone stall is left out)
});

export class JitterBuffer {
  constructor(options = {}) {
    const o = { ...JITTER_DEFAULTS, ...options };
    this.o = o;
    this.perMs = o.rate / 1000;
    this.buf = new Float32Array(Math.ceil(o.capacityMs * this.perMs));
    this.start = 0;
    this.end = 0;
    this.overlap = Math.max(8, Math.round(o.overlapMs * this.perMs));
    this.minCut = Math.max(2, Math.round(o.minCutMs * this.perMs));
    this.maxCut = Math.max(this.minCut, Math.round(o.maxCutMs * this.perMs));
    this.fade = Math.max(1, Math.round(o.fadeMs * this.perMs));
    this.historyMax = this.maxCut + this.overlap; // played samples kept for repeats
    this.reset();
  }

  reset() {
    this.start = 0;
    this.end = 0;
    this.targetMs = this.o.targetMs;
    this.latencyMs = 0; // smoothed buffered latency
    this.playing = false;
    this.finished = false;
    this.fadeIn = false;
    this.underruns = 0;
    this.caughtUpSamples = 0; // cut out a pitch period at a time by catching up
    this.droppedSamples = 0; // discarded whole: jumps above hardLimitMs, overflow
    this.playedSamples = 0;
    this.stretchedSamples = 0; // added by slowing down
    this.sinceUnderrun = 0; // samples pulled since the last underrun
    this.credit = 0; // samples owed to catching up (< 0: owed to slowing down)
    this.cooldown = 0;
    this.windowMin = Infinity;
    this.windowLen = 0;
    this.clock = 0; // samples pulled: the device's clock
    this.pushed = 0; // samples pushed: the stream's
    this.arrivals = []; // [clock, clock - stream position, lateness] of recent pushes
    this.jitterMs = 0; // the lateness the target covers
  }

  get size() {
    return this.end - this.start;
  }

  get bufferedMs() {
    return this.size / this.perMs;
  }

  get droppedMs() {
    return this.droppedSamples / this.perMs;
  }

  get caughtUpMs() {
    return this.caughtUpSamples / this.perMs;
  }

  get playedMs() {
    return this.playedSamples / this.perMs;
  }

  // The stream has ended: play out what is queued, with no catching up, and an
  // empty buffer is not an underrun.
  finish() {
    this.finished = true;
  }

  push(samples) {
    let x = samples;
    if (x.length === 0) return;
    this.arrived(x.length);
    this.finished = false;
    const room = this.buf.length - this.historyMax;
    if (x.length > room) {
      this.droppedSamples += x.length - room;
      x = x.subarray(x.length - room);
    }
    if (this.end + x.length > this.buf.length) {
      const overflow = this.size + x.length - room;
      if (overflow > 0) {
        this.start += overflow;
        this.droppedSamples += overflow;
      }
      const from = this.start - Math.min(this.start, this.historyMax);
      this.buf.copyWithin(0, from, this.end);
      this.start -= from;
      this.end -= from;
    }
    this.buf.set(x, this.end);
    this.end += x.length;
  }

  // One push of `n` samples arrived now: how much later, for its place in the
  // stream, than the earliest arrival remembered before it (a sender slightly
  // faster than the device is never late; a stall's frames are).
  arrived(n) {
    const o = this.o;
    if (o.jitterWindowMs <= 0) return;
    const window = o.jitterWindowMs * this.perMs;
    while (this.arrivals.length && this.arrivals[0][0] < this.clock - window) this.arrivals.shift();
    const offset = this.clock - this.pushed;
    const earliest = this.arrivals.reduce((m, a) => Math.min(m, a[1]), offset);
    this.arrivals.push([this.clock, offset, offset - earliest]);
    this.pushed += n;
    const late = this.arrivals.map((a) => a[2]).sort((a, b) => a - b);
    const k = Math.min(late.length - 1, Math.floor(o.jitterQuantile * late.length));
    this.jitterMs = late[k] / this.perMs;
  }

  // The least target the arrivals call for.
  get jitterFloorMs() {
    const o = this.o;
    if (this.jitterMs <= 0) return o.minTargetMs;
    return Math.min(o.maxTargetMs, Math.max(o.minTargetMs, this.jitterMs + o.safetyMs));
  }

  pull(out) {
    const n = out.length;
    out.fill(0);
    this.clock += n;
    const floor = this.jitterFloorMs;
    if (floor > this.targetMs) this.targetMs = floor;
    if (!this.playing && this.size > 0) {
      if (this.finished || this.size >= this.targetMs * this.perMs) {
        this.playing = true;
        this.fadeIn = true;
      }
    }
    if (this.playing) {
      this.adapt(n);
      const take = Math.min(n, this.size);
      out.set(this.buf.subarray(this.start, this.start + take));
      this.start += take;
      this.playedSamples += take;
      if (this.fadeIn) {
        const k = Math.min(take, this.fade);
        for (let i = 0; i < k; i++) out[i] *= (i + 1) / (k + 1);
        this.fadeIn = false;
      }
      if (take < n) {
        const k = Math.min(take, this.fade);
        for (let i = 0; i < k; i++) out[take - 1 - i] *= (i + 1) / (k + 1);
        this.playing = false;
        if (!this.finished) {
          this.underruns += 1;
          this.targetMs = Math.min(this.o.maxTargetMs, this.targetMs + this.o.stepMs);
          this.sinceUnderrun = 0;
        }
      }
    }
    this.track(n);
    return out;
  }

  // Latency estimate, low-water mark and the target's decay.
  track(n) {
    const o = this.o;
    const a = 1 - Math.exp(-n / (o.smoothingMs * this.perMs));
    this.latencyMs += a * (this.bufferedMs - this.latencyMs);
    this.sinceUnderrun += n;
    if (this.playing) this.windowMin = Math.min(this.windowMin, this.bufferedMs);
    this.windowLen += n;
    if (this.windowLen < o.rate) return; // once a second
    const seconds = this.windowLen / o.rate;
    const steady = this.sinceUnderrun >= o.holdMs * this.perMs && this.windowMin !== Infinity;
    const settled = Math.abs(this.latencyMs - this.targetMs) < o.deadbandMs + 10;
    if (steady && settled && this.targetMs > o.minTargetMs) {
      // What the low-water mark would be at the target, less the safety margin.
      const excess = Math.max(0, this.latencyMs - this.targetMs);
      const headroom = this.windowMin - excess - o.safetyMs;
      if (headroom > 0) {
        const step = Math.min(o.decayMsPerS * seconds, headroom);
        this.targetMs = Math.max(o.minTargetMs, this.jitterFloorMs, this.targetMs - step);
      }
    }
    this.windowMin = Infinity;
    this.windowLen = 0;
  }

  // Speed up (cut) or slow down (repeat) a little to bring the latency to the target.
  adapt(n) {
    if (this.finished) return;
    const o = this.o;
    if (this.cooldown > 0) this.cooldown -= n;
    if (this.bufferedMs > o.hardLimitMs) {
      const jump = Math.floor(this.size - this.targetMs * this.perMs) - this.overlap;
      if (jump > 0) {
        this.cut(jump);
        this.droppedSamples += jump;
        this.latencyMs = this.bufferedMs;
      }
      return;
    }
    const error = this.latencyMs - this.targetMs;
    if (error > o.deadbandMs) {
      if (this.credit < 0) this.credit = 0;
      this.credit += n * Math.min(o.maxSpeedup, (error - o.deadbandMs) / o.catchupMs);
    } else if (error < -o.deadbandMs) {
      if (this.credit > 0) this.credit = 0;
      this.credit -= n * Math.min(o.maxSlowdown, (-error - o.deadbandMs) / o.catchupMs);
    } else {
      this.credit = 0;
      return;
    }
    if (this.cooldown > 0) return;
    if (this.credit >= this.minCut && this.size >= n + this.maxCut + this.overlap) {
      const lag = this.bestLag(1);
      this.cut(lag);
      this.caughtUpSamples += lag;
      this.credit -= lag;
      this.cooldown = this.overlap;
    } else if (
      this.credit <= -this.minCut &&
      this.start >= this.historyMax &&
      this.size >= this.overlap
    ) {
      const lag = this.bestLag(-1);
      this.repeat(lag);
      this.credit += lag;
      this.cooldown = this.overlap + lag;
    }
  }

  // The piece length in [minCut, maxCut] where the audio `lag` samples ahead
  // (direction 1, for a cut) or back (-1, for a repeat) best matches what plays
  // next: normalised cross-correlation over the overlap, every 2nd sample.
  bestLag(direction) {
    const { buf, start, overlap } = this;
    let best = this.minCut;
    let bestScore = -Infinity;
    for (let lag = this.minCut; lag <= this.maxCut; lag += 2) {
      const other = start + direction * lag;
      let xy = 0;
      let yy = 1e-12;
      for (let i = 0; i < overlap; i += 2) {
        const y = buf[other + i];
        xy += buf[start + i] * y;
        yy += y * y;
      }
      const score = xy / Math.sqrt(yy);
      if (score > bestScore) {
        bestScore = score;
        best = lag;
      }
    }
    return best;
  }

  // Remove `lag` samples at the read position, cross-fading what plays now into
  // what follows the cut.
  cut(lag) {
    const { buf, start, overlap } = this;
    const w = Math.min(overlap, this.size - lag);
    for (let i = 0; i < w; i++) {
      const g = (i + 0.5) / w;
      buf[start + lag + i] = buf[start + i] * (1 - g) + buf[start + lag + i] * g;
    }
    this.start += lag;
  }

  // Play the last `lag` samples again: what plays next cross-fades into them,
  // and they lead back into the queue where it was.
  repeat(lag) {
    const { buf, start, overlap } = this;
    const w = Math.min(overlap, this.size);
    const from = start - lag;
    for (let i = 0; i < w; i++) {
      const g = (i + 0.5) / w;
      buf[from + i] = buf[start + i] * (1 - g) + buf[from + i] * g;
    }
    this.start = from;
    this.stretchedSamples += lag;
  }

  stats() {
    return {
      bufferedMs: this.bufferedMs,
      latencyMs: this.latencyMs,
      targetMs: this.targetMs,
      underruns: this.underruns,
      droppedMs: this.droppedMs,
      caughtUpMs: this.caughtUpMs,
      stretchedMs: this.stretchedSamples / this.perMs,
      jitterMs: this.jitterMs,
      playedMs: this.playedMs,
      playing: this.playing,
      finished: this.finished,
    };
  }
}
