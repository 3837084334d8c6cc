"""What the offline host already has, for delta bundles (``bundle export --have FILE``).

FILE is either an inventory printed on the offline host (``bundle-import --inventory``) or an
earlier bundle's bundle.json. Either way what matters is the set of layer diff_ids the host
holds: a layer with one of those diff_ids is left out of the delta bundle."""

from __future__ import annotations

from typing import Any, Set

from importer.digest import Digest, is_digest
from importer.errors import ManifestError
from importer.inventory import held_diff_ids, load_inventory
from importer.limits import MAX_ENGINE_JSON, parse_json, read_file_limited

_DIFF_ID_KEYS = ("diffIds", "diff_ids", "diffId")


def _collect(node: Any, out: Set[Digest], depth: int = 0) -> None:
    if depth > 32:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _DIFF_ID_KEYS:
                values = value if isinstance(value, list) else [value]
                out.update(Digest.parse(v) for v in values if is_digest(v))
            else:
                _collect(value, out, depth + 1)
    elif isinstance(node, list):
        for item in node:
            _collect(item, out, depth + 1)


def load_have(path: str) -> Set[Digest]:
    """The diff_ids held by the host described by ``path`` (inventory or bundle.json)."""
    raw = read_file_limited(path, MAX_ENGINE_JSON, path)
    doc = parse_json(raw, path)
    found: Set[Digest] = set()
    if isinstance(doc, dict) and doc.get("kind") == "inventory":
        # checksum and version checked; images the engine reported problems with are not trusted
        found.update(Digest.parse(d) for d in held_diff_ids(load_inventory(raw, what=path)))
    elif isinstance(doc, dict) and str(doc.get("mediaType", "")).startswith("application/vnd.sneakernet.bundle."):
        for image in doc.get("images") or []:
            for layer in image.get("layers") or [] if isinstance(image, dict) else []:
                if isinstance(layer, dict) and is_digest(layer.get("diffId")) and not layer.get("external"):
                    found.add(Digest.parse(layer["diffId"]))
            if isinstance(image, dict):
                found.update(Digest.parse(d) for d in image.get("diffIds") or [] if is_digest(d))
    else:
        _collect(doc, found)
    if not found:
        raise ManifestError(
            f"reading {path}: expected an inventory (bundle-import --inventory) or a bundle.json listing layers, "
            "found no layer diff_ids",
            hint="pass the file printed by `bundle-import --inventory` on the offline host",
        )
    return found
