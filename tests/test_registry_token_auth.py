"""The registry bearer-token flow (importer/registry/auth.py) against a real registry (issue 17, Tests).

Debian's docker-registry runs with ``auth: token`` (docker/scripts/registry.sh,
SNEAKERNET_REGISTRY_TOKEN_*); its realm is a small token issuer this test serves on 127.0.0.1 over
TLS (a self-signed certificate made here), issuing JWTs as the distribution token spec says:
RS256, the signing certificate in the header's ``x5c``, claims iss/sub/aud/exp/nbf/iat/jti/access,
the certificate in the registry's ``rootcertbundle``. The issuer checks HTTP basic credentials,
which `bundle push` takes from a docker config.json (``auths``, keyed by the registry as `docker
login` writes it) in a temporary DOCKER_CONFIG.

The realm's certificate is not checked by the importer here: a loopback registry is "insecure"
(as Docker treats it) and fetch_token() uses the registry's TLS setting for its realm; that the
issuer really answers over TLS is asserted by a client that does check it."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import ssl
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from tests.kit import engines
from tests.kit.helpers import run_cli
from tests.kit.transferkit import free_port, random_bundle

pytestmark = pytest.mark.engine

SERVICE = "sneakernet-token-test"
ISSUER = "sneakernet-test-issuer"
USERS = {"alice": ("s3cret-pw", ("pull", "push")), "reader": ("read-only", ("pull",))}


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass
class Signer:
    key: rsa.RSAPrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, name: str) -> Signer:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                            x509.DNSName("localhost")]), critical=False)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def write(self, folder: Path) -> Tuple[Path, Path]:
        cert, key = folder / "cert.pem", folder / "key.pem"
        cert.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert, key

    def jwt(self, sub: str, access: List[Dict[str, Any]], *, audience: str = SERVICE) -> str:
        """A token as docker/distribution's token auth verifies it (registry/auth/token)."""
        now = int(datetime.datetime.now(datetime.timezone.utc).timestamp())
        header = {"typ": "JWT", "alg": "RS256",
                  "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode("ascii")]}
        claims = {"iss": ISSUER, "sub": sub, "aud": audience, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"


@dataclass
class Issuer:
    """The realm: GET /token?service=..&scope=.. with HTTP basic auth -> {"token": JWT}."""

    signer: Signer
    port: int = 0
    seen: List[Dict[str, Any]] = field(default_factory=list)  # every request: user, ok, service, scopes

    @property
    def realm(self) -> str:
        return f"https://127.0.0.1:{self.port}/token"

    def grant(self, user: str, scopes: List[str]) -> List[Dict[str, Any]]:
        allowed = USERS[user][1]
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository":
                granted = [a for a in actions.split(",") if a in allowed]
                if granted:
                    access.append({"type": kind, "name": name, "actions": granted})
            elif kind == "registry" and name == "catalog" and user == "alice":
                access.append({"type": kind, "name": name, "actions": ["*"]})
        return access

    def handler(self) -> type:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                user = _basic_user(self.headers.get("Authorization", ""))
                record = {"path": url.path, "user": user, "service": query.get("service", [""])[0],
                          "scopes": query.get("scope", []), "ok": user is not None}
                issuer.seen.append(record)
                if url.path != "/token" or user is None:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="sneakernet-token-test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                token = issuer.signer.jwt(user, issuer.grant(user, record["scopes"]))
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


def _basic_user(header: str) -> Optional[str]:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(value).decode("utf-8").partition(":")
    except ValueError:
        return None
    return user if user in USERS and USERS[user][0] == password else None


@dataclass
class TokenRegistry:
    name: str
    port: int
    issuer: Issuer
    cert: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tag_link(self, repo: str, tag: str) -> Optional[str]:
        """The manifest digest the registry's storage holds for repo:tag (read from disk)."""
        run = Path(os.environ.get("SNEAKERNET_RUN", "/tmp/sneakernet-run"))
        link = (run / f"registry-{self.name}" / "data" / "docker" / "registry" / "v2" / "repositories" / repo /
                "_manifests" / "tags" / tag / "current" / "link")
        return link.read_text().strip() if link.is_file() else None


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenRegistry]:
    engines.require("docker-registry")
    folder = tmp_path_factory.mktemp("token")
    signer = Signer.make("sneakernet token issuer")
    cert, key = signer.write(folder)
    issuer = Issuer(signer)
    server = ThreadingHTTPServer(("127.0.0.1", 0), issuer.handler())
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    issuer.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    name, port = f"i17token-{os.getpid()}", free_port()
    env = {"SNEAKERNET_REGISTRY_TOKEN_REALM": issuer.realm, "SNEAKERNET_REGISTRY_TOKEN_SERVICE": SERVICE,
           "SNEAKERNET_REGISTRY_TOKEN_ISSUER": ISSUER, "SNEAKERNET_REGISTRY_TOKEN_ROOTCERTS": str(cert)}
    os.environ.update(env)
    try:
        engines.start_registry(name, port)
    except engines.EngineError as e:
        engines.unavailable(f"could not start the private docker-registry with token auth: {e}")
    finally:
        for k in env:
            del os.environ[k]
    try:
        yield TokenRegistry(name, port, issuer, cert)
    finally:
        engines.stop_registry(name, purge=True)
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_bundle(tmp_path_factory.mktemp("tokpush") / "carry.bundle", mb=(1, 1))


def _docker_config(folder: Path, registry: str, user: str, password: str) -> Path:
    folder.mkdir()
    auth = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return folder


def _push(bundle: Path, target: str, docker_config: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("bundle", "push", str(bundle), target, "--json", "--allow-realm-credentials",
                   env={"DOCKER_CONFIG": str(docker_config)}, timeout=600)


def _token(reg: TokenRegistry, user: str, *scopes: str) -> str:
    """A token fetched by this test's own client, which checks the issuer's certificate."""
    query = urllib.parse.urlencode([("service", SERVICE), *(("scope", s) for s in scopes)])
    req = urllib.request.Request(f"{reg.issuer.realm}?{query}", headers={
        "Authorization": "Basic " + base64.b64encode(f"{user}:{USERS[user][0]}".encode()).decode("ascii")})
    ctx = ssl.create_default_context(cafile=str(reg.cert))
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return str(json.loads(r.read())["token"])


def _get(reg: TokenRegistry, path: str, token: Optional[str] = None,
         accept: str = "application/vnd.oci.image.manifest.v1+json") -> Tuple[int, bytes, Dict[str, str]]:
    headers = {"Accept": accept}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://{reg.addr}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def test_the_registry_wants_a_token_from_the_realm(token_registry: TokenRegistry) -> None:
    status, _, headers = _get(token_registry, "/v2/")
    assert status == 401
    challenge = headers.get("Www-Authenticate") or headers.get("WWW-Authenticate") or ""
    assert challenge.startswith("Bearer ") and f'realm="{token_registry.issuer.realm}"' in challenge
    assert f'service="{SERVICE}"' in challenge
    # a token signed by a key the registry does not trust is refused: the registry checks signatures
    stranger = Signer.make("stranger").jwt("alice", [])
    assert _get(token_registry, "/v2/", stranger)[0] == 401
    assert _get(token_registry, "/v2/", token_registry.issuer.signer.jwt("alice", []))[0] == 200
    wrong_aud = token_registry.issuer.signer.jwt("alice", [], audience="another-service")
    assert _get(token_registry, "/v2/", wrong_aud)[0] == 401


def test_push_with_docker_config_credentials_through_the_token_flow(token_registry: TokenRegistry, bundle: Path,
                                                                     tmp_path: Path) -> None:
    reg = token_registry
    reg.issuer.seen.clear()
    config = _docker_config(tmp_path / "docker", reg.addr, "alice", "s3cret-pw")
    proc = _push(bundle, f"{reg.addr}/tok", config)
    assert proc.returncode == 0, f"{proc.stderr}\nthe issuer saw: {reg.issuer.seen}"
    out = json.loads(proc.stdout)
    assert [i["pushedTo"] for i in out["images"]] == [f"{reg.addr}/tok/carry/base:1", f"{reg.addr}/tok/carry/app:2"]
    assert "s3cret-pw" not in proc.stdout + proc.stderr
    # the issuer was asked, with the config's credentials, for the scopes of the push
    assert reg.issuer.seen and all(r["user"] == "alice" and r["service"] == SERVICE for r in reg.issuer.seen)
    scopes = {s for r in reg.issuer.seen for s in r["scopes"]}
    # a scope's actions come in the registry's order ("pull,push" or "push,pull"): compared as sets
    asked = {(s.rsplit(":", 1)[0], frozenset(s.rsplit(":", 1)[1].split(","))) for s in scopes}
    push = frozenset({"pull", "push"})
    assert {("repository:tok/carry/base", push), ("repository:tok/carry/app", push)} <= asked
    # the mount's challenge asks for two scopes in one (space-separated): sent as two parameters
    assert ("repository:tok/carry/base", frozenset({"pull"})) in asked and not any(" " in s for s in scopes)
    # what the registry holds: its storage on disk, and the manifests read back with a token of our own
    doc = json.loads((bundle / "bundle.json").read_text())
    token = _token(reg, "alice", "repository:tok/carry/base:pull", "repository:tok/carry/app:pull",
                   "registry:catalog:*")
    for image, (repo, tag) in zip(doc["images"], [("tok/carry/base", "1"), ("tok/carry/app", "2")]):
        digest = image["manifest"]["digest"]
        assert reg.tag_link(repo, tag) == digest
        status, raw, _ = _get(reg, f"/v2/{repo}/manifests/{tag}", token, image["manifest"]["mediaType"])
        assert status == 200
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    status, raw, _ = _get(reg, "/v2/_catalog", token, "application/json")
    assert status == 200 and {"tok/carry/base", "tok/carry/app"} <= set(json.loads(raw)["repositories"])
    # and `bundle export docker://` reads it back through the same flow (a pull token), digest kept
    reg.issuer.seen.clear()
    out_dir = tmp_path / "exported"
    exported = run_cli("bundle", "export", f"docker://{reg.addr}/tok/carry/app:2", "-o", str(out_dir), "--json",
                       "-q", "--allow-realm-credentials", env={"DOCKER_CONFIG": str(config)})
    assert exported.returncode == 0, exported.stderr
    [image] = json.loads((out_dir / "bundle.json").read_text())["images"]
    assert image["manifest"]["digest"] == doc["images"][1]["manifest"]["digest"]
    assert {"repository:tok/carry/app:pull"} <= {s for r in reg.issuer.seen for s in r["scopes"]}


def test_a_wrong_password_fails_with_registry_auth(token_registry: TokenRegistry, bundle: Path,
                                                   tmp_path: Path) -> None:
    reg = token_registry
    reg.issuer.seen.clear()
    config = _docker_config(tmp_path / "docker", reg.addr, "alice", "not-it")
    proc = _push(bundle, f"{reg.addr}/wrongpw", config)
    assert proc.returncode == 6, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["id"] == "registry-auth" and err["exitCode"] == 6
    assert err["message"] == f"authenticating at 127.0.0.1:{reg.issuer.port}: expected a token, found HTTP 401"
    assert "(user 'alice')" in err["hint"] and "not-it" not in proc.stdout + proc.stderr
    assert reg.issuer.seen and not any(r["ok"] for r in reg.issuer.seen)
    assert reg.tag_link("wrongpw/carry/base", "1") is None


def test_a_token_without_push_is_refused_by_the_registry(token_registry: TokenRegistry, bundle: Path,
                                                         tmp_path: Path) -> None:
    """The issuer grants `reader` pull only: the registry itself refuses the upload (HTTP 401,
    insufficient scope) and the push fails with registry-auth, nothing tagged."""
    reg = token_registry
    config = _docker_config(tmp_path / "docker", reg.addr, "reader", "read-only")
    proc = _push(bundle, f"{reg.addr}/ro", config)
    assert proc.returncode == 6, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["id"] == "registry-auth" and "refused the credentials (HTTP 401)" in err["message"]
    assert reg.tag_link("ro/carry/base", "1") is None
