"""copy_bundle(): copy a bundle (folder, tar or parts) to a destination folder, resumably.

Stdlib only: it runs as ``bundle copy`` on the online side and as ``bundle-import copy`` (the
zipapp) on the offline side, e.g. from a USB stick to local disk.

Files already at the destination with the right digest are skipped; a file cut short by an
interruption (``NAME.partial``) is resumed from its length, and its digest is checked over the
whole file (prefix included) before it is renamed into place; everything is fsynced. The copy
ends with a full verification of the destination. Interrupting it at any point (even SIGKILL)
and re-running finishes the job.

- folder SRC: DST becomes the bundle folder (blobs first, bundle.json and SHA256SUMS last).
- tar SRC: DST/FILE.tar (+ DST/bundle-import.pyz when SRC has one beside it).
- parts SRC: DST/FILE.tar.partNNN, DST/bundle-import.pyz, then DST/FILE.tar.parts.json last."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from importer.archive import ArchiveReader, locate
from importer.archiveverify import verify_opened
from importer.digest import CHUNK, Digest, hash_file
from importer.errors import DigestMismatch, UsageError, VerificationFailed
from importer.fsutil import fsync_dir
from importer.limits import MAX_BUNDLE_JSON, read_file_limited
from importer.manifest import BUNDLE_JSON, IMPORTER_PYZ, SIGNATURE_FILE, SUMS_FILE, load_bundle_manifest
from importer.opened import open_bundle
from importer.verify import VerifyReport

ProgressFn = Callable[[int], None]
PARTIAL = ".partial"


@dataclass
class CopyItem:
    src: str
    rel: str  # path under DST
    size: int
    digest: Optional[Digest]  # pinned; None: compare with the source's own digest when needed


@dataclass
class CopyResult:
    src: str
    dst: str
    kind: str
    copied: List[str] = field(default_factory=list)
    resumed: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    bytes_copied: int = 0
    seconds: float = 0.0
    verification: Optional[VerifyReport] = None
    target: str = ""  # what to import on the far side (DST, DST/FILE.tar or the parts index)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "kind": self.kind,
            "bundle": self.target,
            "copied": self.copied,
            "resumed": self.resumed,
            "skipped": self.skipped,
            "bytesCopied": self.bytes_copied,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.to_dict() if self.verification else None,
        }


class _Throttle:
    """At most ``rate`` bytes per second (``--bwlimit``), averaged since the start."""

    def __init__(self, rate: Optional[int]) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    def __call__(self, n: int) -> None:
        if not self.rate:
            return
        self.done += n
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


def plan_copy(src: str) -> Tuple[str, List[CopyItem], str]:
    """(kind, files in copy order, what to import at DST relative to it)."""
    loc = locate(src)
    items: List[CopyItem] = []
    if loc.kind == "folder":
        root = os.path.abspath(loc.path)
        raw_bj = read_file_limited(os.path.join(root, BUNDLE_JSON), MAX_BUNDLE_JSON, BUNDLE_JSON)
        manifest = load_bundle_manifest(raw_bj, where=os.path.join(root, BUNDLE_JSON))
        files = sorted(manifest.files, key=lambda f: (not f.path.startswith("blobs/"), -f.size, f.path))
        for f in files:
            items.append(CopyItem(os.path.join(root, f.path), f.path, f.size, f.digest))
        for extra in (SIGNATURE_FILE, SUMS_FILE):
            full = os.path.join(root, extra)
            if os.path.isfile(full):
                items.append(CopyItem(full, extra, os.path.getsize(full), None))
        items.append(CopyItem(os.path.join(root, BUNDLE_JSON), BUNDLE_JSON, len(raw_bj), Digest.of_bytes(raw_bj)))
        return "folder", items, ""
    reader = ArchiveReader(loc.path)
    beside = os.path.join(reader.directory, IMPORTER_PYZ)
    if reader.index is None:
        if os.path.isfile(beside):
            items.append(CopyItem(beside, IMPORTER_PYZ, os.path.getsize(beside), None))
        items.append(CopyItem(reader.path, os.path.basename(reader.path), os.path.getsize(reader.path), None))
        return "tar", items, os.path.basename(reader.path)
    bad = reader.part_issues()
    if bad:
        raise VerificationFailed(
            f"copying {reader.path}: expected every part the index lists, found {len(bad)} problem(s)",
            bad, context="\n".join(f"[{i.id}] {i.path}: {i.message}" for i in bad),
            hint="copy the missing or short parts from the source medium first",
        )
    for rec in reader.index.parts:
        items.append(CopyItem(os.path.join(reader.directory, rec.name), rec.name, rec.size, rec.digest))
    imp = reader.index.importer
    if imp is not None and os.path.isfile(beside):
        items.append(CopyItem(beside, IMPORTER_PYZ, imp.size, imp.digest))
    raw_index = read_file_limited(reader.path, 16 * 1024 * 1024, os.path.basename(reader.path))
    name = os.path.basename(reader.path)
    items.append(CopyItem(reader.path, name, len(raw_index), Digest.of_bytes(raw_index)))
    return "parts", items, name


def copy_bundle(src: str, dst: str, *, progress: Optional[Callable[[str, int], ProgressFn]] = None,
                bwlimit: Optional[int] = None) -> CopyResult:
    """Copy, resume, verify. Raises VerificationFailed if the copy does not verify."""
    started = time.monotonic()
    kind, items, target = plan_copy(src)
    dst = os.path.abspath(dst)
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise UsageError(f"copying to {dst}: expected a folder, found a file")
    if os.path.abspath(src) == dst or os.path.dirname(os.path.abspath(src)) == dst:
        raise UsageError(f"copying {src} to {dst}: expected another place, found the source itself")
    os.makedirs(dst, exist_ok=True)
    result = CopyResult(src=os.path.abspath(src), dst=dst, kind=kind,
                        target=os.path.join(dst, target) if target else dst)
    on_bytes = progress("copy", sum(i.size for i in items)) if progress is not None else None
    throttle = _Throttle(bwlimit)
    for item in items:
        outcome, n = copy_file(item, dst, on_bytes=on_bytes, throttle=throttle)
        result.bytes_copied += n
        {"copied": result.copied, "resumed": result.resumed, "skipped": result.skipped}[outcome].append(item.rel)
    report = verify_opened(open_bundle(result.target))
    result.verification = report
    result.seconds = time.monotonic() - started
    if not report.ok:
        raise VerificationFailed(
            f"verifying the copy {result.target}: expected every file to match, found {len(report.problems)} "
            "problem(s)", report.problems, context="\n".join(str(p) for p in report.problems[:50]),
            hint="the source itself may be damaged: verify it with bundle-import SRC --verify-only",
        )
    return result


def _same(path: str, item: CopyItem) -> bool:
    if os.path.getsize(path) != item.size:
        return False
    want = item.digest if item.digest is not None else hash_file(item.src)[0]
    return hash_file(path)[0] == want


def copy_file(item: CopyItem, dst_dir: str, *, on_bytes: Optional[ProgressFn] = None,
              throttle: Optional[Callable[[int], None]] = None) -> Tuple[str, int]:
    """("skipped"|"copied"|"resumed", bytes written) for one file."""
    final = os.path.join(dst_dir, *item.rel.split("/"))
    os.makedirs(os.path.dirname(final), exist_ok=True)
    if os.path.isfile(final) and _same(final, item):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(final + PARTIAL)  # left by a run killed after the rename's fsync
        if on_bytes is not None:
            on_bytes(item.size)
        return "skipped", 0
    partial = final + PARTIAL
    for attempt in (1, 2):
        start = os.path.getsize(partial) if os.path.isfile(partial) else 0
        if start > item.size:
            os.unlink(partial)
            start = 0
        h = hashlib.sha256()
        written = 0
        with open(partial, "ab" if start else "wb") as out, open(item.src, "rb") as f:
            if start:
                with open(partial, "rb") as prefix:  # the digest covers what an earlier run wrote
                    left = start
                    while left > 0:
                        data = prefix.read(min(CHUNK, left))
                        if not data:
                            break
                        h.update(data)
                        left -= len(data)
                if on_bytes is not None:
                    on_bytes(start)
            f.seek(start)
            left = item.size - start
            while left > 0:
                data = f.read(min(CHUNK, left))
                if not data:
                    raise DigestMismatch(f"copying {item.src}: expected {item.size} bytes, found {item.size - left}",
                                         hint="the source is shorter than the bundle says; verify the source")
                out.write(data)
                h.update(data)
                written += len(data)
                left -= len(data)
                if on_bytes is not None:
                    on_bytes(len(data))
                if throttle is not None:
                    throttle(len(data))
            out.flush()
            os.fsync(out.fileno())
        got = Digest("sha256", h.hexdigest())
        want = item.digest if item.digest is not None else (hash_file(item.src)[0] if start else got)
        if got == want:
            os.replace(partial, final)
            fsync_dir(os.path.dirname(final))
            return ("resumed" if start else "copied"), written
        with contextlib.suppress(OSError):
            os.unlink(partial)
        if attempt == 2 or not start:
            raise DigestMismatch(
                f"copying {item.rel}: expected {want}, found {got}",
                hint="the source is damaged (or changed during the copy): "
                "verify it with bundle-import SRC --verify-only",
            )
    raise AssertionError("unreachable")  # pragma: no cover
