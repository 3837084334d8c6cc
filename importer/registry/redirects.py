"""Following a registry's redirects (blob storage, a token realm) without leaking credentials.

A credential (Basic or Bearer) is sent only to the origin it was meant for (scheme, host and
port, :func:`origin`): a blob redirected to a CDN, or a token realm redirected elsewhere, is
fetched there without the ``Authorization`` header. At most MAX_REDIRECTS hops; a URL seen twice
is a loop. Both are :class:`~importer.errors.RegistryRedirectError`."""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from typing import Callable, Dict, List, Optional, Tuple

from importer.errors import RegistryError, RegistryRedirectError

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
Origin = Tuple[str, str, int]


def origin(url: str) -> Origin:
    """(scheme, host, port) of an http(s) URL, the port made explicit (80/443)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def open_url(url: str, *, what: str, headers: Dict[str, str], auth: Optional[str], auth_origin: Optional[Origin],
             context: ssl.SSLContext, timeout: float,
             own: Optional[Callable[[], http.client.HTTPConnection]] = None
             ) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    """GET ``url``, following redirects: (the first answer that is not one, its connection; the
    caller reads and closes both). ``auth`` goes only to ``auth_origin``, and a hop there uses
    ``own()`` when given (the registry client's connection: its tunnel, its TLS settings)."""
    seen: List[str] = []
    while True:
        if url in seen:
            raise RegistryRedirectError(f"{what}: expected the redirects to end, found a loop back to {_show(url)}",
                                        hint="the registry (or its storage) is misconfigured; tell its operator")
        if len(seen) > MAX_REDIRECTS:
            raise RegistryRedirectError(f"{what}: expected at most {MAX_REDIRECTS} redirects, found more "
                                        f"(last to {_show(url)})",
                                        hint="the registry (or its storage) is misconfigured; tell its operator")
        seen.append(url)
        here = origin(url)
        if here[0] not in ("http", "https") or not here[1]:
            raise RegistryError(f"{what}: expected an http(s) URL to follow, found {_show(url)}")
        hdrs = dict(headers)
        if auth and here == auth_origin:
            hdrs["Authorization"] = auth
        parts = urllib.parse.urlsplit(url)
        conn: http.client.HTTPConnection
        if own is not None and here == auth_origin:
            conn = own()
            hdrs["Host"] = parts.netloc  # the connection may be a tunnel's local port
        elif here[0] == "https":
            conn = http.client.HTTPSConnection(here[1], here[2], timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(here[1], here[2], timeout=timeout)
        try:
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=hdrs)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status not in REDIRECTS:
            return resp, conn
        location = resp.getheader("Location") or ""
        conn.close()  # the body of a redirect is not read: it may not end
        if not location:
            raise RegistryError(f"{what}: expected a Location in the redirect (HTTP {resp.status}) "
                                f"from {_show(url)}, found none")
        url = urllib.parse.urljoin(url, location)


def _show(url: str) -> str:
    """A URL without its query (which may hold a signed token)."""
    return url.split("?", 1)[0][:200]
