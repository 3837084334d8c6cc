"""Signing keys: ``bundle keygen`` (Ed25519), loading a private key, signing a bundle.

The private key file is created with ``O_CREAT | O_EXCL`` and mode 0600 in one step (never
chmod'ed afterwards, so it is never readable by others, not even for an instant) and is
optionally encrypted with a passphrase (PKCS#8, PEM). The public key is PEM
SubjectPublicKeyInfo, what ``bundle-import --trust`` and ``openssl pkeyutl -pubin`` read.
The signature format itself lives in :mod:`importer.verify.signature`."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Optional

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundle.writer import write_sums
from importer.format.digest import Digest
from importer.format.limits import MAX_BUNDLE_JSON, read_file_limited
from importer.format.manifest import BUNDLE_JSON, SIGNATURE_FILE, BundleManifest, load_bundle_manifest
from importer.streams.fsutil import atomic_write_bytes, fsync_dir
from importer.verify.keyfiles import InvalidKey
from importer.verify.signature import encode_signature, fingerprint, public_key_pem

MAX_PRIVATE_KEY = 64 * 1024


@dataclass(frozen=True)
class KeyPair:
    private_path: str
    public_path: str
    fingerprint: str
    encrypted: bool


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _create_exclusive(path: str, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` or fail if anything (even a dangling link) is there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise InvalidKey(f"writing {path}: expected no file there, found one",
                         hint="choose another -o PREFIX; keygen never overwrites a key") from None
    except OSError as e:
        raise InvalidKey(f"writing {path}: expected a writable folder, found {e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def generate_keypair(prefix: str, passphrase: bytes | None = None) -> KeyPair:
    """Write ``PREFIX.key`` (0600, encrypted when a passphrase is given) and ``PREFIX.pub``."""
    private_path, public_path = f"{prefix}.key", f"{prefix}.pub"
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise InvalidKey(f"writing {path}: expected no file there, found one",
                             hint="choose another -o PREFIX; keygen never overwrites a key")
    if passphrase is not None and not passphrase:
        raise InvalidKey("encrypting the private key: expected a non-empty passphrase, found an empty one",
                         hint="give a passphrase on stdin, or drop --passphrase-stdin for an unencrypted key")
    key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    raw_public = _raw_public(key)
    _create_exclusive(private_path, pem, 0o600)
    try:
        _create_exclusive(public_path, public_key_pem(raw_public), 0o644)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(private_path)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(private_path)))
    return KeyPair(private_path, public_path, fingerprint(raw_public), passphrase is not None)


def key_is_encrypted(path: str) -> bool:
    try:
        return b"ENCRYPTED PRIVATE KEY" in read_file_limited(path, MAX_PRIVATE_KEY, path)
    except OSError:
        return False


def load_signing_key(path: str, passphrase: bytes | None = None) -> Ed25519PrivateKey:
    """Read an Ed25519 private key written by ``bundle keygen``."""
    try:
        data = read_file_limited(path, MAX_PRIVATE_KEY, path)
    except OSError as e:
        raise InvalidKey(f"reading the signing key {path}: expected a readable file, found {e}") from e
    encrypted = b"ENCRYPTED PRIVATE KEY" in data
    if encrypted and not passphrase:
        raise InvalidKey(f"reading the signing key {path}: expected a passphrase, found none (the key is encrypted)",
                         hint="give the passphrase on stdin with --passphrase-stdin")
    try:
        key = serialization.load_pem_private_key(data, password=passphrase if encrypted else None)
    except (ValueError, TypeError) as e:
        found = "a wrong passphrase" if encrypted else f"an unreadable key ({e})"
        raise InvalidKey(f"reading the signing key {path}: expected an Ed25519 private key, found {found}",
                         hint="use the PREFIX.key written by `bundle keygen -o PREFIX`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidKey(f"reading the signing key {path}: expected an Ed25519 key, found {type(key).__name__}",
                         hint="make one with `bundle keygen -o PREFIX`")
    return key


def sign_bundle(root: str, key: Ed25519PrivateKey, *, raw_bundle_json: Optional[bytes] = None,
                manifest: Optional[BundleManifest] = None) -> str:
    """Sign ``root``/bundle.json: write bundle.json.sig, then SHA256SUMS again listing it.
    ``raw_bundle_json``: the bytes the caller opened and verified (else read here); ``manifest``:
    what they were parsed into (else parsed here; ``bundle sign`` passes both, so it reads and
    parses bundle.json once).

    Returns the key fingerprint. The signature is over the exact bytes on disk."""
    raw = raw_bundle_json if raw_bundle_json is not None else \
        read_file_limited(os.path.join(root, BUNDLE_JSON), MAX_BUNDLE_JSON, BUNDLE_JSON)
    if manifest is None:
        manifest = load_bundle_manifest(raw)
    raw_public = _raw_public(key)
    sig = encode_signature(raw, key.sign(raw), raw_public)
    atomic_write_bytes(os.path.join(root, SIGNATURE_FILE), sig)
    write_sums(root, manifest, raw, extra={SIGNATURE_FILE: Digest.of_bytes(sig)})
    fsync_dir(root)
    return fingerprint(raw_public)
