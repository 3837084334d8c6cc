"""What the offline host already has, for delta bundles (``bundle export --have FILE``).

FILE is either an inventory printed on the offline host (``bundle-import --inventory``) or an
earlier bundle's bundle.json. What matters is the set of layer diff_ids the host holds (a layer
with one of those diff_ids is left out of the delta bundle) and, where the file says so, the
compressed blob the host keeps for each (an earlier bundle's layer blob, containerd's content
store, a registry): the delta then names that blob, which is what containerd and registries
need to complete it (docs/deltas.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from importer.errors import ManifestError, UsageError
from importer.format.cudafit import major_minor
from importer.format.digest import Digest, is_digest
from importer.format.fileartifacts import title_issue
from importer.format.limits import MAX_ENGINE_JSON, parse_json, read_file_limited
from importer.format.manifest import BlobRef
from importer.format.mediatypes import LAYER_TYPES, OCI_LAYER_TAR
from importer.format.platform import Platform
from importer.inventory.engine import held_diff_ids, inventory_decoders, inventory_platform, load_inventory
from importer.streams.compression import FAST_ZSTD_DECODERS

_DIFF_ID_KEYS = ("diffIds", "diff_ids", "diffId")

#: diff_id -> the compressed blob the host keeps for it (None: only the diff_id is known)
HaveLayers = Dict[Digest, Optional[BlobRef]]


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


def _blob(desc: Any) -> Optional[BlobRef]:
    """A compressed layer descriptor usable in a delta, or None."""
    if not isinstance(desc, dict):
        return None
    media_type, digest, size = desc.get("mediaType"), desc.get("digest"), desc.get("size")
    if media_type not in LAYER_TYPES or media_type == OCI_LAYER_TAR or not is_digest(digest):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None
    return BlobRef(str(media_type), Digest.parse(str(digest)), size)


def _add(found: HaveLayers, diff_id: Digest, blob: Optional[BlobRef]) -> None:
    if found.get(diff_id) is None:
        found[diff_id] = blob


def load_have_layers(path: str) -> HaveLayers:
    """diff_id -> compressed blob (or None) for every layer the host described by ``path`` holds."""
    raw = read_file_limited(path, MAX_ENGINE_JSON, path)
    doc = parse_json(raw, path)
    found: HaveLayers = {}
    if isinstance(doc, dict) and doc.get("kind") == "inventory":
        # checksum and version checked; images the engine reported problems with are not trusted
        inventory = load_inventory(raw, what=path)
        for d in held_diff_ids(inventory):
            _add(found, Digest.parse(d), None)
        for image in inventory.get("images") or []:
            if not isinstance(image, dict) or image.get("problems"):
                continue
            diff_ids, blobs = image.get("diffIds") or [], image.get("blobs") or []
            if isinstance(diff_ids, list) and isinstance(blobs, list) and len(diff_ids) == len(blobs):
                for d, desc in zip(diff_ids, blobs):  # manifest layers[i] <-> config diff_ids[i]
                    if is_digest(d):
                        _add(found, Digest.parse(d), _blob(desc))
    elif isinstance(doc, dict) and str(doc.get("mediaType", "")).startswith("application/vnd.sneakernet.bundle."):
        for image in doc.get("images") or []:
            for layer in image.get("layers") or [] if isinstance(image, dict) else []:
                if isinstance(layer, dict) and is_digest(layer.get("diffId")) and not layer.get("external"):
                    _add(found, Digest.parse(layer["diffId"]), _blob(layer))
            if isinstance(image, dict):  # schema 1/2 bundle.json: diff_ids only
                for d in image.get("diffIds") or []:
                    if is_digest(d):
                        _add(found, Digest.parse(d), None)
    else:
        ids: Set[Digest] = set()
        _collect(doc, ids)
        for held in ids:
            _add(found, held, None)
    if not found and _held_files_of(raw, doc, path).any:  # 1.5 / 3.6: a folder of files, no image
        return found
    if not found:
        raise ManifestError(
            f"reading {path}: expected an inventory (bundle-import --inventory) or a bundle.json listing layers, "
            "found no layer diff_ids",
            hint="pass the file printed by `bundle-import --inventory` on the offline host",
        )
    return found


@dataclass
class HeldFiles:
    """The files the far side holds (a file delta, schema 3.8): by digest wherever it lies (a registry),
    or by digest at a title (a ``--files-to`` folder, whose inventory lists what lies at each path,
    or an earlier bundle.json whose files were written there: only a file at its own path completes
    a delta there)."""

    anywhere: Dict[Digest, int] = field(default_factory=dict)  # digest -> size
    at_title: Dict[Tuple[str, Digest], int] = field(default_factory=dict)  # (title, digest) -> size

    @property
    def any(self) -> bool:
        return bool(self.anywhere or self.at_title)

    def sizes(self) -> Set[int]:
        """Every size held: a file of another size is not held (no need to hash it to know)."""
        return {*self.anywhere.values(), *self.at_title.values()}

    def holds(self, title: str, digest: Digest, size: int) -> bool:
        return self.anywhere.get(digest) == size or self.at_title.get((title, digest)) == size

    def update(self, other: HeldFiles) -> None:
        self.anywhere.update(other.anywhere)
        self.at_title.update(other.at_title)


def _held_file(entry: Any) -> Optional[Tuple[str, Digest, int]]:
    if not isinstance(entry, dict) or not is_digest(entry.get("digest")):
        return None
    title, size = entry.get("title"), entry.get("size")
    if title_issue(title) is not None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None
    return str(title), Digest.parse(str(entry["digest"])), size


def _held_files_of(raw: bytes, doc: Any, path: str) -> HeldFiles:
    """The files ``doc`` says the far side holds: an inventory's ``files`` (1.5; a folder's: at their
    titles), an earlier bundle.json's artifacts (written at their titles, held ones included)."""
    held = HeldFiles()
    if not isinstance(doc, dict):
        return held
    if doc.get("kind") == "inventory":
        inventory = load_inventory(raw, what=path)  # its checksum: a file changed on the way is refused
        engine = inventory.get("engine")
        by_title = isinstance(engine, dict) and engine.get("kind") == "folder"
        for entry in inventory.get("files") or [] if isinstance(inventory.get("files"), list) else []:
            found = _held_file(entry)
            if found is not None:
                title, digest, size = found
                if by_title:
                    held.at_title[(title, digest)] = size
                else:
                    held.anywhere[digest] = size
        if isinstance(engine, dict) and engine.get("kind") in ("registry", "oci"):  # a blob is its bytes, by digest
            for image in inventory.get("images") or []:  # a file artifact is listed too (its problems: no diff_ids)
                for desc in image.get("blobs") or [] if isinstance(image, dict) else []:
                    blob = _held_file({**desc, "title": "blob"}) if isinstance(desc, dict) else None
                    if blob is not None:
                        held.anywhere[blob[1]] = blob[2]
    elif str(doc.get("mediaType", "")).startswith("application/vnd.sneakernet.bundle.") \
            and isinstance(doc.get("artifacts"), list):
        for art in doc["artifacts"]:
            for entry in art.get("files") or [] if isinstance(art, dict) and isinstance(art.get("files"), list) else []:
                found = _held_file(entry)
                if found is not None:
                    held.at_title[(found[0], found[1])] = found[2]
    return held


def merge_held_files(paths: Sequence[str]) -> HeldFiles:
    """The files every ``--have`` file says the far side holds (none: an empty :class:`HeldFiles`)."""
    held = HeldFiles()
    for path in paths:
        raw = read_file_limited(path, MAX_ENGINE_JSON, path)
        held.update(_held_files_of(raw, parse_json(raw, path), path))
    return held


def merge_have(paths: Any) -> HaveLayers:
    """Every ``--have`` file together; a compressed blob named by any file wins over none."""
    merged: HaveLayers = {}
    for path in paths:
        for diff_id, blob in load_have_layers(path).items():
            _add(merged, diff_id, blob)
    return merged


def load_have(path: str) -> Set[Digest]:
    """The diff_ids held by the host described by ``path`` (inventory or bundle.json)."""
    return set(load_have_layers(path))


def zstd_is_fast_on(paths: Sequence[str]) -> Optional[bool]:
    """Whether every host described by an inventory among ``paths`` decodes zstd fast (a zstd
    module or the zstd command, docs/benchmarks.md); None when no file says (no inventory, a
    bundle.json, an inventory 1.0 without ``decoders``)."""
    said: List[bool] = []
    for path in paths:
        raw = read_file_limited(path, MAX_ENGINE_JSON, path)
        doc = parse_json(raw, path)
        if isinstance(doc, dict) and doc.get("kind") == "inventory":
            decoders = inventory_decoders(load_inventory(raw, what=path))
            if decoders is not None:
                said.append(any(d in FAST_ZSTD_DECODERS for d in decoders))
    return all(said) if said else None


def engine_reads_zstd(kind: str, version: str) -> Optional[bool]:
    """Whether an engine pulls and loads zstd layers: Docker from 23.0, containerd from 1.5
    (podman, OCI layouts and registries do); None when the version says nothing."""
    if kind in ("podman", "oci", "registry"):
        return True
    v = major_minor(version)  # ASCII digits only: Arabic-Indic '23.0' says nothing, as 'abc' does
    if v is None or max(v) > 9999 or kind not in ("docker", "containerd"):
        return None
    return v[0] >= 23 if kind == "docker" else v >= (1, 5)


def engines_read_zstd(paths: Sequence[str]) -> Optional[Tuple[bool, str]]:
    """Whether every engine an inventory among ``paths`` describes reads zstd layers (and the
    first that does not, ``docker 20.10.24``); None when no inventory says."""
    said: List[Tuple[bool, str]] = []
    for path in paths:
        raw = read_file_limited(path, MAX_ENGINE_JSON, path)
        doc = parse_json(raw, path)
        if isinstance(doc, dict) and doc.get("kind") == "inventory":
            engine = load_inventory(raw, what=path).get("engine")
            if isinstance(engine, dict):
                kind, version = str(engine.get("kind", "")), str(engine.get("version", ""))
                reads = engine_reads_zstd(kind, version)
                if reads is not None:
                    said.append((reads, f"{kind} {version}"[:80]))
    if not said:
        return None
    return next((s for s in said if not s[0]), said[0])


def have_platform(paths: Sequence[str]) -> Optional[Platform]:
    """The platform the offline host runs, as its inventories among ``paths`` say (1.2+); None
    when none says. Inventories naming different platforms are refused: one bundle, one platform."""
    said: Dict[Platform, str] = {}
    for path in paths:
        raw = read_file_limited(path, MAX_ENGINE_JSON, path)
        doc = parse_json(raw, path)
        if isinstance(doc, dict) and doc.get("kind") == "inventory":
            found = inventory_platform(load_inventory(raw, what=path))
            if found is not None and not any(found.matches(p) for p in said):
                said[found] = path
    if len(said) > 1:
        raise UsageError("exporting with --have: expected inventories of one platform, found "
                         + ", ".join(f"{p} ({path})" for p, path in said.items()),
                         hint="export one bundle per platform, with --platform and that platform's inventory")
    return next(iter(said), None)
