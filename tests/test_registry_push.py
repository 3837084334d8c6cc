"""Registry push (issue 5) against a real Debian docker-registry on 127.0.0.1: push and re-push
(zero blobs the second time, counted in the registry's access log), through an SSH tunnel to a
private sshd, across a connection cut mid-blob and between requests, across injected 500s, no
retry on a 4xx, `docker pull` of the pushed image giving the same image ID, and the registry as
an import target (`bundle-import --engine registry`) with tag conflicts."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from tests.kit import engines
from tests.kit.engines import Registry
from tests.kit.fixtures import auth_registry as auth_registry  # the fixture, one per module
from tests.kit.helpers import REPO, docker, image_facts, run_cli, run_pyz
from tests.kit.imagegen import simple_context
from tests.kit.transferkit import (
    FlakyProxy,
    blob_upload_requests,
    free_port,
    log_size,
    random_bundle,
    start_sshd,
    stop_sshd,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    with engines.private_registry(f"i5-{os.getpid()}") as reg:
        yield reg


@pytest.fixture(scope="module")
def sshd(registry: Registry) -> Iterator[Path]:
    engines.require_root("starting a private sshd")
    engines.require("sshd")
    engines.require("ssh")
    engines.require("ssh-keygen")
    name = f"i5-{os.getpid()}"
    try:
        state = start_sshd(name, free_port(), registry.addr)
    except engines.EngineError as e:
        engines.unavailable(f"could not start the private sshd: {e}")
    try:
        yield state
    finally:
        stop_sshd(name)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_bundle(tmp_path_factory.mktemp("push") / "carry.bundle")


def _push(bundle: Path, target: str, *extra: str) -> dict:
    proc = run_cli("bundle", "push", str(bundle), target, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _manifest_bytes(addr: str, repo: str, tag: str) -> bytes:
    req = urllib.request.Request(f"http://{addr}/v2/{repo}/manifests/{tag}",
                                 headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return bytes(r.read())


def test_push_then_repush_sends_no_blob(registry: Registry, bundle: Path) -> None:
    before = log_size(registry.name)
    first = _push(bundle, f"{registry.addr}/team", "--chunk-size", "1M")
    assert first["ok"] and first["scheme"] == "http"
    assert [i["pushedTo"] for i in first["images"]] == [f"{registry.addr}/team/carry/base:1",
                                                        f"{registry.addr}/team/carry/app:2"]
    # 2 configs + 2 layers uploaded once; the shared base layer mounted into the second repository
    assert first["blobs"] == {"uploaded": 4, "mounted": 1, "present": 0,
                              "bytesUploaded": first["blobs"]["bytesUploaded"]}
    assert first["blobs"]["bytesUploaded"] > 9 * 1024 * 1024
    assert blob_upload_requests(registry.name, before)  # the log counts what we count
    doc = json.loads((bundle / "bundle.json").read_text())
    for image, pushed in zip(doc["images"], first["images"]):
        assert pushed["readBack"]["ok"] and pushed["readBack"]["manifestDigest"] == image["manifest"]["digest"]
        repo, tag = pushed["repository"], pushed["tag"]
        raw = _manifest_bytes(registry.addr, repo, tag)
        assert raw == (bundle / "blobs" / "sha256" / image["manifest"]["digest"][7:]).read_bytes()  # exact bytes

    before = log_size(registry.name)
    second = _push(bundle, f"{registry.addr}/team")
    assert second["blobs"]["uploaded"] == 0 and second["blobs"]["mounted"] == 0
    assert [i["status"] for i in second["images"]] == ["already-present", "already-present"]
    assert blob_upload_requests(registry.name, before) == []  # zero blob requests reached the registry


def test_push_from_parts_and_a_tar_without_unpacking(registry: Registry, bundle: Path, tmp_path: Path) -> None:
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "c.tar"), "--split", "2M", check=True)
    out = _push(tmp_path / "c.tar.parts.json", f"{registry.addr}/fromparts", "--chunk-size", "1M")
    assert out["ok"] and out["blobs"]["uploaded"] == 4
    assert not (tmp_path / "c.tar").exists()  # read in place: nothing joined


def test_push_through_an_ssh_tunnel(registry: Registry, sshd: Path, bundle: Path) -> None:
    port = int(next(line.split()[0].rsplit(":", 1)[1] for line in (sshd / "known_hosts").read_text().splitlines()))
    ssh = ["--ssh", "root@127.0.0.1", "--ssh-port", str(port), "--identity", str(sshd / "id_ed25519"),
           "--ssh-option", f"UserKnownHostsFile={sshd / 'known_hosts'}", "--ssh-option", "StrictHostKeyChecking=yes"]
    out = _push(bundle, f"{registry.addr}/viassh", *ssh)
    assert out["ok"] and out["via"].startswith("ssh root@127.0.0.1")
    assert out["images"][0]["pushedTo"] == f"{registry.addr}/viassh/carry/base:1"  # the far side's name
    local = int(out["via"].rsplit(":", 1)[1])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", local), timeout=2):
        pass  # the tunnel is closed after the push
    # the SSH server only forwards to the registry port (PermitOpen): anything else is refused, named
    refused = run_cli("bundle", "push", str(bundle), f"127.0.0.1:{free_port()}/x", *ssh)
    assert refused.returncode == 6, refused.stderr
    assert "error[ssh-tunnel]" in refused.stderr and "PermitOpen" in refused.stderr


def test_a_connection_cut_mid_blob_is_resumed_or_restarted_and_completes(registry: Registry, bundle: Path) -> None:
    with FlakyProxy(registry.port, cut_mid_at=int(2.5 * 1024 * 1024)) as proxy:
        out = _push(bundle, f"127.0.0.1:{proxy.port}/cutmid", "--chunk-size", "1M", "--concurrency", "1")
        assert proxy.cuts == 1
    assert out["ok"]
    # distribution 2.x cancels a session whose PATCH was cut ("upload resumed at wrong offset"):
    # the client asked for the offset, then sent that blob again in a new session
    assert out["requests"]["resumes"] + out["requests"]["restarts"] >= 1
    assert all(i["readBack"]["ok"] for i in out["images"])


def test_a_connection_cut_between_requests_resumes_at_the_registry_offset(registry: Registry,
                                                                           bundle: Path) -> None:
    with FlakyProxy(registry.port, cut_between_at=int(2.5 * 1024 * 1024)) as proxy:
        out = _push(bundle, f"127.0.0.1:{proxy.port}/cutbetween", "--chunk-size", "1M", "--concurrency", "1")
        assert proxy.cuts == 1
        patches = [line for line in proxy.lines if line.startswith("PATCH")]
    assert out["ok"]
    assert out["requests"]["resumes"] == 1 and out["requests"]["restarts"] == 0
    # resumed where the registry was: no chunk was sent twice beyond the one cut before it left
    assert out["requests"]["bytesSent"] < out["blobs"]["bytesUploaded"] + 1024 * 1024 + 1
    assert len(patches) >= 10


def test_a_registry_answering_500_then_recovering(registry: Registry, bundle: Path) -> None:
    with FlakyProxy(registry.port, fail_first=2, fail_match=b"PATCH") as proxy:
        out = _push(bundle, f"127.0.0.1:{proxy.port}/flaky", "--chunk-size", "1M", "--concurrency", "1")
        assert proxy.failed == 2
    assert out["ok"] and out["requests"]["resumes"] == 2
    with FlakyProxy(registry.port, fail_first=3, fail_match=b"HEAD") as proxy:
        out = _push(bundle, f"127.0.0.1:{proxy.port}/flaky2")
        assert proxy.failed == 3
    assert out["ok"] and out["requests"]["retries"] >= 3


def _tags(addr: str, repo: str) -> list[str]:
    """The tags the registry lists for ``repo`` (none when it knows no such repository)."""
    try:
        with urllib.request.urlopen(f"http://{addr}/v2/{repo}/tags/list", timeout=30) as r:
            return list(json.loads(r.read()).get("tags") or [])
    except urllib.error.HTTPError as e:
        assert e.code == 404, e
        return []


def test_a_failed_read_back_by_digest_moves_no_tag(registry: Registry, bundle: Path) -> None:
    """`bundle push` reads every image back by digest before it writes a tag: a registry that
    answers no manifest GET (404) fails the push (exit 8, naming REPO@DIGEST) with every manifest
    there by digest and no tag written."""
    with FlakyProxy(registry.port, fail_first=1000, fail_match=b"GET /v2/lost/", fail_status=404) as proxy:
        proc = run_cli("bundle", "push", str(bundle), f"127.0.0.1:{proxy.port}/lost", "--concurrency", "1")
    assert proc.returncode == 8 and "error[post-load-mismatch]" in proc.stderr, proc.stderr
    images = json.loads((bundle / "bundle.json").read_text())["images"]
    for image in images:
        repo = image["refs"][0].rsplit(":", 1)[0]
        assert f"lost/{repo}@{image['manifest']['digest']}: the registry does not have it" in proc.stderr
        raw = _manifest_bytes(registry.addr, f"lost/{repo}", image["manifest"]["digest"])  # pushed by digest
        assert raw == (bundle / "blobs" / "sha256" / image["manifest"]["digest"][7:]).read_bytes()
        assert _tags(registry.addr, f"lost/{repo}") == []  # never tagged
    assert "no tag was written or moved" in proc.stderr
    assert not [line for line in proxy.lines if line.startswith("PUT /v2/lost/") and "/manifests/sha256:" not in line
                and "/blobs/" not in line]  # no tag PUT reached the registry


def test_a_tag_that_reads_back_wrong_after_its_put_is_a_mismatch(registry: Registry, bundle: Path) -> None:
    """Each tag is HEAD again after it is written: a registry that does not name the pushed digest
    under it (404 to every HEAD of that tag) fails the push (exit 8), naming the tag."""
    with FlakyProxy(registry.port, fail_first=1000, fail_match=b"HEAD /v2/headless/carry/base/manifests/1 ",
                    fail_status=404) as proxy:
        proc = run_cli("bundle", "push", str(bundle), f"127.0.0.1:{proxy.port}/headless", "--concurrency", "1")
    assert proc.returncode == 8 and "error[post-load-mismatch]" in proc.stderr, proc.stderr
    assert f"tagging 127.0.0.1:{proxy.port}/headless/carry/base:1: expected the tag to name sha256:" in proc.stderr
    assert "found nothing" in proc.stderr
    assert any(line.startswith("PUT /v2/headless/carry/base/manifests/1 ") for line in proxy.lines)


def test_a_4xx_is_not_retried(registry: Registry, bundle: Path) -> None:
    with FlakyProxy(registry.port, fail_first=100, fail_match=b"HEAD", fail_status=400) as proxy:
        proc = run_cli("bundle", "push", str(bundle), f"127.0.0.1:{proxy.port}/refused", "--concurrency", "1")
        heads = [line for line in proxy.lines if line.startswith("HEAD")]
    assert proc.returncode == 6, proc.stderr
    assert "error[registry]" in proc.stderr and "found 400" in proc.stderr
    assert heads and len(heads) == len(set(heads))  # each refused once, never retried


def test_docker_pull_of_the_pushed_image_gives_the_same_image_id(registry: Registry, docker_host: str,
                                                                   busybox: str, tmp_path: Path) -> None:
    """Docker 20.10 cannot pull zstd layers: this is the gzip bundle path (docs/transfer.md)."""
    image_id = engines.build_image(docker_host, simple_context(tmp_path / "ctx", busybox, "pulled"), "pullme/app:1")
    out_dir = tmp_path / "gz.bundle"
    run_cli("bundle", "export", "pullme/app:1", "-o", str(out_dir), "--compression", "gzip",
            docker_host=docker_host, check=True)
    pushed = _push(out_dir, f"{registry.addr}/nodes")
    ref = pushed["images"][0]["pushedTo"]
    assert ref == f"{registry.addr}/nodes/pullme/app:1"
    docker(docker_host, "image", "rm", "pullme/app:1")
    assert image_facts(docker_host, image_id) is None
    docker(docker_host, "pull", ref)
    facts = image_facts(docker_host, ref)
    assert facts is not None and facts[0] == image_id
    docker(docker_host, "image", "rm", ref)


def test_registry_as_the_import_target(registry: Registry, bundle: Path, tmp_path: Path) -> None:
    run_cli("bundle", "pack", str(bundle), str(tmp_path / "c.tar"), "--split", "3M", check=True)
    pyz = tmp_path / "bundle-import.pyz"
    receipt = tmp_path / "r.json"

    def import_(*extra: str) -> tuple[int, str]:
        proc = run_pyz(tmp_path / "c.tar.parts.json", "--verify", "--engine", "registry", "--registry",
                       f"{registry.addr}/imported", "--receipt", str(receipt), *extra, pyz=pyz, timeout=600)
        return proc.returncode, proc.stderr

    rc, err = import_()
    assert rc == 0, err
    doc = json.loads(receipt.read_text())
    schema = json.loads((REPO / "schemas" / "receipt" / "import-v1.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    assert doc["result"] == "pass" and doc["engine"]["kind"] == "registry"
    assert [c["identityRule"] for c in doc["images"]] == ["manifest-digest", "manifest-digest"]
    assert [c["status"] for c in doc["images"]] == ["loaded", "loaded"]
    rc, err = import_()
    assert rc == 0, err
    assert [c["status"] for c in json.loads(receipt.read_text())["images"]] == ["already-present"] * 2

    # another bundle with the same refs: the tags are not moved without --force
    other = random_bundle(tmp_path / "other.bundle", mb=(1, 1), seed=7)
    run_cli("bundle", "pack", str(other), str(tmp_path / "c.tar"), "--split", "3M", "--force", check=True)
    rc, err = import_()
    assert rc == 7 and "error[tag-conflict]" in err, err
    rc, err = import_("--force")
    assert rc == 0, err
    assert json.loads(receipt.read_text())["images"][0]["tagsApplied"] == [f"{registry.addr}/imported/carry/base:1"]


def _push_with(bundle: Path, target: str, *extra: str, stdin: str = "",
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("bundle", "push", str(bundle), target, "--json", *extra, input=stdin, env=env, timeout=600)


def test_credentials_from_flags_or_the_docker_config_and_never_printed(auth_registry: Registry, bundle: Path,
                                                                         tmp_path: Path) -> None:
    empty = tmp_path / "no-config"
    empty.mkdir()
    anon = _push_with(bundle, f"{auth_registry.addr}/a", env={"DOCKER_CONFIG": str(empty)})
    assert anon.returncode == 6 and "error[registry-auth]" in anon.stderr and "docker login" in anon.stderr
    wrong = _push_with(bundle, f"{auth_registry.addr}/a", "--username", "alice", "--password-stdin",
                       stdin="not-it\n", env={"DOCKER_CONFIG": str(empty)})
    assert wrong.returncode == 6 and "refused the credentials" in wrong.stderr and "'alice'" in wrong.stderr
    flags = _push_with(bundle, f"{auth_registry.addr}/a", "--username", "alice", "--password-stdin",
                       stdin="s3cret-pw\n", env={"DOCKER_CONFIG": str(empty)})
    assert flags.returncode == 0, flags.stderr
    config = tmp_path / "docker"
    config.mkdir()
    auth = base64.b64encode(b"alice:s3cret-pw").decode()
    (config / "config.json").write_text(json.dumps({"auths": {auth_registry.addr: {"auth": auth}}}))
    login = _push_with(bundle, f"{auth_registry.addr}/b", env={"DOCKER_CONFIG": str(config)})
    assert login.returncode == 0, login.stderr
    assert json.loads(login.stdout)["ok"]
    for proc in (anon, wrong, flags, login):
        assert "s3cret-pw" not in proc.stdout + proc.stderr and auth not in proc.stdout + proc.stderr


def test_push_over_tls_with_an_htpasswd_login(bundle: Path, tmp_path: Path) -> None:
    """Debian's docker-registry serving HTTPS (a CA made by serve's --tls-self-signed code) with bcrypt
    htpasswd: the push speaks TLS, is refused without the right password, and what it wrote reads back
    through a client that checks the certificate against the CA."""
    from importer.serve.selfsigned import make_self_signed

    engines.require("docker-registry")
    made = make_self_signed(str(tmp_path / "tls"), ["localhost", "127.0.0.1"])
    htpasswd = engines.bcrypt_htpasswd(tmp_path, "alice", "tls-pw")
    empty = tmp_path / "no-config"
    empty.mkdir()
    env = {"DOCKER_CONFIG": str(empty)}
    with engines.private_registry(f"i5tls-{os.getpid()}", htpasswd=htpasswd,
                                  tls=(Path(made.cert), Path(made.key))) as reg:
        assert reg.tls
        target = f"{reg.addr}/secure"
        wrong = _push_with(bundle, target, "--username", "alice", "--password-stdin", stdin="nope\n", env=env)
        assert wrong.returncode == 6 and "error[registry-auth]" in wrong.stderr, wrong.stderr
        proc = _push_with(bundle, target, "--username", "alice", "--password-stdin", stdin="tls-pw\n", env=env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["scheme"] == "https"  # TLS, not a fallback to plain HTTP
        assert "tls-pw" not in proc.stdout + proc.stderr
        app = json.loads((bundle / "bundle.json").read_text())["images"][1]
        ctx = ssl.create_default_context(cafile=made.ca)  # checks the chain and the name localhost
        req = urllib.request.Request(
            f"https://localhost:{reg.port}/v2/secure/carry/app/manifests/2",
            headers={"Accept": app["manifest"]["mediaType"],
                     "Authorization": "Basic " + base64.b64encode(b"alice:tls-pw").decode()})
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            body = r.read()
        assert body == (bundle / "blobs" / "sha256" / app["manifest"]["digest"][7:]).read_bytes()
