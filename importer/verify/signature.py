"""Detached Ed25519 signatures over bundle.json, and the trust policy that checks them.

bundle.json pins every file of the bundle (digest and size, the importer included), so one
signature over its exact bytes covers the whole bundle. The signature file ``bundle.json.sig``
is a small JSON document (``schemas/signature/v1.schema.json``), one field per line so that it
can be taken apart with ``sed`` and checked by hand with ``openssl`` (docs/security.md)::

    {
      "mediaType": "application/vnd.sneakernet.signature.v1+json",
      "algorithm": "ed25519",
      "keyFingerprint": "sha256:<hex of sha256 over the raw 32-byte public key>",
      "signedFile": "bundle.json",
      "signedDigest": "sha256:<hex of sha256 over the bundle.json bytes>",
      "signature": "<base64 of the 64-byte Ed25519 signature over the bundle.json bytes>"
    }

Only ``signature`` is cryptographic; ``keyFingerprint`` picks the trusted key to try and
``signedDigest`` gives a clear message when bundle.json was edited after signing.

Verification backends, in order: the ``cryptography`` module when importable, else the OpenSSL
3 command line (``openssl pkeyutl -verify -pubin -inkey PUB -rawin -in FILE -sigfile SIG``),
else a clear refusal. Public keys are PEM SubjectPublicKeyInfo and parsed here with the
standard library, so the fingerprint never depends on the backend.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from importer.errors import BadSignature, BundleError, PolicyRejected
from importer.format.digest import Digest
from importer.format.manifest import BUNDLE_JSON, SIGNATURE_FILE
from importer.streams.commands import run
from importer.verify.keyfiles import InvalidKey, ed25519_point_ok, read_key_file

if TYPE_CHECKING:
    from importer.input.opened import OpenedBundle

SIGNATURE_MEDIA_TYPE = "application/vnd.sneakernet.signature.v1+json"
ALGORITHM = "ed25519"
#: DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410); the raw key's 32 bytes follow.
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM_RE = re.compile(rb"-----BEGIN PUBLIC KEY-----\s*([A-Za-z0-9+/=\s]+?)\s*-----END PUBLIC KEY-----")
MAX_KEY_FILE = 64 * 1024
#: Test-only switch: force one backend ("cryptography", "openssl" or "none").
BACKEND_ENV = "SNEAKERNET_SIGNATURE_BACKEND"

_TRUST_HINT = "pass the publisher's public key with --trust PUBKEY (a .pub file, or a folder of them)"


class SignatureMissing(PolicyRejected):
    """The trust policy asks for a signature and the bundle has none."""

    reference = "signature-missing"


class UntrustedKey(PolicyRejected):
    """The bundle is signed, but not by a key the operator trusts."""

    reference = "untrusted-key"


class SignatureVerifierUnavailable(BundleError):
    """Neither the cryptography module nor an OpenSSL 3 command is available."""

    reference = "no-signature-verifier"
    exit_code = 2




# ============================================================================ keys


def fingerprint(raw_public_key: bytes) -> str:
    """``sha256:<hex>`` of the raw 32-byte Ed25519 public key."""
    return str(Digest.of_bytes(raw_public_key))


def public_key_pem(raw_public_key: bytes) -> bytes:
    """PEM SubjectPublicKeyInfo of a raw Ed25519 public key (what ``bundle keygen`` writes)."""
    body = base64.encodebytes(_SPKI_PREFIX + raw_public_key).replace(b"\n", b"")
    return b"-----BEGIN PUBLIC KEY-----\n" + body + b"\n-----END PUBLIC KEY-----\n"


def public_key_der(data: bytes) -> bytes:
    """The DER of the first ``PUBLIC KEY`` PEM block in ``data`` (SubjectPublicKeyInfo), or b""
    when there is none or it is not base64: the one PEM reader of our keys and cosign's."""
    m = _PEM_RE.search(data)
    if m is None:
        return b""
    try:
        return base64.b64decode(b"".join(m.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        return b""


def parse_public_key_pem(data: bytes, what: str) -> bytes:
    """The raw 32 bytes of an Ed25519 public key in PEM SubjectPublicKeyInfo form."""
    der = public_key_der(data)
    if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX) or \
            not ed25519_point_ok(der[len(_SPKI_PREFIX):]):
        raise InvalidKey(
            f"reading the public key {what}: expected an Ed25519 public key "
            "(PEM, '-----BEGIN PUBLIC KEY-----'), found something else",
            hint="use the PREFIX.pub file written by `bundle keygen -o PREFIX`",
        )
    return der[len(_SPKI_PREFIX):]


@dataclass(frozen=True)
class TrustedKey:
    path: str
    raw: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.raw)


def load_trusted_keys(paths: Sequence[str]) -> Tuple[TrustedKey, ...]:
    """Read every ``--trust`` argument: a public key file, or a folder whose ``*.pub`` files
    are all trusted (rotation: add the new key's file, later remove the old one)."""
    keys: List[TrustedKey] = []
    for given in paths:
        files = [given]
        if os.path.isdir(given):
            files = sorted(os.path.join(given, n) for n in os.listdir(given) if n.endswith(".pub"))
            if not files:
                raise InvalidKey(f"reading trusted keys from {given}: expected *.pub files, found none",
                                 hint=_TRUST_HINT)
        for path in files:
            data = read_key_file(path, MAX_KEY_FILE, "the public key", _TRUST_HINT)
            keys.append(TrustedKey(path, parse_public_key_pem(data, path)))
    return tuple(keys)


# ============================================================================ the file format


@dataclass(frozen=True)
class SignatureDoc:
    key_fingerprint: str
    signed_digest: str
    signature: bytes


def encode_signature(raw_bundle_json: bytes, signature: bytes, raw_public_key: bytes) -> bytes:
    """The bytes of ``bundle.json.sig`` for a signature over ``raw_bundle_json``."""
    doc = {
        "mediaType": SIGNATURE_MEDIA_TYPE,
        "algorithm": ALGORITHM,
        "keyFingerprint": fingerprint(raw_public_key),
        "signedFile": BUNDLE_JSON,
        "signedDigest": str(Digest.of_bytes(raw_bundle_json)),
        "signature": base64.b64encode(signature).decode("ascii"),
    }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def signature_fields(raw: bytes, media_type: str, signed_file: Optional[str] = None) -> SignatureDoc:
    """The fields every sneakernet signature document has (``bundle.json.sig``, a receipt's
    ``.sig``): a JSON object of ``media_type``, Ed25519, the key's fingerprint, the signed digest
    and a 64-byte base64 signature (and ``signedFile`` when given). ValueError names what is wrong."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("invalid JSON") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}")
    if doc.get("mediaType") != media_type:
        raise ValueError(f"mediaType {str(doc.get('mediaType'))[:80]!r}")
    if doc.get("algorithm") != ALGORITHM:
        raise ValueError(f"algorithm {str(doc.get('algorithm'))[:40]!r} (only {ALGORITHM} is supported)")
    if signed_file is not None and doc.get("signedFile") != signed_file:
        raise ValueError(f"signedFile {str(doc.get('signedFile'))[:80]!r}")
    fp, digest, sig = doc.get("keyFingerprint"), doc.get("signedDigest"), doc.get("signature")
    for name, value in (("keyFingerprint", fp), ("signedDigest", digest)):
        try:
            Digest.parse(value, what=name)
        except BundleError:
            raise ValueError(f"{name} {str(value)[:80]!r}") from None
    if not isinstance(sig, str) or len(sig) > 200:
        raise ValueError("no base64 signature")
    try:
        signature = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a signature that is not base64") from None
    if len(signature) != 64:
        raise ValueError(f"a signature of {len(signature)} bytes (Ed25519 signatures have 64)")
    return SignatureDoc(str(fp), str(digest), signature)


def parse_signature(raw: bytes) -> SignatureDoc:
    """Parse ``bundle.json.sig``; anything unexpected is a BadSignature."""
    try:
        return signature_fields(raw, SIGNATURE_MEDIA_TYPE, BUNDLE_JSON)
    except ValueError as e:
        raise BadSignature(
            f"reading {SIGNATURE_FILE}: expected a sneakernet signature document, found {e}",
            hint="the signature file was damaged or replaced; re-copy the bundle, or ask the publisher to re-sign it",
        ) from None


# ============================================================================ backends


def _cryptography_ed25519() -> Optional[Any]:
    try:
        return importlib.import_module("cryptography.hazmat.primitives.asymmetric.ed25519")
    except ImportError:
        return None


def _openssl() -> Optional[str]:
    path = shutil.which("openssl")
    if path is None:
        return None
    res = run([path, "version"], what="asking openssl for its version", check=False, timeout=30)
    m = re.match(rb"OpenSSL (\d+)\.", res.stdout)
    return path if res.returncode == 0 and m is not None and int(m.group(1)) >= 3 else None


def backend() -> str:
    """Which verifier this host would use: 'cryptography', 'openssl' or 'none'."""
    forced = os.environ.get(BACKEND_ENV, "")
    if forced in ("cryptography", "openssl", "none"):
        return forced
    if _cryptography_ed25519() is not None:
        return "cryptography"
    return "openssl" if _openssl() is not None else "none"


def verify_ed25519(raw_public_key: bytes, signature: bytes, data: bytes) -> Tuple[bool, str]:
    """(valid?, backend name). Raises SignatureVerifierUnavailable with no backend."""
    which = backend()
    if which == "cryptography":
        mod = _cryptography_ed25519()
        if mod is not None:
            exceptions = importlib.import_module("cryptography.exceptions")
            key = mod.Ed25519PublicKey.from_public_bytes(raw_public_key)
            try:
                key.verify(signature, data)
            except exceptions.InvalidSignature:
                return False, which
            return True, which
    if which in ("cryptography", "openssl"):
        openssl = _openssl()
        if openssl is not None:
            return _verify_openssl(openssl, raw_public_key, signature, data), "openssl"
    raise SignatureVerifierUnavailable(
        "verifying the bundle signature: expected the Python module 'cryptography' or the "
        "OpenSSL 3 command (`openssl pkeyutl -rawin`), found neither on this host",
        hint="install one of them (pip install cryptography / apt-get install openssl), or verify by "
        "hand as docs/security.md shows; nothing was loaded",
    )


def _verify_openssl(openssl: str, raw_public_key: bytes, signature: bytes, data: bytes) -> bool:
    """``openssl pkeyutl -verify -rawin`` over a private copy of exactly the bytes checked here."""
    tmp = tempfile.mkdtemp(prefix="sneakernet-sig-")
    try:
        paths = {"pub": os.path.join(tmp, "key.pub"), "sig": os.path.join(tmp, "sig.bin"),
                 "in": os.path.join(tmp, BUNDLE_JSON)}
        for name, content in (("pub", public_key_pem(raw_public_key)), ("sig", signature), ("in", data)):
            with open(paths[name], "wb") as f:
                f.write(content)
        res = run([openssl, "pkeyutl", "-verify", "-pubin", "-inkey", paths["pub"], "-rawin",
                   "-in", paths["in"], "-sigfile", paths["sig"]],
                  what="verifying the bundle signature with openssl", check=False, timeout=120)
        return res.returncode == 0 and b"Signature Verified Successfully" in res.stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ============================================================================ the policy


@dataclass(frozen=True)
class TrustPolicy:
    """``--trust`` keys and ``--require-signature``. Giving any trusted key also requires a
    signature: a bundle whose signature was stripped is refused, not silently accepted."""

    keys: Tuple[TrustedKey, ...] = ()
    require: bool = False

    @property
    def requires_signature(self) -> bool:
        return self.require or bool(self.keys)


@dataclass
class SignatureCheck:
    """What the signature step found; ``raw_bundle_json`` are the exact bytes it judged."""

    status: str  # "verified", "not-checked" (signed, no policy), "unsigned"
    bundle_digest: str
    raw_bundle_json: bytes = field(repr=False)
    key_fingerprint: Optional[str] = None
    key_file: Optional[str] = None
    backend: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "status": self.status,
            "algorithm": ALGORITHM if self.key_fingerprint else None,
            "keyFingerprint": self.key_fingerprint,
            "trustedKeyFile": self.key_file,
            "backend": self.backend,
            "signedDigest": self.bundle_digest if self.status == "verified" else None,
        }

    def line(self) -> str:
        if self.status == "verified":
            return (f"signature: verified (ed25519 key {self.key_fingerprint}, trusted via {self.key_file}, "
                    f"checked with {self.backend})")
        if self.status == "not-checked":
            return (f"signature: present, claims key {self.key_fingerprint}, NOT checked "
                    "(pass --trust PUBKEY to check it)")
        return "signature: none (pass --require-signature to refuse unsigned bundles)"


def check_signature(bundle: OpenedBundle, policy: TrustPolicy) -> SignatureCheck:
    """The first step of every import: the trust policy over the bundle.json and signature bytes
    read when the bundle was opened (importer/input/opened.py), the very bytes every later step uses.
    Raises a PolicyRejected subclass, or SignatureVerifierUnavailable."""
    return check_signature_bytes(bundle.raw_bundle_json, bundle.raw_signature, policy, where=bundle.path)


def check_signature_bytes(raw: bytes, raw_sig: Optional[bytes], policy: TrustPolicy, *,
                          where: str) -> SignatureCheck:
    """The trust policy over bundle.json bytes and the signature file's bytes (None: absent).
    For bundles read from a tar or parts, pass the members' bytes (bounded reads)."""
    root = where
    digest = str(Digest.of_bytes(raw))
    if raw_sig is None:
        if policy.requires_signature:
            raise SignatureMissing(
                f"checking the signature of {root}: expected {SIGNATURE_FILE} (the trust policy requires "
                "a signed bundle), found none",
                hint="nothing was loaded; ask the publisher for a bundle exported with --sign-key "
                "(or signed with `bundle sign`)",
            )
        return SignatureCheck("unsigned", digest, raw)
    doc = parse_signature(raw_sig)
    if not policy.requires_signature:
        return SignatureCheck("not-checked", digest, raw, key_fingerprint=doc.key_fingerprint)
    key = next((k for k in policy.keys if k.fingerprint == doc.key_fingerprint), None)
    if key is None:
        trusted = ", ".join(f"{k.fingerprint} ({k.path})" for k in policy.keys) or "none given"
        raise UntrustedKey(
            f"checking the signature of {root}: expected a key this host trusts ({trusted}), "
            f"found a signature by key {doc.key_fingerprint}",
            hint="nothing was loaded; if that key is really the publisher's, add its .pub file with --trust "
            "(compare the fingerprint with the publisher over another channel first)",
        )
    if doc.signed_digest != digest:
        raise BadSignature(
            f"checking the signature of {root}: expected {BUNDLE_JSON} to hash to the signed "
            f"{doc.signed_digest}, found {digest} ({BUNDLE_JSON} was changed after signing)",
            hint="nothing was loaded; do not import this bundle: get a fresh copy from the publisher",
        )
    ok, used = verify_ed25519(key.raw, doc.signature, raw)
    if not ok:
        raise BadSignature(
            f"checking the signature of {root}: expected a valid ed25519 signature by {key.fingerprint} "
            f"over {BUNDLE_JSON} ({digest}), found one that does not verify",
            hint="nothing was loaded; do not import this bundle: get a fresh copy from the publisher",
        )
    return SignatureCheck("verified", digest, raw, key_fingerprint=key.fingerprint, key_file=key.path,
                          backend=used)
