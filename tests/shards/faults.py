"""Helpers of the fault tests: a fault-injecting HTTP proxy on 127.0.0.1, versioned data, writers in children.

:class:`FaultProxy` forwards every request to a real server (the moto S3 server) and, for requests
that match a rule, misbehaves a given number of times: flips a byte of the body, resets the
connection, truncates the body, answers 500/503, or stalls. Writers run in child processes
(:func:`start_writer`), so a test can kill them for real (SIGKILL, from outside or at a named point).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

BUCKET = "sets"
ROOT = str(Path(__file__).resolve().parents[2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Versioned(torch.utils.data.Dataset[dict[str, Any]]):
    """n samples ``{"x": i, "v": version, "pad": uint8[pad]}``: which data version a read sample came from."""

    def __init__(self, n: int, version: int, pad: int = 16) -> None:
        self.n, self.version, self.pad = n, version, pad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        noise = torch.randint(0, 256, (self.pad,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
        return {"x": i, "v": self.version, "pad": noise}


class Slow(Versioned):
    """Versioned, each sample after ``after`` taking a second: a writer to kill mid-write."""

    def __init__(self, n: int, version: int, after: int = 2) -> None:
        super().__init__(n, version)
        self.after = after

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i >= self.after:
            time.sleep(1.0)
        return super().__getitem__(i)


def versions(rs: Any) -> list[int]:
    """The data version of every sample of an opened set (one per sample, in order)."""
    return [int(sample["v"]) for sample in rs]


def start_writer(
    directory: str, shard: int, num_shards: int, data: str, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.Popen[bytes]:
    """Start ``write_shard(<data>, directory, shard=, num_shards=, **kw)`` in a child process.

    ``data`` is Python source for the source (``"Versioned(40, 1)"``); ``env`` adds to the
    child's environment (``TORCHRECORD_TEST_STOP`` kills it at a named point).
    """
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    code = (
        "from tests.shards.faults import Versioned, Slow\n"
        "from torchrecord import write_shard\n"
        f"write_shard({data}, {directory!r}, shard={shard}, num_shards={num_shards}, progress=False, {args})\n"
    )
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-c", code], env=full, cwd=ROOT)


def wait_for(condition: Any, timeout: float = 120.0, what: str = "") -> None:
    """Poll ``condition()`` until it is true (AssertionError naming ``what`` after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class Rule:
    """Misbehave ``times`` times for requests of ``method`` whose path matches ``path``."""

    method: str
    path: str
    action: str  # flip | reset | truncate | 403 | 500 | 503 | stall
    times: int = 1
    stall: float = 3600.0


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream``, misbehaving by its rules; ``seen`` counts requests."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.split("://", 1)[1]
        self.rules: list[Rule] = []
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def add(self, method: str, path: str, action: str, times: int = 1, stall: float = 3600.0) -> None:
        with self.lock:
            self.rules.append(Rule(method, path, action, times, stall))

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _rule(self, method: str, path: str) -> Rule | None:
        with self.lock:
            self.seen.append((method, path))
            for rule in self.rules:
                if rule.times > 0 and rule.method == method and re.search(rule.path, path):
                    rule.times -= 1
                    return rule
        return None

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        body = _request_body(h)
        rule = self._rule(h.command, h.path)
        if rule is not None and rule.action == "reset":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        if rule is not None and rule.action in ("403", "500", "503"):
            _answer(
                h,
                int(rule.action),
                {"Content-Type": "application/xml"},
                b"<Error><Code>InternalError</Code><Message>injected</Message></Error>",
            )
            return
        if rule is not None and rule.action == "stall":
            self.stopping.wait(rule.stall)
            h.close_connection = True
            return
        status, headers, data = self._forward(h, body)
        if rule is not None and rule.action == "flip" and data:
            data = bytearray(data)
            data[len(data) // 2] ^= 0x01
            data = bytes(data)
        if rule is not None and rule.action == "truncate" and data:
            _answer(h, status, headers, data[: len(data) // 2], length=len(data))
            h.close_connection = True
            return
        _answer(h, status, headers, data)

    def _forward(self, h: http.server.BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        skip = {"host", "expect", "transfer-encoding", "content-length", "connection"}
        headers = {k: v for k, v in h.headers.items() if k.lower() not in skip}
        headers["Host"] = self.upstream
        headers["Content-Length"] = str(len(body))
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            out = {k: v for k, v in response.getheaders() if k.lower() not in ("transfer-encoding", "connection")}
            return response.status, out, data
        finally:
            conn.close()


def _request_body(h: http.server.BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        pieces = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(pieces)
            pieces.append(h.rfile.read(size))
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def _answer(
    h: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes, length: int | None = None
) -> None:
    with contextlib.suppress(OSError):
        h.send_response(status)
        for key, value in headers.items():
            if key.lower() != "content-length" or h.command == "HEAD":  # a HEAD's length is the object's
                h.send_header(key, value)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(data) if length is None else length))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
        h.wfile.flush()
