"""verify_archive(): check a bundle tar, or a set of parts, in ONE sequential read.

bundle.json comes first in the tar, so every following member is checked against it as it
streams past: its size, its digest, and for layers the decompressed size and diff_id (the same
one-pass reader as for folders). Parts are hashed as they are read and checked against the parts
index; a missing, extra, truncated, reordered or corrupted part is named. Small JSON documents
(oci-layout, index.json, manifests, configs) are kept and checked against bundle.json at the
end with the folder verifier's own layout checks. Nothing is extracted to disk except those
small documents, into a temporary folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from importer.errors import BundleError, IntegrityError, LimitExceeded, ManifestError
from importer.format import limits
from importer.format.digest import CHUNK, Digest
from importer.format.limits import read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    SIGNATURE_FILE,
    SUMS_FILE,
    BundleManifest,
    LayerRecord,
    load_bundle_manifest,
)
from importer.format.mediatypes import compression_of
from importer.format.problems import Problem
from importer.format.sums import parse_sums
from importer.input.archive import ArchiveReader, ConcatFile, PartIssue
from importer.input.layers import LayerReader
from importer.input.safetar import BUNDLE_POLICY, DIR, SafeTarReader, TarMember, UnsafeArchive
from importer.streams.compression import open_decompressed
from importer.streams.readers import HashingReader
from importer.verify.bundle import (
    VerifyReport,
    _check_layout,
    _layer_names,
    check_records,
    check_sums_listing,
)

ProgressFn = Callable[[int], None]


def _problem(issue: PartIssue) -> Problem:
    return Problem(issue.id, issue.path, issue.message)


def verify_archive(archive: Union[str, ArchiveReader], *, on_bytes: Optional[ProgressFn] = None,
                   raw_bundle_json: Optional[bytes] = None, manifest: Optional[BundleManifest] = None) -> VerifyReport:
    """Verify a bundle tar or parts index; returns a report listing every problem.
    ``raw_bundle_json``: the bundle.json the bundle was opened with (the signature step judged
    it); the first member must hold exactly those bytes. ``manifest``: those bytes already parsed.

    Raises only when no usable bundle.json can be read (ManifestError and subclasses)."""
    started = time.monotonic()
    reader = ArchiveReader(archive) if isinstance(archive, str) else archive  # a path, or the opened reader
    report = VerifyReport(root=reader.path)
    add = report.problems.append

    # === the parts are all there, with their sizes (from the folder listing alone)
    structural = reader.part_issues()
    if structural:
        for issue in structural:
            add(_problem(issue))
        _hash_intact_parts(reader, {i.path for i in structural}, add)
        report.seconds = time.monotonic() - started
        return report

    # === one pass: every member checked against bundle.json, every part against the index as its
    # last byte goes by; parts the pass did not reach (a damaged header stops it) are hashed after
    index = reader.index
    cf = ConcatFile(reader.files, expect=index.parts if index is not None else None)
    try:
        try:
            leftover, raw_bj = _verify_members(reader, cf, report, on_bytes, raw_bundle_json, manifest)
        except (ManifestError, UnsafeArchive) as e:
            if index is None:
                raise
            part_problems = _part_problems(reader, cf)
            if not part_problems:
                raise
            add(Problem(e.reference, os.path.basename(reader.path), e.message))
        else:
            if leftover:
                add(Problem("archive-damaged", os.path.basename(reader.path),
                            f"{leftover} non-zero bytes follow the end of the tar (a damaged header cut it short)"))
            got = Digest.of_bytes(raw_bj)
            if index is not None and index.bundle_digest is not None and got != index.bundle_digest:
                add(Problem("digest-mismatch", BUNDLE_JSON,
                            f"the parts index pins {index.bundle_digest}, the member hashes to {got}"))
            part_problems = _part_problems(reader, cf) if index is not None else []
    finally:
        cf.close()
    # the damaged parts are the root cause: list them first
    report.problems[:0] = part_problems
    report.seconds = time.monotonic() - started
    return report


def _part_problems(reader: ArchiveReader, cf: ConcatFile) -> List[Problem]:
    """What the pass found about the parts, plus a hash of each part it did not reach."""
    found = [_problem(i) for i in cf.part_issues]
    assert reader.index is not None
    unchecked = reader.index.parts[cf.parts_checked:]
    if unchecked:
        skip = tuple(p.name for p in reader.index.parts[: cf.parts_checked])
        found += [_problem(i) for i in reader.hash_issues(skip)]
    return found


def _hash_intact_parts(reader: ArchiveReader, skip: Set[str], add: Callable[[Problem], None]) -> None:
    """With a part missing the tar cannot be read; still name every other damaged part."""
    for issue in reader.hash_issues(tuple(skip)):
        add(_problem(issue))


def _verify_members(reader: ArchiveReader, cf: ConcatFile, report: VerifyReport, on_bytes: Optional[ProgressFn],
                    opened_with: Optional[bytes], parsed: Optional[BundleManifest] = None) -> Tuple[int, bytes]:
    """Check every member in archive order, through the safe tar reader (importer/input/safetar.py);
    return how many non-zero bytes follow the end of the tar (a damaged header ends it early),
    and the bundle.json bytes."""
    label = os.path.basename(reader.path)
    tar = SafeTarReader(_Counted(cf, on_bytes), BUNDLE_POLICY, what=label)
    members = iter(tar)
    raw_bj = _first_bundle_json(tar, members, label, opened_with, report.problems.append)
    same = parsed is not None and raw_bj == opened_with  # the member holds the bytes parsed already
    manifest = parsed if same and parsed is not None else load_bundle_manifest(raw_bj, where=f"{label}:{BUNDLE_JSON}")
    report.manifest = manifest
    scan = _MemberScan(tar, manifest, report)
    try:
        for member in members:
            scan.check(member)
    except UnsafeArchive as e:  # the safe tar reader refused a member: the rest cannot be trusted
        report.problems.append(Problem(e.reference, label, e.message))
    except LimitExceeded as e:
        report.problems.append(Problem(e.reference, label, e.message))
    except OSError as e:
        report.problems.append(Problem("unreadable-file", label, f"expected a readable archive, found {e}"))
    leftover = _nonzero_after(cf, tar.position)
    scan.check_complete(raw_bj)
    _check_kept_layout(scan.kept, manifest, report)
    return leftover, raw_bj


def _first_bundle_json(tar: SafeTarReader, members: Iterator[TarMember], label: str, opened_with: Optional[bytes],
                       add: Callable[[Problem], None]) -> bytes:
    """bundle.json, which must be the first member; when it differs from the bytes the bundle was
    opened with, the difference is reported and the opened bytes are judged."""
    first = next(members, None)
    if first is None or first.name != BUNDLE_JSON or not first.isfile():
        shown = first.name if first is not None else "an empty archive"
        raise ManifestError(
            f"reading {label}: expected {BUNDLE_JSON} as the first member, found {shown}",
            hint="write the archive with `bundle pack DIR FILE.tar` (bundle.json must come first), "
            "or unpack it and import the folder",
        )
    raw_bj = read_limited(HashingReader(_Current(tar)), limits.MAX_BUNDLE_JSON, BUNDLE_JSON)
    if opened_with is not None and raw_bj != opened_with:
        add(Problem("digest-mismatch", BUNDLE_JSON,
                    f"expected the bundle.json the bundle was opened with ({Digest.of_bytes(opened_with)}), "
                    f"found {Digest.of_bytes(raw_bj)}: the archive changed while it was read"))
        raw_bj = opened_with  # judge the rest against what the signature step judged
    return raw_bj


class _MemberScan:
    """The members after bundle.json, checked one by one against bundle.json as they pass."""

    def __init__(self, tar: SafeTarReader, manifest: BundleManifest, report: VerifyReport) -> None:
        self.tar = tar
        self.manifest = manifest
        self.report = report
        self.add = report.problems.append
        self.expected: Dict[str, Digest] = {f.path: f.digest for f in manifest.files}
        self.sizes: Dict[str, int] = {f.path: f.size for f in manifest.files}
        self.layers: Dict[str, LayerRecord] = {x.digest.blob_path: x for x in manifest.stored_layers()}
        self.names = _layer_names(manifest)
        self.small = _small_documents(manifest)
        self.kept: Dict[str, bytes] = {}
        self.seen: Set[str] = {BUNDLE_JSON}
        self.sums: Dict[str, Digest] = {}
        self.sums_seen = False
        self.sig_seen = False

    def _data(self) -> HashingReader:
        return HashingReader(_Current(self.tar))

    def check(self, member: TarMember) -> None:
        name = member.name
        if member.type == DIR:
            return
        self.seen.add(name)
        add = self.add
        if not member.isfile():
            add(Problem("not-a-regular-file", name, "expected a regular file, found a link or special member"))
            return
        if name == SUMS_FILE:
            self.sums_seen = True
            self.sums, sum_problems = parse_sums(read_limited(self._data(), limits.MAX_SUMS, SUMS_FILE))
            for text in sum_problems:
                add(Problem("sums-invalid", SUMS_FILE, text))
            return
        if name == SIGNATURE_FILE:
            self.sig_seen = True
            return
        if name not in self.expected:
            add(Problem("unlisted-file", name, "present in the archive but not listed in bundle.json"))
            return
        if member.size != self.sizes[name]:
            add(Problem("size-mismatch", name, f"expected {self.sizes[name]} bytes, found {member.size}"))
            return
        layers = self.layers
        problem = _check_member(name, self._data(), self.expected[name], layers.get(name),
                                self.names.get(layers[name].digest, name) if name in layers else name,
                                self.small.get(name), self.kept)
        self.report.files_checked += 1
        self.report.bytes_checked += member.size
        if name in layers:
            self.report.layers_checked += 1
        if problem is not None:
            add(problem)

    def check_complete(self, raw_bj: bytes) -> None:
        """Everything listed arrived; SHA256SUMS lists exactly what bundle.json lists; the records agree."""
        add, expected = self.add, self.expected
        for path in sorted(set(expected) - self.seen):
            add(Problem("missing-file", path, f"expected a member of {self.sizes[path]} bytes, found none"))
        listed = set(expected) | {BUNDLE_JSON} | ({SIGNATURE_FILE} if self.sig_seen else set())
        if not self.sums_seen:
            add(Problem("missing-file", SUMS_FILE, "expected the checksum list, found no member"))
        else:
            sums = self.sums
            bj_digest = Digest.of_bytes(raw_bj)
            if BUNDLE_JSON in sums and sums[BUNDLE_JSON] != bj_digest:
                add(Problem("digest-mismatch", BUNDLE_JSON,
                            f"SHA256SUMS says {sums[BUNDLE_JSON]}, the member hashes to {bj_digest}"))
            check_sums_listing(sums, expected, listed, add)
        check_records(self.manifest, self.seen, add)


def _check_kept_layout(kept: Dict[str, bytes], manifest: BundleManifest, report: VerifyReport) -> None:
    """The OCI layout agrees with bundle.json: the folder verifier's checks on the kept JSON."""
    bad = {p.path for p in report.problems}
    tmp = tempfile.mkdtemp(prefix="sneakernet-layout-")
    try:
        for rel, raw in kept.items():
            full = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(raw)
        _check_layout(tmp, manifest, bad, report.problems.append)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Current:
    """The current member's data, as a stream (the safe tar reader stops at its end)."""

    def __init__(self, tar: SafeTarReader) -> None:
        self._tar = tar

    def read(self, n: int = -1) -> bytes:
        return self._tar.read(n if n is not None and n >= 0 else CHUNK)


class _Counted:
    def __init__(self, raw: ConcatFile, on_bytes: Optional[ProgressFn]) -> None:
        self._raw = raw
        self._on = on_bytes

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._raw.read(n) or b""
        if data and self._on is not None:
            self._on(len(data))
        return data


def _nonzero_after(cf: ConcatFile, offset: int) -> int:
    """Non-zero bytes after ``offset`` (the tar's end-of-archive blocks and padding are zeros)."""
    cf.seek(offset)
    found = 0
    buf = bytearray(CHUNK)
    while True:
        n = cf.readinto(buf)
        if not n:
            return found
        found += n - bytes(buf[:n]).count(0)


def _small_documents(manifest: BundleManifest) -> Dict[str, int]:
    """Paths of the JSON documents the layout check reads, with their size limits."""
    docs = {"oci-layout": 4096, "index.json": limits.MAX_INDEX}
    for image in manifest.images:
        if image.index is not None:
            docs[image.index.digest.blob_path] = limits.MAX_INDEX
    for image in manifest.records():
        docs[image.manifest.digest.blob_path] = limits.MAX_MANIFEST
        docs[image.config.digest.blob_path] = limits.MAX_CONFIG
    for art in manifest.file_artifacts:  # 3.6: files carried as artifacts
        docs[art.manifest.digest.blob_path] = limits.MAX_MANIFEST
    return docs


def _drain(raw: HashingReader) -> None:
    with contextlib.suppress(OSError, UnsafeArchive):
        while raw.read(CHUNK):
            pass


def _read_up_to(raw: HashingReader, n: int) -> bytes:
    """At most ``n`` bytes, fewer only at the member's end (a read of parts stops at a part's end)."""
    chunks: List[bytes] = []
    while n > 0:
        data = raw.read(n)
        if not data:
            break
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def _check_member(name: str, raw: HashingReader, want: Digest, layer: Optional[LayerRecord], what: str,
                  keep_limit: Optional[int], kept: Dict[str, bytes]) -> Optional[Problem]:
    """Check one member as it streams past; return its problem, if any."""
    if layer is not None:
        try:
            with open_decompressed(raw, compression_of(layer.media_type),
                                   bound=layer.uncompressed_size, what=what) as plain:
                LayerReader(raw, plain, layer, what).finish()
        except IntegrityError as e:
            _drain(raw)
            got = raw.digest()
            if e.reference != "digest-mismatch" and got != want:  # name the root cause
                return Problem("digest-mismatch", name, f"expected {want}, found {got}")
            return Problem(e.reference, name, e.message)
        except BundleError:
            raise
        return None
    if keep_limit is not None:
        data = _read_up_to(raw, keep_limit + 1)  # a part boundary inside it ends one read early
        _drain(raw)
        if raw.digest() == want and len(data) <= keep_limit:
            kept[name] = data
        elif raw.digest() == want:  # a document too large to check is refused, as in a folder
            return Problem("limit-exceeded", name, f"reading {name}: expected at most {keep_limit} bytes, found more")
    else:
        _drain(raw)
    got = raw.digest()
    if got != want:
        return Problem("digest-mismatch", name, f"expected {want}, found {got}")
    return None
