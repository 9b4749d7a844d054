// Library: every job with its cover, author, length and progress (the job's event stream while it is
// active), the time it has left (measured by the daemon from the job's own finished segments: jobs.eta),
// cancel, retry and delete; a finished book plays in the player (player.js) from where the listener stopped,
// and opens here with its chapters, text and files (book.js).
import { api, events, mediaUrl, el, duration, filePath, serverNow } from "./api.js";
import * as player from "./player.js";
import * as bookView from "./book.js";

const ACTIVE = ["queued", "running"];
const ENDED = ["done", "partial", "failed", "cancelled"];
const FOLLOW_AT_ONCE = 3; // event streams held open (a browser has few connections per server)
const REFRESH_MS = 4000;

let root, list, timer, reveal = null;
const items = new Map(); // job id -> <li>
const covers = new Map(); // job id -> the URL of its cover (a blob URL where a key is needed)
const following = new Map(); // job id -> AbortController of its event stream

export function init(section) {
  root = section;
  list = section.querySelector(".jobs");
  bookView.init(section.querySelector(".book-view"));
}

export async function show() {
  await refresh();
  timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
}

export function hide() { // the player plays on
  clearInterval(timer);
  following.forEach((c) => c.abort());
  following.clear();
}

/** Put the keyboard's focus on job `id` once the library shows it (a book just submitted). */
export function focusOn(id) { reveal = id; }

async function refresh() {
  const jobs = await api("/v1/jobs");
  root.querySelector(".empty").hidden = jobs.length > 0;
  const ids = new Set(jobs.map((j) => j.id));
  for (const id of [...items.keys()]) if (!ids.has(id)) gone(id); // deleted by another client
  jobs.sort((a, b) => a.created_at - b.created_at).forEach(render); // each new one goes on top
  for (const job of jobs) {
    if (ACTIVE.includes(job.state) && !following.has(job.id) && following.size < FOLLOW_AT_ONCE) follow(job.id);
  }
  if (reveal && items.has(reveal)) {
    items.get(reveal).querySelector(".title").focus();
    reveal = null;
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

/** The time left, from the daemon's estimate: counted down between the job's finished segments. */
function eta(job) {
  if (job.state !== "running") return job.state === "queued" ? "waiting for its turn" : "";
  if (!job.eta) return "estimating the time left";
  const left = job.eta.finish_at - serverNow(), quiet = serverNow() - job.eta.at;
  if (left > 0) return `about ${duration(left)} left`;
  return quiet > 120 ? `no segment finished for ${duration(quiet)}` : "finishing";
}

function byline(job) {
  const { seconds, measured } = job.length || {};
  const length = seconds === undefined ? "" : measured ? `${duration(seconds)} long` : `about ${duration(seconds)} long (estimated)`;
  return [job.author ? `by ${job.author}` : "", length].filter(Boolean).join(" · ");
}

function render(job) {
  let li = items.get(job.id);
  if (!li) {
    li = el("li", { "data-id": job.id },
      el("div", { class: "head" }, el("strong", { class: "title", tabindex: "-1" }), " ", el("span", { class: "badge" })),
      el("p", { class: "byline" }), el("progress", { max: 1, value: 0 }), el("p", { class: "counts" }),
      el("p", { class: "error" }), el("div", { class: "actions" }));
    items.set(job.id, li);
    list.prepend(li);
  }
  if (job.cover && !li.querySelector("img.cover")) cover(li, job.id);
  const { done, total, failed } = job.progress;
  const title = job.title || job.id;
  li.querySelector(".title").textContent = title;
  li.querySelector(".badge").textContent = job.state;
  li.querySelector(".byline").textContent = byline(job);
  const bar = li.querySelector("progress");
  bar.max = Math.max(total, 1);
  bar.value = done;
  bar.setAttribute("aria-label", `${title}: ${done} of ${total} segments`);
  const left = eta(job);
  if (job.eta) li.dataset.finishAt = job.eta.finish_at; else delete li.dataset.finishAt;
  li.querySelector(".counts").textContent =
    `${done}/${total} segments${failed ? `, ${failed} failed` : ""}${left ? ` · ${left}` : ""}`;
  if (li.dataset.state !== job.state) { // new buttons only when the state changes (keeps keyboard focus)
    const had = li.querySelector(".actions, .confirm") && li.contains(document.activeElement) &&
      document.activeElement !== li.querySelector(".title");
    li.dataset.state = job.state;
    li.querySelector(".confirm")?.remove();
    li.querySelector(".error").textContent = "";
    li.querySelector(".actions").replaceChildren(...actions(job));
    if (had) (li.querySelector(".actions button") || li.querySelector(".title")).focus(); // not onto the page's body
  }
  if (job.error) li.querySelector(".error").textContent = job.error;
}

async function cover(li, id) {
  const img = el("img", { class: "cover", alt: "", "data-job": id });
  li.prepend(img);
  li.classList.add("with-cover");
  try {
    if (!covers.has(id)) covers.set(id, await mediaUrl(`/v1/jobs/${encodeURIComponent(id)}/cover`));
    img.src = covers.get(id);
  } catch {
    img.remove();
    li.classList.remove("with-cover");
  }
}

function actions(job) {
  const act = (label, fn) => el("button", { type: "button", onclick: (e) => run(e.currentTarget, fn) }, label);
  const out = [];
  if (["done", "partial"].includes(job.state)) out.push(act("Play", () => play(job.id)));
  if (ACTIVE.includes(job.state)) out.push(act("Cancel", () => api(`/v1/jobs/${job.id}/cancel`, { method: "POST" })));
  if (["failed", "partial", "cancelled"].includes(job.state)) {
    out.push(act("Retry", () => api(`/v1/jobs/${job.id}/retry`, { method: "POST" })));
  }
  if (ENDED.includes(job.state)) {
    out.push(el("button", { type: "button", class: "delete", onclick: (e) => confirmDelete(e.currentTarget, job) }, "Delete"));
  }
  return out;
}

/** Run a button's action; the button stays focusable meanwhile (a disabled one would drop the focus). */
async function run(button, fn) {
  if (button.getAttribute("aria-disabled") === "true") return;
  const li = button.closest("li");
  button.setAttribute("aria-disabled", "true");
  li.querySelector(".error").textContent = "";
  try {
    await fn();
    await refresh();
  } catch (e) {
    li.querySelector(".error").textContent = e.message;
  } finally {
    button.removeAttribute("aria-disabled");
  }
}

function confirmDelete(button, job) {
  const li = button.closest("li"), title = job.title || job.id;
  li.querySelector(".confirm")?.remove();
  const box = el("div", { class: "inline confirm", role: "group", "aria-label": `Delete ${title}?` },
    `Delete ${title} and its files? `,
    el("button", { type: "button", onclick: (e) => run(e.currentTarget, () => remove(job)) }, "Yes, delete"),
    el("button", { type: "button", onclick: () => { box.remove(); button.focus(); } }, "Keep it"));
  li.querySelector(".actions").after(box);
  box.querySelector("button").focus();
}

/** DELETE /v1/jobs/{id}: the job, its book and its files are gone ({"id", "deleted", "freed_bytes"}). */
async function remove(job) {
  let freed = null;
  try {
    freed = (await api(`/v1/jobs/${encodeURIComponent(job.id)}`, { method: "DELETE" })).freed_bytes;
  } catch (e) {
    if (e.status !== 404) throw e; // 404: gone already
  }
  root.querySelector(".said").textContent =
    `Deleted ${job.title || job.id}${freed ? ` (${(freed / 1048576).toFixed(1)} MiB freed)` : ""}.`;
  gone(job.id, true);
}

/** Job `id` is no more: its entry goes, the player and book view let go of it; `focus`: the keyboard's focus
 * moves to the next entry (or the library's heading), not onto the page's body. */
function gone(id, focus = false) {
  const li = items.get(id);
  items.delete(id);
  if (player.playing() === id) player.close();
  if (root.querySelector(".book-view").dataset.job === id) bookView.hide();
  if (covers.get(id)?.startsWith("blob:")) URL.revokeObjectURL(covers.get(id));
  covers.delete(id);
  const next = li?.nextElementSibling || li?.previousElementSibling;
  li?.remove();
  if (focus) (next?.querySelector(".actions button") || root.querySelector("h2")).focus();
}

// -- playing a book -----------------------------------------------------------------------------
const relative = (path, folder) => (path && folder && path.startsWith(`${folder}/`) ? path.slice(folder.length + 1) : null);
let blobs = []; // object URLs of the open book (revoked when another opens)

async function url(path) {
  const u = await mediaUrl(path);
  if (u.startsWith("blob:")) blobs.push(u);
  return u;
}

async function play(id) {
  const job = await api(`/v1/jobs/${id}`);
  const [{ files }, manifest] = await Promise.all([api(`/v1/jobs/${id}/files`), api(filePath(id, "manifest.json"))]);
  const out = manifest.output || {}, title = job.title || id;
  bookView.show(id, title, manifest, files);
  if (player.playing() !== id) {
    const old = blobs;
    blobs = [];
    const book = relative(out.book, job.output_dir);
    const vtt = (out.subtitles || []).map((p) => relative(p, job.output_dir)).find((p) => p && p.endsWith(".vtt"));
    await player.open({ id, title, author: job.author, src: book ? await url(filePath(id, book)) : "",
      vtt: vtt ? await url(filePath(id, vtt)) : null, cover: covers.get(id) || null, language: manifest.language || manifest.settings?.language,
      chapters: manifest.chapter_list || [] });
    old.forEach((u) => URL.revokeObjectURL(u));
  } else await player.open({ id });
  document.getElementById("player-title").focus(); // the keyboard goes on in the player, not at the page's top
}
