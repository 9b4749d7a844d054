// What the daemon's checkpoint offers (GET /v1/voices) and what it reads and writes (GET /v1/formats),
// shared by the screens; the page adapts to it (CustomVoice speakers, Base clones, VoiceDesign descriptions).
import { api, fill } from "./api.js";

export const info = { name: "", type: null, voices: [], languages: [], formats: null, testModel: "" };
const listeners = new Set();

/** Call `fn(info)` after every refresh (a voice cloned, renamed or deleted). */
export const onChange = (fn) => listeners.add(fn);

export async function refresh() {
  const [voices, formats, models] = await Promise.all([
    api("/v1/voices"), info.formats ? null : api("/v1/formats"), info.name ? null : api("/v1/models")]);
  info.type = voices.model_type;
  info.voices = voices.voices.map((v) => v.name);
  info.languages = voices.languages.filter((l) => l !== "auto"); // offered once, as the first choice
  info.testModel = voices.test_model || "";
  if (formats) info.formats = formats;
  if (models) info.name = models.data[0]?.id || "";
  listeners.forEach((fn) => fn(info));
}

/** Offer the voices in `form`'s voice select, or the description field where the checkpoint takes one
 * (VoiceDesign); the languages in its language select. */
export function fillVoiceFields(form) {
  const design = info.type === "voice_design";
  form.querySelector("label.voice").hidden = design;
  form.querySelector("label.instruct").hidden = !design;
  fill(form.elements.voice, info.voices);
  form.elements.voice.disabled = design || info.voices.length === 0;
  fill(form.elements.language, [["auto", "auto (from the text)"], ...info.languages]);
}

/** Show, in every `.test-model` paragraph of `root`, that the checkpoint is a test model and makes no speech. */
export function showTestModel(root) {
  for (const p of root.querySelectorAll(".test-model")) {
    p.textContent = info.testModel ? `${info.name} is a test model: ${info.testModel}. Point the daemon at a real ` +
      "Qwen3-TTS checkpoint (model.path) to make audiobooks." : "";
    p.hidden = !info.testModel;
  }
}

/** Why nothing can be spoken yet, or "". */
export function missingVoice() {
  if (info.type === "base" && info.voices.length === 0) return "This checkpoint clones voices: clone one under Voices first.";
  return "";
}
