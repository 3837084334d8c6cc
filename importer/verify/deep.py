"""``--deep``: prove the engine stores the same bytes, not just the same metadata.

The image is exported back out of the engine (``docker save``, ``podman save``, ``ctr export``,
or the blobs of an OCI layout), every layer is hashed again (decompressed where the engine keeps
it compressed) and each layer's diff_id is compared with bundle.json. A layer whose bytes differ
is named: its position, the build step that made it, the expected and the found diff_id."""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer.engines import EngineImage
from importer.errors import BundleError, CommandFailed
from importer.format.limits import MAX_CONFIG, read_file_limited
from importer.format.manifest import ImageRecord
from importer.input.layers import open_layer
from importer.input.safetar import LAYER_POLICY, SafeTarReader
from importer.input.tarscan import ArchiveScan


@dataclass
class LayerVerdict:
    index: int  # 1-based
    expected: str
    found: Optional[str]
    path: Optional[str]
    created_by: str = ""
    detail: str = ""
    checked: bool = True  # False: the re-export stopped before this layer

    @property
    def ok(self) -> bool:
        return self.checked and self.found == self.expected

    def name(self, image: ImageRecord) -> str:
        step = f" ({self.created_by[:80]})" if self.created_by else ""
        return f"layer {self.index}/{len(image.layers)}{step} of {image.name}"

    def to_dict(self) -> Dict[str, Any]:
        return {
            "index": self.index,
            "expectedDiffId": self.expected,
            "foundDiffId": self.found,
            "path": self.path,
            "createdBy": self.created_by,
            "ok": self.ok,
            "checked": self.checked,
            "detail": self.detail,
        }


@dataclass
class DeepResult:
    image: ImageRecord
    source: str
    config_found: bool
    layers: List[LayerVerdict] = field(default_factory=list)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.config_found and len(self.layers) == len(self.image.layers) and all(x.ok for x in self.layers)

    def failures(self) -> List[str]:
        if not self.config_found:
            return [f"{self.image.name}: {self.detail}"]
        lines = [f"{v.name(self.image)}: {v.detail}" for v in self.layers if v.checked and not v.ok]
        unchecked = [v for v in self.layers if not v.checked]
        if unchecked:
            lines.append(f"{self.image.name}: {len(unchecked)} other layer(s) could not be checked ({self.detail})")
        if len(self.layers) != len(self.image.layers) and not lines:
            lines.append(f"{self.image.name}: {self.detail}")
        return lines

    def to_dict(self) -> Dict[str, Any]:
        return {
            "ok": self.ok,
            "source": self.source,
            "configFound": self.config_found,
            "layers": [v.to_dict() for v in self.layers],
            "detail": self.detail,
        }


def layer_steps(root: str, image: ImageRecord) -> List[str]:
    """The build step (history ``created_by``) of each layer, from the bundle's config."""
    try:
        raw = read_file_limited(os.path.join(root, image.config.digest.blob_path), MAX_CONFIG, "config")
        history = json.loads(raw.decode("utf-8")).get("history") or []
    except (OSError, ValueError, AttributeError):
        return []
    steps = [str(h.get("created_by", "")) for h in history if isinstance(h, dict) and not h.get("empty_layer")]
    return steps if len(steps) == len(image.layers) else []


def compare(image: ImageRecord, scan: ArchiveScan, *, steps: Optional[List[str]] = None) -> DeepResult:
    """Compare the re-exported image in ``scan`` with what bundle.json pins."""
    config = str(image.config.digest)
    if scan.error:
        return DeepResult(image, scan.source, False, detail=f"the re-export is not a readable tar ({scan.error})")
    located = scan.find_image(config)
    if located is None:
        return DeepResult(image, scan.source, False,
                          detail=f"the re-export holds no image with config {config} "
                          "(the engine's copy of the config differs, or the export is incomplete)")
    paths, _how = located
    result = DeepResult(image, scan.source, True)
    steps = steps or []
    for i, layer in enumerate(image.layers):
        expected = str(layer.diff_id)
        step = steps[i] if i < len(steps) else ""
        if i >= len(paths):
            result.layers.append(LayerVerdict(i + 1, expected, None, None, step, "missing from the re-export"))
            continue
        facts = scan.resolve(paths[i])
        if facts is None:
            result.layers.append(LayerVerdict(i + 1, expected, None, paths[i], step,
                                              f"{paths[i]} is listed but not in the re-export"))
            continue
        found = str(facts.plain_digest) if facts.plain_digest is not None else None
        if found == expected:
            detail = ""
        elif found is None:
            detail = f"expected diff_id {expected}; the engine's copy {facts.note or 'could not be read'}"
        else:
            detail = f"expected diff_id {expected}, found {found}: the engine stores other bytes for this layer"
        blob_name = _blob_name(paths[i])
        if blob_name is not None and blob_name != str(facts.digest):
            detail = (detail + "; " if detail else "") + (
                f"the stored blob {blob_name} hashes to {facts.digest} (damaged in the engine's content store)")
            if found == expected:
                found = None  # the blob is not what its name says: count it as a mismatch
        result.layers.append(LayerVerdict(i + 1, expected, found, paths[i], step, detail))
    if len(paths) != len(image.layers):
        result.detail = f"the re-export lists {len(paths)} layers, bundle.json {len(image.layers)}"
    return result


def _blob_name(path: str) -> Optional[str]:
    parts = path.split("/")
    if len(parts) == 3 and parts[0] == "blobs" and len(parts[2]) == 64:
        return f"{parts[1]}:{parts[2]}"
    return None


#: an engine's image exported again (a sink's ``reexport``: importer/sinks/__init__.py ``Reexporting``)
Reexport = Callable[[EngineImage, ImageRecord, Optional[Callable[[int], None]]], ArchiveScan]


def run_deep(reexport: Reexport, checks: Sequence[Any], root: str,
             progress: Optional[Callable[[str, int], Callable[[int], None]]] = None) -> List[str]:
    """Re-export every checked image from the engine (``reexport``) and compare it with bundle.json;
    sets ``check.deep`` on each ImageCheck and returns one line per failure (empty: all match)."""
    failures: List[str] = []
    for check in checks:
        if check.found is None:
            continue
        total = sum(layer.uncompressed_size for layer in check.image.layers)
        on_bytes = progress(f"deep {check.image.name}", total) if progress is not None else None
        try:
            scan = reexport(check.found, check.image, on_bytes)
        except CommandFailed as e:
            refused = _INTEGRITY_RE.search(e.stderr_tail or "")
            if refused is None:
                raise
            check.deep = export_refused(check.image, root, refused.group(1), " ".join(e.argv), refused.group(0))
        else:
            check.deep = compare(check.image, scan, steps=layer_steps(root, check.image))
        failures += check.deep.failures()
    return failures


# Docker's classic store and containers/storage rebuild a layer's tar from tar-split metadata
# plus the files on disk, checking each file's CRC64; a changed file stops the export with this.
_INTEGRITY_RE = re.compile(r'file integrity checksum failed for "([^"\n]+)"')


def export_refused(image: ImageRecord, root: str, path: str, source: str, reason: str) -> DeepResult:
    """The engine refused to export the image because a stored file changed: name the layer(s)
    of the bundle that hold that file."""
    steps = layer_steps(root, image)
    want = _norm(path)
    holders = [i for i, layer in enumerate(image.layers) if want in _member_names(root, image, i)]
    result = DeepResult(image, source, True,
                        detail=f"the engine stopped exporting at the changed file {path!r}")
    for i, layer in enumerate(image.layers):
        step = steps[i] if i < len(steps) else ""
        if i in holders:
            which = "" if len(holders) == 1 else f" (one of layers {', '.join(str(h + 1) for h in holders)})"
            result.layers.append(LayerVerdict(
                i + 1, str(layer.diff_id), None, None, step,
                f"the engine refused to export it: {reason}{which}; its stored copy of /{want} differs from "
                f"the bytes it loaded (expected diff_id {layer.diff_id})"))
        else:
            result.layers.append(LayerVerdict(i + 1, str(layer.diff_id), None, None, step,
                                              "not exported (the engine stopped at another layer)", checked=False))
    if not holders:
        result.config_found = False
        result.detail = f"the engine refused to export it: {reason}; no layer of bundle.json holds /{want}"
    return result


def _norm(path: str) -> str:
    return posixpath.normpath("/" + path).lstrip("/")


def _member_names(root: str, image: ImageRecord, i: int) -> List[str]:
    """File names in layer ``i`` of the bundle (streamed from its blob, checked as it is read)."""
    names: List[str] = []
    layer = image.layers[i]
    try:
        with open_layer(root, layer, f"layer {i + 1}/{len(image.layers)} of {image.name}") as reader:
            names = [_norm(m.name) for m in SafeTarReader(reader, LAYER_POLICY, what=f"layer {i + 1} of {image.name}")]
            reader.finish()
    except (BundleError, OSError):
        return names
    return names
