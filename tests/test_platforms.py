"""Multi-platform images (issue 17): ``--platform`` parsing and matching, and picking one platform
of a two-platform OCI index built here (tiny layers, amd64 and arm64 configs) on export, checked
with skopeo as an independent reader and imported into the private amd64 dockerd."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from importer.errors import UsageError
from importer.format.platform import Platform, host, parse_platform, parse_platforms, pick_platform_manifest
from tests.kit import engines
from tests.kit.helpers import docker, image_facts, run_cli
from tests.kit.layoutgen import (
    OCI_MANIFEST,
    REF,
    two_platform_layout,
)

# --- parsing and matching (no engine)

def test_platforms_parse_and_match_as_containerd_does() -> None:
    assert parse_platform("linux/arm64") == Platform("linux", "arm64")
    assert parse_platform("Linux/ARM64/v8") == Platform("linux", "arm64", "v8")
    assert parse_platform("linux/arm64").matches(Platform("linux", "arm64", "v8"))  # v8 is arm64's default
    assert parse_platform("linux/aarch64").matches(Platform("linux", "arm64"))
    assert parse_platform("linux/x86_64").matches(Platform("linux", "amd64"))
    assert parse_platform("linux/arm").matches(Platform("linux", "arm", "v7"))
    assert not parse_platform("linux/arm/v6").matches(Platform("linux", "arm", "v7"))
    assert not parse_platform("linux/arm64").matches(Platform("linux", "amd64"))
    assert not parse_platform("windows/amd64").matches(Platform("linux", "amd64"))
    assert parse_platforms(["linux/amd64,linux/arm64", "linux/arm64/v8"]) == [
        Platform("linux", "amd64"), Platform("linux", "arm64")]
    assert str(Platform("linux", "arm64", "v8")) == "linux/arm64/v8"


@pytest.mark.parametrize("bad", ["linux", "linux/", "/amd64", "linux/amd64/v8/x", "linux amd64", ""])
def test_a_bad_platform_is_one_clear_error(bad: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_platform(bad)
    assert "expected OS/ARCH or OS/ARCH/VARIANT" in str(e.value) and repr(bad) in str(e.value)


def test_an_empty_entry_in_a_platform_list_is_refused() -> None:
    with pytest.raises(UsageError, match="empty entry"):
        parse_platforms(["linux/amd64,,linux/arm64"])


def test_the_index_entry_for_a_platform_is_picked() -> None:
    index = {"manifests": [
        {"digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": "sha256:" + "b" * 64, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        {"digest": "sha256:" + "c" * 64, "platform": {"os": "unknown", "architecture": "unknown"}}]}
    assert pick_platform_manifest(index, Platform("linux", "arm64")) == "sha256:" + "b" * 64
    assert pick_platform_manifest(index, Platform("linux", "amd64")) == "sha256:" + "a" * 64
    assert pick_platform_manifest(index, Platform("linux", "s390x")) is None


# --- a two-platform OCI layout

def _blobs_of(bundle: Path) -> set[str]:
    return {"sha256:" + p.name for p in (bundle / "blobs" / "sha256").iterdir()}


@pytest.mark.engine
def test_skopeo_reads_the_test_index_byte_for_byte(tmp_path: Path) -> None:
    engines.require("skopeo")
    built = two_platform_layout(tmp_path / "layout")
    raw = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{tmp_path / 'layout'}:{REF}"],
                         check=True, capture_output=True).stdout
    assert raw == built["index_raw"]
    arm = subprocess.run(["skopeo", "inspect", "--override-arch", "arm64", "--override-variant", "v8",
                          "--config", "--raw", f"oci:{tmp_path / 'layout'}:{REF}"],
                         check=True, capture_output=True).stdout
    assert hashlib.sha256(arm).hexdigest() == built["platforms"]["arm64"]["config"].split(":")[1]


@pytest.mark.parametrize("asked, arch", [(["--platform", "linux/arm64"], "arm64"),
                                         (["--platform", "linux/arm64/v8"], "arm64"),
                                         (["--platform", "linux/amd64"], "amd64"),
                                         ([], host().architecture)])
def test_export_carries_only_the_picked_platform(tmp_path: Path, asked: list[str], arch: str) -> None:
    built = two_platform_layout(tmp_path / "layout")
    if arch not in built["platforms"]:
        pytest.fail(f"this test expects an amd64 or arm64 host, found {host()}")
    out = tmp_path / "b"
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", *asked, "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "bundle.json").read_text())
    (image,) = doc["images"]
    want = built["platforms"][arch]
    assert image["platform"]["architecture"] == arch
    assert image["config"]["digest"] == want["config"]
    assert image["manifest"]["digest"] == want["manifest"]  # the source's manifest bytes are kept
    assert [x["digest"] for x in image["layers"]] == [want["layer"]]
    other = built["platforms"]["amd64" if arch == "arm64" else "arm64"]
    assert not {other["config"], other["layer"], other["manifest"]} & _blobs_of(out)
    dropped = [line for line in proc.stderr.splitlines() if "--all-platforms" in line]
    if asked:  # a platform named is a choice made; the default drops the others and says so, once
        assert dropped == [], proc.stderr
    else:
        assert dropped == [f"note: exporting from the OCI layout {tmp_path / 'layout'}: a multi-platform image "
                           f"(linux/amd64, linux/arm64/v8); carrying linux/{arch}{'/v8' if arch == 'arm64' else ''} "
                           "only (pass --all-platforms to keep every platform)"], proc.stderr
    assert run_cli("importer", str(out), "--verify-only").returncode == 0
    shown = run_cli("bundle", "inspect", str(out))
    assert shown.returncode == 0 and f"linux/{arch}" in shown.stdout, shown.stdout
    assert json.loads(run_cli("bundle", "inspect", str(out), "--json").stdout)["images"][0]["platform"][
        "architecture"] == arch


def test_a_platform_the_index_lacks_is_refused_naming_what_it_has(tmp_path: Path) -> None:
    two_platform_layout(tmp_path / "layout")
    out = tmp_path / "b"
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "--platform", "linux/s390x",
                   "-o", str(out))
    assert proc.returncode == 5, proc.stderr
    assert "linux/s390x" in proc.stderr and "found linux/amd64, linux/arm64/v8" in proc.stderr
    assert "platform-not-found" in proc.stderr or "--platform" in proc.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["layout"]  # no partial folder left


def test_a_single_platform_image_for_another_platform_is_refused(tmp_path: Path) -> None:
    """An OCI layout naming one amd64 manifest (no index): ``--platform linux/arm64`` is refused
    (it used to give an amd64 bundle), ``--platform linux/amd64`` carries it."""
    built = two_platform_layout(tmp_path / "layout")
    amd = built["platforms"]["amd64"]
    size = (tmp_path / "layout" / "blobs" / "sha256" / amd["manifest"].split(":")[1]).stat().st_size
    (tmp_path / "layout" / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd["manifest"], "size": size,
         "annotations": {"org.opencontainers.image.ref.name": REF}}]}))
    out = tmp_path / "b"
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "--platform", "linux/arm64",
                   "-o", str(out))
    assert proc.returncode == 5, proc.stderr
    assert "error[platform-not-found]" in proc.stderr, proc.stderr
    assert "expected an image for linux/arm64 (--platform), found a single-platform image for linux/amd64" \
        in proc.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["layout"]
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "--platform", "linux/amd64",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "bundle.json").read_text())["images"][0]["config"]["digest"] == amd["config"]


def test_a_docker_source_on_another_platform_is_refused(tmp_path: Path) -> None:
    """(Several platforms of one image: tests/test_multiplatform.py.)"""
    other = "linux/s390x" if host().architecture != "s390x" else "linux/amd64"
    proc = run_cli("bundle", "export", "some/image:1", "--platform", other, "-o", str(tmp_path / "b"),
                   docker_host="unix:///nonexistent.sock")
    assert proc.returncode == 2 and "expected this host's platform" in proc.stderr, proc.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.engine
def test_the_host_platform_of_a_two_platform_index_imports_into_docker(docker_host: str, tmp_path: Path) -> None:
    built = two_platform_layout(tmp_path / "layout")
    want = built["platforms"].get(host().architecture)
    if want is None:
        pytest.fail(f"this test expects an amd64 or arm64 host, found {host()}")
    out = tmp_path / "b"
    run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "-o", str(out), check=True)
    docker(docker_host, "image", "rm", REF, check=False)
    proc = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    facts = image_facts(docker_host, REF)
    assert facts is not None and facts[0] == want["config"]
    docker(docker_host, "image", "rm", REF, check=False)


# --- the offline host's platform, from its inventory (1.2)

def _inventory(tmp_path: Path, name: str, platform: dict | None, diff_id: str = "sha256:" + "1" * 64) -> str:
    from importer.engines import EngineImage, EngineInfo
    from importer.inventory.engine import build_inventory, checksum

    engine = EngineInfo("containerd", "1.7", "overlayfs", "containerd", "/run/containerd/containerd.sock")
    doc = build_inventory(engine, [EngineImage("sha256:" + "a" * 64, [diff_id], ["x:1"])])
    if platform is None:  # as a 1.1 inventory was written
        del doc["platform"]
        doc["inventoryVersion"] = "1.1"
    else:
        doc["platform"] = platform
    doc["checksum"] = checksum(doc)
    (tmp_path / name).write_text(json.dumps(doc))
    return str(tmp_path / name)


def test_the_inventory_names_the_engines_platform(tmp_path: Path) -> None:
    import jsonschema

    from importer.inventory.engine import inventory_platform, load_inventory

    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "inventory" /
                         "inventory-v1.schema.json").read_text())
    doc = load_inventory(Path(_inventory(tmp_path, "i.json", {"os": "linux", "architecture": "arm64",
                                                              "variant": "v8"})).read_bytes())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["inventoryVersion"] == "1.5" and inventory_platform(doc) == Platform("linux", "arm64", "v8")
    old = load_inventory(Path(_inventory(tmp_path, "old.json", None)).read_bytes())  # 1.1 stays readable
    jsonschema.Draft202012Validator(schema).validate(old)
    assert inventory_platform(old) is None


@pytest.mark.parametrize("inventories, asked, arch", [
    ([{"os": "linux", "architecture": "arm64", "variant": "v8"}], [], "arm64"),  # the offline host's
    ([{"os": "linux", "architecture": "arm64"}], ["--platform", "linux/amd64"], "amd64"),  # --platform wins
    ([None], [], host().architecture),  # a 1.1 inventory says nothing: this host's
])
def test_a_delta_export_carries_the_platform_the_inventory_names(tmp_path: Path, inventories: list,
                                                                 asked: list[str], arch: str) -> None:
    built = two_platform_layout(tmp_path / "layout")
    have = [a for i, p in enumerate(inventories) for a in ("--have", _inventory(tmp_path, f"i{i}.json", p))]
    out = tmp_path / "b"
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", *have, *asked, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    (image,) = json.loads((out / "bundle.json").read_text())["images"]
    assert image["config"]["digest"] == built["platforms"][arch]["config"]


def test_inventories_of_two_platforms_are_refused(tmp_path: Path) -> None:
    two_platform_layout(tmp_path / "layout")
    a = _inventory(tmp_path, "a.json", {"os": "linux", "architecture": "amd64"})
    b = _inventory(tmp_path, "b.json", {"os": "linux", "architecture": "arm64"})
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "--have", a, "--have", b,
                   "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "expected inventories of one platform, found linux/amd64" in proc.stderr and "linux/arm64" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.engine
def test_the_docker_inventory_records_this_hosts_platform(docker_host: str) -> None:
    proc = run_cli("importer", "--inventory", "--docker-host", docker_host)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["inventoryVersion"] == "1.5" and Platform(**doc["platform"]) == host()


# --- import: an engine runs one platform

@pytest.mark.engine
def test_a_bundle_for_another_platform_is_refused_before_any_change(docker_host: str, tmp_path: Path) -> None:
    built = two_platform_layout(tmp_path / "layout")
    foreign = "arm64" if host().architecture != "arm64" else "amd64"
    out = tmp_path / "b"
    run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "--platform", f"linux/{foreign}",
            "-o", str(out), check=True)
    docker(docker_host, "image", "rm", REF, check=False)
    before = sorted(docker(docker_host, "image", "ls", "-a", "-q", "--no-trunc").stdout.split())
    proc = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 7, proc.stderr
    assert "platform-mismatch" in proc.stderr and f"{REF} (linux/{foreign}" in proc.stderr, proc.stderr
    # nothing changed (as a set: images created in the same second list in any order)
    assert sorted(docker(docker_host, "image", "ls", "-a", "-q", "--no-trunc").stdout.split()) == before
    # an OCI layout holds any platform: the same bundle goes there, its manifest digest kept
    oci = tmp_path / "out.oci"
    proc = run_cli("importer", str(out), "--engine", "oci", "--oci-dir", str(oci), "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    index = json.loads((oci / "index.json").read_text())
    assert built["platforms"][foreign]["manifest"] in [m["digest"] for m in index["manifests"]]
    # told that the engine runs that platform (emulated), Docker takes it, ID = its config digest
    proc = run_cli("importer", str(out), "--verify", "--docker-host", docker_host, "--no-receipt",
                   "--platform", f"linux/{foreign}")
    assert proc.returncode == 0, proc.stderr
    facts = image_facts(docker_host, REF)
    assert facts is not None and facts[0] == built["platforms"][foreign]["config"]
    docker(docker_host, "image", "rm", REF, check=False)


@pytest.mark.engine
def test_containerd_holds_both_platforms_and_exports_the_one_asked(containerd_address: str, tmp_path: Path) -> None:
    built = two_platform_layout(tmp_path / "layout")
    index_json = tmp_path / "layout" / "index.json"  # ctr import names an image by this annotation
    doc = json.loads(index_json.read_text())
    doc["manifests"][0]["annotations"]["io.containerd.image.name"] = "docker.io/multi/app:1"
    index_json.write_text(json.dumps(doc))
    archive = tmp_path / "multi.tar"  # an OCI archive: the layout as a tar
    with tarfile.open(archive, "w") as tar:
        for p in sorted((tmp_path / "layout").rglob("*")):
            tar.add(p, arcname=str(p.relative_to(tmp_path / "layout")), recursive=False)
    ns = "platforms"
    ctr = ["ctr", "--address", containerd_address, "--namespace", ns]
    subprocess.run([*ctr, "images", "import", "--all-platforms", "--no-unpack", str(archive)],
                   check=True, capture_output=True)
    listed = subprocess.run([*ctr, "images", "ls", "-q"], check=True, capture_output=True, text=True).stdout.split()
    assert "docker.io/multi/app:1" in listed, listed
    name = "docker.io/multi/app:1"
    for arch in ("arm64", "amd64"):
        out = tmp_path / arch
        proc = run_cli("bundle", "export", f"containerd:{name}", "--platform", f"linux/{arch}", "-o", str(out),
                       "--address", containerd_address, "--namespace", ns)
        assert proc.returncode == 0, proc.stderr
        (image,) = json.loads((out / "bundle.json").read_text())["images"]
        assert image["manifest"]["digest"] == built["platforms"][arch]["manifest"]
        assert [x["digest"] for x in image["layers"]] == [built["platforms"][arch]["layer"]]
    proc = run_cli("bundle", "export", f"containerd:{name}", "--platform", "linux/riscv64", "-o",
                   str(tmp_path / "none"), "--address", containerd_address, "--namespace", ns)
    assert proc.returncode == 5 and "error[platform-not-found]" in proc.stderr, proc.stderr
    assert "found linux/amd64, linux/arm64/v8" in proc.stderr and not (tmp_path / "none").exists()
