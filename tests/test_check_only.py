"""``bundle-import BUNDLE --check-only`` (issue 18, point 2) against a private dockerd: it passes
after an import, fails with exit 8 and a stable id for a missing image and for another image under
the tag, never changes the engine's image list, and with ``--name-prefix`` proves the images a
node pulled from a registry the bundle was pushed to (a real docker-registry on 127.0.0.1)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit import engines
from tests.kit.bundlegen import FLEET_REFS as REFS
from tests.kit.bundlegen import fleet_bundle
from tests.kit.clijson import validate
from tests.kit.helpers import bundle_image_id, docker, forget, image_facts, run_cli

pytestmark = pytest.mark.engine



def engine_images(docker_host: str) -> list[str]:
    """Every image and tag the engine holds (IDs in full), sorted: what must not change."""
    out = docker(docker_host, "images", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}").stdout
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def check(bundle: Path, docker_host: str, receipt: Path, *extra: str) -> tuple[int, Any]:
    """Run --check-only with --json; the printed document (validated) and the receipt are the same."""
    before = engine_images(docker_host)
    proc = run_cli("importer", str(bundle), "--check-only", "--engine", "docker", "--docker-host", docker_host,
                   "--receipt", str(receipt), "--json", "-q", *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    validate("import", doc)
    assert engine_images(docker_host) == before, "--check-only changed the engine's image list"
    written = json.loads(receipt.read_text())
    assert written["kind"] == "check-only" and written["images"] == doc["images"]
    return proc.returncode, doc


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fleet_bundle(tmp_path_factory.mktemp("fleet") / "fleet.bundle")


@pytest.fixture()
def imported(bundle: Path, docker_store_host: str) -> Path:
    """The bundle's images in the engine under their names, as an import leaves them."""
    docker_host = docker_store_host
    forget(docker_host, *REFS)
    proc = run_cli("importer", str(bundle), "--engine", "docker", "--docker-host", docker_host, "--no-receipt", "-q")
    assert proc.returncode == 0, proc.stderr
    return bundle


STORES = pytest.mark.parametrize("docker_store", list(engines.DOCKER_STORES), indirect=True)


@STORES
def test_check_only_passes_after_an_import_and_changes_nothing(imported: Path, docker_store_host: str,
                                                                 tmp_path: Path) -> None:
    docker_host = docker_store_host
    pinned = json.loads((imported / "bundle.json").read_text())
    code, doc = check(imported, docker_host, tmp_path / "r.json", "--deep")
    assert code == 0 and doc["ok"] is True and doc["result"] == "pass", doc["error"]
    assert doc["kind"] == "check-only" and doc["checkOnly"] == {"namePrefix": None, "deep": True, "names": 2}
    assert doc["verification"]["ok"] and doc["verification"]["filesChecked"] > 0
    assert doc["staging"]["refs"] == [] and doc["staging"]["leftovers"] == []
    for image, entry in zip(pinned["images"], doc["images"]):
        assert entry["status"] == "checked" and entry["tagsApplied"] == [] and entry["result"] == "match"
        assert entry["deep"]["ok"] is True
        ref = image["refs"][0]
        facts = image_facts(docker_host, ref)
        assert facts is not None
        [named] = entry["names"]
        assert (named["name"], named["ref"], named["result"], named["imageId"]) == (ref, ref, "match", facts[0])
        assert facts[0] == bundle_image_id(docker_host, image)  # config digest; containerd store: manifest


@STORES
def test_a_missing_image_fails_with_check_only_missing_and_changes_nothing(imported: Path, docker_store_host: str,
                                                                             tmp_path: Path) -> None:
    docker_host = docker_store_host
    forget(docker_host, REFS[1])
    assert image_facts(docker_host, REFS[1]) is None
    code, doc = check(imported, docker_host, tmp_path / "r.json")
    assert code == 8 and doc["ok"] is False and doc["result"] == "fail"
    assert doc["error"]["id"] == "check-only-missing" and doc["error"]["exitCode"] == 8
    assert [e["result"] for e in doc["images"]] == ["match", "missing"]
    assert f"{REFS[1]}: the engine does not report the image" in doc["error"]["context"]
    assert image_facts(docker_host, REFS[1]) is None  # nothing was loaded


@STORES
def test_another_image_under_the_tag_fails_with_check_only_mismatch(imported: Path, docker_store_host: str,
                                                                      tmp_path: Path) -> None:
    docker_host = docker_store_host
    base_id = image_facts(docker_host, REFS[0])
    assert base_id is not None
    docker(docker_host, "tag", REFS[0], REFS[1])  # fleet/app:2 now names the base image
    code, doc = check(imported, docker_host, tmp_path / "r.json")
    assert code == 8 and doc["error"]["id"] == "check-only-mismatch", doc["error"]
    app = doc["images"][1]
    assert app["result"] == "mismatch" and app["found"]["imageId"] == base_id[0]
    assert "image ID: expected" in app["detail"] and app["names"][0]["imageId"] == base_id[0]
    facts = image_facts(docker_host, REFS[1])
    assert facts is not None and facts[0] == base_id[0]  # the tag was not moved back


def test_name_prefix_is_used_only_with_check_only(bundle: Path, tmp_path: Path) -> None:
    proc = run_cli("importer", str(bundle), "--name-prefix", "127.0.0.1:5000/team", "--verify-only", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "usage"
    proc = run_cli("importer", str(bundle), "--check-only", "--force", "--json")
    assert proc.returncode == 2 and "--check-only changes nothing" in proc.stderr


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    with engines.private_registry(f"i18-{os.getpid()}") as reg:
        yield reg.addr


def test_name_prefix_proves_what_a_node_pulled_from_the_registry(bundle: Path, registry: str, docker_host: str,
                                                                  tmp_path: Path) -> None:
    """The cluster path: the bundle pushed to a registry, the node pulls under the registry's names
    (and holds none of the bundle's own), --check-only --name-prefix proves them."""
    pushed = run_cli("bundle", "push", str(bundle), f"{registry}/mirror", "--json")
    assert pushed.returncode == 0, pushed.stderr
    mirrored = [f"{registry}/mirror/{ref}" for ref in REFS]
    assert [i["pushedTo"] for i in json.loads(pushed.stdout)["images"]] == mirrored
    forget(docker_host, *REFS, *mirrored)
    for name in mirrored:
        docker(docker_host, "pull", name)
    code, doc = check(bundle, docker_host, tmp_path / "plain.json")  # the bundle's own names: not there
    assert code == 8 and doc["error"]["id"] == "check-only-missing"

    code, doc = check(bundle, docker_host, tmp_path / "prefixed.json", "--name-prefix", f"{registry}/mirror")
    assert code == 0 and doc["ok"], doc["error"]
    assert doc["checkOnly"]["namePrefix"] == f"{registry}/mirror"
    assert [e["names"][0]["name"] for e in doc["images"]] == mirrored
    assert [e["names"][0]["ref"] for e in doc["images"]] == list(REFS)
    pinned = json.loads((bundle / "bundle.json").read_text())
    assert [e["found"]["imageId"] for e in doc["images"]] == [i["config"]["digest"] for i in pinned["images"]]

    # a registry that was pushed another build since: the node pulled that one; the check names it
    other = fleet_bundle(tmp_path / "other.bundle", seed=b"# another build\n")
    assert run_cli("bundle", "push", str(other), f"{registry}/mirror", "-q").returncode == 0
    docker(docker_host, "pull", mirrored[1])
    code, doc = check(bundle, docker_host, tmp_path / "moved.json", "--name-prefix", f"{registry}/mirror")
    assert code == 8 and doc["error"]["id"] == "check-only-mismatch"
    assert [e["result"] for e in doc["images"]] == ["match", "mismatch"]  # only the app was pulled again
    forget(docker_host, *mirrored)
