// Try it: text spoken as it is made. POST /v1/audio/speech with "stream": true and response_format pcm
// (16-bit mono at X-Sample-Rate); each piece is played through Web Audio as it arrives. The time to first
// audio is measured here, from the click to the first bytes of sound.
import { api } from "./api.js";
import { fillVoiceFields, missingVoice, onChange, info } from "./model.js";

let form, root, audio = null, playing = [], stop = null;

export function init(section) {
  root = section;
  form = section.querySelector("form");
  form.addEventListener("submit", speak);
  form.querySelector(".stop").addEventListener("click", halt);
  onChange(() => {
    fillVoiceFields(form);
    root.querySelector(".error").textContent = missingVoice();
  });
}

export function show() {}
export function hide() { halt(); }

function halt() {
  stop?.abort();
  stop = null;
  playing.forEach((s) => { try { s.stop(); } catch { /* not started */ } });
  playing = [];
  form.querySelector(".stop").disabled = true;
}

async function speak(e) {
  e.preventDefault();
  halt();
  const f = form.elements, error = root.querySelector(".error");
  const ttfa = root.querySelector(".ttfa"), received = root.querySelector(".seconds");
  const body = { input: f.input.value, response_format: "pcm", stream: true, language: f.language.value };
  if (info.type === "voice_design") body.instructions = f.instructions.value.trim() || undefined;
  else body.voice = f.voice.value;
  error.textContent = "";
  ttfa.textContent = "waiting…";
  delete ttfa.dataset.ms;
  received.textContent = "0.0 s";
  audio = audio || new AudioContext(); // made on a click, so the browser lets it play
  await audio.resume();
  const mine = new AbortController();
  stop = mine;
  form.querySelector(".stop").disabled = false;
  const started = performance.now();
  try {
    const r = await api("/v1/audio/speech", { method: "POST", json: body, raw: true, signal: mine.signal });
    const rate = Number(r.headers.get("X-Sample-Rate")) || 24000;
    const reader = r.body.getReader();
    let at = 0, samples = 0, odd = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let bytes = value;
      if (odd) { bytes = new Uint8Array([...odd, ...value]); odd = null; }
      if (bytes.length % 2) { odd = bytes.slice(-1); bytes = bytes.slice(0, -1); }
      if (!bytes.length) continue;
      if (!samples) {
        const ms = Math.round(performance.now() - started);
        ttfa.textContent = `${ms} ms`;
        ttfa.dataset.ms = ms;
      }
      at = Math.max(at, audio.currentTime + 0.05); // a gap (the network, the engine) starts a little later
      at += play(bytes, rate, at);
      samples += bytes.length / 2;
      received.textContent = `${(samples / rate).toFixed(1)} s`;
    }
  } catch (err) {
    if (err.name !== "AbortError") error.textContent = err.message;
  }
  if (stop === mine) form.querySelector(".stop").disabled = true;
}

/** Schedule s16le `bytes` at `when`; answers their length in seconds. */
function play(bytes, rate, when) {
  const pcm = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
  const buffer = audio.createBuffer(1, pcm.length, rate);
  const out = buffer.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) out[i] = pcm[i] / 32768;
  const source = audio.createBufferSource();
  source.buffer = buffer;
  source.connect(audio.destination);
  source.start(when);
  source.onended = () => { playing = playing.filter((s) => s !== source); };
  playing.push(source);
  return buffer.duration;
}
