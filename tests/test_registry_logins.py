"""Registry logins and CAs the way skopeo, podman and Docker keep them, on every command that talks
to a registry (issue 40, points 1 and 6): --username/--password-stdin, --authfile, $REGISTRY_AUTH_FILE,
${XDG_RUNTIME_DIR}/containers/auth.json, Docker's config.json and its credential helpers; --cert-dir and
the certs.d folders; cheap checks first (a registry that cannot be reached fails at once, before the
bundle is verified). The resolvers are importer/registry/logins.py and importer/registry/certs.py.

The CLI tests run against one private Debian docker-registry on 127.0.0.1 with HTTPS (a CA made
here) and an htpasswd login, for the whole module. Every file the tests hand the tools is also read
as a hostile one (not JSON, huge, nested, wrong types, bad base64, a FIFO, a helper that hangs or
prints megabytes); no secret ever shows in output, errors or receipts."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from importer.errors import RegistryUnreachable, UsageError
from importer.registry.access import RegistryAccess
from importer.registry.auth import Credentials
from importer.registry.certs import CertDirs
from importer.registry.client import RegistryClient, RegistryTarget
from importer.registry.logins import Logins, run_helper
from tests.kit import engines
from tests.kit.engines import Registry
from tests.kit.helpers import run_cli
from tests.kit.transferkit import free_port, random_bundle

USER, PASSWORD = "carrier", "pw-9f3b-never-shown"
AUTH = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
WRONG = base64.b64encode(f"{USER}:not-the-password".encode()).decode()


# ------------------------------------------------------------------ certificates and files


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(folder: Path, cn: str = "sneakernet test CA") -> tuple[Path, Any]:
    """A CA (ca.crt in ``folder``) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return folder / "ca.crt", (cert, key)


def _issue(ca: Any, cn: str, usage: x509.ObjectIdentifier, *extensions: x509.ExtensionType
           ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate for ``cn`` signed by ``ca`` (valid from yesterday to the day after
    tomorrow, not a CA, extended key usage ``usage``, plus ``extensions``) and its new key."""
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    for ext in extensions:
        builder = builder.add_extension(ext, critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write_pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, crt: Path, pem: Path) -> tuple[Path, Path]:
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def make_server_cert(folder: Path, ca: Any) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost signed by ``ca`` (cert, key)."""
    names = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    cert, key = _issue(ca, "127.0.0.1", x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, names,
                       x509.AuthorityKeyIdentifier.from_issuer_public_key(ca[1].public_key()))
    return _write_pair(cert, key, folder / "server.crt", folder / "server.key")


def make_client_cert(folder: Path, ca: Any, name: str = "client") -> tuple[Path, Path]:
    """A client certificate (``NAME.cert``, ``NAME.key``: containers-certs.d(5) names) signed by ``ca``."""
    cert, key = _issue(ca, "sneakernet client", x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
    folder.mkdir(parents=True, exist_ok=True)
    crt, pem = _write_pair(cert, key, folder / f"{name}.cert", folder / f"{name}.key")
    pem.chmod(0o600)
    return crt, pem


def auth_file(path: Path, auths: dict[str, str], **extra: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": {k: {"auth": v} for k, v in auths.items()}, **extra}))
    return path


def helper_on_path(folder: Path, name: str, script: str) -> str:
    """``docker-credential-NAME`` (a shell script) in ``folder``; returns a PATH with it first."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / f"docker-credential-{name}"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


def quiet_env(tmp: Path, **extra: str) -> dict[str, str]:
    """An environment in which no login or CA of this host is found (HOME and XDG folders of the test)."""
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_RUNTIME_DIR": str(tmp / "run"),
           "DOCKER_CONFIG": str(home / ".docker"), "REGISTRY_AUTH_FILE": ""}
    env.update(extra)
    return env


def no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text and AUTH not in text, "a secret leaked"


# ------------------------------------------------------------------ the resolvers, unit by unit


def test_logins_precedence_follows_skopeo(tmp_path: Path) -> None:
    """flags > --authfile > $REGISTRY_AUTH_FILE > $XDG_RUNTIME_DIR/containers/auth.json >
    ~/.config/containers/auth.json > Docker's config.json; a named file is the only one read."""
    host = "reg.example:5000"
    env = quiet_env(tmp_path)
    docker = auth_file(Path(env["DOCKER_CONFIG"]) / "config.json", {host: base64.b64encode(b"docker:1").decode()})
    assert Logins(environ=env).credentials(host).username == "docker"  # type: ignore[union-attr]
    auth_file(Path(env["XDG_CONFIG_HOME"]) / "containers" / "auth.json", {host: base64.b64encode(b"cfg:1").decode()})
    assert Logins(environ=env).credentials(host).username == "cfg"  # type: ignore[union-attr]
    auth_file(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json", {host: base64.b64encode(b"run:1").decode()})
    assert Logins(environ=env).credentials(host).username == "run"  # type: ignore[union-attr]
    named = auth_file(tmp_path / "named.json", {host: base64.b64encode(b"env:1").decode()})
    env["REGISTRY_AUTH_FILE"] = str(named)
    assert Logins(environ=env).credentials(host).username == "env"  # type: ignore[union-attr]
    given = auth_file(tmp_path / "given.json", {"other.example": base64.b64encode(b"x:1").decode()})
    assert Logins(authfile=str(given), environ=env).credentials(host) is None  # that file only
    assert Logins(authfile=str(docker), environ=env).credentials(host).username == "docker"  # type: ignore[union-attr]
    flags = Credentials("flag", "1", source="--username/--password-stdin")
    assert Logins(flags, authfile=str(docker), environ=env).credentials(host) is flags


def test_the_most_specific_key_wins_and_urls_name_their_host(tmp_path: Path) -> None:
    host = "reg.example:5000"
    f = auth_file(tmp_path / "auth.json", {
        "https://reg.example:5000/v1/": base64.b64encode(b"url:1").decode(),
        "reg.example:5000/team": base64.b64encode(b"team:1").decode(),
        "reg.example:5000/team/app": base64.b64encode(b"app:1").decode(),
        "https://index.docker.io/v1/": base64.b64encode(b"hub:1").decode(),
    })
    logins = Logins(authfile=str(f), environ={})
    found = {repo: logins.credentials(host, repo).username for repo in  # type: ignore[union-attr]
             ("", "other/x", "team", "team/tool", "team/app", "team/app/sub")}
    assert found == {"": "url", "other/x": "url", "team": "team", "team/tool": "team", "team/app": "app",
                     "team/app/sub": "app"}
    assert logins.credentials("registry-1.docker.io", "library/busybox").username == "hub"  # type: ignore[union-attr]
    assert logins.credentials("reg.example:5001") is None  # another port is another registry


@pytest.mark.parametrize("content, says", [
    (b"{not json", "expected JSON"),
    (b"[" * 200_000 + b"]" * 200_000, "expected JSON"),  # nested past any stack
    (b"x" * (1024 * 1024 + 1), "at most"),
    (b'["auths"]', "JSON object"),
    (b'{"auths": {"reg.example:5000": {"auth": "%%%not-base64%%%"}}}', "base64"),
    (b'{"auths": {"reg.example:5000": {"auth": "' + base64.b64encode(b"no-colon") + b'"}}}', "base64"),
], ids=["not-json", "nested", "huge", "not-an-object", "not-base64", "no-colon"])
def test_a_hostile_authfile_is_refused_by_name(tmp_path: Path, content: bytes, says: str) -> None:
    f = tmp_path / "auth.json"
    f.write_bytes(content)
    with pytest.raises(UsageError) as err:
        logins = Logins(authfile=str(f), environ={})
        logins.check()
        logins.credentials("reg.example:5000")
    text = f"{err.value.message} {err.value.hint}"
    assert str(f) in text and says in text and "not-base64" not in text and "no-colon" not in text


def test_wrong_types_are_no_login_and_a_broken_default_file_is_named(tmp_path: Path) -> None:
    host = "reg.example:5000"
    odd = tmp_path / "odd.json"
    for doc in ({"auths": []}, {"auths": {host: "x"}}, {"auths": {host: {"auth": 5}}}, {"credHelpers": [1]},
                {"auths": {host: {"username": 1, "password": None}}}, {"credsStore": 7}, {}):
        odd.write_text(json.dumps(doc))
        assert Logins(authfile=str(odd), environ={}).credentials(host) is None, doc
    odd.write_text("")
    assert Logins(authfile=str(odd), environ={}).credentials(host) is None  # podman's empty file
    env = quiet_env(tmp_path)
    broken = Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{oops")
    auth_file(Path(env["DOCKER_CONFIG"]) / "config.json", {host: AUTH})
    logins = Logins(environ=env)
    assert logins.credentials(host).username == USER  # type: ignore[union-attr]  # skipped, the next one read
    assert str(broken) in logins.hint("other.example:1") and "expected JSON" in logins.hint("other.example:1")


def test_missing_or_special_named_files_are_refused_without_blocking(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="found nothing there"):
        Logins(authfile=str(tmp_path / "absent.json"), environ={}).check()
    with pytest.raises(UsageError, match="found nothing there"):
        Logins(environ={"REGISTRY_AUTH_FILE": str(tmp_path / "absent.json")}).credentials("reg.example")
    fifo = tmp_path / "auth.fifo"
    os.mkfifo(fifo)
    (tmp_path / "ca").mkdir()
    os.mkfifo(tmp_path / "ca" / "ca.crt")
    outcome: list[str] = []

    def read() -> None:
        for call in (lambda: Logins(authfile=str(fifo), environ={}).check(),
                     lambda: CertDirs(str(tmp_path / "ca")).check()):
            try:
                call()
            except UsageError as e:
                outcome.append(e.message)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a FIFO blocked the reader"
    assert len(outcome) == 2 and all("a FIFO" in m for m in outcome), outcome


def test_credential_helpers_are_bounded_and_never_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = helper_on_path(tmp_path / "bin", "good",
                          'server=$(cat)\n[ "$server" = reg.example:5000 ] || { echo "credentials not found"; '
                          f'exit 1; }}\nprintf \'{{"Username":"{USER}","Secret":"{PASSWORD}"}}\'\n')
    helper_on_path(tmp_path / "bin", "hangs", "exec sleep 60\n")
    helper_on_path(tmp_path / "bin", "floods", f"while :; do echo {PASSWORD}; done\n")
    helper_on_path(tmp_path / "bin", "junk", f"echo 'not json {PASSWORD}'\n")
    monkeypatch.setenv("PATH", path)
    creds, why = run_helper("good", "reg.example:5000")
    assert creds is not None and creds.username == USER and creds.password == PASSWORD and not why
    assert PASSWORD not in repr(creds)
    assert run_helper("good", "other.example")[0] is None
    started = time.monotonic()
    creds, why = run_helper("hangs", "reg.example:5000", timeout=1)
    assert creds is None and "no answer within 1 s" in why and time.monotonic() - started < 5
    creds, why = run_helper("floods", "reg.example:5000", timeout=20)
    assert creds is None and "more than" in why and time.monotonic() - started < 15
    for name in ("junk", "absent", "../../bin/sh"):
        creds, why = run_helper(name, "reg.example:5000")
        assert creds is None and why and PASSWORD not in why
    # credHelpers for the host first, then the most specific auths, then credsStore
    f = auth_file(tmp_path / "auth.json", {"reg.example:5000": WRONG}, credHelpers={"reg.example:5000": "good"})
    creds = Logins(authfile=str(f), environ={}).credentials("reg.example:5000")
    assert creds is not None and creds.source == "docker-credential-good"
    f = auth_file(tmp_path / "auth.json", {"elsewhere": WRONG}, credsStore="good")
    creds = Logins(authfile=str(f), environ={}).credentials("reg.example:5000")
    assert creds is not None and creds.password == PASSWORD


def test_cert_dirs_read_the_containers_layout(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    certs = CertDirs(environ=env, system=(str(tmp_path / "etc-containers"), str(tmp_path / "etc-docker")))
    assert certs.folders("reg.example:5000") == [str(tmp_path / "cfg" / "containers" / "certs.d" / "reg.example:5000"),
                                                 str(tmp_path / "etc-containers" / "reg.example:5000"),
                                                 str(tmp_path / "etc-docker" / "reg.example:5000")]
    assert certs.folders("../x") == [] and certs.folders("..") == []
    make_ca(tmp_path / "etc-docker" / "reg.example:5000")
    assert certs.ca_files("reg.example:5000") == [str(tmp_path / "etc-docker" / "reg.example:5000" / "ca.crt")]
    assert "ca.crt" in certs.hint("reg.example:5000") and "--insecure" not in certs.hint("reg.example:5000")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ca.crt").write_text("not a certificate")
    with pytest.raises(UsageError, match="PEM"):
        CertDirs(str(tmp_path / "bad")).check()
    with pytest.raises(UsageError, match="folder"):
        CertDirs(str(tmp_path / "absent")).check()


def test_an_unreachable_registry_fails_at_the_first_contact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused and unknown host: one try (two for a loopback registry: HTTPS, then HTTP), no retries."""
    client = RegistryClient(RegistryTarget(f"127.0.0.1:{free_port()}"), backoff=5)
    started = time.monotonic()
    with pytest.raises(RegistryUnreachable, match="refused"):
        client.ping()
    assert client.stats.retries == 0 and client.stats.requests <= 2 and time.monotonic() - started < 5

    def no_such_host(*_args: Any, **_kw: Any) -> socket.socket:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", no_such_host)
    client = RegistryClient(RegistryTarget("registry.invalid:5000"), backoff=5)
    with pytest.raises(RegistryUnreachable, match="does not resolve"):
        client.ping()
    assert client.stats.retries == 0 and client.stats.requests == 1


def test_a_ca_of_its_own_makes_a_loopback_registry_checked(tmp_path: Path) -> None:
    make_ca(tmp_path / "certs")
    access = RegistryAccess(certs=CertDirs(str(tmp_path / "certs")))
    assert not RegistryClient(RegistryTarget("127.0.0.1:5000"), access=access).insecure
    assert RegistryClient(RegistryTarget("127.0.0.1:5000"), access=RegistryAccess(certs=CertDirs(
        environ={"XDG_CONFIG_HOME": str(tmp_path / "none")}, system=()))).insecure
    access.insecure = True
    assert RegistryClient(RegistryTarget("127.0.0.1:5000"), access=access).insecure


# ------------------------------------------------------------------ through the real CLIs


@pytest.fixture(scope="module")
def tls_login(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path, Path]]:
    """(a registry with HTTPS by a private CA and an htpasswd login, the CA's folder, a bundle in it
    under team/)."""
    engines.require("docker-registry")
    tmp = tmp_path_factory.mktemp("logins")
    ca_file, ca = make_ca(tmp / "ca")
    crt, key = make_server_cert(tmp, ca)
    htpasswd = engines.bcrypt_htpasswd(tmp, USER, PASSWORD)
    bundle = random_bundle(tmp / "carry.bundle", mb=(1, 1))
    with engines.private_registry(f"i40login-{os.getpid()}", htpasswd=htpasswd, tls=(crt, key)) as reg:
        env = quiet_env(tmp)
        proc = run_cli("bundle", "push", str(bundle), f"{reg.addr}/team", "--json", "-q", "--cert-dir",
                       str(ca_file.parent), "--username", USER, "--password-stdin", input=PASSWORD + "\n", env=env,
                       timeout=300)
        assert proc.returncode == 0, proc.stderr
        yield reg, ca_file.parent, bundle


def test_push_with_an_authfile_and_cert_dir(tls_login: tuple[Registry, Path, Path], tmp_path: Path) -> None:
    reg, cadir, bundle = tls_login
    env = quiet_env(tmp_path)
    # the most specific key: the registry's own is wrong, its namespace's right
    f = auth_file(tmp_path / "auth.json", {reg.addr: WRONG, f"{reg.addr}/team": AUTH})
    proc = run_cli("bundle", "push", str(bundle), f"{reg.addr}/team", "--json", "-q", "--authfile", str(f),
                   "--cert-dir", str(cadir), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scheme"] == "https"
    wrong = run_cli("bundle", "push", str(bundle), f"{reg.addr}/other", "--json", "-q", "--authfile", str(f),
                    "--cert-dir", str(cadir), env=env, timeout=300)
    err = json.loads(wrong.stdout)["error"]
    assert err["id"] == "registry-auth" and str(f) in err["hint"], err
    no_secret(proc.stdout, proc.stderr, wrong.stdout, wrong.stderr)


def test_export_with_registry_auth_file_and_certs_d(tls_login: tuple[Registry, Path, Path], tmp_path: Path) -> None:
    """``bundle export docker://`` reads $REGISTRY_AUTH_FILE, the per-registry certs.d folder, and
    takes --username/--password-stdin."""
    reg, cadir, _bundle = tls_login
    env = quiet_env(tmp_path, REGISTRY_AUTH_FILE=str(auth_file(tmp_path / "env-auth.json", {reg.addr: AUTH})))
    certs_d = Path(env["XDG_CONFIG_HOME"]) / "containers" / "certs.d" / reg.addr
    certs_d.mkdir(parents=True)
    (certs_d / "ca.crt").write_bytes((cadir / "ca.crt").read_bytes())
    ref = f"docker://{reg.addr}/team/carry/app:2"
    proc = run_cli("bundle", "export", ref, "-o", str(tmp_path / "a.bundle"), "--json", "-q", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    flags = run_cli("bundle", "export", ref, "-o", str(tmp_path / "b.bundle"), "--json", "-q", "--username", USER,
                    "--password-stdin", "--cert-dir", str(cadir), input=PASSWORD + "\n",
                    env=quiet_env(tmp_path / "x"), timeout=300)
    assert flags.returncode == 0, flags.stderr
    no_secret(proc.stdout, proc.stderr, flags.stdout, flags.stderr)


def test_a_registry_ca_that_does_not_sign_says_where_cas_go(tls_login: tuple[Registry, Path, Path],
                                                            tmp_path: Path) -> None:
    reg, _cadir, _bundle = tls_login
    other, _ = make_ca(tmp_path / "other-ca", "another CA")
    env = quiet_env(tmp_path, REGISTRY_AUTH_FILE=str(auth_file(tmp_path / "auth.json", {reg.addr: AUTH})))
    proc = run_cli("bundle", "export", f"docker://{reg.addr}/team/carry/app:2", "-o", str(tmp_path / "o"), "--json",
                   "-q", "--cert-dir", str(other.parent), env=env, timeout=120)
    err = json.loads(proc.stdout)["error"]
    assert err["id"] == "registry" and "trusted TLS certificate" in err["message"], err
    assert "--cert-dir" in err["hint"] and "--insecure" not in err["hint"], err


def test_inventory_and_import_with_xdg_auth_and_a_credential_helper(tls_login: tuple[Registry, Path, Path],
                                                                     tmp_path: Path) -> None:
    reg, cadir, bundle = tls_login
    env = quiet_env(tmp_path)
    auth_file(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json", {reg.addr: AUTH})
    inv = run_cli("importer", "--inventory", "--registry", f"{reg.addr}/team", "--cert-dir", str(cadir), env=env,
                  timeout=300)
    assert inv.returncode == 0, inv.stderr
    assert any(t.endswith("/team/carry/app:2") for i in json.loads(inv.stdout)["images"] for t in i["names"])
    # Docker's config.json naming a credential helper for the registry
    helper_env = quiet_env(tmp_path / "h")
    helper_env["PATH"] = helper_on_path(tmp_path / "bin", "sneakertest",
                                        f'[ "$(cat)" = {reg.addr} ] || exit 1\n'
                                        f'printf \'{{"Username":"{USER}","Secret":"{PASSWORD}"}}\'\n')
    auth_file(Path(helper_env["DOCKER_CONFIG"]) / "config.json", {}, credHelpers={reg.addr: "sneakertest"})
    receipt = tmp_path / "receipt.json"
    imp = run_cli("importer", str(bundle), "--engine", "registry", "--registry", f"{reg.addr}/helped", "--cert-dir",
                  str(cadir), "--receipt", str(receipt), "-q", env=helper_env, timeout=300)
    assert imp.returncode == 0, imp.stderr
    no_secret(inv.stdout, inv.stderr, imp.stdout, imp.stderr, receipt.read_text())


def test_no_login_names_every_way_to_give_one(tls_login: tuple[Registry, Path, Path], tmp_path: Path) -> None:
    reg, cadir, _bundle = tls_login
    proc = run_cli("bundle", "export", f"docker://{reg.addr}/team/carry/app:2", "-o", str(tmp_path / "o"), "--json",
                   "-q", "--cert-dir", str(cadir), env=quiet_env(tmp_path), timeout=120)
    err = json.loads(proc.stdout)["error"]
    assert err["id"] == "registry-auth", err
    for way in ("podman login", "docker login", "--authfile", "--username", "--password-stdin"):
        assert way in err["hint"], (way, err["hint"])


def _damaged(bundle: Path, tmp_path: Path) -> Path:
    """A copy of ``bundle`` with one blob longer than pinned: its verification fails."""
    import shutil

    copy = tmp_path / "damaged.bundle"
    shutil.copytree(bundle, copy)
    blob = max((copy / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    blob.chmod(blob.stat().st_mode | stat.S_IWUSR)
    with blob.open("ab") as f:
        f.write(b"x")
    return copy


def test_cheap_checks_come_before_verifying_every_byte(tls_login: tuple[Registry, Path, Path],
                                                       tmp_path: Path) -> None:
    """A refused connection, a wrong login, an SSH host that does not answer: each said before the
    bundle is verified (the damaged bundle would fail verification), with no retries."""
    _reg, cadir, bundle = tls_login
    damaged = _damaged(bundle, tmp_path)
    closed = f"127.0.0.1:{free_port()}"
    env = quiet_env(tmp_path)
    runs = {
        "push": run_cli("bundle", "push", str(damaged), closed, "--json", env=env, timeout=60),
        "import": run_cli("importer", str(damaged), "--engine", "registry", "--registry", closed, "--json",
                          "--no-receipt", env=env, timeout=60),
    }
    for what, proc in runs.items():
        err = json.loads(proc.stdout)["error"]
        assert err["id"] == "registry-unreachable" and "refused" in err["message"], (what, err)
        assert "retrying" not in proc.stderr, (what, proc.stderr)
    login = run_cli("bundle", "push", str(damaged), f"{_reg.addr}/team", "--json", "--cert-dir", str(cadir),
                    "--username", USER, "--password-stdin", input="wrong\n", env=env, timeout=60)
    assert json.loads(login.stdout)["error"]["id"] == "registry-auth", login.stdout
    engines.require("ssh")
    ssh = run_cli("bundle", "push", str(damaged), "10.0.0.1:5000", "--json", "--ssh", "nobody@127.0.0.1",
                  "--ssh-port", str(free_port()), env=env, timeout=60)
    assert json.loads(ssh.stdout)["error"]["id"] == "ssh-tunnel", ssh.stdout


def test_a_registry_that_wants_a_client_certificate_gets_the_one_in_certs_d(tmp_path: Path) -> None:
    """Mutual TLS (docker-registry's http.tls.clientcas): the client certificate and key of the
    registry's certs.d folder (or --cert-dir), NAME.cert + NAME.key as containers-certs.d(5) names
    them, are presented; without one the push fails in one line saying where it goes; a .cert
    without its .key is refused before anything is sent."""
    engines.require("docker-registry")
    ca_file, ca = make_ca(tmp_path / "ca")
    crt, key = make_server_cert(tmp_path, ca)
    probe = make_client_cert(tmp_path / "probe", ca)
    bundle = random_bundle(tmp_path / "carry.bundle", mb=(1, 1))
    with engines.private_registry(f"i40mtls-{os.getpid()}", tls=(crt, key), client_ca=(ca_file, *probe)) as reg:
        env = quiet_env(tmp_path)
        certs_d = Path(env["XDG_CONFIG_HOME"]) / "containers" / "certs.d" / reg.addr
        certs_d.mkdir(parents=True)
        (certs_d / "ca.crt").write_bytes(ca_file.read_bytes())
        bare = run_cli("bundle", "push", str(bundle), f"{reg.addr}/team", "--json", "-q", env=env, timeout=300)
        err = json.loads(bare.stdout)["error"]
        assert bare.returncode != 0 and "client certificate" in err["message"], err
        assert str(certs_d) in err["hint"] and "client.cert" in err["hint"], err
        make_client_cert(certs_d, ca)
        proc = run_cli("bundle", "push", str(bundle), f"{reg.addr}/team", "--json", "-q", env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["scheme"] == "https"
        cert_dir = tmp_path / "cert-dir"
        cert_dir.mkdir()
        (cert_dir / "ca.crt").write_bytes(ca_file.read_bytes())
        (cert_dir / "me.cert").write_bytes((certs_d / "client.cert").read_bytes())
        lone = run_cli("bundle", "push", str(bundle), f"{reg.addr}/other", "--json", "-q", "--cert-dir",
                       str(cert_dir), env=quiet_env(tmp_path / "x"), timeout=300)
        err = json.loads(lone.stdout)["error"]
        assert lone.returncode == 2 and err["id"] == "usage" and str(cert_dir / "me.key") in err["message"], err
        (cert_dir / "me.key").write_bytes((certs_d / "client.key").read_bytes())
        flags = run_cli("bundle", "push", str(bundle), f"{reg.addr}/other", "--json", "-q", "--cert-dir",
                        str(cert_dir), env=quiet_env(tmp_path / "x"), timeout=300)
        assert flags.returncode == 0, flags.stdout + flags.stderr
