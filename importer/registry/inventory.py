"""What a registry holds (``bundle-import --inventory --registry HOST[:PORT][/NAMESPACE]``).

The catalog (``GET /v2/_catalog``, paged with ``n``/``last`` and the ``Link`` header), each
repository's tags (``GET /v2/<repo>/tags/list``, paged the same way), each tag's manifest (an
index: the manifest for this host's platform), its config's diff_ids and its layer descriptors.
Images are keyed by the digest of the manifest bytes the tag names, so every tag of one image is
listed once. Everything is bounded (importer/format/limits.py); a registry without the catalog API is a
clear error. The layer descriptors are what a delta export names (``bundle export --have``), and
what a delta push into this registry then finds and mounts (importer/registry/push.py)."""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from importer.engines import EngineImage
from importer.errors import LimitExceeded, RegistryAuthError, RegistryError, RegistryNoCatalog, RegistryUnreachable
from importer.format.digest import Digest, is_digest
from importer.format.limits import (
    MAX_CONFIG,
    MAX_MANIFEST,
    MAX_REGISTRY_IMAGES,
    MAX_REGISTRY_REPOSITORIES,
    MAX_REGISTRY_TAGS,
    REGISTRY_PAGE,
)
from importer.format.platform import pick_platform_manifest
from importer.format.reference import valid_path, valid_tag
from importer.registry.client import MANIFEST_ACCEPT, RegistryClient
from importer.streams.threads import each

_NEXT_RE = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?')
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_SCHEMA1 = ("application/vnd.docker.distribution.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.v1+prettyjws")

NO_CATALOG_HINT = ("this registry does not list its repositories (/v2/_catalog); take the inventory on an engine "
                   "that holds the base, or pass the base bundle's bundle.json to `bundle export --have`")


def _next_path(link: Optional[str], path: str) -> Optional[str]:
    """The next page from a ``Link: <...>; rel="next"`` header, on this registry and this endpoint."""
    if not link:
        return None
    m = _NEXT_RE.search(link)
    if m is None:
        return None
    parts = urllib.parse.urlsplit(m.group(1))
    if parts.path != path or not parts.query:
        return None
    return f"{parts.path}?{parts.query}"


def _paged(client: RegistryClient, path: str, key: str, limit: int, *, what: str, repo: str = "",
           missing_ok: bool = False) -> Tuple[List[str], bool]:
    """Every string of ``doc[key]`` over the pages of ``path``; (values, True) or, when the
    registry answers 404/405 and ``missing_ok``, ([], False)."""
    values: List[str] = []
    seen: Dict[str, None] = {}
    url: Optional[str] = f"{path}?{urllib.parse.urlencode({'n': REGISTRY_PAGE})}"
    visited: Dict[str, None] = {}
    while url is not None:
        if url in visited:
            break  # a Link loop: what was listed is all there is
        visited[url] = None
        resp = client.request("GET", url, what=what, ok=(200, 404, 405) if missing_ok else (200,), repo=repo)
        if resp.status != 200:
            return [], False
        try:
            doc = json.loads(resp.body.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # RecursionError: a list nested past the stack
            raise RegistryError(f"{what}: expected JSON, found something else ({e})",
                                hint="the registry answered with something other than the distribution API") from e
        page = doc.get(key) if isinstance(doc, dict) else None
        if page is None:
            page = []
        if not isinstance(page, list):
            raise RegistryError(f"{what}: expected a list in {key!r}, found {type(page).__name__}")
        new = 0
        for value in page:
            if isinstance(value, str) and value not in seen:
                seen[value] = None
                values.append(value)
                new += 1
        if len(values) > limit:
            raise LimitExceeded(f"{what}: expected at most {limit} entries, found more",
                                hint="name a namespace (--registry HOST:PORT/NAMESPACE) to list part of the registry")
        if not new:
            break
        url = _next_path(resp.header("Link"), path)
        if url is None and len(page) >= REGISTRY_PAGE:  # no Link header: go on after the last one
            url = f"{path}?{urllib.parse.urlencode({'n': REGISTRY_PAGE, 'last': page[-1]})}"
    return values, True


def list_repositories(client: RegistryClient, *, namespace: str = "", required: bool = True) -> Optional[List[str]]:
    """Every repository of the catalog (under ``namespace`` if given), sorted; None when the
    registry has no catalog API and not ``required``."""
    values, ok = _paged(client, "/v2/_catalog", "repositories", MAX_REGISTRY_REPOSITORIES, missing_ok=True,
                        what=f"listing the repositories of {client.target.host} (/v2/_catalog)")
    if not ok:
        if not required:
            return None
        raise RegistryNoCatalog(
            f"listing the repositories of {client.target.host}: expected the catalog API (/v2/_catalog), "
            "found none (HTTP 404/405)", hint=NO_CATALOG_HINT)
    repos = [r for r in values if valid_path(r) and len(r) <= 255]
    if namespace:
        repos = [r for r in repos if r == namespace or r.startswith(namespace + "/")]
    return sorted(repos)


def list_tags(client: RegistryClient, repo: str) -> List[str]:
    """Every tag of ``repo`` (none when the repository is gone or has none)."""
    values, _ok = _paged(client, f"/v2/{repo}/tags/list", "tags", MAX_REGISTRY_TAGS, repo=repo, missing_ok=True,
                         what=f"listing the tags of {repo}")
    return sorted(t for t in values if valid_tag(t))


@dataclass
class _Described:
    """One tag's image as the registry holds it."""

    image_id: str = ""
    manifest_digest: Optional[str] = None
    config_digest: Optional[str] = None
    diff_ids: List[str] = field(default_factory=list)
    blobs: List[Dict[str, Any]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _get_manifest(client: RegistryClient, repo: str, reference: str) -> Optional[Tuple[bytes, str, str]]:
    r = client.request("GET", f"/v2/{repo}/manifests/{reference}", ok=(200, 404), repo=repo, limit=MAX_MANIFEST,
                       headers={"Accept": MANIFEST_ACCEPT}, what=f"reading the manifest {repo}:{reference}")
    if r.status == 404:
        return None
    return r.body, (r.header("Content-Type") or "").split(";")[0].strip(), r.header("Docker-Content-Digest") or ""


def _get_config(client: RegistryClient, repo: str, digest: Digest) -> Optional[bytes]:
    r = client.request("GET", f"/v2/{repo}/blobs/{digest}", ok=(200, 302, 307, 404), repo=repo, limit=MAX_CONFIG,
                       what=f"reading the config {digest.short} of {repo}")
    if r.status == 404:
        return None
    return r.body if r.status == 200 else client.get_blob(repo, digest, MAX_CONFIG)


def describe_tag(client: RegistryClient, repo: str, tag: str, configs: Dict[str, Any]) -> Optional[_Described]:
    """Manifest (this platform's, for an index) -> config -> diff_ids and layer descriptors;
    None when the tag vanished while listing. ``configs`` caches parsed configs by digest."""
    got = _get_manifest(client, repo, tag)
    if got is None:
        return None
    raw, media_type, header_digest = got
    out = _Described(image_id=str(Digest.of_bytes(raw)))
    if header_digest and header_digest != out.image_id:
        out.problems.append(f"the registry names the manifest {header_digest}, its bytes hash to {out.image_id}")
    doc = _json(raw)
    if not isinstance(doc, dict):
        out.problems.append("the manifest is not a JSON object")
        return out
    media_type = str(doc.get("mediaType") or media_type)
    out.manifest_digest = out.image_id
    if media_type in _INDEX_TYPES or isinstance(doc.get("manifests"), list):
        chosen = pick_platform_manifest(doc)
        if chosen is None:
            out.problems.append("the image is an index with no manifest for this platform")
            return out
        sub = _get_manifest(client, repo, chosen)
        if sub is None:
            out.problems.append(f"the index names manifest {chosen}, the registry does not have it")
            return out
        out.manifest_digest = str(Digest.of_bytes(sub[0]))
        if out.manifest_digest != chosen:
            out.problems.append(f"manifest {chosen}: its bytes hash to {out.manifest_digest}")
        doc = _json(sub[0])
        media_type = str(doc.get("mediaType") or sub[1]) if isinstance(doc, dict) else ""
        if not isinstance(doc, dict):
            out.problems.append(f"manifest {chosen} is not a JSON object")
            return out
    if media_type in _SCHEMA1 or doc.get("schemaVersion") == 1:
        out.problems.append("a Docker schema 1 manifest (no config, no diff_ids)")
        return out
    config = doc.get("config")
    config_digest = config.get("digest") if isinstance(config, dict) else None
    if not is_digest(config_digest):
        out.problems.append("the manifest names no config")
        return out
    out.config_digest = str(config_digest)
    layers = doc.get("layers")
    for x in layers if isinstance(layers, list) else []:
        if isinstance(x, dict) and is_digest(x.get("digest")):
            size = x.get("size")
            out.blobs.append({"mediaType": x.get("mediaType") if isinstance(x.get("mediaType"), str) else None,
                              "digest": str(x["digest"]),
                              "size": size if isinstance(size, int) and not isinstance(size, bool) else None})
        else:
            out.problems.append("a layer descriptor without a digest")
    if out.config_digest not in configs:
        raw_cfg = _get_config(client, repo, Digest.parse(out.config_digest))
        if raw_cfg is None:
            configs[out.config_digest] = f"config {out.config_digest}: missing from {repo}"
        elif Digest.of_bytes(raw_cfg) != Digest.parse(out.config_digest):
            configs[out.config_digest] = f"config {out.config_digest}: its bytes hash to {Digest.of_bytes(raw_cfg)}"
        else:
            configs[out.config_digest] = _json(raw_cfg)
    cfg = configs[out.config_digest]
    if isinstance(cfg, str):
        out.problems.append(cfg)
        return out
    rootfs = cfg.get("rootfs") if isinstance(cfg, dict) else None
    ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if ids is None and isinstance(rootfs, dict) and rootfs.get("type") == "layers":
        ids = []  # an image with no layers (FROM scratch plus a LABEL): Docker leaves diff_ids out
    if not isinstance(ids, list) or not all(is_digest(d) for d in ids):
        out.problems.append("the config lists no diff_ids (not a container image?)")
        return out
    out.diff_ids = [str(d) for d in ids]
    if len(out.diff_ids) != len(out.blobs):
        out.problems.append(f"the manifest lists {len(out.blobs)} layers, the config {len(out.diff_ids)} diff_ids")
    return out


def _described_or_left_out(client: RegistryClient, repo: str, tag: str, configs: Dict[str, Any],
                           note: Callable[[str], None]) -> Optional[_Described]:
    """:func:`describe_tag`, or None (the tag left out, said through ``note``) when the registry
    keeps failing on that one tag (a 5xx after the retries, a refused request, a redirect loop): what else it holds
    is still listed, and a tag left out counts as absent, so a delta carries its layers rather than
    assume them (docs/deltas.md). A refused login or a registry that stopped answering still ends it."""
    try:
        return describe_tag(client, repo, tag, configs)
    except (RegistryAuthError, RegistryUnreachable):
        raise
    except RegistryError as e:
        note(f"{repo}:{tag} left out of the inventory (counted as absent): {e.message}")
        return None


def registry_inventory(client: RegistryClient, *, workers: int = 4,
                       note: Optional[Callable[[str], None]] = None) -> List[EngineImage]:
    """Every image the registry (under the target's namespace) holds, one entry per manifest;
    ``note`` (default: the client's log) hears of each tag left out."""
    said = note or client.log
    repos = list_repositories(client, namespace=client.target.namespace) or []
    items: List[Tuple[str, str]] = []
    for repo in repos:
        items.extend((repo, tag) for tag in list_tags(client, repo))
        if len(items) > MAX_REGISTRY_IMAGES:
            raise LimitExceeded(
                f"listing the tags of {client.target}: expected at most {MAX_REGISTRY_IMAGES} tags, found more",
                hint="name a namespace (--registry HOST:PORT/NAMESPACE) to list part of the registry")
    configs: Dict[str, Any] = {}
    found = each(workers, lambda it: _described_or_left_out(client, it[0], it[1], configs, said), items,
                 client.cancel)
    merged: Dict[str, EngineImage] = {}
    for (repo, tag), d in zip(items, found):
        if d is None:
            continue
        name = f"{client.target.host}/{repo}:{tag}"
        have = merged.get(d.image_id)
        if have is not None:
            have.tags.append(name)
            continue
        merged[d.image_id] = EngineImage(image_id=d.image_id, diff_ids=d.diff_ids, tags=[name],
                                         config_digest=d.config_digest, manifest_digest=d.manifest_digest,
                                         blobs=d.blobs, problems=d.problems)
    return [merged[k] for k in sorted(merged)]
