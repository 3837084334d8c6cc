"""cosign signatures carried with the images (bundle schema 3.5 ``artifacts``), checked offline
against the publisher's public keys: ``bundle export --require-signed KEY.pub`` and
``bundle-import --require-signed KEY.pub`` run this one check.

A cosign signature (key-based, the tag scheme ``sha256-<hex>.sig`` or an OCI 1.1 referrer) is an
image manifest whose layers (mediaType ``application/vnd.dev.cosign.simplesigning.v1+json``) each
hold a simple-signing payload and carry the signature in the annotation
``dev.cosignproject.cosign/signature`` (base64): ECDSA P-256 over SHA-256 of the payload bytes
(ASN.1 DER), or Ed25519 over the payload bytes. An image passes when one payload verifies by one
of the keys AND names the image: ``critical.image.docker-manifest-digest`` is the digest of the
carried manifest (or of its carried index) and ``critical.identity.docker-reference`` is the
repository of one of the image's names or the one the signature was read from.

Keys are PEM SubjectPublicKeyInfo (``cosign generate-key-pair`` writes cosign.pub so), parsed with
the standard library. Verification: the ``cryptography`` module when importable, else
``openssl dgst -sha256 -verify`` (ECDSA) / ``openssl pkeyutl -verify -rawin`` (Ed25519), as
importer/verify/signature.py does for bundle signatures. Transparency logs and certificates
(keyless signing) are not checked: there is no network on the offline side."""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from importer.errors import DigestMismatch, PolicyRejected
from importer.format.artifacts import ArtifactRecord
from importer.format.digest import Digest, is_digest
from importer.format.limits import MAX_CONFIG
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.reference import split_reference
from importer.input.opened import OpenedBundle
from importer.streams.commands import run
from importer.verify.signature import BACKEND_ENV, InvalidKey, SignatureVerifierUnavailable, _openssl, public_key_der

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
MAX_KEY_FILE = 64 * 1024
MAX_PAYLOAD = 1024 * 1024
#: DER prefixes of SubjectPublicKeyInfo: EC P-256 (id-ecPublicKey, prime256v1; an uncompressed
#: point of 65 bytes follows) and Ed25519 (RFC 8410; 32 bytes follow)
_P256_PREFIX = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200")
_ED25519_PREFIX = bytes.fromhex("302a300506032b6570032100")
ECDSA_P256 = "ecdsa-p256"
ED25519 = "ed25519"

#: reads a blob of the bundle (its digest checked), at most ``limit`` bytes
BlobReader = Callable[[Digest, int], bytes]


class ImageUnsigned(PolicyRejected):
    """``--require-signed``: an image carries no cosign signature at all (exported without
    ``--require-signed`` from an unsigned image, with ``--no-referrers``, or from a source that
    keeps no signatures). Nothing was written or loaded."""

    reference = "image-unsigned"


class ImageSignatureInvalid(PolicyRejected):
    """``--require-signed``: an image carries cosign signatures, but none verifies by one of the
    keys for this image (another key, a tampered signature or payload, a payload naming another
    digest or repository). Nothing was written or loaded."""

    reference = "image-signature-invalid"


@dataclass(frozen=True)
class CosignKey:
    path: str
    der: bytes
    algorithm: str

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the DER SubjectPublicKeyInfo."""
        return str(Digest.of_bytes(self.der))

    def pem(self) -> bytes:
        body = base64.encodebytes(self.der).replace(b"\n", b"")
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        return b"-----BEGIN PUBLIC KEY-----\n" + b"\n".join(lines) + b"\n-----END PUBLIC KEY-----\n"


def parse_cosign_key(data: bytes, path: str) -> CosignKey:
    der = public_key_der(data)
    if len(der) == len(_P256_PREFIX) + 65 and der.startswith(_P256_PREFIX) and der[len(_P256_PREFIX)] == 4:
        return CosignKey(path, der, ECDSA_P256)
    if len(der) == len(_ED25519_PREFIX) + 32 and der.startswith(_ED25519_PREFIX):
        return CosignKey(path, der, ED25519)
    raise InvalidKey(f"reading the signing public key {path}: expected an ECDSA P-256 or Ed25519 public key "
                     "(PEM, '-----BEGIN PUBLIC KEY-----'), found something else",
                     hint="use the cosign.pub file `cosign generate-key-pair` wrote (or `cosign public-key`)")


def load_cosign_keys(paths: Sequence[str]) -> Tuple[CosignKey, ...]:
    keys: List[CosignKey] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_KEY_FILE + 1)
        except OSError as e:
            raise InvalidKey(f"reading the signing public key {path}: expected a readable file, found "
                             f"{e.strerror or e}", hint="check the path given to --require-signed") from e
        if len(data) > MAX_KEY_FILE:
            raise InvalidKey(f"reading the signing public key {path}: expected at most {MAX_KEY_FILE} bytes, "
                             "found more", hint="give the cosign.pub file, not something else")
        keys.append(parse_cosign_key(data, path))
    return tuple(keys)


# ============================================================================ verification


def _backend() -> str:
    forced = os.environ.get(BACKEND_ENV, "")
    if forced in ("cryptography", "openssl", "none"):
        return forced
    try:
        importlib.import_module("cryptography.hazmat.primitives.serialization")
    except ImportError:
        return "openssl" if _openssl() is not None else "none"
    return "cryptography"


def verify_payload(key: CosignKey, signature: bytes, payload: bytes) -> bool:
    """True when ``signature`` over ``payload`` verifies by ``key``."""
    which = _backend()
    if which == "cryptography":
        serialization = importlib.import_module("cryptography.hazmat.primitives.serialization")
        exceptions = importlib.import_module("cryptography.exceptions")
        public = serialization.load_der_public_key(key.der)
        try:
            if key.algorithm == ECDSA_P256:
                ec = importlib.import_module("cryptography.hazmat.primitives.asymmetric.ec")
                hashes = importlib.import_module("cryptography.hazmat.primitives.hashes")
                public.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
            else:
                public.verify(signature, payload)
        except exceptions.InvalidSignature:
            return False
        return True
    openssl = _openssl() if which == "openssl" else None
    if openssl is None:
        raise SignatureVerifierUnavailable(
            "verifying image signatures (--require-signed): expected the Python module 'cryptography' or the "
            "OpenSSL 3 command, found neither on this host",
            hint="install one of them (pip install cryptography / apt-get install openssl); nothing was loaded")
    return _verify_openssl(openssl, key, signature, payload)


def _verify_openssl(openssl: str, key: CosignKey, signature: bytes, payload: bytes) -> bool:
    tmp = tempfile.mkdtemp(prefix="sneakernet-cosign-")
    try:
        paths = {"pub": os.path.join(tmp, "cosign.pub"), "sig": os.path.join(tmp, "sig.bin"),
                 "in": os.path.join(tmp, "payload.json")}
        for name, content in (("pub", key.pem()), ("sig", signature), ("in", payload)):
            with open(paths[name], "wb") as f:
                f.write(content)
        if key.algorithm == ECDSA_P256:
            argv = [openssl, "dgst", "-sha256", "-verify", paths["pub"], "-signature", paths["sig"], paths["in"]]
        else:
            argv = [openssl, "pkeyutl", "-verify", "-pubin", "-inkey", paths["pub"], "-rawin", "-in", paths["in"],
                    "-sigfile", paths["sig"]]
        res = run(argv, what="verifying an image signature with openssl", check=False, timeout=120)
        out = res.stdout
        return res.returncode == 0 and (b"Verified OK" in out or b"Signature Verified Successfully" in out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class SignedImage:
    image: str
    digest: str
    key: CosignKey
    signature: str  # the digest of the signature manifest
    identity: str

    def to_dict(self) -> Dict[str, Any]:
        return {"image": self.image, "digest": self.digest, "keyPath": self.key.path,
                "keyFingerprint": self.key.fingerprint, "algorithm": self.key.algorithm,
                "signatureManifest": self.signature, "identity": self.identity}


def repository_of(ref: str) -> str:
    """``HOST/REPO`` of ``HOST/REPO:TAG`` or ``HOST/REPO@sha256:...``."""
    return split_reference(ref)[0]


def _subjects(image: ImageRecord, read: BlobReader) -> Set[str]:
    """The digests a signature may name for ``image``: its manifests, its carried index, and an
    index one platform was picked from (artifact kind ``index``) when it lists a carried manifest."""
    found = {str(v.manifest.digest) for v in image.variants}
    if image.index is not None:
        found.add(str(image.index.digest))
    for art in image.artifacts:
        if art.kind != "index" or art.subject != art.manifest.digest:
            continue
        try:
            doc = json.loads(read(art.manifest.digest, MAX_CONFIG).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        listed = doc.get("manifests") if isinstance(doc, dict) else None
        if isinstance(listed, list) and found & {d.get("digest") for d in listed if isinstance(d, dict)}:
            found.add(str(art.manifest.digest))
    return found


def _payload_claims(payload: bytes) -> Tuple[str, str]:
    """(docker-manifest-digest, docker-reference) of a simple-signing payload, or ("", "")."""
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "", ""
    critical = doc.get("critical") if isinstance(doc, dict) else None
    if not isinstance(critical, dict):
        return "", ""
    image: Dict[str, Any] = critical["image"] if isinstance(critical.get("image"), dict) else {}
    identity: Dict[str, Any] = critical["identity"] if isinstance(critical.get("identity"), dict) else {}
    digest, ref = image.get("docker-manifest-digest"), identity.get("docker-reference")
    return (digest if isinstance(digest, str) else ""), (ref if isinstance(ref, str) else "")


def _signature_layers(art: ArtifactRecord, read: BlobReader) -> List[Tuple[Dict[str, Any], Digest]]:
    """The simple-signing layers of one signature manifest: (descriptor, payload digest)."""
    try:
        doc = json.loads(read(art.manifest.digest, MAX_CONFIG).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return []
    layers = doc.get("layers") if isinstance(doc, dict) else None
    return [(d, Digest.parse(d["digest"])) for d in (layers if isinstance(layers, list) else [])
            if isinstance(d, dict) and d.get("mediaType") == SIMPLE_SIGNING and is_digest(d.get("digest"))]


def check_image(image: ImageRecord, keys: Sequence[CosignKey], read: BlobReader, doing: str) -> SignedImage:
    """The first signature carried with ``image`` that one of ``keys`` verifies for it; else
    ImageUnsigned (none carried) or ImageSignatureInvalid (every reason why not)."""
    subjects = _subjects(image, read)
    identities = {repository_of(r) for r in image.refs}
    why: List[str] = []
    carried = 0
    for art in image.artifacts:
        layers = _signature_layers(art, read) if art.kind in ("signature", "referrer") else []
        for desc, payload_digest in layers:
            carried += 1
            annotations: Dict[str, Any] = desc["annotations"] if isinstance(desc.get("annotations"), dict) else {}
            try:
                sig = base64.b64decode(str(annotations.get(SIGNATURE_ANNOTATION, "")), validate=True)
            except (binascii.Error, ValueError):
                sig = b""
            payload = read(payload_digest, MAX_PAYLOAD)
            key = next((k for k in keys if sig and verify_payload(k, sig, payload)), None)
            signed_digest, reference = _payload_claims(payload)
            where = f"{art.manifest.digest.short} ({art.tag or art.kind})"
            if key is None:
                why.append(f"{where}: does not verify by any of the {len(keys)} key(s)")
            elif signed_digest not in subjects:
                why.append(f"{where}: signs {signed_digest[:19] or 'no digest'}, not this image's manifest")
            elif reference not in identities | ({art.repository} if art.repository else set()):
                why.append(f"{where}: names the repository {reference!r}, not "
                           f"{', '.join(sorted(identities)) or art.repository or '?'}")
            else:
                return SignedImage(image.name, signed_digest, key, str(art.manifest.digest), reference)
    if not carried:
        raise ImageUnsigned(
            f"{doing}: expected {image.name} to carry a cosign signature by {_key_names(keys)}, found none",
            hint="sign the image in the source registry (cosign sign --key cosign.key REG/REPO@DIGEST) and "
            "export it again (without --no-referrers)")
    raise ImageSignatureInvalid(
        f"{doing}: expected a cosign signature on {image.name} by {_key_names(keys)}, found {carried} that "
        "do not verify for it", context="\n".join(why[:20]),
        hint="the image or its signature was changed, or it was signed with another key; do not use it")


def _key_names(keys: Sequence[CosignKey]) -> str:
    return ", ".join(k.path for k in keys) if len(keys) <= 3 else f"one of {len(keys)} keys"


def checked_reader(read_file: Callable[[str, int, str], bytes], doing: str) -> BlobReader:
    """A BlobReader over ``read_file(relative path, limit, what)`` that hashes what it read: the
    check runs before the bundle's own verification, so it trusts no blob unhashed."""
    def read(digest: Digest, limit: int) -> bytes:
        what = f"{doing}: reading the signature blob {digest.short}"
        data = read_file(digest.blob_path, limit, what)
        if Digest.of_bytes(data) != digest:
            raise DigestMismatch(f"{what}: expected the bytes of {digest}, found {Digest.of_bytes(data)}",
                                 hint="the bundle was modified or damaged; re-copy it or re-export it")
        return data
    return read


def check_bundle(manifest: BundleManifest, keys: Sequence[CosignKey], read: BlobReader,
                 doing: str) -> List[SignedImage]:
    """Every image of the bundle signed by one of ``keys`` (the first that is not: raised)."""
    return [check_image(image, keys, read, doing) for image in manifest.images]


def images_signed(bundle: OpenedBundle, keys: Sequence[str], major: Optional[int], *,
                  quiet: bool, on_notice: Callable[[str], None]) -> List[Dict[str, Any]]:
    """``--require-signed`` (the walk's ``image-signatures`` step, before the engine is asked
    anything): every image of the opened bundle carries a cosign signature by one of ``keys``, its
    blobs hashed as they are read; the receipt's ``imageSignatures``. A schema 1/2 bundle
    (``major``) carries none."""
    doing = "importing with --require-signed"
    cosign_keys = load_cosign_keys(keys)
    if major is not None:
        raise ImageUnsigned(f"{doing}: expected a schema 3.5 bundle carrying image signatures, found schema {major}",
                            hint="export the images again from their registry (bundle export docker://...)")
    signed = check_bundle(bundle.manifest(), cosign_keys, checked_reader(bundle.read, doing), doing)
    if not quiet:
        for s in signed:
            on_notice(f"image {s.image}: cosign signature by {s.key.path} ({s.key.fingerprint[:19]}) verified")
    return [s.to_dict() for s in signed]
