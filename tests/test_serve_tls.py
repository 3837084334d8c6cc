"""`bundle-import serve` over TLS with optional Basic auth, and the node configuration it prints
(issue 25, points 2 and 4). Engine-free here: curl and Python's ssl verify the self-signed CA (and
fail without it), the wrong protocol on either side gets a clear log line, an idle TLS client does
not hold others up, htpasswd users (PBKDF2, {SSHA}) get in and nobody else does, bad inputs are one
line with exit 2. tests/test_serve_engines.py pulls over TLS with Docker 26 (containerd store),
containerd (the generated hosts.toml) and podman."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from importer.serve import htpasswd
from importer.serve.htpasswd import Htpasswd, HtpasswdError, pbkdf2_line
from importer.serve.selfsigned import make_self_signed
from importer.serve.servelimits import LOGIN_FAILURES_BURST, LOGIN_FAILURES_PER_SECOND
from tests.kit.clijson import validate
from tests.kit.helpers import run_cli
from tests.kit.servekit import (
    CLIENTS,
    blob_bytes,
    bundle_doc,
    closed_by_server,
    connect,
    https_request,
    pyz,
    request,
    serving,
)
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
    # --idle-timeout 5, not the default 10 s: the five are closed 5 s sooner; the three requests must
    # end before that, so they were served while the five still sat there, not after they were closed
    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tmp_path / "tls"), "--idle-timeout", "5") as s:
        port = int(_port(s.addr))
        sat = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", port), 30) for _ in range(4)]
        stalled = socket.create_connection(("127.0.0.1", port), 30)
        stalled.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, then nothing
        try:
            for _ in range(3):  # served while five connections sit in (or before) their handshake
                assert https_request(f"localhost:{port}", "GET", "/v2/_catalog", ca=ca)[0] == 200
            assert time.monotonic() - sat < 5, "the requests waited for the idle connections' timeout"
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


def test_bundle_tls_cert_refuses_a_folder_others_may_write_or_a_ca_key_others_may_read(tmp_path: Path) -> None:
    """`bundle tls-cert DIR` keeps the CA key the nodes trust in DIR, as `serve --tls-self-signed DIR`
    does, so it holds DIR to the same rule: a folder group or others may write (anyone there could
    plant a CA) or a ca.key others may read is refused with the fix, before anything is written; a
    folder it makes is private (0700)."""
    from tests.kit.helpers import run_cli

    group_dir = tmp_path / "group_dir"
    group_dir.mkdir()
    group_dir.chmod(0o775)
    bad = run_cli("bundle", "tls-cert", str(group_dir), "--name", "gpu-gw", "--json")
    doc = json.loads(bad.stdout)
    assert bad.returncode == 2 and doc["error"]["id"] == "serve-tls-unsafe", bad
    assert f"using bundle tls-cert {group_dir}: expected it private" in doc["error"]["message"]
    assert f"chmod go-w {group_dir}" in doc["error"]["hint"]
    assert not list(group_dir.iterdir())  # refused before anything was made
    mine = tmp_path / "mine"
    made = run_cli("bundle", "tls-cert", str(mine), "--name", "gpu-gw", "--json")
    assert made.returncode == 0, made.stderr
    assert mine.stat().st_mode & 0o777 == 0o700
    (mine / "ca.key").chmod(0o644)
    leaked = run_cli("bundle", "tls-cert", str(mine), "--name", "gpu-gw", "--json")
    doc = json.loads(leaked.stdout)
    assert leaked.returncode == 2 and doc["error"]["id"] == "serve-tls-unsafe"
    assert "group or others may read or write" in doc["error"]["message"] and "chmod 600" in doc["error"]["hint"]


# ============================== issue 38, class 4: shared fairly (TLS deadlines, logins, the CA folder)


def _client_hello() -> bytes:
    """The bytes of a real TLS ClientHello (what a client sends first)."""
    ctx = ssl._create_unverified_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_tls_clients_silent_or_dribbling_their_handshake_are_closed_at_the_idle_timeout(
        made: dict[str, Path], tmp_path: Path) -> None:
    """The handshake runs against a deadline, not a socket timeout that starts again at each byte:
    a ClientHello dribbled a byte every 0.25 s (minutes for the whole of it) is cut at --idle-timeout
    like a silent client. Wall-clock bounds, wide: closed after 3 s and well before 8 s."""
    hello = _client_hello()
    with serving(pyz(made), made["folder"], "--tls-self-signed", str(tmp_path / "tls"), "--idle-timeout", "3") as s:
        opened = time.monotonic()
        silent = connect(s.addr)
        slow = connect(s.addr)
        stop = threading.Event()
        sent: list[int] = []

        def dribble() -> None:
            try:
                slow.sendall(hello[:5])  # the record header, then the rest a byte at a time
                for b in hello[5:]:
                    if stop.wait(0.25):
                        return
                    slow.sendall(bytes([b]))
                    sent.append(b)
            except OSError:
                pass

        t = threading.Thread(target=dribble)
        t.start()
        try:
            assert closed_by_server(silent, 30) and closed_by_server(slow, 30)
            took = time.monotonic() - opened
        finally:
            stop.set()
            t.join(30)
            silent.close()
            slow.close()
        assert 2.5 <= took <= 6.5, took
        assert len(sent) < len(hello) - 5  # cut off long before its ClientHello was whole
        assert https_request(f"localhost:{s.addr.rsplit(':', 1)[1]}", "GET", "/v2/", ca=tmp_path / "tls" / "ca.crt"
                             )[0] == 200
        assert s.stop() == 0
        log = s.stderr()
    assert "sent nothing within 3s of connecting: closed" in log, log
    assert "did not finish the TLS handshake within 3s: closed" in log and "Traceback" not in log, log


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _statuses(addr: str, source: str, headers: list[dict[str, str]]) -> list[tuple[int, dict[str, str]]]:
    """(status, headers) of one GET /v2/ per header set, all on one keep-alive connection from ``source``."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120, source_address=(source, 0))
    out = []
    try:
        for h in headers:
            conn.request("GET", "/v2/", headers=h)
            resp = conn.getresponse()
            resp.read()
            out.append((resp.status, {k.lower(): v for k, v in resp.getheaders()}))
    finally:
        conn.close()
    return out


ROUNDS = 400_000  # a hash of tens of ms of CPU: a flood that ran one per request would show


def test_a_login_flood_costs_no_more_hashing_than_the_refused_login_budget(made: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    """40 logins of a client that knows its password cost one PBKDF2 (remembered); 40 wrong passwords
    from one address cost at most the budget of refused logins (LOGIN_FAILURES_BURST, then
    LOGIN_FAILURES_PER_SECOND), the rest answered 429 with Retry-After and no hash. Measured in the
    server's CPU time, with a bound of whole hashes (a hash's CPU measured here): before the budget,
    the flood cost 40 hashes."""
    users = tmp_path / "htpasswd"
    users.write_text(f"{pbkdf2_line('alice', PASSWORD, rounds=ROUNDS)}\n"
                     f"{pbkdf2_line('bob', 'b0b-pw', rounds=ROUNDS)}\n")
    t0 = time.process_time()
    for _ in range(3):
        hashlib.pbkdf2_hmac("sha256", b"x", b"0123456789abcdef", ROUNDS)
    one_hash = (time.process_time() - t0) / 3
    with serving(pyz(made), made["folder"], "--htpasswd", str(users)) as s:
        cpu = s.cpu_seconds()
        good = _statuses(s.addr, CLIENTS[0], [_basic("alice", PASSWORD)] * 40)
        ok_cpu, cpu = s.cpu_seconds() - cpu, s.cpu_seconds()
        start = time.monotonic()
        flood = _statuses(s.addr, CLIENTS[1], [_basic("alice", f"guess-{i}") for i in range(40)])
        elapsed = time.monotonic() - start
        bad_cpu = s.cpu_seconds() - cpu
        assert [st for st, _ in good] == [200] * 40
        checked = [st for st, _ in flood if st == 401]
        throttled = [h for st, h in flood if st == 429]
        allowed = LOGIN_FAILURES_BURST + int(elapsed * LOGIN_FAILURES_PER_SECOND) + 1
        assert len(checked) + len(throttled) == 40 and 1 <= len(checked) <= allowed, (len(checked), elapsed)
        assert throttled and all(int(h["retry-after"]) >= 1 for h in throttled), throttled[:1]
        assert bad_cpu <= ok_cpu + (allowed + 1) * one_hash * 1.5 + 0.5, (bad_cpu, ok_cpu, one_hash, len(checked))
        # the budget is the flooding address's alone, and a login it already made needs no hash
        assert _statuses(s.addr, CLIENTS[2], [_basic("bob", "b0b-pw")])[0][0] == 200
        assert _statuses(s.addr, CLIENTS[1], [_basic("alice", PASSWORD)])[0][0] == 200
        assert s.stop() == 0
        log = s.stderr()
    assert " 429 " in log and "too many refused logins" in log and "Traceback" not in log
    assert PASSWORD not in log and "guess-1" not in log


def _mixed_users(path: Path) -> Path:
    """{SSHA} first (the cheapest hash: what an unknown user was checked against before), then PBKDF2."""
    path.write_text(f"{_ssha_line('bob', 'b0b-pw')}\n{pbkdf2_line('alice', PASSWORD, rounds=20000)}\n"
                    f"{pbkdf2_line('carol', 'c4rol', rounds=30000)}\n")
    return path


def test_refusing_an_unknown_user_costs_the_same_hash_work_as_a_known_one(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: the PBKDF2 rounds and SHA-1 calls of each check, whatever the user (known
    or not) and its kind of hash, are those of the costliest line plus one SHA-1 for the {SSHA} lines."""
    users = Htpasswd(str(_mixed_users(tmp_path / "htpasswd")))
    work = {"rounds": 0, "sha1": 0}
    pbkdf2, sha1 = hashlib.pbkdf2_hmac, hashlib.sha1

    def counted_pbkdf2(name: str, pw: bytes, salt: bytes, rounds: int, *a: Any) -> bytes:
        work["rounds"] += rounds
        return pbkdf2(name, pw, salt, rounds, *a)

    def counted_sha1(*a: Any, **k: Any) -> Any:
        work["sha1"] += 1
        return sha1(*a, **k)

    monkeypatch.setattr(htpasswd.hashlib, "pbkdf2_hmac", counted_pbkdf2)
    monkeypatch.setattr(htpasswd.hashlib, "sha1", counted_sha1)
    seen = {}
    for i, (user, password, ok) in enumerate([("mallory", "x", False), ("alice", "wrong", False),
                                              ("bob", "wrong", False), ("carol", "wrong", False),
                                              ("", "x", False), ("alice", PASSWORD, True), ("bob", "b0b-pw", True),
                                              ("carol", "c4rol", True)]):
        work.update(rounds=0, sha1=0)
        login = users.check(_basic(user, password)["Authorization"], f"10.0.0.{i}")
        assert login.ok is ok and not login.retry_after, (user, password)
        seen[f"{user}:{password}"] = dict(work)
    assert all(w == {"rounds": 30000, "sha1": 1} for w in seen.values()), seen


def test_an_unknown_user_costs_the_server_the_cpu_of_a_known_one(made: dict[str, Path], tmp_path: Path) -> None:
    """The same, measured in the real server's CPU time: wrong passwords for an unknown user and for a
    PBKDF2 user cost alike (before, an unknown user was checked against the file's first line, a
    one-round {SSHA}: next to nothing, which told which users exist). Each set from its own address
    and within its budget of refused logins."""
    users = tmp_path / "htpasswd"
    users.write_text(f"{_ssha_line('bob', 'b0b-pw')}\n{pbkdf2_line('alice', PASSWORD, rounds=ROUNDS)}\n")
    n = LOGIN_FAILURES_BURST - 1
    with serving(pyz(made), made["folder"], "--htpasswd", str(users)) as s:
        cpu = s.cpu_seconds()
        known = _statuses(s.addr, CLIENTS[0], [_basic("alice", f"guess-{i}") for i in range(n)])
        known_cpu, cpu = s.cpu_seconds() - cpu, s.cpu_seconds()
        unknown = _statuses(s.addr, CLIENTS[1], [_basic(f"nobody{i}", f"guess-{i}") for i in range(n)])
        unknown_cpu = s.cpu_seconds() - cpu
        assert [st for st, _ in known + unknown] == [401] * (2 * n)
        assert s.stop() == 0
    assert unknown_cpu >= 0.5 * known_cpu and known_cpu > 0, (unknown_cpu, known_cpu)


HIDERS = {"vt": "\x0b", "ff": "\x0c", "fs": "\x1c", "gs": "\x1d", "rs": "\x1e", "nel": "\x85", "ls": "\u2028",
          "ps": "\u2029", "cr": "\r"}


def test_a_comment_cannot_hide_a_credential_line(made: dict[str, Path], tmp_path: Path) -> None:
    """htpasswd lines end at \\n only: a user written after \\v, \\f, \\x1c-\\x1e, \\x85, U+2028, U+2029
    or a lone \\r inside a comment is part of the comment (str.splitlines made it a line of its
    own: a credential nobody sees in an editor). A CRLF file is read as its lines."""
    users = tmp_path / "htpasswd"
    hidden = "".join(f"# rotated {name}{ch}{pbkdf2_line(name, PASSWORD, rounds=1000)}\r\n"
                     for name, ch in HIDERS.items())
    users.write_bytes((hidden + f"{pbkdf2_line('bob', 'b0b-pw', rounds=1000)}\r\n").encode("utf-8"))
    parsed = Htpasswd(str(users))
    assert sorted(parsed.users) == ["bob"]
    with serving(pyz(made), made["folder"], "--htpasswd", str(users)) as s:
        for i, name in enumerate(HIDERS):  # spread over addresses: each within its budget of refused logins
            status, _, _ = request(s.addr, "GET", "/v2/", _basic(name, PASSWORD), source=CLIENTS[i % len(CLIENTS)])
            assert status == 401, name
        assert request(s.addr, "GET", "/v2/", _basic("bob", "b0b-pw"))[0] == 200  # the CRLF line
        assert s.stop() == 0


@pytest.mark.parametrize("name", ["vt", "nel", "ls", "cr"])
def test_a_credential_line_holding_a_line_separator_is_refused_at_start(made: dict[str, Path], tmp_path: Path,
                                                                        name: str) -> None:
    users = tmp_path / "htpasswd"
    users.write_bytes(f"# ok\n{pbkdf2_line('bob', 'b0b-pw', rounds=1000)}{HIDERS[name]}x\n".encode())
    with pytest.raises(HtpasswdError, match="line 2"):
        Htpasswd(str(users))
    _refused(_serve(made, "--htpasswd", str(users)), "serve-htpasswd", "line 2", "expected USER:HASH")


def _node_config(made: dict[str, Path], tls: Path) -> subprocess.CompletedProcess[str]:
    """`serve --tls-self-signed DIR --print-node-config`: the certificate is made (or refused) as for
    serving, then it prints and exits instead of serving."""
    return _serve(made, "--listen", "127.0.0.1:5443", "--tls-self-signed", str(tls), "--print-node-config")


def test_a_self_signed_folder_open_to_other_users_is_refused(made: dict[str, Path], tmp_path: Path) -> None:
    group_dir = tmp_path / "group_dir"
    group_dir.mkdir()
    group_dir.chmod(0o775)  # group may write: anyone in it may put a CA of theirs before the nodes
    doc = _refused(_node_config(made, group_dir), "serve-tls-unsafe", str(group_dir), "group or others may write",
                   "0775")
    assert f"chmod go-w {group_dir}" in doc["error"]["hint"]
    assert not list(group_dir.iterdir())  # refused before anything was made
    plain = run_cli("importer", "serve", str(made["folder"]), "--listen", "127.0.0.1:0", "--tls-self-signed",
                    str(group_dir), prefix=("timeout", "120"), timeout=300)
    assert plain.returncode == 2 and plain.stdout == "" and "Traceback" not in plain.stderr, plain.stderr
    assert plain.stderr.startswith(f"error[serve-tls-unsafe]: using --tls-self-signed {group_dir}: expected it private")
    assert "\nhint: chmod go-w" in plain.stderr

    mine = tmp_path / "mine"
    make_self_signed(str(mine), ["localhost"])
    key, crt = mine / "ca.key", mine / "ca.crt"
    for path, mode, found, fix in ((key, 0o644, "group or others may read or write (mode 0644)", f"chmod 600 {key}"),
                                   (key, 0o620, "group or others may read or write (mode 0620)", f"chmod 600 {key}"),
                                   (crt, 0o664, "group or others may write (mode 0664)", f"chmod 644 {crt}")):
        path.chmod(mode)
        doc = _refused(_node_config(made, mine), "serve-tls-unsafe", str(path), found)
        assert fix in doc["error"]["hint"]
        path.chmod(0o600 if path == key else 0o644)
    before = key.read_bytes()
    key.rename(mine / "real.key")
    key.symlink_to(mine / "real.key")
    _refused(_node_config(made, mine), "serve-tls-unsafe", str(key), "not a regular file")
    key.unlink()
    (mine / "real.key").rename(key)
    assert _node_config(made, mine).returncode == 0 and key.read_bytes() == before  # private again: used


def test_a_self_signed_folder_or_key_of_another_user_is_refused(made: dict[str, Path], tmp_path: Path) -> None:
    if os.geteuid() != 0:  # not root: a folder root owns is another user's
        doc = _refused(_node_config(made, Path("/usr")), "serve-tls-unsafe", "owned by uid 0")
        assert "chown" in doc["error"]["hint"]
        return
    nobody = 65534
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, nobody, nobody)
    doc = _refused(_node_config(made, theirs), "serve-tls-unsafe", str(theirs), f"owned by uid {nobody}")
    assert f"chown 0 {theirs}" in doc["error"]["hint"]
    assert not list(theirs.iterdir())
    mine = tmp_path / "mine"
    make_self_signed(str(mine), ["localhost"])
    os.chown(mine / "ca.key", nobody, nobody)  # 0600, but theirs: they can read it, and swap it
    _refused(_node_config(made, mine), "serve-tls-unsafe", str(mine / "ca.key"), f"owned by uid {nobody}")


def test_a_tls_folder_or_ca_file_that_cannot_be_looked_at_is_one_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--tls-self-signed FOLDER (or bundle tls-cert's) whose stat fails for another reason than
    absence: one error naming the option, the path, what was expected and found, and what to do."""
    import errno

    from importer.serve import selfsigned
    from importer.serve.servetls import ServeTLSError

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(ServeTLSError) as e:
        selfsigned.check_private(str(not_a_folder / "ca"))
    assert e.value.message == (f"reading --tls-self-signed {not_a_folder / 'ca'}: expected a folder this user can "
                               "read, found Not a directory"), e.value.message
    assert "pick another folder" in (e.value.hint or "")
    folder = tmp_path / "ca"
    folder.mkdir(mode=0o700)
    real = os.lstat

    def lstat(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith("ca.key"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(selfsigned.os, "lstat", lstat)
    with pytest.raises(ServeTLSError) as e:
        selfsigned.check_private(str(folder), using="bundle tls-cert")
    assert e.value.message == (f"reading bundle tls-cert {folder / 'ca.key'}: expected a readable file, found "
                               "Permission denied"), e.value.message
    assert "fix its permissions or remove it" in (e.value.hint or "")
