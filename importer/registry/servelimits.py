"""What keeps ``bundle-import serve`` answering under load and abuse (docs/security.md, "Serving
a bundle"): a deadline for each request head (idle and slow clients are closed, never waited on),
a cap on connections held at once, bounded request lines and heads, strict paging parameters,
and the memory of which blobs were already hashed whole (a Range request for one of them is sent
without hashing the whole blob again)."""

from __future__ import annotations

import http.client
import io
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs

from importer.errors import UsageError
from importer.input.opened import OpenedBundle

DEFAULT_IDLE_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 64
MAX_REQUEST_LINE = 8192  # longer: 414
MAX_REQUEST_HEAD = 64 * 1024  # request line and headers together; more: 431 (and at most 100 headers)
MIN_SEND_TIMEOUT = 60.0  # a client that takes no bytes for this long while a response is sent is dropped
MAX_PAGE = 10000  # the largest ``n=`` of a paged listing
MAX_LAST = 512  # the longest ``last=``


@dataclass(frozen=True)
class Limits:
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # seconds to send a whole request head (also between requests)
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # connections served at once; more get 503

    @property
    def send_timeout(self) -> float:
        return max(MIN_SEND_TIMEOUT, self.idle_timeout)


def checked_limits(idle_timeout: float, max_connections: int) -> Limits:
    """The limits of the command line, or a UsageError naming the bad one."""
    if not 0.1 <= idle_timeout <= 3600:
        raise UsageError(f"reading --idle-timeout {idle_timeout}: expected seconds from 0.1 to 3600, found "
                         f"{idle_timeout}", hint=f"bundle-import serve BUNDLE --idle-timeout {DEFAULT_IDLE_TIMEOUT:g}")
    if not 1 <= max_connections <= 10000:
        raise UsageError(f"reading --max-connections {max_connections}: expected 1 to 10000, found "
                         f"{max_connections}", hint=f"bundle-import serve BUNDLE --max-connections "
                         f"{DEFAULT_MAX_CONNECTIONS}")
    return Limits(idle_timeout, max_connections)


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

    def begin_head(self, timeout: float) -> None:
        self._deadline = time.monotonic() + timeout
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
            if left <= 0:
                raise socket.timeout("no complete request head before the idle timeout")
            self._sock.settimeout(left)
        n = self._sock.recv_into(view)
        if self._budget is not None:
            self._budget -= n
        return n


class Slots:
    """Connections being served, at most ``limit``; as many again may be busy being refused (503)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._refusing = 0
        self._lock = threading.Lock()

    def take(self) -> Optional[bool]:
        """True: a slot to serve; False: none, but one to answer 503; None: not even that (close)."""
        with self._lock:
            if self._held < self.limit:
                self._held += 1
                return True
            if self._refusing < self.limit:
                self._refusing += 1
                return False
            return None

    def release(self, served: bool) -> None:
        with self._lock:
            if served:
                self._held -= 1
            else:
                self._refusing -= 1


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
    paths: List[str] = ([local] if local is not None else [os.path.join(bundle.path, rel)] if bundle.archive is None
                        else [p for p, _ in bundle.archive.files])
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
