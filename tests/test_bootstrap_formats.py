"""``bundle export --for k3s|rke2|apptainer`` (issue 43, point 5; bundle/bootstrap.py): the k3s
archive imports with ``ctr -n k8s.io images import --all-platforms`` (what k3s runs on each
``agent/images/*.tar``) into the kit's containerd under the full names, every platform's manifest
with it; an apptainer file is an ``oci-archive:`` skopeo reads; registries.yaml parses and names
the mirror; bad options, a delta bundle, a damaged blob and a folder in the way are one typed
error with nothing left behind. Engine-free bundles of the kit (``pristine``, ``pristine_multi``)
and its OCI layout source (layoutgen) are used."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bundle.bootstrap import parse_serve_address, registries_yaml, write_bootstrap
from bundle.yamlbound import compose_bounded
from importer.errors import DigestMismatch, UsageError
from importer.format.manifest import BundleManifest
from importer.verify.bundle import verify_bundle
from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.engine_stores import ctr
from tests.kit.helpers import run_cli
from tests.kit.layoutgen import ARCHES, REF, write_layout


def _manifest(bundle: Path) -> BundleManifest:
    m = verify_bundle(str(bundle)).manifest
    assert m is not None
    return m


def _yaml(text: str) -> Any:
    import yaml

    compose_bounded(text, depth=16, nodes=1000)  # the bounded reader takes it
    return yaml.safe_load(text)


def _index(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        return dict(json.loads(member.read()))


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bootstrap") / "layout"
    write_layout(root)
    return root


# --- engine-free ---------------------------------------------------------------------------------

def test_k3s_folder_holds_every_platform_named_for_containerd(pristine_multi: Path, tmp_path: Path) -> None:
    m = _manifest(pristine_multi)
    boot = write_bootstrap(str(pristine_multi), m, "k3s", str(tmp_path / "c.k3s"),
                           serve_address="10.0.0.5:5000")
    assert boot.files == ["images.tar", "registries.yaml", "README.txt"]
    [image] = m.images
    [entry] = _index(tmp_path / "c.k3s" / "images.tar")["manifests"]
    assert entry["digest"] == str(image.index.digest)  # the carried index, byte for byte
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": "docker.io/multi/app:1",
                                    "io.containerd.image.name": "docker.io/multi/app:1"}
    with tarfile.open(tmp_path / "c.k3s" / "images.tar") as tar:
        names = set(tar.getnames())
    for v in image.variants:
        assert {v.manifest.digest.blob_path, v.config.digest.blob_path} <= names
        assert {x.digest.blob_path for x in v.layers} <= names
    readme = (tmp_path / "c.k3s" / "README.txt").read_text()
    assert "/var/lib/rancher/k3s/agent/images/" in readme and "/etc/rancher/k3s/registries.yaml" in readme
    doc = _yaml((tmp_path / "c.k3s" / "registries.yaml").read_text())
    assert doc == {"mirrors": {"docker.io": {"endpoint": ["http://10.0.0.5:5000"]}}}
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]


def test_registries_yaml_names_each_registry_rewrites_bare_hub_names_and_trusts_the_ca(pristine: Path) -> None:
    image = _manifest(pristine).images[0]
    images = [dataclasses.replace(image, refs=("busybox:1.36", "docker.io/library/alpine:3", "my.app:2")),
              dataclasses.replace(image, refs=("nvcr.io/nvidia/cuda:12.4.1", "127.0.0.1:5000/team/app:1"))]
    text, registries, rewritten = registries_yaml(images, "https", "mirror.example:5443", "/etc/ca.crt")
    doc = _yaml(text)
    assert registries == ["127.0.0.1:5000", "docker.io", "nvcr.io"] and rewritten == ["busybox", "my.app"]
    assert {k: v["endpoint"] for k, v in doc["mirrors"].items()} == {
        r: ["https://mirror.example:5443"] for r in registries}
    assert doc["mirrors"]["docker.io"]["rewrite"] == {r"^library/(busybox|my\.app)$": "$1"}
    assert doc["configs"] == {"mirror.example:5443": {"tls": {"ca_file": "/etc/ca.crt"}}}


@pytest.mark.parametrize("bad", ["ftp://h:5000", "h", "h:0", "h:99999", "h:5000/x", "h:5000/", "http://:5000",
                                 "http://h p:5000", "h\x1b:5000", "https://", ""])
def test_a_bad_serve_address_is_one_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="--serve-address"):
        parse_serve_address(bad)


def test_good_serve_addresses() -> None:
    assert parse_serve_address("10.0.0.5:5000") == ("http", "10.0.0.5:5000")
    assert parse_serve_address("https://gw.example:443") == ("https", "gw.example:443")


def test_a_delta_bundle_is_refused_and_nothing_is_written(pristine: Path, tmp_path: Path) -> None:
    m = _manifest(pristine)
    first = m.images[0]
    delta = dataclasses.replace(first, layers=(dataclasses.replace(first.layers[0], external=True), *first.layers[1:]))
    with pytest.raises(UsageError, match="delta bundle"):
        write_bootstrap(str(pristine), dataclasses.replace(m, images=(delta, *m.images[1:])), "k3s",
                        str(tmp_path / "d.k3s"))
    assert os.listdir(tmp_path) == []


def test_a_damaged_blob_stops_the_archive_and_leaves_nothing(bundle: Path, tmp_path: Path) -> None:
    m = _manifest(bundle)
    layer = m.images[0].layers[0]
    path = bundle / layer.digest.blob_path
    path.write_bytes(b"\0" * path.stat().st_size)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DigestMismatch):
        write_bootstrap(str(bundle), m, "apptainer", str(out / "x.apptainer"))
    assert os.listdir(out) == []


def test_cli_refusals_before_the_export(layout: Path, tmp_path: Path) -> None:
    src = f"oci:{layout}:{REF}"
    have = tmp_path / "have.json"
    have.write_text("{}")
    (tmp_path / "taken.apptainer").mkdir()
    (tmp_path / "taken.apptainer" / "notes.txt").write_text("mine")
    for args, says in [(["--for", "k3s", "--have", str(have)], "--have"),
                       (["--serve-address", "h:5000"], "--for k3s"),
                       (["--for", "apptainer", "--serve-address", "h:5000"], "--for apptainer"),
                       (["--for", "k3s", "--serve-address", "h"], "--serve-address"),
                       (["--for", "k3s", "--schema", "2"], "schema 3")]:
        proc = run_cli("bundle", "export", src, "-o", str(tmp_path / "b"), "-q", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not (tmp_path / "b").exists()
    proc = run_cli("bundle", "export", src, "-o", str(tmp_path / "taken"), "-q", "--for", "apptainer", "--force")
    assert proc.returncode == 2 and "other files (notes.txt)" in proc.stderr, proc.stderr
    assert not (tmp_path / "taken").exists() and os.listdir(tmp_path / "taken.apptainer") == ["notes.txt"]


def test_cli_archive_only_writes_the_folder_beside_it(layout: Path, tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", f"oci:{layout}:{REF}", "--all-platforms", "--archive",
                   str(tmp_path / "app.tar"), "--for", "rke2", "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate("export", doc)
    assert doc["bootstrap"]["for"] == "rke2" and doc["bootstrap"]["path"] == str(tmp_path / "app.rke2")
    assert sorted(os.listdir(tmp_path / "app.rke2")) == ["README.txt", "images.tar", "registries.yaml"]
    assert "/var/lib/rancher/rke2/agent/images/app.tar" in (tmp_path / "app.rke2" / "README.txt").read_text()
    assert not [p for p in os.listdir(tmp_path) if ".export-" in p or ".partial-" in p]


# --- against containerd and skopeo -----------------------------------------------------------------

@pytest.mark.engine
def test_k3s_archive_imports_with_ctr_all_platforms(containerd_address: str, pristine: Path, layout: Path,
                                                    tmp_path: Path) -> None:
    """Two images of one bundle, and a multi-platform image carried with two of its platforms (the
    index written here): ``ctr -n k8s.io images import --all-platforms`` names each with its full
    name and the digest the bundle pins, every platform's manifest in the content store."""
    plain = _manifest(pristine)
    write_bootstrap(str(pristine), plain, "k3s", str(tmp_path / "plain.k3s"))
    proc = run_cli("bundle", "export", f"oci:{layout}:{REF}", "--platform", "linux/amd64,linux/arm64",
                   "-o", str(tmp_path / "two.bundle"), "--for", "k3s", "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "an index of them written here" in " ".join(json.loads(proc.stdout)["bootstrap"]["notes"])
    two = _manifest(tmp_path / "two.bundle")
    want = {f"docker.io/{ref}": str(i.manifest.digest) for i in plain.images for ref in i.refs}
    try:
        for archive in (tmp_path / "plain.k3s" / "images.tar", tmp_path / "two.bundle.k3s" / "images.tar"):
            ctr(containerd_address, "k8s.io", "images", "import", "--all-platforms", str(archive))
        rows = {line.split()[0]: line.split()[2]
                for line in ctr(containerd_address, "k8s.io", "images", "ls").splitlines()[1:]}
        for name, digest in want.items():
            assert rows.get(name) == digest, rows
        [entry] = _index(tmp_path / "two.bundle.k3s" / "images.tar")["manifests"]
        assert rows.get(f"docker.io/{REF}") == entry["digest"]
        listed = json.loads(ctr(containerd_address, "k8s.io", "content", "get", entry["digest"]))["manifests"]
        [image] = two.images
        assert sorted(m["digest"] for m in listed) == sorted(str(v.manifest.digest) for v in image.variants)
        assert sorted(m["platform"]["architecture"] for m in listed) == sorted(ARCHES[:2])
        for v in image.variants:  # every platform's blobs are in the content store
            ctr(containerd_address, "k8s.io", "content", "get", str(v.config.digest))
    finally:
        for name in [*want, f"docker.io/{REF}"]:
            subprocess.run(["ctr", "--address", containerd_address, "-n", "k8s.io", "images", "rm", name],
                           capture_output=True, check=False, timeout=120)


@pytest.mark.engine
def test_apptainer_files_are_oci_archives_skopeo_reads(pristine: Path, pristine_multi: Path, tmp_path: Path) -> None:
    skopeo = engines.require("skopeo")
    for bundle in (pristine, pristine_multi):
        m = _manifest(bundle)
        out = tmp_path / f"{bundle.name}.apptainer"
        boot = write_bootstrap(str(bundle), m, "apptainer", str(out))
        assert len(boot.files) == len(m.images) + 1 and "apptainer build" in (out / "README.txt").read_text()
        for image, name in zip(m.images, boot.files):
            assert ":" not in name and name.endswith(".oci.tar")
            proc = subprocess.run([skopeo, "inspect", "--raw", f"oci-archive:{out / name}"], capture_output=True,
                                  text=True, check=False, timeout=120)
            assert proc.returncode == 0, proc.stderr
            top = image.index or image.manifest
            assert json.loads(proc.stdout)["mediaType"] == top.media_type
            proc = subprocess.run([skopeo, "inspect", "--override-arch", "amd64", "--override-os", "linux",
                                   f"oci-archive:{out / name}"], capture_output=True, text=True, check=False,
                                  timeout=120)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["Layers"] == [str(x.digest) for x in image.layers]
