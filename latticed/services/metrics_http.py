"""The metrics endpoint: ``GET /metrics`` over HTTP/1.x, served by a small trio server in the daemon's
nursery, so it stops with the daemon and runs no thread of its own.

Why not ``prometheus_client.start_http_server``: it runs a thread that would collect while the event loop
changes the state being read, and nothing stops it when the daemon does. Here each scrape is one short
connection: the request head is read (bounded in size and time), the registry is collected and encoded on
the event loop by ``prometheus_client`` itself (text 0.0.4 or OpenMetrics, as the ``Accept`` header asks;
gzipped if allowed), and the connection closes. A scraper sends its request at once, so a client gets
:data:`REQUEST_TIMEOUT_S` for its request head; at most :data:`MAX_CONNECTIONS` are served at once, and a
new connection beyond that closes the oldest one instead of being refused: clients that connect and send
nothing (or dribble) cannot keep a scraper out, and none can hold the loop or the memory.

The endpoint has no authentication: it listens on loopback unless an address says otherwise, and a
non-loopback address is logged as a warning.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import ipaddress
import logging
from dataclasses import dataclass
from functools import partial

import trio
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from latticed.errors import LatticedError
from latticed.host.config import HostPort
from latticed.net.accept import serve_listeners
from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)

METRICS_PATH = "/metrics"
MAX_REQUEST_BYTES = 8192
#: Seconds a client gets to send its request head (a scraper sends it at once).
REQUEST_TIMEOUT_S = 2.0
#: Seconds a response may take to go out (what a scraper needs to read a few hundred KiB).
RESPONSE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
_INDEX = b"latticed metrics: " + METRICS_PATH.encode() + b"\n"


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    """Where the endpoint listens (the bound port when 0 was asked for)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}{METRICS_PATH}"


async def serve_metrics(
    address: HostPort,
    registry: Collector,
    *,
    task_status: trio.TaskStatus[MetricsEndpoint] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``registry`` at ``address`` until cancelled; reports the bound endpoint once listening."""
    host, port = address
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise LatticedError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} (see --metrics-listen)"
        ) from exc
    if port == 0 and len(listeners) > 1:
        # Each address family would get its own random port: keep one, so the endpoint is one address.
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    bound = listeners[0].socket.getsockname()
    endpoint = MetricsEndpoint(host, int(bound[1]))
    serving: collections.deque[trio.CancelScope] = collections.deque()

    async def handler(stream: trio.SocketStream) -> None:
        if len(serving) >= MAX_CONNECTIONS:
            serving.popleft().cancel()  # shed the oldest: the newest is the likeliest to be a scraper
        with trio.CancelScope() as scope:
            serving.append(scope)
            try:
                await _serve_one(stream, registry)
            finally:
                with contextlib.suppress(ValueError):  # already shed
                    serving.remove(scope)

    loopback = all(_is_loopback(listener.socket.getsockname()[0]) for listener in listeners)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_listeners, handler, listeners, name="metrics"))
        log_event(log, "metrics.listening", address=str(endpoint), url=endpoint.url)
        if not loopback:
            log_event(
                log,
                "metrics.exposed",
                level=logging.WARNING,
                address=str(endpoint),
                hint="the metrics endpoint has no authentication: anyone who can reach it reads queue "
                "counts and peer identities; firewall it or listen on 127.0.0.1",
            )
        task_status.started(endpoint)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def _serve_one(stream: trio.SocketStream, registry: Collector) -> None:
    """One request, one response, then close; every failure stays with this connection."""
    try:
        with trio.move_on_after(REQUEST_TIMEOUT_S) as waited:
            head = await _read_head(stream)
        if waited.cancelled_caught:
            return  # no request in time: nobody to answer
        response = _response(400, b"bad request\n") if head is None else _answer(head, registry)
        with trio.move_on_after(RESPONSE_TIMEOUT_S):
            await stream.send_all(response)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the scraper went away
    except Exception as exc:
        log_event(log, "metrics.request_failed", level=logging.ERROR, exc_info=exc)
    finally:
        await trio.aclose_forcefully(stream)


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    """The request line and headers, or None if they are too long or the stream ends first."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_REQUEST_BYTES:
            return None
        chunk = await stream.receive_some(MAX_REQUEST_BYTES)
        if not chunk:
            return None
        data += chunk
    return data.split(b"\r\n\r\n", 1)[0]


def _answer(head: bytes, registry: Collector) -> bytes:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return _response(400, b"bad request\n")
    method, target = parts[0], parts[1]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        return _response(405, b"only GET and HEAD\n", extra=[("Allow", "GET, HEAD")])
    path = target.split("?", 1)[0]
    extra: list[tuple[str, str]] = []
    if path == "/":
        body, content_type = _INDEX, "text/plain; charset=utf-8"
    elif path == METRICS_PATH:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(registry)
        if gzip_accepted(headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=1)
            extra.append(("Content-Encoding", "gzip"))
    else:
        return _response(404, b"not found: try " + METRICS_PATH.encode() + b"\n")
    return _response(200, body, content_type=content_type, extra=extra, head_only=method == "HEAD")


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _response(
    status: int,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: list[tuple[str, str]] | None = None,
    head_only: bool = False,
) -> bytes:
    fields = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        *(extra or []),
    ]
    head = f"HTTP/1.1 {status} {_REASONS[status]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
    return head.encode("latin-1") + b"\r\n" + (b"" if head_only else body)


__all__ = ["METRICS_PATH", "MetricsEndpoint", "serve_metrics"]
