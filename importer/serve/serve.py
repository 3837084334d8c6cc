"""``bundle-import serve``: a read-only OCI distribution API straight from a verified bundle.

The bundle (folder, tar or parts) is read in place through the one opened view
(importer/input/opened.py); nothing is copied or unpacked. The caller verifies the bundle first
(importer/cli/serve.py); here every blob is hashed again as it is sent and the response is cut
before its last bytes when the bytes no longer match bundle.json, so no client can store them
(a client sees a short body and fails the pull).

Repository names are the bundle's refs with the registry host left out: ``app:1`` is served as
``app:1``, ``reg.example:5000/team/app:1`` as ``team/app:1``, ``docker.io/library/app:1`` as
``library/app:1`` (``docker pull HOST:PORT/app:1`` asks for ``app``, so keep refs short or pull
the path shown). A ref without tag is served as ``latest``; a ref by digest only, by digest.
Each repository serves its images' manifests (by tag and by digest), configs and layers, and
nothing else (docs/transfer.md, "Serve a bundle as a registry")."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type
from urllib.parse import parse_qs, unquote, urlsplit

from importer import __version__
from importer.errors import BundleError, IntegrityError, UsageError
from importer.format.artifacts import handed_on_reference
from importer.format.digest import Digest, is_digest
from importer.format.fileartifacts import FileArtifact
from importer.format.manifest import BlobRef, BundleManifest, ImageRecord
from importer.format.reference import engine_host, split_host_path, split_reference, valid_path, valid_tag
from importer.format.text import printable
from importer.input.opened import OpenedBundle
from importer.serve.serve_artifacts import REFERRERS_RE, ServedArtifacts
from importer.serve.servelimits import (
    CLIENT_FULL,
    MAX_REQUEST_LINE,
    SERVE,
    BadQuery,
    Limits,
    RequestReader,
    Slots,
    VerifiedBlobs,
    blob_identity,
    client_key,
    page_params,
)
from importer.streams import testhooks

CHUNK = 1024 * 1024
DEFAULT_LISTEN = "127.0.0.1:5000"
API_VERSION_HEADER = ("Docker-Distribution-API-Version", "registry/2.0")
_ROUTE_RE = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")
_TAGS_RE = re.compile(r"^/v2/(?P<name>.+)/tags/list$")


class ListenFailed(UsageError):
    """The server could not listen on the address given (in use, not this host's, no permission)."""

    reference = "serve-listen"


class ServedBlobDamaged(IntegrityError):
    """A blob no longer matched bundle.json while it was served: the response was cut."""

    reference = "serve-blob-damaged"


def repository_of(ref: str) -> Tuple[str, str, str]:
    """(repository, tag, digest) a bundle ref is served as: the registry host left out, a ref
    with neither tag nor digest tagged ``latest``."""
    name, tag, digest = split_reference(ref)
    name = split_host_path(name, engine_host)[1]
    if not tag and not digest:
        tag = "latest"
    return name, tag, digest


@dataclass
class Blob:
    digest: Digest
    size: int
    media_type: str
    stored: bool  # False: a layer a delta bundle leaves out
    path: Optional[str] = None  # a blob recompressed for serving (importer/registry/transcode.py)

    @property
    def rel(self) -> str:
        return f"blobs/{self.digest.algorithm}/{self.digest.hex}"


@dataclass
class Repository:
    name: str
    tags: Dict[str, ImageRecord] = field(default_factory=dict)
    #: digest -> image: each platform's manifest, and a multi-platform image's index (what its tags name)
    manifests: Dict[str, ImageRecord] = field(default_factory=dict)
    blobs: Set[str] = field(default_factory=set)  # digests of manifests, configs, layers
    artifacts: ServedArtifacts = field(default_factory=ServedArtifacts)  # schema 3.5 (serve_artifacts.py)


class Catalog:
    """What the bundle serves: repositories (by the rule above) and every blob bundle.json pins.
    A multi-platform image's tags name its index (every platform pullable, each by its digest).
    ``local``: blobs recompressed for serving (digest -> file), ``manifest`` then holds the images
    as recompressed (importer/registry/transcode.py)."""

    def __init__(self, manifest: BundleManifest, on_notice: Callable[[str], None],
                 local: Optional[Dict[str, str]] = None) -> None:
        self.repositories: Dict[str, Repository] = {}
        self.blobs: Dict[str, Blob] = {}
        self.local = dict(local or {})
        #: manifests (and indexes) naming a zstd layer: refused to a Docker too old to read them
        self.zstd: Set[str] = set()
        stored = {f.path for f in manifest.files}
        for image in manifest.images:
            for ref in image.refs:
                self._add(image, ref, stored, on_notice)
        for art in manifest.file_artifacts:  # 3.6: files carried as OCI artifacts, under their refs
            self._add_files(art, stored, on_notice)

    def _blob(self, digest: Digest, size: int, media_type: str, stored: Set[str]) -> str:
        blob = Blob(digest, size, media_type, False, self.local.get(str(digest)))
        blob.stored = blob.path is not None or blob.rel in stored
        self.blobs.setdefault(str(digest), blob)
        return str(digest)

    def _add(self, image: ImageRecord, ref: str, stored: Set[str], on_notice: Callable[[str], None]) -> None:
        name, tag, _ = repository_of(ref)
        if not valid_path(name):
            on_notice(f"serve: not serving ref {ref}: {name!r} is no registry repository name")
            return
        repo = self.repositories.setdefault(name, Repository(name))
        if tag:
            other = repo.tags.get(tag)
            if other is not None and top_of(other).digest != top_of(image).digest:
                on_notice(f"serve: {name}:{tag} names two images of the bundle; serving {other.name}, "
                          f"{image.name} only by digest")
            else:
                repo.tags[tag] = image
        if image.index is not None:
            repo.manifests[str(image.index.digest)] = image
            repo.blobs.add(self._blob(image.index.digest, image.index.size, image.index.media_type, stored))
            if any(_zstd(v) for v in image.variants):
                self.zstd.add(str(image.index.digest))
        for v in image.variants if image.index is not None else (image,):
            repo.manifests[str(v.manifest.digest)] = v
            if _zstd(v):
                self.zstd.add(str(v.manifest.digest))
            repo.blobs.add(self._blob(v.manifest.digest, v.manifest.size, v.manifest.media_type, stored))
            repo.blobs.add(self._blob(v.config.digest, v.config.size, v.config.media_type, stored))
            for layer in v.layers:
                repo.blobs.add(self._blob(layer.digest, layer.size, layer.media_type, stored))
        repo.blobs |= repo.artifacts.add(image, lambda d, n, mt: self._blob(d, n, mt, stored))

    def _add_files(self, art: FileArtifact, stored: Set[str], on_notice: Callable[[str], None]) -> None:
        """A file artifact (3.6): its manifest by digest and under its ref's tag (in ``tags/list``),
        its config and every file's raw layer, each hashed again as it is sent like any blob
        (``oras pull HOST:PORT/models/llama:3.1``)."""
        name, tag, _ = repository_of(art.ref)
        if not valid_path(name):
            on_notice(f"serve: not serving the artifact {art.ref}: {name!r} is no registry repository name")
            return
        if art.held_files():  # 3.8: its manifest names files this bundle does not hold; no pull could complete
            on_notice(f"serve: not serving the artifact {art.ref}: it is a file delta, {len(art.held_files())} of its "
                      "files are left out of this bundle (held on the far side); serve the full bundle, or write the "
                      "delta with bundle-import BUNDLE --files-to DIR")
            return
        repo = self.repositories.setdefault(name, Repository(name))
        if tag in repo.tags:  # the exporter refuses this; a hand-made bundle gets the image served
            on_notice(f"serve: {name}:{tag} names an image and the artifact {art.ref}; serving the artifact "
                      "by digest only")
            tag = ""
        blobs = [self._blob(b.digest, b.size, b.media_type, stored) for b in art.every_blob()]
        repo.blobs.update(blobs)
        repo.artifacts.add_manifest(blobs[0], tag)
        for sig in art.signatures:  # 3.7: its cosign signatures under sha256-<hex>.sig (cosign verify reads them)
            repo.artifacts.add_signature(str(sig.manifest.digest), handed_on_reference(sig))

    def has_zstd(self) -> bool:
        return bool(self.zstd)

    def missing_layers(self) -> List[Blob]:
        return [b for b in self.blobs.values() if not b.stored]

    def listing(self) -> List[Dict[str, Any]]:
        return [{"name": r.name, "tags": sorted({*r.tags, *r.artifacts.file_tags})}
                for _, r in sorted(self.repositories.items())]


def top_of(image: ImageRecord) -> BlobRef:
    """What a tag of ``image`` names: its index when the bundle carries one, else its manifest."""
    return image.index if image.index is not None else image.manifest


def _zstd(image: ImageRecord) -> bool:
    return any(layer.media_type.endswith("+zstd") for layer in image.layers)


def too_old_for_zstd(user_agent: str) -> Optional[str]:
    """The Docker version in a client's User-Agent when it is before 23.0 (reads no zstd layer):
    ``docker/20.10.24 go/go1.19 ...`` -> ``20.10.24``; None for any other client."""
    m = re.match(r"\s*docker/(\d+)\.(\d+)[^\s]*", user_agent)
    if m is None or int(m.group(1)) >= 23:
        return None
    return m.group(0).strip()[len("docker/"):]


@dataclass
class Stats:
    requests: int = 0
    bytes_sent: int = 0  # body bytes of every response, counted per request
    bytes_hashed: int = 0  # blob bytes hashed whole (a Range request of a blob hashed before adds none)
    cut: List[str] = field(default_factory=list)  # "digest (what)" of each cut response
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0  # requests read whose access line is not written yet

    def __post_init__(self) -> None:
        self._landed = threading.Condition(self.lock)

    def add(self, sent: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_sent += sent

    def took_off(self) -> None:
        with self.lock:
            self.in_flight += 1

    def landed(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self._landed.notify_all()

    def settle(self, within: float) -> int:
        """Wait (at most ``within`` seconds) until every request read has its access line and its
        count: a stop must not lose the request whose last byte the client already has. Returns the
        requests still in flight (cut by the stop)."""
        with self.lock:
            self._landed.wait_for(lambda: self.in_flight <= 0, within)
            return self.in_flight

    def hashed(self, n: int) -> None:
        with self.lock:
            self.bytes_hashed += n

    def damaged(self, what: str) -> None:
        with self.lock:
            if what not in self.cut:
                self.cut.append(what)


def parse_listen(value: str) -> Tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); port 0 picks a free one."""
    m = re.fullmatch(r"\[(?P<v6>[0-9A-Fa-f:.%a-zA-Z]+)\]:(?P<p>\d{1,5})|(?P<h>[^\s:\[\]/]+):(?P<q>\d{1,5})", value)
    port = int((m.group("p") or m.group("q")) if m else -1)
    if m is None or not 0 <= port <= 65535:
        raise UsageError(f"reading --listen {value!r}: expected ADDR:PORT (127.0.0.1:5000, [::1]:5000, "
                         f"0.0.0.0:5000), found {value!r}", hint="bundle-import serve BUNDLE --listen 127.0.0.1:5000")
    return (m.group("v6") or m.group("h")), port


class BundleRegistry(ThreadingHTTPServer):
    """One listening socket, a thread per connection, every request answered from ``bundle``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, bundle: OpenedBundle, catalog: Catalog, listen: str, *,
                 log: Optional[Callable[[str], None]] = None, limits: Optional[Limits] = None,
                 handler: Optional[Type[BaseHTTPRequestHandler]] = None) -> None:
        host, port = parse_listen(listen)
        self.bundle = bundle
        self.catalog = catalog
        self.stats = Stats()
        self.log = log
        self.limits = limits = limits or Limits()
        self.slots = Slots(limits.max_connections, limits.per_client)
        self.verified = VerifiedBlobs()
        try:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
            self.address_family = infos[0][0]
            super().__init__((str(infos[0][4][0]), int(infos[0][4][1])), handler or _Handler)
        except (OSError, UnicodeError) as e:
            raise ListenFailed(
                f"listening on {listen}: expected a free port on an address of this host, found "
                f"{getattr(e, 'strerror', None) or e}",
                hint="pick another port (--listen 127.0.0.1:5001) or stop what holds it; nothing was served") from e

    def server_bind(self) -> None:
        """As HTTPServer's, without its reverse DNS lookup (slow or hanging on an offline host)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    @property
    def address(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(printable(line))

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection while a slot is free (``--max-connections``) and the client holds
        less than its share (``--max-connections-per-client``); beyond that a thread answers 503, and
        beyond twice that (for the server, or for this client) the connection is closed unanswered.
        The connection's first request head is due ``--idle-timeout`` after this accept."""
        deadline = time.monotonic() + self.limits.idle_timeout
        client = client_key(str(client_address[0]))
        taken = self.slots.take(client)
        if taken is None:
            held = self.slots.held_by(client)
            why = (f"{client} holds {held} connections and as many refusals (--max-connections-per-client "
                   f"{self.slots.per_client})" if held >= self.slots.per_client
                   else f"{2 * self.slots.limit} connections held already")
            self.say(f"serve: refused a connection from {client_address[0]}: {why} (closed unanswered)")
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._connection, args=(request, client_address, client, taken, deadline),
                             daemon=True).start()
        except RuntimeError:  # no thread to be had
            self.slots.release(client, taken)
            self.shutdown_request(request)

    def open_connection(self, request: Any, client_address: Any, deadline: float) -> Any:
        """The connection to answer HTTP on, in the connection's own thread (importer/serve/servetls.py:
        the TLS handshake, the wrong-protocol checks); None: it was closed there. ``deadline``: when the
        first request head is due (``time.monotonic()``)."""
        return request

    def idle_closed(self, client_address: Any) -> None:
        """The log line of a connection closed for sending no whole request head in time."""
        self.say(f"serve: closed the connection from {client_address[0]}: no complete request within "
                 f"{self.limits.idle_timeout:g}s (--idle-timeout)")

    def _connection(self, request: Any, client_address: Any, client: str, taken: str, deadline: float) -> None:
        conn = None
        try:
            conn = self.open_connection(request, client_address, deadline)
            if conn is not None:
                handler: Callable[..., Any] = self.RequestHandlerClass if taken == SERVE else _Busy
                handler(conn, client_address, self, deadline=deadline, refusal=taken)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            if conn is not None and conn is not request:
                self.shutdown_request(conn)
            self.shutdown_request(request)
            self.slots.release(client, taken)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (the client left mid-response, ...): one line, never a traceback."""
        e = sys.exc_info()[1]
        self.say(f"serve: connection from {client_address[0]} ended: {type(e).__name__}: {e}")


class _Handler(BaseHTTPRequestHandler):
    server_version = f"sneakernet-serve/{__version__}"

    def version_string(self) -> str:
        return self.server_version
    protocol_version = "HTTP/1.1"
    server: BundleRegistry

    def __init__(self, request: Any, client_address: Any, server: Any, *, deadline: Optional[float] = None,
                 refusal: str = SERVE) -> None:
        self._first_deadline = deadline  # the first request head is due then (from the accept), not later
        self._refusal = refusal
        self._flying = False  # a request line was read; its access line is not written yet
        super().__init__(request, client_address, server)

    # --- plumbing ---------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        # a head and a short body are two small writes: with Nagle on, the second waits for the client's
        # delayed ACK (about 40 ms per manifest GET or short Range request on a kept-alive connection);
        # a socket that is not TCP (a test's socketpair) has nothing to turn off
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile.close()  # the buffered reader the server made; ours waits only as long as a deadline allows
        self._reader = RequestReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self._begin()

    def _begin(self) -> None:
        """Each request's own account: its status, the body bytes it sent, its time."""
        self._sent = 0
        self._note = ""
        self._code: Any = "-"
        self._started = time.monotonic()

    def handle_one_request(self) -> None:
        """BaseHTTPRequestHandler's, with a deadline on the whole request head (``--idle-timeout``, also
        between requests), a shorter request line (414) and a bounded head (431). From its request
        line to its access line a request is in flight (``Stats.settle``: a stop waits for it)."""
        try:
            self._one_request()
        finally:
            self._land()

    def _land(self) -> None:
        if self._flying:
            self._flying = False
            self.server.stats.landed()

    def _one_request(self) -> None:
        self._begin()
        self.command, self.path, self.requestline, self.request_version = "", "", "", "HTTP/0.9"
        idle = self.server.limits.idle_timeout
        first, self._first_deadline = self._first_deadline, None
        self._reader.begin_head(first if first is not None else time.monotonic() + idle)
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
            self._started = time.monotonic()
            if self.raw_requestline and not self._flying:
                self._flying = True
                self.server.stats.took_off()
            if len(self.raw_requestline) > MAX_REQUEST_LINE:
                self._reader.end_head(self.server.limits.send_timeout)
                self.request_version = ""
                self.send_error(414, "request line too long", f"over {MAX_REQUEST_LINE} bytes")
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            parsed = self.parse_request()
        except socket.timeout:
            self.close_connection = True
            self.server.idle_closed(self.client_address)
            return
        self._reader.end_head(self.server.limits.send_timeout)
        if not parsed:
            return
        if self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # a body this server never reads: no next request after it
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            self.send_error(501, f"unsupported method {self.command[:40]!r}")
            return
        method()
        self.wfile.flush()

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """A refused request (400, 414, 431, 501, ...): a registry error body, then the connection closes."""
        self.close_connection = True
        self.request_version = "HTTP/1.1"  # a status line and headers even for a line that named no version
        self._reader.end_head(self.server.limits.send_timeout)  # the head's deadline does not bound the answer
        text = message or str(code)
        try:
            self._error(code, "UNSUPPORTED", text + (f": {explain}" if explain else ""), close=True)
        finally:
            self._access()

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        self._code = code

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log is not None:
            self.server.log(printable(f"{self.address_string()} {format % args}"))

    def _access(self) -> None:
        testhooks.reached("serve-access", through_stop=True)
        self.server.stats.add(self._sent)
        if self.server.log is not None:
            took = time.monotonic() - self._started
            line = (f"{self.address_string()} \"{self.command} {self.path[:1000]}\" {self._code} "
                    f"{self._sent} {took:.3f}s")
            self.server.log(printable(line + (f" {self._note}" if self._note else "")))
        self._land()

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self._sent += len(data)

    def _headers(self, code: int, length: int, content_type: str, extra: Optional[Dict[str, str]] = None) -> None:
        self.send_response(code)
        self.send_header(*API_VERSION_HEADER)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def _json(self, code: int, doc: Any, extra: Optional[Dict[str, str]] = None) -> None:
        body = json.dumps(doc).encode()
        self._headers(code, len(body), "application/json", extra)
        if self.command != "HEAD":
            self._write(body)

    def _error(self, code: int, error: str, message: str, detail: Any = None, *, close: bool = False,
               extra: Optional[Dict[str, str]] = None) -> None:
        if close:
            self.close_connection = True
            extra = {**(extra or {}), "Connection": "close"}
        self._json(code, {"errors": [{"code": error, "message": message, "detail": detail or {}}]}, extra)

    # --- methods ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        try:
            self._route()
        finally:
            self._access()

    do_HEAD = do_GET

    def _refuse_write(self) -> None:
        try:  # the body is never read, so the connection ends with the answer
            self._error(405, "UNSUPPORTED", "this registry serves a bundle read-only", close=True)
        finally:
            self._access()

    do_PUT = do_POST = do_PATCH = do_DELETE = _refuse_write

    def _route(self) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        if path in ("/v2", "/v2/"):
            return self._json(200, {})
        if path == "/v2/_catalog":
            return self._paged("repositories", sorted(self.server.catalog.repositories), url.query, None)
        m = _TAGS_RE.match(path)
        if m:
            repo = self._repository(m.group("name"))
            if repo is not None:
                self._paged("tags", sorted({*repo.tags, *repo.artifacts.tags}), url.query, repo.name)
            return None
        m = REFERRERS_RE.match(path)
        if m:
            return self._referrers(m.group("name"), m.group("digest"), url.query)
        m = _ROUTE_RE.match(path)
        if m is None:
            return self._error(404, "NAME_UNKNOWN" if path.startswith("/v2/") else "UNSUPPORTED",
                               f"no such endpoint: {path[:200]}")
        repo = self._repository(m.group("name"))
        if repo is None:
            return None
        if m.group("kind") == "manifests":
            return self._manifest(repo, m.group("ref"))
        return self._blob(repo, m.group("ref"))

    def _repository(self, name: str) -> Optional[Repository]:
        repo = self.server.catalog.repositories.get(name)
        if repo is None:
            self._error(404, "NAME_UNKNOWN", "repository name not known to registry", {"name": name[:300]})
        return repo

    def _paged(self, key: str, items: List[str], query: str, name: Optional[str]) -> None:
        try:
            n, last = page_params(query)
        except BadQuery as e:
            return self._error(400, e.code, str(e), {"query": query[:200]})
        if last:
            items = [x for x in items if x > last]
        extra: Dict[str, str] = {}
        if n is not None and n < len(items):
            items = items[:n]
            base = f"/v2/{name}/tags/list" if name else "/v2/_catalog"
            extra["Link"] = f'<{base}?n={n}&last={items[-1] if items else ""}>; rel="next"'
        doc: Dict[str, Any] = {"name": name, key: items} if name else {key: items}
        self._json(200, doc, extra)

    def _manifest(self, repo: Repository, ref: str) -> None:
        image = repo.manifests.get(ref) if is_digest(ref) else repo.tags.get(ref) if valid_tag(ref) else None
        if image is None and ref in repo.artifacts.manifests:  # a signature, SBOM, referrer (3.5)
            blob = self.server.catalog.blobs[repo.artifacts.manifests[ref]]
            return self._send_blob(blob, blob.media_type)
        if image is None:
            return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown",
                               {"name": repo.name, "reference": ref[:200]})
        digest = ref if is_digest(ref) else str(top_of(image).digest)
        old = too_old_for_zstd(self.headers.get("User-Agent", ""))
        if old is not None and digest in self.server.catalog.zstd:
            self._note = f"refused: zstd layers to Docker {old[:40]}"
            return self._error(
                404, "MANIFEST_UNKNOWN",
                f"{repo.name}:{ref[:80]} has zstd layers and Docker {old[:40]} (before 23.0) cannot read them: "
                "serve this bundle with `bundle-import serve --compression gzip` (same image IDs), "
                "or pull with Docker >= 23, containerd >= 1.5 or podman",
                {"name": repo.name, "reference": ref[:200]})
        blob = self.server.catalog.blobs[digest]
        self._send_blob(blob, blob.media_type)

    def _referrers(self, name: str, digest: str, query: str) -> None:
        """The OCI 1.1 Referrers API: the carried manifests whose subject is ``digest``."""
        repo = self._repository(name)
        if repo is None:
            return None
        if not is_digest(digest):
            return self._error(400, "DIGEST_INVALID", "invalid digest", {"digest": digest[:200]})
        try:  # bounded like every query: a flood of fields is a bad request, not work
            artifact_type = (parse_qs(query, max_num_fields=16).get("artifactType") or [""])[0][:512]
        except ValueError:
            return self._error(400, "UNSUPPORTED", "too many query parameters", None)
        body = repo.artifacts.index(digest, artifact_type)
        self._headers(200, len(body), "application/vnd.oci.image.index.v1+json",
                      {"OCI-Filters-Applied": "artifactType"} if artifact_type else None)
        if self.command != "HEAD":
            self._write(body)
        return None

    def _blob(self, repo: Repository, ref: str) -> None:
        if not is_digest(ref):
            return self._error(400 if ref.startswith("sha256:") else 404,
                               "DIGEST_INVALID" if ref.startswith("sha256:") else "BLOB_UNKNOWN",
                               "provided digest did not match uploaded content"
                               if ref.startswith("sha256:") else "blob unknown to registry", {"digest": ref[:200]})
        blob = self.server.catalog.blobs.get(ref)
        if blob is None or ref not in repo.blobs or not blob.stored:
            return self._error(404, "BLOB_UNKNOWN", "blob unknown to registry" if blob is None or blob.stored
                               else "blob unknown to registry (a layer this delta bundle leaves out)",
                               {"digest": ref})
        self._send_blob(blob, "application/octet-stream")

    # --- bytes ------------------------------------------------------------------------------

    def _range(self, size: int) -> Optional[Tuple[int, int]]:
        """(first, last) of a single ``Range: bytes=`` the client asked for; None: the whole blob.
        Raises ValueError for a range outside the blob."""
        value = self.headers.get("Range", "")
        m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", value) if value else None
        if m is None or not (m.group(1) or m.group(2)):
            return None  # absent, several ranges or another unit: the whole blob (RFC 9110 allows it)
        if not m.group(1):  # the last N bytes
            n = int(m.group(2))
            if n == 0 or size == 0:
                raise ValueError(value)
            return max(0, size - n), size - 1
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else size - 1
        if first >= size or last < first:
            raise ValueError(value)
        return first, min(last, size - 1)

    def _send_blob(self, blob: Blob, content_type: str) -> None:
        extra = {"Docker-Content-Digest": str(blob.digest), "Accept-Ranges": "bytes",
                 "ETag": f'"{blob.digest}"'}
        try:
            wanted = self._range(blob.size)
        except ValueError:
            self._headers(416, 0, "application/json", {**extra, "Content-Range": f"bytes */{blob.size}"})
            return
        first, last = wanted if wanted is not None else (0, blob.size - 1)
        try:  # the identity first: a file rewritten while it is hashed is not remembered as verified
            identity = blob_identity(self.server.bundle, blob.rel, blob.path)
            f = open(blob.path, "rb") if blob.path is not None else self.server.bundle.open(blob.rel)  # noqa: SIM115
        except (OSError, BundleError) as e:
            self._damaged(blob, f"it cannot be opened ({getattr(e, 'message', None) or e})")
            self._error(500, "BLOB_UNKNOWN", "blob can no longer be read from the bundle; the server goes on",
                        {"digest": str(blob.digest)}, close=True)
            return
        with f:
            if wanted is not None:
                extra["Content-Range"] = f"bytes {first}-{last}/{blob.size}"
            self._headers(206 if wanted is not None else 200, last - first + 1, content_type, extra)
            if self.command == "HEAD" or blob.size == 0:
                return
            if wanted is not None and self.server.verified.matches(str(blob.digest), identity):
                self._send_range(f, blob, first, last)
            else:
                self._stream(f, blob, first, last, identity)

    def _send_range(self, f: Any, blob: Blob, first: int, last: int) -> None:
        """Bytes ``first..last`` of a blob hashed whole before, from its unchanged file."""
        left = last - first + 1
        while left > 0:
            try:
                f.seek(last + 1 - left)
                data = f.read(min(CHUNK, left))
            except OSError as e:
                return self._cut(blob, f"a read error ({e})")
            if not data:
                return self._cut(blob, f"it ends {left} bytes early")
            self._write(data)
            left -= len(data)
        return None

    def _stream(self, f: Any, blob: Blob, first: int, last: int, identity: Any) -> None:
        """Send bytes ``first..last`` of the blob while hashing all of it; the last piece of the
        range goes out only once the whole blob matched its digest and size."""
        h = hashlib.sha256()
        pos = 0
        pending = b""
        while True:
            try:
                data = f.read(CHUNK)
            except OSError as e:  # the medium failed or the file went away mid-read
                return self._cut(blob, f"a read error after {pos} bytes ({e})")
            if not data:
                break
            h.update(data)
            lo, hi = max(first - pos, 0), min(last + 1 - pos, len(data))
            if lo < hi:
                if pending:
                    self._write(pending)
                pending = data[lo:hi]
            pos += len(data)
            if pos > blob.size:
                break
        self.server.stats.hashed(pos)
        if pos == blob.size and h.hexdigest() == blob.digest.hex:
            self.server.verified.remember(str(blob.digest), identity)
            self._write(pending)
            return None
        return self._cut(blob, f"{pos} bytes" if pos != blob.size else f"sha256:{h.hexdigest()}")

    def _damaged(self, blob: Blob, found: str) -> None:
        """The blob no longer matches bundle.json: remembered for the exit status, one typed line."""
        self.server.verified.forget(str(blob.digest))
        self.server.stats.damaged(f"{blob.digest} (found {found})")
        self.server.say(f"serve: error[{ServedBlobDamaged.reference}] serving {blob.digest} to "
                        f"{self.address_string()}: expected the bytes bundle.json pins, found {found}; this "
                        "response fails, the server goes on")

    def _cut(self, blob: Blob, found: str) -> None:
        """End the response before its last bytes, so no client stores them."""
        self._note = f"CUT: {blob.digest} no longer matches bundle.json (found {found})"
        self._damaged(blob, found)
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Busy(_Handler):
    """A connection beyond ``--max-connections``: its request read (bounded as any), answered 503."""

    def handle_one_request(self) -> None:
        super().handle_one_request()
        self.close_connection = True

    def do_GET(self) -> None:
        slots = self.server.slots
        if self._refusal == CLIENT_FULL:
            self._note = "refused: this client's share of the connections is taken"
            message = (f"this client address holds {slots.per_client} connections already "
                       "(--max-connections-per-client); close one or retry shortly")
        else:
            message = f"this server is serving {slots.limit} connections (--max-connections); retry shortly"
        try:
            self._error(503, "UNAVAILABLE", message, close=True, extra={"Retry-After": "1"})
        finally:
            self._access()

    do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = do_GET


def serve_forever(server: BundleRegistry) -> None:
    """Answer requests until a signal raises in the main thread (importer/streams/signals.py)."""
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


def damaged_error(server: BundleRegistry, where: str) -> Optional[ServedBlobDamaged]:
    """The error a run ends with when it cut responses (None: every blob matched)."""
    cut = server.stats.cut
    if not cut:
        return None
    return ServedBlobDamaged(
        f"serving {where}: expected every blob to match bundle.json, found {len(cut)} blob(s) changed "
        f"after verification: {', '.join(cut[:5])}",
        hint="their responses were cut before the last bytes or refused, so no client stored them; re-copy the bundle "
             "from the source medium and serve it again")


_LOG_LOCK = threading.Lock()


def stderr_log(line: str) -> None:
    """One line on stderr; lines of concurrent requests never interleave."""
    with _LOG_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
