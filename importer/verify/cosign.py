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

from importer.errors import DigestMismatch, LimitExceeded, PolicyRejected
from importer.format.artifacts import ArtifactRecord
from importer.format.digest import Digest, is_digest
from importer.format.fileartifacts import FileArtifact
from importer.format.limits import MAX_CONFIG, MAX_INDEX
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.reference import canonical_repository, split_reference
from importer.input.opened import OpenedBundle
from importer.streams.commands import run
from importer.verify.keyfiles import InvalidKey, ed25519_point_ok, p256_point_ok, read_key_file
from importer.verify.signature import BACKEND_ENV, SignatureVerifierUnavailable, _openssl, public_key_der

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
COSIGN_CRITICAL_TYPE = "cosign container image signature"
MAX_KEY_FILE = 64 * 1024
MAX_PAYLOAD = 1024 * 1024
#: cosign's own bound on the layers of one signature manifest (pkg/oci/remote/signatures.go, maxLayers)
MAX_SIGNATURE_LAYERS = 1000
#: distinct (payload, signature) pairs weighed for one image, and the bytes its check reads: a
#: hostile bundle cannot make the policy run for minutes
MAX_SIGNATURES_PER_IMAGE = 1000
MAX_POLICY_BYTES = 64 * 1024 * 1024
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
    if len(der) == len(_P256_PREFIX) + 65 and der.startswith(_P256_PREFIX):
        if not p256_point_ok(der[len(_P256_PREFIX):]):
            raise InvalidKey(f"reading the signing public key {path}: expected a point on the P-256 curve, found "
                             "one off it", hint="the key file is damaged or forged; get cosign.pub from its publisher")
        return CosignKey(path, der, ECDSA_P256)
    if len(der) == len(_ED25519_PREFIX) + 32 and der.startswith(_ED25519_PREFIX):
        if not ed25519_point_ok(der[len(_ED25519_PREFIX):]):
            raise InvalidKey(f"reading the signing public key {path}: expected an Ed25519 point, found bytes that "
                             "decode to none", hint="the key file is damaged or forged; get the key from its publisher")
        return CosignKey(path, der, ED25519)
    raise InvalidKey(f"reading the signing public key {path}: expected an ECDSA P-256 or Ed25519 public key "
                     "(PEM, '-----BEGIN PUBLIC KEY-----'), found something else",
                     hint="use the cosign.pub file `cosign generate-key-pair` wrote (or `cosign public-key`)")


def load_cosign_keys(paths: Sequence[str]) -> Tuple[CosignKey, ...]:
    keys: List[CosignKey] = []
    for path in paths:
        data = read_key_file(path, MAX_KEY_FILE, "the signing public key",
                             "give the cosign.pub file to --require-signed, not something else")
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
    digest: str  # the digest the signature names: the image's manifest, or the index listing it
    key: CosignKey
    signature: str  # the digest of the signature manifest
    identity: str
    #: every manifest the bundle carries for the image, and the signed digest that covers it
    #: (itself, or the signed index that lists it)
    covers: Tuple[Tuple[str, str], ...] = ()
    kind: str = ""  # "file-artifact": ``image`` is a file artifact's ref (3.6); "" an image

    def to_dict(self) -> Dict[str, Any]:
        return {**({"kind": self.kind} if self.kind else {}), "image": self.image, "digest": self.digest,
                "keyPath": self.key.path,
                "keyFingerprint": self.key.fingerprint, "algorithm": self.key.algorithm,
                "signatureManifest": self.signature, "identity": self.identity,
                "manifests": [{"digest": d, "signedAs": by} for d, by in self.covers]}


def repository_of(ref: str) -> str:
    """``HOST/REPO`` of ``HOST/REPO:TAG`` or ``HOST/REPO@sha256:...``."""
    return split_reference(ref)[0]


def needed_manifests(image: ImageRecord) -> List[Digest]:
    """Every manifest of ``image`` that an import may load, write or push and a tag may name:
    each platform carried, and the carried index naming them. The policy's rule: each must be
    named by a verified signature, or listed by digest in an index whose own signature verified."""
    found = [v.manifest.digest for v in image.variants]
    return found + ([image.index.digest] if image.index is not None else [])


def _index_candidates(image: ImageRecord) -> Set[Digest]:
    """Where a signed index may be read from: the image's carried index, and the index one platform
    was picked from (kind ``index``). The record only says where the bytes are; what they vouch
    for comes from the signature over their digest, and the bytes are hashed as they are read."""
    found = {a.manifest.digest for a in image.artifacts if a.kind == "index" and a.subject == a.manifest.digest}
    return found | ({image.index.digest} if image.index is not None else set())


def _payload_claims(payload: bytes) -> Tuple[str, str]:
    """(docker-manifest-digest, docker-reference) of a simple-signing payload, or ("", "") when it
    is none: its ``critical.type`` must be cosign's (sigstore's payload check, ``Valid``/
    ``unmarshalAndValidate``: "unknown critical type for Cosign signature payload")."""
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "", ""
    critical = doc.get("critical") if isinstance(doc, dict) else None
    if not isinstance(critical, dict) or critical.get("type") != COSIGN_CRITICAL_TYPE:
        return "", ""
    image: Dict[str, Any] = critical["image"] if isinstance(critical.get("image"), dict) else {}
    identity: Dict[str, Any] = critical["identity"] if isinstance(critical.get("identity"), dict) else {}
    digest, ref = image.get("docker-manifest-digest"), identity.get("docker-reference")
    return (digest if isinstance(digest, str) else ""), (ref if isinstance(ref, str) else "")


def _json_object(raw: bytes) -> Dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


class _Reads:
    """The blobs one check reads, each once by digest, within the policy's bounds."""

    def __init__(self, read: BlobReader, doing: str) -> None:
        self.read, self.doing = read, doing
        self.cache: Dict[Tuple[Digest, int], bytes] = {}
        self.total = 0

    def blob(self, digest: Digest, limit: int) -> bytes:
        key = (digest, limit)
        if key not in self.cache:
            data = self.read(digest, limit)
            self.total += len(data)
            if self.total > MAX_POLICY_BYTES:
                raise LimitExceeded(f"{self.doing}: expected the signatures of one image to hold at most "
                                    f"{MAX_POLICY_BYTES} bytes, found more", hint=_LIMIT_HINT)
            self.cache[key] = data
        return self.cache[key]


_LIMIT_HINT = "the bundle carries more signature material than any publisher writes; do not use it"


def _signature_layers(art: ArtifactRecord, reads: _Reads) -> List[Tuple[Dict[str, Any], Digest]]:
    """The simple-signing layers of one signature manifest: (descriptor, payload digest); more
    than cosign reads (MAX_SIGNATURE_LAYERS, its ``maxLayers``) is refused."""
    layers = _json_object(reads.blob(art.manifest.digest, MAX_CONFIG)).get("layers")
    layers = layers if isinstance(layers, list) else []
    if len(layers) > MAX_SIGNATURE_LAYERS:
        raise LimitExceeded(f"{reads.doing}: expected at most {MAX_SIGNATURE_LAYERS} layers in the signature "
                            f"manifest {art.manifest.digest.short}, found {len(layers)}", hint=_LIMIT_HINT)
    return [(d, Digest.parse(d["digest"])) for d in layers
            if isinstance(d, dict) and d.get("mediaType") == SIMPLE_SIGNING and is_digest(d.get("digest"))]


@dataclass(frozen=True)
class _Proof:
    key: CosignKey
    signature: str  # the signature manifest's digest
    identity: str


def _proofs(name: str, records: Sequence[ArtifactRecord], wanted: Set[str], identities: Set[str],
            keys: Sequence[CosignKey], reads: _Reads, why: List[str],
            what: str = "image") -> Tuple[int, Dict[str, _Proof]]:
    """(signature layers carried, signed digest -> the first verified signature naming it). A
    payload is believed only when a key verifies it, it names a digest in ``wanted`` (what the
    image or file artifact ``name`` may need), and its identity is one of ``identities`` (the
    repository of one of its names: bundle.json's ``repository`` fields are not evidence). Each
    (payload, signature) pair is weighed once."""
    allowed = {canonical_repository(i) for i in identities}
    proofs: Dict[str, _Proof] = {}
    seen: Set[Tuple[Digest, str]] = set()
    carried = 0
    for art in (a for a in records if a.kind in ("signature", "referrer")):
        for desc, payload_digest in _signature_layers(art, reads):
            carried += 1
            annotations: Dict[str, Any] = desc["annotations"] if isinstance(desc.get("annotations"), dict) else {}
            encoded = str(annotations.get(SIGNATURE_ANNOTATION, ""))
            if (payload_digest, encoded) in seen:
                continue
            seen.add((payload_digest, encoded))
            if len(seen) > MAX_SIGNATURES_PER_IMAGE:
                raise LimitExceeded(f"{reads.doing}: expected at most {MAX_SIGNATURES_PER_IMAGE} signatures carried "
                                    f"with {name}, found more", hint=_LIMIT_HINT)
            signed_digest, reference = _payload_claims(reads.blob(payload_digest, MAX_PAYLOAD))
            where = f"{art.manifest.digest.short} ({art.tag or art.kind})"
            if signed_digest not in wanted:
                why.append(f"{where}: signs {signed_digest[:19] or 'no digest'}, not this {what}'s manifest")
                continue
            if canonical_repository(reference) not in allowed:  # Docker Hub's spellings are one name
                why.append(f"{where}: names the repository {reference!r}, not {', '.join(sorted(identities)) or '?'}")
                continue
            try:
                sig = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                sig = b""
            payload = reads.blob(payload_digest, MAX_PAYLOAD)
            key = next((k for k in keys if sig and verify_payload(k, sig, payload)), None)
            if key is None:
                why.append(f"{where}: does not verify by any of the {len(keys)} key(s)")
            else:
                proofs.setdefault(signed_digest, _Proof(key, str(art.manifest.digest), reference))
    return carried, proofs


def _coverage(image: ImageRecord, proofs: Dict[str, _Proof], reads: _Reads) -> Dict[str, str]:
    """Needed manifest digest -> the signed digest that covers it: itself, or a signed index (its
    bytes read by the signed digest, hashed) that lists it by digest."""
    needed = {str(d) for d in needed_manifests(image)}
    covered = {d: d for d in needed if d in proofs}
    for index in sorted(_index_candidates(image), key=str):
        if str(index) not in proofs:
            continue
        listed = _json_object(reads.blob(index, MAX_INDEX)).get("manifests")
        for entry in listed if isinstance(listed, list) else []:
            digest = entry.get("digest") if isinstance(entry, dict) else None
            if isinstance(digest, str) and digest in needed:
                covered.setdefault(digest, str(index))
    return covered


def check_image(image: ImageRecord, keys: Sequence[CosignKey], read: BlobReader, doing: str) -> SignedImage:
    """``image`` admitted by ``keys``: every manifest it carries (needed_manifests) is named by a
    verified signature or listed in a signed index; else ImageUnsigned (no signature carried) or
    ImageSignatureInvalid (every reason why not, and which manifests no signature covers)."""
    reads = _Reads(read, doing)
    why: List[str] = []
    wanted = {str(d) for d in needed_manifests(image)} | {str(d) for d in _index_candidates(image)}
    carried, proofs = _proofs(image.name, image.artifacts, wanted, {repository_of(r) for r in image.refs}, keys,
                              reads, why)
    if not carried:
        raise ImageUnsigned(
            f"{doing}: expected {image.name} to carry a cosign signature by {_key_names(keys)}, found none",
            hint="sign the image in the source registry (cosign sign --key cosign.key REG/REPO@DIGEST) and "
            "export it again (without --no-referrers)")
    covered = _coverage(image, proofs, reads)
    needed = [str(d) for d in needed_manifests(image)]
    unsigned = [d for d in needed if d not in covered]
    if not unsigned:
        top = needed[-1] if image.index is not None else needed[0]
        proof = proofs[covered[top]]
        return SignedImage(image.name, covered[top], proof.key, proof.signature, proof.identity,
                           tuple((d, covered[d]) for d in needed))
    if proofs:
        names = {str(v.manifest.digest): v.platform_text() for v in image.variants}
        why.insert(0, "signed by none of them: " + ", ".join(
            f"{d[:19]} ({names.get(d, 'index')})" for d in unsigned[:10]))
        raise ImageSignatureInvalid(
            f"{doing}: expected every manifest of {image.name} to be signed by {_key_names(keys)} (or listed by a "
            f"signed index), found {len(unsigned)} of {len(needed)} that no verified signature covers",
            context="\n".join(why[:20]),
            hint="one signed platform never vouches for another: sign the index (cosign sign on the tag) or each "
            "platform, or export only the signed platforms (--platform)")
    raise ImageSignatureInvalid(
        f"{doing}: expected a cosign signature on {image.name} by {_key_names(keys)}, found {carried} that "
        "do not verify for it", context="\n".join(why[:20]),
        hint="the image or its signature was changed, or it was signed with another key; do not use it")


def check_file_artifact(art: FileArtifact, keys: Sequence[CosignKey], read: BlobReader, doing: str,
                        signatures: Sequence[ArtifactRecord] = ()) -> SignedImage:
    """A file artifact (3.6) admitted by ``keys``: its manifest is named by one of the cosign
    ``signatures`` it carries that verifies by one of the keys, with the identity of its ref's
    repository: cosign's rule for an image of one manifest. Else ImageUnsigned (none carried) or
    ImageSignatureInvalid (every reason why not). Its files are the manifest's layers, pinned by
    digest: the signed manifest covers each byte."""
    reads = _Reads(read, doing)
    why: List[str] = []
    digest = str(art.manifest.digest)
    name = f"the file artifact {art.ref}"
    carried, proofs = _proofs(name, signatures, {digest}, {repository_of(art.ref)}, keys, reads, why, "artifact")
    if not carried:
        raise ImageUnsigned(
            f"{doing}: expected {name} to carry a cosign signature by {_key_names(keys)}, found none",
            hint="export the files again signed (bundle export --files DIR --artifact-ref NAME:TAG "
            "--sign-artifacts-key cosign.key), or import without --require-signed; nothing was written")
    proof = proofs.get(digest)
    if proof is None:
        raise ImageSignatureInvalid(
            f"{doing}: expected a cosign signature on {name} by {_key_names(keys)}, found {carried} that "
            "do not verify for it", context="\n".join(why[:20]),
            hint="the files or their signature were changed, or signed with another key; do not use them")
    return SignedImage(art.ref, digest, proof.key, proof.signature, proof.identity, ((digest, digest),),
                       kind="file-artifact")


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
    """Every image and every file artifact (3.6) of the bundle signed by one of ``keys`` (the first
    that is not: raised). What ``--require-signed`` admits is signed, files as images."""
    return [*(check_image(image, keys, read, doing) for image in manifest.images),
            *(check_file_artifact(art, keys, read, doing, art.signatures) for art in manifest.file_artifacts)]


def images_signed(bundle: OpenedBundle, keys: Sequence[str], major: Optional[int], *,
                  quiet: bool, on_notice: Callable[[str], None],
                  doing: str = "importing with --require-signed") -> List[Dict[str, Any]]:
    """``--require-signed`` (the walk's ``image-signatures`` step, before the engine is asked
    anything): every image of the opened bundle carries a cosign signature by one of ``keys``, its
    blobs hashed as they are read; the receipt's ``imageSignatures``. A schema 1/2 bundle
    (``major``) carries none."""
    cosign_keys = load_cosign_keys(keys)
    if major is not None:
        raise ImageUnsigned(f"{doing}: expected a schema 3.5 bundle carrying image signatures, found schema {major}",
                            hint="export the images again from their registry (bundle export docker://...)")
    signed = check_bundle(bundle.manifest(), cosign_keys, checked_reader(bundle.read, doing), doing)
    if not quiet:
        for s in signed:
            what = "file artifact" if s.kind else "image"
            on_notice(f"{what} {s.image}: cosign signature by {s.key.path} ({s.key.fingerprint[:19]}) verified")
    return [s.to_dict() for s in signed]
