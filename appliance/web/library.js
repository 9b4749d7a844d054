// Library: every job with its progress (the job's event stream while it is active), an ETA, cancel and
// retry; a finished book plays here with its chapters, captions from its WebVTT subtitles and the
// sentence being read highlighted in the text; every output file can be downloaded.
import { api, events, key, mediaUrl, download, el, duration, filePath } from "./api.js";

const ACTIVE = ["queued", "running"];
const FOLLOW_AT_ONCE = 3; // event streams held open (a browser has few connections per server)
const REFRESH_MS = 4000;

let root, list, player, timer;
const items = new Map(); // job id -> <li>
const following = new Map(); // job id -> AbortController of its event stream
const pace = new Map(); // job id -> {t, done}: when this page first saw it running, for the ETA
let blobs = []; // object URLs of the open book (revoked when another opens)

export function init(section) {
  root = section;
  list = section.querySelector(".jobs");
  player = section.querySelector(".player");
}

export async function show() {
  await refresh();
  timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
}

export function hide() {
  player.querySelector("audio").pause(); // its controls go out of sight with the screen
  clearInterval(timer);
  following.forEach((c) => c.abort());
  following.clear();
}

async function refresh() {
  const jobs = await api("/v1/jobs");
  root.querySelector(".empty").hidden = jobs.length > 0;
  jobs.sort((a, b) => a.created_at - b.created_at).forEach(render); // each new one goes on top
  for (const job of jobs) {
    if (ACTIVE.includes(job.state) && !following.has(job.id) && following.size < FOLLOW_AT_ONCE) follow(job.id);
  }
}

async function follow(id) {
  const stop = new AbortController();
  following.set(id, stop);
  try {
    for await (const { type, data } of events(`/v1/jobs/${id}/events`, stop.signal)) {
      if (type === "progress") render(data);
      if (type === "end") render(await api(`/v1/jobs/${id}`));
    }
  } catch { /* stopped, or the daemon went away: the list refresh carries on */ } finally {
    following.delete(id);
  }
}

function eta(job) {
  const { done, total } = job.progress;
  if (job.state !== "running") return job.state === "queued" ? "waiting for its turn" : "";
  const now = Date.now() / 1000, first = pace.get(job.id);
  if (!first) pace.set(job.id, { t: now, done });
  if (!first || done <= first.done) return "estimating the time left";
  return `about ${duration(((total - done) * (now - first.t)) / (done - first.done))} left`;
}

function render(job) {
  let li = items.get(job.id);
  if (!li) {
    li = el("li", { "data-id": job.id },
      el("div", { class: "head" }, el("strong", { class: "title" }), " ", el("span", { class: "badge" })),
      el("progress", { max: 1, value: 0 }), el("p", { class: "counts" }), el("p", { class: "error" }),
      el("div", { class: "actions" }));
    items.set(job.id, li);
    list.prepend(li);
  }
  const { done, total, failed } = job.progress;
  li.querySelector(".title").textContent = job.title || job.id;
  li.querySelector(".badge").textContent = job.state;
  const bar = li.querySelector("progress");
  bar.max = Math.max(total, 1);
  bar.value = done;
  bar.setAttribute("aria-label", `${job.title || job.id}: ${done} of ${total} segments`);
  const left = eta(job);
  li.querySelector(".counts").textContent =
    `${done}/${total} segments${failed ? `, ${failed} failed` : ""}${left ? ` · ${left}` : ""}`;
  li.querySelector(".error").textContent = job.error || "";
  if (li.dataset.state !== job.state) { // new buttons only when the state changes (keeps keyboard focus)
    li.dataset.state = job.state;
    li.querySelector(".actions").replaceChildren(...actions(job));
  }
}

function actions(job) {
  const act = (label, fn) => el("button", { type: "button", onclick: (e) => run(e.target, fn) }, label);
  const out = [];
  if (["done", "partial"].includes(job.state)) out.push(act("Play", () => open(job.id)));
  if (ACTIVE.includes(job.state)) out.push(act("Cancel", () => api(`/v1/jobs/${job.id}/cancel`, { method: "POST" })));
  if (["failed", "partial", "cancelled"].includes(job.state)) {
    out.push(act("Retry", async () => { pace.delete(job.id); await api(`/v1/jobs/${job.id}/retry`, { method: "POST" }); }));
  }
  return out;
}

async function run(button, fn) {
  const li = button.closest("li");
  button.disabled = true;
  try {
    await fn();
    await refresh();
  } catch (e) {
    li.querySelector(".error").textContent = e.message;
  } finally {
    button.disabled = false;
  }
}

// -- the player ---------------------------------------------------------------------------------
const relative = (path, folder) => (path && folder && path.startsWith(`${folder}/`) ? path.slice(folder.length + 1) : null);

async function url(path) {
  const u = await mediaUrl(path);
  if (u.startsWith("blob:")) blobs.push(u);
  return u;
}

async function open(id) {
  const job = await api(`/v1/jobs/${id}`);
  const [{ files }, manifest] = await Promise.all([api(`/v1/jobs/${id}/files`), api(filePath(id, "manifest.json"))]);
  blobs.forEach((u) => URL.revokeObjectURL(u));
  blobs = [];
  player.hidden = false;
  player.dataset.job = id;
  player.querySelector("h3").textContent = job.title || id;
  const audio = player.querySelector("audio");
  audio.querySelectorAll("track").forEach((t) => t.remove());
  const out = manifest.output || {};
  const book = relative(out.book, job.output_dir);
  if (book) audio.src = await url(filePath(id, book));
  const vtt = (out.subtitles || []).map((p) => relative(p, job.output_dir)).find((p) => p && p.endsWith(".vtt"));
  if (vtt) await captions(audio, await url(filePath(id, vtt)), manifest.settings?.language);
  showChapters(audio, manifest.chapter_list || []);
  showText(audio, manifest.chapters || []);
  player.querySelector(".files").replaceChildren(...files.map((f) => fileItem(id, f)));
  player.scrollIntoView({ block: "start" });
}

async function captions(audio, src, language) {
  const track = el("track", { kind: "captions", label: "Captions", src, srclang: language && language !== "auto" ? language.slice(0, 2) : "en" });
  audio.append(track);
  track.track.mode = "hidden"; // loads the cues; the page shows them (an <audio> draws no captions itself)
  const line = player.querySelector(".caption");
  line.textContent = "";
  track.track.addEventListener("cuechange", () => {
    line.textContent = [...(track.track.activeCues || [])].map((c) => c.text).join(" ");
  });
}

function showChapters(audio, chapters) {
  const ol = player.querySelector(".chapters ol");
  ol.replaceChildren(...chapters.map((c) => el("li", {},
    el("button", { type: "button", class: "link", "data-start": c.start_s,
      onclick: () => { audio.currentTime = c.start_s; audio.play(); } }, `${c.title} (${duration(c.start_s)})`))));
}

function showText(audio, chapters) {
  const spans = [];
  const box = player.querySelector(".text");
  box.replaceChildren(...chapters.map((ch) => el("section", {}, el("h5", {}, ch.title),
    el("p", {}, ...ch.segments.filter((s) => s.book_start_s !== null).flatMap((s) => {
      const span = el("span", { "data-start": s.book_start_s, "data-end": s.book_end_s,
        onclick: () => { audio.currentTime = s.book_start_s; } }, s.original || s.text);
      spans.push(span);
      return [span, " "];
    })))));
  let current = null;
  audio.ontimeupdate = () => {
    const t = audio.currentTime;
    let lo = 0, hi = spans.length - 1, found = null; // the last span starting at or before t
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (Number(spans[mid].dataset.start) <= t) { found = spans[mid]; lo = mid + 1; } else hi = mid - 1;
    }
    if (found === current) return;
    current?.classList.remove("current");
    current = found;
    if (current) {
      current.classList.add("current");
      current.scrollIntoView({ block: "nearest" });
    }
  };
}

function fileItem(id, f) {
  const path = filePath(id, f.name);
  const link = el("a", { href: `${path}?download=1`, download: f.name.split("/").pop() }, f.name);
  link.addEventListener("click", (e) => { // with a key the link cannot carry it: fetch, then save
    if (key()) {
      e.preventDefault();
      download(path, f.name.split("/").pop()).catch((err) => { link.after(` (${err.message})`); });
    }
  });
  return el("li", {}, link, ` ${f.type}, ${size(f.bytes)}`);
}

const size = (n) => (n < 1024 ? `${n} bytes` : n < 1048576 ? `${(n / 1024).toFixed(0)} KiB` : `${(n / 1048576).toFixed(1)} MiB`);
