// Status: the daemon's health (GET /health): its engines and their devices, slots and streams, the job
// queue, and each part (engine loops, queue workers, the inbox watcher) with what is wrong with it; a daemon
// that stops answering is shown as not answering (since when), not as the last "ok" it gave.
import { api, el } from "./api.js";

const EVERY_MS = 2000;
let root, timer, answered = null, silent = null;

export function init(section) { root = section.querySelector(".health"); }

export async function show() {
  await check();
  timer = setInterval(() => check().catch(() => {}), EVERY_MS);
}

async function check() {
  try {
    await update();
    answered = new Date();
    silent = null;
  } catch (e) {
    if (e.status !== 0) throw e; // an answer that is an error: the page's notice says it
    silent = silent || new Date();
    root.replaceChildren(el("dl", { class: "figures" },
      el("dt", {}, "Daemon"), el("dd", { class: "state down" }, el("span", { class: "bad" }, "not answering"),
        ` since ${silent.toLocaleTimeString()}${answered ? ` (last answer ${answered.toLocaleTimeString()})` : ""}`),
      el("dt", {}, "Why"), el("dd", {}, e.message)));
  }
}

export function hide() { clearInterval(timer); }

const yes = (ok) => el("span", { class: ok ? "ok" : "bad" }, ok ? "ok" : "down");

function table(caption, head, rows) {
  return el("div", { class: "scroll" }, el("table", {}, el("caption", {}, caption),
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c, i) => el(i ? "td" : "th", i ? {} : { scope: "row" }, c)))))));
}

async function update() {
  const [h, jobs] = await Promise.all([api("/health", { allow: [503] }), api("/v1/jobs")]);
  const e = h.engine || {};
  const states = {};
  let waiting = 0;
  for (const j of jobs) {
    states[j.state] = (states[j.state] || 0) + 1;
    waiting += j.progress.queued + j.progress.leased;
  }
  const engines = (e.engines || [e]).map((x) => [x.device ?? "-", x.dtype ?? "-", `${x.active_slots ?? 0} / ${x.max_slots ?? "?"}`,
    String(x.queued ?? 0), String(x.streams ?? 0), String(x.restarts ?? 0), yes(x.alive !== false)]);
  const parts = Object.entries(h.parts || {}).map(([name, p]) => [name, yes(p.ok), p.status || "", String(p.restarts ?? 0),
    p.error || (p.books && Object.keys(p.books).length ? `writing ${Object.keys(p.books).join(", ")}` : "")]);
  const limits = h.limits || {};
  root.replaceChildren(
    el("dl", { class: "figures" },
      el("dt", {}, "Daemon"), el("dd", { class: `state ${h.status}` }, h.status),
      el("dt", {}, "Model"), el("dd", { class: "path" }, `${h.model} (${h.model_type}, ${h.sample_rate} Hz)`,
        h.test_model ? el("strong", { class: "bad" }, " test model") : null),
      el("dt", {}, "Streams now"), el("dd", {}, String(e.streams ?? 0)),
      el("dt", {}, "Job queue"), el("dd", {}, h.queue.ok ? `reachable; ${Object.entries(states).map(([s, n]) => `${n} ${s}`).join(", ") || "no jobs"}; ${waiting} segments to make` : `unreachable: ${h.queue.error}`),
      el("dt", {}, "Limits"), el("dd", {}, `body ${mib(limits.max_body_bytes)}, document ${mib(limits.max_file_bytes)}, ${limits.max_text_chars} characters a stream`)),
    table("Engines", ["Device", "Type", "Slots busy", "Waiting", "Streams", "Restarts", "Health"], engines),
    table("Parts", ["Part", "Health", "State", "Restarts", "Notes"], parts));
}

const mib = (n) => (n ? `${(n / 1048576).toFixed(0)} MiB` : "?");
