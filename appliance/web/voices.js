// Voices: every voice with a sample to listen to (GET /v1/voices/{name}/sample: made once, kept by the
// daemon); on a Base checkpoint, cloning a voice from a recording made here (the microphone) or a file,
// with its transcript (POST /v1/voices), and renaming (PATCH) or deleting (DELETE) a cloned one.
import { api, el, mediaUrl } from "./api.js";
import { info, refresh, onChange } from "./model.js";
import { base64, toWav } from "./wav.js";

const MAX_RECORD_S = 30;
let root, list, form, take = null, recorder = null;

export function init(section) {
  root = section;
  list = section.querySelector(".voices");
  form = section.querySelector("#clone-form");
  form.querySelector(".record").addEventListener("click", record);
  form.elements.audio.addEventListener("change", () => {
    const file = form.elements.audio.files[0];
    if (file) useTake(file, `file ${file.name}`);
  });
  form.addEventListener("submit", clone);
  onChange(() => render().catch((e) => { root.querySelector(".note").textContent = e.message; }));
}

export async function show() {
  await refresh(); // voices saved by other clients meanwhile
}

export function hide() {
  if (recorder?.state === "recording") recorder.stop();
}

async function render() {
  const { data } = await api("/v1/audio/voices");
  const cloning = info.type === "base";
  form.hidden = !cloning;
  root.querySelector(".note").textContent = {
    custom_voice: `The speakers of ${info.name}. Cloning a voice needs a Base checkpoint.`,
    base: `${info.name} clones voices: the voices saved here${data.length ? "" : " (none yet: clone one below)"}.`,
    voice_design: `${info.name} makes a voice from a description (the Voice description field of the other screens); it has no named voices.`,
  }[info.type] || "";
  list.replaceChildren(...data.map((v) => item(v, cloning)));
}

function item(voice, cloned) {
  const audio = el("audio", { controls: true, preload: "none", hidden: true });
  const listen = el("button", { type: "button", onclick: () => sample(voice.name, listen, audio) }, "Play sample");
  const li = el("li", { "data-voice": voice.name }, el("strong", {}, voice.name), " ",
    el("span", { class: "badge" }, cloned ? "cloned" : "speaker"), el("div", { class: "actions" }, listen), audio,
    el("p", { class: "error", role: "alert" }));
  if (cloned) {
    li.querySelector(".actions").append(
      el("button", { type: "button", onclick: () => renaming(li, voice.name) }, "Rename"),
      el("button", { type: "button", onclick: () => deleting(li, voice.name) }, "Delete"));
  }
  return li;
}

async function sample(name, button, audio) {
  if (button.getAttribute("aria-disabled") === "true") return;
  button.setAttribute("aria-disabled", "true"); // not disabled: the keyboard's focus stays on it
  button.textContent = "Making the sample…"; // the first time only: the daemon keeps it
  try {
    audio.src = await mediaUrl(`/v1/voices/${encodeURIComponent(name)}/sample`);
    audio.hidden = false;
    await audio.play().catch(() => {}); // autoplay may be refused: the controls are there
    button.textContent = "Play sample";
  } catch (e) {
    button.textContent = "Play sample";
    button.closest("li").querySelector(".error").textContent = e.message;
  }
  button.removeAttribute("aria-disabled");
}

function renaming(li, name) {
  const input = el("input", { name: "new-name", value: name, "aria-label": `New name for ${name}`, required: true });
  const box = el("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api(`/v1/voices/${encodeURIComponent(name)}`, { method: "PATCH", json: { name: input.value.trim() } });
      await refresh();
    } catch (err) { li.querySelector(".error").textContent = err.message; }
  } }, input, el("button", { type: "submit" }, "Save"), el("button", { type: "button", onclick: () => box.remove() }, "Cancel"));
  li.querySelector(".actions").after(box);
  input.focus();
  input.select();
}

function deleting(li, name) {
  const box = el("div", { class: "inline", role: "group", "aria-label": `Delete ${name}?` }, `Delete ${name}? `,
    el("button", { type: "button", onclick: async () => {
      try {
        await api(`/v1/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
        await refresh();
      } catch (err) { li.querySelector(".error").textContent = err.message; }
    } }, "Yes, delete"), el("button", { type: "button", onclick: () => box.remove() }, "Keep it"));
  li.querySelector(".actions").after(box);
  box.querySelector("button").focus();
}

// -- cloning ----------------------------------------------------------------------------------
async function record() {
  const button = form.querySelector(".record"), state = form.querySelector(".rec-state");
  if (recorder?.state === "recording") { recorder.stop(); return; }
  form.querySelector(".error").textContent = "";
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (e) {
    form.querySelector(".error").textContent = `No microphone (${e.message}): choose a file instead.`;
    return;
  }
  const parts = [], started = Date.now();
  recorder = new MediaRecorder(stream);
  recorder.ondataavailable = (e) => parts.push(e.data);
  const tick = setInterval(() => {
    const s = (Date.now() - started) / 1000;
    state.textContent = `Recording… ${s.toFixed(0)} s`;
    if (s >= MAX_RECORD_S) recorder.stop();
  }, 250);
  recorder.onstop = () => {
    clearInterval(tick);
    stream.getTracks().forEach((t) => t.stop());
    button.textContent = "Record";
    useTake(new Blob(parts, { type: recorder.mimeType }), "recording");
  };
  recorder.start(250);
  button.textContent = "Stop";
  state.textContent = "Recording…";
}

async function useTake(blob, what) {
  const state = form.querySelector(".rec-state"), audio = form.querySelector("audio.take");
  try {
    const wav = await toWav(blob);
    take = wav.bytes;
    state.textContent = `${what}: ${wav.seconds.toFixed(1)} s ready`;
    audio.src = URL.createObjectURL(new Blob([take], { type: "audio/wav" }));
    audio.hidden = false;
  } catch (e) {
    take = null;
    state.textContent = "";
    form.querySelector(".error").textContent = `This browser cannot decode the ${what} (${e.message}): try a WAV file.`;
  }
}

function clone(e) {
  e.preventDefault();
  const error = form.querySelector(".error");
  error.textContent = "";
  form.querySelector(".conflict")?.remove();
  if (!take) { error.textContent = "Record something or choose a file first."; return; }
  send(false);
}

/** POST /v1/voices; a name already saved (409) asks whether to replace that voice or choose another name. */
async function send(overwrite) {
  const error = form.querySelector(".error"), button = form.querySelector("button[type=submit]");
  if (button.getAttribute("aria-disabled") === "true") return;
  button.setAttribute("aria-disabled", "true"); // not disabled: the keyboard's focus stays where it is
  button.textContent = "Cloning…";
  const body = { name: form.elements.name.value.trim(), ref_audio: base64(take) };
  if (form.elements.ref_text.value.trim()) body.ref_text = form.elements.ref_text.value.trim();
  if (overwrite) body.overwrite = true;
  try {
    const saved = await api("/v1/voices", { method: "POST", json: body });
    form.reset();
    take = null;
    form.querySelector(".rec-state").textContent = `${saved.replaced ? "Replaced" : "Saved"} ${body.name}.`;
    form.querySelector("audio.take").hidden = true;
    button.focus();
    await refresh();
  } catch (err) {
    if (err.status === 409 && !overwrite) conflict(body.name); else error.textContent = err.message;
  }
  button.removeAttribute("aria-disabled");
  button.textContent = "Clone";
}

function conflict(name) {
  const box = el("div", { class: "inline conflict", role: "group", "aria-label": `A voice ${name} is already saved` },
    `A voice named ${name} is already saved. `,
    el("button", { type: "button", onclick: () => { form.querySelector("button[type=submit]").focus(); box.remove(); send(true); } },
      `Replace ${name}`),
    el("button", { type: "button", onclick: () => { box.remove(); form.elements.name.focus(); form.elements.name.select(); } },
      "Choose another name"));
  form.querySelector("button[type=submit]").before(box);
  box.querySelector("button").focus();
}
