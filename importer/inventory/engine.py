"""``bundle-import --inventory``: what an engine holds, as JSON with a checksum.

The document lists every image with its ID, names, config and manifest digests (where the
engine keeps them), diff_ids and, where the engine keeps compressed blobs (containerd's content
store, an OCI layout), their digests. It is what a delta export on the online side consumes
(``bundle export --have``), so it travels back across the air gap: ``checksum`` is the sha256
of the canonical JSON of every other field, and :func:`load_inventory` refuses a document whose
checksum does not match (schema: ``schemas/inventory/inventory-v1.schema.json``).

Since 1.1 it also lists the layer ``decoders`` the host has (importer/streams/compression.py
host_decoders): ``bundle export --compression auto --have`` writes zstd layers only when the
host decodes zstd fast, gzip otherwise.

Since 1.2 it names the ``platform`` the engine runs images for (``linux/arm64/v8`` on a Grace
node; engines only: an OCI layout or a registry holds any platform), so ``bundle export --have``
picks that platform from a multi-platform image unless ``--platform`` says otherwise.

Since 1.3 it describes the host's GPU side (``gpu``: driver, its CUDA, each GPU's name, brand,
compute capability and data-center flag, the container toolkit's version and mode;
importer/inventory/gpuhost.py), so ``bundle export --have`` says whether each image will run
there (docs/gpu-fit.md). Older inventories still read: no ``gpu``, the fit is "unknown".

Since 1.4 it names the ``node`` as the GPU Operator sees it (os-release ``ID``/``VERSION_ID``, kernel
release and flavour, architecture; importer/inventory/nodefacts.py), so ``bundle export
--images-from-manifests --have`` computes each node's driver image tag (docs/kubernetes.md).

Since 1.5 it may list ``files`` (``title``, ``size``, ``digest``): the files a ``--files-to DIR``
folder holds (importer/inventory/folder.py, ``engine.kind`` ``folder``), so ``bundle export --files
... --have`` leaves out the files the far side holds (a file delta, docs/files.md)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

from importer import __version__
from importer.engines import EngineImage, EngineInfo
from importer.errors import InventoryDamaged, ManifestError, UsageError
from importer.format.digest import is_digest
from importer.format.limits import parse_json
from importer.format.platform import Platform, host, of_dict, to_dict
from importer.inventory import gpuhost
from importer.inventory.nodefacts import env_os_release, node_facts
from importer.receipts.receipt import host_facts, now_utc
from importer.sinks import Sink, inventorying
from importer.streams.compression import host_decoders

INVENTORY_VERSION = "1.5"  # 1.1: decoders; 1.2: platform; 1.3: gpu; 1.4: node; 1.5: files
ENGINE_KINDS = ("docker", "containerd", "podman")
KIND = "inventory"


def image_entry(image: EngineImage) -> Dict[str, Any]:
    return {
        "id": image.image_id,
        "names": sorted(image.tags),
        "configDigest": image.config_digest,
        "manifestDigest": image.manifest_digest,
        "diffIds": list(image.diff_ids),
        "blobs": [dict(b) for b in image.blobs] or None,
        "problems": list(image.problems),
    }


def canonical_bytes(doc: Dict[str, Any]) -> bytes:
    """The bytes the checksum covers: every field but ``checksum`` as JSON with keys sorted, no
    spaces, non-ASCII escaped (``json.dumps(body, sort_keys=True, separators=(",", ":"))``)."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")


def with_ok(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The inventory as ``--json`` prints it: ``"ok": true`` (covered by the checksum) added."""
    out = {"ok": True, **{k: v for k, v in doc.items() if k != "checksum"}}
    out["checksum"] = checksum(out)
    return out


def checksum(doc: Dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_bytes(doc)).hexdigest()


def inventory_head() -> Dict[str, Any]:
    """What every inventory starts with (an engine's, a registry's, a folder's): version, kind, the
    tool, when, this host."""
    return {"inventoryVersion": INVENTORY_VERSION, "kind": KIND, "tool": {"name": "sneakernet", "version": __version__},
            "created": now_utc(), "host": host_facts()}


def build_inventory(engine: EngineInfo, images: List[EngineImage], *, selected_by: str = "") -> Dict[str, Any]:
    engine_doc = engine.to_dict()
    if selected_by:
        engine_doc["selectedBy"] = selected_by
    doc: Dict[str, Any] = {
        **inventory_head(),
        "decoders": host_decoders(),
        "gpu": gpuhost.probe(),
        "node": node_facts(env_os_release()),
        "engine": engine_doc,
        "images": sorted((image_entry(x) for x in images), key=lambda e: (e["id"], e["names"])),
    }
    if engine.kind in ENGINE_KINDS:
        doc["platform"] = to_dict(host())
    doc["checksum"] = checksum(doc)
    return doc


def take_inventory(sink: Sink, *, selected_by: str = "") -> Dict[str, Any]:
    """Probe the engine and list everything it holds."""
    if not sink.capabilities.lists_images:
        raise UsageError(f"--inventory with the {sink.kind} engine: expected an engine "
                         "that can list its images, found one that cannot")
    engine = sink.probe()
    return build_inventory(engine, inventorying(sink).inventory(), selected_by=selected_by)


def held_diff_ids(doc: Dict[str, Any]) -> List[str]:
    """Every distinct diff_id the inventory says the engine holds (for delta exports)."""
    seen: Dict[str, bool] = {}
    for image in doc.get("images") or []:
        if isinstance(image, dict) and not image.get("problems"):
            for d in image.get("diffIds") or []:
                if is_digest(d):
                    seen.setdefault(d, True)
    return list(seen)


def load_inventory(raw: bytes, *, what: str = "the inventory") -> Dict[str, Any]:
    """Parse an inventory and check its version and checksum; raise on damage."""
    doc = parse_json(raw, what)
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ManifestError(f"reading {what}: expected a sneakernet inventory (kind {KIND!r}), found something else",
                            hint="produce it with `bundle-import --inventory --engine ... > inventory.json`")
    version = doc.get("inventoryVersion")
    if not isinstance(version, str) or not version.startswith("1."):
        raise ManifestError(f"reading {what}: expected inventoryVersion 1.x, found {version!r}",
                            hint="use a sneakernet release that reads this inventory version")
    want = doc.get("checksum")
    found = checksum(doc)
    if want != found:
        raise InventoryDamaged(
            f"checking {what}: expected checksum {want!r}, found {found} (the file was changed or damaged)",
            hint="take the inventory again on the offline host and carry it back unchanged",
        )
    return doc


def inventory_decoders(doc: Dict[str, Any]) -> Optional[List[str]]:
    """The decoders an inventory says its host has; None for a 1.0 inventory (not said)."""
    found = doc.get("decoders")
    if not isinstance(found, list):
        return None
    return [d for d in found if isinstance(d, str)]


def inventory_platform(doc: Dict[str, Any]) -> Optional[Platform]:
    """The platform an inventory says its engine runs; None before 1.2 and for OCI/registry targets."""
    return of_dict(doc.get("platform"))
