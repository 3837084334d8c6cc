"""bundle.json's per-image ``artifacts`` (schema 3.5): what the source registry had attached to
an image, carried byte for byte beside it.

* cosign's tag scheme: ``sha256-<hex>.sig`` (signatures), ``.att`` (attestations), ``.sbom``;
* OCI 1.1 referrers: manifests whose ``subject`` is the image (found with the Referrers API,
  or in the ``sha256-<hex>`` fallback tag, an index that is itself carried, kind
  ``referrers-index``);
* ``index``: the image index a single platform was picked from, byte for byte, when something
  is attached to it (cosign signs the index a multi-platform tag names): it lets the offline
  side check that the carried manifest is one the signed index lists. Never handed on (it
  names platforms the bundle does not carry).

Each record names the artifact's manifest and every blob it holds (config, layers; an index's
manifests are records of their own); all of them are files of the bundle like any blob, so
verification covers them. Older 3.x importers ignore the field.

No field of a record is signed: ``kind``, ``subject``, ``tag`` and ``repository`` are inputs to
check, never evidence. A record's ``tag`` can only be the name derived from its own subject
(:func:`derived_tag`: ``sha256-<hex>.sig|.att|.sbom`` by kind, ``sha256-<hex>`` for the referrers
fallback index, none for the rest), and its subject must be a manifest of its own image
(importer/format/manifest.py): a record can never move or shadow an image's tag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from importer.format.digest import BlobRef, Digest, is_digest

KINDS = ("signature", "attestation", "sbom", "referrer", "referrers-index", "index")
#: kinds handed on to registries, layouts and clients (an ``index`` names platforms not carried)
HANDED_ON = KINDS[:5]
#: cosign's tag suffixes, by kind
TAG_SUFFIXES = {"signature": ".sig", "attestation": ".att", "sbom": ".sbom"}
MAX_ARTIFACTS = 256  # per image: a bound on what a registry can make an export carry
MAX_FILE_SIGNATURES = 16  # per file artifact (3.7): one per signing key is what an export writes
MAX_TEXT = 1024


@dataclass(frozen=True)
class ArtifactRecord:
    kind: str
    subject: Digest  # the manifest (or index) digest it is attached to
    manifest: BlobRef
    blobs: Tuple[BlobRef, ...] = ()
    tag: str = ""  # the tag it had in the source registry (cosign scheme, fallback index)
    artifact_type: str = ""
    repository: str = ""  # HOST[:PORT]/REPO it was read from

    def to_dict(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {"kind": self.kind, "subject": str(self.subject), "manifest": self.manifest.to_dict(),
                               "blobs": [b.to_dict() for b in self.blobs]}
        if self.tag:
            doc["tag"] = self.tag
        if self.artifact_type:
            doc["artifactType"] = self.artifact_type
        if self.repository:
            doc["repository"] = self.repository
        return doc

    def every_blob(self) -> Tuple[BlobRef, ...]:
        return (self.manifest, *self.blobs)


Fail = Callable[[str, str], None]


def derived_tag(kind: str, subject: Digest) -> str:
    """The only tag a record of ``kind`` about ``subject`` may carry and be handed on under:
    cosign's ``sha256-<hex>.sig``/``.att``/``.sbom``, the referrers fallback ``sha256-<hex>``;
    "" for a kind that is handed on by digest only (a referrer, an index)."""
    base = f"{subject.algorithm}-{subject.hex}"
    if kind in TAG_SUFFIXES:
        return base + TAG_SUFFIXES[kind]
    return base if kind == "referrers-index" else ""


def handed_on_reference(art: ArtifactRecord) -> str:
    """What a registry, a layout or ``serve`` names ``art`` by: its derived tag when it had one,
    else its digest. Never ``art.tag`` itself (bundle.json's word, unsigned)."""
    tag = derived_tag(art.kind, art.subject) if art.tag else ""
    return tag or str(art.manifest.digest)


def layout_entry(art: ArtifactRecord) -> Optional[Tuple[Dict[str, Any], str]]:
    """How an OCI layout's index.json lists ``art`` (the bundle's own, since the writer of 3.5
    bundles names them; the OCI layout target does the same): its manifest's descriptor, with its
    ``artifactType`` when it has one, and the ``ref.name`` it is listed under: a cosign artifact's
    derived tag (``sha256-<hex>.sig``, as ``cosign save`` names it), "" (unnamed: a referrer, found
    by its ``subject``). None for a kind a layout does not list (the fallback index, an index)."""
    if art.kind not in ("signature", "attestation", "sbom", "referrer"):
        return None
    desc = art.manifest.to_dict()
    if art.artifact_type:
        desc["artifactType"] = art.artifact_type
    name = handed_on_reference(art) if art.kind in TAG_SUFFIXES and art.tag else ""
    return desc, name


def _text(fail: Fail, value: Any, where: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        fail(where, f"expected a string (at most {MAX_TEXT} characters), found {value!r}"[:200])
        return ""
    return value


def check_blob_ref(fail: Fail, value: Any, where: str) -> Optional[BlobRef]:
    """A descriptor of bundle.json's records (``mediaType``, ``digest``, ``size``), or None with
    every problem given to ``fail``: the one reader of them (artifacts here, file artifacts)."""
    if not isinstance(value, dict):
        fail(where, f"expected an object, found {type(value).__name__}")
        return None
    mt = _text(fail, value.get("mediaType"), f"{where}.mediaType")
    size = value.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        fail(f"{where}.size", f"expected a non-negative integer, found {size!r}"[:200])
        return None
    if not is_digest(value.get("digest")):
        fail(f"{where}.digest", f"expected 'sha256:' + 64 lowercase hex, found {value.get('digest')!r}"[:200])
        return None
    return BlobRef(mt, Digest.parse(value["digest"]), size)


def check_artifacts(fail: Fail, raw: Any, where: str) -> Tuple[ArtifactRecord, ...]:
    """The ``artifacts`` list of one image; every problem goes to ``fail(where, message)``."""
    if not isinstance(raw, list):
        fail(where, f"expected an array, found {type(raw).__name__}")
        return ()
    if len(raw) > MAX_ARTIFACTS:
        fail(where, f"expected at most {MAX_ARTIFACTS} artifacts, found {len(raw)}")
        return ()
    out: List[ArtifactRecord] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            fail(at, f"expected an object, found {type(item).__name__}")
            continue
        kind = item.get("kind")
        if kind not in KINDS:
            fail(f"{at}.kind", f"expected one of {', '.join(KINDS)}, found {kind!r}"[:200])
        subject = item.get("subject")
        if not is_digest(subject):
            fail(f"{at}.subject", f"expected 'sha256:' + 64 lowercase hex, found {subject!r}"[:200])
        manifest = check_blob_ref(fail, item.get("manifest"), f"{at}.manifest")
        raw_blobs = item.get("blobs")  # required, as the schema says: an artifact names its blobs, if none
        if not isinstance(raw_blobs, list):
            fail(f"{at}.blobs", f"expected an array, found {type(raw_blobs).__name__}")
            raw_blobs = []
        blobs = [check_blob_ref(fail, b, f"{at}.blobs[{k}]") for k, b in enumerate(raw_blobs)]
        # optional, but a string when present (null is not "absent"; the schema refuses it too)
        tag = _text(fail, item.get("tag"), f"{at}.tag", required="tag" in item)
        artifact_type = _text(fail, item.get("artifactType"), f"{at}.artifactType", required="artifactType" in item)
        repository = _text(fail, item.get("repository"), f"{at}.repository", required="repository" in item)
        if "tag" in item and kind in KINDS and is_digest(subject) and \
                (not tag or tag != derived_tag(str(kind), Digest.parse(subject))):
            want = derived_tag(str(kind), Digest.parse(subject))
            fail(f"{at}.tag", f"expected {'no tag' if not want else repr(want) + ' (derived from its subject) or none'}"
                 f" for a {kind}, found {tag!r}"[:300])
        if kind in KINDS and is_digest(subject) and manifest is not None and all(b is not None for b in blobs):
            out.append(ArtifactRecord(str(kind), Digest.parse(subject), manifest,
                                      tuple(b for b in blobs if b is not None), tag, artifact_type, repository))
    return tuple(out)


def check_file_signatures(fail: Fail, raw: Any, where: str, subject: Optional[Digest]) -> Tuple[ArtifactRecord, ...]:
    """A file artifact's ``signatures`` (schema 3.7): cosign signature records (the 3.5 model) of
    its own manifest (``subject``): kind ``signature``, subject that manifest, tag the derived
    ``sha256-<hex>.sig`` (or none), at most :data:`MAX_FILE_SIGNATURES`."""
    if isinstance(raw, list) and not 0 < len(raw) <= MAX_FILE_SIGNATURES:
        fail(where, f"expected 1 to {MAX_FILE_SIGNATURES} signatures, found {len(raw)}")
        return ()
    records = check_artifacts(fail, raw, where)
    for i, rec in enumerate(records):
        if rec.kind != "signature":
            fail(f"{where}[{i}].kind", f"expected 'signature', found {rec.kind!r}")
        elif subject is not None and rec.subject != subject:
            fail(f"{where}[{i}].subject", f"expected the artifact's manifest {subject}, found {rec.subject}")
    return tuple(r for r in records if r.kind == "signature" and (subject is None or r.subject == subject))
