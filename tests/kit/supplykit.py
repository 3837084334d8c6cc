"""Supply-chain test kit: small images pushed straight into a loopback docker-registry with the
importer's own registry client, cosign-format signatures made here with ``cryptography`` (the
simple-signing payload, the ``dev.cosignproject.cosign/signature`` annotation and the
``sha256-<hex>.sig`` tag cosign writes), an SBOM attached as an OCI 1.1 referrer with its
``sha256-<hex>`` fallback index, and the real cosign (Debian 13's, fetched by
docker/scripts/install-deps.sh into /opt/sneakernet/trixie-tools)."""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from importer.format.digest import Digest
from importer.registry.client import RegistryClient, parse_target
from tests.kit import engines

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SPDX = "application/spdx+json"
TRIXIE_TOOLS = Path(os.environ.get("SNEAKERNET_TRIXIE_TOOLS", "/opt/sneakernet/trixie-tools"))


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


@contextlib.contextmanager
def client(addr: str) -> Iterator[RegistryClient]:
    c = RegistryClient(parse_target(addr))
    c.ping()
    try:
        yield c
    finally:
        c.close()


def push_blob(c: RegistryClient, repo: str, data: bytes, media_type: str) -> dict[str, Any]:
    digest = Digest.of_bytes(data)
    if c.blob_size(repo, digest) is None:
        c.upload_blob(repo, digest, len(data), lambda: contextlib.nullcontext(io.BytesIO(data)))  # type: ignore[arg-type,return-value]
    return {"mediaType": media_type, "digest": str(digest), "size": len(data)}


def push_manifest(c: RegistryClient, repo: str, doc: dict[str, Any], reference: str = "") -> dict[str, Any]:
    raw = _json(doc)
    digest = str(Digest.of_bytes(raw))
    c.put_manifest(repo, reference or digest, raw, doc["mediaType"])
    return {"mediaType": doc["mediaType"], "digest": digest, "size": len(raw)}


def push_image(addr: str, repo: str, tag: str, text: str, *, arch: str = "amd64", zstd: bool = False) -> dict[str, Any]:
    """A one-layer image (a gzip tar, or with ``zstd`` a zstd one, holding /hello.txt = ``text``);
    its manifest's descriptor (``tag`` "": pushed by digest only)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = text.encode()
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    plain = buf.getvalue()
    config = {"architecture": arch, "os": "linux", "config": {},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(plain).hexdigest()]}}
    with client(addr) as c:
        if zstd:
            import zstandard
            layer = push_blob(c, repo, zstandard.ZstdCompressor().compress(plain),
                              "application/vnd.oci.image.layer.v1.tar+zstd")
        else:
            layer = push_blob(c, repo, gzip.compress(plain, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
        cfg = push_blob(c, repo, _json(config), OCI_CONFIG)
        return push_manifest(c, repo, {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg,
                                       "layers": [layer]}, tag)


def push_multi(addr: str, repo: str, tag: str, arches: list[str]) -> dict[str, Any]:
    """An image index tagged ``tag`` over one-layer images for linux/``arches``: its descriptor,
    and each platform's manifest descriptor by architecture."""
    platforms = {arch: push_image(addr, repo, "", f"built for {arch}\n", arch=arch) for arch in arches}
    with client(addr) as c:
        index = push_manifest(c, repo, {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {**d, "platform": {"os": "linux", "architecture": arch}} for arch, d in platforms.items()]}, tag)
    return {"index": index, "platforms": platforms}


def ecdsa_key(directory: Path, name: str = "cosign") -> tuple[ec.EllipticCurvePrivateKey, Path]:
    """A P-256 key pair (what `cosign generate-key-pair` makes); the public key's PEM file."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _write_pub(directory / f"{name}.pub", key.public_key())


def ed25519_key(directory: Path, name: str = "ed") -> tuple[Ed25519PrivateKey, Path]:
    key = Ed25519PrivateKey.generate()
    return key, _write_pub(directory / f"{name}.pub", key.public_key())


def _write_pub(path: Path, public: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def payload(digest: str, reference: str) -> bytes:
    """cosign's simple-signing payload for ``digest`` as ``reference`` (repository, no tag)."""
    return _json({"critical": {"identity": {"docker-reference": reference},
                               "image": {"docker-manifest-digest": digest},
                               "type": "cosign container image signature"}, "optional": None})


def sign_bytes(key: Any, data: bytes) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        return key.sign(data)
    return bytes(key.sign(data, ec.ECDSA(hashes.SHA256())))


def cosign_sign(addr: str, repo: str, digest: str, key: Any, *, reference: str = "", signed: bytes | None = None,
                signature: bytes | None = None) -> dict[str, Any]:
    """Push a cosign signature of ``digest`` under ``sha256-<hex>.sig``. ``signed``: the payload
    the signature is made over when it differs from the one stored (a tampered payload);
    ``signature``: the bytes stored in the annotation instead of a real signature."""
    body = payload(digest, reference or f"{addr}/{repo}")
    sig = signature if signature is not None else sign_bytes(key, signed if signed is not None else body)
    config = {"architecture": "", "os": "", "config": {}, "created": "0001-01-01T00:00:00Z",
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(body).hexdigest()]}}
    with client(addr) as c:
        layer = push_blob(c, repo, body, SIMPLE_SIGNING)
        layer["annotations"] = {"dev.cosignproject.cosign/signature": base64.b64encode(sig).decode()}
        cfg = push_blob(c, repo, _json(config), OCI_CONFIG)
        return push_manifest(c, repo, {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg,
                                       "layers": [layer]}, "sha256-" + digest.split(":")[1] + ".sig")


def attach_sbom(addr: str, repo: str, subject: dict[str, Any], sbom: bytes) -> dict[str, Any]:
    """An SPDX SBOM as an OCI 1.1 referrer of ``subject``, listed in the ``sha256-<hex>`` fallback
    index (a registry without the Referrers API: what oras and cosign write there)."""
    with client(addr) as c:
        empty = push_blob(c, repo, b"{}", OCI_EMPTY)
        layer = push_blob(c, repo, sbom, SPDX)
        ref = push_manifest(c, repo, {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SPDX,
                                      "config": empty, "layers": [layer],
                                      "subject": {k: subject[k] for k in ("mediaType", "digest", "size")}})
        push_manifest(c, repo, {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                "manifests": [{**ref, "artifactType": SPDX}]},
                      "sha256-" + subject["digest"].split(":")[1])
        return ref


def cosign() -> str:
    """The real cosign (PATH, else Debian 13's in /opt/sneakernet/trixie-tools); under CI=true a
    missing one fails the test (engines.unavailable)."""
    found = shutil.which("cosign") or (str(TRIXIE_TOOLS / "usr/bin/cosign")
                                       if (TRIXIE_TOOLS / "usr/bin/cosign").is_file() else None)
    if found is None:
        engines.unavailable("cosign is not installed (docker/scripts/install-deps.sh fetches Debian 13's into "
                            f"{TRIXIE_TOOLS})")
    return str(found)


def layout_signature(layout: Path, digest: str, reference: str, key: Any) -> dict[str, Any]:
    """A cosign signature of ``digest`` as ``reference`` written into an OCI layout, named
    ``sha256-<hex>.sig`` in its index.json (as ``cosign save`` writes it): an ``oci:`` source
    of a signed image without a registry."""
    body = payload(digest, reference)
    config = {"architecture": "", "os": "", "config": {}, "created": "0001-01-01T00:00:00Z",
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(body).hexdigest()]}}
    blobs = layout / "blobs" / "sha256"

    def put(raw: bytes, media_type: str) -> dict[str, Any]:
        hexd = hashlib.sha256(raw).hexdigest()
        (blobs / hexd).write_bytes(raw)
        return {"mediaType": media_type, "digest": f"sha256:{hexd}", "size": len(raw)}

    layer = {**put(body, SIMPLE_SIGNING),
             "annotations": {"dev.cosignproject.cosign/signature": base64.b64encode(sign_bytes(key, body)).decode()}}
    manifest = put(_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": put(_json(config), OCI_CONFIG),
                          "layers": [layer]}), OCI_MANIFEST)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].append({**manifest, "annotations": {
        "org.opencontainers.image.ref.name": "sha256-" + digest.split(":")[1] + ".sig"}})
    (layout / "index.json").write_text(json.dumps(index))
    return manifest
