"""A multi-platform image's carried image index (schema 3.2, ``bundle export --all-platforms``)
parsed and checked against bundle.json, not only hashed.

The index must list exactly the platform manifests bundle.json records for the image (each once,
with the record's size and media type), and each entry's ``platform`` must be the record's
platform (os/architecture/variant, containerd's normalisation: importer/format/platform.py); the
records' platforms must differ from each other. Otherwise a reader that picks its platform from
the index (an engine, a registry client of ``serve``, a reader of the OCI target) would get
another platform's image than bundle.json says. :func:`carried_index_issues` is the one check:
verification (importer/verify/bundle.py) runs it on every carried index, and readers that expose
an index per platform may call it too."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from importer.format.digest import is_digest
from importer.format.manifest import ImageRecord
from importer.format.platform import Platform, of_dict


def record_platform(record: ImageRecord) -> Optional[Platform]:
    """The platform bundle.json records for one image record, or None when it names none."""
    os_name, arch = record.platform.get("os"), record.platform.get("architecture")
    if not os_name or not arch:
        return None
    return Platform(os_name, arch, record.platform.get("variant", ""))


def _entry_platform(entry: Dict[str, Any]) -> Optional[Platform]:
    raw = entry.get("platform")
    if not isinstance(raw, dict):
        return None
    if any(not isinstance(raw.get(k, ""), str) for k in ("os", "architecture", "variant")):
        return None
    return of_dict(raw)


def _entry_issue(entry: Any, k: int) -> Optional[str]:
    if not isinstance(entry, dict):
        return f"manifests[{k}]: expected a descriptor object, found {type(entry).__name__}"
    if not is_digest(entry.get("digest")):
        return f"manifests[{k}]: expected a digest 'sha256:' + 64 lowercase hex, found {entry.get('digest')!r:.80}"
    size = entry.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not isinstance(entry.get("mediaType"), str):
        return f"manifests[{k}]: expected a mediaType string and an integer size, found {size!r:.40}"
    if _entry_platform(entry) is None:
        return f"manifests[{k}]: expected a platform object with os and architecture strings, " \
            f"found {entry.get('platform')!r:.120}"
    return None


def carried_index_issues(image: ImageRecord, doc: Any) -> List[str]:
    """What is wrong with ``doc`` (the parsed carried index of ``image``) next to bundle.json's
    records of the image's platforms; empty when the index lists exactly those manifests, each
    for its record's platform."""
    records = list(image.variants)
    issues: List[str] = []
    seen_platforms: List[Platform] = []
    for record in records:
        p = record_platform(record)
        if p is None:
            issues.append(f"{record.manifest.digest}: bundle.json records no platform (os/architecture) for it")
        elif any(p.matches(q) for q in seen_platforms):
            issues.append(f"bundle.json records {p} twice (each platform once)")
        else:
            seen_platforms.append(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
        return [*issues, "expected an image index (an object with a manifests array), found "
                f"{'null' if doc is None else type(doc).__name__}"]
    by_digest = {str(r.manifest.digest): r for r in records}
    listed: Dict[str, int] = {}
    for k, entry in enumerate(doc["manifests"]):
        issue = _entry_issue(entry, k)
        if issue is not None:
            issues.append(issue)
            continue
        digest = str(entry["digest"])
        listed[digest] = listed.get(digest, 0) + 1
        found = by_digest.get(digest)
        if found is None:
            issues.append(f"manifests[{k}]: lists {digest} ({_entry_platform(entry)}), "
                          "a manifest bundle.json records for no platform of the image")
            continue
        record = found
        if entry["size"] != record.manifest.size or entry["mediaType"] != record.manifest.media_type:
            issues.append(f"manifests[{k}]: expected {record.manifest.media_type} of {record.manifest.size} "
                          f"bytes for {digest}, found {str(entry['mediaType'])[:80]!r} of {entry['size']}")
        got, want = _entry_platform(entry), record_platform(record)
        if got is not None and want is not None and not got.matches(want):
            issues.append(f"manifests[{k}]: lists {digest} for {got}, bundle.json records it for {want}")
    for digest, record in by_digest.items():
        count = listed.get(digest, 0)
        if count != 1:
            issues.append(f"expected the manifest of {record.platform_text()} ({digest}) listed once, "
                          f"found it {count} times")
    return issues


def config_platform_issue(record: ImageRecord, config: Dict[str, Any]) -> Optional[str]:
    """Why an image config (parsed) contradicts the platform bundle.json records for it, or None.
    A record naming no platform is not judged (schema 3.0/3.1 bundles may leave it out)."""
    want = record_platform(record)
    if want is None:
        if record.platform.get("os"):  # an os without an architecture names no platform a config can be for
            return (f"expected bundle.json's platform to name an architecture with its os, found "
                    f"{dict(record.platform)!r:.120}")
        return None
    got = of_dict(config)
    if got is None or not got.matches(want):
        shown = got if got is not None else \
            f"os {config.get('os')!r:.40}, architecture {config.get('architecture')!r:.40}"
        return f"expected the config to be for {want} (bundle.json's platform), found {shown}"
    return None
