"""End to end through a real dockerd: export the tricky images, carry, import, prove identity.

The round trip runs on both of Docker's image stores (fixture ``store``): the classic one
(overlay2; image ID = config digest) and the containerd one (Docker 26, containerd snapshotter;
image ID = manifest digest, kept because the bundle carries the engine's own manifest and layers
as stored). The cross-store tests carry a bundle from one store to the other."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kit import engines
from tests.kit.helpers import docker, image_facts, image_ids, run_cli, run_pyz, run_zipapp
from tests.kit.imagegen import LONG_DIR, LONG_FILE, UNICODE_NAME, write_contexts

pytestmark = pytest.mark.engine

REFS = ("tricky:base", "tricky:child")


@pytest.fixture(scope="session")
def tricky(docker_host: str, busybox: str,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, list[str]]]:
    """Build both images once; return ref -> (image ID, diff_ids) as the engine built them."""
    root = tmp_path_factory.mktemp("ctx")
    base, child = write_contexts(root, busybox)
    engines.build_image(docker_host, base, "tricky:base")
    engines.build_image(docker_host, child, "tricky:child")
    facts = {ref: image_facts(docker_host, ref) for ref in REFS}
    assert all(facts.values())
    LISTINGS["built"] = _listing(docker_host)
    return facts  # type: ignore[return-value]


LISTINGS: dict[str, str] = {}
CONTENT_SCRIPT = (
    "cd /data; stat -c '%n %a %h %s' hl-src hl-dst setuid sticky empty; "
    "readlink abs-link; readlink rel-link; readlink dangling; ls gone-dir; ls gone-file 2>&1; "
    f"cat '{LONG_DIR}/{LONG_FILE}' '/data/{UNICODE_NAME}'; sha256sum /big.bin; cat /child; "
    "find / -xdev ! -path '/etc/*' ! -path /etc ! -path '/proc*' ! -path '/sys*' ! -path '/dev*' "
    "! -name .dockerenv -exec stat -c '%n %a %u %g %s %h %F' {} + | sort"
)


def _listing(docker_host: str) -> str:
    return docker(docker_host, "run", "--rm", "--pull", "never", "--network", "none", "tricky:child",
                  "/bin/sh", "-c", CONTENT_SCRIPT).stdout


@pytest.fixture(scope="session")
def tricky_bundle(docker_host: str, tricky: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "tricky.bundle"
    run_cli("bundle", "export", *REFS, "-o", str(out), "--schema", "3", docker_host=docker_host, check=True)
    return out


@dataclass
class Store:
    """One Docker image store with the tricky images built in it and a bundle exported from it."""

    kind: str  # "classic" or "containerd"
    host: str
    facts: dict  # ref -> (image ID, diff_ids) as the engine built them
    bundle: Path
    listing: str
    driver: str  # docker info's storage driver


@pytest.fixture(scope="session", params=["classic", "containerd"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "classic":
        facts = request.getfixturevalue("tricky")
        return Store("classic", request.getfixturevalue("docker_host"), facts,
                     request.getfixturevalue("tricky_bundle"), LISTINGS["built"], "overlay2")
    return request.getfixturevalue("ctrstore_images")  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def ctrstore_images(docker_host_ctrstore: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The tricky images built in the containerd-store Docker and exported with no extra flags."""
    host = docker_host_ctrstore
    base, child = write_contexts(tmp_path_factory.mktemp("ctx-ctrstore"), busybox)
    engines.build_image(host, base, "tricky:base")
    engines.build_image(host, child, "tricky:child")
    facts = {ref: image_facts(host, ref) for ref in REFS}
    listing = _listing(host)
    out = tmp_path_factory.mktemp("bundles-ctrstore") / "tricky.bundle"
    run_cli("bundle", "export", *REFS, "-o", str(out), docker_host=host, check=True)  # no extra flags
    return Store("containerd", host, facts, out, listing, "overlayfs")


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / bundle.name
    shutil.copytree(bundle, dst)
    return dst


def _remove(docker_host: str, *refs: str) -> None:
    for ref in refs:
        docker(docker_host, "image", "rm", ref, check=False)


def test_bundle_holds_both_images_and_shares_layers(tricky_bundle: Path, tricky: dict) -> None:
    doc = json.loads((tricky_bundle / "bundle.json").read_text())
    assert doc["schemaVersion"] == "3.0"
    by_ref = {img["refs"][0]: img for img in doc["images"]}
    assert set(by_ref) == set(REFS)
    for ref, (image_id, diff_ids) in tricky.items():
        assert by_ref[ref]["config"]["digest"] == image_id
        assert [x["diffId"] for x in by_ref[ref]["layers"]] == diff_ids
    base_layers = {x["digest"] for x in by_ref["tricky:base"]["layers"]}
    child_layers = [x["digest"] for x in by_ref["tricky:child"]["layers"]]
    assert base_layers <= set(child_layers)
    # shared layers are stored once: one blob per unique layer + 2 configs + 2 manifests
    blobs = list((tricky_bundle / "blobs" / "sha256").iterdir())
    assert len(blobs) == len(set(child_layers)) + 4
    # --compression auto: the 200 MB random layer does not compress, so it is stored as it is (its
    # digest is its diff_id); the small layers of text and busybox are zstd
    big = max(by_ref["tricky:base"]["layers"], key=lambda x: x["uncompressedSize"])
    assert big["uncompressedSize"] > 200 * 1024 * 1024
    assert big["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    assert big["digest"] == big["diffId"] and big["size"] == big["uncompressedSize"]
    assert {x["mediaType"] for x in by_ref["tricky:child"]["layers"]} == {
        "application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+zstd"}


def test_sha256sum_accepts_the_bundle(tricky_bundle: Path) -> None:
    proc = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=tricky_bundle,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {line.split("  ", 1)[1] for line in (tricky_bundle / "SHA256SUMS").read_text().splitlines()}
    on_disk = {str(p.relative_to(tricky_bundle)) for p in tricky_bundle.rglob("*") if p.is_file()}
    assert on_disk - listed == {"SHA256SUMS"}


def test_bundle_json_and_oci_documents_validate(tricky_bundle: Path) -> None:
    import jsonschema

    from tests.kit.oci_schemas import validate_oci

    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas/bundle/v3.schema.json").read_text())
    doc = json.loads((tricky_bundle / "bundle.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    validate_oci("layout", json.loads((tricky_bundle / "oci-layout").read_text()))
    validate_oci("index", json.loads((tricky_bundle / "index.json").read_text()))
    for image in doc["images"]:
        blob = tricky_bundle / "blobs" / "sha256"
        validate_oci("manifest", json.loads((blob / image["manifest"]["digest"][7:]).read_text()))
        validate_oci("config", json.loads((blob / image["config"]["digest"][7:]).read_text()))


def test_skopeo_reads_the_bundle_as_an_oci_layout(tricky_bundle: Path, tricky: dict) -> None:
    engines.require("skopeo")
    for ref in REFS:
        out = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{tricky_bundle}:{ref}"],
                             capture_output=True, text=True, check=True).stdout
        manifest = json.loads(out)
        assert manifest["config"]["digest"] == tricky[ref][0]


def test_skopeo_copies_the_stored_and_zstd_layers_of_the_bundle(tricky_bundle: Path, tricky: dict,
                                                                 tmp_path: Path) -> None:
    """A peer OCI reader takes the layers --compression auto stored uncompressed: skopeo copies the
    layout as it is (--preserve-digests: checking every blob's digest, recompressing none), so the
    config, so the image ID, is the same."""
    engines.require("skopeo")
    dest = tmp_path / "copy"
    subprocess.run(["skopeo", "copy", "--preserve-digests", f"oci:{tricky_bundle}:tricky:child", f"oci:{dest}:c"],
                   capture_output=True, text=True, check=True)
    manifest = json.loads(subprocess.run(["skopeo", "inspect", "--raw", f"oci:{dest}:c"], capture_output=True,
                                         text=True, check=True).stdout)
    assert manifest["config"]["digest"] == tricky["tricky:child"][0]
    assert "application/vnd.oci.image.layer.v1.tar" in {x["mediaType"] for x in manifest["layers"]}


def test_skopeo_copies_a_gzip_bundle_into_docker(docker_host: str, tricky: dict, tmp_path: Path) -> None:
    """skopeo 1.9 refuses zstd layers for docker-daemon (Docker schema 2 has no zstd type);
    a --compression gzip bundle goes through and keeps the image ID."""
    engines.require("skopeo")
    out = tmp_path / "gz.bundle"
    run_cli("bundle", "export", "tricky:child", "-o", str(out), "--compression", "gzip",
            docker_host=docker_host, check=True)
    subprocess.run(["skopeo", "copy", "--dest-daemon-host", docker_host, f"oci:{out}:tricky:child",
                    "docker-daemon:skopeo/copied:1"], capture_output=True, text=True, check=True)
    try:
        assert image_facts(docker_host, "skopeo/copied:1") == tricky["tricky:child"]
    finally:
        _remove(docker_host, "skopeo/copied:1")


def test_bundle_pins_the_image_ids_the_build_host_shows(store: Store) -> None:
    """Classic: the config digest is the ID. Containerd store: the manifest digest is the ID (the
    engine's own manifest, byte for byte), layers carried as the engine keeps them (gzip)."""
    doc = json.loads((store.bundle / "bundle.json").read_text())
    by_ref = {img["refs"][0]: img for img in doc["images"]}
    assert doc["source"]["imageStore"] == store.kind
    for ref, (image_id, diff_ids) in store.facts.items():
        image = by_ref[ref]
        assert [x["diffId"] for x in image["layers"]] == diff_ids
        if store.kind == "classic":
            assert image["config"]["digest"] == image_id
        else:
            assert image["manifest"]["digest"] == image_id
            assert all("gzip" in x["mediaType"] for x in image["layers"])  # no recompression
    proc = run_pyz(store.bundle, "--verify-only", "--json")
    assert proc.returncode == 0, proc.stderr


def test_bundled_importer_round_trip_reproduces_image_ids(store: Store, tmp_path: Path) -> None:
    host = store.host
    carried = _copy(store.bundle, tmp_path)  # the far side sees a copy
    _remove(host, "tricky:child", "tricky:base")
    assert image_facts(host, "tricky:base") is None
    receipt = tmp_path / "receipt.json"
    proc = run_pyz(carried, "--verify", "--docker-host", host, "--receipt", str(receipt))
    assert proc.returncode == 0, proc.stderr
    assert "MATCH" in proc.stdout
    for ref in REFS:
        assert image_facts(host, ref) == store.facts[ref]
    doc = json.loads(receipt.read_text())
    assert doc["result"] == "pass"
    assert doc["engine"]["storageDriver"] == store.driver
    assert doc["engine"]["imageStore"] == store.kind
    assert {tuple(i["refs"]) for i in doc["images"]} == {(r,) for r in REFS}
    assert all(i["result"] == "match" and i["idVerified"] for i in doc["images"])
    rule = "config-digest" if store.kind == "classic" else "manifest-digest"
    assert {i["identityRule"] for i in doc["images"]} == {rule}
    assert not [line for line in image_ids(host) if "sneakernet-staging" in line]


def test_imported_filesystem_keeps_tricky_content(store: Store, tmp_path: Path) -> None:
    docker_host = store.host
    _remove(docker_host, "tricky:child", "tricky:base")
    assert run_pyz(store.bundle, "--docker-host", docker_host, "--no-receipt").returncode == 0
    out = _listing(docker_host)  # docker run --pull never: the name resolves
    assert out == store.listing  # every path, mode, owner, size, link count and type
    assert "setuid 4755 1" in out and "sticky 1777" in out and "empty 644 1 0" in out
    assert "/data/hl-src\nhl-src\n/nonexistent/target\n" in out
    assert "new\n" in out and "No such file" in out
    assert "long\nunicode\n" in out and "child\n" in out


def test_second_import_changes_nothing(store: Store) -> None:
    docker_host, tricky_bundle = store.host, store.bundle
    assert run_pyz(tricky_bundle, "--docker-host", docker_host, "--no-receipt").returncode == 0
    before = image_ids(docker_host)
    proc = run_pyz(tricky_bundle, "--docker-host", docker_host, "--no-receipt", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [i["status"] for i in doc["images"]] == ["already-present", "already-present"]
    assert all(i["tagsApplied"] == [] for i in doc["images"])
    assert image_ids(docker_host) == before


def test_import_into_a_vfs_engine_gives_the_same_identity(docker_host_vfs: str, tricky_bundle: Path,
                                                          tricky: dict) -> None:
    proc = run_pyz(tricky_bundle, "--verify", "--docker-host", docker_host_vfs, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"]["storageDriver"] == "vfs"
    for ref in REFS:
        assert image_facts(docker_host_vfs, ref) == tricky[ref]


def test_tag_held_by_another_image_is_not_moved_without_force(store: Store) -> None:
    docker_host, tricky_bundle, tricky = store.host, store.bundle, store.facts
    _remove(docker_host, "tricky:child")
    docker(docker_host, "tag", tricky["tricky:base"][0], "tricky:child")  # the tag points elsewhere
    before = image_ids(docker_host)
    proc = run_pyz(tricky_bundle, "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 7, proc.stderr
    assert "error[tag-conflict]" in proc.stderr and "tricky:child" in proc.stderr
    assert image_ids(docker_host) == before
    proc = run_pyz(tricky_bundle, "--docker-host", docker_host, "--no-receipt", "--force")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(docker_host, "tricky:child") == tricky["tricky:child"]


def test_tampered_layer_is_refused_before_the_engine_is_touched(store: Store, tmp_path: Path) -> None:
    docker_host = store.host
    carried = _copy(store.bundle, tmp_path)
    doc = json.loads((carried / "bundle.json").read_text())
    layer = doc["images"][1]["layers"][-1]["digest"][7:]
    path = carried / "blobs" / "sha256" / layer
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    _remove(docker_host, "tricky:child")
    before = image_ids(docker_host)
    proc = run_pyz(carried, "--verify", "--docker-host", docker_host, "--json",
                   "--receipt", str(tmp_path / "r.json"))
    assert proc.returncode == 3, proc.stderr
    assert "error[verification-failed]" in proc.stderr
    assert f"[digest-mismatch] blobs/sha256/{layer}" in proc.stderr or "decompress-failed" in proc.stderr
    assert image_ids(docker_host) == before
    receipt = json.loads((tmp_path / "r.json").read_text())
    assert receipt["result"] == "fail" and receipt["error"]["id"] == "verification-failed"


def test_verify_only_needs_no_engine(tricky_bundle: Path) -> None:
    proc = run_pyz(tricky_bundle, "--verify-only", "--docker-host", "unix:///nonexistent.sock", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["verification"]["layersChecked"] >= 7


def test_unreachable_engine_is_a_clear_error(tricky_bundle: Path, tmp_path: Path) -> None:
    proc = run_pyz(tricky_bundle, "--docker-host", f"unix://{tmp_path}/none.sock", "--no-receipt")
    assert proc.returncode == 6
    assert "error[engine-unavailable]" in proc.stderr and "none.sock" in proc.stderr


def test_export_of_a_missing_image_leaves_nothing(docker_host: str, tmp_path: Path) -> None:
    out = tmp_path / "missing.bundle"
    proc = run_cli("bundle", "export", "no/such:image", "-o", str(out), docker_host=docker_host)
    assert proc.returncode == 5
    assert "error[image-not-found]" in proc.stderr and "no/such:image" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_an_existing_folder(docker_host: str, tricky: dict, tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep").write_text("x")
    proc = run_cli("bundle", "export", "tricky:base", "-o", str(tmp_path / "b"), docker_host=docker_host)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert (tmp_path / "b" / "keep").read_text() == "x"


def test_inspect_shows_images_and_shared_layers(tricky_bundle: Path, tricky: dict) -> None:
    proc = run_cli("bundle", "inspect", str(tricky_bundle), "--json", check=True)
    info = json.loads(proc.stdout)
    assert [i["refs"] for i in info["images"]] == [["tricky:base"], ["tricky:child"]]
    assert len(info["sharedLayers"]) == len(tricky["tricky:base"][1])
    assert info["totals"]["uniqueLayers"] == len(tricky["tricky:child"][1])
    human = run_cli("bundle", "inspect", str(tricky_bundle), check=True).stdout
    assert "tricky:child" in human


def test_pyz_runs_isolated_without_site(tricky_bundle: Path) -> None:
    proc = run_zipapp(tricky_bundle / "bundle-import.pyz", "--version", flags=("-I", "-S"), drop_env=())
    assert proc.returncode == 0 and "bundle-import" in proc.stdout
    digest = hashlib.sha256((tricky_bundle / "bundle-import.pyz").read_bytes()).hexdigest()
    doc = json.loads((tricky_bundle / "bundle.json").read_text())
    assert doc["importer"]["digest"] == f"sha256:{digest}"


def test_deep_and_inventory_on_each_store(store: Store) -> None:
    """--deep re-exports (docker save) and re-hashes every layer; the inventory lists the images."""
    proc = run_pyz(store.bundle, "--docker-host", store.host, "--deep", "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [i["deep"]["ok"] for i in doc["images"]] == [True, True]
    inv = run_zipapp(store.bundle / "bundle-import.pyz", "--inventory", "--docker-host", store.host, "--json",
                     drop_env=("PYTHON", "DOCKER_"), timeout=300)
    assert inv.returncode == 0, inv.stderr
    listed = {(i["id"], tuple(i["diffIds"])) for i in json.loads(inv.stdout)["images"]}
    assert {(store.facts[r][0], tuple(store.facts[r][1])) for r in REFS} <= listed


# --- across stores: what each store's ID becomes (docs/engines.md) -------------------------


def _bundle_ids(bundle: Path) -> dict:
    doc = json.loads((bundle / "bundle.json").read_text())
    return {img["refs"][0]: (img["config"]["digest"], img["manifest"]["digest"],
                             [x["diffId"] for x in img["layers"]]) for img in doc["images"]}


def test_classic_bundle_into_the_containerd_store(tricky_bundle: Path, tricky: dict,
                                                  docker_host_ctrstore: str, tmp_path: Path) -> None:
    """A bundle made on the classic store: on the containerd store the ID is the bundle's
    manifest digest (the classic host never had a manifest), RootFS.Layers the same diff_ids."""
    host = docker_host_ctrstore
    _remove(host, "tricky:child", "tricky:base")
    proc = run_pyz(tricky_bundle, "--docker-host", host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    ids = _bundle_ids(tricky_bundle)
    for ref in REFS:
        config, manifest, _ = ids[ref]
        assert config == tricky[ref][0]
        assert image_facts(host, ref) == (manifest, tricky[ref][1])
    assert "child\n" in docker(host, "run", "--rm", "--pull", "never", "--network", "none",
                               "tricky:child", "cat", "/child").stdout
    _remove(host, "tricky:child", "tricky:base")  # leave the containerd store as the store fixture expects


def test_containerd_store_bundle_into_the_classic_store(ctrstore_images: Store, docker_host_vfs: str) -> None:
    """A bundle made on the containerd store: on a classic store the ID is the config digest."""
    ctr, host = ctrstore_images, docker_host_vfs
    _remove(host, "tricky:child", "tricky:base")
    proc = run_pyz(ctr.bundle, "--docker-host", host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    ids = _bundle_ids(ctr.bundle)
    for ref in REFS:
        config, manifest, _ = ids[ref]
        assert manifest == ctr.facts[ref][0]  # the ID on the build host
        assert image_facts(host, ref) == (config, ctr.facts[ref][1])
    _remove(host, "tricky:child", "tricky:base")


def test_containerd_store_export_through_docker_save_matches_the_content_store(
        ctrstore_images: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the content store cannot be read, the `docker save` stream (which carries the stored
    blobs on this store) gives the very same bundle images: manifest, config and layer blobs."""
    out = tmp_path / "via-save.bundle"
    host = ctrstore_images.host  # the images as built there (other tests load and remove them)
    assert run_pyz(ctrstore_images.bundle, "--docker-host", host, "--no-receipt", "--force").returncode == 0
    monkeypatch.setenv("SNEAKERNET_DOCKER_CONTENT_STORE", "0")
    run_cli("bundle", "export", *REFS, "-o", str(out), docker_host=ctrstore_images.host, check=True)
    images = json.loads((out / "bundle.json").read_text())["images"]
    assert images == json.loads((ctrstore_images.bundle / "bundle.json").read_text())["images"]
    assert {i["manifest"]["digest"] for i in images} == {ctrstore_images.facts[r][0] for r in REFS}


@pytest.mark.parametrize("via", ["content-store", "docker-save"])
def test_asked_compression_recompresses_on_the_containerd_store_and_says_so(
        ctrstore_images: Store, via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--compression zstd` asked explicitly: the layers the store keeps as gzip are recompressed,
    the manifest is the bundle's own (a notice says the ID changes), and it still imports with
    that manifest's digest as the ID. `auto` (the default, the fixture's bundle) keeps them."""
    host = ctrstore_images.host
    assert run_pyz(ctrstore_images.bundle, "--docker-host", host, "--no-receipt", "--force").returncode == 0
    kept = json.loads((ctrstore_images.bundle / "bundle.json").read_text())["images"]
    assert {x["mediaType"] for i in kept for x in i["layers"]} <= {
        "application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip"}
    if via == "docker-save":
        monkeypatch.setenv("SNEAKERNET_DOCKER_CONTENT_STORE", "0")
    out = tmp_path / "zstd.bundle"
    proc = run_cli("bundle", "export", *REFS, "-o", str(out), "--compression", "zstd", docker_host=host, check=True)
    assert "note: --compression zstd recompressed" in proc.stderr
    images = json.loads((out / "bundle.json").read_text())["images"]
    assert {x["mediaType"] for i in images for x in i["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    by_ref = {i["refs"][0]: i for i in images}
    for ref, (image_id, diff_ids) in ctrstore_images.facts.items():
        assert by_ref[ref]["manifest"]["digest"] != image_id  # the notice's point
        assert [x["diffId"] for x in by_ref[ref]["layers"]] == diff_ids
    _remove(host, *REFS)
    proc = run_pyz(out, "--verify", "--docker-host", host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    for ref in REFS:
        assert image_facts(host, ref) == (by_ref[ref]["manifest"]["digest"], ctrstore_images.facts[ref][1])
    # gzip asked on a gzip store: nothing to recompress, the manifest is kept, no notice
    same = tmp_path / "gzip.bundle"
    assert run_pyz(ctrstore_images.bundle, "--docker-host", host, "--no-receipt", "--force").returncode == 0
    proc = run_cli("bundle", "export", *REFS, "-o", str(same), "--compression", "gzip", docker_host=host, check=True)
    assert "recompressed" not in proc.stderr
    assert json.loads((same / "bundle.json").read_text())["images"] == kept
