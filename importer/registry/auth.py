"""Registry credentials and the distribution-API auth handshake (never printed).

Credentials come from ``--username`` + ``--password-stdin``, else from the Docker client config
(``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``: ``auths`` entries, or a
``credHelpers``/``credsStore`` helper ``docker-credential-NAME get``), else none (anonymous).
A registry that answers 401 says how to authenticate in ``WWW-Authenticate``: ``Basic`` (send
the credentials) or ``Bearer realm=...,service=...,scope=...`` (fetch a token from the realm,
with the credentials when there are some).

Credentials go only to the registry that was named: a realm on another host or port gets them only
over HTTPS and when the user allows it (``--allow-realm-credentials``; Docker Hub's own pair,
registry-1.docker.io and https://auth.docker.io, is known), and a redirect from the realm to
another origin is followed without them (importer/registry/redirects.py)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from importer.errors import BundleError, ManifestError, RegistryAuthError
from importer.format.limits import parse_json
from importer.registry.redirects import Origin, open_url, origin
from importer.streams.commands import StdinCommand

MAX_TOKEN_RESPONSE = 1024 * 1024
#: registries whose token realm is on another host, known to belong to them (HTTPS)
KNOWN_REALMS = {"registry-1.docker.io": "auth.docker.io"}
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


def docker_config_path() -> str:
    base = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(base, "config.json")


def _host_keys(host: str) -> List[str]:
    keys = [host, f"https://{host}", f"http://{host}", f"https://{host}/v2/", f"http://{host}/v2/"]
    if host in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        keys.append("https://index.docker.io/v1/")
    return keys


def credentials_from_docker_config(host: str, path: Optional[str] = None) -> Optional[Credentials]:
    """Credentials the Docker client would use for ``host`` (``docker login`` writes them)."""
    path = path or docker_config_path()
    try:
        with open(path, "rb") as f:
            doc = parse_json(f.read(MAX_TOKEN_RESPONSE), path)
    except (OSError, ValueError):
        return None
    except Exception:  # a damaged config is not ours to report; go anonymous
        return None
    if not isinstance(doc, dict):
        return None
    helpers: Dict[str, Any] = doc["credHelpers"] if isinstance(doc.get("credHelpers"), dict) else {}
    helper = helpers.get(host) or doc.get("credsStore")
    if isinstance(helper, str) and helper:
        found = _from_helper(helper, host)
        if found is not None:
            return found
    auths: Dict[str, Any] = doc["auths"] if isinstance(doc.get("auths"), dict) else {}
    for key in _host_keys(host):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            return Credentials(user, password, source=f"{path} (auths.{key})")
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return Credentials(entry["username"], entry["password"], source=f"{path} (auths.{key})")
    return None


def _from_helper(helper: str, host: str) -> Optional[Credentials]:
    """``docker-credential-HELPER get`` with the host on stdin (the credential-helper protocol)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", helper):
        return None
    try:
        cmd = StdinCommand([f"docker-credential-{helper}", "get"], what=f"asking docker-credential-{helper}")
        with contextlib.suppress(OSError):
            cmd.stdin.write(host.encode())
        out = cmd.finish().stdout
    except BundleError:
        return None
    try:
        doc = json.loads(out.decode("utf-8"))
    except ValueError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("Username"), str) and isinstance(doc.get("Secret"), str):
        return Credentials(doc["Username"], doc["Secret"], source=f"docker-credential-{helper}")
    return None


def realm_gets_credentials(realm: str, registry: Origin, allowed: bool) -> bool:
    """May the registry's credentials go to the token ``realm``? Yes on the registry's own origin
    (host and port; its scheme may differ); on another, only over HTTPS, when ``allowed``
    (--allow-realm-credentials) or for a known pair (:data:`KNOWN_REALMS`)."""
    scheme, host, port = origin(realm)
    if (host, port) == registry[1:]:
        return True
    return scheme == "https" and (allowed or KNOWN_REALMS.get(registry[1]) == host)


def fetch_token(params: Dict[str, str], scopes: List[str], creds: Optional[Credentials], *,
                insecure: bool, timeout: float, registry: Optional[Origin] = None,
                realm_credentials: bool = False) -> str:
    """The bearer token flow: GET realm?service=..&scope=.. (with basic auth when we have
    credentials and the realm may have them, :func:`realm_gets_credentials`; ``registry``: the
    registry's origin, None = the realm's own); returns the ``Authorization`` header value. A
    challenge's ``scope`` that holds several scopes, space-separated (distribution asks so for a
    cross-repository mount), is sent as one ``scope`` parameter each, as the token spec says."""
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
    ctx = ssl.create_default_context()
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
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
        hint = _auth_hint(creds)
        if withheld:
            hint = (f"the token service {host} is not the registry's host, so the login was not sent to it; "
                    "if you trust it, pass --allow-realm-credentials (HTTPS realms only)")
        raise RegistryAuthError(f"{what}: expected a token, found HTTP {status}", hint=hint)
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


def _auth_hint(creds: Optional[Credentials]) -> str:
    if creds is None:
        return "log in first (docker login REGISTRY), or pass --username and --password-stdin"
    return f"check the credentials from {creds.source} (user {creds.username!r}) and their rights on the repository"
