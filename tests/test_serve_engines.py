"""`bundle-import serve` read by real clients (issue 18, point 1): Docker (a private dockerd; Docker
treats 127.0.0.0/8 as an insecure registry), podman (a private store, ``--tls-verify=false``),
the standalone containerd (``ctr images pull --plain-http``) and skopeo, all pulling at once from
one served bundle and getting the bundle's digests and image IDs; a blob damaged after the
server verified the bundle is stored by none of them."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.kit import engines
from tests.kit.fuzzkit import flip_byte
from tests.kit.helpers import docker, image_facts, run_zipapp
from tests.kit.servekit import Served, blob_bytes, bundle_doc, pyz, serve_args, serving
from tests.kit.servekit import made as made  # the fixture: one per module

pytestmark = pytest.mark.engine
NS = "serve-test"


def _ctr(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([engines.require("ctr"), "--address", address, "--namespace", NS, *args],
                          capture_output=True, text=True, timeout=600, check=False)


def _ctr_images(address: str) -> dict[str, str]:
    """name -> target digest of every image in the test namespace."""
    out = _ctr(address, "images", "ls").stdout.splitlines()[1:]
    return {line.split()[0]: line.split()[2] for line in out if line.strip()}


def _all_at_once(jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {}

    def run(name: str, job: Callable[[], Any]) -> None:
        try:
            results[name] = job()
        except Exception as e:  # reported by the assertion below
            results[name] = e

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    return results


@pytest.mark.parametrize("kind", ["folder", "tar", "parts"])
def test_docker_pulls_the_bundles_image_ids(made: dict[str, Path], kind: str, docker_host: str) -> None:
    doc = bundle_doc(made)
    with serving(pyz(made), made[kind]) as s:
        refs = {f"{s.addr}/{image['refs'][0]}": image for image in doc["images"]}
        results = _all_at_once({ref: (lambda ref=ref: docker(docker_host, "pull", ref, check=False)) for ref in refs})
        for ref, image in refs.items():
            proc = results[ref]
            assert proc.returncode == 0, proc.stderr
            facts = image_facts(docker_host, ref)
            assert facts is not None and facts[0] == image["config"]["digest"]  # the same image ID as the bundle
            assert facts[1] == [layer["diffId"] for layer in image["layers"]]
            digests = json.loads(docker(docker_host, "image", "inspect", ref).stdout)[0]["RepoDigests"]
            assert f"{ref.rsplit(':', 1)[0]}@{image['manifest']['digest']}" in digests
        assert s.stop() == 0
    for ref in refs:
        docker(docker_host, "image", "rm", ref)


def test_every_client_at_once_from_one_served_bundle(made: dict[str, Path], docker_host: str,
                                                      containerd_address: str, podman_vfs: Any,
                                                      tmp_path: Path) -> None:
    """Docker, podman, containerd and skopeo (inspect and copy) pull from the parts at the same time."""
    doc = bundle_doc(made)
    base, app = doc["images"]
    with serving(pyz(made), made["parts"]) as s:
        ref = f"{s.addr}/carry/app:2"
        jobs: dict[str, Callable[[], Any]] = {
            "docker-app": lambda: docker(docker_host, "pull", ref, check=False),
            "docker-base": lambda: docker(docker_host, "pull", f"{s.addr}/carry/base:1", check=False),
            "podman": lambda: podman_vfs.podman("pull", "--tls-verify=false", ref, check=False),
            "ctr": lambda: _ctr(containerd_address, "images", "pull", "--plain-http", ref),
            "skopeo-inspect": lambda: engines.skopeo("inspect", "--tls-verify=false", f"docker://{ref}", check=False),
            "skopeo-copy": lambda: engines.skopeo("copy", "--src-tls-verify=false", f"docker://{ref}",
                                           f"oci:{tmp_path / 'layout'}:app", check=False),
        }
        results = _all_at_once(jobs)
        for name, proc in results.items():
            assert isinstance(proc, subprocess.CompletedProcess) and proc.returncode == 0, (name, proc)
        assert s.stop() == 0
        log = s.stderr()
    assert log.count(" /v2/carry/app/manifests/") >= 5  # they all came here (HEAD or GET, by tag or digest)
    assert image_facts(docker_host, ref)[0] == app["config"]["digest"]  # type: ignore[index]
    assert image_facts(docker_host, f"{s.addr}/carry/base:1")[0] == base["config"]["digest"]  # type: ignore[index]
    podman_image = podman_vfs.inspect(ref)
    assert f"sha256:{podman_image['Id']}" == app["config"]["digest"]
    assert podman_image["Digest"] == app["manifest"]["digest"]
    assert _ctr_images(containerd_address)[ref] == app["manifest"]["digest"]
    assert json.loads(results["skopeo-inspect"].stdout)["Digest"] == app["manifest"]["digest"]
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [app["manifest"]["digest"]]  # skopeo kept the exact bytes
    for blob in [app["config"], *app["layers"]]:
        assert (tmp_path / "layout" / "blobs" / "sha256" / blob["digest"][7:]).read_bytes() == blob_bytes(
            made["folder"], blob["digest"])
    docker(docker_host, "image", "rm", ref, f"{s.addr}/carry/base:1")
    podman_vfs.podman("rmi", ref)
    _ctr(containerd_address, "images", "rm", "--sync", ref)  # content too, now (not at the next GC)


def test_a_damaged_blob_is_stored_by_no_client(made: dict[str, Path], docker_host_one_retry: str,
                                               containerd_address: str, podman_vfs: Any, tmp_path: Path) -> None:
    # Docker retries a cut layer download 5 times with backoff (75 s); this dockerd retries once (5 s),
    # so a retry is still proven not to store the blob
    docker_host = docker_host_one_retry
    app = bundle_doc(made)["images"][1]
    top = app["layers"][1]  # carry/app's own layer; carry/base does not use it
    target = tmp_path / "b"
    shutil.copytree(made["folder"], target)
    # containerd skips a blob its content store holds (another test may have pulled this image):
    # make sure it must fetch the damaged layer from the server
    _ctr(containerd_address, "content", "rm", top["digest"])
    assert top["digest"] not in _ctr(containerd_address, "content", "ls", "-q").stdout
    with serving(pyz(made), target) as s:
        flip_byte(target / "blobs" / "sha256" / top["digest"][7:], top["size"] - 10)  # after the server verified
        ref = f"{s.addr}/carry/app:2"
        results = _all_at_once({
            "docker": lambda: docker(docker_host, "pull", ref, check=False),
            "podman": lambda: podman_vfs.podman("pull", "--tls-verify=false", ref, check=False),
            "ctr": lambda: _ctr(containerd_address, "images", "pull", "--plain-http", ref),
            "skopeo": lambda: engines.skopeo("copy", "--src-tls-verify=false", f"docker://{ref}",
                                      f"oci:{tmp_path / 'layout'}:app", check=False),
        })
        for name, proc in results.items():
            assert isinstance(proc, subprocess.CompletedProcess) and proc.returncode != 0, (name, proc)
        # the undamaged image still pulls
        assert docker(docker_host, "pull", f"{s.addr}/carry/base:1", check=False).returncode == 0
        rc = s.stop()
        log = s.stderr()
    assert rc == 3 and "error[serve-blob-damaged]" in log, log
    assert image_facts(docker_host, ref) is None
    assert image_facts(docker_host, app["config"]["digest"]) is None
    assert podman_vfs.podman("image", "exists", ref, check=False).returncode == 1
    assert ref not in _ctr_images(containerd_address)
    assert top["digest"] not in _ctr(containerd_address, "content", "ls", "-q").stdout  # nothing committed
    assert not (tmp_path / "layout" / "blobs" / "sha256" / top["digest"][7:]).exists()
    docker(docker_host, "image", "rm", f"{s.addr}/carry/base:1")
    assert isinstance(s, Served)


def test_nodes_that_pulled_from_serve_prove_it_and_one_report_joins_them(
        made: dict[str, Path], docker_host: str, docker_host_vfs: str, containerd_address: str, podman_vfs: Any,
        tmp_path: Path) -> None:
    """The cluster workflow end to end (docs/fleet.md): four "nodes" (Docker overlay2, Docker vfs,
    podman, containerd, each under its own host name) pull both images from one served bundle at
    once, prove what they
    hold with ``--check-only --name-prefix ADDR`` (receipts), and ``fleet-report`` over those
    receipts passes; when one node loses an image its new receipt fails and so does the report,
    naming that node."""
    from tests.kit.fleetkit import hosts, on_host, report

    doc = bundle_doc(made)
    # Not Docker's containerd image store: it pulls over HTTPS only, insecure-registries or not
    # (moby/moby#51080; docs/fleet.md says what such nodes do instead)
    dockers = {"node-docker": docker_host, "node-docker-vfs": docker_host_vfs}
    nodes: dict[str, list[str]] = {
        **{host: ["--engine", "docker", "--docker-host", address] for host, address in dockers.items()},
        "node-podman": podman_vfs.importer_args(),
        "node-ctr": ["--engine", "containerd", "--address", containerd_address, "--namespace", NS],
    }
    collected = tmp_path / "collected"
    with serving(pyz(made), made["folder"]) as s:
        refs = [f"{s.addr}/{image['refs'][0]}" for image in doc["images"]]
        jobs: dict[str, Callable[[], Any]] = {}
        for ref in refs:
            for host, address in dockers.items():
                jobs[f"{host} {ref}"] = lambda ref=ref, address=address: docker(address, "pull", ref, check=False)
            jobs[f"podman {ref}"] = lambda ref=ref: podman_vfs.podman("pull", "--tls-verify=false", ref, check=False)
            jobs[f"ctr {ref}"] = lambda ref=ref: _ctr(containerd_address, "images", "pull", "--plain-http", ref)
        for name, proc in _all_at_once(jobs).items():
            assert isinstance(proc, subprocess.CompletedProcess) and proc.returncode == 0, (name, proc)

        def prove(host: str) -> subprocess.CompletedProcess[str]:
            receipt = collected / host / f"{host}.check.json"
            receipt.parent.mkdir(parents=True, exist_ok=True)
            return on_host(host, str(made["folder"]), "--check-only", "--name-prefix", s.addr, *nodes[host],
                           "--receipt", str(receipt), "-q", docker_host=docker_host)

        for host in nodes:
            proc = prove(host)
            assert proc.returncode == 0, f"{host}: {proc.stderr}"
        code, fleet = report(str(collected), "--hosts", ",".join(nodes))
        assert code == 0 and fleet["verdict"] == "pass", fleet
        carried = sorted(image["manifest"]["digest"] for image in doc["images"])
        by_host = hosts(fleet)
        assert sorted(by_host) == sorted(nodes)
        assert {h["engine"]["kind"] for h in by_host.values()} == {"docker", "podman", "containerd"}
        for host in by_host.values():
            assert host["proof"]["kind"] == "check-only" and host["verdict"] == "pass"
            assert sorted(i["manifestDigest"] for i in host["images"]) == carried

        # podman loses carry/app:2: its proof now fails (exit 8) and the report names it
        podman_vfs.podman("rmi", refs[1])
        proc = prove("node-podman")
        assert proc.returncode == 8 and "error[check-only-missing]" in proc.stderr, proc.stderr
        code, fleet = report(str(collected), "--hosts", ",".join(nodes))
        assert code != 0 and fleet["verdict"] == "fail"
        by_host = hosts(fleet)
        assert by_host["node-podman"]["verdict"] == "fail" and by_host["node-podman"]["reasons"]
        assert all(by_host[host]["verdict"] == "pass" for host in nodes if host != "node-podman")
        assert s.stop() == 0
    for address in dockers.values():
        docker(address, "image", "rm", *refs)
    podman_vfs.podman("rmi", refs[0])
    for ref in refs:
        _ctr(containerd_address, "images", "rm", "--sync", ref)


def _node_config(made: dict[str, Path], tls: Path, port: int) -> dict[str, Any]:
    """What ``serve --print-node-config --json`` prints for a TLS server on 127.0.0.1:port."""
    proc = run_zipapp(pyz(made), *serve_args(made["folder"]), "--listen", f"127.0.0.1:{port}", "--tls-self-signed",
                      str(tls), "--print-node-config", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _install(doc: dict[str, Any], engine: str, etc: str, root: Path) -> None:
    """Write ``engine``'s node files as an admin would, under ``root`` instead of ``etc``."""
    for f in doc["files"]:
        if f["engine"] != engine or not f["path"].startswith(etc):
            continue
        dest = root / f["path"][len(etc) + 1:]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if f["content"] is None:
            shutil.copyfile(f["copyFrom"], dest)
        else:
            dest.write_text(f["content"].replace(etc, str(root)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tls_with_htpasswd_pulls_by_docker_ctrstore_containerd_and_podman_through_the_node_config(
        made: dict[str, Path], docker_host_ctrstore: str, containerd_address: str, podman_vfs: Any,
        tmp_path: Path) -> None:
    """Docker 26 with the containerd image store (HTTPS only), containerd with the generated hosts.toml
    (``docker.io/carry/app:2`` resolved through the mirror, CA checked) and podman with the generated
    registries.conf and the CA (``--cert-dir``) pull over TLS with a login; without it, or with a
    wrong password, nothing is pulled; the password is in no log."""
    from importer.serve.htpasswd import pbkdf2_line

    app = bundle_doc(made)["images"][1]
    tls, port, password = tmp_path / "tls", _free_port(), "clu5ter-pw"
    doc = _node_config(made, tls, port)
    hosts, certs = tmp_path / "certs.d", tmp_path / "podman-certs"
    _install(doc, "containerd", "/etc/containerd/certs.d", hosts)
    certs.mkdir()
    shutil.copyfile(tls / "ca.crt", certs / "ca.crt")
    registries = tmp_path / "registries.conf"
    registries.write_text(next(f["content"] for f in doc["files"] if f["path"].endswith("50-sneakernet-mirror.conf")))
    users = tmp_path / "htpasswd"
    users.write_text(pbkdf2_line("alice", password, rounds=50000) + "\n")
    upstream = "docker.io/carry/app:2"  # the name in the manifests; only the mirror holds it
    config = tmp_path / "docker-config"
    config.mkdir()
    with serving(pyz(made), made["folder"], "--listen", f"127.0.0.1:{port}", "--tls-self-signed", str(tls),
                 "--htpasswd", str(users)) as s:
        assert s.start["url"] == f"https://127.0.0.1:{port}" and s.start["auth"] == "basic"
        pull = ["images", "pull", "--hosts-dir", str(hosts)]
        for creds in ([], ["--user", "alice:wrong"]):
            proc = _ctr(containerd_address, *pull, *creds, upstream)
            assert proc.returncode != 0 and ("401" in proc.stderr or "unauthorized" in proc.stderr.lower()), proc
        assert upstream not in _ctr_images(containerd_address)
        proc = _ctr(containerd_address, *pull, "--user", f"alice:{password}", upstream)
        assert proc.returncode == 0, proc.stderr
        assert _ctr_images(containerd_address)[upstream] == app["manifest"]["digest"]

        env = {**podman_vfs.env(), "CONTAINERS_REGISTRIES_CONF": str(registries)}
        podman = [engines.require("podman"), *podman_vfs.global_args(), "pull", "--cert-dir", str(certs)]
        proc = subprocess.run([*podman, upstream], capture_output=True, text=True, env=env, timeout=600, check=False)
        assert proc.returncode != 0, proc  # no login
        authfile = tmp_path / "auth.json"  # a mirror's login comes from the auth file, not --creds
        authfile.write_text(json.dumps({"auths": {f"127.0.0.1:{port}": {
            "auth": base64.b64encode(f"alice:{password}".encode()).decode()}}}))
        proc = subprocess.run([*podman, "--authfile", str(authfile), upstream], capture_output=True, text=True,
                              env=env, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr
        assert podman_vfs.inspect(upstream)["Digest"] == app["manifest"]["digest"]

        ref = f"127.0.0.1:{port}/carry/app:2"
        cli = ["docker", "-H", docker_host_ctrstore, "--config", str(config)]
        assert subprocess.run([*cli, "pull", ref], capture_output=True, text=True, timeout=600,
                              check=False).returncode != 0
        login = subprocess.run([*cli, "login", f"127.0.0.1:{port}", "-u", "alice", "--password-stdin"],
                               input=password, capture_output=True, text=True, timeout=120, check=False)
        assert login.returncode == 0, login.stderr
        proc = subprocess.run([*cli, "pull", ref], capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr
        facts = image_facts(docker_host_ctrstore, ref)  # the containerd store's image ID is the manifest digest
        assert facts is not None and facts[0] == app["manifest"]["digest"]
        assert facts[1] == [layer["diffId"] for layer in app["layers"]]
        assert s.stop() == 0
        log = s.stderr()
    assert "ns=docker.io" in log  # containerd asked the mirror for docker.io's repository
    assert " 401 " in log and password not in log
    docker(docker_host_ctrstore, "image", "rm", ref)
    podman_vfs.podman("rmi", upstream)
    _ctr(containerd_address, "images", "rm", "--sync", upstream)
