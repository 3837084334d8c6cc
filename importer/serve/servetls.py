"""``bundle-import serve`` over TLS, with optional Basic auth: the listener around
importer/serve/serve.py's server.

- ``--tls-cert/--tls-key`` (PEM) or ``--tls-self-signed DIR`` (a CA and a server certificate made
  with the host's ``openssl`` command: importer/serve/selfsigned.py) give an
  :class:`ssl.SSLContext`; the handshake runs in the connection's own thread against a deadline
  (the connection's ``--idle-timeout``, at most HANDSHAKE_TIMEOUT after the accept, however its
  bytes trickle in), so an idle or slow client never holds the accept loop or another client.
- Wrong protocol on either side gets one clear log line instead of garbage: a TLS ClientHello
  (``0x16 0x03``) on a plain listener is answered with a plain ``HTTP/1.0 400`` (Go clients then
  say "server gave HTTP response to HTTPS client"), plain HTTP on a TLS listener with a plain 400
  saying to use https; a failed handshake (``ssl.SSLError``: often a client that does not trust
  the CA) is logged with what to do.
- ``--htpasswd FILE`` (importer/serve/htpasswd.py): every request but a refused write needs a
  known user; 401 ``UNAUTHORIZED`` with ``WWW-Authenticate: Basic realm=...`` otherwise, 429
  ``TOOMANYREQUESTS`` with ``Retry-After`` (and no hash run) for a client address past its budget
  of refused logins. Credentials are never logged (the access line has the method, path, status
  and bytes only)."""

from __future__ import annotations

import math
import selectors
import socket
import ssl
import time
from typing import Any, Callable, Optional, Tuple

from importer.errors import UsageError
from importer.format.text import printable
from importer.input.opened import OpenedBundle
from importer.serve.htpasswd import REALM, Htpasswd
from importer.serve.serve import BundleRegistry, Catalog, _Handler
from importer.serve.servelimits import Limits, client_key

HANDSHAKE_TIMEOUT = 10.0  # at most this many seconds from the accept to a finished TLS handshake
DRAIN = 16 * 1024

_PLAIN_BODY = b"this registry speaks HTTPS: pull over https:// (trust its CA certificate)\n"
PLAIN_ON_TLS = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(_PLAIN_BODY), _PLAIN_BODY))
TLS_ON_PLAIN = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                b"this registry speaks plain HTTP, not HTTPS\n")


class ServeTLSError(UsageError):
    """``bundle-import serve`` cannot set up TLS: a ``--tls-cert``/``--tls-key`` that is unreadable,
    not PEM or not a matching pair, ``--tls-self-signed`` without an ``openssl`` command or with a
    folder it cannot write, or TLS options that do not go together. Nothing was served."""

    reference = "serve-tls"


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """A server-side context from a PEM certificate (chain) and its key; ServeTLSError when not."""
    for what, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise ServeTLSError(f"reading {what} {path}: expected a readable PEM file, found {e.strerror or e}",
                                hint="give the server certificate and its key as PEM files, or make both with "
                                     "--tls-self-signed DIR") from e
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise ServeTLSError(
            f"loading --tls-cert {cert} with --tls-key {key}: expected a PEM certificate and its unencrypted PEM "
            f"private key, found {getattr(e, 'reason', None) or e}",
            hint="check that the key belongs to the certificate (openssl x509 -noout -pubkey -in CERT vs "
                 "openssl pkey -pubout -in KEY), or make a pair with --tls-self-signed DIR") from e
    return ctx


def _peer(addr: Any) -> str:
    host, port = str(addr[0]), int(addr[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _answer_and_close(sock: socket.socket, reply: bytes) -> None:
    """Read what the client already sent (so closing does not reset the reply away), reply, close."""
    try:
        sock.settimeout(1.0)
        sock.recv(DRAIN)
        sock.sendall(reply)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class _AuthHandler(_Handler):
    """serve.py's handler with ``--htpasswd`` checked before every route."""

    server: GuardedRegistry

    def _route(self) -> None:
        users = self.server.htpasswd
        if users is not None:
            login = users.check(self.headers.get("Authorization"), client_key(str(self.client_address[0])))
            if login.retry_after:
                self._note = "refused: too many refused logins from this address (no hash run)"
                wait = str(max(1, math.ceil(login.retry_after)))
                self._json(429, {"errors": [{"code": "TOOMANYREQUESTS", "message": "too many refused logins from "
                                             f"this address; retry after {wait}s", "detail": {}}]},
                           {"Retry-After": wait, "WWW-Authenticate": f'Basic realm="{REALM}"'})
                return
            if not login.ok:
                self._json(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required",
                                             "detail": {}}]},
                           {"WWW-Authenticate": f'Basic realm="{REALM}"'})
                return
        super()._route()


class GuardedRegistry(BundleRegistry):
    """serve.py's server with TLS (optional), the wrong-protocol checks and Basic auth."""

    def __init__(self, bundle: OpenedBundle, catalog: Catalog, listen: str, *,
                 log: Optional[Callable[[str], None]] = None, limits: Optional[Limits] = None,
                 tls: Optional[ssl.SSLContext] = None, htpasswd: Optional[Htpasswd] = None) -> None:
        self.tls = tls
        self.htpasswd = htpasswd
        super().__init__(bundle, catalog, listen, log=log, limits=limits, handler=_AuthHandler)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(printable(line))

    def _first_bytes(self, sock: socket.socket, wait: float) -> Optional[bytes]:
        """Up to 3 bytes the client sent first, left in the socket; b"" for a closed connection,
        None when it sent nothing within ``wait`` seconds."""
        old = sock.gettimeout()
        sock.settimeout(max(wait, 0.0))  # past the deadline: only what has arrived already
        try:
            return sock.recv(3, socket.MSG_PEEK)
        except (socket.timeout, BlockingIOError):
            return None
        except OSError:
            return b""
        finally:
            sock.settimeout(old)

    def open_connection(self, sock: socket.socket, addr: Any, deadline: float) -> Optional[socket.socket]:
        """The connection to answer HTTP on (``sock`` itself, or its TLS side); None: closed here.
        ``deadline``: when its first request head is due; a client silent until then is closed now."""
        peer = _peer(addr)
        if self.tls is None:
            first = self._first_bytes(sock, deadline - time.monotonic())
            if first is None:
                self.idle_closed(addr)
                return None
            if first[:2] == b"\x16\x03":
                self._say(f"{peer} spoke TLS (https) to this plain-HTTP listener: answered 400 in plain HTTP and "
                          "closed; serve with --tls-self-signed DIR (or --tls-cert/--tls-key), or let the client "
                          "pull over plain HTTP (an insecure registry)")
                _answer_and_close(sock, TLS_ON_PLAIN)
                return None
            return sock if first != b"" else None
        return self._handshake(sock, peer, deadline)

    def _handshake(self, sock: socket.socket, peer: str, deadline: float) -> Optional[socket.socket]:
        assert self.tls is not None
        accepted = deadline - self.limits.idle_timeout
        limit = min(self.limits.idle_timeout, HANDSHAKE_TIMEOUT)
        done_by = accepted + limit
        first = self._first_bytes(sock, done_by - time.monotonic())
        if first is None:
            self._say(f"{peer} sent nothing within {limit:g}s of connecting: closed")
            return None
        if not first:
            return None
        if first[:1] != b"\x16":
            self._say(f"{peer} spoke plain HTTP to this TLS listener: answered 400 and closed; the client must "
                      "pull over https:// and trust this server's CA")
            _answer_and_close(sock, PLAIN_ON_TLS)
            return None
        old = sock.gettimeout()
        try:
            sock.setblocking(False)  # the handshake waits in _finish_handshake, for the deadline only
            conn = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):
            return None
        try:
            _finish_handshake(conn, done_by)
        except ssl.SSLError as e:
            self._say(f"{peer}: TLS handshake failed ({e.reason or e}); a client that does not trust this "
                      "certificate says 'unknown ca' or 'bad certificate': put the CA where it looks "
                      "(the start lines say where), or give it a certificate for the name it dials")
            conn.close()
            return None
        except (socket.timeout, OSError) as e:
            why = f"did not finish the TLS handshake within {limit:g}s" \
                if isinstance(e, socket.timeout) else f"dropped the TLS handshake ({e})"
            self._say(f"{peer} {why}: closed")
            conn.close()
            return None
        conn.settimeout(old)
        return conn


def _finish_handshake(conn: ssl.SSLSocket, deadline: float) -> None:
    """``conn.do_handshake()`` on a non-blocking socket, waiting for it only until ``deadline``
    (``time.monotonic()``): a socket timeout would start again at each byte a slow client sends.
    Raises socket.timeout when the deadline passes first."""
    with selectors.DefaultSelector() as sel:
        sel.register(conn, selectors.EVENT_READ)
        while True:
            try:
                conn.do_handshake()
                return
            except ssl.SSLWantReadError:
                sel.modify(conn, selectors.EVENT_READ)
            except ssl.SSLWantWriteError:
                sel.modify(conn, selectors.EVENT_WRITE)
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise socket.timeout("the TLS handshake did not finish in time")


def tls_names_default(host: str, hostname: str) -> Tuple[str, ...]:
    """The names a self-signed server certificate carries when no --tls-name is given: the listen
    address (this host's name instead of a wildcard), localhost and the loopback addresses."""
    first = hostname if host in ("0.0.0.0", "::", "") else host  # noqa: S104 (a wildcard, compared)
    names = [first, "localhost", "127.0.0.1", "::1"]
    return tuple(dict.fromkeys(n for n in names if n))
