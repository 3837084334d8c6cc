"""Delta bundles into a registry: every layer the bundle leaves out (``"external": true``) must
already be in each destination repository, or be mounted there from a repository that holds it.

:func:`plan_external` finds, before anything is uploaded, where each external blob is: HEAD in
the destination repository, else the first holder among the push's other destination
repositories, else the first holder in the registry's catalog (bounded, one HEAD per repository,
stopping at the first hit). Any blob found nowhere: :class:`DeltaBaseMissing` (exit 9), naming
every missing layer and the images that need it, nothing pushed. :func:`mount_external` then
mounts (cross-repository) what is not in place. External blobs are never uploaded: the bundle
does not have them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from importer.errors import DeltaBaseMissing, LimitExceeded, RegistryAuthError
from importer.format.digest import Digest
from importer.format.manifest import LayerRecord
from importer.registry.client import Destination, RegistryClient
from importer.registry.inventory import list_repositories
from importer.streams.threads import each

DOCKER_FORM_HINT = ("; a delta made from a Docker or podman inventory names its base layers uncompressed, by "
                    "diff_id, which a registry does not hold: it cannot complete in a registry")


@dataclass
class ExternalBlob:
    """One external layer blob in one destination repository."""

    repository: str
    layer: LayerRecord
    images: List[str]
    status: str = "missing"  # "present", "mount" (then "mounted"), "missing"
    source: Optional[str] = None  # the repository to mount from

    def to_dict(self) -> Dict[str, Any]:
        return {"digest": str(self.layer.digest), "diffId": str(self.layer.diff_id), "repository": self.repository,
                "status": self.status, "from": self.source}


@dataclass
class DeltaPlan:
    """Where every external blob of a delta push is, and how it gets into place."""

    blobs: List[ExternalBlob] = field(default_factory=list)
    catalog: Optional[str] = None  # None: not needed; "listed", "unavailable", "refused", "too-large"
    repositories_searched: int = 0
    head_requests: int = 0

    def count(self, status: str) -> int:
        return sum(1 for b in self.blobs if b.status == status)

    def pairs(self, *statuses: str) -> List[Tuple[str, Digest]]:
        return [(b.repository, b.layer.digest) for b in self.blobs if b.status in statuses]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "externalLayers": len({b.layer.digest for b in self.blobs}),
            "present": self.count("present"),
            "mounted": self.count("mounted"),
            "mounts": [b.to_dict() for b in self.blobs if b.status == "mounted"],
            "catalog": self.catalog,
            "repositoriesSearched": self.repositories_searched,
            "headRequests": self.head_requests,
        }


def external_blobs(refs: Sequence[Tuple[Destination, str, Sequence[LayerRecord]]]) -> List[ExternalBlob]:
    """One entry per (destination repository, external blob); ``refs`` are (destination, image
    name, layers). A blob the bundle stores for another image is not external."""
    stored = {x.digest for _, _, layers in refs for x in layers if not x.external}
    out: Dict[Tuple[str, Digest], ExternalBlob] = {}
    for dest, name, layers in refs:
        for layer in layers:
            if not layer.external or layer.digest in stored:
                continue
            entry = out.setdefault((dest.repository, layer.digest), ExternalBlob(dest.repository, layer, []))
            if name not in entry.images:
                entry.images.append(name)
    return list(out.values())


def _holds(client: RegistryClient, repo: str, layer: LayerRecord) -> bool:
    size = client.blob_size(repo, layer.digest)
    return size is not None and (size < 0 or size == layer.size)


def plan_external(client: RegistryClient, blobs: List[ExternalBlob], *, workers: int = 4) -> DeltaPlan:
    """HEAD every external blob where it goes; find a mount source for each one missing; raise
    DeltaBaseMissing (nothing pushed yet) when a blob is nowhere in the registry."""
    plan = DeltaPlan(blobs=blobs)
    here = each(workers, lambda b: _holds(client, b.repository, b.layer), blobs, client.cancel)
    plan.head_requests += len(blobs)
    holder: Dict[Digest, str] = {}
    for b, found in zip(blobs, here):
        if found:
            b.status = "present"
            holder.setdefault(b.layer.digest, b.repository)
    lost = {b.layer.digest: b.layer for b in blobs if b.status != "present" and b.layer.digest not in holder}
    if lost:
        searched_by_digest = {d: {b.repository for b in blobs if b.layer.digest == d} for d in lost}
        repos, plan.catalog = _catalog(client)
        plan.repositories_searched = len(repos or [])
        for digest, layer in lost.items():
            candidates = [r for r in repos or [] if r not in searched_by_digest[digest]]
            source = _first_holder(client, candidates, layer, workers, plan)
            if source is not None:
                holder[digest] = source
    for b in blobs:
        if b.status != "present" and b.layer.digest in holder:
            b.status, b.source = "mount", holder[b.layer.digest]
    missing = [b for b in blobs if b.status == "missing"]
    if missing:
        raise _base_missing(client, plan, missing)
    return plan


def _catalog(client: RegistryClient) -> Tuple[Optional[List[str]], str]:
    """Every repository of the registry and "listed"; else None and why not."""
    try:
        repos = list_repositories(client, required=False)
    except RegistryAuthError:
        return None, "refused"
    except LimitExceeded:
        return None, "too-large"
    return (repos, "listed") if repos is not None else (None, "unavailable")


_CATALOG_WHY = {
    "unavailable": "the registry has no catalog API (/v2/_catalog)",
    "refused": "the registry refused to list its catalog (/v2/_catalog) with these credentials",
    "too-large": "the registry's catalog is larger than the listing limit",
}


def _first_holder(client: RegistryClient, candidates: List[str], layer: LayerRecord, workers: int,
                  plan: DeltaPlan) -> Optional[str]:
    """The first of ``candidates`` holding ``layer`` (HEADs in batches of ``workers``), or None."""
    batch = max(1, workers)
    for start in range(0, len(candidates), batch):
        part = candidates[start:start + batch]
        found = each(workers, lambda repo: _holds(client, repo, layer), part, client.cancel)
        plan.head_requests += len(part)
        for repo, ok in zip(part, found):
            if ok:
                return repo
    return None


def _base_missing(client: RegistryClient, plan: DeltaPlan, missing: List[ExternalBlob]) -> DeltaBaseMissing:
    by_digest: Dict[Digest, List[ExternalBlob]] = {}
    for b in missing:
        by_digest.setdefault(b.layer.digest, []).append(b)
    lines = []
    uncompressed = False
    for entries in by_digest.values():
        layer = entries[0].layer
        users = sorted({name for b in entries for name in b.images})
        line = f"registry lacks layer {layer.digest} required by {', '.join(users)}"
        if layer.digest == layer.diff_id:  # the form a Docker/podman inventory gives
            uncompressed = True
            line += " (named uncompressed, by diff_id)"
        lines.append(line)
    wanted = len({b.layer.digest for b in plan.blobs})
    dests = sorted({b.repository for b in plan.blobs})
    if plan.catalog in _CATALOG_WHY:
        lines.append(f"searched: {', '.join(dests)}; {_CATALOG_WHY[plan.catalog]}, "
                     "so no other repository could be searched")
    else:
        lines.append(f"searched: {', '.join(dests)} and {plan.repositories_searched} repositories of the catalog")
    host = client.target.host
    return DeltaBaseMissing(
        f"checking the base of a delta bundle: expected the registry {host} to hold {wanted} layer(s) the bundle "
        f"leaves out, found {len(by_digest)} missing",
        context="\n".join(lines),
        hint=("nothing was pushed; push/import the base bundle into this registry first, or re-export with --have "
              f"from this registry's inventory (bundle-import --inventory --registry {host})"
              + (DOCKER_FORM_HINT if uncompressed else "")),
    )


def mount_external(client: RegistryClient, plan: DeltaPlan, *, workers: int = 4) -> None:
    """Mount every external blob not yet in its repository from the holder found by the plan."""
    todo = [b for b in plan.blobs if b.status == "mount"]

    def mount(b: ExternalBlob) -> bool:
        assert b.source is not None
        return client.mount_blob(b.repository, b.layer.digest, b.source)

    for b, ok in zip(todo, each(workers, mount, todo, client.cancel)):
        if ok:
            b.status = "mounted"
    refused = [b for b in todo if b.status != "mounted"]
    if refused:
        first = refused[0]
        raise DeltaBaseMissing(
            f"mounting layer {first.layer.digest.short} into {first.repository} from {first.source}: expected the "
            "registry to mount it (HTTP 201), found it opening an upload instead",
            context="\n".join(f"{b.repository}: layer {b.layer.digest} from {b.source}" for b in refused),
            hint="the bundle does not hold these layers, so they cannot be uploaded: allow cross-repository mounts "
            "(pull rights on the source repository), or push the base bundle into the destination first",
        )
