"""A small OCI distribution-API client (stdlib ``http.client``), shared by ``bundle push`` and
the registry sink (``bundle-import --engine registry``).

- Blobs: HEAD (present -> skip), cross-repository mount, or POST an upload session, PATCH it in
  chunks with ``Content-Range``, PUT ``?digest=``. After a dropped connection the upload's
  offset is queried (GET on the session) and the upload resumes there; a registry that cannot
  resume a cut request (distribution 2.x cancels the session: "upload resumed at wrong offset")
  gets the blob again in a new session. The bytes sent are hashed and must match the digest.
- Retries with exponential backoff on transient failures only: connection reset or dropped,
  timeouts, 5xx, 429 (honouring Retry-After). Never on other 4xx.
- Manifests are PUT with their exact bytes and their own media type; read back by GET.
- Auth: anonymous, Basic, or the Bearer token flow, as the registry's ``WWW-Authenticate`` asks
  (importer/registry/auth.py). Credentials are never printed.
- Logins and CA certificates come from the command's :class:`RegistryAccess`
  (importer/registry/access.py: one resolver of logins, one of CA files, for every command).
- Like Docker, a registry on 127.0.0.0/8, ::1 or localhost is "insecure" by default: HTTPS
  without certificate checks first, then plain HTTP; not when it has a CA of its own
  (``--cert-dir``, certs.d): then it is checked against it.
- The first contact (:meth:`RegistryClient.ping`) fails at once when nothing can be reached (a
  refused connection, an unknown host, no route): no retries, so a push or an import learns it
  before verifying every byte."""

from __future__ import annotations

import errno
import hashlib
import http.client
import ipaddress
import random
import re
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, ContextManager, Dict, List, Optional, Tuple, Type

from importer import __version__
from importer.errors import (
    DigestMismatch,
    Interrupted,
    InvalidReference,
    LimitExceeded,
    RegistryAuthError,
    RegistryError,
    RegistryUnreachable,
    UsageError,
)
from importer.format.digest import CHUNK, Digest
from importer.format.mediatypes import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST
from importer.format.reference import (
    split_host_path,
    split_host_port,
    split_reference,
    split_registry,
    valid_path,
    valid_tag,
)
from importer.registry.access import RegistryAccess
from importer.registry.auth import Credentials, fetch_token, parse_challenge
from importer.registry.redirects import REDIRECTS, Origin, open_url

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: isdigit() also takes superscripts, int() other scripts' digits

DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_ACCEPT = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_MANIFEST_LIST))
DEFAULT_CHUNK = 16 * 1024 * 1024
DEFAULT_ATTEMPTS = 6
MAX_RESPONSE = 16 * 1024 * 1024
USER_AGENT = f"sneakernet/{__version__}"

_HOST_RE = re.compile(r"(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]{1,5})?")
_RANGE_RE = re.compile(r"(?:bytes=)?0-([0-9]+)")

Opener = Callable[[], ContextManager[BinaryIO]]


# ================================================================ names


@dataclass(frozen=True)
class RegistryTarget:
    """``HOST[:PORT][/NAMESPACE]``: where images go, as the registry is named (not necessarily
    where this process connects: through an SSH tunnel that is a local port)."""

    host: str
    namespace: str = ""

    def repository(self, path: str) -> str:
        return f"{self.namespace}/{path}" if self.namespace else path

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}" if self.namespace else self.host


def parse_target(text: str) -> RegistryTarget:
    """Parse ``HOST[:PORT][/NAMESPACE]`` (no scheme, no tag)."""
    if "://" in text:
        raise UsageError(f"reading the registry {text!r}: expected HOST[:PORT][/NAMESPACE], found a URL",
                         hint="drop the scheme; a registry on loopback (or with --insecure) may speak plain HTTP")
    host, namespace = split_registry(text.strip())
    namespace = namespace.strip("/")
    if not _HOST_RE.fullmatch(host):
        raise UsageError(f"reading the registry {text!r}: expected a host name or address (with :PORT), found {host!r}")
    if namespace and not valid_path(namespace):
        raise UsageError(f"reading the registry {text!r}: expected a lowercase namespace path "
                         f"(a-z, 0-9, '.', '_', '-'), found {namespace!r}")
    return RegistryTarget(host, namespace)


def _push_host(first: str) -> bool:
    """A ref's first component is a registry host to drop when pushing (``[::1]`` is not one here)."""
    return "." in first or ":" in first or first == "localhost"


def is_loopback(hostname: str) -> bool:
    if hostname == "localhost" or hostname.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Destination:
    """Where one bundle ref goes: ``repository`` (namespace included) and ``tag`` ("" = by digest)."""

    repository: str
    tag: str

    def ref(self, target: RegistryTarget) -> str:
        name = f"{target.host}/{self.repository}"
        return f"{name}:{self.tag}" if self.tag else name


def map_ref(ref: str, target: RegistryTarget) -> Destination:
    """``my/train:1`` -> ``NAMESPACE/my/train`` + ``1``; a registry host in the ref is dropped
    (``registry.example:5000/x/y:2`` -> ``x/y``); a digest in the ref is dropped (the bundle's
    manifest is pushed by its own digest)."""
    name, tag, _digest = split_reference(ref)
    path = split_host_path(name, _push_host)[1]
    if not valid_path(path):
        raise InvalidReference(
            f"pushing {ref}: expected a repository path of lowercase components, found {path!r}",
            hint="re-tag the image with a lowercase name before exporting",
        )
    if tag and not valid_tag(tag):
        raise InvalidReference(f"pushing {ref}: expected a tag of [A-Za-z0-9_.-] (max 128), found {tag!r}")
    return Destination(target.repository(path), tag)


# ================================================================ HTTP


@dataclass
class Response:
    status: int
    headers: Any  # http.client.HTTPMessage: case-insensitive get()
    body: bytes

    def header(self, name: str) -> Optional[str]:
        value = self.headers.get(name)
        return str(value) if value is not None else None


@dataclass
class Stats:
    requests: int = 0
    retries: int = 0
    resumes: int = 0
    restarts: int = 0
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)

    def to_dict(self) -> Dict[str, int]:
        return {"requests": self.requests, "retries": self.retries, "resumes": self.resumes,
                "restarts": self.restarts, "bytesSent": self.bytes_sent}


class _TLSConnection(http.client.HTTPSConnection):
    """HTTPS to ``addr`` (e.g. a tunnel's local port) checking the certificate of ``server_name``."""

    def __init__(self, addr: str, port: int, *, server_name: str, context: ssl.SSLContext,
                 timeout: float) -> None:
        super().__init__(addr, port, timeout=timeout, context=context, blocksize=CHUNK)
        self._server_name = server_name
        self._ctx = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self._server_name)


class _Interrupted(Exception):
    """An upload request did not complete; the upload loop queries the offset and goes on."""


class _ChunksRefused(Exception):
    """The registry refused a chunked PATCH outright (405, 501, 415, or 400 on the first chunk):
    the blob goes in one monolithic PUT instead."""


class _Slice:
    """``n`` bytes of ``src`` from its current position, hashed and counted as they are sent."""

    def __init__(self, src: BinaryIO, n: int, hasher: Any, stats: Stats) -> None:
        self._src = src
        self._left = n
        self._hasher = hasher
        self._stats = stats

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        want = self._left if size is None or size < 0 else min(size, self._left)
        data = self._src.read(min(want, CHUNK))
        if not data:
            raise _Interrupted("the bundle file ended early (changed since it was verified?)")
        self._left -= len(data)
        self._hasher.update(data)
        self._stats.add(bytes_sent=len(data))
        return bytes(data)


_TRANSIENT: Tuple[Type[BaseException], ...] = (OSError, http.client.HTTPException, _Interrupted)
#: what a registry that wants mutual TLS answers a client without an accepted certificate: no retry helps
CLIENT_CERT_ALERTS = frozenset({"TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE",
                                "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_UNKNOWN"})
_NO_ROUTE = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)


def unreachable(e: BaseException) -> str:
    """Why nothing can be reached (a refused connection, an unknown host, no route), or "" for a
    failure worth retrying."""
    if isinstance(e, ConnectionRefusedError):
        return "the connection was refused (nothing listens there)"
    if isinstance(e, socket.gaierror):
        return f"the host name does not resolve ({e.strerror or e})"
    if isinstance(e, OSError) and e.errno in _NO_ROUTE:
        return f"no route to it ({e.strerror or e})"
    return ""


def _error_text(resp: Response) -> str:
    """The registry's error codes and messages (distribution's {"errors": [...]})."""
    try:
        import json

        doc = json.loads(resp.body.decode("utf-8")) if resp.body else None
    except (ValueError, RecursionError):  # a hostile error body nested past the stack
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("errors"), list):
        parts = []
        for err in doc["errors"][:5]:
            if isinstance(err, dict):
                parts.append(f"{err.get('code', '?')}: {err.get('message', '')}".strip())
        if parts:
            return "; ".join(parts)
    return resp.body[:200].decode("utf-8", "replace").strip()


class RegistryClient:
    """One registry; safe to share between threads (one connection per thread)."""

    def __init__(
        self,
        target: RegistryTarget,
        *,
        connect_to: Optional[Tuple[str, int]] = None,
        access: Optional[RegistryAccess] = None,
        timeout: float = 120.0,
        chunk_size: int = DEFAULT_CHUNK,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff: float = 0.5,
        log: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.target = target
        self.access = access = access or RegistryAccess()
        #: send the credentials to a token realm on another host too (HTTPS only; --allow-realm-credentials)
        self.realm_credentials = access.realm_credentials
        hostname, port = split_host_port(target.host)
        self.server_name = hostname
        self.connect_to = connect_to or (hostname, port or 0)
        self.tunnelled = connect_to is not None
        #: --insecure, or a loopback registry without a CA of its own (Docker's default)
        self.insecure = access.insecure or (is_loopback(hostname) and not access.certs.ca_files(target.host))
        self.timeout = timeout
        self.chunk_size = max(1, chunk_size)
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.log = log or (lambda _msg: None)
        self.scheme = "https"
        self.tls_error = ""
        self.api_version = ""
        self.stats = Stats()
        self._ssl: Optional[ssl.SSLContext] = None
        self._auth: Dict[str, str] = {}
        self._extra_scopes: Dict[str, List[str]] = {}
        self._local = threading.local()
        self._all: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.cancelled = threading.Event()
        #: the registry refused chunked uploads once: every later blob goes in one PUT
        self.monolithic = False

    # === connections
    def _new_connection(self) -> http.client.HTTPConnection:
        addr, port = self.connect_to
        if self.scheme == "https":
            ctx = self.ssl_context()
            conn: http.client.HTTPConnection = _TLSConnection(
                addr, port or 443, server_name=self.server_name, context=ctx, timeout=self.timeout)
        else:
            conn = http.client.HTTPConnection(addr, port or 80, timeout=self.timeout, blocksize=CHUNK)
        with self._lock:
            self._all.append(conn)
        return conn

    def ssl_context(self) -> ssl.SSLContext:
        """The registry's TLS setting: the system's CAs and its own (certs.d, --cert-dir), or no
        checks for an insecure registry; also for its token realm and blob storage."""
        with self._lock:
            if self._ssl is None:
                self._ssl = self.access.certs.context(self.target.host, verify=not self.insecure)
            return self._ssl

    def _conn(self) -> http.client.HTTPConnection:
        conn: Optional[http.client.HTTPConnection] = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._new_connection()
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def cancel(self) -> None:
        """Stop every request in flight (other threads): close the sockets, refuse new requests."""
        self.cancelled.set()
        self.close()

    def _check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise Interrupted(f"pushing to {self.target}: stopped")

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # === one request, no retry
    def _send(self, method: str, path: str, headers: Optional[Dict[str, str]], body: Any, repo: str,
              limit: int = MAX_RESPONSE) -> Response:
        self._check_cancelled()
        conn = self._conn()
        hdrs = {"Host": self.target.host, "User-Agent": USER_AGENT}
        auth = self._auth.get(repo) or self._auth.get("")
        if auth:
            hdrs["Authorization"] = auth
        if body is None and method in ("PUT", "POST", "PATCH"):
            hdrs["Content-Length"] = "0"
        hdrs.update(headers or {})
        self.stats.add(requests=1)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            declared = (r.getheader("Content-Length") or "").strip()
            too_big = method != "HEAD" and bool(_DIGITS.fullmatch(declared)) and int(declared) > limit  # refused unread
            data = b"" if too_big else r.read(limit + 1)  # also for HEAD: reading (nothing) frees the connection
        except BaseException:
            self._drop()
            raise
        if too_big or len(data) > limit:
            self._drop()
            raise LimitExceeded(f"{method} {path} on {self.target.host}: expected an answer of at most {limit} bytes, "
                                f"found {f'a Content-Length of {declared}' if too_big else 'more'}",
                                hint="the registry answered with far more than such a document holds; "
                                "do not trust this registry")
        if r.will_close:
            self._drop()
        return Response(r.status, r.msg, data)

    def _pause(self, attempt: int, resp: Optional[Response] = None) -> None:
        delay = min(8.0, self.backoff * (2 ** max(0, attempt - 1)))
        delay *= 0.75 + random.random() / 2  # noqa: S311 - jitter, not cryptography
        retry_after = resp.header("Retry-After") if resp is not None else None
        if retry_after and _DIGITS.fullmatch(retry_after.strip()):
            delay = max(delay, min(60.0, float(retry_after.strip())))
        if self.cancelled.wait(delay):
            self._check_cancelled()

    def request(self, method: str, path: str, *, what: str, ok: Tuple[int, ...] = (200,),
                headers: Optional[Dict[str, str]] = None, body: Optional[bytes] = None, repo: str = "",
                limit: int = MAX_RESPONSE, fail_fast: bool = False) -> Response:
        """One request with retries on transient failures and the auth handshake on 401.
        ``fail_fast``: a registry that cannot be reached at all (:func:`unreachable`) is not retried."""
        attempt = 0
        auth_rounds = 0
        while True:
            resp: Optional[Response] = None
            try:
                resp = self._send(method, path, headers, body, repo, limit)
            except ssl.SSLCertVerificationError as e:
                raise RegistryError(
                    f"{what}: expected a trusted TLS certificate from {self.target.host}, found {e.verify_message}",
                    hint=self.access.certs.hint(self.target.host),
                ) from e
            except _TRANSIENT as e:
                if isinstance(e, ssl.SSLError) and getattr(e, "reason", None) in CLIENT_CERT_ALERTS:
                    raise RegistryError(
                        f"{what}: expected {self.target.host} to accept the TLS connection, found it wants a client "
                        f"certificate it accepts (TLS alert {e.reason})",
                        hint=self.access.certs.client_hint(self.target.host),
                    ) from e
                self._check_cancelled()
                why = unreachable(e) if fail_fast else ""
                if why:
                    raise RegistryUnreachable(
                        f"{what}: expected the registry to answer at {self._address()}, found {why}",
                        hint="check the registry's address and port and that it runs"
                        + (" (through the SSH tunnel: REGISTRY is the address as the SSH host sees it)"
                           if self.tunnelled else ""),
                    ) from e
                last = f"{type(e).__name__}: {e}"
            else:
                if resp.status == 401 and auth_rounds < 2:
                    auth_rounds += 1
                    self._authenticate(resp, repo, what)
                    continue
                if resp.status == 401:
                    raise RegistryAuthError(f"{what}: the registry refused the credentials (HTTP 401)",
                                            context=_error_text(resp) or None, hint=self._auth_hint(repo, True))
                if resp.status in ok:
                    return resp
                if resp.status != 429 and resp.status < 500:
                    raise self._refused(what, resp, ok)
                last = f"HTTP {resp.status} {_error_text(resp)}".strip()
            attempt += 1
            if attempt >= self.attempts:
                raise RegistryError(
                    f"{what}: expected an answer from {self.target.host}, found failures {attempt} times in a row "
                    f"(last: {last})",
                    hint="check that the registry (and the tunnel, if any) is up and run the command again "
                    "(a push resumes: blobs already there are skipped)",
                )
            self.stats.add(retries=1)
            self.log(f"{what}: {last}; retrying")
            self._pause(attempt, resp)

    def _refused(self, what: str, resp: Response, ok: Tuple[int, ...]) -> RegistryError:
        text = _error_text(resp)
        cls = RegistryAuthError if resp.status == 403 else RegistryError
        return cls(
            f"{what}: expected HTTP {'/'.join(map(str, ok))}, found {resp.status}" + (f" ({text})" if text else ""),
            hint=self._auth_hint("", True) if resp.status == 403 else "the registry refused the request; see its "
            "message",
        )

    # === auth
    def _creds(self, repo: str) -> Optional[Credentials]:
        """The login for ``repo`` (the namespace pushed to, for the registry as a whole)."""
        return self.access.logins.credentials(self.target.host, repo or self.target.namespace)

    def _address(self) -> str:
        addr, port = self.connect_to
        shown = f"[{addr}]" if ":" in addr else addr
        return f"{shown}:{port or (443 if self.scheme == 'https' else 80)}"

    def _auth_hint(self, repo: str = "", refused: bool = False) -> str:
        return self.access.logins.hint(self.target.host, repo or self.target.namespace, refused=refused)

    def _authenticate(self, resp: Response, repo: str, what: str) -> None:
        challenge = resp.header("WWW-Authenticate") or ""
        scheme, params = parse_challenge(challenge)
        creds = self._creds(repo)
        if scheme == "basic":
            if creds is None:
                raise RegistryAuthError(f"{what}: the registry asks for a login, found no credentials",
                                        hint=self._auth_hint(repo))
            self._auth[repo] = creds.basic_header()
        elif scheme == "bearer":
            scopes = [params["scope"]] if params.get("scope") else []
            scopes += [s for s in self._extra_scopes.get(repo, []) if s not in scopes]
            self._auth[repo] = fetch_token(params, scopes, creds, context=self.ssl_context(), timeout=self.timeout,
                                           registry=self.origin(), realm_credentials=self.realm_credentials,
                                           hint=self._auth_hint(repo, creds is not None))
        else:
            raise RegistryAuthError(f"{what}: expected a Basic or Bearer challenge, found {challenge[:100]!r}")

    def origin(self) -> Origin:
        """(scheme, host, port) of the registry as it is named: where its credentials may go."""
        _, port = split_host_port(self.target.host)
        return self.scheme, self.server_name.lower(), port or (443 if self.scheme == "https" else 80)

    def _follow(self, location: str, what: str, headers: Dict[str, str],
                repo: str) -> Tuple[Any, http.client.HTTPConnection]:
        """A storage redirect followed: the registry's credential only to the registry itself."""
        base = f"{self.scheme}://{self.target.host}/"
        return open_url(urllib.parse.urljoin(base, location), what=what, headers={"User-Agent": USER_AGENT, **headers},
                        auth=self._auth_header(repo), auth_origin=self.origin(), context=self.ssl_context(),
                        timeout=self.timeout, own=self._new_connection)

    def _auth_header(self, repo: str) -> Optional[str]:
        return self._auth.get(repo) or self._auth.get("")

    # === the API
    def ping(self) -> str:
        """``GET /v2/``: the registry answers, and takes the login when it wants one (the cheap
        check before a long verification). An insecure registry is tried once over HTTPS
        (certificate not checked), then over plain HTTP. Nothing to reach (refused, unknown host,
        no route) fails at once, without retries."""
        if self.insecure:
            self.scheme = "https"
            try:
                self._send("GET", "/v2/", None, None, "")
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                self.scheme = "http"  # an insecure registry without TLS (reported as `scheme`)
                self.tls_error = f"{type(e).__name__}: {e}"
        resp = self.request("GET", "/v2/", what=f"connecting to the registry {self.target.host}", ok=(200,),
                            fail_fast=True)
        self.api_version = resp.header("Docker-Distribution-Api-Version") or "registry/2.0"
        return self.api_version

    def blob_size(self, repo: str, digest: Digest) -> Optional[int]:
        """Size of the blob in ``repo``, or None when the registry does not have it there."""
        r = self.request("HEAD", f"/v2/{repo}/blobs/{digest}", ok=(200, 307, 404), repo=repo,
                         what=f"looking for blob {digest.short} in {repo}")
        if r.status == 404:
            return None
        length = r.header("Content-Length")
        return int(length) if length and _DIGITS.fullmatch(length) and r.status == 200 else -1

    def manifest_digest(self, repo: str, reference: str) -> Optional[str]:
        r = self.request("HEAD", f"/v2/{repo}/manifests/{reference}", ok=(200, 404), repo=repo,
                         headers={"Accept": MANIFEST_ACCEPT}, what=f"looking for {repo}:{reference}")
        return r.header("Docker-Content-Digest") if r.status == 200 else None

    def get_manifest(self, repo: str, reference: str, limit: int) -> Optional[Tuple[bytes, str, str]]:
        """(exact bytes, media type, Docker-Content-Digest) or None when absent."""
        r = self.request("GET", f"/v2/{repo}/manifests/{reference}", ok=(200, 404), repo=repo, limit=limit,
                         headers={"Accept": MANIFEST_ACCEPT}, what=f"reading back {repo}:{reference}")
        if r.status == 404:
            return None
        return r.body, (r.header("Content-Type") or ""), (r.header("Docker-Content-Digest") or "")

    def put_manifest(self, repo: str, reference: str, raw: bytes, media_type: str) -> str:
        r = self.request("PUT", f"/v2/{repo}/manifests/{reference}", ok=(201, 200, 202), repo=repo, body=raw,
                         headers={"Content-Type": media_type, "Content-Length": str(len(raw))},
                         what=f"pushing the manifest {repo}:{reference}")
        return r.header("Docker-Content-Digest") or ""

    def get_blob(self, repo: str, digest: Digest, limit: int) -> bytes:
        """A small blob (a config), following a storage redirect."""
        r = self.request("GET", f"/v2/{repo}/blobs/{digest}", ok=(200, 307, 302), repo=repo, limit=limit,
                         what=f"reading back blob {digest.short} of {repo}")
        if r.status == 200:
            return r.body
        what = f"reading back blob {digest.short}"
        resp, conn = self._follow(r.header("Location") or "", what, {}, repo)
        try:
            if resp.status != 200:
                raise RegistryError(f"{what}: expected HTTP 200 from the blob's storage, found {resp.status}")
            data: bytes = resp.read(limit + 1)
        finally:
            conn.close()
        if len(data) > limit:
            raise LimitExceeded(f"{what}: expected at most {limit} bytes, found more")
        return data

    def open_blob(self, repo: str, digest: Digest, *, offset: int = 0, what: str = "",
                  size: Optional[int] = None) -> Tuple[Any, int]:
        """A blob's bytes as a stream, from ``offset`` (``Range``), following a storage redirect:
        (a readable the caller closes, the offset its first byte is at: 0 when the registry sent
        the whole blob). The auth handshake runs first (HEAD, with retries); a blob the registry
        does not hold is a RegistryError naming it. ``size`` (the descriptor's): an answer whose
        Content-Length says more is refused before its body is read (LimitExceeded)."""
        what = what or f"reading blob {digest.short} of {repo}"
        if offset == 0 or not self._auth:
            head = self.request("HEAD", f"/v2/{repo}/blobs/{digest}", ok=(200, 307, 302, 404), repo=repo, what=what)
            if head.status == 404:
                raise RegistryError(f"{what}: expected the blob in {self.target.host}/{repo}, found none (HTTP 404)",
                                    hint="the image's manifest names a blob its repository lacks; push it again")
        self._check_cancelled()
        hdrs = {"Host": self.target.host, "User-Agent": USER_AGENT}
        if offset:
            hdrs["Range"] = f"bytes={offset}-"
        auth = self._auth_header(repo)
        if auth:
            hdrs["Authorization"] = auth
        conn = self._new_connection()  # its own connection: the stream holds it while it is read
        conn.request("GET", f"/v2/{repo}/blobs/{digest}", headers=hdrs)
        r = conn.getresponse()
        if r.status in REDIRECTS:
            location = r.getheader("Location") or ""
            conn.close()  # the body of a redirect is not read: it may not end
            if not location:
                raise RegistryError(f"{what}: expected a Location in the redirect (HTTP {r.status}), found none")
            r, conn = self._follow(location, what, {"Range": f"bytes={offset}-"} if offset else {}, repo)
            if r.status not in (200, 206):
                r.close()
                conn.close()
                raise http.client.HTTPException(f"{what}: HTTP {r.status} from the blob's storage")
        if r.status in (200, 206):
            _check_length(r, size, offset if r.status == 206 else 0, what, conn)
        if r.status not in (200, 206):
            body = r.read(4096)
            conn.close()
            resp = Response(r.status, r.msg, body)
            if r.status == 401:  # a token that expired mid-export: the next attempt authenticates again
                self._auth.pop(repo, None)
                raise http.client.HTTPException(f"{what}: HTTP 401")
            if r.status == 429 or r.status >= 500:
                raise http.client.HTTPException(f"{what}: HTTP {r.status} {_error_text(resp)}".strip())
            raise self._refused(what, resp, (200, 206))
        return _Owned(r, conn), (offset if r.status == 206 else 0)

    def _location(self, resp: Response, current: str = "") -> str:
        loc = resp.header("Location") or current
        if not loc:
            raise RegistryError(f"expected a Location header in the registry's answer (HTTP {resp.status}), found none")
        parts = urllib.parse.urlsplit(loc)
        path = parts.path if parts.path.startswith("/") else urllib.parse.urljoin(current or "/", parts.path)
        return path + (f"?{parts.query}" if parts.query else "")

    def mount_blob(self, repo: str, digest: Digest, from_repo: str) -> bool:
        """Cross-repository mount; False when the registry opened an upload instead (cancelled)."""
        self._extra_scopes[repo] = [f"repository:{from_repo}:pull"]
        query = urllib.parse.urlencode({"mount": str(digest), "from": from_repo})
        r = self.request("POST", f"/v2/{repo}/blobs/uploads/?{query}", ok=(201, 202), repo=repo,
                         what=f"mounting blob {digest.short} into {repo} from {from_repo}")
        if r.status == 201:
            return True
        self._cancel(repo, self._location(r))
        return False

    def _cancel(self, repo: str, location: str) -> None:
        try:
            self._send("DELETE", location, None, None, repo)
        except (RegistryError, OSError, http.client.HTTPException, _Interrupted):
            self._drop()

    def _start_upload(self, repo: str, what: str) -> str:
        r = self.request("POST", f"/v2/{repo}/blobs/uploads/", ok=(202,), repo=repo, what=what)
        return self._location(r)

    def upload_status(self, repo: str, location: str, what: str) -> Optional[Tuple[int, str]]:
        """(bytes the registry holds, session URL) of an upload; None when the session is gone."""
        r = self.request("GET", location, ok=(204, 200, 400, 404, 416), repo=repo,
                         what=f"{what}: asking the registry how much it received")
        if r.status not in (200, 204):
            return None
        m = _RANGE_RE.fullmatch((r.header("Range") or "0-0").strip())
        if m is None:
            return None
        end = int(m.group(1))
        return (end + 1 if end > 0 else 0), self._location(r, location)

    def upload_blob(self, repo: str, digest: Digest, size: int, opener: Opener,
                    on_bytes: Optional[Callable[[int], None]] = None) -> None:
        """Upload one blob in chunks; resume after interruptions; check the digest of what was sent.
        A registry that refuses chunks (:class:`_ChunksRefused`) gets it in one monolithic PUT."""
        what = f"uploading blob {digest.short} ({size} bytes) to {repo}"
        if self.monolithic:
            return self._upload_monolithic(repo, digest, size, opener, on_bytes, what)
        location = self._start_upload(repo, what)
        offset = 0
        hasher: Any = hashlib.sha256()
        hashed = 0  # hasher holds the sha256 of the first `hashed` bytes
        failures = 0
        while True:
            try:
                with opener() as src:
                    if hashed != offset:
                        hasher, hashed = _hash_prefix(src, offset), offset
                    src.seek(offset)
                    while offset < size:
                        n = min(self.chunk_size, size - offset)
                        before = hasher.copy()
                        try:
                            location = self._patch(repo, location, _Slice(src, n, hasher, self.stats), offset, n, what)
                        except _Interrupted:
                            hasher = before
                            raise
                        offset += n
                        hashed = offset
                        if on_bytes is not None:
                            on_bytes(n)
                sent = Digest("sha256", hasher.hexdigest())
                if sent != digest:
                    self._cancel(repo, location)
                    raise DigestMismatch(
                        f"{what}: expected the bytes to hash to {digest}, found {sent}",
                        hint="the bundle changed after it was verified; re-copy it and push again",
                    )
                self._finish(repo, location, digest, size, what)
                return
            except _ChunksRefused as e:
                self._cancel(repo, location)
                self.log(f"{what}: the registry refuses chunked uploads ({e}); sending each blob in one request")
                self.monolithic = True
                return self._upload_monolithic(repo, digest, size, opener, on_bytes, what)
            except _Interrupted as e:
                self._check_cancelled()
                failures += 1
                if failures >= self.attempts:
                    raise RegistryError(
                        f"{what}: expected the upload to complete, found it interrupted {failures} times "
                        f"(last: {e})",
                        hint="check the registry and the link; re-running the push skips what arrived",
                    ) from e
                self.log(f"{what}: interrupted at byte {offset} ({e}); asking the registry where to resume")
                self._pause(failures)
                if str(e) == "finished" and self.blob_size(repo, digest) == size:
                    return
                status = self.upload_status(repo, location, what)
                if status is None or status[0] > size:
                    self.log(f"{what}: the registry dropped the upload session; starting it again")
                    location = self._start_upload(repo, what)
                    offset = 0
                    self.stats.add(restarts=1)
                else:
                    offset, location = status
                    self.stats.add(resumes=1)
                    self.log(f"{what}: resuming at byte {offset}")

    def _patch(self, repo: str, location: str, body: _Slice, offset: int, n: int, what: str) -> str:
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(n),
                   "Content-Range": f"{offset}-{offset + n - 1}"}
        try:
            r = self._send("PATCH", location, headers, body, repo)
        except ssl.SSLCertVerificationError:
            raise
        except _TRANSIENT as e:
            raise _Interrupted(f"{type(e).__name__}: {e}") from e
        if r.status == 202:
            m = _RANGE_RE.fullmatch((r.header("Range") or "").strip())
            if m is not None and int(m.group(1)) != offset + n - 1:
                raise _Interrupted(f"the registry holds bytes 0-{m.group(1)}, expected 0-{offset + n - 1}")
            return self._location(r, location)
        if r.status == 401:
            self._authenticate(r, repo, what)
            raise _Interrupted("the registry asked to authenticate again")
        if r.status in (405, 415, 501) or (r.status == 400 and offset == 0):
            raise _ChunksRefused(f"HTTP {r.status} {_error_text(r)}".strip())
        if r.status in (404, 416, 429) or r.status >= 500:
            raise _Interrupted(f"HTTP {r.status} {_error_text(r)}".strip())
        raise self._refused(what, r, (202,))

    def _upload_monolithic(self, repo: str, digest: Digest, size: int, opener: Opener,
                           on_bytes: Optional[Callable[[int], None]], what: str) -> None:
        """The whole blob in one ``PUT <session>?digest=`` (the distribution spec's monolithic
        upload), for a registry that refuses chunks; a failed try starts a new session."""
        failures = 0
        while True:
            location = self._start_upload(repo, what)
            sep = "&" if "?" in location else "?"
            hasher: Any = hashlib.sha256()
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
            try:
                with opener() as src:
                    src.seek(0)
                    r: Optional[Response] = self._send("PUT", f"{location}{sep}digest={digest}", headers,
                                                       _Slice(src, size, hasher, self.stats), repo)
                last = ""
            except ssl.SSLCertVerificationError:
                raise
            except _TRANSIENT as e:
                self._check_cancelled()
                r, last = None, f"{type(e).__name__}: {e}"
            if r is not None and r.status in (201, 204):
                sent = Digest("sha256", hasher.hexdigest())
                if sent != digest:
                    raise DigestMismatch(f"{what}: expected the bytes to hash to {digest}, found {sent}",
                                         hint="the bundle changed after it was verified; re-copy it and push again")
                if on_bytes is not None:
                    on_bytes(size)
                return
            if r is not None and r.status == 401:
                self._authenticate(r, repo, what)
            elif r is not None and r.status != 429 and r.status < 500:
                raise self._refused(what, r, (201,))
            if r is not None:
                last = f"HTTP {r.status} {_error_text(r)}".strip()
            failures += 1
            if failures >= self.attempts:
                raise RegistryError(f"{what}: expected the upload (one request) to complete, found it failed "
                                    f"{failures} times (last: {last})",
                                    hint="check the registry and the link; re-running the push skips what arrived")
            self.stats.add(restarts=1)
            self.log(f"{what}: {last}; sending it again")
            self._pause(failures, r)

    def _finish(self, repo: str, location: str, digest: Digest, size: int, what: str) -> None:
        sep = "&" if "?" in location else "?"
        try:
            r = self._send("PUT", f"{location}{sep}digest={digest}", {"Content-Length": "0"}, None, repo)
        except _TRANSIENT as e:
            raise _Interrupted("finished") from e
        if r.status in (201, 204):
            return
        if r.status == 401:
            self._authenticate(r, repo, what)
            raise _Interrupted("finished")
        if r.status == 429 or r.status >= 500 or r.status == 404:
            raise _Interrupted("finished")
        if r.status == 400 and "DIGEST_INVALID" in _error_text(r):
            raise _Interrupted(f"the registry hashed the upload to something else ({_error_text(r)})")
        raise self._refused(what, r, (201,))


def _check_length(r: http.client.HTTPResponse, size: Optional[int], start: int, what: str,
                  conn: http.client.HTTPConnection) -> None:
    """A blob answer whose Content-Length is more than the descriptor's size allows is refused
    before its body is read."""
    declared = (r.getheader("Content-Length") or "").strip()
    if size is None or not _DIGITS.fullmatch(declared) or int(declared) <= size - start:
        return
    r.close()
    conn.close()
    raise LimitExceeded(f"{what}: expected at most {size - start} bytes (the descriptor says the blob has {size}), "
                        f"found a Content-Length of {declared}",
                        hint="the registry sends more than the image's manifest declares; do not trust this registry")


class _Owned:
    """An HTTP response body that closes its own connection."""

    def __init__(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> None:
        self.resp = resp
        self.conn = conn

    def read(self, n: int = -1) -> bytes:
        return self.resp.read(n)

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


def _hash_prefix(src: BinaryIO, offset: int) -> Any:
    """sha256 state of the first ``offset`` bytes of ``src`` (to resume hashing mid-blob)."""
    h = hashlib.sha256()
    src.seek(0)
    left = offset
    while left > 0:
        data = src.read(min(CHUNK, left))
        if not data:
            break
        h.update(data)
        left -= len(data)
    return h
