"""`bundle-import serve` as a child process for tests and bench/: started from a bundle's own
pyz (stdlib only, ``python3 -I``) on a free loopback port, its one JSON start line read, stopped
by its pid with SIGTERM."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Served:
    proc: subprocess.Popen[str]
    start: dict[str, Any]
    log: Path

    @property
    def addr(self) -> str:
        return str(self.start["listening"])

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send ``sig`` to the server (by its pid); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def serve_command(pyz: Path, target: Path, *extra: str) -> list[str]:
    return [sys.executable, "-I", str(pyz), "serve", str(target), "--listen", "127.0.0.1:0", "--json", *extra]


@contextlib.contextmanager
def serving(pyz: Path, target: Path, *extra: str) -> Iterator[Served]:
    """Serve ``target`` (folder, tar or parts index) until the block ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with tempfile.NamedTemporaryFile(prefix="serve-", suffix=".log", delete=False) as log:
        path = Path(log.name)
    with open(path, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(serve_command(pyz, target, *extra), stdout=subprocess.PIPE, stderr=err, text=True,
                                env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server prints it once verified and listening
        if not line:
            rc = proc.wait(60)
            raise AssertionError(f"serve exited {rc} before serving:\n{path.read_text()}")
        yield Served(proc, json.loads(line), path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()
        path.unlink(missing_ok=True)


def connect(addr: str, timeout: float = 30) -> socket.socket:
    """A raw TCP connection to a served ``ADDR:PORT``."""
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def raw_exchange(sock: socket.socket, data: bytes, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as is, read one response: (status, lower-case headers, body)."""
    sock.sendall(data)
    resp = http.client.HTTPResponse(sock, method=method)
    resp.begin()
    try:
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        resp.close()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (whatever it sends first is read)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return False
    except OSError:  # reset: closed too
        return True
    return True


def shutdown_figures(log: str) -> tuple[int, int, int]:
    """(requests, bytes sent, bytes hashed) of the line serve prints when stopped."""
    m = re.search(r"(\d+) request\(s\), (\d+) bytes sent, (\d+) bytes hashed", log)
    assert m is not None, log
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def https_request(addr: str, method: str, path: str, *, ca: Path | None, headers: dict[str, str] | None = None
                  ) -> tuple[int, dict[str, str], bytes]:
    """One request to a TLS ``serve`` at ``addr`` (a name it must carry, e.g. localhost:PORT), verified
    with the CA ``ca`` (None: not verified)."""
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca)) if ca is not None else ssl._create_unverified_context()
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=60)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
