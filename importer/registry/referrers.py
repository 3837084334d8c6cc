"""OCI 1.1 referrers of a manifest in a registry: the Referrers API
(``GET /v2/<name>/referrers/<digest>``) where the registry has it, else the ``sha256-<hex>``
fallback tag (an image index the clients that attach artifacts keep up to date). Registries
without the API (docker-registry 2.x) answer 404 there (others 400, 405 or 406), or a page that
is no index."""

from __future__ import annotations

from typing import Optional, Tuple

from importer.format.digest import Digest
from importer.format.limits import MAX_CONFIG, parse_json
from importer.format.mediatypes import OCI_INDEX
from importer.registry.client import RegistryClient

API = "api"
NO_API = (400, 404, 405, 406)
FALLBACK_TAG = "tag"


def fallback_tag(digest: Digest) -> str:
    """``sha256-<hex>``: the tag of a manifest's referrers index (and cosign's tag stem)."""
    return f"{digest.algorithm}-{digest.hex}"


def fetch_referrers(client: RegistryClient, repo: str, digest: Digest) -> Optional[Tuple[bytes, str]]:
    """(the referrers index bytes, API or FALLBACK_TAG), or None when the manifest has none."""
    # a registry without the API answers 404, or (some proxies and older registries) 400, 405 or 406
    r = client.request("GET", f"/v2/{repo}/referrers/{digest}", ok=(200, *NO_API), repo=repo, limit=MAX_CONFIG,
                       headers={"Accept": OCI_INDEX}, what=f"listing the referrers of {repo}@{digest.short}")
    if r.status == 200 and (r.header("Content-Type") or "").split(";")[0].strip() == OCI_INDEX:
        doc = parse_json(r.body, f"the referrers of {repo}@{digest.short}")
        if isinstance(doc, dict) and isinstance(doc.get("manifests"), list):
            return r.body, API
    got = client.get_manifest(repo, fallback_tag(digest), MAX_CONFIG)
    if got is None:
        return None
    return got[0], FALLBACK_TAG
