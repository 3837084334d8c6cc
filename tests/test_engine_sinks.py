"""Engine-free tests of the sinks (issue 3): identity rules on recorded engine output
(tests/golden/engine-output/, README there says where each file came from), the parsers of
ctr/podman/docker output, reference normalisation, engine choice, the inventory checksum and
the --deep comparison."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from importer.engines import EngineImage, EngineInfo
from importer.engines.ctrclient import parse_image_rows, server_version
from importer.engines.dockerclient import engine_image_from_inspect, image_store_of
from importer.engines.podmanclient import engine_image_from_podman
from importer.errors import EngineNotChosen, EngineUnavailable, InventoryDamaged, ManifestError, UsageError
from importer.format.identity import (
    chain_ids,
    docker_archive_manifest,
    docker_archive_manifest_digest,
    expected_image_id,
    loads_as_docker_archive,
    lookup_name,
)
from importer.format.manifest import ImageRecord
from importer.format.refs import familiar, normalize
from importer.input.tarscan import hash_member, scan_tar
from importer.inventory.engine import build_inventory, checksum, held_diff_ids, load_inventory
from importer.pipeline.postload import check_image
from importer.sinks.choose import EngineOptions, choose_sink
from importer.sinks.containerd import parse_check_rows, snapshotter_status
from importer.sinks.ociarchive import index_document
from importer.verify.bundle import verify_bundle
from importer.verify.deep import compare, export_refused
from tests.kit.engines import require
from tests.kit.fakesave import docker_save, layer_tar, sample_images

REPO = Path(__file__).resolve().parents[1]
REC = REPO / "tests" / "golden" / "engine-output"


@pytest.fixture(scope="module")
def images(pristine: Path) -> dict[str, ImageRecord]:
    manifest = verify_bundle(str(pristine)).manifest
    assert manifest is not None
    return {image.refs[0]: image for image in manifest.images}


def _json(name: str) -> Any:
    return json.loads((REC / name).read_text())


# ============================== references

@pytest.mark.parametrize(("ref", "full", "short"), [
    ("app", "docker.io/library/app:latest", "app:latest"),
    ("app:1", "docker.io/library/app:1", "app:1"),
    ("team/app:1", "docker.io/team/app:1", "team/app:1"),
    ("docker.io/library/app:1", "docker.io/library/app:1", "app:1"),
    ("index.docker.io/team/app:1", "docker.io/team/app:1", "team/app:1"),
    ("localhost/app:1", "localhost/app:1", "localhost/app:1"),
    ("registry.local:5000/x/y:2", "registry.local:5000/x/y:2", "registry.local:5000/x/y:2"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3"),
    (f"app@sha256:{'a' * 64}", f"docker.io/library/app@sha256:{'a' * 64}", f"app@sha256:{'a' * 64}"),
    ("sneakernet-staging/0123456789ab:3", "docker.io/sneakernet-staging/0123456789ab:3",
     "sneakernet-staging/0123456789ab:3"),
])
def test_references_are_normalised_as_docker_means_them(ref: str, full: str, short: str) -> None:
    assert normalize(ref) == full
    assert familiar(ref) == short


# ============================== identity rules on recorded output

def test_docker_archive_manifest_is_what_containerd_writes(images: dict[str, ImageRecord]) -> None:
    """Recorded from containerd 1.6.20 importing the docker-archive of the Docker sink: the
    manifest Docker's containerd store makes on `docker load`, byte for byte."""
    recorded = (REC / "containerd-1.6.20.docker-archive-manifest.fake-app-2.json").read_bytes()
    assert docker_archive_manifest(images["fake/app:2"]) == recorded
    assert docker_archive_manifest_digest(images["fake/app:2"]) == \
        "sha256:7e644f23fe3672bcb08971bbbfb43e4b9701b0b9c03681536fac340d7e233af7"


def test_chain_ids_are_containerds_snapshot_keys(images: dict[str, ImageRecord]) -> None:
    # `ctr snapshots ls` after importing fake/app:2 (containerd 1.6.20) listed these keys
    diff_ids = [str(x.diff_id) for x in images["fake/app:2"].layers]
    assert chain_ids(diff_ids) == [
        "sha256:1f65047b4ee1ef5721521305ede8a9bb0a32e363348cccbec7755d06e53fb468",
        "sha256:85d6311b0d8ced8800ddc6c037c5206af8ef5bfc2eec1cad43ed2d09220bd5c3",
        "sha256:4196ba8b61ded8a49d87a8efb85da07551614d0f35efda7f744bd976881c1ab9",
    ]


def test_docker_classic_store_id_is_the_config_digest(images: dict[str, ImageRecord]) -> None:
    info = _json("docker-20.10-classic-overlay2.info.json")
    assert image_store_of(info) == "classic"
    found = engine_image_from_inspect(_json("docker-20.10-classic-overlay2.image-inspect.json"), "classic")
    check = check_image(images["fake/app:2"], found, "classic")
    assert check.result == "match" and check.identity_rule == "config-digest" and check.id_verified
    assert found.config_digest == str(images["fake/app:2"].config.digest)


def _delta(image: ImageRecord) -> ImageRecord:
    """The same image in a delta bundle made against a Docker inventory (its first layer left out,
    described uncompressed): on Docker's containerd store it is loaded as a docker-archive, so its
    ID is the manifest that load makes."""
    layer = image.layers[0]
    first = dataclasses.replace(layer, external=True, digest=layer.diff_id, size=layer.uncompressed_size,
                                media_type="application/vnd.oci.image.layer.v1.tar")
    return dataclasses.replace(image, layers=(first, *image.layers[1:]))


@pytest.mark.parametrize("recording", ["docker-25.0-containerd-store.image-inspect.json",
                                       "docker-28.2-containerd-store.image-inspect.json"])
def test_docker_containerd_store_id_is_the_manifest_digest(images: dict[str, ImageRecord], recording: str) -> None:
    for info in ("docker-28.2-containerd-store.info.json", "docker-29.0-containerd-store.info.json"):
        assert image_store_of(_json(info)) == "containerd"
    image = _delta(images["fake/app:2"])
    found = engine_image_from_inspect(_json(recording), "containerd")
    assert found.image_id == docker_archive_manifest_digest(image) != str(image.config.digest)
    assert found.manifest_digest == found.image_id and found.config_digest is None
    check = check_image(image, found, "containerd")
    assert check.result == "match" and check.identity_rule == "diff-ids+manifest"
    assert check.id_verified and "docker-archive load" in check.detail
    # the classic rule would call the same engine output a mismatch: the rule must follow the store
    assert check_image(image, found, "classic").result == "mismatch"
    # an untagged image is found by the ID the rule predicts
    assert lookup_name("containerd", image) == found.image_id


def test_docker_containerd_store_full_bundle_id_is_the_bundle_manifest(images: dict[str, ImageRecord]) -> None:
    """A full bundle is loaded as an OCI archive of its own manifest: the ID must be that digest."""
    image = images["fake/app:2"]
    doc = _json("docker-28.2-containerd-store.image-inspect.json")
    check = check_image(image, engine_image_from_inspect(doc, "containerd"), "containerd")
    assert check.result == "mismatch" and "image ID: expected " + str(image.manifest.digest) in check.detail
    doc[0]["Id"] = doc[0]["Descriptor"]["digest"] = str(image.manifest.digest)
    check = check_image(image, engine_image_from_inspect(doc, "containerd"), "containerd")
    assert check.result == "match" and check.identity_rule == "manifest-digest" and check.id_verified
    assert lookup_name("containerd", image) == str(image.manifest.digest)


def test_docker_containerd_store_delta_naming_the_blobs_keeps_the_bundle_manifest(
        images: dict[str, ImageRecord]) -> None:
    """A delta whose left-out layers name the compressed blobs goes in as an OCI archive of the
    bundle's own manifest (the blobs copied out of the engine): the ID must be that digest."""
    image = images["fake/app:2"]
    named = dataclasses.replace(image, layers=(dataclasses.replace(image.layers[0], external=True),
                                               *image.layers[1:]))
    assert not loads_as_docker_archive(named) and loads_as_docker_archive(_delta(image))
    assert expected_image_id("containerd", named) == str(image.manifest.digest)
    doc = _json("docker-28.2-containerd-store.image-inspect.json")
    check = check_image(named, engine_image_from_inspect(doc, "containerd"), "containerd")
    assert check.result == "mismatch" and "image ID: expected " + str(image.manifest.digest) in check.detail


def test_docker_containerd_store_checks_the_diff_ids(images: dict[str, ImageRecord]) -> None:
    doc = _json("docker-28.2-containerd-store.image-inspect.json")
    doc[0]["RootFS"]["Layers"][2] = "sha256:" + "0" * 64
    check = check_image(_delta(images["fake/app:2"]), engine_image_from_inspect(doc, "containerd"), "containerd")
    assert check.result == "mismatch" and "layer(s) 3" in check.detail


def test_docker_containerd_store_with_another_id_rests_on_the_diff_ids(images: dict[str, ImageRecord]) -> None:
    doc = _json("docker-28.2-containerd-store.image-inspect.json")
    doc[0]["Id"] = doc[0]["Descriptor"]["digest"] = "sha256:" + "e" * 64  # e.g. an index Docker made
    check = check_image(_delta(images["fake/app:2"]), engine_image_from_inspect(doc, "containerd"), "containerd")
    assert check.result == "match" and not check.id_verified
    assert "identity rests on the diff_ids" in check.detail


def test_podman_id_is_the_config_digest(images: dict[str, ImageRecord]) -> None:
    found = engine_image_from_podman(_json("podman-4.3.1-vfs.image-inspect.json")[0])
    image = images["fake/app:2"]
    assert found.image_id == found.config_digest == str(image.config.digest)
    assert found.manifest_digest and found.manifest_digest.startswith("sha256:")
    assert "docker.io/fake/app:2" in found.tags
    assert check_image(image, found, "classic").ok


def test_bare_containerd_and_oci_layout_id_is_the_bundle_manifest(images: dict[str, ImageRecord]) -> None:
    image = images["fake/app:2"]
    diff_ids = [str(x.diff_id) for x in image.layers]
    good = EngineImage(str(image.manifest.digest), diff_ids, [], config_digest=str(image.config.digest),
                       manifest_digest=str(image.manifest.digest))
    check = check_image(image, good, "oci")
    assert check.ok and check.identity_rule == "manifest-digest" and check.id_verified
    rewritten = EngineImage(docker_archive_manifest_digest(image), diff_ids, [], config_digest=str(image.config.digest))
    assert "image ID: expected" in check_image(image, rewritten, "oci").detail
    other_config = EngineImage(str(image.manifest.digest), diff_ids, [], config_digest="sha256:" + "c" * 64)
    assert "config digest: expected" in check_image(image, other_config, "oci").detail
    missing = EngineImage(str(image.manifest.digest), diff_ids, [], config_digest=str(image.config.digest),
                          problems=["not unpacked in snapshotter native"])
    assert check_image(image, missing, "oci").detail == "not unpacked in snapshotter native"


# ============================== ctr output (containerd 1.6.20, recorded)

def test_ctr_output_parsers() -> None:
    assert server_version((REC / "ctr-1.6.20.version.txt").read_text()) == "1.6.20~ds1"
    status = snapshotter_status((REC / "ctr-1.6.20.plugins-ls.txt").read_text())
    assert status["overlayfs"] == "ok" and status["native"] == "ok"
    rows = parse_image_rows((REC / "ctr-1.6.20.images-ls.txt").read_text())
    assert rows == [
        ("docker.io/fake/app:2", "application/vnd.docker.distribution.manifest.v2+json",
         "sha256:7e644f23fe3672bcb08971bbbfb43e4b9701b0b9c03681536fac340d7e233af7"),
        ("docker.io/fake/base:1", "application/vnd.docker.distribution.manifest.v2+json",
         "sha256:b7cab38efae09e51d2ac612a6b09aa001f7580f41f7b598edfad12996750f806"),
    ]
    assert parse_check_rows((REC / "ctr-1.6.20.images-check.txt").read_text()) == {
        "docker.io/fake/app:2": ("complete", 4, 4, True), "docker.io/fake/base:1": ("complete", 3, 3, True)}
    assert parse_check_rows((REC / "ctr-1.6.20.images-check.incomplete.txt").read_text()) == {
        "docker.io/fake/app:2": ("incomplete", 3, 4, False), "docker.io/fake/base:1": ("complete", 3, 3, False)}


def test_oci_archive_index_names_every_image_in_full(images: dict[str, ImageRecord]) -> None:
    doc = index_document([(images["fake/app:2"], "docker.io/fake/app:2")])
    [entry] = doc["manifests"]  # type: ignore[misc]
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": "docker.io/fake/app:2",
                                    "io.containerd.image.name": "docker.io/fake/app:2"}
    assert entry["digest"] == str(images["fake/app:2"].manifest.digest)
    assert entry["platform"] == {"os": "linux", "architecture": "amd64"}


# ============================== choosing the engine

def test_engine_options_must_belong_to_the_engine() -> None:
    with pytest.raises(UsageError, match="--docker-host"):
        choose_sink(EngineOptions(engine="containerd", docker_host="unix:///x.sock"))
    with pytest.raises(UsageError, match="containerd and podman"):
        choose_sink(EngineOptions(address="/x.sock", podman_root="/r"))
    with pytest.raises(UsageError, match="--oci-dir"):
        choose_sink(EngineOptions(engine="oci"))


@pytest.mark.parametrize(("opts", "kind", "why"), [
    (EngineOptions(oci_dir="/tmp/x"), "oci", "--oci-dir given"),
    (EngineOptions(address="/run/x.sock"), "containerd", "--address given"),
    (EngineOptions(namespace="k8s.io"), "containerd", "--namespace given"),
    (EngineOptions(podman_root="/var/lib/c"), "podman", "--podman-root given"),
    (EngineOptions(docker_host="unix:///d.sock"), "docker", "--docker-host given"),
    (EngineOptions(engine="podman"), "podman", "--engine podman"),
])
def test_options_imply_the_engine(opts: EngineOptions, kind: str, why: str) -> None:
    sink, reason = choose_sink(opts)
    assert sink.kind == kind and reason == why


def test_detection_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    with pytest.raises(EngineUnavailable) as e:  # a dead DOCKER_HOST is said at once, with the way out
        choose_sink(EngineOptions())
    assert f"DOCKER_HOST is set (unix://{tmp_path}/docker.sock)" in e.value.message
    assert "--engine containerd|podman|oci" in (e.value.hint or "")
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.delenv("CONTAINERD_ADDRESS", raising=False)
    with pytest.raises(EngineUnavailable) as e:
        choose_sink(EngineOptions(), docker_socket=str(tmp_path / "none"), which=lambda _: None)
    assert "no `docker` command" in (e.value.context or "") and "--engine" in (e.value.hint or "")
    with pytest.raises(EngineUnavailable) as e:
        choose_sink(EngineOptions(), docker_socket=str(tmp_path / "none"),
                    containerd_socket=str(tmp_path / "none2"), which=lambda name: name if name != "podman" else None)
    assert f"Docker: no {tmp_path / 'none'}" in (e.value.context or "")
    assert f"containerd: no {tmp_path / 'none2'}" in (e.value.context or "")


def test_podman_is_never_chosen_silently(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No --engine, no DOCKER_HOST, no Docker socket: the system podman answers, but a load into
    an engine nobody named is refused, naming what answered and ``--engine podman``."""
    require("podman")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("CONTAINERD_ADDRESS", raising=False)
    with pytest.raises(EngineNotChosen) as e:
        choose_sink(EngineOptions(), docker_socket=str(tmp_path / "none"),
                    containerd_socket=str(tmp_path / "none2"))
    assert "found podman (default storage) answering instead" in e.value.message
    assert e.value.hint == "name the engine to load into: --engine podman"
    assert "podman (default storage): answers" in (e.value.context or "")
    assert e.value.exit_code == 2 and e.value.reference == "engine-not-chosen"


# ============================== the inventory

def _inventory() -> dict[str, Any]:
    engine = EngineInfo("containerd", "1.6.20~ds1", "overlayfs", "oci", "/run/containerd/containerd.sock",
                        extra={"namespace": "k8s.io", "snapshotter": "overlayfs"})
    images = [EngineImage("sha256:" + "a" * 64, ["sha256:" + "1" * 64, "sha256:" + "2" * 64], ["docker.io/x/ünï:1"],
                          config_digest="sha256:" + "b" * 64, manifest_digest="sha256:" + "a" * 64,
                          blobs=[{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd",
                                  "digest": "sha256:" + "3" * 64, "size": 10}]),
              EngineImage("sha256:" + "d" * 64, ["sha256:" + "9" * 64], [], problems=["not unpacked"])]
    return build_inventory(engine, images, selected_by="--engine containerd")


def test_inventory_round_trip_and_damage() -> None:
    import jsonschema

    doc = _inventory()
    raw = json.dumps(doc, indent=2, ensure_ascii=False).encode()
    assert load_inventory(raw) == doc
    schema = json.loads((REPO / "schemas" / "inventory" / "inventory-v1.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert held_diff_ids(doc) == ["sha256:" + "1" * 64, "sha256:" + "2" * 64]  # not the image with problems
    damaged = json.loads(raw)
    damaged["images"][0]["diffIds"].pop()
    with pytest.raises(InventoryDamaged):
        load_inventory(json.dumps(damaged).encode())
    with pytest.raises(ManifestError):
        load_inventory(b'{"kind": "receipt"}')
    assert checksum(doc) == doc["checksum"]


def test_the_delta_export_accepts_the_inventory(tmp_path: Path) -> None:
    """importer/inventory/have.py (bundle export --have) reads this inventory and checks the same checksum."""
    from importer.inventory.have import load_have

    path = tmp_path / "have.json"
    doc = _inventory()
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    assert {str(d) for d in load_have(str(path))} >= {"sha256:" + "1" * 64, "sha256:" + "2" * 64}
    doc["images"][0]["names"] = ["tampered"]
    path.write_text(json.dumps(doc))
    with pytest.raises(InventoryDamaged):
        load_have(str(path))


# ============================== --deep: comparing a re-export with bundle.json

def _scan(archive: bytes) -> Any:
    return scan_tar(io.BytesIO(archive), "test", bound=1 << 30)


@pytest.mark.parametrize("layout", ["classic", "v25"])
def test_deep_accepts_both_docker_save_layouts(images: dict[str, ImageRecord], layout: str) -> None:
    scan = _scan(docker_save(sample_images(), layout=layout))
    for image in images.values():
        result = compare(image, scan)
        assert result.ok, result.to_dict()
        assert [v.found for v in result.layers] == [str(x.diff_id) for x in image.layers]


def test_deep_names_the_layer_with_other_bytes(images: dict[str, ImageRecord]) -> None:
    fakes = sample_images()
    top = fakes[1].layers[2]
    archive = docker_save(fakes).replace(top[1024:1040], b"X" * 16)  # same length, other bytes
    result = compare(images["fake/app:2"], _scan(archive), steps=["a", "b", "RUN make"])
    assert not result.ok
    assert [v.index for v in result.layers if not v.ok] == [3]
    [line] = result.failures()
    assert line.startswith("layer 3/3 (RUN make) of fake/app:2: expected diff_id")
    assert compare(images["fake/base:1"], _scan(archive)).ok


def test_deep_follows_podman_layer_symlinks_and_compressed_blobs(images: dict[str, ImageRecord]) -> None:
    image = images["fake/app:2"]
    cfg = sample_images()[1].config
    layers = sample_images()[1].layers
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        names = []
        for i, layer in enumerate(layers):
            add(f"{i}.tar", gzip.compress(layer) if i == 2 else layer)
            link = tarfile.TarInfo(f"dir{i}/layer.tar")
            link.type, link.linkname = tarfile.SYMTYPE, f"../{i}.tar"
            tar.addfile(link)
            names.append(f"dir{i}/layer.tar")
        add("c.json", cfg)
        add("manifest.json", json.dumps([{"Config": "c.json", "Layers": names}]).encode())
    assert compare(image, _scan(buf.getvalue())).ok


def test_deep_without_the_image_says_so(images: dict[str, ImageRecord]) -> None:
    result = compare(images["fake/app:2"], _scan(docker_save(sample_images()[:1])))
    assert not result.ok and not result.config_found and "no image with config" in result.failures()[0]
    empty = compare(images["fake/app:2"], _scan(b""))
    assert not empty.ok and "not a readable tar" in empty.detail


def test_deep_names_the_layer_holding_a_file_the_engine_refused(pristine: Path,
                                                                images: dict[str, ImageRecord]) -> None:
    image = images["fake/app:2"]
    reason = 'file integrity checksum failed for "app/main.py"'
    result = export_refused(image, str(pristine), "app/main.py", "docker save x", reason)
    assert not result.ok
    assert [v.index for v in result.layers if v.checked] == [3]
    assert "layer 3/3" in result.failures()[0] and reason in result.failures()[0]
    assert "could not be checked" in result.failures()[1]
    lower = export_refused(image, str(pristine), "etc/os-release", "podman save x", reason)
    assert [v.index for v in lower.layers if v.checked] == [1]
    nowhere = export_refused(image, str(pristine), "no/such/file", "docker save x", reason)
    assert not nowhere.ok and "no layer of bundle.json holds /no/such/file" in nowhere.failures()[0]


def test_hash_member_decompresses_gzip_and_zstd() -> None:
    import zstandard

    plain = layer_tar({"a": b"x" * 100000})
    want = hash_member(io.BytesIO(plain), "p", bound=1 << 20)[0].plain_digest
    for packed, kind in ((gzip.compress(plain), "gzip"), (zstandard.ZstdCompressor().compress(plain), "zstd")):
        facts, _ = hash_member(io.BytesIO(packed), "p", bound=1 << 20)
        assert facts.compression == kind and facts.plain_digest == want and facts.plain_size == len(plain)
    facts, _ = hash_member(io.BytesIO(gzip.compress(plain)), "p", bound=1000)
    assert facts.plain_digest is None and "more than 1000 bytes" in facts.note
