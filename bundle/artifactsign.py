"""``bundle export --files DIR --artifact-ref NAME:TAG --sign-artifacts-key KEY``: a cosign
signature of each file artifact's manifest (schema 3.7; docs/files.md "Signatures"), written as
``cosign sign --key`` writes one, so ``bundle-import --require-signed KEY.pub`` admits the files
and ``cosign verify --key KEY.pub`` accepts them in the registry they are pushed to.

The signature is an OCI image manifest of one layer, the simple-signing payload
``{"critical":{"identity":{"docker-reference":REPO},"image":{"docker-manifest-digest":DIGEST},
"type":"cosign container image signature"},"optional":null}`` (media type
``application/vnd.dev.cosign.simplesigning.v1+json``; REPO the repository of the artifact's ref,
DIGEST its manifest's), with the base64 signature in its ``dev.cosignproject.cosign/signature``
annotation: ECDSA P-256 over SHA-256 of the payload (ASN.1 DER) or Ed25519 over the payload. It
is handed on under cosign's tag ``sha256-<hex>.sig``. bundle.json records it as a 3.5 signature
record of the artifact (importer/format/artifacts.py ``check_file_signatures``).

Keys: an unencrypted PEM private key, PKCS#8 (or SEC1 ``EC PRIVATE KEY``) ECDSA P-256
(``openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256``) or Ed25519 (``openssl
genpkey -algorithm ed25519``; ``bundle keygen`` without a passphrase). cosign's own encrypted
``cosign.key`` (scrypt + secretbox) and encrypted PEM keys are not read."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from typing import Any, Callable, Optional, Sequence, Tuple

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundle.blobstore import BlobStore
from bundle.fileartifact import FileSet
from bundle.helmchart import ChartPackage, carry_artifacts
from importer.format.artifacts import ArtifactRecord, derived_tag
from importer.format.digest import BlobRef
from importer.format.fileartifacts import FileArtifact
from importer.format.limits import read_file_limited
from importer.format.mediatypes import OCI_MANIFEST
from importer.format.reference import split_reference
from importer.verify.cosign import COSIGN_CRITICAL_TYPE, SIGNATURE_ANNOTATION, SIMPLE_SIGNING
from importer.verify.keyfiles import InvalidKey

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MAX_PRIVATE_KEY = 64 * 1024
SigningKey = Any  # ec.EllipticCurvePrivateKey (P-256) or Ed25519PrivateKey


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def load_artifact_key(path: str) -> SigningKey:
    """The private key of ``--sign-artifacts-key``: ECDSA P-256 or Ed25519, PEM; a typed error
    (``invalid-key``, exit 2) for anything else, before the export starts."""
    what = f"reading the artifact signing key {path}"
    try:
        data = read_file_limited(path, MAX_PRIVATE_KEY, path)
    except OSError as e:
        raise InvalidKey(f"{what}: expected a readable file, found {e.strerror or e}") from None
    if b"ENCRYPTED COSIGN PRIVATE KEY" in data or b"ENCRYPTED SIGSTORE PRIVATE KEY" in data:
        raise InvalidKey(f"{what}: expected a PEM private key, found cosign's encrypted key format",
                         hint="sign with a PEM key: openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 "
                         "-out artifacts.key (its public key: openssl pkey -in artifacts.key -pubout)")
    if b"ENCRYPTED PRIVATE KEY" in data:
        raise InvalidKey(f"{what}: expected an unencrypted PEM private key, found an encrypted one",
                         hint="decrypt a copy on the signing host (openssl pkey -in KEY -out PLAIN.key) and keep it "
                         "there")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        found = f"no PEM private key ({str(e)[:80]})"
        raise InvalidKey(f"{what}: expected an ECDSA P-256 or Ed25519 private key, found {found}",
                         hint="openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out artifacts.key, "
                         "or bundle keygen -o PREFIX") from None
    if isinstance(key, Ed25519PrivateKey):
        return key
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    raise InvalidKey(f"{what}: expected an ECDSA P-256 or Ed25519 private key, found {type(key).__name__}"
                     f"{' on ' + key.curve.name if isinstance(key, ec.EllipticCurvePrivateKey) else ''}",
                     hint="cosign verifies P-256 and Ed25519 keys: make one with openssl genpkey")


def _sign(key: SigningKey, payload: bytes) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        return key.sign(payload)
    return bytes(key.sign(payload, ec.ECDSA(hashes.SHA256())))


def signature_of(store: BlobStore, art: FileArtifact, key: SigningKey) -> ArtifactRecord:
    """Write the cosign signature of ``art``'s manifest into ``store``; its record."""
    digest = str(art.manifest.digest)
    payload = _json({"critical": {"identity": {"docker-reference": split_reference(art.ref)[0]},
                                  "image": {"docker-manifest-digest": digest},
                                  "type": COSIGN_CRITICAL_TYPE}, "optional": None})
    layer = store.write_bytes(payload)
    config = store.write_bytes(_json({
        "architecture": "", "os": "", "config": {}, "created": "0001-01-01T00:00:00Z",
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(payload).hexdigest()]}}))
    manifest = store.write_bytes(_json({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": str(config.digest), "size": config.size},
        "layers": [{"mediaType": SIMPLE_SIGNING, "digest": str(layer.digest), "size": layer.size,
                    "annotations": {SIGNATURE_ANNOTATION: base64.b64encode(_sign(key, payload)).decode("ascii")}}]}))
    return ArtifactRecord("signature", art.manifest.digest, BlobRef(OCI_MANIFEST, manifest.digest, manifest.size),
                          (BlobRef(OCI_CONFIG, config.digest, config.size),
                           BlobRef(SIMPLE_SIGNING, layer.digest, layer.size)),
                          derived_tag("signature", art.manifest.digest))


def sign_artifacts(store: BlobStore, artifacts: Sequence[FileArtifact],
                   keys: Sequence[SigningKey]) -> Tuple[FileArtifact, ...]:
    """Each artifact with a signature by each of ``keys`` (none: as they are)."""
    return tuple(dataclasses.replace(a, signatures=tuple(signature_of(store, a, k) for k in keys)) if keys else a
                 for a in artifacts)


def carry_signed(store: BlobStore, files: Optional[FileSet], charts: Sequence[ChartPackage],
                 on_bytes: Optional[Callable[[int], None]], keys: Sequence[SigningKey]) -> Tuple[FileArtifact, ...]:
    """The export's file artifacts (bundle/helmchart.py ``carry_artifacts``), each signed by ``keys``."""
    return sign_artifacts(store, carry_artifacts(store, files, charts, on_bytes), keys)
