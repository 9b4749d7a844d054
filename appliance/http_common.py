"""What every route of the local HTTP API shares: the app's context key, JSON errors (ApiError and
the middleware that turns every failure into `{"error": {"message", "type", "code"}}`), the guards of
TCP requests (browsers' cross-site requests refused; the bearer token of http.api_key), reading a JSON
body and typed fields (reference audio: appliance.http_refaudio).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import socket
from urllib.parse import urlsplit

from aiohttp import web

from engines.model.errors import TTSError
from engines.runtime.runner import EngineBusy

log = logging.getLogger(__name__)
CTX = web.AppKey("ctx", object)  # the Daemon the app serves


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.headers = status, message, type_, headers or {}


def error_response(status: int, message: str, type_: str, headers=None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": status}}, status=status,
                             headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler):
    """Turn every failure into a JSON error body (400 bad input, 413 too large, 503 busy ...)."""
    ctx = request.app[CTX]
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.type, exc.headers)
    except EngineBusy as exc:
        ctx.metrics.error("busy")
        return error_response(503, str(exc), "busy",
                              {"Retry-After": str(ctx.cfg.runtime.retry_after_s)})
    except TTSError as exc:
        ctx.metrics.error(type(exc).__name__)
        return error_response(400, str(exc), type(exc).__name__)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"request body larger than {ctx.cfg.http.max_body_bytes} bytes", "too_large")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason, "http_error", {k: v for k, v in exc.headers.items()
                                                                    if k in ("Allow", "Retry-After")})
    except asyncio.TimeoutError:
        return error_response(408, "the request was not received in time", "timeout")
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:  # a bug: log it, answer 500, keep serving
        log.exception("%s %s failed", request.method, request.path)
        ctx.metrics.error(type(exc).__name__)
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")


def over_tcp(request: web.Request) -> bool:
    """Whether the request came over a TCP listener (http.tcp), not the Unix socket."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    return sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)


def is_loopback(host: str) -> bool:
    """Whether `host` (http.tcp_host, or the name in a request's Host header) is this machine only."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() in ("localhost", "localhost.")


def loopback_name(host_header: str) -> bool:
    """Whether a request's Host header (name or address, with or without a port) names this machine only:
    localhost, a name under .localhost (browsers resolve those to loopback themselves), 127.0.0.0/8 or
    [::1]. Any other name may be one whose DNS answer was made to point here (DNS rebinding)."""
    h = host_header.strip()
    if h.startswith("["):  # [v6] or [v6]:port
        name = h[1:h.find("]")] if "]" in h else h
    else:
        name = h.rsplit(":", 1)[0] if h.count(":") == 1 else h
    name = name.lower().rstrip(".")
    return is_loopback(name) or name == "localhost" or name.endswith(".localhost")


PAGE_PREFIX = "/web/"  # the page's files (appliance.http_web), and `/`


def is_page(request: web.Request) -> bool:
    """A request for the page's static files (appliance.http_web: `/`, `/web/...`): public, they hold no
    data; everything the page shows comes from the API, under the same rules as any client's requests."""
    return request.method in ("GET", "HEAD") and (request.path == "/" or request.path.startswith(PAGE_PREFIX))


@web.middleware
async def same_origin(request: web.Request, handler):
    """Over TCP, refuse what a browser may send on behalf of another site (403):
    - listening on loopback without http.api_key: any request, the page's files included, whose Host is not
      a loopback name or address (loopback_name), whatever its other headers. A page of another site whose
      name was made to resolve here (DNS rebinding) is then same-origin to the browser, which sends neither
      `Origin` on its GETs nor `Sec-Fetch-*` to a plain-http name that is not localhost: only the Host
      header tells it apart from the page this daemon serves.
    - the API (not the page's files): a `Sec-Fetch-Site` other than same-origin or none (typed by the user),
      an `Origin` other than this server's.
    Clients that send none of these headers (curl, the SDKs, the CLI) and name the address they connect to
    are not browsers and pass; the Unix socket is not reachable from a browser."""
    if over_tcp(request):
        h = request.app[CTX].cfg.http
        host = request.headers.get("Host")
        if host is not None and not h.api_key and is_loopback(h.tcp_host) and not loopback_name(host):
            log.warning("refused a request under a name that is not loopback (DNS rebinding?): %s %s (Host %s)",
                        request.method, request.path, host)
            raise ApiError(403, f"this daemon was reached as {host!r}, a name that is not loopback; it answers "
                                f"on loopback only as 127.0.0.1, localhost or [::1]: open "
                                f"http://127.0.0.1:{_port(request)}/ (or set http.api_key)", "cross_site")
        if not is_page(request):
            site, origin = request.headers.get("Sec-Fetch-Site"), request.headers.get("Origin")
            where = f"{request.scheme}://{request.host}"
            other_site = site is not None and site not in ("same-origin", "none")
            # the origin's host and port against the Host header (a TLS proxy in front makes only the scheme differ)
            if other_site or origin is not None and urlsplit(origin).netloc != request.host:
                log.warning("refused a cross-site request: %s %s (Origin %s, Sec-Fetch-Site %s)", request.method,
                            request.path, origin or "-", site or "-")
                raise ApiError(403, f"cross-site request refused (Origin {origin or '-'}, Sec-Fetch-Site "
                                    f"{site or '-'}): use the page this daemon serves at {where}/, or a client "
                                    "that is not a browser", "cross_site")
    return await handler(request)


def _port(request: web.Request):
    """The TCP port the request came in on."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return sock[1] if sock else "PORT"


@web.middleware
async def require_key(request: web.Request, handler):
    """http.api_key set: a request over TCP needs `Authorization: Bearer KEY` (401 otherwise), all but
    the page's static files (is_page). The Unix socket is guarded by its file mode and group (http.mode,
    http.group) and needs no key."""
    key = request.app[CTX].cfg.http.api_key
    if key and over_tcp(request) and not is_page(request):
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "this daemon wants an API key over TCP: send 'Authorization: Bearer KEY' with the "
                                "key of http.api_key (OpenAI SDK: api_key=KEY)", "unauthorized",
                           {"WWW-Authenticate": 'Bearer realm="tts-appliance"'})
    return await handler(request)


def is_json(content_type: str) -> bool:
    """application/json or a +json type (application/merge-patch+json ...)."""
    return content_type == "application/json" or (content_type.startswith("application/")
                                                   and content_type.endswith("+json"))


async def read_json(request: web.Request) -> dict:
    """The request body as a JSON object, read within the read timeout: 415 unless it is declared
    as JSON (Content-Type: application/json), 400 unless it is an object, 413 when too large."""
    ctx = request.app[CTX]
    if not is_json(request.content_type):
        raise ApiError(415, f"send the body as JSON with 'Content-Type: application/json' (got "
                            f"{request.headers.get('Content-Type') or 'no Content-Type'})", "unsupported_media_type")
    if request.content_length is not None and request.content_length > ctx.cfg.http.max_body_bytes:
        raise ApiError(413, f"request body larger than {ctx.cfg.http.max_body_bytes} bytes", "too_large")
    raw = await asyncio.wait_for(request.read(), ctx.cfg.http.read_timeout_s)
    return parse_object(raw, "body")


def parse_object(raw: bytes | str, what: str) -> dict:
    """JSON text that must hold an object (400 otherwise)."""
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"{what} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"{what} must be a JSON object")
    return data


def field(data: dict, name: str, typ, default=None, required: bool = False):
    """`data[name]` checked against `typ` (a type or a tuple of types; bool is not an int); None
    and absent give `default` (400 when `required`)."""
    value = data.get(name, default)
    if value is None:
        if required:
            raise ApiError(400, f"'{name}' is required")
        return None
    if typ is int and isinstance(value, bool) or not isinstance(value, typ):
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ApiError(400, f"'{name}' must be a {want}")
    return value
