// The player: below every screen, so a book keeps playing while the listener opens another one. It goes
// on from where the listener stopped (GET/PUT /v1/jobs/{id}/position: kept by the daemon, so a reload,
// another browser or another device goes on from the same place), skips back 15 s and forward 30 s,
// plays faster or slower (kept in this browser), stops on a sleep timer (minutes, or the chapter's end),
// and shows the captions of the book's WebVTT subtitles.
import { api, el, duration, serverNow } from "./api.js";

const SPEEDS = [0.75, 1, 1.25, 1.5, 1.75, 2, 2.5];
const SLEEP = [["", "Off"], ["5", "5 minutes"], ["15", "15 minutes"], ["30", "30 minutes"], ["45", "45 minutes"],
  ["60", "1 hour"], ["chapter", "End of chapter"]];
const SPEED_KEY = "tts-appliance.speed";
const SAVE_EVERY_S = 10; // while playing, the place is saved this often (and at every pause, seek and close)
const BACK_S = 15, FORWARD_S = 30;

let root, audio, book = null, lastSaved = 0, saving = Promise.resolve();
let sleepAt = null, sleepTick = null, chapterEnd = null, track = null;
const listeners = new Set();

/** The <audio> element (the book view follows it to highlight the sentence being read). */
export const element = () => audio;
/** The id of the book playing, or null. */
export const playing = () => book?.id ?? null;
/** Call `fn(book or null)` whenever another book is opened, or the player closed. */
export const onBook = (fn) => listeners.add(fn);

export function init(section) {
  root = section;
  audio = section.querySelector("audio");
  const speed = section.querySelector(".speed");
  speed.replaceChildren(...SPEEDS.map((s) => el("option", { value: s }, `${s}×`)));
  speed.value = String(Number(localStorage.getItem(SPEED_KEY)) || 1);
  speed.addEventListener("change", () => {
    audio.playbackRate = Number(speed.value);
    localStorage.setItem(SPEED_KEY, speed.value);
  });
  const sleep = section.querySelector(".sleep");
  sleep.replaceChildren(...SLEEP.map(([v, label]) => el("option", { value: v }, label)));
  sleep.addEventListener("change", () => setSleep(sleep.value));
  section.querySelector(".back").addEventListener("click", () => skip(-BACK_S));
  section.querySelector(".forward").addEventListener("click", () => skip(FORWARD_S));
  section.querySelector(".close").addEventListener("click", close);
  audio.addEventListener("timeupdate", tick);
  audio.addEventListener("pause", () => save());
  audio.addEventListener("seeked", () => { save(); if (sleep.value === "chapter") chapterEnd = endOfChapter(); });
  audio.addEventListener("ratechange", () => { speed.value = String(audio.playbackRate); });
  audio.addEventListener("loadedmetadata", () => { audio.playbackRate = Number(speed.value); });
  addEventListener("pagehide", () => save(true));

  document.addEventListener("visibilitychange", () => { if (document.hidden) save(true); });
}

/** Play `b` = {id, title, author, src, cover, chapters: [{title, start_s, end_s}], vtt, language} from the
 * place the daemon kept for it (or from `b.at`, seconds); answers once it plays (or autoplay was refused). */
export async function open(b) {
  if (book?.id === b.id && b.at === undefined) { // this book already: go on playing it
    await audio.play().catch(() => {});
    return;
  }
  if (book && book.id !== b.id) await close(false);
  book = b;
  root.hidden = false;
  document.body.classList.add("playing"); // the screens scroll above the player, never under it
  root.querySelector("h2").textContent = b.title;
  const cover = root.querySelector("img.cover");
  cover.hidden = !b.cover;
  if (b.cover) cover.src = b.cover;
  if (audio.getAttribute("src") !== b.src) {
    audio.src = b.src;
    audio.querySelectorAll("track").forEach((t) => t.remove());
    if (b.vtt) captions(b.vtt, b.language);
  }
  let at = b.at;
  const said = root.querySelector(".saved");
  if (at === undefined) {
    const kept = await api(`/v1/jobs/${encodeURIComponent(b.id)}/position`).catch(() => null);
    at = kept?.position_s || 0;
    said.textContent = at ? `Going on from ${duration(at)}, where you stopped${kept.updated_at ? ` (${ago(kept.updated_at)})` : ""}.` : "";
  } else said.textContent = "";
  await ready();
  if (at >= audio.duration - 1) at = 0; // finished last time: from the start
  audio.currentTime = at;
  lastSaved = at;
  audio.playbackRate = Number(root.querySelector(".speed").value);
  listeners.forEach((fn) => fn(book));
  await audio.play().catch(() => {}); // autoplay refused: the controls are there
  where();
}

/** Seek to `t` seconds (a chapter, a sentence of the text) and play. */
export function seek(t) {
  audio.currentTime = t;
  audio.play().catch(() => {});
}

/** Stop the player, keeping the place; `hide`: and put it away (false: the next book follows at once). */
export async function close(hide = true) {
  if (!book) return;
  audio.pause();
  await save();
  setSleep("");
  book = null;
  if (hide) {
    root.hidden = true;
    document.body.classList.remove("playing");
    audio.removeAttribute("src");
    audio.load();
    listeners.forEach((fn) => fn(null));
  }
}

const ready = () => new Promise((resolve) => {
  if (audio.readyState >= 1) resolve();
  else audio.addEventListener("loadedmetadata", resolve, { once: true });
});

function captions(src, language) {
  // the manifest's `language`: a BCP-47 tag of what is spoken (the job's, or guessed for auto); "und" otherwise
  track = el("track", { kind: "captions", label: "Captions", src, srclang: /^[a-z]{2,3}$/i.test(language || "") ? language : "und" });
  audio.append(track);
  track.track.mode = "hidden"; // loads the cues; the page shows them (an <audio> draws no captions itself)
  const line = root.querySelector(".caption");
  line.textContent = "";
  const mine = track;
  track.track.addEventListener("cuechange", () => {
    if (mine === track) line.textContent = [...(mine.track.activeCues || [])].map((c) => c.text).join(" ");
  });
}

function skip(seconds) {
  audio.currentTime = Math.max(0, Math.min(audio.duration || 0, audio.currentTime + seconds));
}

/** The chapter (index into book.chapters) playing at `t`, or -1. */
function chapterAt(t) {
  const list = book?.chapters || [];
  let found = -1;
  list.forEach((c, i) => { if (c.start_s <= t + 0.01) found = i; });
  return found;
}

function endOfChapter() {
  const c = book?.chapters?.[chapterAt(audio.currentTime)];
  return c ? c.end_s : audio.duration;
}

function tick() {
  if (!book) return;
  where();
  if (chapterEnd !== null && audio.currentTime >= chapterEnd - 0.05) {
    audio.pause();
    audio.currentTime = Math.min(chapterEnd, audio.duration);
    setSleep("");
    root.querySelector(".sleep-left").textContent = "Stopped at the end of the chapter (sleep timer).";
    return;
  }
  if (!audio.paused && Math.abs(audio.currentTime - lastSaved) >= SAVE_EVERY_S) save();
}

function where() {
  const i = chapterAt(audio.currentTime), c = book?.chapters?.[i];
  root.querySelector(".where").textContent = `${book?.author ? `${book.author} · ` : ""}${c ? `${c.title} · ` : ""}` +
    `${duration(Math.floor(audio.currentTime))} of ${duration(Math.floor(audio.duration))}`; // as the controls count
}

function setSleep(value) {
  const select = root.querySelector(".sleep"), left = root.querySelector(".sleep-left");
  select.value = value;
  clearInterval(sleepTick);
  sleepTick = null;
  sleepAt = null;
  chapterEnd = null;
  left.textContent = "";
  if (value === "chapter") {
    chapterEnd = endOfChapter();
    left.textContent = "Stops at the end of this chapter.";
  } else if (value) {
    sleepAt = Date.now() + Number(value) * 60000;
    const show = () => {
      const s = (sleepAt - Date.now()) / 1000;
      if (s <= 0) {
        audio.pause();
        setSleep("");
        left.textContent = "Stopped by the sleep timer.";
      } else left.textContent = `Stops in ${duration(s)}.`;
    };
    sleepTick = setInterval(show, 1000);
    show();
  }
}

/** Keep the place of the book playing on the daemon (`leaving`: the request outlives the page). */
function save(leaving = false) {
  if (!book || !(audio.readyState >= 1)) return saving;
  const id = book.id, position_s = audio.currentTime, chapter = chapterAt(position_s);
  lastSaved = position_s;
  saving = saving.then(() => api(`/v1/jobs/${encodeURIComponent(id)}/position`, {
    method: "PUT", json: { position_s, chapter: chapter >= 0 ? chapter : null }, keepalive: leaving,
  })).then(() => { root.dataset.saved = String(position_s); }, () => {});
  return saving;
}

function ago(t) {
  const s = serverNow() - t;
  if (s < 90) return "just now";
  if (s < 5400) return `${Math.round(s / 60)} minutes ago`;
  if (s < 129600) return `${Math.round(s / 3600)} hours ago`;
  return new Date(t * 1000).toLocaleDateString();
}
