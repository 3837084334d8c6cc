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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kit.helpers import run_cli, start_pyz
from tests.kit.transferkit import random_bundle


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

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far, from /proc: what a load test
        measures instead of the wall clock."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send ``sig`` to the server (by its pid); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def serve_args(target: Path, *extra: str) -> list[str]:
    """The importer's arguments to serve ``target`` on a free loopback port, its start line in JSON."""
    return ["serve", str(target), "--listen", "127.0.0.1:0", "--json", *extra]


@contextlib.contextmanager
def serving(pyz: Path, target: Path, *extra: str) -> Iterator[Served]:
    """Serve ``target`` (folder, tar or parts index) until the block ends."""
    with tempfile.NamedTemporaryFile(prefix="serve-", suffix=".log", delete=False) as log:
        path = Path(log.name)
    with open(path, "w", encoding="utf-8") as err:
        proc = start_pyz(pyz, *serve_args(target, *extra), stderr=err)
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


#: loopback addresses a test binds its connections to, to be several clients of one server
#: (serve gives each client address its share of the connections and its budget of refused logins)
CLIENTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def connect(addr: str, timeout: float = 30, source: str | None = None) -> socket.socket:
    """A raw TCP connection to a served ``ADDR:PORT`` (from the loopback address ``source``, e.g. one
    of :data:`CLIENTS`; None: the system's choice, 127.0.0.1)."""
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout,
                                    source_address=(source, 0) if source is not None else None)


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


def https_request(addr: str, method: str, path: str, *, ca: Path | None, headers: dict[str, str] | None = None,
                  source: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request to a TLS ``serve`` at ``addr`` (a name it must carry, e.g. localhost:PORT), verified
    with the CA ``ca`` (None: not verified), from the loopback address ``source`` (as :func:`connect`)."""
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca)) if ca is not None else ssl._create_unverified_context()
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=60,
                                       source_address=(source, 0) if source is not None else None)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# ============================== the served bundle and plain HTTP requests to it


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same bundle as a folder, one tar and parts of 3 MB; gzip layers, so that Debian 12's Docker
    20.10 can pull it (Docker reads zstd layers from 23.0 on). A serve test file imports it
    (``from tests.kit.servekit import made``): one per module, read only."""
    root = tmp_path_factory.mktemp("serve")
    folder = random_bundle(root / "carry.bundle", compression="gzip")
    run_cli("bundle", "pack", str(folder), str(root / "carry.tar"), check=True)
    run_cli("bundle", "pack", str(folder), str(root / "parts" / "carry.tar"), "--split", "3M", check=True)
    return {"folder": folder, "tar": root / "carry.tar", "parts": root / "parts" / "carry.tar.parts.json"}


def pyz(made: dict[str, Path]) -> Path:
    """The importer of ``made``'s folder."""
    return made["folder"] / "bundle-import.pyz"


def bundle_doc(made: dict[str, Path]) -> dict[str, Any]:
    return json.loads((made["folder"] / "bundle.json").read_text())  # type: ignore[no-any-return]


def request(addr: str, method: str, path: str, headers: dict[str, str] | None = None, source: str | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own (from the loopback address ``source``, as :func:`connect`)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60,
                                      source_address=(source, 0) if source is not None else None)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def blob_bytes(folder: Path, digest: str) -> bytes:
    return (folder / "blobs" / "sha256" / digest[7:]).read_bytes()


def cut_body(addr: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(status, Content-Length, bytes received) of a response the server cuts before its end."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        try:
            resp.read()
        except http.client.IncompleteRead as e:
            return resp.status, int(resp.getheader("Content-Length") or -1), len(e.partial)
        raise AssertionError(f"the server sent all of {path}: it was to cut the body short")
    finally:
        conn.close()
