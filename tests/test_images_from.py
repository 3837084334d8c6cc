"""`bundle export --images-from FILE` (issue 17, point 4): plain lists (comments, blank lines, any
source prefix), hauler `kind: Images` manifests and zarf.yaml read with a YAML parser, each bad
entry named by file and line; then real exports: a plain list from the private dockerd, and a
hauler manifest and a zarf.yaml whose bare names are read from a real docker-registry."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundle.imagelist import ImageListError, platform_of, read_image_list, read_image_lists
from tests.kit import engines
from tests.kit.engines import Registry
from tests.kit.helpers import run_cli
from tests.kit.imagegen import simple_context


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_plain_list_with_comments_and_prefixes(tmp_path: Path) -> None:
    f = write(tmp_path / "images.txt", "# the training stack\n\nteam/train:7\n"
              "  docker://reg.example:5000/a/b:1  # pinned\n"
              "oci:/srv/layout:app:1\ncontainerd:docker.io/library/x:2\n\tteam/train:7\n")
    images = read_image_list(f)
    assert [i.ref for i in images] == ["team/train:7", "docker://reg.example:5000/a/b:1", "oci:/srv/layout:app:1",
                                       "containerd:docker.io/library/x:2", "team/train:7"]
    assert [i.where for i in images] == [f"{f}:3", f"{f}:4", f"{f}:5", f"{f}:6", f"{f}:7"]
    assert [i.ref for i in read_image_lists([f, f])] == ["team/train:7", "docker://reg.example:5000/a/b:1",
                                                         "oci:/srv/layout:app:1", "containerd:docker.io/library/x:2"]


def test_a_hauler_manifest_skips_other_kinds_and_keeps_platforms(tmp_path: Path) -> None:
    f = write(tmp_path / "hauler.yaml", """\
apiVersion: content.hauler.cattle.io/v1
kind: Charts
spec:
  charts:
    - name: rancher
---
apiVersion: content.hauler.cattle.io/v1
kind: Images
metadata:
  name: stack
spec:
  images:
    - name: nvcr.io/nvidia/pytorch:25.01-py3
      platform: linux/arm64
    - name: busybox
    - name: oci:/srv/layout:extra:1
""")
    notes: list[str] = []
    images = read_image_list(f, note=notes.append, allow_local=True)  # the oci: entry (see *_hostile.py)
    assert [(i.ref, i.where, i.platform) for i in images] == [
        ("docker://nvcr.io/nvidia/pytorch:25.01-py3", f"{f}:13", "linux/arm64"),
        ("docker://busybox", f"{f}:15", None),
        ("oci:/srv/layout:extra:1", f"{f}:16", None)]
    assert len(notes) == 1 and "Charts" in notes[0] and f"{f}:1" in notes[0]
    assert platform_of(images, []) == ("linux/arm64",)
    with pytest.raises(ImageListError, match=r"expected one platform, found --platform linux/amd64 and .*:13"):
        platform_of(images, ["linux/amd64"])


def test_a_zarf_package_lists_every_components_images(tmp_path: Path) -> None:
    f = write(tmp_path / "zarf.yaml", """\
kind: ZarfPackageConfig
metadata:
  name: gpu-stack
components:
  - name: operator
    images:
      - nvcr.io/nvidia/gpu-operator:v25.3.0
      - registry.k8s.io/pause:3.9
  - name: docs
  - name: app
    images:
      - ghcr.io/team/app@sha256:""" + "a" * 64 + "\n")
    images = read_image_list(f)
    assert [(i.ref, i.where) for i in images] == [
        ("docker://nvcr.io/nvidia/gpu-operator:v25.3.0", f"{f}:7"),
        ("docker://registry.k8s.io/pause:3.9", f"{f}:8"),
        ("docker://ghcr.io/team/app@sha256:" + "a" * 64, f"{f}:12")]


@pytest.mark.parametrize("name, text, line, found", [
    ("bad.txt", "ok/a:1\nnot a ref\n", 2, "'not a ref'"),
    ("hauler.yaml", "apiVersion: content.hauler.cattle.io/v1\nkind: Images\nspec:\n  images:\n    - platform: x\n",
     5, "without one"),
    ("zarf.yaml", "kind: ZarfPackageConfig\ncomponents:\n  - name: a\n    images:\n      - {name: x}\n", 5,
     "a mapping"),
    ("other.yaml", "apiVersion: v1\nkind: Pod\n", 1, "kind 'Pod'"),
    ("broken.yaml", "kind: Images\nspec: [\n", 3, "expected YAML"),
    ("empty.txt", "# nothing here\n\n", None, "found none"),
])
def test_a_bad_entry_is_named_by_file_and_line(tmp_path: Path, name: str, text: str, line: int | None,
                                              found: str) -> None:
    f = write(tmp_path / name, text)
    with pytest.raises(ImageListError) as e:
        read_image_list(f)
    assert found in e.value.message and (f"{f}:{line}" in e.value.message if line else f in e.value.message)
    assert e.value.exit_code == 2 and e.value.reference == "image-list"


def test_the_cli_refuses_a_bad_list_before_anything_is_read(tmp_path: Path) -> None:
    f = write(tmp_path / "images.txt", "team/a:1\nteam/b:1 extra\n")
    proc = run_cli("bundle", "export", "--images-from", f, "-o", str(tmp_path / "b"), "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "image-list"
    assert f"error[image-list]: reading {f}:2" in proc.stderr and not (tmp_path / "b").exists()
    proc = run_cli("bundle", "export", "-o", str(tmp_path / "b"), "--json")
    assert proc.returncode == 2 and "IMAGE or --images-from" in proc.stderr


@pytest.fixture(scope="module")
def built(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("listed")
    refs = ["listed/one:1", "listed/two:1", "listed/three:1"]
    for n, ref in enumerate(refs):
        engines.build_image(docker_host, simple_context(root / str(n), busybox, f"listed {n}\n"), ref)
    return refs


def test_export_a_plain_list_from_docker(built: list[str], docker_host: str, tmp_path: Path) -> None:
    f = write(tmp_path / "images.txt", f"# two of three\n{built[0]}\n\n{built[2]}  # the last\n")
    out = tmp_path / "b"
    proc = run_cli("bundle", "export", "--images-from", f, "-o", str(out), "--json", "-q", docker_host=docker_host)
    assert proc.returncode == 0, proc.stderr
    bundle = json.loads((out / "bundle.json").read_text())
    assert [i["refs"] for i in bundle["images"]] == [[built[0]], [built[2]]]
    verified = run_cli("importer", str(out), "--verify-only")
    assert verified.returncode == 0, verified.stderr


@pytest.fixture(scope="module")
def registry(docker_host: str, built: list[str]) -> Iterator[Registry]:
    with engines.private_registry(f"listed-{os.getpid()}") as reg:
        for ref in built:
            engines.push_from_docker(docker_host, ref, f"{reg.addr}/{ref}")
        yield reg


@pytest.mark.parametrize("kind", ["hauler", "zarf"])
def test_export_a_hauler_or_zarf_list_from_the_registry(registry: Registry, built: list[str], tmp_path: Path,
                                                       kind: str) -> None:
    names = [f"{registry.addr}/{ref}" for ref in built[:2]]
    if kind == "hauler":
        text = ("apiVersion: content.hauler.cattle.io/v1\nkind: Images\nmetadata:\n  name: t\nspec:\n  images:\n"
                + "".join(f"    - name: {n}\n" for n in names))
    else:
        text = ("kind: ZarfPackageConfig\nmetadata:\n  name: t\ncomponents:\n  - name: c\n    images:\n"
                + "".join(f"      - {n}\n" for n in names))
    f = write(tmp_path / f"{kind}.yaml", text)
    out = tmp_path / "b"
    proc = run_cli("bundle", "export", "--images-from", f, "-o", str(out), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    bundle = json.loads((out / "bundle.json").read_text())
    assert bundle["source"]["kind"] == "registry" and [i["refs"] for i in bundle["images"]] == [[n] for n in names]
