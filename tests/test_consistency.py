"""Records that contradict each other are refused, in a folder and in a tar alike.

Each hostile bundle below is re-pinned after its mutation (bundle.json ``files``, SHA256SUMS, the
manifest and index.json that point at a rewritten blob), so every plain hash check passes and
only the consistency rule under test can catch it:

1. every record of a shared layer blob agrees (mediaType, size, diffId, uncompressedSize, external);
2. ``external`` only in a delta bundle (schema 3.1+), on a layer that is neither listed nor stored;
3. index.json, manifests, configs, the descriptors inside them and ``rootfs`` are JSON objects;
4. SHA256SUMS lists exactly what bundle.json lists (an empty or partial one is refused);
5. SHA256SUMS lines are split as ``sha256sum -c`` splits them (on LF only) and are strict.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bundle.archive import pack_bundle
from importer.archiveverify import verify_archive
from importer.sums import parse_sums
from importer.verify import verify_bundle
from tests.bundlegen import make_bundle
from tests.trustkit import regenerate_sums

BLOBS = "blobs/sha256/"
FAKE_DIFF_ID = "sha256:" + "ab" * 32
GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
BASE, APP = 0, 1  # sample_images(): fake/base:1 [base, empty], fake/app:2 [base, empty, top]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("b") / "fake.bundle")


@pytest.fixture
def bundle(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "fake.bundle"))


# ============================================================================ re-pinning


def _doc(b: Path) -> dict[str, Any]:
    return json.loads((b / "bundle.json").read_text())


def _read_blob(b: Path, digest: str) -> Any:
    return json.loads((b / BLOBS / digest[7:]).read_bytes())


def _put_blob(b: Path, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (b / BLOBS / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def _replace_manifest(b: Path, doc: dict[str, Any], i: int, edit: Callable[[Any], Any]) -> None:
    """Rewrite image i's manifest blob through ``edit``; bundle.json and index.json follow it."""
    image = doc["images"][i]
    old = image["manifest"]["digest"]
    value = edit(_read_blob(b, old))
    (b / BLOBS / old[7:]).unlink()
    desc = _put_blob(b, json.dumps(value).encode())
    image["manifest"].update(desc)
    index = json.loads((b / "index.json").read_text())
    for entry in index["manifests"]:
        if entry["digest"] == old:
            entry.update(desc)
    (b / "index.json").write_text(json.dumps(index))


def _replace_config(b: Path, doc: dict[str, Any], i: int, edit: Callable[[Any], Any]) -> None:
    """Rewrite image i's config blob through ``edit``; its manifest, bundle.json follow it."""
    image = doc["images"][i]
    old = image["config"]["digest"]
    value = edit(_read_blob(b, old))
    (b / BLOBS / old[7:]).unlink()
    desc = _put_blob(b, json.dumps(value).encode())
    image["config"].update(desc)
    _replace_manifest(b, doc, i, lambda m: {**m, "config": {**m["config"], **desc}})


def _repin(b: Path, doc: dict[str, Any], *, unlisted: tuple[str, ...] = ()) -> None:
    """bundle.json ``files`` from what is on disk (but ``unlisted``), then SHA256SUMS over them."""
    files = []
    for p in sorted(b.rglob("*")):
        rel = p.relative_to(b).as_posix()
        if p.is_file() and rel not in ("bundle.json", "SHA256SUMS", "bundle.json.sig", *unlisted):
            data = p.read_bytes()
            files.append({"path": rel, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)})
    doc["files"] = files
    (b / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    hidden = [(b / rel, b.parent / f"hidden-{i}") for i, rel in enumerate(unlisted)]
    for src, dst in hidden:  # SHA256SUMS agrees with bundle.json: only the rule under test trips
        src.rename(dst)
    regenerate_sums(b)
    for src, dst in hidden:
        dst.rename(src)


def _problems(b: Path, tmp_path: Path, *, add_members: tuple[str, ...] = ()) -> dict[str, list[tuple[str, str]]]:
    """id -> [(path, message)] for the folder and for the same bundle packed as a tar (plus
    ``add_members``, files of the folder appended to the tar as a hand-made archive would hold)."""
    tar = tmp_path / "packed" / "fake.tar"
    pack_bundle(str(b), str(tar))
    if add_members:
        with tarfile.open(tar, "a", format=tarfile.PAX_FORMAT) as t:
            for rel in add_members:
                data = (b / rel).read_bytes()
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    found: dict[str, list[tuple[str, str]]] = {}
    for where, report in (("folder", verify_bundle(str(b))), ("tar", verify_archive(str(tar)))):
        for p in report.problems:
            found.setdefault(f"{where}:{p.id}", []).append((p.path, p.message))
    return found


def _assert_both(found: dict[str, list[tuple[str, str]]], problem_id: str, *words: str) -> None:
    for where in ("folder", "tar"):
        hits = found.get(f"{where}:{problem_id}")
        assert hits, f"{where}: expected [{problem_id}], found {sorted(found)}"
        assert any(all(w in f"{path}: {msg}" for w in words) for path, msg in hits), (where, hits, words)


# ============================================================================ 5. SHA256SUMS split as coreutils does


@pytest.mark.parametrize("sep", ["\r\n", "\u2028", "\x0b", "\x0c", "\x1c", "\x85"])
def test_sums_split_on_lf_only(bundle: Path, tmp_path: Path, sep: str) -> None:
    raw = (bundle / "SHA256SUMS").read_text()
    (bundle / "SHA256SUMS").write_bytes(raw.replace("\n", sep).encode("utf-8"))
    found = _problems(bundle, tmp_path)
    for where in ("folder", "tar"):
        assert found.get(f"{where}:sums-invalid"), (where, sorted(found))


HEX_A = hashlib.sha256(b"a\n").hexdigest()
HEX_B = hashlib.sha256(b"b\n").hexdigest()

#: crafted SHA256SUMS -> whether parse_sums accepts it; the test also runs `sha256sum -c --strict`
#: on each: whatever coreutils refuses, parse_sums must refuse too (it is stricter in places).
SUMS_CASES: dict[str, tuple[bytes, bool]] = {
    "plain": (f"{HEX_A}  a\n{HEX_B}  b\n".encode(), True),
    "binary-mode": (f"{HEX_A} *a\n{HEX_B}  b\n".encode(), True),
    "no-final-newline": (f"{HEX_A}  a\n{HEX_B}  b".encode(), True),
    "crlf": (f"{HEX_A}  a\r\n{HEX_B}  b\r\n".encode(), False),
    "u2028": (f"{HEX_A}  a\u2028{HEX_B}  b\n".encode(), False),
    "u2029": (f"{HEX_A}  a\u2029{HEX_B}  b\n".encode(), False),
    "nel": (f"{HEX_A}  a\x85{HEX_B}  b\n".encode(), False),
    "vertical-tab": (f"{HEX_A}  a\x0b{HEX_B}  b\n".encode(), False),
    "form-feed": (f"{HEX_A}  a\x0c{HEX_B}  b\n".encode(), False),
    "file-separator": (f"{HEX_A}  a\x1c{HEX_B}  b\n".encode(), False),
    "lone-cr": (f"{HEX_A}  a\r{HEX_B}  b\n".encode(), False),
    "nul": (f"{HEX_A}  a\x00{HEX_B}  b\n".encode(), False),
    "blank-line": (f"{HEX_A}  a\n\n{HEX_B}  b\n".encode(), False),
    "leading-space": (f" {HEX_A}  a\n{HEX_B}  b\n".encode(), False),
    "uppercase-hex": (f"{HEX_A.upper()}  a\n{HEX_B}  b\n".encode(), False),
    "one-space": (f"{HEX_A} a\n{HEX_B}  b\n".encode(), False),
    "empty": (b"", True),  # parses to nothing; the cross-check with bundle.json refuses it (rule 4)
    "only-newline": (b"\n", False),
}


@pytest.mark.parametrize("name", sorted(SUMS_CASES))
def test_sums_parsing_is_never_laxer_than_coreutils(tmp_path: Path, name: str) -> None:
    raw, ours_ok = SUMS_CASES[name]
    (tmp_path / "a").write_bytes(b"a\n")
    (tmp_path / "b").write_bytes(b"b\n")
    (tmp_path / "SHA256SUMS").write_bytes(raw)
    coreutils_ok = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=tmp_path,
                                  capture_output=True, check=False).returncode == 0
    entries, problems = parse_sums(raw)
    assert (not problems) == ours_ok, problems
    if ours_ok and raw:
        assert coreutils_ok, "parse_sums accepts a file sha256sum -c refuses"
        assert entries == {"a": entries["a"], "b": entries["b"]} and str(entries["a"]) == "sha256:" + HEX_A
    if name in ("plain", "binary-mode", "no-final-newline"):
        assert coreutils_ok
