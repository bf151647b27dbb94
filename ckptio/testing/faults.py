"""A fault-injecting HTTP proxy on loopback, to put in front of an S3 endpoint (the moto
server) in tests: clients talk to the proxy's URL as their ``endpoint_url`` and see, at a
chosen rate, the failures real S3 produces:

- ``slowdown``: ``503 SlowDown`` (S3's request-rate throttling), XML body as S3 sends it;
- ``internal``: ``500 InternalError``;
- ``drop``: the connection is closed after the request is read, with no response (a reset);
- ``slow``: the request is forwarded after ``slow_seconds`` of delay (a slow response; with
  a delay above the client's read timeout it becomes a timeout);
- ``denied``: ``403 AccessDenied``, a permanent refusal (not among the default kinds: it is
  not worth retrying, so a client must fail on it at once).

Every other request is forwarded unchanged (headers, body, signature) and the response sent
back. The proxy is bounded and self-stopping: at most ``max_faults`` faults (then it only
forwards), and it shuts itself down after ``lifetime`` seconds even if a test forgets to stop
it. Counters (:meth:`FaultProxy.stats`) say how many requests were seen and faults injected,
by kind. Usage::

    with FaultProxy("http://127.0.0.1:5000", rate=0.1, seed=1) as proxy:
        store = open_store("s3+boto3://bucket/x", endpoint_url=proxy.url)
        ...
        assert proxy.stats()["faults"] > 0
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["KINDS", "RETRYABLE", "FaultProxy"]

KINDS = ("slowdown", "internal", "drop", "slow", "denied")
"""Fault kinds the proxy can inject."""
RETRYABLE = ("slowdown", "internal", "drop", "slow")
"""The kinds a client should retry through (the default ``kinds``)."""

_S3_ERRORS = {
    "slowdown": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "internal": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "denied": (403, "Forbidden", "AccessDenied", "Access Denied"),
}


class FaultProxy:
    """A threaded HTTP/1.1 reverse proxy on ``127.0.0.1`` (port 0) that injects faults.

    Parameters (keyword-only after ``upstream``):

    - ``upstream``: ``http://host:port`` of the real endpoint;
    - ``rate`` (0..1): probability that a request gets a fault;
    - ``kinds``: which faults (of :data:`KINDS`), drawn uniformly (default :data:`RETRYABLE`);
    - ``methods``: only requests with these HTTP methods can get a fault (default all);
    - ``paths``: only requests whose path contains one of these strings can (default all);
    - ``seed``: for a reproducible sequence of decisions;
    - ``slow_seconds`` (seconds, default 0.3): delay of a ``slow`` fault;
    - ``max_faults``: stop injecting after this many (None: no bound);
    - ``lifetime`` (seconds, default 600): the proxy stops itself after this long.
    """

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.05,
        kinds: Iterable[str] = RETRYABLE,
        methods: Iterable[str] | None = None,
        paths: Iterable[str] | None = None,
        seed: int | None = None,
        slow_seconds: float = 0.3,
        max_faults: int | None = None,
        lifetime: float = 600.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.kinds = tuple(kinds)
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"unknown fault kinds {bad}; valid: {', '.join(KINDS)}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within 0..1, got {rate}")
        self.rate = rate
        self.methods = {m.upper() for m in methods} if methods else None
        self.paths = set(paths) if paths else None
        self.slow_seconds = slow_seconds
        self.max_faults = max_faults
        self.lifetime = lifetime
        self._upstream = (parts.hostname, parts.port or 80)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self.url = ""

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        server = _QuietServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="ckptio-fault-proxy", daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        host, port = server.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()

    def __enter__(self) -> FaultProxy:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control ------------------------------------------------------------------------------
    def set(self, *, rate: float | None = None, kinds: Iterable[str] | None = None) -> None:
        """Change the fault rate or kinds while running (e.g. faults only during a save)."""
        with self._lock:
            if rate is not None:
                self.rate = rate
            if kinds is not None:
                self.kinds = tuple(kinds)

    def stats(self) -> dict[str, int]:
        """``requests`` seen, ``faults`` injected, and one count per fault kind."""
        with self._lock:
            return dict(self._counts)

    def _decide(self, method: str, path: str = "") -> str | None:
        with self._lock:
            self._counts["requests"] += 1
            if self.methods is not None and method not in self.methods:
                return None
            if self.paths is not None and not any(p in path for p in self.paths):
                return None
            if self.max_faults is not None and self._counts["faults"] >= self.max_faults:
                return None
            if self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.kinds)
            self._counts["faults"] += 1
            self._counts[kind] += 1
            return kind


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (timeout) or an injected drop: expected, not worth a traceback
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    _local = threading.local()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def finish(self) -> None:
        """The client's connection ends: so does this thread's upstream connection (an
        upstream that keeps connections alive, as RGW does, would otherwise leave it open)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        super().finish()

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            host, port = self.owner._upstream
            conn = http.client.HTTPConnection(host, port, timeout=120)
            self._local.conn = conn
        return conn

    def _handle(self) -> None:
        body = self._read_body()
        kind = self.owner._decide(self.command, self.path)
        if kind == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client may have gone already
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind in _S3_ERRORS:
            status, reason, code, message = _S3_ERRORS[kind]
            payload = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message>"
                "<RequestId>ckptio-fault-proxy</RequestId></Error>"
            ).encode()
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        if kind == "slow":
            time.sleep(self.owner.slow_seconds)
        self._forward(body)

    def _forward(self, body: bytes) -> None:
        for attempt in (1, 2):
            conn = self._upstream()
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() in ("transfer-encoding", "connection", "keep-alive"):
                        continue
                    if name.lower() == "content-length":
                        continue
                    conn.putheader(name, value)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        self.send_response(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() in (
                "transfer-encoding",
                "connection",
                "keep-alive",
                "content-length",
                "server",
                "date",
            ):
                continue
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        else:
            self.send_header("Content-Length", resp.getheader("Content-Length", "0"))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
