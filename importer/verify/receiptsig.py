"""Detached Ed25519 signatures over receipts (``RECEIPT.sig`` beside ``RECEIPT``), with the same
keys as bundle signatures (``bundle keygen``), so that a fleet report (importer/receipts/fleet.py)
can tell a node's own receipt from one edited or made up on the way to it.

The file (``schemas/signature/receipt-v1.schema.json``) has the shape of ``bundle.json.sig``
(importer/verify/signature.py) with its own media type, so a receipt signature can never pass for
a bundle signature or the reverse::

    {
      "mediaType": "application/vnd.sneakernet.receipt-signature.v1+json",
      "algorithm": "ed25519",
      "keyFingerprint": "sha256:<hex of sha256 over the raw 32-byte public key>",
      "signedFile": "<the receipt's file name when it was signed>",
      "signedDigest": "sha256:<hex of sha256 over the receipt's bytes>",
      "signature": "<base64 of the 64-byte Ed25519 signature over the receipt's bytes>"
    }

Only ``signature`` is cryptographic, over the exact bytes of the receipt; ``signedFile`` is a note
(collected receipts are often renamed, e.g. by ``rpdcp``). Verification uses the backends of
importer/verify/signature.py (the ``cryptography`` module, else ``openssl pkeyutl``). Signing
(:func:`sign_receipt_file`): ``bundle sign-receipt`` passes a key object of ``cryptography``;
``bundle-import sign-receipt`` on a node with only python3 uses ``openssl pkeyutl -sign``."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from importer.errors import BundleError, CommandFailed, UsageError
from importer.format.digest import Digest
from importer.streams.fsutil import atomic_write_bytes
from importer.verify.keyfiles import InvalidKey
from importer.verify.signature import (
    ALGORITHM,
    TrustedKey,
    fingerprint,
    parse_public_key_pem,
    signature_fields,
    verify_ed25519,
)

RECEIPT_SIGNATURE_MEDIA_TYPE = "application/vnd.sneakernet.receipt-signature.v1+json"
SUFFIX = ".sig"
MAX_SIGNATURE_FILE = 4096
MAX_PRIVATE_KEY = 64 * 1024

#: status of a receipt's signature; only "verified" passes a report given --trust
VERIFIED, UNSIGNED, NOT_CHECKED, UNTRUSTED, BAD = "verified", "unsigned", "not-checked", "untrusted-key", "bad"


def signature_path(receipt_path: str) -> str:
    return receipt_path + SUFFIX


def encode_receipt_signature(raw: bytes, signature: bytes, raw_public_key: bytes, name: str) -> bytes:
    doc = {
        "mediaType": RECEIPT_SIGNATURE_MEDIA_TYPE,
        "algorithm": ALGORITHM,
        "keyFingerprint": fingerprint(raw_public_key),
        "signedFile": name,
        "signedDigest": str(Digest.of_bytes(raw)),
        "signature": base64.b64encode(signature).decode("ascii"),
    }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


@dataclass
class ReceiptSignature:
    """What the check of one receipt's signature found."""

    status: str  # VERIFIED, UNSIGNED, NOT_CHECKED (signed, no --trust), UNTRUSTED, BAD
    key_fingerprint: Optional[str] = None
    key_file: Optional[str] = None
    detail: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"status": self.status, "keyFingerprint": self.key_fingerprint, "trustedKeyFile": self.key_file,
                "detail": self.detail}


def _parse(raw_sig: bytes) -> Dict[str, Any]:
    """The fields of a receipt signature file; ValueError naming what is wrong."""
    doc = signature_fields(raw_sig, RECEIPT_SIGNATURE_MEDIA_TYPE)
    return {"fingerprint": doc.key_fingerprint, "digest": doc.signed_digest, "signature": doc.signature}


def check_receipt_signature(raw: bytes, raw_sig: Optional[bytes], keys: Sequence[TrustedKey]) -> ReceiptSignature:
    """Judge a receipt's bytes against its signature file's bytes (None: there is none). Never
    raises for a bad signature (the report lists it); raises SignatureVerifierUnavailable when a
    signature by a trusted key must be checked and this host has no verifier."""
    if raw_sig is None:
        return ReceiptSignature(UNSIGNED, detail="no signature file")
    try:
        doc = _parse(raw_sig)
    except ValueError as e:
        return ReceiptSignature(BAD, detail=f"the signature file is not a receipt signature ({e})")
    if not keys:
        return ReceiptSignature(NOT_CHECKED, doc["fingerprint"], detail="signed; no --trust key given to check it")
    key = next((k for k in keys if k.fingerprint == doc["fingerprint"]), None)
    if key is None:
        return ReceiptSignature(UNTRUSTED, doc["fingerprint"],
                                detail=f"signed by key {doc['fingerprint']}, which no --trust key is")
    digest = str(Digest.of_bytes(raw))
    if doc["digest"] != digest:
        return ReceiptSignature(BAD, key.fingerprint, key.path,
                                f"the receipt was changed after signing (signed {doc['digest']}, found {digest})")
    ok, _backend = verify_ed25519(key.raw, doc["signature"], raw)
    if not ok:
        return ReceiptSignature(BAD, key.fingerprint, key.path, "the signature does not verify over the receipt")
    return ReceiptSignature(VERIFIED, key.fingerprint, key.path, f"signed by {key.fingerprint} ({key.path})")


# ============================================================================ signing

Signer = Callable[[bytes], bytes]


def sign_receipt_file(path: str, sign: Signer, raw_public_key: bytes) -> str:
    """Write ``path``.sig over the receipt's bytes as they are now; returns the signature's path.
    The receipt must be a sneakernet receipt (a JSON object with a known ``kind``)."""
    with open(path, "rb") as f:
        raw = f.read(64 * 1024 * 1024 + 1)
    if len(raw) > 64 * 1024 * 1024 or not _is_receipt(raw):
        raise UsageError(f"signing {path}: expected a receipt written by bundle-import (JSON with kind import, "
                         "check-only or qualification), found something else",
                         hint="sign the receipt files themselves (*.import-receipt.json, *.check-receipt.json, "
                         "*.qualification.json), not a folder or another file")
    sig = encode_receipt_signature(raw, sign(raw), raw_public_key, os.path.basename(path))
    atomic_write_bytes(signature_path(path), sig)
    return signature_path(path)


def _is_receipt(raw: bytes) -> bool:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    return doc.get("kind") in ("import", "check-only", "qualification") or (
        isinstance(doc.get("import"), dict) and isinstance(doc.get("qualifications"), list))


def openssl_signer(key_path: str, passphrase: Optional[bytes] = None) -> Tuple[Any, ...]:
    """(sign function, raw public key) for a ``bundle keygen`` private key, with the OpenSSL 3
    command line (``openssl pkeyutl -sign -rawin``): for nodes that have python3 and openssl only."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise UsageError("signing a receipt: expected the openssl command (OpenSSL 3) on this host, found none",
                         hint="install openssl, or copy the receipts to a host with `bundle` and run "
                         "`bundle sign-receipt` there")
    if not os.path.isfile(key_path):
        raise InvalidKey(f"reading the signing key {key_path}: expected a file, found none",
                         hint="use the PREFIX.key written by `bundle keygen -o PREFIX`")
    pass_args = ["-passin", "stdin"] if passphrase else []
    stdin = (passphrase + b"\n") if passphrase else b""
    res = _run([openssl, "pkey", "-in", key_path, "-pubout", *pass_args], stdin)
    if res.returncode != 0:
        said = res.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InvalidKey(f"reading the signing key {key_path}: expected an Ed25519 private key "
                         f"{'and its passphrase ' if passphrase else ''}openssl can read, "
                         f"found {_key_problem(key_path, passphrase)}",
                         context=f"openssl: {said[0][:200]}" if said else None,
                         hint="use the PREFIX.key written by `bundle keygen -o PREFIX`; an encrypted key needs "
                         "--passphrase-stdin and its passphrase")
    raw_public = parse_public_key_pem(res.stdout, key_path)

    def sign(data: bytes) -> bytes:
        tmp = tempfile.mkdtemp(prefix="sneakernet-rsig-")
        try:
            src, out = os.path.join(tmp, "receipt"), os.path.join(tmp, "sig")
            with open(src, "wb") as f:
                f.write(data)
            argv = [openssl, "pkeyutl", "-sign", "-inkey", key_path, "-rawin", "-in", src, "-out", out, *pass_args]
            done = _run(argv, stdin)
            if done.returncode != 0:
                raise CommandFailed(argv, done.returncode, done.stderr.decode("utf-8", "replace"),
                                    what="signing the receipt with openssl")
            with open(out, "rb") as f:
                signature = f.read(65)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if len(signature) != 64:
            raise BundleError(f"signing the receipt with openssl: expected a 64-byte Ed25519 signature, "
                              f"found {len(signature)} bytes")
        return signature

    return sign, raw_public


def _key_problem(key_path: str, passphrase: Optional[bytes]) -> str:
    """What is wrong with a key openssl refused, in words (openssl's own dump goes to the context)."""
    try:
        with open(key_path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        return f"an unreadable file ({e.strerror or e})"
    if b"ENCRYPTED PRIVATE KEY" in head:
        return "a wrong key or passphrase" if passphrase else "an encrypted key and no passphrase"
    if b"PRIVATE KEY" not in head:
        return "a file that is not a PEM private key"
    return "a wrong key (not Ed25519, or damaged)"


def _run(argv: Sequence[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    """openssl with the passphrase (if any) on its stdin, never in its arguments or a file."""
    try:
        return subprocess.run(list(argv), input=stdin, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CommandFailed(argv, -1, str(e), what="running openssl") from e
