"""Helpers for the transfer tests (issue 5): bundles of a few MB of random data, a private
docker-registry and a private sshd (through docker/scripts/*.sh), and a loopback HTTP proxy that
cuts connections or answers 500 (the flaky link between a push and its registry)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

from bundle.blobstore import BlobStore
from bundle.exportloop import read_docker_save
from bundle.writer import write_bundle
from tests.kit import engines
from tests.kit.fakesave import FakeImage, docker_save, layer_tar

SSHD_SH = engines.SCRIPTS / "sshd.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_bundle(root: Path, *, mb: tuple[int, ...] = (6, 3), compression: str = "zstd",
                  seed: int = 0) -> Path:
    """Two images sharing a base layer; each further layer holds ``mb`` MiB of random bytes
    (incompressible), so the bundle is a few MB and splits into several parts."""
    import random

    rnd = random.Random(seed)

    def blob(n: int) -> bytes:
        return b"".join(rnd.randbytes(min(1 << 20, n - i)) for i in range(0, n, 1 << 20))

    base = layer_tar({"bin/tool": b"#!/bin/sh\necho tool\n" * 100, "data/base.bin": blob(mb[0] * 1024 * 1024)})
    top = layer_tar({"data/top.bin": blob(mb[1] * 1024 * 1024)})
    images = [FakeImage("carry/base:1", [base]), FakeImage("carry/app:2", [base, top])]
    root.mkdir(parents=True, exist_ok=True)
    store = BlobStore(str(root), fsync=False)
    found = read_docker_save(io.BytesIO(docker_save(images)), store, compression=compression)
    write_bundle(str(root), store, found, {"kind": "test"})
    return root


# --- private daemons ---------------------------------------------------------------------


def run_script(*argv: str, timeout: float = 60) -> str:
    proc = subprocess.run(["bash", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise engines.EngineError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def run_dir() -> Path:
    return Path(os.environ.get("SNEAKERNET_RUN", "/tmp/sneakernet-run")).absolute()


def registry_log(name: str) -> Path:
    return run_dir() / f"registry-{name}" / "registry.log"


_UPLOAD_RE = re.compile(r'"(POST|PATCH|PUT) /v2/\S+/blobs/uploads/')


def blob_upload_requests(name: str, since: int = 0) -> list[str]:
    """Blob-upload requests (POST/PATCH/PUT on .../blobs/uploads/) in the registry's access log
    after byte offset ``since``."""
    data = registry_log(name).read_bytes()[since:].decode("utf-8", "replace")
    return [line for line in data.splitlines() if _UPLOAD_RE.search(line) and line.startswith("127.0.0.1 - ")]


def log_size(name: str) -> int:
    return registry_log(name).stat().st_size


def start_sshd(name: str, port: int, permit_open: str) -> Path:
    """Private sshd on 127.0.0.1:port; returns its state folder (id_ed25519, known_hosts)."""
    run_script(str(SSHD_SH), "purge", name)
    run_script(str(SSHD_SH), "start", name, str(port), permit_open)
    return run_dir() / f"sshd-{name}"


def stop_sshd(name: str) -> None:
    run_script(str(SSHD_SH), "purge", name)


# --- a flaky link ------------------------------------------------------------------------


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


class FlakyProxy:
    """HTTP-aware loopback proxy in front of a registry.

    - ``cut_mid_at=N``: once N request bytes went through, cut the connection in the middle of
      the request being sent (the registry sees a truncated body); once.
    - ``cut_between_at=N``: once N request bytes went through, cut the connection when the next
      request starts (the registry got every earlier request whole); once.
    - ``fail_first=K``: answer the first K requests (whose request line starts with
      ``fail_match``) with ``fail_status`` (500 by default), then behave.
    - ``cut_response_at=N``: once N response bytes went back to the client, cut that connection in
      the middle of the answer (a download that drops); once.
    A TLS ClientHello is refused at once, as a plain-HTTP server does. Counts request lines and
    keeps the ``Range`` headers clients sent."""

    def __init__(self, upstream: int, *, cut_mid_at: int = 0, cut_between_at: int = 0, fail_first: int = 0,
                 fail_match: bytes = b"", fail_status: int = 500, cut_response_at: int = 0) -> None:
        self.cut_response_at = cut_response_at
        self.received = 0
        self.response_cuts = 0
        self.ranges: list[str] = []
        self.upstream = upstream
        self.cut_mid_at = cut_mid_at
        self.cut_between_at = cut_between_at
        self.fail_left = fail_first
        self.fail_match = fail_match
        self.fail_status = fail_status
        self.sent = 0
        self.cuts = 0
        self.failed = 0
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        self._sock.close()

    def __enter__(self) -> FlakyProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:
            client.close()
            return
        threading.Thread(target=self._answers, args=(server, client), daemon=True).start()
        reader = client.makefile("rb")
        try:
            if reader.peek(1)[:1] == b"\x16":  # a TLS handshake: this is a plain-HTTP server
                return
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline(65536)
                    if not line:
                        return
                    head += line
                with self._lock:
                    self.lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
                    r = re.search(rb"\r\nrange:\s*([^\r\n]*)", head, re.IGNORECASE)
                    if r:
                        self.ranges.append(r.group(1).decode("latin-1"))
                    if self.fail_left > 0 and head.startswith(self.fail_match):
                        self.fail_left -= 1
                        self.failed += 1
                        action = "fail"
                    elif self.cut_between_at and not self.cuts and self.sent >= self.cut_between_at:
                        self.cuts += 1
                        action = "cut"
                    else:
                        action = "pass"
                m = re.search(rb"\r\ncontent-length:\s*([0-9]+)", head, re.IGNORECASE)
                length = int(m.group(1)) if m else 0
                if action == "cut":
                    return
                if action == "fail":
                    while length > 0:  # read the body, then refuse it
                        chunk = reader.read(min(length, 1 << 20))
                        if not chunk:
                            return
                        length -= len(chunk)
                    body = b'{"errors":[{"code":"UNKNOWN","message":"injected by the test proxy"}]}'
                    status = f"HTTP/1.1 {self.fail_status} Injected\r\n".encode()
                    client.sendall(status + b"Content-Type: application/json\r\nConnection: close\r\n"
                                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                    return
                server.sendall(head)
                self._count(len(head))
                while length > 0:
                    chunk = reader.read(min(length, 64 * 1024))
                    if not chunk:
                        return
                    with self._lock:
                        cut_here = self.cut_mid_at and not self.cuts and self.sent + len(chunk) >= self.cut_mid_at
                        if cut_here:
                            self.cuts += 1
                    if cut_here:
                        keep = max(0, self.cut_mid_at - self.sent)
                        server.sendall(chunk[:keep])
                        return
                    server.sendall(chunk)
                    self._count(len(chunk))
                    length -= len(chunk)
        except OSError:
            return
        finally:
            _close(client, server)

    def _count(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        """The registry's answers back to the client, cut once past ``cut_response_at`` bytes."""
        if not self.cut_response_at:
            self._pump(server, client)
            return
        try:
            while True:
                data = server.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    cut_here = not self.response_cuts and self.received + len(data) >= self.cut_response_at
                    if cut_here:
                        self.response_cuts += 1
                        data = data[:max(0, self.cut_response_at - self.received)]
                    self.received += len(data)
                client.sendall(data)
                if cut_here:
                    break
        except OSError:
            pass
        finally:
            _close(client, server)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
