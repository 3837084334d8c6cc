"""Registry credentials and the distribution-API auth handshake (never printed).

Where credentials come from (flags, --authfile, podman/skopeo auth.json, Docker's config.json,
credential helpers) is importer/registry/logins.py. A registry that answers 401 says how to
authenticate in ``WWW-Authenticate``: ``Basic`` (send the credentials) or ``Bearer
realm=...,service=...,scope=...`` (fetch a token from the realm, with the credentials when there
are some).

Credentials go only to the registry that was named: a realm on another host or port gets them only
over HTTPS and when the user allows it (``--allow-realm-credentials``; Docker Hub's own pair,
registry-1.docker.io and https://auth.docker.io, is known), and a redirect from the realm to
another origin is followed without them (importer/registry/redirects.py)."""

from __future__ import annotations

import base64
import http.client
import re
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from importer.errors import ManifestError, RegistryAuthError
from importer.format.limits import parse_json
from importer.format.reference import DOCKER_HUB_API
from importer.registry.redirects import Origin, open_url, origin

MAX_TOKEN_RESPONSE = 1024 * 1024
#: registries whose token realm is on another host, known to belong to them (HTTPS)
KNOWN_REALMS = {DOCKER_HUB_API: "auth.docker.io"}
_PARAM_RE = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)=(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = "flags"  # where they came from (shown instead of the secret)

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***, source={self.source!r})"

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


def parse_challenge(header: str) -> Tuple[str, Dict[str, str]]:
    """``Bearer realm="x",service="y"`` -> ("bearer", {"realm": "x", "service": "y"})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {}
    for m in _PARAM_RE.finditer(rest):
        value = m.group(2) if m.group(2) is not None else m.group(3)
        params[m.group(1).lower()] = value.replace('\\"', '"')
    return scheme.lower(), params


def realm_gets_credentials(realm: str, registry: Origin, allowed: bool) -> bool:
    """May the registry's credentials go to the token ``realm``? Yes on the registry's own origin
    (host and port; its scheme may differ); on another, only over HTTPS, when ``allowed``
    (--allow-realm-credentials) or for a known pair (:data:`KNOWN_REALMS`)."""
    scheme, host, port = origin(realm)
    if (host, port) == registry[1:]:
        return True
    return scheme == "https" and (allowed or KNOWN_REALMS.get(registry[1]) == host)


def fetch_token(params: Dict[str, str], scopes: List[str], creds: Optional[Credentials], *,
                context: ssl.SSLContext, timeout: float, registry: Optional[Origin] = None,
                realm_credentials: bool = False, hint: str = "") -> str:
    """The bearer token flow: GET realm?service=..&scope=.. (with basic auth when we have
    credentials and the realm may have them, :func:`realm_gets_credentials`; ``registry``: the
    registry's origin, None = the realm's own); returns the ``Authorization`` header value. A
    challenge's ``scope`` that holds several scopes, space-separated (distribution asks so for a
    cross-repository mount), is sent as one ``scope`` parameter each, as the token spec says.
    ``context``: the registry's TLS setting (its CAs, or no checks for an insecure one);
    ``hint``: what to do when the realm refuses (the resolver's, importer/registry/logins.py)."""
    realm = params.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise RegistryAuthError(f"authenticating: expected a token realm URL in WWW-Authenticate, found {realm!r}")
    query: List[Tuple[str, str]] = []
    if params.get("service"):
        query.append(("service", params["service"]))
    for scope in dict.fromkeys(s for item in scopes for s in item.split()):  # a challenge's scope may hold
        query.append(("scope", scope))  # several, space-separated: one `scope` parameter each (token spec)
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
    withheld = creds is not None and not realm_gets_credentials(realm, registry or origin(realm), realm_credentials)
    basic = creds.basic_header() if creds is not None and not withheld else None
    ctx = context
    host = urllib.parse.urlsplit(realm).netloc
    what = f"authenticating at {host}"
    try:
        resp, conn = open_url(url, what=what, headers={"User-Agent": "sneakernet"}, auth=basic,
                              auth_origin=origin(realm), context=ctx, timeout=timeout)
        try:
            status = resp.status
            raw = resp.read(MAX_TOKEN_RESPONSE + 1) if status == 200 else b""
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as e:
        raise RegistryAuthError(f"{what}: expected the token service to answer, found {e}",
                                hint="the token realm must be reachable from here") from e
    if status != 200:
        if withheld:
            hint = (f"the token service {host} is not the registry's host, so the login was not sent to it; "
                    "if you trust it, pass --allow-realm-credentials (HTTPS realms only)")
        raise RegistryAuthError(f"{what}: expected a token, found HTTP {status}", hint=hint or None)
    if len(raw) > MAX_TOKEN_RESPONSE:
        raise RegistryAuthError(f"{what}: expected a token answer of at most {MAX_TOKEN_RESPONSE} bytes, found more")
    try:
        doc: Any = parse_json(raw, f"the token from {host}")
    except ManifestError as e:
        raise RegistryAuthError(f"{what}: expected a JSON token answer, found something else",
                                hint="the token realm is not a token service; check the registry") from e
    token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
    if not isinstance(token, str) or not token:
        raise RegistryAuthError(f"{what}: expected a token (a string) in the answer, found none")
    return "Bearer " + token
