// Audio the browser recorded or was given (WebM/Ogg Opus, MP3, M4A ...) as a 16-bit mono WAV: the daemon
// reads WAV whatever was installed beside it (no ffmpeg needed for a browser's recording).

const RATE = 24000; // the model's rate: the daemon resamples to it anyway, and the upload stays small

/** Decode `blob` with the browser's own decoders and encode it as WAV bytes (Uint8Array). */
export async function toWav(blob) {
  const decoded = await new OfflineAudioContext(1, 1, RATE).decodeAudioData(await blob.arrayBuffer());
  const n = decoded.length, channels = decoded.numberOfChannels, mono = new Float32Array(n);
  for (let c = 0; c < channels; c++) {
    const data = decoded.getChannelData(c);
    for (let i = 0; i < n; i++) mono[i] += data[i] / channels;
  }
  const view = new DataView(new ArrayBuffer(44 + 2 * n));
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + 2 * n, true);
  text(8, "WAVEfmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, RATE, true);
  view.setUint32(28, RATE * 2, true); // bytes a second
  view.setUint16(32, 2, true); // bytes a frame
  view.setUint16(34, 16, true); // bits a sample
  text(36, "data");
  view.setUint32(40, 2 * n, true);
  for (let i = 0; i < n; i++) view.setInt16(44 + 2 * i, Math.max(-1, Math.min(1, mono[i])) * 0x7fff, true);
  return { bytes: new Uint8Array(view.buffer), seconds: n / RATE };
}

/** Bytes as base64 (what POST /v1/voices takes as ref_audio). */
export function base64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}
