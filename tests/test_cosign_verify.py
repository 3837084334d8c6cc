"""importer/verify/cosign.py and importer/format/artifacts.py on hostile input, without a registry:
key files that are not P-256 or Ed25519 public keys, signature manifests and payloads that are
not what cosign writes (not JSON, nested too deep, no critical section, a signature that is not
base64), both verification backends (cryptography and openssl) agreeing, and bundle.json
``artifacts`` lists that are malformed or too long."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any, Callable

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from importer.errors import BundleError
from importer.format.artifacts import MAX_ARTIFACTS, ArtifactRecord, check_artifacts
from importer.format.digest import Digest
from importer.format.manifest import BlobRef, ImageRecord
from importer.verify.cosign import (
    ImageSignatureInvalid,
    ImageUnsigned,
    check_image,
    load_cosign_keys,
    parse_cosign_key,
)
from importer.verify.keyfiles import InvalidKey
from importer.verify.signature import BACKEND_ENV
from tests.kit import supplykit
from tests.kit.fuzzkit import mutate_json

SUBJECT = Digest.of_bytes(b"the image manifest")
REPO = "registry.example:5000/team/app"


class Blobs:
    """An in-memory bundle: digest -> bytes (the reader check_image is given)."""

    def __init__(self) -> None:
        self.data: dict[Digest, bytes] = {}

    def put(self, raw: bytes) -> BlobRef:
        d = Digest.of_bytes(raw)
        self.data[d] = raw
        return BlobRef("", d, len(raw))

    def read(self, digest: Digest, limit: int) -> bytes:
        return self.data[digest][:limit + 1]


def signed_image(blobs: Blobs, payload: bytes, signature: Any) -> ImageRecord:
    sig_b64 = signature if isinstance(signature, str) else base64.b64encode(signature).decode()
    layer = blobs.put(payload)
    manifest = blobs.put(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": supplykit.SIMPLE_SIGNING, "digest": str(layer.digest), "size": layer.size,
         "annotations": {"dev.cosignproject.cosign/signature": sig_b64}}]}).encode())
    art = ArtifactRecord("signature", SUBJECT, manifest, (layer,), "sha256-x.sig", "", REPO)
    ref = BlobRef("application/vnd.oci.image.manifest.v1+json", SUBJECT, 18)
    return ImageRecord((f"{REPO}:1",), ref, ref, (), artifacts=(art,))


@pytest.fixture(params=["cryptography", "openssl"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(BACKEND_ENV, request.param)
    return str(request.param)


@pytest.fixture
def key(tmp_path: Path) -> tuple[Any, Path]:
    return supplykit.ecdsa_key(tmp_path)


def test_a_good_signature_passes_with_either_backend(backend: str, key: tuple[Any, Path]) -> None:
    signer, pub = key
    blobs = Blobs()
    body = supplykit.payload(str(SUBJECT), REPO)
    signed = check_image(signed_image(blobs, body, supplykit.sign_bytes(signer, body)),
                         load_cosign_keys([str(pub)]), blobs.read, "testing")
    assert signed.digest == str(SUBJECT) and signed.identity == REPO and signed.key.algorithm == "ecdsa-p256"


def test_ed25519_with_either_backend(backend: str, tmp_path: Path) -> None:
    signer, pub = supplykit.ed25519_key(tmp_path)
    blobs = Blobs()
    body = supplykit.payload(str(SUBJECT), REPO)
    keys = load_cosign_keys([str(pub)])
    assert check_image(signed_image(blobs, body, signer.sign(body)), keys, blobs.read, "t").key.algorithm == "ed25519"
    with pytest.raises(ImageSignatureInvalid):
        check_image(signed_image(blobs, body, signer.sign(body + b" ")), keys, blobs.read, "t")


def _deep() -> bytes:
    return b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("payload, why", [
    (b"\xff\xfe not utf-8", "not this image's manifest"),
    (b"not json at all", "not this image's manifest"),
    (b"[1, 2, 3]", "not this image's manifest"),
    (b'{"critical": "no"}', "not this image's manifest"),
    (b'{"critical": {"image": {"docker-manifest-digest": 7}}}', "not this image's manifest"),
    (_deep(), "not this image's manifest"),
    (supplykit.payload(str(Digest.of_bytes(b"another image")), REPO), "not this image's manifest"),
    (supplykit.payload(str(SUBJECT), "registry.example:5000/team/other"), "names the repository"),
    (supplykit.payload(str(SUBJECT), REPO).replace(b"cosign container image signature", b"atomic container"),
     "not this image's manifest"),
], ids=["not-utf8", "not-json", "a-list", "critical-not-object", "digest-not-string", "nested-deep",
        "another-digest", "another-repository", "another-critical-type"])
def test_a_verified_payload_must_name_the_image(backend: str, key: tuple[Any, Path], payload: bytes,
                                                why: str) -> None:
    """A payload the key really signed, that names no image or another one, is refused."""
    signer, pub = key
    blobs = Blobs()
    with pytest.raises(ImageSignatureInvalid) as e:
        check_image(signed_image(blobs, payload, supplykit.sign_bytes(signer, payload)),
                    load_cosign_keys([str(pub)]), blobs.read, "testing")
    assert why in (e.value.context or ""), e.value.context
    assert e.value.reference == "image-signature-invalid" and e.value.exit_code == 7


@pytest.mark.parametrize("signature", ["%%% not base64 %%%", "", base64.b64encode(b"\x30\x02\x00\x00").decode(),
                                       base64.b64encode(b"\x00" * 5000).decode()],
                         ids=["not-base64", "empty", "short-der", "zeros"])
def test_a_signature_that_is_not_one_is_refused(backend: str, key: tuple[Any, Path], signature: str) -> None:
    _signer, pub = key
    blobs = Blobs()
    body = supplykit.payload(str(SUBJECT), REPO)
    with pytest.raises(ImageSignatureInvalid) as e:
        check_image(signed_image(blobs, body, signature), load_cosign_keys([str(pub)]), blobs.read, "testing")
    assert "does not verify" in (e.value.context or "")


def test_an_image_without_signature_layers_is_unsigned(key: tuple[Any, Path]) -> None:
    _signer, pub = key
    blobs = Blobs()
    image = signed_image(blobs, b"{}", b"x")
    sbom = ArtifactRecord("referrer", SUBJECT, blobs.put(b'{"layers": [{"mediaType": "application/spdx+json"}]}'))
    for arts in ((), (sbom,)):
        with pytest.raises(ImageUnsigned):
            check_image(ImageRecord(image.refs, image.manifest, image.config, (), artifacts=arts),
                        load_cosign_keys([str(pub)]), blobs.read, "testing")


def _rsa_pem() -> bytes:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize("make", [
    lambda: b"",
    lambda: b"-----BEGIN PUBLIC KEY-----\n%%%%\n-----END PUBLIC KEY-----\n",
    lambda: b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    _rsa_pem,
    lambda: b"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED COSIGN PRIVATE KEY-----\n",
], ids=["empty", "not-base64", "too-short", "rsa", "private-key"])
def test_key_files_that_are_no_p256_or_ed25519_public_key(make: Callable[[], bytes]) -> None:
    with pytest.raises(InvalidKey) as e:
        parse_cosign_key(make(), "k.pub")
    assert e.value.reference == "invalid-key" and "k.pub" in e.value.message


def test_key_files_missing_or_too_large(tmp_path: Path) -> None:
    big = tmp_path / "big.pub"
    big.write_bytes(b"x" * 70_000)
    for path in (tmp_path / "missing.pub", big, tmp_path):
        with pytest.raises(InvalidKey):
            load_cosign_keys([str(path)])


def _problems(raw: Any) -> list[str]:
    issues: list[str] = []
    check_artifacts(lambda where, msg: issues.append(f"{where}: {msg}"), raw, "artifacts")
    return issues


def test_artifacts_lists_that_are_malformed_are_refused() -> None:
    good = {"kind": "signature", "subject": str(SUBJECT), "blobs": [],
            "manifest": {"mediaType": "m", "digest": str(SUBJECT), "size": 1}}
    assert _problems([good]) == []
    assert _problems({"not": "a list"})
    assert _problems([good] * (MAX_ARTIFACTS + 1))
    for bad in ({**good, "kind": "x"}, {**good, "subject": "../../etc"}, {**good, "blobs": "no"},
                {**good, "tag": "t" * 5000}, {**good, "manifest": {"digest": str(SUBJECT), "size": -1}},
                {**good, "manifest": None}, "not an object", {**good, "blobs": [{"digest": "sha256:00", "size": 1}]}):
        assert _problems([bad]), bad


def test_errors_are_typed() -> None:
    assert issubclass(ImageUnsigned, BundleError) and ImageUnsigned.reference == "image-unsigned"


def test_mutated_signature_documents_give_typed_refusals_only(key: tuple[Any, Path]) -> None:
    """Seeded, bounded: the signature manifest and payload mutated by tests/fuzzkit.mutate_json;
    check_image passes or raises a BundleError, never anything else (no traceback, no internal)."""
    signer, pub = key
    keys = load_cosign_keys([str(pub)])
    body = json.loads(supplykit.payload(str(SUBJECT), REPO))
    rnd = random.Random(29)
    outcomes = set()
    for _ in range(300):
        blobs = Blobs()
        payload = json.dumps(mutate_json(body, rnd)).encode()
        image = signed_image(blobs, payload, supplykit.sign_bytes(signer, payload))
        art = image.artifacts[0]
        manifest = json.loads(blobs.data[art.manifest.digest])
        mutated = blobs.put(json.dumps(mutate_json(manifest, rnd) if rnd.random() < 0.5 else manifest).encode())
        image = ImageRecord(image.refs, image.manifest, image.config, (),
                            artifacts=(ArtifactRecord("signature", SUBJECT, mutated, art.blobs, art.tag, "", REPO),))
        try:
            check_image(image, keys, blobs.read, "fuzzing")
            outcomes.add("passed")
        except BundleError as e:
            assert e.reference != "internal"
            outcomes.add(e.reference)
        except KeyError:
            outcomes.add("blob-not-in-bundle")  # the mutated manifest names a blob this in-memory bundle lacks
    assert {"image-signature-invalid", "image-unsigned"} <= outcomes, outcomes


# ============================================================ the policy's rule (issue 38 class 1)

OTHER = Digest.of_bytes(b"the other platform's manifest")


def _signature_record(blobs: Blobs, signer: Any, digest: Digest, reference: str = REPO, *,
                      repository: str = REPO) -> ArtifactRecord:
    body = supplykit.payload(str(digest), reference)
    layer = blobs.put(body)
    manifest = blobs.put(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": supplykit.SIMPLE_SIGNING, "digest": str(layer.digest), "size": layer.size,
         "annotations": {"dev.cosignproject.cosign/signature":
                         base64.b64encode(supplykit.sign_bytes(signer, body)).decode()}}]}).encode())
    return ArtifactRecord("signature", digest, manifest, (layer,), "", "", repository)


def _multi(blobs: Blobs, *, index_lists: tuple[Digest, ...] | None = (SUBJECT, OTHER), carried_index: bool = True,
           artifacts: tuple[ArtifactRecord, ...] = ()) -> tuple[ImageRecord, Digest]:
    """A two-platform image (SUBJECT amd64, OTHER arm64); its index lists ``index_lists``."""
    index = blobs.put(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": str(d), "size": 1}
        for d in index_lists or ()]}).encode())
    first = BlobRef("application/vnd.oci.image.manifest.v1+json", SUBJECT, 18)
    second = ImageRecord((), BlobRef("application/vnd.oci.image.manifest.v1+json", OTHER, 18), first, (),
                         {"os": "linux", "architecture": "arm64"})
    if not carried_index:
        index_rec = ArtifactRecord("index", index.digest, index)
        return ImageRecord((f"{REPO}:1",), first, first, (), {"os": "linux", "architecture": "amd64"},
                           others=(second,), artifacts=(*artifacts, index_rec)), index.digest
    return ImageRecord((f"{REPO}:1",), first, first, (), {"os": "linux", "architecture": "amd64"}, index=index,
                       others=(second,), artifacts=artifacts), index.digest


def _admitted(image: ImageRecord, keys: Any, blobs: Blobs) -> bool:
    try:
        check_image(image, keys, blobs.read, "testing")
    except ImageSignatureInvalid:
        return False
    return True


def test_one_signed_platform_never_vouches_for_its_sibling(backend: str, key: tuple[Any, Path]) -> None:
    """The oracle over every way to sign a two-platform image: admitted exactly when every carried
    manifest (both platforms and the index) is signed itself or listed by a signed index."""
    signer, pub = key
    keys = load_cosign_keys([str(pub)])
    for signed_first, signed_other, signed_index in [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]:
        blobs = Blobs()
        image, index = _multi(blobs)
        arts = tuple(_signature_record(blobs, signer, d) for d, on in
                     ((SUBJECT, signed_first), (OTHER, signed_other), (index, signed_index)) if on)
        if not arts:
            continue
        image, _ = _multi(blobs, artifacts=arts)
        covered = {d for d, on in ((SUBJECT, signed_first), (OTHER, signed_other), (index, signed_index)) if on}
        if signed_index:
            covered |= {SUBJECT, OTHER}  # what the signed index lists
        want = {SUBJECT, OTHER, index} <= covered
        assert _admitted(image, keys, blobs) == want, (signed_first, signed_other, signed_index)


def test_a_signed_index_covers_only_what_it_lists(key: tuple[Any, Path]) -> None:
    signer, pub = key
    keys = load_cosign_keys([str(pub)])
    blobs = Blobs()
    _, index = _multi(blobs, index_lists=(SUBJECT,))
    image, _ = _multi(blobs, index_lists=(SUBJECT,), artifacts=(_signature_record(blobs, signer, index),))
    with pytest.raises(ImageSignatureInvalid) as e:
        check_image(image, keys, blobs.read, "testing")
    assert "linux/arm64" in (e.value.context or "") and "1 of 3" in e.value.message


def test_the_index_one_platform_was_picked_from(key: tuple[Any, Path]) -> None:
    """An ``index`` record says where the signed index's bytes are; what they vouch for is what
    the signature over their digest covers, and only the manifests they list."""
    signer, pub = key
    keys = load_cosign_keys([str(pub)])
    blobs = Blobs()
    _, index = _multi(blobs, carried_index=False)
    image, _ = _multi(blobs, carried_index=False, artifacts=(_signature_record(blobs, signer, index),))
    signed = check_image(image, keys, blobs.read, "testing")
    assert signed.digest == str(index) and dict(signed.covers) == {str(SUBJECT): str(index), str(OTHER): str(index)}
    # the same index record, but the signature is over something else: nothing is covered
    image, _ = _multi(blobs, carried_index=False,
                      artifacts=(_signature_record(blobs, signer, Digest.of_bytes(b"elsewhere")),))
    assert not _admitted(image, keys, blobs)
    # a signed index that lists only the first platform never covers the second
    blobs = Blobs()
    _, short = _multi(blobs, carried_index=False, index_lists=(SUBJECT,))
    image, _ = _multi(blobs, carried_index=False, index_lists=(SUBJECT,),
                      artifacts=(_signature_record(blobs, signer, short),))
    assert not _admitted(image, keys, blobs)


def test_the_records_repository_is_not_evidence(key: tuple[Any, Path]) -> None:
    """A signature for another repository stays refused whatever the (unsigned) record claims."""
    signer, pub = key
    keys = load_cosign_keys([str(pub)])
    blobs = Blobs()
    other_repo = "registry.example:5000/team/base"
    art = _signature_record(blobs, signer, SUBJECT, other_repo, repository=other_repo)
    ref = BlobRef("application/vnd.oci.image.manifest.v1+json", SUBJECT, 18)
    with pytest.raises(ImageSignatureInvalid) as e:
        check_image(ImageRecord((f"{REPO}:1",), ref, ref, (), artifacts=(art,)), keys, blobs.read, "testing")
    assert "names the repository" in (e.value.context or "")


@pytest.mark.parametrize("image_ref, identity, admitted", [
    ("alpine:3", "index.docker.io/library/alpine", True),  # what cosign sign writes for a Hub image
    ("docker.io/library/alpine:3", "index.docker.io/library/alpine", True),
    ("alpine:3", "docker.io/alpine", True), ("team/app:1", "index.docker.io/team/app", True),
    ("alpine:3", "index.docker.io/library/busybox", False), ("alpine:3", "index.docker.io/team/alpine", False),
    ("alpine:3", "registry.example:5000/library/alpine", False),  # another registry is another repository
    ("registry.example:5000/alpine:3", "docker.io/library/alpine", False),
    ("registry.example:5000/alpine:3", "registry.example:5000/library/alpine", False),
])
def test_docker_hub_spellings_of_one_repository_are_one_identity(key: tuple[Any, Path], image_ref: str,
                                                                  identity: str, admitted: bool) -> None:
    """cosign writes a Docker Hub image's identity as ``index.docker.io/library/NAME``; the bundle
    names it ``NAME:TAG`` or ``docker.io/library/NAME:TAG``: one repository, so one identity
    (format/reference.py ``canonical_repository``). Any other repository stays refused."""
    signer, pub = key
    keys = load_cosign_keys([str(pub)])
    blobs = Blobs()
    art = _signature_record(blobs, signer, SUBJECT, identity)
    ref = BlobRef("application/vnd.oci.image.manifest.v1+json", SUBJECT, 18)
    assert _admitted(ImageRecord((image_ref,), ref, ref, (), artifacts=(art,)), keys, blobs) == admitted


def test_the_policy_work_is_bounded(key: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A signature manifest with more layers than cosign reads is refused; a fan-out of records
    naming junk is weighed without a single verification, each payload read once; more distinct
    signatures than the bound is refused (limit-exceeded), never minutes of work."""
    from importer.errors import LimitExceeded
    from importer.verify import cosign

    _signer, pub = key
    keys = load_cosign_keys([str(pub)])
    blobs = Blobs()
    junk = blobs.put(supplykit.payload(str(Digest.of_bytes(b"junk")), REPO))
    layer = {"mediaType": supplykit.SIMPLE_SIGNING, "digest": str(junk.digest), "size": junk.size,
             "annotations": {"dev.cosignproject.cosign/signature": base64.b64encode(b"x" * 64).decode()}}
    too_many = blobs.put(json.dumps({"schemaVersion": 2, "layers": [layer] * 1001}).encode())
    ref = BlobRef("application/vnd.oci.image.manifest.v1+json", SUBJECT, 18)
    with pytest.raises(LimitExceeded):
        check_image(ImageRecord((f"{REPO}:1",), ref, ref, (), artifacts=(
            ArtifactRecord("signature", SUBJECT, too_many),)), keys, blobs.read, "testing")
    calls = {"verify": 0, "read": 0}
    real_verify = cosign.verify_payload

    def counting_verify(*a: Any) -> bool:
        calls["verify"] += 1
        return real_verify(*a)

    def counting_read(digest: Digest, limit: int) -> bytes:
        calls["read"] += 1
        return blobs.read(digest, limit)

    monkeypatch.setattr(cosign, "verify_payload", counting_verify)
    same = blobs.put(json.dumps({"schemaVersion": 2, "layers": [layer] * 1000}).encode())
    fan_out = tuple(ArtifactRecord("signature", SUBJECT, same) for _ in range(256))
    with pytest.raises(ImageSignatureInvalid):
        check_image(ImageRecord((f"{REPO}:1",), ref, ref, (), artifacts=fan_out), keys, counting_read, "testing")
    assert calls == {"verify": 0, "read": 2}  # the manifest once, the payload once
    distinct = blobs.put(json.dumps({"schemaVersion": 2, "layers": [
        {**layer, "annotations": {"dev.cosignproject.cosign/signature": base64.b64encode(b"%d" % i).decode()}}
        for i in range(1000)]}).encode())
    other = blobs.put(json.dumps({"schemaVersion": 2, "layers": [
        {**layer, "annotations": {"dev.cosignproject.cosign/signature": base64.b64encode(b"o%d" % i).decode()}}
        for i in range(10)]}).encode())
    with pytest.raises(LimitExceeded):
        check_image(ImageRecord((f"{REPO}:1",), ref, ref, (), artifacts=(
            ArtifactRecord("signature", SUBJECT, distinct), ArtifactRecord("signature", SUBJECT, other))),
            keys, blobs.read, "testing")


def _off_curve_p256() -> bytes:
    from importer.verify.cosign import _P256_PREFIX
    point = b"\x04" + (1).to_bytes(32, "big") + (1).to_bytes(32, "big")
    return _pem(_P256_PREFIX + point)


def _not_ed25519_point() -> bytes:
    from importer.verify.cosign import _ED25519_PREFIX
    from importer.verify.keyfiles import ed25519_point_ok
    y = 2
    while ed25519_point_ok(y.to_bytes(32, "little")):
        y += 1
    return _pem(_ED25519_PREFIX + y.to_bytes(32, "little"))


def _pem(der: bytes) -> bytes:
    return b"-----BEGIN PUBLIC KEY-----\n" + base64.encodebytes(der) + b"-----END PUBLIC KEY-----\n"


@pytest.mark.parametrize("make", [_off_curve_p256, _not_ed25519_point], ids=["p256-off-curve", "ed25519-no-point"])
def test_a_point_that_is_no_key_is_refused_when_read(backend: str, make: Callable[[], bytes], tmp_path: Path) -> None:
    """Before: accepted here, then `internal` (ValueError) at the first signature checked."""
    path = tmp_path / "k.pub"
    path.write_bytes(make())
    with pytest.raises(InvalidKey) as e:
        load_cosign_keys([str(path)])
    assert e.value.reference == "invalid-key" and str(path) in e.value.message


def test_real_keys_are_on_their_curves(tmp_path: Path) -> None:
    for _ in range(20):
        for make in (supplykit.ecdsa_key, supplykit.ed25519_key):
            _, pub = make(tmp_path)
            assert load_cosign_keys([str(pub)])


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "huge"])
def test_key_files_that_are_no_files_fail_at_once(kind: str, tmp_path: Path) -> None:
    """A FIFO nobody writes used to hang the run; every loader of key files refuses them at once."""
    import os
    import signal

    from importer.verify.signature import load_trusted_keys

    path = tmp_path / "k.pub"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "inner").write_text("x")
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path.write_bytes(b"-" * (64 * 1024 + 1))
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"reading a {kind} as a key hung"))
    signal.alarm(10)
    try:
        with pytest.raises(InvalidKey) as e:
            load_cosign_keys([str(path)])
        assert str(path) in e.value.message
        if kind != "folder":  # --trust takes a folder of *.pub files
            with pytest.raises(InvalidKey):
                load_trusted_keys([str(path)])
    finally:
        signal.alarm(0)
