// Audio thread side of the page: capture (mic -> PCM16 frames at the session's
// input rate) and playback (the answer at the session's output rate -> device rate
// through an adaptive jitter buffer). The page passes the figures session.updated
// stated; the fallbacks below are VoiceChat's. Both run in the
// AudioWorkletGlobalScope, where `sampleRate` is the context rate.

import { JitterBuffer } from "./jitter.js";

// A streaming windowed-sinc resampler. It keeps its input history between
// calls, so 128-sample render quanta resample without clicks at the edges, and
// low-passes below the lower Nyquist, so 48 kHz -> 16 kHz does not alias.
class StreamResampler {
  constructor(inRate, outRate, zeroCrossings = 16) {
    this.step = inRate / outRate; // input samples per output sample
    this.cutoff = Math.min(1, outRate / inRate) * 0.94; // of the input Nyquist
    this.half = Math.ceil(zeroCrossings / this.cutoff); // half filter width, input samples
    this.buf = new Float32Array(4096);
    this.len = this.half; // start with `half` zeros of history
    this.pos = this.half; // position of the next output sample in `buf`
    this.identity = inRate === outRate;
  }

  process(input) {
    if (this.identity) return input.slice();
    if (this.len + input.length > this.buf.length) {
      const grown = new Float32Array(Math.max(this.buf.length * 2, this.len + input.length));
      grown.set(this.buf.subarray(0, this.len));
      this.buf = grown;
    }
    this.buf.set(input, this.len);
    this.len += input.length;
    const available = Math.max(0, Math.ceil((this.len - this.half - this.pos) / this.step));
    const out = new Float32Array(available);
    const { buf, half, cutoff } = this;
    let n = 0;
    while (n < available && this.pos + half < this.len) {
      const p = this.pos;
      const first = Math.ceil(p - half);
      const last = Math.floor(p + half);
      let acc = 0;
      let norm = 0;
      for (let k = first; k <= last; k++) {
        const t = k - p;
        const x = t * cutoff;
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
        const w = 0.5 * (1 + Math.cos((Math.PI * t) / (half + 1))); // Hann window
        const h = sinc * w;
        acc += buf[k] * h;
        norm += h;
      }
      out[n++] = norm !== 0 ? acc / norm : 0;
      this.pos += this.step;
    }
    // Forget what no future output needs.
    const drop = Math.max(0, Math.floor(this.pos - half) - 1);
    if (drop > 0) {
      this.buf.copyWithin(0, drop, this.len);
      this.len -= drop;
      this.pos -= drop;
    }
    return n === out.length ? out : out.subarray(0, n);
  }
}

// Mic -> mono -> `targetRate` -> little-endian PCM16, posted one `frameSamples`
// frame at a time (1280 at 16 kHz: 80 ms for VoiceChat); the page sends each as one
// input_audio_buffer.append. After "mute" (the user pressed Stop and the microphone
// is off) it posts frames of silence at the same pace, on the audio clock, so the
// model's timeline runs on while it finishes its answer; "stop" ends it.
class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.frameSamples = opts.frameSamples || 1280;
    this.resampler = new StreamResampler(sampleRate, opts.targetRate || 16000);
    this.frame = new Float32Array(this.frameSamples);
    this.targetRate = opts.targetRate || 16000;
    this.filled = 0;
    this.active = true;
    this.muted = false;
    this.port.onmessage = (e) => {
      const type = e.data && e.data.type;
      if (type === "stop") this.active = false;
      else if (type === "mute" && !this.muted) this.mute();
    };
  }

  // The microphone's last frame goes out padded with silence; every frame after it
  // is pure silence (a fresh resampler: no tail of the microphone's audio).
  mute() {
    if (this.filled > 0) {
      this.frame.fill(0, this.filled);
      this.emit();
    }
    this.muted = true;
    this.resampler = new StreamResampler(sampleRate, this.targetRate);
  }

  emit() {
    const bytes = new ArrayBuffer(this.frameSamples * 2);
    const view = new DataView(bytes);
    let energy = 0;
    for (let i = 0; i < this.frameSamples; i++) {
      const x = Math.max(-1, Math.min(1, this.frame[i]));
      energy += x * x;
      view.setInt16(i * 2, Math.round(x * 32767), true);
    }
    const levelDb = 10 * Math.log10(energy / this.frameSamples + 1e-12);
    this.port.postMessage({ type: "frame", pcm: bytes, levelDb, silence: this.muted }, [bytes]);
    this.filled = 0;
  }

  process(inputs, outputs) {
    if (!this.active) return false;
    const input = inputs[0];
    let mono;
    if (this.muted) {
      mono = new Float32Array(outputs[0][0].length); // one render quantum of silence
    } else {
      // A device that delivers nothing gives no channels: no frame is posted, and
      // the page's microphone watch notices the gap.
      if (!input || input.length === 0) return true;
      const n = input[0].length;
      mono = new Float32Array(n);
      for (const channel of input) {
        for (let i = 0; i < n; i++) mono[i] += channel[i] / input.length;
      }
    }
    const out = this.resampler.process(mono);
    let i = 0;
    while (i < out.length) {
      const take = Math.min(out.length - i, this.frameSamples - this.filled);
      this.frame.set(out.subarray(i, i + take), this.filled);
      this.filled += take;
      i += take;
      if (this.filled === this.frameSamples) this.emit();
    }
    return true;
  }
}

// Answer audio at `inputRate` -> device rate -> adaptive jitter buffer (jitter.js)
// -> speakers.
// Reports the buffer's figures and the output level about 20 times a second.
class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.resampler = new StreamResampler(opts.inputRate || 22050, sampleRate);
    this.jitter = new JitterBuffer({ ...(opts.jitter || {}), rate: sampleRate });
    this.sinceReport = 0;
    this.energy = 0;
    this.peak = 0;
    this.port.onmessage = (e) => {
      const msg = e.data || {};
      if (msg.type === "audio") this.jitter.push(this.resampler.process(msg.samples));
      else if (msg.type === "finish") this.jitter.finish();
      else if (msg.type === "reset") this.jitter.reset();
    };
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    this.jitter.pull(out);
    for (let i = 0; i < out.length; i++) {
      const x = out[i];
      this.energy += x * x;
      if (Math.abs(x) > this.peak) this.peak = Math.abs(x);
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 20) {
      const s = this.jitter.stats();
      this.port.postMessage({
        type: "stats",
        ...s,
        levelDb: 10 * Math.log10(this.energy / this.sinceReport + 1e-12),
        peak: this.peak,
      });
      this.sinceReport = 0;
      this.energy = 0;
      this.peak = 0;
    }
    return true;
  }
}

registerProcessor("capture-processor", CaptureProcessor);
registerProcessor("playback-processor", PlaybackProcessor);
