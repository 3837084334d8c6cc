"""Issue 24 class 4: a multi-platform bundle's carried image index is parsed and checked, not only
hashed. Every mutation below is re-pinned (the index blob, bundle.json and SHA256SUMS agree, as
an attacker who rewrites the bundle makes them), so only the index check can refuse it: the
index must list exactly the platform manifests bundle.json records, each for its platform, and
each config must be for the platform recorded. Refused before any side effect (an OCI target
folder is not even created); the exporter refuses a source index whose platforms contradict the
configs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fuzzkit import replace_blob, rewrite_index
from tests.kit.helpers import run_cli


def _index_digest(b: Path) -> str:
    return str(json.loads((b / "bundle.json").read_text())["images"][0]["index"]["digest"])


def _swap_platforms(doc: Any) -> Any:
    m = doc["manifests"]
    m[0]["platform"], m[1]["platform"] = m[1]["platform"], m[0]["platform"]
    return doc


def _set(path: tuple, value: Any) -> Callable[[Any], Any]:
    def change(doc: Any) -> Any:
        here = doc
        for key in path[:-1]:
            here = here[key]
        here[path[-1]] = value
        return doc
    return change


def _drop(k: int) -> Callable[[Any], Any]:
    def change(doc: Any) -> Any:
        del doc["manifests"][k]
        return doc
    return change


def _duplicate(doc: Any) -> Any:
    doc["manifests"].append(dict(doc["manifests"][1]))
    return doc


def _add_foreign(doc: Any) -> Any:
    doc["manifests"].append({**doc["manifests"][0], "digest": "sha256:" + "ab" * 32,
                             "platform": {"os": "linux", "architecture": "s390x"}})
    return doc


MUTATIONS: dict[str, Callable[[Any], Any]] = {
    "swap-platforms": _swap_platforms,
    "amd64-entry-says-arm64": _set(("manifests", 0, "platform", "architecture"), "arm64"),
    "variant-added": _set(("manifests", 1, "platform", "variant"), "v6"),
    "os-changed": _set(("manifests", 2, "platform", "os"), "windows"),
    "platform-null": _set(("manifests", 0, "platform"), None),
    "architecture-number": _set(("manifests", 1, "platform", "architecture"), 64),
    "entry-null": _set(("manifests", 1), None),
    "manifests-null": _set(("manifests",), None),
    "index-null": lambda doc: None,
    "index-list": lambda doc: doc["manifests"],
    "drop-one": _drop(2),
    "drop-primary": _drop(0),
    "duplicate": _duplicate,
    "add-foreign": _add_foreign,
    "size-wrong": _set(("manifests", 1, "size"), 419),
    "size-string": _set(("manifests", 1, "size"), "418"),
}


def _verify(b: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = run_cli("importer", str(b), "--verify-only", "--json", *args)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_the_pristine_multiplatform_bundle_verifies(pristine_multi: Path) -> None:
    code, _, err = _verify(pristine_multi)
    assert code == 0, err


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_carried_index_that_disagrees_with_bundle_json_is_refused(multi_bundle: Path, name: str) -> None:
    b = multi_bundle
    rewrite_index(b, MUTATIONS[name])
    code, doc, err = _verify(b)
    assert code == 3, err
    assert doc["error"]["id"] == "verification-failed"
    ids = {p["id"] for p in doc["problems"]}
    assert ids == {"index-platform-mismatch"}, doc["problems"]
    assert "Traceback" not in err and "internal" not in err


def test_a_config_for_another_platform_than_recorded_is_refused(multi_bundle: Path) -> None:
    b = multi_bundle
    image = json.loads((b / "bundle.json").read_text())["images"][0]
    other = image["platforms"][0]["config"]["digest"]  # the arm64 config
    cfg = json.loads((b / "blobs/sha256" / other[7:]).read_bytes())
    cfg["architecture"] = "amd64"
    replace_blob(b, other, json.dumps(cfg).encode())
    code, doc, err = _verify(b)
    assert code == 3, err
    assert {p["id"] for p in doc["problems"]} == {"config-platform-mismatch"}, doc["problems"]


def test_a_recorded_platform_with_an_os_but_no_architecture_is_refused(tmp_path: Path) -> None:
    """Found by the fuzzer: bundle.json naming an os but no architecture (re-pinned) judged no
    config, so any image passed as "linux"."""
    from tests.kit.fuzzkit import repin_file
    from tests.kit.transferkit import random_bundle

    b = random_bundle(tmp_path / "one.bundle", mb=(1, 1))  # single-platform images
    doc = json.loads((b / "bundle.json").read_text())
    assert doc["images"][0]["platform"]["architecture"]
    del doc["images"][0]["platform"]["architecture"]
    (b / "bundle.json").write_text(json.dumps(doc, indent=2))
    repin_file(b, "bundle.json")
    code, out, err = _verify(b)
    assert code == 3, err
    assert {p["id"] for p in out["problems"]} == {"config-platform-mismatch"}, out["problems"]
    assert "Traceback" not in err and "internal" not in err


def test_a_bad_index_is_refused_before_the_oci_target_is_written(multi_bundle: Path, tmp_path: Path) -> None:
    b = multi_bundle
    rewrite_index(b, _swap_platforms)
    out = tmp_path / "layout"
    proc = run_cli("importer", str(b), "--engine", "oci", "--oci-dir", str(out), "--json")
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["error"]["id"] == "verification-failed"
    assert not out.exists()


def test_a_bad_index_is_refused_in_a_tar_too(multi_bundle: Path, tmp_path: Path) -> None:
    b = multi_bundle
    rewrite_index(b, _drop(1))
    proc = run_cli("bundle", "pack", str(b), str(tmp_path / "b.tar"))
    assert proc.returncode == 0, proc.stderr
    code, doc, err = _verify(tmp_path / "b.tar")
    assert code == 3, err
    assert {p["id"] for p in doc["problems"]} == {"index-platform-mismatch"}, doc["problems"]


def test_the_exporter_refuses_an_index_whose_platforms_contradict_the_configs(tmp_path: Path) -> None:
    from tests.kit.layoutgen import REF, write_layout

    layout = tmp_path / "layout"
    write_layout(layout)
    top = json.loads((layout / "index.json").read_text())
    old = top["manifests"][0]["digest"]
    index = json.loads((layout / "blobs/sha256" / old[7:]).read_bytes())
    index["manifests"][1]["platform"]["architecture"] = "s390x"  # the arm64 manifest, claimed for s390x
    raw = json.dumps(index).encode()
    import hashlib
    new = "sha256:" + hashlib.sha256(raw).hexdigest()
    (layout / "blobs/sha256" / new[7:]).write_bytes(raw)
    top["manifests"][0].update(digest=new, size=len(raw))
    (layout / "index.json").write_text(json.dumps(top))
    for args in (["--all-platforms"], ["--platform", "linux/amd64,linux/s390x"]):
        out = tmp_path / f"out{len(args)}"
        proc = run_cli("bundle", "export", f"oci:{layout}:{REF}", "-o", str(out), "--json", "-q", *args)
        assert proc.returncode == 5, proc.stderr
        err = json.loads(proc.stdout)["error"]
        assert err["id"] == "source" and "s390x" in err["message"] and "arm64" in err["message"], err
        assert not (out / "bundle.json").exists()


def test_an_oci_target_whose_index_gives_a_platform_another_image_is_not_held(pristine_multi: Path,
                                                                               tmp_path: Path) -> None:
    """What the OCI target exposes for a platform is read back and must be that platform's image:
    an index in the target that lists the arm64 manifest for ppc64le (and the reverse) makes
    --check-only fail, though this host's (amd64) entry is untouched."""
    import hashlib

    target = tmp_path / "target"
    proc = run_cli("importer", str(pristine_multi), "--engine", "oci", "--oci-dir", str(target), "-q")
    assert proc.returncode == 0, proc.stderr
    check = ["--check-only", "--engine", "oci", "--oci-dir", str(target), "--json"]
    assert run_cli("importer", str(pristine_multi), *check).returncode == 0
    top = json.loads((target / "index.json").read_text())
    [entry] = [e for e in top["manifests"] if e["digest"] == _index_digest(pristine_multi)]
    index = json.loads((target / "blobs/sha256" / entry["digest"][7:]).read_bytes())
    m = index["manifests"]
    m[1]["platform"], m[2]["platform"] = m[2]["platform"], m[1]["platform"]
    raw = json.dumps(index).encode()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    (target / "blobs/sha256" / digest[7:]).write_bytes(raw)
    entry.update(digest=digest, size=len(raw))
    (target / "index.json").write_text(json.dumps(top))
    proc = run_cli("importer", str(pristine_multi), *check)
    assert proc.returncode == 8, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["id"] == "check-only-mismatch" and "ppc64le" in (error["context"] or ""), error


def test_serve_refuses_a_bundle_whose_index_gives_a_platform_another_image(multi_bundle: Path) -> None:
    b = multi_bundle
    rewrite_index(b, _swap_platforms)
    proc = run_cli("importer", "serve", str(b), "--listen", "127.0.0.1:0", "--json", timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "error[verification-failed]" in proc.stderr and "index-platform-mismatch" in proc.stderr, proc.stderr


@pytest.mark.parametrize("packed", [False, True])
def test_a_carried_index_too_large_to_check_is_refused(multi_bundle: Path, tmp_path: Path, packed: bool) -> None:
    """An index the verifier will not parse (over its 4 MiB bound) is refused, not skipped: in a
    tar it used to be left out of the documents checked, so its platforms went unjudged."""
    from importer.format.limits import MAX_INDEX

    b = multi_bundle
    old = _index_digest(b)
    raw = (b / "blobs/sha256" / old[7:]).read_bytes()
    doc = json.loads(raw)
    _swap_platforms(doc)
    body = json.dumps(doc).encode()
    replace_blob(b, old, body[:-1] + b" " * (MAX_INDEX + 1 - len(body)) + b"}")
    subject = b
    if packed:
        assert run_cli("bundle", "pack", str(b), str(tmp_path / "b.tar")).returncode == 0
        subject = tmp_path / "b.tar"
    code, result, err = _verify(subject)
    assert code == 3, err
    assert "limit-exceeded" in {p["id"] for p in result["problems"]}, result["problems"]


@pytest.mark.parametrize("refs", [True, [], ["x/y:1"]])
def test_refs_in_one_platforms_entry_are_refused(multi_bundle: Path, refs: Any) -> None:
    """Found by the fuzzer (case 1719, seed 20261203): bundle.json's schema allows no refs in a
    platforms entry (the image's refs name the index), but the importer dropped them unread."""
    from tests.kit.fuzzkit import repin_file

    b = multi_bundle
    doc = json.loads((b / "bundle.json").read_text())
    doc["images"][0]["platforms"][0]["refs"] = refs
    (b / "bundle.json").write_text(json.dumps(doc, indent=2))
    repin_file(b, "bundle.json")
    code, out, err = _verify(b)
    assert code == 4, err  # bundle.json is not a valid manifest: nothing else is read
    assert out["error"]["id"] == "invalid-manifest", out
    assert "images[0].platforms[0].refs: expected no refs in one platform's entry" in err
    assert "Traceback" not in err and "internal" not in err
