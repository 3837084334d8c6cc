"""Import preflight: everything that can be checked before the first byte is written.

Checked, in order, before the bundle's bytes are verified and before the engine is changed:
the signature/trust policy (importer/verify/signature.py, the very first step), the schema version
(bundle.json is read from the bytes whose signature was checked), the engine answering, and the
free space the import needs. A failed preflight raises and changes nothing.

Space rule (docs/security.md, "Preflight"): for the images not already in the engine, with U
the sum of the uncompressed sizes of their distinct layers plus their configs,

* engine data root: ``docker load`` first unpacks the whole archive into a temp dir inside
  the data root (``<data-root>/tmp``), then stores each layer: ``2 * U``. The ``vfs`` driver
  stores every layer as a full copy of all layers below it, so there it is ``U`` plus, for
  each distinct layer chain, the cumulative size of the chain. Plus :data:`DATA_ROOT_MARGIN`
  for the engine's own metadata.
* temp dir of the importer: command output it captures, :data:`TEMP_NEED` (margin included).
* when the data root and the temp dir share a file system, their needs add up. Layers the
  engine already holds are counted too (``docker load`` unpacks them before it skips them).

The data root is checked only when the engine is local (a ``unix://`` address) and its data
root exists on this host; otherwise the check says it was skipped and why.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from importer.engines import EngineInfo
from importer.errors import PlatformMismatch, SinkError
from importer.format.manifest import BundleManifest, ImageRecord
from importer.format.platform import VARIANT_IF_BOTH, VARIANT_IGNORED, Platform, host, of_dict, platform_matches
from importer.pipeline.steps import find_held
from importer.sinks import Sink
from importer.streams.progress import human_bytes

DATA_ROOT_MARGIN = 16 * 1024 * 1024
TEMP_NEED = 4 * 1024 * 1024


class InsufficientSpace(SinkError):
    """Preflight: a file system the import writes to has less free space than it needs."""

    reference = "insufficient-space"


@dataclass
class SpaceNeed:
    path: str
    purpose: str
    need: int


@dataclass
class SpaceCheck:
    paths: List[str]
    purposes: List[str]
    need: int
    available: int

    @property
    def ok(self) -> bool:
        return self.available >= self.need

    def to_dict(self) -> Dict[str, Any]:
        return {"name": "space", "ok": self.ok, "paths": self.paths, "purposes": self.purposes,
                "needBytes": self.need, "availableBytes": self.available}

    def text(self) -> str:
        return (f"{' and '.join(self.paths)} ({'; '.join(self.purposes)}): need {human_bytes(self.need)} "
                f"({self.need} bytes), available {human_bytes(self.available)} ({self.available} bytes)")


@dataclass
class PreflightReport:
    checks: List[Dict[str, Any]] = field(default_factory=list)
    space: List[SpaceCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.get("ok", False) for c in self.checks) and all(s.ok for s in self.space)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append({"name": name, "ok": ok, "detail": detail})

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": self.ok, "checks": self.checks + [s.to_dict() for s in self.space]}

    def raise_if_short(self) -> None:
        short = [s for s in self.space if not s.ok]
        if short:
            raise InsufficientSpace(
                "checking free space before importing: expected enough room, found too little on "
                + "; ".join(s.text() for s in short),
                context="\n".join(s.text() for s in self.space),
                hint="nothing was changed; free space there (or point TMPDIR elsewhere for the temp dir) "
                "and retry",
            )


def layer_bytes(images: Sequence[ImageRecord]) -> int:
    """Uncompressed bytes of the distinct layers of ``images`` plus their configs: what
    ``docker load`` receives (the archive importer/sinks/dockerarchive.py writes)."""
    layers = {layer.diff_id: layer.uncompressed_size for image in images for layer in image.layers}
    configs = {image.config.digest: image.config.size for image in images}
    return sum(layers.values()) + sum(configs.values())


def vfs_bytes(images: Sequence[ImageRecord]) -> int:
    """What the vfs driver stores: every distinct layer chain as a full copy of itself."""
    chains: Dict[Tuple[str, ...], int] = {}
    for image in images:
        total = 0
        for i, layer in enumerate(image.layers):
            total += layer.uncompressed_size
            chains[tuple(str(x.diff_id) for x in image.layers[: i + 1])] = total
    return sum(chains.values())


def data_root_need(images: Sequence[ImageRecord], storage_driver: str) -> int:
    """Bytes the engine's data root needs for loading ``images`` (the rule above, no margin)."""
    archive = layer_bytes(images)
    stored = vfs_bytes(images) if storage_driver == "vfs" else archive
    return archive + stored


def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def free_bytes(path: str) -> Tuple[int, int]:
    """(device id, bytes available to unprivileged writers) of the file system holding path."""
    where = _existing_ancestor(path)
    st = os.statvfs(where)
    return os.stat(where).st_dev, st.f_bavail * st.f_frsize


def check_space(needs: Sequence[SpaceNeed]) -> List[SpaceCheck]:
    """Group needs by file system (needs on one file system add up), compare."""
    by_dev: Dict[int, SpaceCheck] = {}
    for n in needs:
        dev, avail = free_bytes(n.path)
        check = by_dev.get(dev)
        if check is None:
            check = by_dev[dev] = SpaceCheck([], [], 0, avail)
        if n.path not in check.paths:
            check.paths.append(n.path)
        check.purposes.append(f"{n.purpose}: {human_bytes(n.need)}")
        check.need += n.need
    return list(by_dev.values())


def images_to_load(sink: Sink, manifest: BundleManifest, engine: EngineInfo) -> List[ImageRecord]:
    """The images the engine does not hold yet in verified form (the rule every import uses:
    importer/pipeline/steps.py ``find_held``)."""
    return [image for image in manifest.images if find_held(sink, image, engine) is None]


def data_root_visible(engine: EngineInfo) -> Optional[str]:
    """Why the data root cannot be checked from here, or None when it can."""
    if not engine.data_root:
        return "the engine does not report its data root"
    if not engine.address.startswith("unix://"):
        return f"the engine at {engine.address} is not local"
    if not os.path.isdir(engine.data_root):
        return f"its data root {engine.data_root} is not visible on this host"
    return None


def run_preflight(
    manifest: Any,
    engine: EngineInfo,
    to_load: Sequence[ImageRecord],
    *,
    signature_line: str,
    tmpdir: Optional[str] = None,
    data_root_bytes: Optional[int] = None,
) -> PreflightReport:
    """Record what was already established and check free space (call :meth:`raise_if_short`).
    ``manifest``: a BundleManifest or a LegacyManifest (importer/verify/legacy.py), whose images carry
    no layer sizes; then ``data_root_bytes`` (``2 x`` the uncompressed archive) replaces the rule."""
    report = PreflightReport()
    report.add("signature", True, signature_line)
    report.add("schema", True, f"bundle schema {manifest.schema_version} is supported")
    report.add("engine", True, f"{engine.kind} {engine.version} at {engine.address} answers "
               f"(storage {engine.storage_driver}, image store {engine.image_store})")
    needs = [SpaceNeed(tmpdir or tempfile.gettempdir(), "importer temp files", TEMP_NEED)]
    skipped = data_root_visible(engine)
    if skipped is None and to_load:
        assert engine.data_root is not None
        if data_root_bytes is not None:
            rule, need = "2 x the uncompressed archive", data_root_bytes
        else:
            rule = "vfs: archive + full copy per layer chain" if engine.storage_driver == "vfs" else "2 x layers"
            need = data_root_need(to_load, engine.storage_driver)
        needs.append(SpaceNeed(engine.data_root, f"engine data root, {len(to_load)} image(s), {rule} + margin",
                               need + DATA_ROOT_MARGIN))
        report.add("data-root", True, f"checking {engine.data_root}")
    elif skipped is None:
        report.add("data-root", True, "nothing to load: every image is already present")
    else:
        report.add("data-root", True, f"not checked: {skipped}")
    report.space = check_space(needs)
    return report


#: engines that run images (an OCI layout or a registry holds any platform)
RUNNING_ENGINES = ("docker", "containerd", "podman")


def select_platform(manifest: BundleManifest, engine: EngineInfo, want: Optional[Platform] = None) -> BundleManifest:
    """An engine runs one platform: each multi-platform image (schema 3.2) is imported as the
    carried platform it runs (``want``: ``bundle-import --platform``, default this host's; OS and
    architecture compared, variant too when both name one). Refused before any change when an
    image carries none for it, naming the platforms it has. Other targets (an OCI layout, a
    registry) and single-platform bundles: unchanged (then :func:`check_platforms`)."""
    if engine.kind not in RUNNING_ENGINES or not manifest.multi_platform:
        return manifest
    runs = (want or host()).normalized()
    images: List[ImageRecord] = []
    missing: List[str] = []
    for image in manifest.images:
        if not image.others:
            images.append(image)
            continue
        match = [v for v in image.variants if _runs(of_dict(v.platform), runs)]
        if not match:
            missing.append(f"{image.name} (carries {', '.join(v.platform_text() for v in image.variants)})")
            continue
        chosen = match[0]
        images.append(ImageRecord(image.refs, chosen.manifest, chosen.config, chosen.layers, chosen.platform,
                                  label=image.label))
    if missing:
        raise PlatformMismatch(
            f"importing into {engine.kind} at {engine.address}: expected a manifest for {Platform(*runs)} in "
            f"every multi-platform image, found none in {len(missing)}: {'; '.join(missing[:10])}",
            hint="export the platform this host runs (bundle export --platform OS/ARCH, or --all-platforms), or "
                 "pass --platform OS/ARCH for an engine that runs it emulated; nothing was changed")
    return dataclasses.replace(manifest, images=tuple(images))


def _runs(plat: Optional[Platform], runs: Platform) -> bool:
    return plat is not None and platform_matches(plat, runs, variant=VARIANT_IF_BOTH)


def check_platforms(manifest: BundleManifest, engine: EngineInfo, want: Optional[Platform] = None) -> None:
    """Refuse, before any change, a bundle whose images are for another platform than the engine
    runs (``want``: ``bundle-import --platform``, default this host's). OS and architecture are
    compared (containerd's normalisation: aarch64 = arm64); images whose config names no platform
    pass."""
    if engine.kind not in RUNNING_ENGINES:
        return
    runs = (want or host()).normalized()
    other = []
    for image in manifest.images:
        plat = of_dict(image.platform)
        if plat is not None and not platform_matches(plat, runs, variant=VARIANT_IGNORED):
            other.append(f"{', '.join(image.refs) or image.config.digest} ({plat})")
    if other:
        raise PlatformMismatch(
            f"importing into {engine.kind} at {engine.address}: expected images for {Platform(*runs[:2])}, "
            f"found {len(other)} for another platform: {'; '.join(other[:10])}",
            hint="export the images for this host's platform (bundle export --platform OS/ARCH, or --have "
                 "with this host's inventory); an engine that runs them emulated: pass --platform OS/ARCH")
