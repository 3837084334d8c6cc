"""The one error hierarchy of sneakernet (the exporter re-exports it).

Every error raised on purpose is a :class:`BundleError` with a stable ``reference`` id and an
``exit_code``; both are documented in ``docs/errors.md``. Messages say what was being done, to
which file/blob/image, what was expected and what was found; ``hint`` says what to do next.
"""

from __future__ import annotations

from typing import List, Optional, Sequence


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

    def to_dict(self) -> dict:  # type: ignore[type-arg]
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


class DecompressFailed(IntegrityError):
    reference = "decompress-failed"


class InventoryDamaged(IntegrityError):
    """An engine inventory (``bundle-import --inventory``) does not match its checksum."""

    reference = "inventory-damaged"


class LimitExceeded(IntegrityError):
    """A bounded read (JSON, decompression) went past its limit."""

    reference = "limit-exceeded"


class NotRegularFile(IntegrityError):
    """A bundle file is a symbolic link, a device, a fifo or a folder where a regular file belongs."""

    reference = "not-a-regular-file"


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


class RegistryNoCatalog(RegistryError):
    """The registry does not list its repositories (``/v2/_catalog`` answers 404/405)."""

    reference = "registry-no-catalog"


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


class PostLoadMismatch(BundleError):
    """The engine holds something other than what the bundle pins."""

    reference = "post-load-mismatch"
    exit_code = 8


class DeepMismatch(PostLoadMismatch):
    """``--deep``: a layer the engine stores hashes to another diff_id than bundle.json pins."""

    reference = "deep-mismatch"


class DeltaBaseMissing(BundleError):
    """A delta bundle needs layers the engine does not hold."""

    reference = "delta-base-missing"
    exit_code = 9


class Interrupted(BundleError):
    reference = "interrupted"
    exit_code = 130
