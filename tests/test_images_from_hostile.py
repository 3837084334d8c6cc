"""`--images-from` lists are data, not a door (issue 24, class 5): a YAML alias bomb, deep nesting,
a huge file or too many nodes is a typed `image-list` error, quickly (bundle/yamlbound.py bounds
what PyYAML composes: no RecursionError, no MemoryError); a hauler or zarf list may only name
registry images: an entry naming a local source (oci:, containerd:, docker-daemon:, an archive, a
path) is `image-list-local-source` unless --images-from-allow-local. A plain list (the user's own)
keeps any source prefix (tests/test_images_from.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle.imagelist import MAX_YAML_BYTES, ImageListError, ImageListLocalSource, read_image_list
from tests.kit.helpers import run_cli

HAULER = "apiVersion: content.hauler.cattle.io/v1\nkind: Images\nspec:\n  images:\n"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def refused(path: str) -> ImageListError:
    with pytest.raises(ImageListError) as e:
        read_image_list(path)
    assert e.value.reference == "image-list" and e.value.exit_code == 2
    return e.value


def test_a_billion_laughs_is_refused_without_expanding(tmp_path: Path) -> None:
    """Nine levels of ten aliases each stand for 10^9 nodes in a few hundred bytes."""
    lines = ["kind: ZarfPackageConfig", f"l0: &l0 [{', '.join(['lol'] * 10)}]"]
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, 9)]
    lines += ["components:", "  - name: bomb", "    images: *l8"]
    err = refused(write(tmp_path / "zarf.yaml", "\n".join(lines) + "\n"))
    assert "with every alias expanded, found more (an alias bomb?)" in err.message


def test_aliases_that_multiply_entries_are_refused(tmp_path: Path) -> None:
    """200 components that are one aliased component of 200 aliased images: 40,000 entries from a
    few kB (PyYAML composes it as a small graph; walking it is what explodes)."""
    text = ("kind: ZarfPackageConfig\nimg: &i registry.example/a:1\n"
            f"one: &c {{name: c, images: [{', '.join(['*i'] * 200)}]}}\n"
            f"components: [{', '.join(['*c'] * 200)}]\n")
    err = refused(write(tmp_path / "zarf.yaml", text))
    assert "alias" in err.message and f"{tmp_path / 'zarf.yaml'}:" in err.message


def test_an_alias_cycle_is_refused(tmp_path: Path) -> None:
    err = refused(write(tmp_path / "zarf.yaml", "kind: ZarfPackageConfig\ncomponents: &c [{name: x, images: *c}]\n"))
    assert "found a cycle" in err.message


def test_deep_nesting_is_refused_before_the_stack_runs_out(tmp_path: Path) -> None:
    err = refused(write(tmp_path / "zarf.yaml", "kind: ZarfPackageConfig\ncomponents: " + "[" * 20_000
                        + "]" * 20_000 + "\n"))
    assert "expected YAML nested at most 32 levels deep, found deeper" in err.message


def test_a_huge_yaml_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    padding = "# padding\n" * (MAX_YAML_BYTES // 10 + 1)
    err = refused(write(tmp_path / "hauler.yaml", HAULER + "    - name: busybox\n" + padding))
    assert f"expected a YAML file of at most {MAX_YAML_BYTES} bytes" in err.message


def test_too_many_nodes_are_refused(tmp_path: Path) -> None:
    err = refused(write(tmp_path / "zarf.yaml", "kind: ZarfPackageConfig\ncomponents:\n  - name: a\n    images: ["
                        + ", ".join(["a"] * 30_000) + "]\n"))
    assert "expected at most 20000 YAML nodes, found more" in err.message


LOCAL = ["oci:/srv/layout:app:1", "containerd:docker.io/library/x:2", "docker-daemon:team/app:1",
         "docker-archive:/tmp/app.tar", "oci-archive:/tmp/app.tar", "/srv/layout", "./layout", "~/layout"]


@pytest.mark.parametrize("entry", LOCAL)
@pytest.mark.parametrize("kind", ["hauler", "zarf"])
def test_a_third_party_list_may_not_name_a_local_source(tmp_path: Path, entry: str, kind: str) -> None:
    if kind == "hauler":
        text = HAULER + f"    - name: registry.example/ok:1\n    - name: {entry}\n"
    else:
        text = f"kind: ZarfPackageConfig\ncomponents:\n  - name: a\n    images:\n      - registry.example/ok:1\n" \
               f"      - {entry}\n"
    f = write(tmp_path / f"{kind}.yaml", text)
    with pytest.raises(ImageListLocalSource) as e:
        read_image_list(f)
    assert e.value.reference == "image-list-local-source" and e.value.exit_code == 2
    assert f"{f}:6" in e.value.message and repr(entry) in e.value.message
    assert "--images-from-allow-local" in (e.value.hint or "")
    allowed = read_image_list(f, allow_local=True)
    assert [i.ref for i in allowed] == ["docker://registry.example/ok:1", entry]


def test_the_cli_refuses_a_local_entry_unless_allowed(tmp_path: Path) -> None:
    f = write(tmp_path / "hauler.yaml", HAULER + f"    - name: oci:{tmp_path / 'nowhere'}:app:1\n")
    proc = run_cli("bundle", "export", "--images-from", f, "-o", str(tmp_path / "b"), "--json", timeout=120)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "image-list-local-source", proc.stderr
    assert not (tmp_path / "b").exists()
    proc = run_cli("bundle", "export", "--images-from", f, "--images-from-allow-local", "-o", str(tmp_path / "b"),
                   "--json", timeout=120)
    err = json.loads(proc.stdout)["error"]  # allowed: the list is read, then the (missing) layout is not found
    assert err["id"] not in ("image-list", "image-list-local-source", "internal") and "nowhere" in err["message"]
