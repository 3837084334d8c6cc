"""A loopback fake registry that can misbehave (issue 24, class 3), for hostile tests of the
registry client (importer/registry/client.py, auth.py) and the ``docker://`` source.

:class:`Loopback` is a small ``http.server`` on 127.0.0.1 (a thread per connection) that records
every request's method, path and headers (``requests``), counts the body bytes it managed to send
(``sent``) and answers with a function of the request. :class:`FakeRegistry` is one that speaks
enough of the distribution API (``/v2/``, manifests, blobs) to serve images built here in memory
(:meth:`FakeRegistry.image`, :meth:`FakeRegistry.index`); ``override`` replaces the answer to one
path (an endless blob, a lying Content-Length, a redirect...). A second :class:`Loopback` plays a
token realm or a CDN on another port and captures any ``Authorization`` header it is sent.

Everything is bounded: an "endless" body stops after ``ENDLESS`` bytes (or when the client hangs
up), so a test of today's code ends instead of filling the disk."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import ssl
import tarfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ENDLESS = 64 << 20  # what an "endless" body sends at most

Handler = Callable[[BaseHTTPRequestHandler], None]


def digest_of(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


class _Req(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _any(self) -> None:
        self.server.owner.record(self)
        try:
            self.server.owner.answer(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: Loopback


class Loopback:
    """A recording HTTP server on 127.0.0.1; ``handler(req)`` answers (default: 404). ``tls``: a
    server context (HTTPS, e.g. from tests/test_registry_token_auth.py's Signer)."""

    def __init__(self, handler: Handler | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Req)
        self._server.owner = self
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        self.addr = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.addr}"
        # polled every 0.05 s, not socketserver's 0.5 s: close() (shutdown) waits for the next poll
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def record(self, req: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append((req.command, req.path, {k.lower(): v for k, v in req.headers.items()}))

    def answer(self, req: BaseHTTPRequestHandler) -> None:
        if self.handler is None:
            send(req, 404, b"")
        else:
            self.handler(req)

    def authorizations(self) -> list[str]:
        """Every Authorization header this server was sent."""
        return [h["authorization"] for _, _, h in self.requests if "authorization" in h]

    def count(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send(req: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None,
         *, content_length: int | None = None) -> None:
    """One answer; ``content_length`` (default: the body's) may lie."""
    req.send_response(status)
    for key, value in (headers or {}).items():
        req.send_header(key, value)
    req.send_header("Content-Length", str(len(body) if content_length is None else content_length))
    req.end_headers()
    if req.command != "HEAD" and body:
        req.wfile.write(body)
        req.server.owner.count(len(body))  # type: ignore[attr-defined]


def send_json(req: BaseHTTPRequestHandler, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
    send(req, status, json.dumps(doc).encode(), {"Content-Type": "application/json", **(headers or {})})


def send_endless(req: BaseHTTPRequestHandler, *, content_length: int | str | None = None, limit: int = ENDLESS,
                 prefix: bytes = b"") -> None:
    """A body that does not end (``limit`` bytes at most): chunked, or after a (lying) Content-Length
    (a number, or any text such as a superscript ``"\u00b2"``); ``prefix`` (e.g. the real blob)
    and then zeros (which gzip takes for padding)."""
    if req.command == "HEAD":
        send(req, 200, b"", content_length=content_length if isinstance(content_length, int) else 0)
        return
    req.send_response(200)
    req.send_header("Content-Type", "application/octet-stream")
    if content_length is None:
        req.send_header("Transfer-Encoding", "chunked")
    else:
        req.send_header("Content-Length", str(content_length))
    req.end_headers()
    block = b"\0" * (256 << 10)
    owner: Loopback = req.server.owner  # type: ignore[attr-defined]
    sent = 0
    try:
        if prefix:
            req.wfile.write(b"%x\r\n" % len(prefix) + prefix + b"\r\n" if content_length is None else prefix)
            sent += len(prefix)
            owner.count(len(prefix))
        while sent < limit:
            if content_length is None:
                req.wfile.write(b"%x\r\n" % len(block) + block + b"\r\n")
            else:
                req.wfile.write(block)
            sent += len(block)
            owner.count(len(block))
    except OSError:
        pass
    req.close_connection = True


def redirect(req: BaseHTTPRequestHandler, location: str, status: int = 307) -> None:
    send(req, status, b"", {"Location": location})


def layer_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class FakeRegistry(Loopback):
    """A distribution-API registry in memory (plain HTTP, no auth unless ``challenge`` is set).

    ``override[path] = handler`` answers that path instead (``path``: as requested, e.g.
    ``/v2/repo/blobs/sha256:...``); ``challenge``: a ``WWW-Authenticate`` value every /v2/ request
    without an ``Authorization`` header is answered 401 with."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}  # "repo:ref" and "repo@digest" -> (bytes, type)
        self.override: dict[str, Handler] = {}
        self.challenge = ""
        super().__init__(self._registry)

    # === content
    def blob(self, raw: bytes) -> dict[str, Any]:
        self.blobs[digest_of(raw)] = raw
        return {"digest": digest_of(raw), "size": len(raw)}

    def put_manifest(self, repo: str, ref: str, raw: bytes, media_type: str) -> dict[str, Any]:
        self.manifests[f"{repo}@{digest_of(raw)}"] = (raw, media_type)
        if ref:
            self.manifests[f"{repo}:{ref}"] = (raw, media_type)
        return {"mediaType": media_type, "digest": digest_of(raw), "size": len(raw)}

    def image(self, repo: str, tag: str, files: dict[str, bytes] | None = None,
              platform: tuple[str, str] = ("linux", "amd64")) -> dict[str, Any]:
        """A one-layer image (gzip), pushed as ``repo:tag``: (manifest descriptor, with
        ``layer``/``config`` descriptors added under those keys)."""
        tar = layer_tar(files or {"hello.txt": b"hello from the fake registry\n"})
        layer = {"mediaType": OCI_LAYER_GZIP, **self.blob(gzip.compress(tar, mtime=0))}
        config_doc = {"architecture": platform[1], "os": platform[0],
                      "rootfs": {"type": "layers", "diff_ids": [digest_of(tar)]}, "config": {}}
        config = {"mediaType": OCI_CONFIG, **self.blob(json.dumps(config_doc).encode())}
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer]}
        desc = self.put_manifest(repo, tag, json.dumps(manifest).encode(), OCI_MANIFEST)
        return {**desc, "layer": layer, "config": config}

    def index(self, repo: str, tag: str, manifests: list[dict[str, Any]]) -> dict[str, Any]:
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.put_manifest(repo, tag, json.dumps(doc).encode(), OCI_INDEX)

    # === the API
    def _registry(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path in self.override:
            self.override[path](req)
            return
        if self.challenge and "authorization" not in {k.lower() for k in req.headers}:
            send_json(req, 401, {"errors": [{"code": "UNAUTHORIZED", "message": "log in"}]},
                      {"WWW-Authenticate": self.challenge})
            return
        if path == "/v2/":
            send_json(req, 200, {}, {"Docker-Distribution-Api-Version": "registry/2.0"})
            return
        repo, kind, ref = _split(path)
        if kind == "manifests":
            key = f"{repo}@{ref}" if ref.startswith("sha256:") else f"{repo}:{ref}"
            if key not in self.manifests:
                send_json(req, 404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": key}]})
                return
            raw, media_type = self.manifests[key]
            send(req, 200, raw, {"Content-Type": media_type, "Docker-Content-Digest": digest_of(raw)})
        elif kind == "blobs" and ref in self.blobs:
            raw = self.blobs[ref]
            start = _range_start(req.headers.get("Range"))
            status = 206 if start else 200
            send(req, status, raw[start:], {"Content-Type": "application/octet-stream",
                                            "Docker-Content-Digest": ref})
        else:
            send_json(req, 404, {"errors": [{"code": "BLOB_UNKNOWN", "message": path}]})


def _split(path: str) -> tuple[str, str, str]:
    """``/v2/a/b/manifests/x`` -> ("a/b", "manifests", "x")."""
    body = path[len("/v2/"):]
    for kind in ("manifests", "blobs"):
        repo, sep, ref = body.rpartition(f"/{kind}/")
        if sep:
            return repo, kind, ref
    return "", "", ""


def _range_start(value: str | None) -> int:
    if value and value.startswith("bytes=") and value.endswith("-") and value[6:-1].isdigit():
        return int(value[6:-1])
    return 0
