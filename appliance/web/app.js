// The page: one screen at a time, chosen by the address's #fragment; sign-in where the daemon asks for
// its API key (a 401 from any route), kept in this tab's sessionStorage; the player (player.js) stays
// below every screen. While the daemon does not answer at all, a banner says so and the page asks again
// every few seconds; once it answers, the screen is read again.
import { key, setKey, onUnauthorized, onReachable, api, ApiError, UNREACHABLE } from "./api.js";
import { info, refresh, showTestModel, onChange } from "./model.js";
import * as player from "./player.js";
import * as library from "./library.js";
import * as newbook from "./newbook.js";
import * as voices from "./voices.js";
import * as tryit from "./tryit.js";
import * as status from "./status.js";

const screens = { library, new: newbook, voices, try: tryit, status };
const PROBE_MS = 3000;
let current = null, started = false, probe = null;

const $ = (id) => document.getElementById(id);

function notice(message) {
  $("notice").textContent = message;
  $("notice").hidden = !message;
}

async function go() {
  const name = location.hash.slice(1) in screens ? location.hash.slice(1) : "library";
  if (current) screens[current].hide();
  current = name;
  for (const s of document.querySelectorAll("section.screen")) s.hidden = s.id !== name;
  for (const a of document.querySelectorAll("header nav a")) {
    if (a.hash === `#${name}`) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.title = `${$(name).querySelector("h2").textContent} · tts-appliance`;
  try {
    await screens[name].show();
    notice("");
  } catch (e) {
    if (!(e instanceof ApiError && (e.status === 401 || e.status === 0))) notice(e.message);
  }
}

function signIn() {
  if (key()) $("signin-error").textContent = "That key was refused: give the daemon's http.api_key.";
  setKey(null);
  if (current) screens[current].hide();
  current = null;
  document.querySelectorAll("section.screen").forEach((s) => { s.hidden = true; });
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("signin-form").elements.key.focus();
}

/** The daemon answered (`up`) or did not: the banner, and asking again until it answers. */
function reachable(up) {
  const was = $("offline").hidden;
  $("offline").hidden = up;
  if (!up && was) $("offline").textContent = UNREACHABLE;
  if (!up && !probe) {
    probe = setInterval(() => api("/v1/formats").catch(() => {}), PROBE_MS);
  } else if (up && probe) {
    clearInterval(probe);
    probe = null;
    if (started) go(); else start();
  }
}

async function start() {
  try {
    await refresh();
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 0)) return; // sign-in form, or the banner
    notice(`The daemon does not answer: ${e.message}`);
    return;
  }
  $("signin").hidden = true;
  $("signout").hidden = !key();
  $("model").textContent = `${info.name} · ${info.type.replace("_", " ")}${info.testModel ? " · test model" : ""}`;
  if (!started) {
    started = true;
    player.init($("player"));
    Object.entries(screens).forEach(([name, screen]) => screen.init($(name)));
    onChange(() => showTestModel(document));
    addEventListener("hashchange", go);
  }
  await refresh(); // the screens fill their fields from it
  await go();
}

onUnauthorized(signIn);
onReachable(reachable);
$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  $("signin-error").textContent = "";
  setKey(e.target.elements.key.value.trim());
  e.target.reset();
  start();
});
$("signout").addEventListener("click", () => { setKey(null); location.reload(); });
start();
