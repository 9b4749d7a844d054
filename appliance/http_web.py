"""The page the daemon serves to browsers: `GET /` and `GET /web/{file}`, the static files of appliance/web
(HTML, CSS, plain JavaScript modules; nothing built, nothing fetched from elsewhere).

The files are public: they hold no data. Everything the page shows or does goes through the API routes
any client uses, under the same rules (http.api_key over TCP, browsers' cross-site requests refused, and on
loopback without a key any request, the page's files too, under a Host that is not a loopback name:
appliance.http_common). A TCP listener beyond loopback without http.api_key does not serve the page
(403 saying to set the key): a browser must not become a way in without it. Every answer carries a
Content-Security-Policy that allows this server alone, so the page can load nothing from elsewhere.
"""
from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

from appliance.http_common import CTX, PAGE_PREFIX, is_loopback, over_tcp

log = logging.getLogger(__name__)
WEB = Path(__file__).resolve().parent / "web"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FILES = web.AppKey("web_files", dict)  # the app's page_files()
NO_KEY = ("This daemon listens beyond loopback (http.tcp_host {host}) without an API key, so it does not serve "
          "its page: set http.api_key in the config and restart the daemon, then sign in with that key; or "
          "listen on 127.0.0.1 only.\n")


def page_files() -> dict[str, Path]:
    """The page's files by URL name (relative to appliance/web, `/` between folders): what exists is what
    is served, nothing else can be named."""
    return {p.relative_to(WEB).as_posix(): p for p in sorted(WEB.rglob("*"))
            if p.is_file() and p.suffix in TYPES and not p.name.startswith(".")}


def _file(request, name: str) -> web.StreamResponse:
    h = request.app[CTX].cfg.http
    if over_tcp(request) and not h.api_key and not is_loopback(h.tcp_host):
        return web.Response(status=403, text=NO_KEY.format(host=h.tcp_host), headers=HEADERS)
    path = request.app[FILES].get(name)
    if path is None:
        return web.Response(status=404, text=f"the page has no file {name!r}\n", headers=HEADERS)
    return web.FileResponse(path, headers={**HEADERS, "Content-Type": f"{TYPES[path.suffix]}; charset=utf-8"})


async def index(request):
    """GET /: the page."""
    return _file(request, "index.html")


async def asset(request):
    """GET /web/{name}: one of the page's files."""
    return _file(request, request.match_info["name"])


def add_routes(app: web.Application) -> None:
    app[FILES] = page_files()
    if "index.html" not in app[FILES]:
        log.warning("the page's files are missing (%s): GET / answers 404; reinstall the package", WEB)
    app.router.add_get("/", index)
    app.router.add_get(PAGE_PREFIX + "{name:.+}", asset)
