// The daemon's HTTP API as the page uses it: the same routes as every other client (docs/APPLIANCE.md).
// Over TCP with http.api_key set, every call carries "Authorization: Bearer KEY"; the key lives in this
// tab's sessionStorage from sign-in until the tab closes or the user signs out.

const KEY = "tts-appliance.api_key";

export class ApiError extends Error {
  constructor(status, message, type) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

export const key = () => sessionStorage.getItem(KEY);
export const setKey = (value) => (value ? sessionStorage.setItem(KEY, value) : sessionStorage.removeItem(KEY));

let unauthorized = () => {};
/** Call `fn(message)` whenever the daemon answers 401 (no key, or a wrong one). */
export const onUnauthorized = (fn) => { unauthorized = fn; };

export const UNREACHABLE = "The daemon does not answer: it may be stopped or restarting (start it with " +
  "`systemctl start tts-appliance`, or `tts-appliance daemon`). The page tries again every few seconds.";
let reachable = () => {};
/** Call `fn(true | false)` after every call: whether the daemon answered at all (any status) or not. */
export const onReachable = (fn) => { reachable = fn; };

let offset = 0; // the daemon's clock minus this browser's, in seconds (from its answers' Date header)
/** The daemon's time now, in seconds since the epoch (times in its answers, such as a job's ETA, use it). */
export const serverNow = () => Date.now() / 1000 + offset;

function headers(extra = {}) {
  const h = { ...extra };
  if (key()) h.Authorization = `Bearer ${key()}`;
  return h;
}

/** Call a route. `json`: a body sent as JSON; `body`: FormData or bytes as they are; `keepalive`: the
 * request outlives the page (a place saved as the tab closes). Answers the parsed JSON, or the Response
 * itself with `raw`. A failure throws ApiError with the daemon's message (status 0: no answer at all), but
 * for the statuses in `allow` (GET /health answers 503 with its report while a part is down). */
export async function api(path, { method = "GET", json, body, raw = false, signal, allow = [], keepalive = false } = {}) {
  const extra = {};
  if (json !== undefined) {
    extra["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  let r;
  try {
    r = await fetch(path, { method, headers: headers(extra), body, signal, keepalive });
  } catch (e) { // no answer at all: the browser's own words ("Failed to fetch") would say nothing
    if (e.name === "AbortError") throw e;
    reachable(false);
    throw new ApiError(0, UNREACHABLE, "unreachable");
  }
  reachable(true);
  const date = Date.parse(r.headers.get("Date") || "");
  if (!Number.isNaN(date)) offset = date / 1000 - Date.now() / 1000;
  if (!r.ok && !allow.includes(r.status)) {
    let message = `${r.status} ${r.statusText}`, type;
    try {
      const answer = await r.json(); // {"error": {message, type}}; a submit that failed: its job, with submit_error
      if (answer.error && typeof answer.error === "object") ({ message, type } = answer.error);
      else message = answer.submit_error || answer.error || message;
    } catch { /* not JSON: keep the status line */ }
    if (r.status === 401) unauthorized(message);
    throw new ApiError(r.status, message, type);
  }
  if (raw) return r;
  return (r.headers.get("Content-Type") || "").startsWith("application/json") ? r.json() : r.text();
}

/** Server-Sent Events of a route (EventSource cannot send the key): yields {type, data} until the end. */
export async function* events(path, signal) {
  const r = await api(path, { raw: true, signal });
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { type, data: JSON.parse(data.join("\n")) };
    }
  }
}

/** A URL an <audio>, <track> or download link can use for a route: the route itself where no key is
 * needed (the browser streams it and seeks with Range requests), else the fetched bytes as a blob URL. */
export async function mediaUrl(path) {
  if (!key()) return path;
  const r = await api(path, { raw: true });
  return URL.createObjectURL(await r.blob());
}

/** Save a route's file under `name`: a plain download link, or the fetched blob where a key is needed. */
export async function download(path, name) {
  const a = el("a", { href: await mediaUrl(path), download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

/** A new element: el("button", {type: "button", onclick: f}, "text", child...). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

/** Seconds as m:ss or h:mm:ss; "?" when unknown. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "?";
  const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  const mm = h ? String(m).padStart(2, "0") : String(m);
  return `${h ? `${h}:` : ""}${mm}:${String(s % 60).padStart(2, "0")}`;
}

/** Fill a <select> with options ([value, label] pairs or values), keeping the current choice if it is there. */
export function fill(select, options, selected) {
  const keep = selected ?? select.value;
  select.replaceChildren(...options.map((o) => {
    const [value, label] = Array.isArray(o) ? o : [o, o];
    return el("option", { value }, label);
  }));
  if ([...select.options].some((o) => o.value === keep)) select.value = keep;
}

/** A path segment list as a URL path (chapter files have spaces in their names). */
export const filePath = (job, name) =>
  `/v1/jobs/${encodeURIComponent(job)}/files/${name.split("/").map(encodeURIComponent).join("/")}`;
