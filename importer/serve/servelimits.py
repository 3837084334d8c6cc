"""What keeps ``bundle-import serve`` answering under load and abuse (docs/security.md, "Serving
a bundle"): a deadline for each request head (idle and slow clients are closed, never waited on;
a new connection's deadline runs from its accept, so one that sends nothing is closed at
``--idle-timeout``, not later), a cap on connections held at once and each client address's share
of it, a budget of refused logins per client address, bounded request lines and heads, strict
paging parameters, and the memory of which blobs were already hashed whole (a Range request for
one of them is sent without hashing the whole blob again)."""

from __future__ import annotations

import http.client
import io
import ipaddress
import math
import os
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs

from importer.errors import UsageError
from importer.input.opened import OpenedBundle

DEFAULT_IDLE_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 64
CLIENT_SHARE = 4  # by default one client address holds at most 1/CLIENT_SHARE of --max-connections
LOGIN_FAILURES_BURST = 5  # refused logins a client address may have at once ...
LOGIN_FAILURES_PER_SECOND = 1.0  # ... and then this many a second; beyond: 429 without hashing
MAX_CLIENTS_TRACKED = 4096  # addresses whose refused logins are remembered
MAX_REQUEST_LINE = 8192  # longer: 414
MAX_REQUEST_HEAD = 64 * 1024  # request line and headers together; more: 431 (and at most 100 headers)
MIN_SEND_TIMEOUT = 60.0  # a client that takes no bytes for this long while a response is sent is dropped
MAX_PAGE = 10000  # the largest ``n=`` of a paged listing
MAX_LAST = 512  # the longest ``last=``


def default_per_client(max_connections: int) -> int:
    """A client address's share of ``max_connections`` when --max-connections-per-client is not given."""
    return max(1, math.ceil(max_connections / CLIENT_SHARE))


@dataclass(frozen=True)
class Limits:
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # seconds to send a whole request head (also between requests)
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # connections served at once; more get 503
    per_client: int = default_per_client(DEFAULT_MAX_CONNECTIONS)  # of them, held by one client address

    @property
    def send_timeout(self) -> float:
        return max(MIN_SEND_TIMEOUT, self.idle_timeout)


def checked_limits(idle_timeout: float, max_connections: int, per_client: Optional[int] = None) -> Limits:
    """The limits of the command line, or a UsageError naming the bad one (``per_client`` None:
    :func:`default_per_client`)."""
    if not 0.1 <= idle_timeout <= 3600:
        raise UsageError(f"reading --idle-timeout {idle_timeout}: expected seconds from 0.1 to 3600, found "
                         f"{idle_timeout}", hint=f"bundle-import serve BUNDLE --idle-timeout {DEFAULT_IDLE_TIMEOUT:g}")
    if not 1 <= max_connections <= 10000:
        raise UsageError(f"reading --max-connections {max_connections}: expected 1 to 10000, found "
                         f"{max_connections}", hint=f"bundle-import serve BUNDLE --max-connections "
                         f"{DEFAULT_MAX_CONNECTIONS}")
    if per_client is None:
        per_client = default_per_client(max_connections)
    if not 1 <= per_client <= max_connections:
        raise UsageError(f"reading --max-connections-per-client {per_client}: expected 1 to --max-connections "
                         f"({max_connections}), found {per_client}",
                         hint=f"bundle-import serve BUNDLE --max-connections-per-client "
                         f"{default_per_client(max_connections)} (the default: a quarter of --max-connections)")
    return Limits(idle_timeout, max_connections, per_client)


def client_key(host: str) -> str:
    """What one client is, for its share of the connections and its refused logins: its IPv4 address
    (an IPv4-mapped IPv6 address counts as that IPv4 address), or the /64 network of its IPv6 address
    (one host commonly holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class HeadTooLarge(http.client.LineTooLong):
    """The request head ran past MAX_REQUEST_HEAD (BaseHTTPRequestHandler answers it with 431)."""


class RequestReader(io.RawIOBase):
    """The raw reading side of one connection. While a request head is awaited (:meth:`begin_head`)
    every receive waits only for what is left of the head's deadline, and the head may take only so
    many bytes: a client dribbling header bytes is cut off at the deadline like an idle one."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self._deadline: Optional[float] = None
        self._budget: Optional[int] = None

    def readable(self) -> bool:
        return True

    def begin_head(self, deadline: float) -> None:
        """The next request head must be whole by ``deadline`` (``time.monotonic()``): every receive
        waits only for what is left of it, so bytes dribbled in do not move it."""
        self._deadline = deadline
        self._budget = MAX_REQUEST_HEAD

    def end_head(self, timeout: float) -> None:
        self._deadline = self._budget = None
        self._sock.settimeout(timeout)

    def readinto(self, b: Any) -> int:
        view = memoryview(b)
        if self._budget is not None:
            if self._budget <= 0:
                raise HeadTooLarge(f"a request head over {MAX_REQUEST_HEAD} bytes")
            view = view[:self._budget]
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            self._sock.settimeout(max(left, 0.0))  # past the deadline: only what has arrived already
            try:
                n = self._sock.recv_into(view)
            except (socket.timeout, BlockingIOError, ssl.SSLWantReadError):
                raise socket.timeout("no complete request head before the idle timeout") from None
        else:
            n = self._sock.recv_into(view)
        if self._budget is not None:
            self._budget -= n
        return n


SERVE, SERVER_FULL, CLIENT_FULL = "serve", "server-full", "client-full"


class Slots:
    """Connections being served, at most ``limit``, of them at most ``per_client`` from one client
    (:func:`client_key`); as many again may be busy being refused (503), again at most
    ``per_client`` of them from one client, so a client over its share cannot use up the refusals
    either."""

    def __init__(self, limit: int, per_client: Optional[int] = None) -> None:
        self.limit = limit
        self.per_client = per_client if per_client is not None else limit
        self._held = 0
        self._refusing = 0
        self._held_by: Dict[str, int] = {}
        self._refusing_by: Dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, client: str) -> Optional[str]:
        """SERVE: a slot to serve; SERVER_FULL or CLIENT_FULL: none (every slot taken, or this
        client holds its share), but one to answer 503; None: not even that (close unanswered)."""
        with self._lock:
            mine = self._held_by.get(client, 0)
            if mine < self.per_client and self._held < self.limit:
                self._held += 1
                self._held_by[client] = mine + 1
                return SERVE
            refusing = self._refusing_by.get(client, 0)
            if refusing < self.per_client and self._refusing < self.limit:
                self._refusing += 1
                self._refusing_by[client] = refusing + 1
                return CLIENT_FULL if mine >= self.per_client else SERVER_FULL
            return None

    def held_by(self, client: str) -> int:
        with self._lock:
            return self._held_by.get(client, 0)

    def release(self, client: str, taken: str) -> None:
        with self._lock:
            if taken == SERVE:
                self._held -= 1
                counts = self._held_by
            else:
                self._refusing -= 1
                counts = self._refusing_by
            left = counts.get(client, 0) - 1
            if left > 0:
                counts[client] = left
            else:
                counts.pop(client, None)


class LoginFailures:
    """Refused logins per client (:func:`client_key`): a bucket of ``burst`` that refills at ``rate``
    a second. A check that needs a hash reserves one first (:meth:`reserve`) and gives it back when
    the login was right (:meth:`refund`), so parallel connections of one client cannot run more
    hashes than its bucket holds; a client with an empty bucket is answered without any hash."""

    def __init__(self, burst: int = LOGIN_FAILURES_BURST, rate: float = LOGIN_FAILURES_PER_SECOND,
                 clock: Any = time.monotonic) -> None:
        self.burst = burst
        self.rate = rate
        self._clock = clock
        self._buckets: Dict[str, Tuple[float, float]] = {}  # client -> (tokens, when counted)
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, then = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - then) * self.rate)

    def reserve(self, client: str) -> float:
        """0: a hash may run (one refused login reserved); else the seconds until one may."""
        with self._lock:
            now = self._clock()
            tokens = self._tokens(client, now)
            if tokens < 1:
                self._buckets[client] = (tokens, now)
                return (1 - tokens) / self.rate
            if client not in self._buckets and len(self._buckets) >= MAX_CLIENTS_TRACKED:
                self._forget_full(now)
            self._buckets[client] = (tokens - 1, now)
            return 0.0

    def refund(self, client: str) -> None:
        """The login that reserved was right: it counts for nothing."""
        with self._lock:
            now = self._clock()
            if client in self._buckets:
                self._buckets[client] = (min(float(self.burst), self._tokens(client, now) + 1), now)

    def _forget_full(self, now: float) -> None:
        """Room for another client: drop those whose bucket is full again (they owe nothing), else all."""
        full = [c for c in self._buckets if self._tokens(c, now) >= self.burst]
        for c in full or list(self._buckets):
            del self._buckets[c]


class BadQuery(ValueError):
    """A paging parameter the server refuses (400): ``code`` is the registry error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def page_params(query: str) -> Tuple[Optional[int], str]:
    """``n`` (None: all) and ``last`` ("": from the start) of a catalog or tags listing; BadQuery
    for a parameter given twice, an ``n`` that is no number from 0 to MAX_PAGE, an overlong ``last``."""
    try:
        q = parse_qs(query, keep_blank_values=True, max_num_fields=20)
    except ValueError:
        raise BadQuery("UNSUPPORTED", "too many query parameters") from None
    for key in ("n", "last"):
        if len(q.get(key, [])) > 1:
            raise BadQuery("PAGINATION_NUMBER_INVALID" if key == "n" else "UNSUPPORTED",
                           f"the query parameter {key} is given {len(q[key])} times; expected it once")
    n: Optional[int] = None
    if "n" in q:
        n_text = q["n"][0]
        if not re.fullmatch(r"[0-9]{1,6}", n_text) or int(n_text) > MAX_PAGE:
            raise BadQuery("PAGINATION_NUMBER_INVALID",
                           f"n must be a number from 0 to {MAX_PAGE}, found {n_text[:40]!r}")
        n = int(n_text)
    last = (q.get("last") or [""])[0]
    if len(last) > MAX_LAST:
        raise BadQuery("UNSUPPORTED", f"last must be at most {MAX_LAST} characters, found {len(last)}")
    return n, last


def blob_identity(bundle: OpenedBundle, rel: str, local: Optional[str] = None) -> Tuple[Any, ...]:
    """What changes when the bytes behind ``rel`` are rewritten, replaced or removed: the stat of
    the blob file (folder; ``local``: a file serve made itself, e.g. a recompressed layer) or of the
    tar / every part. Raises OSError when one is gone."""
    paths: List[str] = [local] if local is not None else bundle.backing_files(rel)
    out: List[Tuple[int, ...]] = []
    for p in paths:
        st = os.stat(p)
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


class VerifiedBlobs:
    """Blobs hashed whole in this process and found to match, with the identity of their file then:
    a Range request for one whose file is unchanged is sent straight from the file."""

    def __init__(self) -> None:
        self._known: Dict[str, Tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def matches(self, digest: str, identity: Tuple[Any, ...]) -> bool:
        with self._lock:
            return self._known.get(digest) == identity

    def remember(self, digest: str, identity: Tuple[Any, ...]) -> None:
        with self._lock:
            self._known[digest] = identity

    def forget(self, digest: str) -> None:
        with self._lock:
            self._known.pop(digest, None)
