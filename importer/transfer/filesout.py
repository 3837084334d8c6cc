"""``bundle-import BUNDLE --files-to DIR``: the files a bundle carries as OCI artifacts (schema 3.6,
importer/format/fileartifacts.py) written below DIR, after the bundle was verified.

1. Plan, before anything is written: every title joined to DIR (checked again: inside DIR, each
   name at most 255 bytes), every existing path looked at without following links: a link or
   non-folder where a folder must be is refused; a file already there with the same bytes is
   left as it is (hashed), one with other bytes refused (:class:`FileConflict`, exit 7) unless
   ``force``. Nothing is written when anything is refused.
2. Stage: each file copied from the bundle into ``DIR/.sneakernet-staging-<bundle digest>/``
   (the same file system, so the rename below is atomic), hashed as it is copied and checked
   against bundle.json, fsynced, its mode set, then renamed to ``<digest hex>``: a staged file of
   that name is complete and checked, and a later run reuses it (an interrupted import resumes).
3. Place: each staged file linked (never replacing anything), else renamed, to its path, the
   folders on the way opened without following links. The staging folder is removed at the end.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from typing import BinaryIO, Callable, Dict, List, Optional, Sequence, Tuple

from importer.errors import (
    WRITE_ERRNOS,
    DeltaBaseMissing,
    DigestMismatch,
    PolicyRejected,
    SizeMismatch,
    UnwritableDestination,
    name_write_error,
    write_error,
)
from importer.format.digest import CHUNK, Digest
from importer.format.fileartifacts import STAGING_PREFIX, CarriedFile, FileArtifact, mode_text
from importer.streams import testhooks

ProgressFn = Callable[[int], None]
Opener = Callable[[str], BinaryIO]
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NAME_MAX = 255


class FileConflict(PolicyRejected):
    """A path of ``--files-to DIR`` holds other bytes than the file the bundle carries there."""

    reference = "file-conflict"


@dataclass
class FileOutcome:
    """One file of the receipt: where it went and what this run did (written, resumed, unchanged, replaced)."""

    artifact: str
    title: str
    path: str
    digest: Digest
    size: int
    mode: int
    action: str = "written"  # written, resumed, unchanged, replaced; held: a delta's file found there (3.8)

    def to_dict(self) -> Dict[str, object]:
        return {"artifact": self.artifact, "title": self.title, "path": self.path, "digest": str(self.digest),
                "size": self.size, "mode": mode_text(self.mode), "action": self.action}


def _hash(f: BinaryIO, on_bytes: Optional[ProgressFn] = None, out: Optional[BinaryIO] = None) -> Tuple[Digest, int]:
    hasher, size = hashlib.sha256(), 0
    for chunk in iter(lambda: f.read(CHUNK), b""):
        hasher.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
        if on_bytes is not None:
            on_bytes(len(chunk))
    return Digest("sha256", hasher.hexdigest()), size


def _unsafe(target: str, title: str, found: str) -> UnwritableDestination:
    return UnwritableDestination(f"writing the files to {target}: expected {title!r} to go below it, found {found}",
                                 hint="move it out of the way (or choose another --files-to DIR); nothing was written")


def _existing(target: str, f: CarriedFile, force: bool) -> str:
    """What is at ``f``'s path now: "" (nothing), "same" (its bytes), "other" (other bytes: replaced with
    ``force``, else refused by the caller). A link, a folder or a special file on the way is refused."""
    parts = f.title.split("/")
    if any(len(os.fsencode(p)) > _NAME_MAX for p in parts):
        raise _unsafe(target, f.title, f"a name longer than {_NAME_MAX} bytes")
    here = target
    for n, part in enumerate(parts):
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return ""
        last = n == len(parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            raise _unsafe(target, f.title, f"{here} is not a folder (a link or a file)")
        if last and not stat.S_ISREG(st.st_mode):
            raise _unsafe(target, f.title, f"{here} is not a regular file (a folder, link or special file)")
    if st.st_size != f.blob.size:
        return "other"
    with open(here, "rb") as existing:
        return "same" if _hash(existing)[0] == f.blob.digest else "other"


def _open_folder(target_fd: int, parts: Sequence[str]) -> int:
    """The folder ``parts`` below the open folder ``target_fd``, made where missing; never through a link."""
    fd = os.dup(target_fd)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _stage(opener: Opener, f: CarriedFile, staging: str, on_bytes: Optional[ProgressFn]) -> Tuple[str, bool]:
    """``f``'s bytes in the staging folder, complete and checked: (its path, reused from an earlier run)."""
    final = os.path.join(staging, f.blob.digest.hex)
    with contextlib.suppress(FileNotFoundError):
        if os.lstat(final).st_size == f.blob.size and stat.S_ISREG(os.lstat(final).st_mode):
            if on_bytes is not None:
                on_bytes(f.blob.size)
            return final, True
    part = final + ".part"
    try:
        with opener(f.blob.digest.blob_path) as src, open(part, "wb") as out:
            digest, size = _hash(src, on_bytes, out)
            out.flush()
            os.fsync(out.fileno())
    except OSError as e:  # a full disk: the cut file goes (it is copied again from its start), named
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise name_write_error(e, part) from None
    if size != f.blob.size:
        os.unlink(part)
        raise SizeMismatch(f"writing {f.title}: expected {f.blob.size} bytes from the bundle, found {size}",
                           hint="the bundle changed since it was verified; verify it again")
    if digest != f.blob.digest:
        os.unlink(part)
        raise DigestMismatch(f"writing {f.title}: expected {f.blob.digest}, found {digest}",
                             hint="the bundle changed since it was verified; verify it again")
    os.replace(part, final)
    return final, False


def _place(staged: str, target_fd: int, f: CarriedFile, keep: bool, force: bool) -> None:
    """``staged`` to ``f``'s path (``keep``: a copy, the staged file is needed again). A link never
    replaces anything; where links do not work (FAT, exFAT) a rename after looking again."""
    parts = f.title.split("/")
    folder = _open_folder(target_fd, parts[:-1])
    try:
        source = staged
        if keep:
            source = staged + ".copy"
            try:
                shutil.copyfile(staged, source)
            except OSError as e:  # a full disk: no cut copy left behind
                with contextlib.suppress(OSError):
                    os.unlink(source)
                raise name_write_error(e, source) from None
        os.chmod(source, f.mode)
        try:
            os.link(source, parts[-1], dst_dir_fd=folder)
            os.unlink(source)
        except FileExistsError:
            if not force:
                if keep:
                    os.unlink(source)
                raise FileConflict(f"writing {f.title}: expected nothing there, found a file that appeared "
                                   "meanwhile", hint="nothing there was replaced; look at it and run again") from None
            os.rename(source, parts[-1], dst_dir_fd=folder)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if not force and os.path.lexists(os.path.join(f"/proc/self/fd/{folder}", parts[-1])):
                raise FileConflict(f"writing {f.title}: expected nothing there, found a file that appeared "
                                   "meanwhile", hint="nothing there was replaced") from None
            os.rename(source, parts[-1], dst_dir_fd=folder)
        os.fsync(folder)
    finally:
        os.close(folder)


def check_held(target: str, artifacts: Sequence[FileArtifact]) -> None:
    """A file delta (3.8): every file it leaves out is below ``target`` with its bytes (read), else
    :class:`DeltaBaseMissing` (exit 9) naming them; a run that loads images first calls this before."""
    target = os.path.abspath(target)
    held = [FileArtifact(a.ref, a.artifact_type, a.manifest, a.config, a.held_files()) for a in artifacts
            if a.held_files()]
    if held and os.path.isdir(target):
        _plan(target, held, force=False)
    elif held:
        _plan_missing([f"{f.title} (missing, expected {f.blob.digest})" for a in held for f in a.files], target)


def _plan_missing(missing: List[str], target: str) -> None:
    if missing:
        raise DeltaBaseMissing(
            f"writing the files of a file delta to {target}: expected {len(missing)} file(s) the bundle leaves out "
            f"there with their bytes, found {len(missing)} not: {'; '.join(missing[:5])}"
            + ("; ..." if len(missing) > 5 else ""),
            hint="nothing was written; write the base version there first (the bundle the --have inventory was "
            "taken after), or re-export with --have from this folder's inventory (bundle-import --inventory "
            f"--files-to {target}), or without --have")


def _plan(target: str, artifacts: Sequence[FileArtifact], force: bool) -> List[Tuple[FileArtifact, CarriedFile, str]]:
    """Every file with what is at its path; every conflict refused at once, before anything is written.
    A file a delta leaves out (3.8, ``external``) must be there with its bytes (read to check)."""
    planned, conflicts, missing = [], [], []
    for art in artifacts:
        for f in art.files:
            real = os.path.normpath(os.path.join(target, f.title))
            if os.path.commonpath([target, real]) != target or real == target:  # titles are checked; again here
                raise _unsafe(target, f.title, "a path outside it")
            found = _existing(target, f, force)
            if f.external and found != "same":
                missing.append(f"{f.title} ({'missing' if not found else 'other bytes'}, expected {f.blob.digest})")
            elif found == "other" and not force:
                conflicts.append(f.title)
            planned.append((art, f, found))
    _plan_missing(missing, target)
    if conflicts:
        raise FileConflict(
            f"writing the files to {target}: expected each path free or holding the same bytes, found "
            f"{len(conflicts)} file(s) with other content: {', '.join(conflicts[:5])}"
            + (", ..." if len(conflicts) > 5 else ""),
            hint="nothing was written; move them away, or pass --force to replace them (files only, never a folder "
            "or link)" + ("; a file delta of a new version replaces the files that changed: --force" if any(
                f.external for _, f, _ in planned) else ""))
    return planned


def write_files(opener: Opener, artifacts: Sequence[FileArtifact], target: str, staging_key: str, *,
                force: bool = False, on_bytes: Optional[ProgressFn] = None) -> List[FileOutcome]:
    """Every file of ``artifacts`` below ``target`` (made when missing); ``opener`` opens a bundle
    path (a folder's file or a tar's member). Staging: ``target/.sneakernet-staging-<staging_key>``."""
    target = os.path.abspath(target)
    os.makedirs(target, exist_ok=True)
    if not os.path.isdir(target):
        raise UnwritableDestination(f"writing the files to {target}: expected a folder, found something else",
                                    hint="choose another --files-to DIR; nothing was written")
    planned = _plan(target, artifacts, force)
    staging = os.path.join(target, STAGING_PREFIX + staging_key)
    os.makedirs(staging, 0o700, exist_ok=True)
    uses: Dict[Digest, int] = {}
    for _, f, found in planned:
        if found != "same":
            uses[f.blob.digest] = uses.get(f.blob.digest, 0) + 1
    outcomes: List[FileOutcome] = []
    target_fd = os.open(target, _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
    try:
        for art, f, found in planned:
            outcome = FileOutcome(art.ref, f.title, os.path.join(target, f.title), f.blob.digest, f.blob.size, f.mode)
            if found == "same":
                outcome.action = "held" if f.external else "unchanged"
                if on_bytes is not None:
                    on_bytes(f.blob.size)
            else:
                staged, reused = _stage(opener, f, staging, on_bytes)
                testhooks.reached("files-staged")
                uses[f.blob.digest] -= 1
                _place(staged, target_fd, f, keep=uses[f.blob.digest] > 0, force=force)
                outcome.action = "replaced" if found == "other" else "resumed" if reused else "written"
            outcomes.append(outcome)
        os.fsync(target_fd)
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        with contextlib.suppress(OSError):
            os.rmdir(staging)  # only when empty: a file staged whole is kept for the next run
        raise write_error(e, f"writing the files to {target}", folder=target,
                          note=f"the {len(outcomes)} file(s) before it are in place, whole; nothing is under "
                          "this file's name", hint=f"free space on the file system of {target}, then run the same "
                          "command again: it keeps what is in place and writes the rest") from None
    finally:
        os.close(target_fd)
    shutil.rmtree(staging, ignore_errors=True)
    return outcomes
