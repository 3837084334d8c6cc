"""Every bundle schema (1, 2, 3) is writable and readable; old golden bundles keep importing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kit import engines
from tests.kit.helpers import docker, image_facts, run_cli, run_pyz
from tests.kit.imagegen import simple_context

GOLDEN = Path(__file__).resolve().parent / "golden" / "bundles"
VERSIONS = ["v1", "v2", "v3"]


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_bundle_verifies_with_the_current_importer(version: str) -> None:
    proc = run_cli("importer", str(GOLDEN / version), "--verify-only", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_golden_bundle_verifies_with_its_own_importer(version: str) -> None:
    proc = run_pyz(GOLDEN / version, "--verify-only")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_bundle_inspects(version: str) -> None:
    info = json.loads(run_cli("bundle", "inspect", str(GOLDEN / version), "--json", check=True).stdout)
    assert info["schemaVersion"].startswith(version[1] + ".")
    assert [i["refs"] for i in info["images"]] == [["fake/base:1"], ["fake/app:2"]]


def test_inspect_reads_a_packed_bundle_in_place_and_names_a_wrong_folder(tmp_path: Path) -> None:
    run_cli("bundle", "pack", str(GOLDEN / "v3"), str(tmp_path / "v3.tar"), "--split", "64K", check=True)
    packed = json.loads(run_cli("bundle", "inspect", str(tmp_path / "v3.tar.parts.json"), "--json", check=True).stdout)
    folder = json.loads(run_cli("bundle", "inspect", str(GOLDEN / "v3"), "--json", check=True).stdout)
    assert packed["bundleDigest"] == folder["bundleDigest"] and packed["images"] == folder["images"]
    (tmp_path / "empty").mkdir()
    proc = run_cli("bundle", "inspect", str(tmp_path / "empty"))
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert f"opening {tmp_path / 'empty'}: expected bundle.json in the folder, found none" in proc.stderr


@pytest.mark.engine
@pytest.mark.parametrize("version", VERSIONS)
def test_golden_bundle_imports_into_docker(version: str, docker_host: str, tmp_path: Path) -> None:
    bundle = tmp_path / version
    shutil.copytree(GOLDEN / version, bundle)
    for ref in ("fake/app:2", "fake/base:1"):
        docker(docker_host, "image", "rm", ref, check=False)
    proc = run_cli("importer", str(bundle), "--docker-host", docker_host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["result"] == "pass"
    configs = {tuple(i["refs"]): i["expected"]["configDigest"] for i in receipt["images"]}
    for ref in ("fake/base:1", "fake/app:2"):
        facts = image_facts(docker_host, ref)
        assert facts is not None and facts[0] == configs[(ref,)]


@pytest.fixture(scope="module")
def small_image(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    ctx = simple_context(tmp_path_factory.mktemp("ctx") / "c", busybox, "schemas\n")
    engines.build_image(docker_host, ctx, "schemas/img:1")
    facts = image_facts(docker_host, "schemas/img:1")
    assert facts is not None
    return facts


@pytest.mark.engine
def test_schema_1_loads_with_plain_docker_load(docker_host: str, small_image: tuple, tmp_path: Path) -> None:
    out = tmp_path / "s1"
    run_cli("bundle", "export", "schemas/img:1", "--schema", "1", "-o", str(out), docker_host=docker_host,
            check=True)
    assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "bundle.json", "images.tar"]
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True).returncode == 0
    docker(docker_host, "image", "rm", "schemas/img:1")
    docker(docker_host, "load", "-i", str(out / "images.tar"))  # nothing but docker on the far side
    assert image_facts(docker_host, "schemas/img:1") == small_image
    doc = json.loads((out / "bundle.json").read_text())
    assert doc["schemaVersion"] == "1.0" and doc["images"][0]["configDigest"] == small_image[0]


@pytest.mark.engine
def test_schema_2_round_trip_with_its_importer(docker_host: str, small_image: tuple, tmp_path: Path) -> None:
    out = tmp_path / "s2"
    run_cli("bundle", "export", "schemas/img:1", "--schema", "2", "-o", str(out), docker_host=docker_host,
            check=True)
    assert (out / "images.tar.zst").exists() and (out / "bundle-import.pyz").exists()
    docker(docker_host, "image", "rm", "schemas/img:1")
    proc = run_pyz(out, "--verify", "--docker-host", docker_host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    assert image_facts(docker_host, "schemas/img:1") == small_image
    assert json.loads(proc.stdout)["images"][0]["result"] == "match"


@pytest.mark.engine
def test_schema_2_tampered_archive_is_refused(docker_host: str, small_image: tuple, tmp_path: Path) -> None:
    out = tmp_path / "s2"
    run_cli("bundle", "export", "schemas/img:1", "--schema", "2", "-o", str(out), docker_host=docker_host,
            check=True)
    data = bytearray((out / "images.tar.zst").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / "images.tar.zst").write_bytes(bytes(data))
    proc = run_pyz(out, "--verify-only")
    assert proc.returncode == 3 and "images.tar.zst" in proc.stderr


@pytest.mark.engine
def test_older_schema_with_per_layer_options_is_a_clear_error(docker_host: str, small_image: tuple,
                                                              tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "schemas/img:1", "--schema", "1", "--compression", "gzip",
                   "-o", str(tmp_path / "x"), docker_host=docker_host)
    assert proc.returncode == 2 and "--schema 3" in proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_bundle_json_validates_against_its_schema(version: str) -> None:
    import jsonschema

    schema = json.loads((GOLDEN.parents[2] / "schemas" / "bundle" / f"{version}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((GOLDEN / version / "bundle.json").read_text()))


def test_export_summary_counts_layers_apart_from_the_importer() -> None:
    from dataclasses import replace

    from bundle.cli import summary_line
    from importer.format.manifest import load_bundle_manifest

    m = load_bundle_manifest((GOLDEN / "v3" / "bundle.json").read_bytes())
    total = sum(f.size for f in m.files)
    assert summary_line(m) == f"2 image(s), 3 layer(s), layers 268 B of 31.0 KiB (1%), bundle {total / 1024:.1f} KiB"
    top = m.images[1].layers[-1]
    delta = replace(m, images=(m.images[0], replace(m.images[1], layers=(*m.images[1].layers[:-1],
                                                                         replace(top, external=True)))))
    assert summary_line(delta).startswith("2 image(s), 2 layer(s) + 1 external (on the host already, not carried), "
                                          "layers 163 B of 11.0 KiB (1%)")
