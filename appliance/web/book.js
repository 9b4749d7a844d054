// The book open in the player, in the Library: its chapters (each starts playing there), its text with the
// sentence being read highlighted (a sentence clicked plays from there), and every output file to download.
import { el, duration, key, download, filePath } from "./api.js";
import * as player from "./player.js";

let root, spans = [], current = null, book = null;

export function init(section) {
  root = section;
  player.element().addEventListener("timeupdate", follow);
  player.onBook((b) => { if (!b) hide(); });
}

/** Show the book `id` titled `title` (its manifest's chapters, its files). */
export function show(id, title, manifest, files) {
  book = id;
  root.hidden = false;
  root.dataset.job = id;
  root.querySelector("h3").textContent = title;
  const list = manifest.chapter_list || [];
  root.querySelector(".chapters ol").replaceChildren(...list.map((c) => el("li", {},
    el("button", { type: "button", class: "link", "data-start": c.start_s, onclick: () => player.seek(c.start_s) },
      `${c.title} (${duration(c.start_s)})`))));
  spans = [];
  current = null;
  root.querySelector(".text").replaceChildren(...(manifest.chapters || []).map(chapterText));
  root.querySelector(".files").replaceChildren(...files.map((f) => fileItem(id, f)));
}

/** A chapter as the book shows it: its spoken title is the heading (once), each paragraph of the book
 *  (manifest: a segment's `kind` and `paragraph`) a paragraph; a manifest without them, one paragraph. */
function chapterText(ch) {
  const said = (s) => { // one segment: a span the player highlights while it is heard
    const span = el("span", { "data-start": s.book_start_s, "data-end": s.book_end_s,
      onclick: () => player.seek(s.book_start_s) }, s.original || s.text);
    spans.push(span); // (in time order: `follow` searches them)
    return span;
  };
  const run = (segs) => segs.flatMap((s, i) => (i ? [" ", said(s)] : [said(s)]));
  const timed = ch.segments.filter((s) => s.book_start_s !== null);
  const title = timed.filter((s) => s.kind === "title");
  const paragraphs = new Map();
  timed.filter((s) => s.kind !== "title").forEach((s) => {
    const k = s.paragraph ?? -1;
    paragraphs.set(k, [...(paragraphs.get(k) || []), s]);
  });
  return el("section", {}, el("h5", {}, ...(title.length ? run(title) : [ch.title])),
    ...[...paragraphs.values()].map((segs) => el("p", {}, ...run(segs))));
}

export function hide() {
  book = null;
  root.hidden = true;
}

/** Highlight the sentence being read: the last one starting at or before the player's time. */
function follow() {
  if (book === null || player.playing() !== book) return;
  const t = player.element().currentTime;
  let lo = 0, hi = spans.length - 1, found = null;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (Number(spans[mid].dataset.start) <= t) { found = spans[mid]; lo = mid + 1; } else hi = mid - 1;
  }
  if (found === current) return;
  current?.classList.remove("current");
  current = found;
  if (!current) return;
  current.classList.add("current");
  if (!root.closest("section").hidden) current.scrollIntoView({ block: "nearest" });
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

export const size = (n) => (n < 1024 ? `${n} bytes` : n < 1048576 ? `${(n / 1024).toFixed(0)} KiB` : `${(n / 1048576).toFixed(1)} MiB`);
