"""Post-load verification: does the engine hold exactly what the bundle pins?

Identity rules: on Docker's classic image store (and podman) the image ID is the config
digest; on Docker's containerd image store the image ID is the manifest digest that Docker
made while loading, so identity there rests on the diff_ids (and on ``--deep``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from importer.manifest import ImageRecord
from importer.sinks import EngineImage


@dataclass
class ImageCheck:
    image: ImageRecord
    found: Optional[EngineImage]
    identity_rule: str
    result: str  # "match", "mismatch", "missing"
    detail: str = ""
    status: str = "loaded"  # "loaded" or "already-present"
    tags_applied: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result == "match"

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
            },
            "identityRule": self.identity_rule,
            "layersMatched": self.layers_matched,
            "result": self.result,
            "detail": self.detail,
            "status": self.status,
            "tagsApplied": list(self.tags_applied),
        }


def check_image(image: ImageRecord, found: Optional[EngineImage], image_store: str) -> ImageCheck:
    """Compare what the engine reports with what bundle.json pins."""
    rule = "config-digest" if image_store == "classic" else "diff-ids+manifest"
    if found is None:
        return ImageCheck(image, None, rule, "missing", "the engine does not report the image")
    problems: List[str] = []
    if image_store == "classic" and found.image_id != str(image.config.digest):
        problems.append(f"image ID: expected {image.config.digest}, found {found.image_id}")
    want = [str(x.diff_id) for x in image.layers]
    if found.diff_ids != want:
        bad = [i + 1 for i, (a, b) in enumerate(zip(want, found.diff_ids)) if a != b]
        if len(found.diff_ids) != len(want):
            problems.append(f"layers: expected {len(want)}, found {len(found.diff_ids)}")
        if bad:
            problems.append(f"diff_ids differ at layer(s) {', '.join(map(str, bad))}")
    if problems:
        return ImageCheck(image, found, rule, "mismatch", "; ".join(problems))
    return ImageCheck(image, found, rule, "match")


def render_table(checks: List[ImageCheck]) -> str:
    """A plain-text table: image, expected config, engine ID, layers matched, result."""
    rows = [("IMAGE", "EXPECTED CONFIG", "ENGINE ID", "LAYERS", "RESULT")]
    for c in checks:
        rows.append((
            c.image.name,
            c.image.config.digest.short,
            (c.found.image_id[:19] if c.found else "-"),
            f"{c.layers_matched}/{len(c.image.layers)}",
            ("MATCH" if c.ok else c.result.upper()) + (" (already present)" if c.status == "already-present" else ""),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
