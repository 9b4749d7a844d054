// The page: one screen at a time, chosen by the address's #fragment; sign-in where the daemon asks for
// its API key (a 401 from any route), kept in this tab's sessionStorage.
import { key, setKey, onUnauthorized, ApiError } from "./api.js";
import { info, refresh } from "./model.js";
import * as library from "./library.js";
import * as newbook from "./newbook.js";
import * as voices from "./voices.js";
import * as tryit from "./tryit.js";
import * as status from "./status.js";

const screens = { library, new: newbook, voices, try: tryit, status };
let current = null, started = false;

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
    if (!(e instanceof ApiError && e.status === 401)) notice(e.message);
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

async function start() {
  try {
    await refresh();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return; // the sign-in form is up
    notice(`The daemon does not answer: ${e.message}`);
    return;
  }
  $("signin").hidden = true;
  $("signout").hidden = !key();
  $("model").textContent = `${info.name} · ${info.type.replace("_", " ")}`;
  if (!started) {
    started = true;
    Object.entries(screens).forEach(([name, screen]) => screen.init($(name)));
    addEventListener("hashchange", go);
  }
  await refresh(); // the screens fill their fields from it
  await go();
}

onUnauthorized(signIn);
$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  $("signin-error").textContent = "";
  setKey(e.target.elements.key.value.trim());
  e.target.reset();
  start();
});
$("signout").addEventListener("click", () => { setKey(null); location.reload(); });
start();
