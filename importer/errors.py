"""The one error hierarchy of sneakernet (the exporter re-exports it).

Every error raised on purpose is a :class:`BundleError` with a stable ``reference`` id and an
``exit_code``; both are documented in ``docs/errors.md``. Messages say what was being done, to
which file/blob/image, what was expected and what was found; ``hint`` says what to do next.
"""

from __future__ import annotations

import errno
import os
from typing import Any, Dict, List, Optional, Sequence


class BundleError(Exception):
    """Base of every error raised on purpose. Not raised directly."""

    reference = "bundle-error"
    exit_code = 1

    def __init__(
        self, message: str, *, context: Optional[str] = None, hint: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.context = context
        self.hint = hint

    def to_dict(self) -> Dict[str, Any]:
        return {
            "id": self.reference,
            "exitCode": self.exit_code,
            "message": self.message,
            "context": self.context,
            "hint": self.hint,
        }


class UsageError(BundleError):
    """Bad command-line arguments or configuration."""

    reference = "usage"
    exit_code = 2


class InvalidReference(UsageError):
    reference = "invalid-reference"


class BundleNotFound(UsageError):
    """BUNDLE names nothing: no folder, tar, part or parts index there (a typo, a wrong path).
    Raised before anything else is done (no engine is probed, no receipt written)."""

    reference = "bundle-not-found"


class EngineNotChosen(UsageError):
    """No ``--engine``, no engine option, no ``DOCKER_HOST`` and no Docker on its default socket,
    but another engine answers: it is not chosen silently; the message lists what answered."""

    reference = "engine-not-chosen"


class UnwritableDestination(UsageError):
    """``copy SRC DST``: DST cannot be written (permissions, no space, a link or special file in it)."""

    reference = "unwritable-destination"


class UnwritableReceipt(UsageError):
    """The receipt could not be written where it was asked to go (``--receipt``, ``--smoke-receipt``):
    found before anything is imported or run."""

    reference = "receipt-unwritable"


class DestinationInUse(UsageError):
    """An output folder holds something other than what would replace it: ``bundle export -o X
    --force`` replaces only a bundle (or an empty folder), ``copy SRC DST`` writes only into an
    empty folder or a (partial) copy of the same bundle."""

    reference = "destination-in-use"


class FileAccessError(UsageError):
    """A file or folder outside the bundle (receipt, ``--have``, output folder...) could not be
    read or written: an OSError that reached a CLI (see :func:`os_error`)."""

    reference = "file-access"


class IntegrityError(BundleError):
    """Bytes on disk differ from what the bundle pins."""

    reference = "integrity"
    exit_code = 3


class InvalidDigest(IntegrityError):
    reference = "invalid-digest"


class DigestMismatch(IntegrityError):
    reference = "digest-mismatch"


class SizeMismatch(IntegrityError):
    reference = "size-mismatch"


class DiffIDMismatch(IntegrityError):
    reference = "diffid-mismatch"


class MissingBlob(IntegrityError):
    reference = "missing-file"


class NotRegularFile(IntegrityError):
    """A path the bundle names is a symbolic link, folder, FIFO, device or socket (or goes
    through a linked folder): a bundle holds regular files only, and nothing is read through a link."""

    reference = "not-a-regular-file"


class DecompressFailed(IntegrityError):
    reference = "decompress-failed"


class UnreadableFile(IntegrityError):
    """A file or folder of the bundle could not be read (permissions, an I/O error)."""

    reference = "unreadable-file"

    @classmethod
    def of(cls, err: OSError, path: Optional[str] = None, *, doing: str = "reading") -> UnreadableFile:
        where = path if path is not None else err.filename if isinstance(err.filename, str) else "a bundle file"
        return cls(
            f"{doing} {where}: expected a readable file, found {os_error_text(err)}",
            hint="give the importer read access to the bundle (the file and every folder above it); "
            "an I/O error: re-copy the bundle from the source medium",
        )


class InventoryDamaged(IntegrityError):
    """An engine inventory (``bundle-import --inventory``) does not match its checksum."""

    reference = "inventory-damaged"


class LimitExceeded(IntegrityError):
    """A bounded read (JSON, decompression) went past its limit."""

    reference = "limit-exceeded"


class ArchiveManifestMismatch(IntegrityError):
    """The ``manifest.json`` inside a schema 1/2 archive disagrees with bundle.json."""

    reference = "archive-manifest-mismatch"


class VerificationFailed(IntegrityError):
    """Collected verification problems; ``problems`` lists every one of them."""

    reference = "verification-failed"

    def __init__(self, message: str, problems: Sequence[object], **kw: Optional[str]) -> None:
        super().__init__(message, **kw)
        self.problems: List[object] = list(problems)


class ManifestError(BundleError):
    """bundle.json (or another JSON document of the bundle) is malformed."""

    reference = "invalid-manifest"
    exit_code = 4


class UnsupportedSchemaVersion(ManifestError):
    reference = "unsupported-schema-version"


class InvalidPartsIndex(ManifestError):
    """A parts index (``FILE.tar.parts.json``) is malformed or is not one."""

    reference = "invalid-parts-index"


class SourceError(BundleError):
    """The exporter could not read the image source."""

    reference = "source"
    exit_code = 5


class ImageNotFound(SourceError):
    reference = "image-not-found"


class PlatformNotFound(ImageNotFound):
    """An image index holds no manifest for the platform asked for (``--platform``, else this host's);
    the message names the platforms it has."""

    reference = "platform-not-found"


class SinkError(BundleError):
    """The engine (docker, containerd, podman, registry) failed or is unreachable."""

    reference = "engine"
    exit_code = 6


class EngineUnavailable(SinkError):
    reference = "engine-unavailable"


class RegistryError(SinkError):
    """A registry refused a request, or kept failing after the retries."""

    reference = "registry"


class RegistryAuthError(RegistryError):
    reference = "registry-auth"


class RegistryUnreachable(RegistryError):
    """Nothing answers where the registry is named: the connection was refused, the host name
    does not resolve, or there is no route to it (found at the first contact, without retries)."""

    reference = "registry-unreachable"


class RegistryNoCatalog(RegistryError):
    """The registry does not list its repositories (``/v2/_catalog`` answers 404/405)."""

    reference = "registry-no-catalog"


class RegistryRedirectError(RegistryError):
    """A registry (its blob storage, its token realm) redirected in a loop or too many times."""

    reference = "registry-redirect"


class TunnelFailed(SinkError):
    """The SSH tunnel to the registry could not be opened or died."""

    reference = "ssh-tunnel"


class CommandFailed(SinkError):
    reference = "command-failed"

    def __init__(self, argv: Sequence[str], returncode: int, stderr_tail: str,
                 *, what: str = "", hint: Optional[str] = None) -> None:
        shown = " ".join(argv)
        doing = f"{what}: " if what else ""
        super().__init__(
            f"{doing}`{shown}` exited with status {returncode}",
            context=stderr_tail.strip() or None,
            hint=hint,
        )
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class PolicyRejected(BundleError):
    """Signature or trust policy refused the bundle."""

    reference = "policy-rejected"
    exit_code = 7


class PlatformMismatch(BundleError):
    """The bundle's images are for another platform than the engine runs (a containerd import
    would unpack nothing); the message names the platforms the bundle has. Nothing was changed."""

    reference = "platform-mismatch"
    exit_code = 7


class GpuUnfit(BundleError):
    """An image will not run on the target host's driver and GPUs (importer/format/cudafit.py,
    docs/gpu-fit.md): ``bundle export --have INVENTORY`` without ``--allow-unfit``, or
    ``bundle-import --require-fit``. The message names the image, the rule that failed and the
    driver that would fit. Nothing was written or loaded."""

    reference = "gpu-unfit"
    exit_code = 7


class BadSignature(PolicyRejected):
    """The signature file is malformed (or not a regular file) or does not verify over bundle.json."""

    reference = "bad-signature"


class PostLoadMismatch(BundleError):
    """The engine holds something other than what the bundle pins."""

    reference = "post-load-mismatch"
    exit_code = 8


class DeepMismatch(PostLoadMismatch):
    """``--deep``: a layer the engine stores hashes to another diff_id than bundle.json pins."""

    reference = "deep-mismatch"


class CheckOnlyMissing(PostLoadMismatch):
    """``--check-only``: the engine holds no image under a name the bundle gives it (with
    ``--name-prefix``: under the mirror's name). Nothing was loaded, tagged or removed."""

    reference = "check-only-missing"


class CheckOnlyMismatch(PostLoadMismatch):
    """``--check-only``: a name of the bundle names another image in the engine (another image
    ID, config or diff_ids). Nothing was loaded, tagged or removed."""

    reference = "check-only-mismatch"


class DeltaBaseMissing(BundleError):
    """A delta bundle needs layers the engine does not hold."""

    reference = "delta-base-missing"
    exit_code = 9


class InternalError(BundleError):
    """An exception no code raised on purpose (a bug): how the CLIs report it, ``error[internal]``
    on stderr and in ``--json`` output. Re-run with ``--debug`` for the traceback."""

    reference = "internal"
    exit_code = 1

    @classmethod
    def of(cls, exc: BaseException, prog: str) -> InternalError:
        return cls(f"{type(exc).__name__}: {exc}",
                   hint=f"this is a bug in {prog}; re-run with --debug and report the traceback")


class Interrupted(BundleError):
    reference = "interrupted"
    exit_code = 130


def os_error_text(err: OSError) -> str:
    """``Permission denied (EACCES)``: the errno text and its symbolic name."""
    name = errno.errorcode.get(err.errno or 0)
    text = err.strerror or str(err) or type(err).__name__
    return f"{text} ({name})" if name else text


def _in_bundle(path: str, bundle: str) -> bool:
    """``path`` is the bundle BUNDLE names, a file below that folder, or one of its tar parts."""
    p, b = os.path.abspath(path), os.path.abspath(bundle)
    if p == b or p.startswith(b.rstrip(os.sep) + os.sep):
        return True
    cut = b.rfind(".tar")
    return cut > len(os.path.dirname(b)) and p.startswith(b[:cut + 4])


#: errors only a write gives: an OSError of these raised while writing a file is that file's
#: (:func:`name_write_error`), whatever else the block read
WRITE_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG, errno.EROFS) if e)
#: what a failed write can tell about its place (:func:`write_error`)
PLACE_ERRNOS = WRITE_ERRNOS | {errno.EACCES, errno.EPERM, errno.EIO}


def name_write_error(err: OSError, path: str, *, any_errno: bool = False) -> OSError:
    """``err`` naming ``path`` when it names no file and is a write's (:data:`WRITE_ERRNOS`; any
    errno with ``any_errno``: a flush, fsync or rename of that file): ``write()`` names none."""
    if not isinstance(err.filename, str) and (any_errno or err.errno in WRITE_ERRNOS):
        err.filename = path
    return err


def _bytes_text(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _statvfs_near(folder: str) -> Optional[os.statvfs_result]:
    """statvfs of the file system holding ``folder`` (its nearest existing folder); None when unread."""
    where = os.path.abspath(folder)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        return os.statvfs(where)
    except (OSError, AttributeError):
        return None


def free_space_text(folder: str) -> str:
    """``1.2 MiB (1258291 bytes) free of 3.9 GiB``: the file system holding ``folder`` (its nearest
    existing folder); "" when that cannot be read."""
    st = _statvfs_near(folder)
    if st is None:
        return ""
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return f"{_bytes_text(free)} ({free} bytes) free of {_bytes_text(total)}"


def inodes_text(folder: str) -> str:
    """`` and 3 of 6 inodes (files and folders)``: the inodes free on the file system holding ``folder``
    (an ENOSPC also means that no file can be made, however many bytes are free: a small tmpfs's
    nr_inodes, an ext4 of many small files); "" where it has no such limit or it cannot be read."""
    st = _statvfs_near(folder)
    if st is None:
        return ""
    return f" and {st.f_favail} of {st.f_files} inodes (files and folders)" if st.f_files > 0 else ""


def write_error(err: OSError, doing: str, path: Optional[str] = None, folder: Optional[str] = None, *,
                note: str = "", hint: Optional[str] = None) -> FileAccessError:
    """A failed write as a :class:`FileAccessError` naming the file, the folder it was written in
    and, out of space, the space left there; ``note`` is said after the place (e.g. a staging
    folder that is gone by now), ``hint`` replaces the one the errno gives."""
    path = path or (err.filename if isinstance(err.filename, str) else None)
    folder = folder or (os.path.dirname(os.path.abspath(path)) if path else None)
    place = f"{path or 'a file'}" + (f" in the folder {folder}" if folder else "")
    found = os_error_text(err)
    inodes = inodes_text(folder) if err.errno == errno.ENOSPC and folder else ""
    if err.errno in WRITE_ERRNOS - {errno.EROFS} and folder:
        free = free_space_text(folder)
        found += f" (its file system has {free}{inodes} now, with this run's partial files removed)" if free else ""
    where = folder or "that folder"
    default = (f"free space on the file system of {where} (bytes, or inodes where it holds as many files as it "
               "can: see `df -h` and `df -i` there), or write somewhere else" if inodes else
               f"free space on the file system of {where}, or write somewhere else"
               if err.errno in WRITE_ERRNOS - {errno.EROFS} else
               f"give this user write access to {where} (or write somewhere else)"
               if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else
               f"the medium holding {where} failed (an I/O error): check it (dmesg), or write somewhere else"
               if err.errno == errno.EIO else "check the path, its permissions and the free space of its file system")
    return FileAccessError(f"{doing}: expected to write {place}, found {found}" + (f"; {note}" if note else ""),
                           hint=hint or default)


def os_error(err: OSError, bundle: Optional[str] = None) -> BundleError:
    """An OSError that reached a CLI, typed: :class:`UnreadableFile` when it concerns a file of
    ``bundle`` (the BUNDLE argument), else :class:`FileAccessError`; both name the file and the
    errno text (a write's out-of-space, permission or I/O error: the folder too, :func:`write_error`)."""
    path = err.filename if isinstance(err.filename, str) else None
    if path is not None and bundle and _in_bundle(path, bundle):
        return UnreadableFile.of(err, path)
    if path is not None and err.errno in WRITE_ERRNOS:
        return write_error(err, "writing")
    other = f" and {err.filename2}" if isinstance(err.filename2, str) else ""
    folder = f" (in the folder {os.path.dirname(os.path.abspath(path))})" if path and not other else ""
    return FileAccessError(
        f"accessing {path or 'a file'}{other}{folder}: expected it readable and writable, found {os_error_text(err)}",
        hint="check the path, its permissions and the free space of its file system",
    )
