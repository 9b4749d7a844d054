// New book: a dropped or chosen document (any format the daemon reads) or pasted text; its preview
// (POST /v1/jobs/preview: chapters to keep or leave out, segments, estimated length and synthesis time);
// voice, language, format and speed; submitted as POST /v1/jobs.
import { api, el, duration, fill } from "./api.js";
import { info, fillVoiceFields, missingVoice, onChange } from "./model.js";
import { focusOn } from "./library.js";

let form, box, plan = null, timer, asked = 0;

export function init(section) {
  form = section.querySelector("form");
  box = form.querySelector(".preview");
  const drop = form.querySelector(".drop");
  const over = (on) => (e) => { e.preventDefault(); drop.classList.toggle("over", on); };
  drop.addEventListener("dragenter", over(true));
  drop.addEventListener("dragover", over(true));
  drop.addEventListener("dragleave", over(false));
  drop.addEventListener("drop", (e) => {
    over(false)(e);
    if (!e.dataTransfer.files.length) return;
    form.elements.file.files = e.dataTransfer.files;
    chosen();
  });
  form.elements.file.addEventListener("change", chosen);
  form.elements.text.addEventListener("input", () => { form.elements.file.value = ""; later(700); });
  for (const name of ["speed", "language", "voice", "instruct"]) form.elements[name].addEventListener("change", () => later(0));
  form.addEventListener("submit", submit);
  onChange(fields);
  fields();
}

export function show() {}
export function hide() {}

function fields() {
  if (!info.formats) return;
  fillVoiceFields(form);
  fill(form.elements.format, [["", "the server's default"], ...info.formats.books]);
  form.elements.file.accept = info.formats.documents.join(",");
  form.querySelector(".accepts").textContent = `Reads ${info.formats.documents.join(" ")}; other names are read as text.`;
  ready();
}

function chosen() {
  form.elements.text.value = "";
  later(0);
}

function later(ms) {
  clearTimeout(timer);
  timer = setTimeout(previewNow, ms);
}

/** The document to send: the chosen file, or the pasted text as a Markdown file (# lines are chapters). */
function documentFile() {
  const file = form.elements.file.files[0];
  if (file) return file;
  const text = form.elements.text.value;
  return text.trim() ? new File([text], "pasted-text.md", { type: "text/markdown" }) : null;
}

function spec(withChapters) {
  const f = form.elements, out = { language: f.language.value, speed: Number(f.speed.value) || 1 };
  if (info.type === "voice_design") { if (f.instruct.value.trim()) out.instruct = f.instruct.value.trim(); } else if (f.voice.value) out.voice = f.voice.value;
  if (f.format.value) out.format = f.format.value;
  const pasted = !f.file.files[0] && f.text.value.trim().split("\n")[0].replace(/^#+\s*/, "").slice(0, 80);
  if (f.title.value.trim() || pasted) out.title = f.title.value.trim() || pasted;
  if (withChapters) {
    const numbers = checked();
    if (plan && numbers.length < plan.chapters.length) out.chapters = ranges(numbers);
  }
  return out;
}

const checked = () => [...box.querySelectorAll("input[type=checkbox]:checked")].map((c) => Number(c.value));

/** [1, 2, 3, 5] -> "1-3,5" (a job's `chapters`). */
function ranges(numbers) {
  const out = [];
  for (const n of numbers) {
    const last = out[out.length - 1];
    if (last && last[1] === n - 1) last[1] = n; else out.push([n, n]);
  }
  return out.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(",");
}

function body(withChapters) {
  const data = new FormData();
  data.append("file", documentFile());
  data.append("spec", JSON.stringify(spec(withChapters)));
  return data;
}

async function previewNow() {
  const error = form.querySelector(".error");
  error.textContent = "";
  if (!documentFile()) { plan = null; box.replaceChildren(); ready(); return; }
  const mine = ++asked; // a slower earlier answer must not replace a newer one
  const before = plan && { file: plan.file, keep: new Set(checked()) }; // the chapters chosen so far stay chosen
  if (plan) box.setAttribute("aria-busy", "true"); else box.replaceChildren(el("p", { class: "busy" }, "Reading the document…"));
  try {
    const got = await api("/v1/jobs/preview", { method: "POST", body: body(false) });
    if (mine !== asked) return;
    if (!got.chapters.length) throw new Error("Nothing in this text can be read aloud: give some words.");
    plan = got;
    showPlan(before && before.file === got.file ? before.keep : null);
  } catch (e) {
    if (mine !== asked) return;
    plan = null;
    box.replaceChildren();
    error.textContent = e.message;
  } finally {
    if (mine === asked) box.removeAttribute("aria-busy");
  }
  ready();
}

function showPlan(keep) {
  const rows = plan.chapters.map((c) => el("tr", {},
    el("td", {}, el("input", { type: "checkbox", value: c.number, checked: keep ? keep.has(c.number) : c.selected,
      "aria-label": `Read chapter ${c.number}: ${c.title}`, onchange: totals })),
    el("td", {}, String(c.number)), el("th", { scope: "row" }, c.title), el("td", {}, String(c.segments)),
    el("td", {}, String(c.characters)), el("td", {}, duration(c.audio_s))));
  const unknown = Object.entries(plan.unknown_voices || {}).map(([v, chs]) =>
    el("p", { class: "error" }, `Unknown voice ${v} in chapter ${chs.join(", ")}: the daemon refuses it.`));
  box.replaceChildren(
    el("h3", {}, `${plan.title}`, el("small", {}, ` (${plan.file}, language ${plan.language})`)),
    el("div", { class: "scroll" }, el("table", {},
      el("thead", {}, el("tr", {}, ...["Read", "#", "Chapter", "Segments", "Characters", "Length"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...rows))),
    el("p", { class: "totals", "aria-live": "polite" }), ...unknown);
  totals();
}

function totals() {
  const keep = new Set(checked());
  const chosen = plan.chapters.filter((c) => keep.has(c.number));
  const sum = (k) => chosen.reduce((a, c) => a + c[k], 0);
  const audio = sum("audio_s"), t = plan.total;
  const synthesis = t.rate ? `synthesis about ${duration(audio / t.rate)} on this machine (${t.rate_source === "configured" ? "jobs.synth_rate" : "measured from its past jobs"})`
    : "synthesis time unknown until this machine has made some audio (or set jobs.synth_rate)";
  box.querySelector(".totals").textContent = `${chosen.length} of ${plan.chapters.length} chapters, ${sum("segments")} segments, ${sum("characters")} characters: about ${duration(audio)} of audio; ${synthesis}.`;
  ready();
}

function ready() {
  const why = missingVoice();
  if (why) form.querySelector(".error").textContent = why;
  form.querySelector("button[type=submit]").disabled = !plan || checked().length === 0 || Boolean(why);
}

async function submit(e) {
  e.preventDefault();
  const button = form.querySelector("button[type=submit]"), error = form.querySelector(".error");
  if (button.getAttribute("aria-disabled") === "true") return;
  button.setAttribute("aria-disabled", "true"); // not disabled: the keyboard's focus stays on it meanwhile
  error.textContent = "";
  try {
    if (!plan || !checked().length) throw new Error("Choose a document (or paste text) and at least one chapter.");
    const job = await api("/v1/jobs", { method: "POST", body: body(true) });
    if (job.submit_error) throw new Error(job.submit_error);
    form.reset();
    form.elements.speed.value = 1;
    plan = null;
    box.replaceChildren();
    focusOn(job.id); // the keyboard goes on at the new book in the library
    location.hash = "#library";
  } catch (err) {
    error.textContent = err.message;
  }
  button.removeAttribute("aria-disabled");
  ready();
}
