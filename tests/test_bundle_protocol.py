"""One Bundle (issue 41 point 3): a bundle folder, a tar and parts are opened by
importer/input/opened.py ``open_bundle`` into one protocol, and every step (verification, the
sinks, push, serve, pack, sign, copy) reads them through its members; which kind it is stays in
input/ (tests/test_architecture.py). Here: the members answer alike where the kinds agree, and
each answers its own way where they differ (a folder is checked file by file, a tar or parts in one
read; some commands take a folder only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bundle.archive import pack_bundle
from importer.errors import UsageError
from importer.format.manifest import BUNDLE_JSON, IMPORTER_PYZ, SUMS_FILE
from importer.input.archive import ArchiveReader
from importer.input.opened import Bundle, open_bundle
from importer.verify.archive import verify_archive
from importer.verify.opened import verify_opened

SPLIT = 64 * 1024


@pytest.fixture
def three(bundle: Path, tmp_path: Path) -> dict[str, Bundle]:
    """The kit's bundle as a folder, a tar and parts, each opened."""
    pack_bundle(str(bundle), str(tmp_path / "t" / "b.tar"))
    pack_bundle(str(bundle), str(tmp_path / "p" / "b.tar"), split=SPLIT)
    return {"folder": open_bundle(str(bundle)), "tar": open_bundle(str(tmp_path / "t" / "b.tar")),
            "parts": open_bundle(str(tmp_path / "p" / "b.tar.parts.json"))}


def test_the_three_kinds_read_the_same_bundle(three: dict[str, Bundle]) -> None:
    folder = three["folder"]
    manifest = folder.manifest()
    config = manifest.images[0].config
    for kind, b in three.items():
        assert b.kind == kind and b.raw_bundle_json == folder.raw_bundle_json and b.digest == folder.digest
        assert b.manifest() == manifest
        assert {f.path for f in manifest.files} | {BUNDLE_JSON, SUMS_FILE} <= set(b.files()), kind
        assert b.read_blob(config.digest, config.size, "config") == folder.read_blob(config.digest, config.size, "c")
        with b.open_blob(config.digest) as f:
            assert f.read() == folder.read(config.digest.blob_path, config.size, "config")
        assert b.size(config.digest.blob_path) == config.size and b.exists(config.digest.blob_path)
        assert not b.exists("blobs/sha256/" + "0" * 64) and not b.exists("blobs")
        assert verify_opened(b).ok, (kind, verify_opened(b).problems)


def test_each_kind_answers_where_they_differ(three: dict[str, Bundle]) -> None:
    folder, tar, parts = three["folder"], three["tar"], three["parts"]
    assert folder.require_folder("signing: expected a folder", hint="h") == folder.path
    for archive in (tar, parts):
        with pytest.raises(UsageError, match="signing: expected a folder"):
            archive.require_folder("signing: expected a folder", hint="h")
    assert not folder.checked_whole and tar.checked_whole and parts.checked_whole
    assert tar.stored_size == os.path.getsize(tar.path)
    blob = folder.manifest().images[0].config.digest.blob_path
    assert folder.backing_files(blob) == [os.path.join(folder.path, blob)]
    assert tar.backing_files(blob) == [tar.path]
    assert len(parts.backing_files(blob)) == len(parts.medium_files()) - 1 > 1  # every part, not the index
    assert folder.importers_beside() == []
    assert tar.importers_beside() == [os.path.join(os.path.dirname(tar.path), IMPORTER_PYZ)]
    assert "cat b.tar.part[0-9]* | tar" in parts.extract_command(IMPORTER_PYZ)
    assert folder.medium_name() == "" and tar.medium_name() == "b.tar" and parts.medium_name() == "b.tar.parts.json"
    assert folder.medium_files()[-1].rel == BUNDLE_JSON and parts.medium_files()[-1].rel == "b.tar.parts.json"
    assert [m.rel for m in tar.medium_files()] == ["b.tar"]
    assert folder.either(lambda path: path, lambda reader: "archive") == folder.path
    assert parts.either(lambda path: "folder", lambda reader: reader.path) == parts.path


def test_a_document_cut_by_a_part_boundary_is_read_whole(bundle: Path, tmp_path: Path) -> None:
    """index.json, manifests and configs are kept whole for the layout checks; where a part ended
    inside one, one read returned only the first part's share and a valid bundle failed as
    invalid-manifest (found when the importer's size moved a manifest across a boundary)."""
    pack_bundle(str(bundle), str(tmp_path / "whole.tar"))
    member = ArchiveReader(str(tmp_path / "whole.tar")).members()["index.json"]
    assert member.offset > SPLIT and member.size > 2
    pack_bundle(str(bundle), str(tmp_path / "cut.tar"), split=member.offset + member.size // 2)
    report = verify_archive(str(tmp_path / "cut.tar.parts.json"))
    assert report.ok, report.problems
