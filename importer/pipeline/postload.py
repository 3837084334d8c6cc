"""Post-load verification: does the engine hold exactly what the bundle pins?

Identity rules (importer/format/identity.py): on Docker's classic image store (and podman) the image ID
is the config digest; on Docker's containerd image store the bundle's own manifest is loaded, so
the image ID must be the bundle's manifest digest (rule ``manifest-digest``), except for a delta
image, loaded as a docker-archive, whose ID is the manifest Docker made while loading
(``diff-ids+manifest``: predictable, checked when it matches, identity resting on the diff_ids and
``--deep``); bare containerd and an OCI layout keep the bundle's own manifest, so the ID must be
the bundle's manifest digest and the config digest the bundle's config digest."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from importer.engines import EngineImage
from importer.format.identity import (
    CLASSIC,
    CONTAINERD,
    DOCKER_ARCHIVE,
    DOCKER_LAYER_TAR,
    OCI,
    docker_archive_manifest_digest,
    expected_image_id,
)
from importer.format.manifest import ImageRecord
from importer.format.text import printable
from importer.verify.deep import DeepResult

IDENTITY_RULES = {CLASSIC: "config-digest", CONTAINERD: "diff-ids+manifest", OCI: "manifest-digest",
                  DOCKER_ARCHIVE: "config-digest+diff-ids"}


@dataclass
class ImageCheck:
    image: ImageRecord
    found: Optional[EngineImage]
    identity_rule: str
    result: str  # "match", "mismatch", "missing"
    detail: str = ""
    status: str = "loaded"  # "loaded" or "already-present"
    tags_applied: List[str] = field(default_factory=list)
    id_verified: bool = False  # the engine's image ID is the one the identity rule predicts
    deep: Optional[DeepResult] = None  # --deep: the engine's bytes re-exported and re-hashed

    @property
    def ok(self) -> bool:
        return self.result == "match" and (self.deep is None or self.deep.ok)

    @property
    def layers_matched(self) -> int:
        if self.found is None:
            return 0
        want = [str(x.diff_id) for x in self.image.layers]
        return sum(1 for a, b in zip(want, self.found.diff_ids) if a == b)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "refs": list(self.image.refs),
            "expected": {
                "configDigest": str(self.image.config.digest),
                "manifestDigest": str(self.image.manifest.digest),
                "diffIds": [str(x.diff_id) for x in self.image.layers],
            },
            "found": None if self.found is None else {
                "imageId": self.found.image_id,
                "diffIds": list(self.found.diff_ids),
                "tags": list(self.found.tags),
                "configDigest": self.found.config_digest,
                "manifestDigest": self.found.manifest_digest,
                "problems": list(self.found.problems),
            },
            "identityRule": self.identity_rule,
            "layersMatched": self.layers_matched,
            "result": self.result,
            "detail": self.detail,
            "status": self.status,
            "tagsApplied": list(self.tags_applied),
            "idVerified": self.id_verified,
            "deep": None if self.deep is None else self.deep.to_dict(),
        }


def check_image(image: ImageRecord, found: Optional[EngineImage], image_store: str) -> ImageCheck:
    """Compare what the engine reports with what bundle.json pins."""
    rule = IDENTITY_RULES.get(image_store, "diff-ids+manifest")
    if found is None:
        return ImageCheck(image, None, rule, "missing", "the engine does not report the image")
    if image.others:  # a multi-platform image kept whole (an OCI layout): compare the platform it reports
        same = next((v for v in image.variants if str(v.manifest.digest) == found.manifest_digest), None)
        if same is not None and same is not image:
            checked = check_image(dataclasses.replace(same, refs=image.refs, label=image.name, others=()), found,
                                  image_store)
            checked.image = image
            return checked
    problems: List[str] = []
    note = ""
    expected_id = expected_image_id(image_store, image)
    id_verified = expected_id is not None and found.image_id == expected_id
    if expected_id is not None and not id_verified:
        problems.append(f"image ID: expected {expected_id}, found {found.image_id}")
    if image_store == CONTAINERD and expected_id is not None:
        rule = IDENTITY_RULES[OCI]  # the bundle's own manifest was loaded: ID = its digest, exactly
        note = "image ID = the bundle's manifest digest"
    elif image_store == CONTAINERD:
        predicted = docker_archive_manifest_digest(image)
        id_verified = found.image_id == predicted
        note = ("image ID is the manifest a docker-archive load makes" if id_verified else
                f"image ID {found.image_id[:19]} is not the predicted docker-archive manifest {predicted[:19]}; "
                "identity rests on the diff_ids (run --deep to compare the bytes)")
    if image_store == DOCKER_ARCHIVE:
        problems += _archive_identity(image, found)
    if found.config_digest is not None and found.config_digest != str(image.config.digest):
        problems.append(f"config digest: expected {image.config.digest}, found {found.config_digest}")
    want = [str(x.diff_id) for x in image.layers]
    if found.diff_ids != want:
        bad = [i + 1 for i, (a, b) in enumerate(zip(want, found.diff_ids)) if a != b]
        if len(found.diff_ids) != len(want):
            problems.append(f"layers: expected {len(want)}, found {len(found.diff_ids)}")
        if bad:
            problems.append(f"diff_ids differ at layer(s) {', '.join(map(str, bad))}")
    problems += found.problems
    if problems:
        return ImageCheck(image, found, rule, "mismatch", "; ".join(problems), id_verified=id_verified)
    return ImageCheck(image, found, rule, "match", note, id_verified=id_verified)


def _archive_identity(image: ImageRecord, found: EngineImage) -> List[str]:
    """A docker-archive load (schema 1/2 bundle): the engine must name the config, and any
    uncompressed layer blob it lists is the layer itself (blob digest = diff_id)."""
    problems = [] if found.config_digest is not None else ["the engine does not report the config digest"]
    layers = [b for b in found.blobs if b.get("mediaType") == DOCKER_LAYER_TAR]
    if layers and [b.get("digest") for b in layers] != [str(x.diff_id) for x in image.layers]:
        problems.append("the engine's uncompressed layer blobs are not the bundle's diff_ids")
    return problems


def render_table(checks: List[ImageCheck]) -> str:
    """A plain-text table: image, the bundle's config and manifest digests (an engine's image ID is
    one of them, or a digest its identity rule predicts), engine ID, layers matched, result."""
    rows = [("IMAGE", "CONFIG DIGEST", "MANIFEST DIGEST", "ENGINE ID", "LAYERS", "RESULT")]
    for c in checks:
        rows.append((
            printable(c.image.name),
            c.image.config.digest.short,
            c.image.manifest.digest.short,
            (printable(c.found.image_id[:19]) if c.found else "-"),
            f"{c.layers_matched}/{len(c.image.layers)}",
            ("MATCH" if c.ok else c.result.upper())
            + ("" if c.deep is None else " +DEEP" if c.deep.ok else " DEEP-MISMATCH")
            + (" (already present)" if c.status == "already-present" else ""),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(table + _detail_lines(checks))


def _detail_lines(checks: List[ImageCheck]) -> List[str]:
    """Below the table, the whole reason of each row that did not match (never cut to a column's width):
    ``  IMAGE: what differs``, one line per reason (--deep: per layer)."""
    lines: List[str] = []
    for c in checks:
        if c.result != "match" and c.detail:
            lines.append(f"  {printable(c.image.name)}: {printable(c.detail)}")
        if c.deep is not None and not c.deep.ok:
            lines += [f"  {printable(line)}" for line in c.deep.failures()]
    return lines
