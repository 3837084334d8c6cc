"""`bundle export docker://HOST[:PORT]/REPO:TAG|@DIGEST` (issue 17, point 1): images read straight
from a real docker-registry on 127.0.0.1 (no auth, and basic auth from a docker config), pushed
there by skopeo (an independent writer) from a private dockerd. The manifest digest survives
byte for byte; the bundle imports into Docker with the config's image ID and into an OCI layout
that skopeo reads back as the registry's bytes; a download cut mid-blob is resumed with a Range
request; a bad reference or a missing tag fails with its exit code and leaves nothing behind."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit import engines
from tests.kit.clijson import export_json as export
from tests.kit.engines import Registry
from tests.kit.engines import push_from_docker as push
from tests.kit.fixtures import auth_registry  # noqa: F401 - the fixture, one per module
from tests.kit.helpers import docker, image_facts, run_cli
from tests.kit.imagegen import layered_context, simple_context
from tests.kit.transferkit import FlakyProxy

pytestmark = pytest.mark.engine


def raw_manifest(ref: str, *extra: str) -> bytes:
    """The registry's manifest bytes as skopeo reads them (an independent reader)."""
    proc = subprocess.run([engines.require("skopeo"), "--insecure-policy", "inspect", "--raw", *extra, ref],
                          capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def images(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two images built FROM scratch in the private dockerd; ``big`` holds 3 MiB of random bytes
    (one blob large enough to cut its download in the middle)."""
    root = tmp_path_factory.mktemp("regsrc")
    small = simple_context(root / "small", busybox, "registry source\n")
    big = layered_context(root / "big", busybox=busybox, files={"/random.bin": os.urandom(3 << 20)})
    engines.build_image(docker_host, small, "regsrc/small:1")
    engines.build_image(docker_host, big, "regsrc/big:1")
    return {"small": "regsrc/small:1", "big": "regsrc/big:1"}


@pytest.fixture(scope="module")
def registry(docker_host: str, images: dict[str, str]) -> Iterator[Registry]:
    with engines.private_registry(f"regsrc-{os.getpid()}") as reg:
        for name, image in images.items():
            push(docker_host, image, f"{reg.addr}/sn/{name}:1")
        yield reg


def test_export_from_a_registry_keeps_the_manifest_and_imports_everywhere(
        registry: Registry, docker_host: str, tmp_path: Path) -> None:
    ref = f"{registry.addr}/sn/small:1"
    pinned = raw_manifest(f"docker://{ref}", "--tls-verify=false")
    out = tmp_path / "b"
    proc, _ = export(f"docker://{ref}", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    bundle = json.loads((out / "bundle.json").read_text())
    assert bundle["source"]["kind"] == "registry" and bundle["source"]["registries"] == [registry.addr]
    [image] = bundle["images"]
    assert image["refs"] == [ref]
    assert image["manifest"]["digest"] == "sha256:" + hashlib.sha256(pinned).hexdigest()  # byte for byte
    assert (out / "blobs" / "sha256" / image["manifest"]["digest"][7:]).read_bytes() == pinned
    # Docker: the config's image ID and the diff_ids; an OCI layout: the registry's exact bytes
    docker(docker_host, "image", "rm", ref, check=False)
    imported = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--no-receipt", "-q")
    assert imported.returncode == 0, imported.stderr
    facts = image_facts(docker_host, ref)
    assert facts is not None and facts[0] == image["config"]["digest"]
    assert facts[1] == [layer["diffId"] for layer in image["layers"]]
    layout = tmp_path / "layout"
    imported = run_cli("importer", str(out), "--verify", "--engine", "oci", "--oci-dir", str(layout),
                       "--no-receipt", "-q")
    assert imported.returncode == 0, imported.stderr
    index = json.loads((layout / "index.json").read_text())
    [entry] = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == ref]
    assert entry["digest"] == image["manifest"]["digest"]
    assert (layout / "blobs" / "sha256" / entry["digest"][7:]).read_bytes() == pinned
    docker(docker_host, "image", "rm", ref)


def test_a_reference_by_digest_is_carried_untagged_or_under_tag(registry: Registry, tmp_path: Path) -> None:
    pinned = raw_manifest(f"docker://{registry.addr}/sn/small:1", "--tls-verify=false")
    digest = "sha256:" + hashlib.sha256(pinned).hexdigest()
    proc, _ = export(f"docker://{registry.addr}/sn/small@{digest}", "-o", str(tmp_path / "u"))
    assert proc.returncode == 0, proc.stderr
    [image] = json.loads((tmp_path / "u" / "bundle.json").read_text())["images"]
    assert image["refs"] == [] and image["manifest"]["digest"] == digest
    proc, _ = export(f"docker://{registry.addr}/sn/small@{digest}", "--tag", "sn/small:pinned",
                     "-o", str(tmp_path / "t"))
    assert proc.returncode == 0, proc.stderr
    [image] = json.loads((tmp_path / "t" / "bundle.json").read_text())["images"]
    assert image["refs"] == ["sn/small:pinned"] and image["manifest"]["digest"] == digest


def test_a_download_cut_mid_blob_is_resumed(registry: Registry, tmp_path: Path) -> None:
    """A proxy cuts the registry's answer once, 1 MiB into the export (inside the 3 MiB layer):
    the export asks for the rest with a Range request and the bundle verifies."""
    with FlakyProxy(registry.port, cut_response_at=1 << 20) as proxy:
        ref = f"127.0.0.1:{proxy.port}/sn/big:1"
        proc, _ = export(f"docker://{ref}", "-o", str(tmp_path / "b"))
        assert proc.returncode == 0, proc.stderr
        assert proxy.response_cuts == 1
        assert any(r.startswith("bytes=") and not r.startswith("bytes=0-") for r in proxy.ranges), proxy.ranges
    pinned = raw_manifest(f"docker://{registry.addr}/sn/big:1", "--tls-verify=false")
    [image] = json.loads((tmp_path / "b" / "bundle.json").read_text())["images"]
    assert image["manifest"]["digest"] == "sha256:" + hashlib.sha256(pinned).hexdigest()
    verified = run_cli("importer", str(tmp_path / "b"), "--verify-only", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stderr


@pytest.mark.parametrize("ref, code, error_id", [
    ("sn/small:nosuchtag", 5, "image-not-found"),
    ("sn/NotLower:1", 2, "invalid-reference"),
])
def test_a_bad_reference_fails_clearly_and_leaves_nothing(registry: Registry, tmp_path: Path, ref: str, code: int,
                                                           error_id: str) -> None:
    out = tmp_path / "b"
    proc, doc = export(f"docker://{registry.addr}/{ref}", "-o", str(out))
    assert proc.returncode == code and doc["error"]["id"] == error_id, proc.stderr
    assert f"error[{error_id}]" in proc.stderr and ref.split(":")[0] in proc.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith("b.partial-")]


def test_docker_scheme_needs_two_slashes(tmp_path: Path) -> None:
    proc, doc = export("docker:127.0.0.1:5000/sn/small:1", "-o", str(tmp_path / "b"))
    assert proc.returncode == 2 and doc["error"]["id"] == "usage" and "docker://" in proc.stderr


def test_basic_auth_from_the_docker_config(docker_host: str, images: dict[str, str], tmp_path: Path,
                                          auth_registry: Registry) -> None:  # noqa: F811 - the fixture
    """A registry with htpasswd: the export logs in with the docker config's credentials; without
    them it fails with the auth error, naming what to do."""
    push(docker_host, images["small"], f"{auth_registry.addr}/sn/small:1", "--dest-creds", "alice:s3cret-pw")
    config = tmp_path / "docker"
    config.mkdir()
    auth = base64.b64encode(b"alice:s3cret-pw").decode()
    (config / "config.json").write_text(json.dumps({"auths": {auth_registry.addr: {"auth": auth}}}))
    ref = f"docker://{auth_registry.addr}/sn/small:1"
    proc = run_cli("bundle", "export", ref, "-o", str(tmp_path / "ok"), "--json", "-q",
                   env={"DOCKER_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "ok" / "bundle.json").read_text())["images"][0]["refs"] == [ref[len("docker://"):]]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("bundle", "export", ref, "-o", str(tmp_path / "no"), "--json", "-q",
                   env={"DOCKER_CONFIG": str(empty)})
    assert proc.returncode == 6 and json.loads(proc.stdout)["error"]["id"] == "registry-auth", proc.stderr
    assert "docker login" in proc.stderr and not (tmp_path / "no").exists()


def test_a_delta_and_a_signature_from_a_registry(registry: Registry, tmp_path: Path) -> None:
    """--have and --sign-key work for docker:// as for every source (issue 17, point 5): the layer
    the earlier bundle holds (busybox, shared by both images) is left out, the rest verifies and
    the signature checks with the public key."""
    from tests.kit.trustkit import keypair

    base = tmp_path / "big.bundle"
    proc, _ = export(f"docker://{registry.addr}/sn/big:1", "-o", str(base))
    assert proc.returncode == 0, proc.stderr
    key, pub = keypair(tmp_path, "site")
    delta = tmp_path / "small.delta"
    proc, _ = export(f"docker://{registry.addr}/sn/small:1", "--have", str(base / "bundle.json"),
                     "--sign-key", str(key), "-o", str(delta))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((delta / "bundle.json").read_text())
    shared = {x["diffId"] for x in json.loads((base / "bundle.json").read_text())["images"][0]["layers"]}
    [image] = doc["images"]
    external = [x for x in image["layers"] if x.get("external")]
    assert doc["schemaVersion"] == "3.1" and external and {x["diffId"] for x in external} <= shared
    assert all(not (delta / "blobs" / "sha256" / x["digest"][7:]).exists() for x in external)
    verified = run_cli("importer", str(delta), "--verify-only", "--trust", str(pub), "--require-signature", "--json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["verification"]["signature"]["status"] == "verified"


def test_each_image_is_read_through_its_own_repository_not_a_cursor(registry: Registry) -> None:
    """The registry source keeps no "current reference" (issue 27): two images' blobs read in
    interleaved order each come from their own repository, and each config hashes to its digest."""
    from bundle.sources import ResolvedImage
    from bundle.sources.protocol import Selection
    from bundle.sources.registry import RegistrySource
    texts = [f"{registry.addr}/sn/small:1", f"{registry.addr}/sn/big:1"]
    source = RegistrySource(texts)
    try:
        resolved = source.resolve(texts, Selection())  # both resolved before either is read
        assert all(isinstance(image, ResolvedImage) for image in resolved)
        providers = [source.blobs(image) for image in resolved if isinstance(image, ResolvedImage)]
        manifests = [image.images[0].manifest for image in resolved if isinstance(image, ResolvedImage)]
        for provider, manifest in reversed(list(zip(providers, manifests))):
            with provider.open_blob(str(manifest.config.digest), "test") as f:
                assert hashlib.sha256(f.read()).hexdigest() == manifest.config.digest.hex
        assert manifests[0].config.digest != manifests[1].config.digest
    finally:
        source.close()


def _sockets() -> int:
    """This process's open sockets (its fds that are sockets)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.exists(fd) and os.readlink(fd).startswith("socket:"))


def test_a_failing_export_closes_the_source(registry: Registry, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter closes its source however the export ends (bundle/export.py): an image missing
    from the registry fails after the source connected (GET /v2/, the manifest), and no connection
    to the registry is left open, nor a staging folder."""
    import bundle.export as export_module
    from bundle.export import export_images
    from importer.errors import ImageNotFound
    opened: list[Any] = []
    real = export_module.open_source

    def keep(*args: Any, **kwargs: Any) -> Any:  # the real source, kept alive so an unclosed socket shows
        got = real(*args, **kwargs)
        opened.append(got[0])
        return got

    monkeypatch.setattr(export_module, "open_source", keep)
    before = _sockets()
    with pytest.raises(ImageNotFound, match="nosuchtag"):
        export_images([f"docker://{registry.addr}/sn/small:nosuchtag"], str(tmp_path / "b"))
    monkeypatch.undo()
    assert len(opened) == 1 and opened[0].hosts == [registry.addr]
    assert _sockets() == before, "the failed export left a connection to the registry open"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("b")]
