"""`bundle-import serve` over TLS with optional Basic auth, and the node configuration it prints
(issue 25, points 2 and 4). Engine-free here: curl and Python's ssl verify the self-signed CA (and
fail without it), the wrong protocol on either side gets a clear log line, an idle TLS client does
not hold others up, htpasswd users (PBKDF2, {SSHA}) get in and nobody else does, bad inputs are one
line with exit 2. tests/test_serve_engines.py pulls over TLS with Docker 26 (containerd store),
containerd (the generated hosts.toml) and podman."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

from importer.registry.htpasswd import pbkdf2_line
from importer.registry.selfsigned import make_self_signed
from tests.kit.clijson import validate
from tests.kit.helpers import run_cli
from tests.kit.servekit import blob_bytes, bundle_doc, https_request, pyz, request, serving
from tests.kit.servekit import made as made  # the fixture: one per module

PASSWORD = "n0de-s3cret"


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    curl = shutil.which("curl")
    if curl is None:
        from tests.kit import engines

        engines.unavailable("no curl (Debian package curl)")
    return subprocess.run([curl, "-sS", "--max-time", "60", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _port(addr: str) -> str:
    return addr.rsplit(":", 1)[1]


def test_a_self_signed_ca_verifies_the_server_and_is_kept_across_runs(made: dict[str, Path], tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tls)) as s:
        validate("serve", s.start)
        port = _port(s.addr)
        assert s.start["url"] == f"https://127.0.0.1:{port}"
        assert s.start["tls"]["ca"] == str(tls / "ca.crt")
        assert s.start["tls"]["names"] == ["127.0.0.1", "localhost", "::1"]
        assert s.start["tls"]["nodeCA"] == {
            "docker": f"/etc/docker/certs.d/127.0.0.1:{port}/ca.crt",
            "containerd": f"/etc/containerd/certs.d/127.0.0.1:{port}/hosts.toml",
            "podman": f"/etc/containers/certs.d/127.0.0.1:{port}/ca.crt"}
        assert s.start["pull"] == f"docker pull 127.0.0.1:{port}/carry/app:2" and s.start["auth"] is None
        for host in ("localhost", "127.0.0.1"):  # both names are in the certificate: curl checks them
            ok = _curl("--cacert", str(tls / "ca.crt"), f"https://{host}:{port}/v2/_catalog")
            assert ok.returncode == 0 and json.loads(ok.stdout) == {"repositories": ["carry/app", "carry/base"]}, ok
        untrusted = _curl(f"https://localhost:{port}/v2/")  # the system's CAs do not know it
        assert untrusted.returncode == 60, untrusted
        app = bundle_doc(made)["images"][1]
        layer = app["layers"][1]["digest"]
        status, _, body = https_request(f"localhost:{port}", "GET", f"/v2/carry/app/blobs/{layer}", ca=tls / "ca.crt")
        assert status == 200 and body == blob_bytes(made["folder"], layer)
        assert s.stop() == 0
        log = s.stderr()
    assert "TLS handshake failed" in log and "UNKNOWN_CA" in log.upper()  # curl without the CA, said clearly
    ca, cert = (tls / "ca.crt").read_bytes(), (tls / "server.crt").read_bytes()
    assert oct((tls / "ca.key").stat().st_mode & 0o777) == "0o600" and oct((tls / "server.key").stat().st_mode
                                                                           & 0o777) == "0o600"
    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tls), "--tls-name", "gpu-gw",
                 "--tls-name", "127.0.0.1") as s:
        assert (tls / "ca.crt").read_bytes() == ca and (tls / "server.crt").read_bytes() != cert  # nodes keep the CA
        assert s.start["tls"]["names"] == ["gpu-gw", "127.0.0.1"]
        ok = _curl("--cacert", str(tls / "ca.crt"), f"https://127.0.0.1:{_port(s.addr)}/v2/")
        assert ok.returncode == 0, ok
        wrong_name = _curl("--cacert", str(tls / "ca.crt"), f"https://localhost:{_port(s.addr)}/v2/")
        assert wrong_name.returncode == 60, wrong_name  # localhost is no longer in the certificate
        assert s.stop() == 0


def test_the_wrong_protocol_either_way_is_one_clear_line(made: dict[str, Path], tmp_path: Path) -> None:
    with serving(pyz(made), made["folder"]) as plain:
        ctx = ssl._create_unverified_context()
        with socket.create_connection(("127.0.0.1", int(_port(plain.addr))), 30) as raw, \
                pytest.raises(ssl.SSLError):  # Python's client: the server answered in plain HTTP
            ctx.wrap_socket(raw, server_hostname="localhost")
        https = _curl("-k", f"https://{plain.addr}/v2/")
        assert https.returncode == 35, https  # curl: TLS connect error, not a hang
        assert request(plain.addr, "GET", "/v2/")[0] == 200  # it still serves plain clients
        assert plain.stop() == 0
        log = plain.stderr()
    assert log.count("spoke TLS (https) to this plain-HTTP listener") == 2, log
    assert "\\x16" not in log and "Bad request" not in log  # no raw bytes, no http.server complaint
    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tmp_path / "tls")) as s:
        status, _, body = request(s.addr, "GET", "/v2/")
        assert status == 400 and b"speaks HTTPS" in body
        assert https_request(s.addr, "GET", "/v2/", ca=tmp_path / "tls" / "ca.crt")[0] == 200
        assert s.stop() == 0
        log = s.stderr()
    assert "spoke plain HTTP to this TLS listener" in log and "GET /v2/ HTTP" not in log


def test_idle_and_stalled_tls_clients_do_not_block_others(made: dict[str, Path], tmp_path: Path) -> None:
    ca = tmp_path / "tls" / "ca.crt"
    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tmp_path / "tls")) as s:
        port = int(_port(s.addr))
        idle = [socket.create_connection(("127.0.0.1", port), 30) for _ in range(4)]
        stalled = socket.create_connection(("127.0.0.1", port), 30)
        stalled.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, then nothing
        try:
            for _ in range(3):  # served while five connections sit in (or before) their handshake
                assert https_request(f"localhost:{port}", "GET", "/v2/_catalog", ca=ca)[0] == 200
            for sock in [*idle, stalled]:  # each is closed by the server once its handshake time is up
                sock.settimeout(60)
                assert sock.recv(100) == b""
        finally:
            for sock in [*idle, stalled]:
                sock.close()
        assert s.stop() == 0
        log = s.stderr()
    assert log.count("sent nothing within") == 4 and "did not finish the TLS handshake" in log, log


def _ssha_line(user: str, password: str) -> str:
    salt = os.urandom(8)
    return f"{user}:{{SSHA}}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def test_htpasswd_users_get_in_and_nobody_else(made: dict[str, Path], tmp_path: Path) -> None:
    users = tmp_path / "htpasswd"
    users.write_text(f"# nodes\n{pbkdf2_line('alice', PASSWORD, rounds=20000)}\n\n{_ssha_line('bob', 'b0b-pw')}\n")
    ca = tmp_path / "tls" / "ca.crt"
    app = bundle_doc(made)["images"][1]
    path = f"/v2/carry/app/manifests/{app['manifest']['digest']}"

    def basic(user: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tmp_path / "tls"), "--htpasswd", str(users)) as s:
        validate("serve", s.start)
        assert s.start["auth"] == "basic"
        addr = f"localhost:{_port(s.addr)}"
        for headers in ({}, basic("alice", "wrong"), basic("mallory", PASSWORD), {"Authorization": "Bearer x"},
                        {"Authorization": "Basic !!!"}, basic("alice", PASSWORD + "x")):
            for where in ("/v2/", path):
                status, got, body = https_request(addr, "GET", where, ca=ca, headers=headers)
                assert status == 401, (headers, where)
                assert got["www-authenticate"] == 'Basic realm="sneakernet-serve"'
                assert json.loads(body)["errors"][0]["code"] == "UNAUTHORIZED"
        for user, password in (("alice", PASSWORD), ("bob", "b0b-pw"), ("alice", PASSWORD)):
            status, _, body = https_request(addr, "GET", path, ca=ca, headers=basic(user, password))
            assert status == 200 and body == blob_bytes(made["folder"], app["manifest"]["digest"])
        assert s.stop() == 0
        log = s.stderr()
    assert " 401 " in log and " 200 " in log
    for secret in (PASSWORD, "b0b-pw", base64.b64encode(f"alice:{PASSWORD}".encode()).decode()):
        assert secret not in log


def _serve(made: dict[str, Path], *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("importer", "serve", str(made["folder"]), "--listen", "127.0.0.1:0", "--json", *extra, env=env,
                   timeout=300)


def _refused(proc: subprocess.CompletedProcess[str], error: str, *words: str) -> dict[str, Any]:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    validate("serve", doc)
    assert doc["error"]["id"] == error, doc
    for word in words:
        assert word in doc["error"]["message"], (word, doc)
    return doc  # type: ignore[no-any-return]


def test_bad_tls_and_htpasswd_inputs_are_one_line_each(made: dict[str, Path], tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_self_signed(str(a), ["localhost"])
    make_self_signed(str(b), ["localhost"])
    _refused(_serve(made, "--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", str(a / "server.key")),
             "serve-tls", "nope.crt", "readable PEM")
    _refused(_serve(made, "--tls-cert", str(a / "server.crt"), "--tls-key", str(b / "server.key")),
             "serve-tls", "its unencrypted PEM private key")  # a key of another certificate
    _refused(_serve(made, "--tls-cert", str(made["folder"] / "bundle.json"), "--tls-key", str(a / "server.key")),
             "serve-tls", "bundle.json")
    _refused(_serve(made, "--tls-cert", str(a / "server.crt")), "serve-tls", "expected both")
    _refused(_serve(made, "--tls-name", "gw"), "serve-tls", "--tls-self-signed")
    _refused(_serve(made, "--tls-self-signed", str(tmp_path / "c"), "--tls-name", "bad name!"), "serve-tls",
             "'bad name!'")
    assert not (tmp_path / "c").exists()  # refused before anything was written
    no_openssl = tmp_path / "bin"
    no_openssl.mkdir()
    doc = _refused(_serve(made, "--tls-self-signed", str(tmp_path / "d"), env={"PATH": str(no_openssl)}),
                   "serve-tls", "openssl")
    assert "--tls-cert DIR/server.crt" in doc["error"]["hint"] and "bundle tls-cert" in doc["error"]["hint"]
    users = tmp_path / "htpasswd"
    for line, found in (("alice:$2y$05$abcdefghijklmnopqrstuu5P6fJ1dlL0zWqtgRCv5X1Yz1v6aHGy", "bcrypt"),
                        ("alice:$apr1$x$y", "apr1"), ("alice:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "unsalted"),
                        ("alice:secret", "plain text"), ("just-a-name", "USER:HASH"),
                        ("alice:$pbkdf2-sha256$10$c2FsdA$aGFzaA", "rounds")):
        users.write_text(f"# ok\n{line}\n")
        doc = _refused(_serve(made, "--htpasswd", str(users)), "serve-htpasswd", found, "line 2")
        assert "pbkdf2-sha256" in doc["error"]["hint"]
    _refused(_serve(made, "--htpasswd", str(tmp_path / "none")), "serve-htpasswd", "readable file")
    users.write_text("# nobody\n")
    _refused(_serve(made, "--htpasswd", str(users)), "serve-htpasswd", "at least one")
    plain = run_cli("importer", "serve", str(made["folder"]), "--htpasswd", str(tmp_path / "none"), timeout=300)
    assert plain.returncode == 2 and plain.stdout == "" and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("error[serve-htpasswd]: reading --htpasswd "), plain.stderr


def _files(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["path"]: f for f in doc["files"]}


def test_node_config_for_the_served_bundle_and_for_a_site_registry(made: dict[str, Path], tmp_path: Path) -> None:
    proc = _serve(made, "--listen", "127.0.0.1:5443", "--tls-self-signed", str(tmp_path / "tls"),
                  "--print-node-config")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate("serve", doc)
    assert doc["mirror"] == "127.0.0.1:5443" and doc["scheme"] == "https" and doc["upstreams"] == ["docker.io"]
    files = _files(doc)
    ca = str(tmp_path / "tls" / "ca.crt")
    hub = files["/etc/containerd/certs.d/docker.io/hosts.toml"]["content"]
    assert hub == ('server = "https://registry-1.docker.io"\n\n[host."https://127.0.0.1:5443"]\n'
                   '  capabilities = ["pull", "resolve"]\n  ca = "/etc/containerd/certs.d/127.0.0.1:5443/ca.crt"\n')
    assert files["/etc/containerd/certs.d/127.0.0.1:5443/ca.crt"]["copyFrom"] == ca
    assert json.loads(files["/etc/docker/daemon.json (merge these keys)"]["content"]) == {
        "registry-mirrors": ["https://127.0.0.1:5443"]}
    assert files["/etc/docker/certs.d/127.0.0.1:5443/ca.crt"]["copyFrom"] == ca
    podman = files["/etc/containers/registries.conf.d/50-sneakernet-mirror.conf"]["content"]
    assert podman == '[[registry]]\nlocation = "docker.io"\n\n[[registry.mirror]]\nlocation = "127.0.0.1:5443"\n'
    assert files["/etc/containers/certs.d/127.0.0.1:5443/ca.crt"]["copyFrom"] == ca
    assert not list(Path(tmp_path).glob("**/*.pid"))  # it printed and exited: nothing served
    site = _serve(made, "--print-node-config", "--node-registry", "registry.internal:5000/team", "--node-ca",
                  "/srv/site-ca.crt")
    doc = json.loads(site.stdout)
    validate("serve", doc)
    hub = _files(doc)["/etc/containerd/certs.d/docker.io/hosts.toml"]["content"]
    assert '[host."https://registry.internal:5000/v2/team"]' in hub and "override_path = true" in hub
    assert any("Docker mirrors Docker Hub only" in n for n in doc["notes"])
    plain = _serve(made, "--print-node-config", "--node-registry", "http://gw:5000")
    doc = json.loads(plain.stdout)
    assert doc["scheme"] == "http" and 'insecure = true' in _files(doc)[
        "/etc/containers/registries.conf.d/50-sneakernet-mirror.conf"]["content"]
    text = run_cli("importer", "serve", str(made["folder"]), "--print-node-config", "--listen", "0.0.0.0:5000",
                   "--tls-self-signed", str(tmp_path / "tls"), "--tls-name", "gpu-gw", timeout=300)
    assert text.returncode == 0 and "# containerd: /etc/containerd/certs.d/docker.io/hosts.toml" in text.stdout
    assert '[host."https://gpu-gw:5000"]' in text.stdout
    _refused(_serve(made, "--print-node-config"), "usage", "port 0")


def test_bundle_tls_cert_makes_a_pair_serve_uses_without_openssl(made: dict[str, Path], tmp_path: Path) -> None:
    """`bundle tls-cert` (the cryptography module) makes what a host without openssl serves with
    --tls-cert/--tls-key; a second run keeps the CA; a bad name is refused before writing."""
    from tests.kit.helpers import run_cli

    folder = tmp_path / "pair"
    proc = run_cli("bundle", "tls-cert", str(folder), "--name", "localhost", "--name", "127.0.0.1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate("tls-cert", doc)
    assert doc["ca"] == str(folder / "ca.crt") and not doc["caReused"] and doc["names"] == ["localhost", "127.0.0.1"]
    assert oct((folder / "server.key").stat().st_mode & 0o777) == "0o600"
    ca = (folder / "ca.crt").read_bytes()
    with serving(pyz(made), made["folder"], "--tls-cert", doc["cert"], "--tls-key", doc["key"]) as s:
        assert s.start["tls"] == {"ca": None, "names": [], "nodeCA": None}
        for host in ("localhost", "127.0.0.1"):
            ok = _curl("--cacert", doc["ca"], f"https://{host}:{_port(s.addr)}/v2/_catalog")
            assert ok.returncode == 0 and "carry/app" in ok.stdout, ok
        assert s.stop() == 0
    again = json.loads(run_cli("bundle", "tls-cert", str(folder), "--name", "gpu-gw", "--json").stdout)
    assert again["caReused"] and (folder / "ca.crt").read_bytes() == ca
    verify = subprocess.run(["openssl", "verify", "-CAfile", doc["ca"], again["cert"]], capture_output=True,
                            text=True, check=False)
    assert verify.returncode == 0, verify.stderr  # signed by the kept CA
    bad = run_cli("bundle", "tls-cert", str(tmp_path / "other"), "--name", "no such/name", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["id"] == "serve-tls"
    validate("tls-cert", json.loads(bad.stdout))
    assert not (tmp_path / "other").exists()
