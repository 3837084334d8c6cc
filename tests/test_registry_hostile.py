"""A hostile registry behind ``bundle export docker://...`` (issue 24, class 3): every download is
bounded by the size its descriptor declares (an endless blob, a lying Content-Length, a chunked
body without end) and manifests by MAX_MANIFEST; indexes nest a bounded number of levels; wrong
JSON types anywhere give a typed error; credentials go only to the registry that was named (a
token realm on another port gets no login, nothing survives a redirect to another port); a
redirect loop and too many redirects have their own error (registry-redirect).

The registry is tests/kit/fakeregistry.py (loopback, in memory, misbehaving on request); a second
loopback server plays the token realm or the CDN and captures every Authorization header."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from importer.registry.auth import realm_gets_credentials
from tests.kit.fakeregistry import OCI_INDEX, FakeRegistry, Loopback, redirect, send, send_endless, send_json
from tests.kit.helpers import run_cli
from tests.test_registry_token_auth import Signer

SECRET = "hunter2-do-not-leak"
TOKEN = {"token": "a-pull-token"}


@pytest.fixture
def fake() -> Iterator[FakeRegistry]:
    with FakeRegistry() as registry:
        yield registry


@pytest.fixture
def other() -> Iterator[Loopback]:
    """A second loopback server (another port): a token realm, a CDN."""
    with Loopback() as server:
        yield server


def export(tmp_path: Path, ref: str, *args: str, config: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """``bundle export REF --json`` with a docker config of its own: (process, the JSON it printed)."""
    docker = tmp_path / "docker"
    docker.mkdir(exist_ok=True)
    (docker / "config.json").write_text(json.dumps(config or {}))
    out = tmp_path / "out"
    proc = run_cli("bundle", "export", ref, "-o", str(out), "--json", "-q", *args, timeout=120,
                   env={"DOCKER_CONFIG": str(docker)}, drop_env=("DOCKER_",))
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0:
        assert not out.exists() or not any(out.iterdir()), "a failed export left files behind"
    return proc, doc


def error_of(proc: Any, doc: dict[str, Any]) -> dict[str, Any]:
    assert proc.returncode != 0, proc.stderr
    err: dict[str, Any] = doc["error"]
    assert err["id"] != "internal" and err["exitCode"] == proc.returncode, proc.stderr
    return err


def login(registry: FakeRegistry) -> dict[str, Any]:
    return {"auths": {registry.addr: {"username": "alice", "password": SECRET}}}


def test_the_fake_registry_serves_an_image_that_exports(fake: FakeRegistry, tmp_path: Path) -> None:
    desc = fake.image("team/app", "1")
    proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    assert proc.returncode == 0, proc.stderr
    [image] = json.loads((tmp_path / "out" / "bundle.json").read_text())["images"]
    assert image["manifest"]["digest"] == desc["digest"]


# ================================================================ bounded downloads


def test_an_endless_blob_is_cut_at_the_size_its_descriptor_declares(fake: FakeRegistry, tmp_path: Path) -> None:
    """The real layer, then zeros without end (chunked): gzip reads zeros as padding, so only the
    declared size stops the download."""
    desc = fake.image("team/app", "1")
    layer = desc["layer"]["digest"]
    fake.override[f"/v2/team/app/blobs/{layer}"] = lambda req: send_endless(req, prefix=fake.blobs[layer])
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    err = error_of(proc, doc)
    assert err["id"] == "limit-exceeded", proc.stderr
    assert f"expected {desc['layer']['size']} bytes (the size its descriptor declares), found more" in err["message"]
    assert fake.sent < 16 << 20, f"the registry managed to send {fake.sent} bytes"


def test_a_content_length_beyond_the_declared_size_is_refused_unread(fake: FakeRegistry, tmp_path: Path) -> None:
    desc = fake.image("team/app", "1")
    fake.override[f"/v2/team/app/blobs/{desc['layer']['digest']}"] = (
        lambda req: send_endless(req, content_length=10 << 30))
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    err = error_of(proc, doc)
    assert err["id"] == "limit-exceeded", proc.stderr
    assert "found a Content-Length of 10737418240" in err["message"]
    assert fake.sent < 16 << 20, f"the registry managed to send {fake.sent} bytes"


@pytest.mark.parametrize("declared", ["\u00b2", "\u00b9\u00b2\u00b3", "1\u00b2"])
@pytest.mark.parametrize("what", ["manifest", "layer"])
def test_a_content_length_in_superscript_digits_is_no_number(fake: FakeRegistry, tmp_path: Path, declared: str,
                                                             what: str) -> None:
    """Issue 38: str.isdigit() takes '\u00b2', int() refuses it: the Content-Length is no number (the
    body is bounded as one without), never a crash."""
    desc = fake.image("team/app", "1")
    layer = desc["layer"]["digest"]
    path, prefix = ((f"/v2/team/app/blobs/{layer}", fake.blobs[layer]) if what == "layer"
                    else ("/v2/team/app/manifests/1", b""))
    fake.override[path] = lambda req: send_endless(req, content_length=declared, prefix=prefix)
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    err = error_of(proc, doc)
    assert err["id"] == "limit-exceeded", proc.stderr
    assert fake.sent < 64 << 20, f"the registry managed to send {fake.sent} bytes"


@pytest.mark.parametrize("how", ["padded", "endless", "lying-length"])
def test_a_manifest_past_the_cap_is_refused(fake: FakeRegistry, tmp_path: Path, how: str) -> None:
    """MAX_MANIFEST (4 MiB, as distribution caps them): a 5 MiB manifest (valid JSON), an endless
    chunked one, one whose Content-Length says 1 GiB."""
    desc = fake.image("team/app", "1")
    raw, _ = fake.manifests[f"team/app@{desc['digest']}"]

    def answer(req: BaseHTTPRequestHandler) -> None:
        if how == "padded":
            send(req, 200, raw[:-1] + b" " * (5 << 20) + b"}", {"Content-Type": desc["mediaType"]})
        else:
            send_endless(req, content_length=(1 << 30) if how == "lying-length" else None)

    fake.override["/v2/team/app/manifests/1"] = answer
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    err = error_of(proc, doc)
    assert err["id"] == "limit-exceeded" and f"at most {4 << 20} bytes" in err["message"], proc.stderr
    assert fake.sent < 24 << 20


def test_indexes_nested_without_end_are_refused(fake: FakeRegistry, tmp_path: Path) -> None:
    """40 indexes, each naming the next (for linux/amd64): refused after MAX_INDEX_DEPTH levels."""
    child = fake.index("team/app", "", [])
    for _ in range(40):
        entry = {**{k: child[k] for k in ("mediaType", "digest", "size")},
                 "platform": {"os": "linux", "architecture": "amd64"}}
        child = fake.index("team/app", "", [entry])
    fake.put_manifest("team/app", "deep", fake.manifests[f"team/app@{child['digest']}"][0], OCI_INDEX)
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:deep", "--platform", "linux/amd64")
    err = error_of(proc, doc)
    assert err["id"] == "limit-exceeded" and "expected indexes nested at most 4 levels deep" in err["message"]
    asked = [p for m, p, _ in fake.requests if m == "GET" and "/manifests/" in p]
    assert len(asked) <= 6, asked


# ================================================================ wrong JSON types


MANIFEST_SHAPES = {
    "layers-a-number": lambda m: {**m, "layers": 5},
    "manifests-a-string": lambda m: {**m, "manifests": "x"},
    "a-list": lambda m: [m],
    "a-string": lambda m: "manifest",
    "config-a-list": lambda m: {**m, "config": [m["config"]]},
    "layer-size-a-string": lambda m: {**m, "layers": [{**m["layers"][0], "size": "12"}]},
    "layer-a-number": lambda m: {**m, "layers": [7]},
}


@pytest.mark.parametrize("shape", sorted(MANIFEST_SHAPES))
def test_a_manifest_of_the_wrong_shape_is_a_typed_error(fake: FakeRegistry, tmp_path: Path, shape: str) -> None:
    desc = fake.image("team/app", "1")
    manifest = json.loads(fake.manifests[f"team/app@{desc['digest']}"][0])
    fake.put_manifest("team/app", "bad", json.dumps(MANIFEST_SHAPES[shape](manifest)).encode(), desc["mediaType"])
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:bad")
    assert error_of(proc, doc)["id"] in ("source", "invalid-manifest"), proc.stderr


INDEX_SHAPES = {
    "entry-a-number": lambda e: [5],
    "platform-a-string": lambda e: [{**e, "platform": "linux/amd64"}],
    "architecture-a-list": lambda e: [{**e, "platform": {"os": "linux", "architecture": ["amd64"]}}],
    "digest-a-number": lambda e: [{**e, "digest": 7}],
}


@pytest.mark.parametrize("shape", sorted(INDEX_SHAPES))
def test_an_index_of_the_wrong_shape_is_a_typed_error(fake: FakeRegistry, tmp_path: Path, shape: str) -> None:
    desc = fake.image("team/app", "")
    entry = {**{k: desc[k] for k in ("mediaType", "digest", "size")},
             "platform": {"os": "linux", "architecture": "amd64"}}
    fake.put_manifest("team/app", "idx", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                     "manifests": INDEX_SHAPES[shape](entry)}).encode(), OCI_INDEX)
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:idx", "--platform", "linux/amd64")
    assert error_of(proc, doc)["id"] in ("source", "invalid-manifest", "invalid-digest", "platform-not-found"), \
        proc.stderr


CONFIG_SHAPES = {
    "a-list": [1, 2],
    "rootfs-a-string": {"rootfs": "layers"},
    "diff-ids-a-number": {"rootfs": {"type": "layers", "diff_ids": 5}},
    "diff-id-a-number": {"rootfs": {"type": "layers", "diff_ids": [5]}},
}


@pytest.mark.parametrize("shape", sorted(CONFIG_SHAPES))
def test_a_config_of_the_wrong_shape_is_a_typed_error(fake: FakeRegistry, tmp_path: Path, shape: str) -> None:
    desc = fake.image("team/app", "1")
    manifest = json.loads(fake.manifests[f"team/app@{desc['digest']}"][0])
    manifest["config"] = {**manifest["config"], **fake.blob(json.dumps(CONFIG_SHAPES[shape]).encode())}
    fake.put_manifest("team/app", "bad", json.dumps(manifest).encode(), desc["mediaType"])
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:bad")
    assert error_of(proc, doc)["id"] in ("source", "invalid-manifest"), proc.stderr


def test_an_error_body_nested_past_the_stack_is_a_typed_error(fake: FakeRegistry, tmp_path: Path) -> None:
    fake.override["/v2/team/app/manifests/1"] = lambda req: send(req, 400, b"[" * 200_000)
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    assert error_of(proc, doc)["id"] == "registry", proc.stderr


@pytest.mark.parametrize("answer", [b"not json", b"[" * 200_000, b'["token"]', b'{"token": 5}',
                                    b'{"token": {"a": 1}}'], ids=["text", "deep", "list", "number", "object"])
def test_a_token_answer_of_the_wrong_shape_is_registry_auth(fake: FakeRegistry, tmp_path: Path,
                                                            answer: bytes) -> None:
    fake.image("team/app", "1")
    fake.challenge = f'Bearer realm="{fake.url}/token",service="fake"'
    fake.override["/token"] = lambda req: send(req, 200, answer, {"Content-Type": "application/json"})
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    assert error_of(proc, doc)["id"] == "registry-auth", proc.stderr


@pytest.mark.parametrize("listing", ["/v2/_catalog", "/v2/team/app/tags/list"])
@pytest.mark.parametrize("body", [b"[" * 200_000, b'{"repositories": 5, "tags": {"a": 1}}', b'"x"'],
                         ids=["deep", "wrong-types", "a-string"])
def test_a_listing_of_the_wrong_shape_is_a_typed_error(fake: FakeRegistry, tmp_path: Path, listing: str,
                                                       body: bytes) -> None:
    """``bundle-import --inventory --registry``: the catalog and a tag list, deep or of other types."""
    fake.image("team/app", "1")
    fake.override["/v2/_catalog"] = lambda req: send_json(req, 200, {"repositories": ["team/app"]})
    fake.override[listing] = lambda req: send(req, 200, body, {"Content-Type": "application/json"})
    proc = run_cli("importer", "--inventory", "--registry", fake.addr, "--json", timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode:
        assert json.loads(proc.stdout)["error"]["id"] == "registry", proc.stderr
    else:  # a listing of no list is an empty one
        assert json.loads(proc.stdout)["images"] == [] and body != b"[" * 200_000, proc.stdout


# ================================================================ credentials stay with the registry


@pytest.mark.parametrize("flag", [(), ("--allow-realm-credentials",)])
def test_a_realm_on_another_port_gets_no_login(fake: FakeRegistry, other: Loopback, tmp_path: Path,
                                               flag: tuple[str, ...]) -> None:
    """The realm (plain HTTP, another port) is asked for an anonymous token: the docker config's
    login is not sent there, not even with --allow-realm-credentials (HTTPS realms only)."""
    fake.image("team/app", "1")
    fake.challenge = f'Bearer realm="{other.url}/token",service="fake"'
    other.handler = lambda req: send_json(req, 200, TOKEN)
    proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1", *flag, config=login(fake))
    assert proc.returncode == 0, proc.stderr
    assert other.requests and other.authorizations() == [], other.authorizations()
    assert {h.get("authorization") for _, p, h in fake.requests if p.startswith("/v2/team/")} == {
        "Bearer a-pull-token"}


def test_an_https_realm_on_another_port_gets_the_login_only_when_allowed(fake: FakeRegistry, tmp_path: Path) -> None:
    signer = Signer.make("realm")
    cert, key = signer.write(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    with Loopback(lambda req: send_json(req, 200, TOKEN), tls=ctx) as realm:
        fake.image("team/app", "1")
        fake.challenge = f'Bearer realm="{realm.url}/token",service="fake"'
        proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1", config=login(fake))
        assert proc.returncode == 0 and realm.requests and realm.authorizations() == [], proc.stderr
        shutil.rmtree(tmp_path / "out")
        proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1", "--allow-realm-credentials",
                            config=login(fake))
        assert proc.returncode == 0, proc.stderr
        basic = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
        assert realm.authorizations() and set(realm.authorizations()) == {basic}
        assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize("realm, registry, allowed, sent", [
    ("http://127.0.0.1:5000/token", ("http", "127.0.0.1", 5000), False, True),  # the registry itself
    ("https://127.0.0.1:5000/token", ("http", "127.0.0.1", 5000), False, True),  # same host and port
    ("http://127.0.0.1:5001/token", ("http", "127.0.0.1", 5000), True, False),  # another port, plain HTTP
    ("https://127.0.0.1:5001/token", ("http", "127.0.0.1", 5000), False, False),  # not allowed
    ("https://127.0.0.1:5001/token", ("http", "127.0.0.1", 5000), True, True),
    ("https://localhost:5000/token", ("http", "127.0.0.1", 5000), False, False),  # another name
    ("https://auth.docker.io/token", ("https", "registry-1.docker.io", 443), False, True),  # known pair
    ("http://auth.docker.io/token", ("https", "registry-1.docker.io", 443), False, False),
    ("https://auth.docker.io/token", ("https", "ghcr.io", 443), False, False),
    ("https://reg.example/token", ("https", "reg.example", 443), False, True),  # default ports
    ("https://reg.example:8443/token", ("https", "reg.example", 443), False, False),
])
def test_which_realms_get_the_login(realm: str, registry: tuple[str, str, int], allowed: bool, sent: bool) -> None:
    assert realm_gets_credentials(realm, registry, allowed) is sent


def test_a_realm_that_refuses_the_anonymous_asker_names_the_flag(fake: FakeRegistry, other: Loopback,
                                                                 tmp_path: Path) -> None:
    fake.image("team/app", "1")
    fake.challenge = f'Bearer realm="{other.url}/token",service="fake"'
    other.handler = lambda req: send_json(req, 401, {"details": "who are you"})
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1", config=login(fake))
    err = error_of(proc, doc)
    assert err["id"] == "registry-auth" and "--allow-realm-credentials" in err["hint"]
    assert other.authorizations() == [] and SECRET not in proc.stdout + proc.stderr


def test_a_realm_on_the_registry_itself_gets_the_login(fake: FakeRegistry, tmp_path: Path) -> None:
    fake.image("team/app", "1")
    fake.challenge = f'Bearer realm="{fake.url}/token",service="fake"'
    fake.override["/token"] = lambda req: send_json(req, 200, TOKEN)
    proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1", config=login(fake))
    assert proc.returncode == 0, proc.stderr
    sent = {h.get("authorization") for _, p, h in fake.requests if p.startswith("/token")}
    assert sent and all(s and s.startswith("Basic ") for s in sent), sent


def test_a_realm_redirect_to_another_port_drops_the_login(fake: FakeRegistry, other: Loopback,
                                                          tmp_path: Path) -> None:
    fake.image("team/app", "1")
    fake.challenge = f'Bearer realm="{fake.url}/token",service="fake"'
    fake.override["/token"] = lambda req: redirect(req, f"{other.url}/elsewhere{req.path[len('/token'):]}")
    other.handler = lambda req: send_json(req, 200, TOKEN)
    proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1", config=login(fake))
    assert proc.returncode == 0, proc.stderr
    assert next(h.get("authorization", "") for _, p, h in fake.requests if p.startswith("/token")).startswith("Basic ")
    assert other.requests and other.authorizations() == [], other.authorizations()


def test_a_blob_redirected_to_a_cdn_is_fetched_without_the_token(fake: FakeRegistry, other: Loopback,
                                                                 tmp_path: Path) -> None:
    desc = fake.image("team/app", "1")
    layer = desc["layer"]["digest"]
    fake.challenge = f'Bearer realm="{fake.url}/token",service="fake"'
    fake.override["/token"] = lambda req: send_json(req, 200, TOKEN)
    fake.override[f"/v2/team/app/blobs/{layer}"] = lambda req: redirect(req, f"{other.url}/cdn/{layer}?sig=x")
    other.handler = lambda req: send(req, 200, fake.blobs[layer])
    proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    assert proc.returncode == 0, proc.stderr
    assert any(p.startswith("/cdn/") for _, p, _ in other.requests)
    assert other.authorizations() == [], other.authorizations()


def test_a_blob_redirected_on_the_registry_itself_keeps_the_token(fake: FakeRegistry, tmp_path: Path) -> None:
    """A relative Location (storage on the registry's own origin) is followed with the token."""
    desc = fake.image("team/app", "1")
    layer = desc["layer"]["digest"]
    fake.challenge = f'Bearer realm="{fake.url}/token",service="fake"'
    fake.override["/token"] = lambda req: send_json(req, 200, TOKEN)
    fake.override[f"/v2/team/app/blobs/{layer}"] = lambda req: redirect(req, f"/storage/{layer}")
    fake.override[f"/storage/{layer}"] = lambda req: send(req, 200, fake.blobs[layer])
    proc, _doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    assert proc.returncode == 0, proc.stderr
    got = [h.get("authorization") for m, p, h in fake.requests if m == "GET" and p.startswith("/storage/")]
    assert got and set(got) == {"Bearer a-pull-token"}, got


@pytest.mark.parametrize("kind", ["loop", "too-many"])
def test_redirects_without_end_are_registry_redirect(fake: FakeRegistry, other: Loopback, tmp_path: Path,
                                                     kind: str) -> None:
    desc = fake.image("team/app", "1")
    layer = desc["layer"]["digest"]
    fake.override[f"/v2/team/app/blobs/{layer}"] = lambda req: redirect(req, f"{other.url}/hop/0")

    def hop(req: BaseHTTPRequestHandler) -> None:
        n = int(req.path.rsplit("/", 1)[1])
        redirect(req, f"{other.url}/hop/{(n + 1) % 2 if kind == 'loop' else n + 1}")

    other.handler = hop
    proc, doc = export(tmp_path, f"docker://{fake.addr}/team/app:1")
    err = error_of(proc, doc)
    assert err["id"] == "registry-redirect" and err["exitCode"] == 6, proc.stderr
    assert ("a loop back to" if kind == "loop" else "at most 5 redirects") in err["message"]
    assert len(other.requests) <= 12


# ================================================================ the inventory of a registry


def test_one_failing_tag_leaves_the_rest_of_a_registry_inventory(fake: FakeRegistry) -> None:
    """A registry that keeps answering 500 for one tag's manifest (after the retries) no longer ends
    the whole ``--inventory --registry``: that tag is left out, said in the log, and counts as absent
    (a delta carries its layers); a refusal of the login (403) still ends it."""
    from importer.errors import RegistryAuthError
    from importer.registry.client import RegistryClient, parse_target
    from importer.registry.inventory import registry_inventory

    good = fake.image("team/app", "1")
    fake.image("team/app", "2", files={"other.txt": b"another layer\n"})
    fake.override["/v2/_catalog"] = lambda req: send_json(req, 200, {"repositories": ["team/app"]})
    fake.override["/v2/team/app/tags/list"] = lambda req: send_json(req, 200, {"name": "team/app", "tags": ["1", "2"]})
    fake.override["/v2/team/app/manifests/2"] = lambda req: send_json(req, 500, {"errors": [{"code": "UNKNOWN"}]})
    logs: list[str] = []
    client = RegistryClient(parse_target(fake.addr), attempts=2, backoff=0, log=logs.append)
    client.ping()  # HTTPS, then plain HTTP on loopback (as the sink's probe)
    images = registry_inventory(client, workers=2)
    assert [i.image_id for i in images] == [good["digest"]] and images[0].tags == [f"{fake.addr}/team/app:1"]
    assert any(line.startswith("team/app:2 left out of the inventory (counted as absent):") and "500" in line
               for line in logs), logs
    fake.override["/v2/team/app/manifests/2"] = lambda req: send_json(req, 403, {"errors": [{"code": "DENIED"}]})
    client = RegistryClient(parse_target(fake.addr), attempts=2, backoff=0)
    client.ping()
    with pytest.raises(RegistryAuthError):
        registry_inventory(client, workers=2)
