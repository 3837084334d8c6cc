"""verify_bundle(): check every byte of a bundle folder before anything touches an engine.

Order: SHA256SUMS lists exactly the files of bundle.json, with its digests; bundle.json's records
agree with each other (``check_records``); no file is missing or unlisted; every file's size and
digest match (in parallel across cores); every layer decompresses within its recorded size to its
diff_id (``deep``); index.json, manifests and configs are the JSON objects the OCI spec requires
and agree with bundle.json. ``check_sums_listing``, ``check_records`` and ``_check_layout`` are
shared with the archive verifier (importer/verify/archive.py).
Every problem is collected; nothing stops at the first one.
"""

from __future__ import annotations

import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from importer.errors import BundleError, IntegrityError, LimitExceeded, ManifestError, UnreadableFile, os_error_text
from importer.format import limits
from importer.format.artifacts import layout_entry
from importer.format.digest import Digest, hash_file, is_digest
from importer.format.fileartifacts import MODE_ANNOTATION, TITLE_ANNOTATION, FileArtifact, mode_text
from importer.format.limits import parse_json, read_limited
from importer.format.manifest import (
    BUNDLE_JSON,
    SIGNATURE_FILE,
    SUMS_FILE,
    BlobRef,
    BundleManifest,
    ImageRecord,
    LayerRecord,
    load_bundle_manifest,
)
from importer.format.mediatypes import REF_NAME_ANNOTATION
from importer.format.problems import Problem
from importer.format.sums import parse_sums
from importer.input.layers import check_layer
from importer.input.opened import open_bundle, open_bundle_file
from importer.verify.carriedindex import carried_index_issues, config_platform_issue

ProgressFn = Callable[[int], None]


@dataclass
class VerifyReport:
    root: str
    manifest: Optional[BundleManifest] = None
    problems: List[Problem] = field(default_factory=list)
    files_checked: int = 0
    bytes_checked: int = 0
    layers_checked: int = 0
    #: Layer blobs whose digest, size and diff_id the load stream checked as it sent them
    #: (importer/pipeline/importing.py: a Docker import of a folder), not hashed beforehand.
    layers_checked_while_loading: int = 0
    bytes_checked_while_loading: int = 0
    seconds: float = 0.0
    signature: Optional[Dict[str, Any]] = None
    #: A schema 1/2 bundle: its images with the sizes the archive holds (config bytes, each layer
    #: uncompressed), for predicting the manifest a docker-archive load makes on a containerd store.
    archive_images: Tuple[ImageRecord, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> Dict[str, Any]:
        return {
            "ok": self.ok,
            "filesChecked": self.files_checked,
            "bytesChecked": self.bytes_checked,
            "layersChecked": self.layers_checked,
            "seconds": round(self.seconds, 3),
            "problems": [p.to_dict() for p in self.problems],
            "signature": self.signature,
            **({"layersCheckedWhileLoading": self.layers_checked_while_loading,
                "bytesCheckedWhileLoading": self.bytes_checked_while_loading}
               if self.layers_checked_while_loading else {}),
        }


def _walk_files(root: str, unreadable: Optional[Dict[str, OSError]] = None,
                max_depth: int = limits.MAX_BUNDLE_DEPTH) -> Dict[str, os.stat_result]:
    """Every entry below root (relative POSIX path -> lstat), never following links.

    Iterative (os.walk recurses, one frame per level: a deep folder is a RecursionError) and
    bounded: a folder more than ``max_depth`` levels below root is LimitExceeded. A folder that
    cannot be listed goes into ``unreadable`` (relative path -> the error), or, without that
    dict, raises UnreadableFile."""
    found: Dict[str, os.stat_result] = {}
    pending: List[Tuple[str, int]] = [("", 0)]
    while pending:
        rel_dir, depth = pending.pop()
        if depth > max_depth:
            shown = rel_dir if len(rel_dir) <= 120 else rel_dir[:120] + "..."
            raise LimitExceeded(
                f"listing the bundle folder {root}: expected folders at most {max_depth} levels deep, "
                f"found {shown} ({depth} levels deep)",
                hint="a bundle holds blobs/sha256/<digest> and a few files: remove the stray folder, or "
                "re-copy the bundle into an empty folder",
            )
        here = os.path.join(root, rel_dir) if rel_dir else root
        try:
            with os.scandir(here) as entries:
                listing = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
            for name, is_dir in listing:
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if is_dir:
                    pending.append((rel, depth + 1))
                else:  # files, links (to folders too) and special files
                    found[rel] = os.lstat(os.path.join(here, name))
        except OSError as e:
            if unreadable is None:
                raise UnreadableFile.of(e, here, doing="listing") from e
            unreadable[rel_dir or "."] = e
    return found


def _problem_of(err: BundleError, path: str) -> Problem:
    return Problem(err.reference, path, err.message)


def verify_bundle(
    root: str,
    *,
    deep: bool = True,
    workers: Optional[int] = None,
    on_bytes: Optional[ProgressFn] = None,
    raw_bundle_json: Optional[bytes] = None,
    manifest: Optional[BundleManifest] = None,
    defer_layers: bool = False,
) -> VerifyReport:
    """Verify the bundle folder ``root``; returns a report listing every problem.
    ``defer_layers``: the layer blobs are checked for presence, kind and size but not read: the
    caller's load stream hashes them as it sends them (importer/pipeline/importing.py), and
    whatever it will not send is checked by ``verify_unstreamed_layers``.
    ``raw_bundle_json``: the bundle.json bytes read when the bundle was opened (importer/input/opened.py),
    the ones the signature step judged; without it bundle.json is read here. ``manifest``: those
    bytes already parsed (importer/input/opened.py ``OpenedBundle.manifest``), not parsed again.

    Raises only for a bundle.json that cannot be used at all (ManifestError and subclasses,
    including an unsupported schema version)."""
    started = time.monotonic()
    report = VerifyReport(root=root)
    add = report.problems.append
    sums = _read_sums(root, add)
    if raw_bundle_json is None:
        raw_bundle_json = open_bundle(root).raw_bundle_json
    manifest = _load_manifest(raw_bundle_json, sums, report, manifest)
    expected: Dict[str, Digest] = {f.path: f.digest for f in manifest.files}
    sizes: Dict[str, int] = {f.path: f.size for f in manifest.files}
    unreadable: Dict[str, OSError] = {}
    on_disk = _walk_files(root, unreadable)
    _check_listing(manifest, sums, on_disk, unreadable, add)
    to_hash = _files_of_right_size(expected, sizes, on_disk, unreadable, add)
    if defer_layers:
        deferred = manifest.stored_layer_paths()
        to_hash = [p for p in to_hash if p not in deferred]
    layers_by_path: Dict[str, LayerRecord] = {}
    if deep and not defer_layers:
        for layer in manifest.stored_layers():
            layers_by_path[layer.digest.blob_path] = layer
    _hash_files(root, manifest, to_hash, expected, sizes, layers_by_path, add, workers=workers, on_bytes=on_bytes)
    report.files_checked = len(to_hash)
    report.bytes_checked = sum(sizes[p] for p in to_hash)
    report.layers_checked = sum(1 for p in to_hash if p in layers_by_path)

    # the OCI layout agrees with bundle.json (only JSON whose digest matched is parsed)
    bad_paths = {p.path for p in report.problems}
    _check_layout(root, manifest, bad_paths, add)
    report.seconds = time.monotonic() - started
    return report


def _read_sums(root: str, add: Callable[[Problem], None]) -> Optional[Dict[str, Digest]]:
    """SHA256SUMS parsed, or None when it is missing or unreadable (reported)."""
    if not os.path.lexists(os.path.join(root, SUMS_FILE)):
        add(Problem("missing-file", SUMS_FILE, "expected the checksum list, found no file"))
        return None
    if not _is_regular(root, SUMS_FILE):
        return None  # a link or special file, never opened or followed: reported with the listing
    try:
        raw_sums = _read_regular(root, SUMS_FILE, limits.MAX_SUMS)
    except BundleError as e:  # replaced by a link or special file since the check, or unreadable
        add(_problem_of(e, SUMS_FILE))
        return None
    except OSError as e:
        add(Problem("unreadable-file", SUMS_FILE, f"expected a readable file, found {os_error_text(e)}"))
        return None
    sums, sum_problems = parse_sums(raw_sums)
    for text in sum_problems:
        add(Problem("sums-invalid", SUMS_FILE, text))
    return sums


def _load_manifest(raw_bj: bytes, sums: Optional[Dict[str, Digest]], report: VerifyReport,
                   parsed: Optional[BundleManifest] = None) -> BundleManifest:
    """bundle.json checked against SHA256SUMS, then by its schema rules (raises ManifestError,
    carrying the problems found so far, when it cannot be used at all)."""
    bj_digest = Digest.of_bytes(raw_bj)
    if sums is not None and BUNDLE_JSON in sums and sums[BUNDLE_JSON] != bj_digest:
        report.problems.append(Problem("digest-mismatch", BUNDLE_JSON,
                                       f"SHA256SUMS says {sums[BUNDLE_JSON]}, the file hashes to {bj_digest}"))
    try:
        manifest = parsed if parsed is not None else load_bundle_manifest(raw_bj)
    except ManifestError as e:
        if report.problems:
            e.context = "\n".join(filter(None, [e.context] + [str(p) for p in report.problems]))
        raise
    report.manifest = manifest
    return manifest


def _check_listing(manifest: BundleManifest, sums: Optional[Dict[str, Digest]], on_disk: Dict[str, os.stat_result],
                   unreadable: Dict[str, OSError], add: Callable[[Problem], None]) -> None:
    """The file lists agree: bundle.json's files, SHA256SUMS, what is on disk."""
    expected: Dict[str, Digest] = {f.path: f.digest for f in manifest.files}
    for path, err in sorted(unreadable.items()):
        add(Problem("unreadable-file", path, f"expected a folder that can be listed, found {os_error_text(err)}"))
    listed: Set[str] = set(expected) | {BUNDLE_JSON}
    if SIGNATURE_FILE in on_disk:
        listed.add(SIGNATURE_FILE)
    if sums is not None:
        check_sums_listing(sums, expected, listed, add)
    check_records(manifest, set(on_disk), add)
    for path, st in sorted(on_disk.items()):
        if path in listed or path == SUMS_FILE:
            if not stat.S_ISREG(st.st_mode):
                add(Problem("not-a-regular-file", path, "expected a regular file, found a link or special file"))
            continue
        if os.path.basename(path).startswith(".tmp-"):
            add(Problem("unlisted-file", path, "a temporary file left by an interrupted write"))
        else:
            add(Problem("unlisted-file", path, "present in the bundle folder but not listed in bundle.json"))


def _files_of_right_size(expected: Dict[str, Digest], sizes: Dict[str, int], on_disk: Dict[str, os.stat_result],
                         unreadable: Dict[str, OSError], add: Callable[[Problem], None]) -> List[str]:
    """Sizes first (cheap): the listed regular files of the recorded size, to be hashed."""
    to_hash: List[str] = []
    for path in sorted(expected):
        found_st = on_disk.get(path)
        if found_st is None and any(path.startswith(f"{d}/") or d == "." for d in unreadable):
            continue  # in a folder that could not be listed: reported above
        if found_st is None:
            add(Problem("missing-file", path, f"expected a file of {sizes[path]} bytes, found none"))
        elif not stat.S_ISREG(found_st.st_mode):
            continue  # reported above
        elif found_st.st_size != sizes[path]:
            add(Problem("size-mismatch", path, f"expected {sizes[path]} bytes, found {found_st.st_size}"))
        else:
            to_hash.append(path)
    return to_hash


def _hash_files(root: str, manifest: BundleManifest, to_hash: List[str], expected: Dict[str, Digest],
                sizes: Dict[str, int], layers_by_path: Dict[str, LayerRecord], add: Callable[[Problem], None], *,
                workers: Optional[int], on_bytes: Optional[ProgressFn]) -> None:
    """Digests, and diff_ids of the layers in ``layers_by_path``, parallel across cores; the
    largest files first. ``to_hash`` is sorted that way in place."""
    names = _layer_names(manifest)

    def check(path: str) -> Optional[Problem]:
        full = os.path.join(root, path)
        layer = layers_by_path.get(path)
        try:
            if layer is not None:
                check_layer(root, layer, names.get(layer.digest, path))
            else:
                got, _ = hash_file(full)
                if got != expected[path]:
                    return Problem("digest-mismatch", path, f"expected {expected[path]}, found {got}")
        except IntegrityError as e:
            if layer is not None and e.reference != "digest-mismatch":
                got, _ = hash_file(full)  # name the root cause: the blob's own bytes changed
                if got != expected[path]:
                    return Problem("digest-mismatch", path, f"expected {expected[path]}, found {got}")
            return _problem_of(e, path)
        except OSError as e:
            return Problem("unreadable-file", path, f"expected a readable file, found {os_error_text(e)}")
        finally:
            if on_bytes is not None:
                on_bytes(sizes[path])
        return None

    to_hash.sort(key=lambda p: -sizes[p])
    n_workers = workers or min(32, (os.cpu_count() or 1) + 1)
    with ThreadPoolExecutor(max_workers=max(1, n_workers)) as pool:
        futures = [pool.submit(check, path) for path in to_hash]
        try:
            for future in futures:
                result = future.result()
                if result is not None:
                    add(result)
        except BaseException:  # SIGINT/SIGTERM: drop the queued files, let the running ones end
            for future in futures:
                future.cancel()
            raise


def check_sums_listing(sums: Dict[str, Digest], expected: Dict[str, Digest], listed: Set[str],
                       add: Callable[[Problem], None]) -> None:
    """SHA256SUMS lists exactly ``listed`` (every file of bundle.json, bundle.json itself, the
    signature when there is one) with bundle.json's digests: an empty or partial list is refused,
    one problem per missing or extra line (folder and archive verification alike)."""
    for path in sorted(listed - set(sums)):
        add(Problem("sums-mismatch", path, "expected a line in SHA256SUMS, found none"))
    for path in sorted(set(sums) - listed):
        add(Problem("sums-mismatch", path, "SHA256SUMS lists it, bundle.json does not (edited SHA256SUMS?)"))
    for path, digest in sorted(expected.items()):
        if path in sums and sums[path] != digest:
            add(Problem("sums-mismatch", path, f"bundle.json pins {digest}, SHA256SUMS says {sums[path]}"))


_RECORD_FIELDS = (("mediaType", "media_type"), ("size", "size"), ("diffId", "diff_id"),
                  ("uncompressedSize", "uncompressed_size"), ("external", "external"))


def check_records(manifest: BundleManifest, present: Set[str], add: Callable[[Problem], None]) -> None:
    """bundle.json's records agree with each other (folder and archive verification alike).

    Every record of one layer blob (same digest, in any image) carries the same mediaType, size,
    diffId, uncompressedSize and external flag: only one of them is checked against the bytes.
    ``external`` appears only in a delta bundle (schema 3.1+), on a layer that is neither listed
    in ``files`` nor stored (``present``: the paths the bundle holds), whose diffId check it skips.
    """
    first: Dict[Digest, Tuple[str, LayerRecord]] = {}
    external: Dict[Digest, str] = {}
    for image in manifest.records():
        for i, layer in enumerate(image.layers):
            where = f"{image.name} (layer {i + 1}/{len(image.layers)})"
            if layer.external:
                external.setdefault(layer.digest, where)
            seen = first.setdefault(layer.digest, (where, layer))
            for name, attr in _RECORD_FIELDS:
                ours, theirs = getattr(seen[1], attr), getattr(layer, attr)
                if ours != theirs:
                    add(Problem("layer-record-conflict", layer.digest.blob_path,
                                f"layer {layer.digest}: expected every record of the blob to agree, found {name} "
                                f"{_shown(ours)} in {seen[0]} and {_shown(theirs)} in {where}"))
    listed = {f.path for f in manifest.files}
    for digest, where in external.items():
        path = digest.blob_path
        if not manifest.may_be_delta:
            add(Problem("invalid-external-layer", path,
                        f"layer {digest} of {where} is marked external: expected schemaVersion 3.1 or later "
                        f"(a delta bundle), found {manifest.schema_version} (a full bundle leaves no layer out)"))
        if path in listed:
            add(Problem("invalid-external-layer", path,
                        f"layer {digest} of {where} is marked external: expected it left out of the bundle, "
                        "found it listed in files (its diffId would go unchecked)"))
        elif path in present:
            add(Problem("invalid-external-layer", path,
                        f"layer {digest} of {where} is marked external: expected it left out of the bundle, "
                        "found it stored in the bundle"))


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _layer_names(manifest: BundleManifest) -> Dict[Digest, str]:
    names: Dict[Digest, str] = {}
    for image in manifest.records():
        for i, layer in enumerate(image.layers):
            names.setdefault(layer.digest, f"layer {i + 1}/{len(image.layers)} of {image.name}")
    return names


#: what _read_json returns for a document it did not read (absent, damaged, or not JSON)
_UNREAD: Any = object()


def _is_regular(root: str, rel: str) -> bool:
    """``rel`` is a regular file itself (lstat: a link, even to a file, is not)."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(root, rel)).st_mode)
    except OSError:
        return False


def _read_regular(root: str, rel: str, limit: int) -> bytes:
    """A small file of the bundle, opened without following a link or blocking on a FIFO (raises
    NotRegularFile when it changed into one since the listing)."""
    with open_bundle_file(root, rel) as f:
        return read_limited(f, limit, rel)


def _read_json(root: str, path: str, limit: int, bad: Set[str], add: Callable[[Problem], None]) -> Any:
    if path in bad or not _is_regular(root, path):  # absent, or a link or special file: reported elsewhere
        return _UNREAD
    try:
        return parse_json(_read_regular(root, path, limit), path)
    except BundleError as e:
        add(_problem_of(e, path))
        return _UNREAD


def _kind(value: Any) -> str:
    """The JSON type of a parsed value, as messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _descriptor_issue(value: Any, where: str) -> Optional[str]:
    """Why ``value`` is not an OCI descriptor: an object with a ``mediaType`` string, a valid
    ``digest``, a non-negative integer ``size``, and object ``annotations`` (of strings) and
    ``platform`` (``os`` and ``architecture`` strings) when present."""
    if not isinstance(value, dict):
        return f"expected {where} to be a descriptor object, found {_kind(value)}"
    media_type = value.get("mediaType")
    if not isinstance(media_type, str) or "/" not in media_type:
        return f"expected {where}.mediaType to be a media type string, found {_kind(media_type)}"
    if not is_digest(value.get("digest")):
        return f"expected {where}.digest to be 'sha256:' + 64 lowercase hex, found {_kind(value.get('digest'))}"
    size = value.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"expected {where}.size to be a non-negative integer, found {_kind(size)}"
    annotations = value.get("annotations", {})
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        return f"expected {where}.annotations to be an object of strings, found {_kind(annotations)}"
    if "platform" in value:
        platform = value["platform"]
        if not isinstance(platform, dict) or not isinstance(platform.get("os"), str) or \
                not isinstance(platform.get("architecture"), str):
            return f"expected {where}.platform to be an object with os and architecture strings, " \
                f"found {_kind(platform)}"
    return None


def _check_layout(root: str, manifest: BundleManifest, bad: Set[str], add: Callable[[Problem], None]) -> None:
    """The OCI layout agrees with bundle.json; every JSON document is the object the OCI image
    spec says it is (index.json, manifests, configs, the descriptors inside them, rootfs).
    Shared by folder and archive verification (the archive's documents are written to a temp dir)."""
    for required in ("oci-layout", "index.json"):
        if required not in {f.path for f in manifest.files}:
            add(Problem("invalid-layout", required, "expected it listed in bundle.json (an OCI layout needs it), "
                        "found no entry"))
    layout = _read_json(root, "oci-layout", 4096, bad, add)
    if layout is not _UNREAD and (not isinstance(layout, dict) or layout.get("imageLayoutVersion") != "1.0.0"):
        add(Problem("invalid-layout", "oci-layout", f"expected imageLayoutVersion 1.0.0, found {layout!r}"[:200]))
    index = _read_json(root, "index.json", limits.MAX_INDEX, bad, add)
    entries: Optional[List[Any]] = []
    if index is _UNREAD and ("index.json" in bad or os.path.lexists(os.path.join(root, "index.json"))):
        entries = None  # damaged, a link or special file: reported already, its entries are not judged
    elif index is _UNREAD:
        pass
    elif not isinstance(index, dict):
        add(Problem("invalid-manifest", "index.json",
                    f"expected a JSON object (an OCI image index), found {_kind(index)}"))
    elif not isinstance(index.get("manifests"), list):
        add(Problem("invalid-layout", "index.json", "expected an OCI index with a manifests array"))
    else:
        entries = index["manifests"]
        for k, entry in enumerate(entries):
            issue = _descriptor_issue(entry, f"manifests[{k}]")
            if issue is not None:
                add(Problem("invalid-manifest", "index.json", issue))
    for top in manifest.images:
        if top.index is not None and entries is not None:
            _check_index_entry(top, entries, add)
        for image in top.variants:
            _check_image(root, image, entries, bad, add, top.index)
        if top.index is not None:
            _check_carried_index(root, top, bad, add)
    if entries is not None:
        _check_artifact_entries(manifest, entries, add)
    for art in manifest.file_artifacts:
        _check_file_artifact(root, art, entries, bad, add)


def _check_artifact_entries(manifest: BundleManifest, entries: List[Any], add: Callable[[Problem], None]) -> None:
    """3.5 artifacts in index.json (``layout_entry``; bundles before this listed none, so none is
    required), and 3.7 signatures of file artifacts: an entry with an artifact's manifest digest
    describes that manifest (size, media type, artifactType) and carries no name but the
    artifact's derived one; an entry under a derived name (``sha256-<hex>.sig``) names the
    manifest of an artifact derived so; an artifact listed at all is listed under its derived name."""
    expected: Dict[str, List[Tuple[Dict[str, Any], str]]] = {}  # manifest digest -> (descriptor, name)
    records = [art for image in manifest.images for art in image.artifacts]
    records += [sig for files in manifest.file_artifacts for sig in files.signatures]  # 3.7
    for art in records:
        entry = layout_entry(art)
        if entry is not None:
            expected.setdefault(entry[0]["digest"], []).append(entry)
    derived = {name: {d for d, pairs in expected.items() for _, n in pairs if n == name}
               for pairs in expected.values() for _, name in pairs if name}
    present: Dict[str, List[Any]] = {name: [] for name in derived}
    for e in entries:
        if not isinstance(e, dict):
            continue
        raw_name = e["annotations"].get(REF_NAME_ANNOTATION) if isinstance(e.get("annotations"), dict) else None
        name = raw_name if isinstance(raw_name, str) else None  # another type: the descriptor check reports it
        digest = e.get("digest") if isinstance(e.get("digest"), str) else None
        if name is not None and name in present:
            present[name].append(digest)
            if digest not in derived[name]:
                add(Problem("invalid-layout", "index.json", f"expected ref.name {str(name)[:100]!r} on the "
                            f"manifest of an artifact derived so ({', '.join(sorted(derived[name]))}), found "
                            f"{str(e.get('digest'))[:80]!r}"))
        pairs = expected.get(digest) if digest is not None else None
        if not pairs:
            continue
        desc = pairs[0][0]
        got = {k: e.get(k) for k in ("mediaType", "digest", "size", "artifactType")}
        if got != {**desc, "artifactType": desc.get("artifactType")}:
            add(Problem("invalid-layout", "index.json",
                        f"expected the entry for artifact {desc['digest']} to describe {desc['mediaType']} of "
                        f"{desc['size']} bytes, artifactType {desc.get('artifactType')!r}, found "
                        f"{str(got['mediaType'])[:80]!r} of {got['size']!r:.40}, artifactType "
                        f"{str(got['artifactType'])[:80]!r}"))
        if name is not None and name not in {n for _, n in pairs if n}:
            add(Problem("invalid-layout", "index.json", f"expected the entry for artifact {desc['digest']} "
                        f"named {' or '.join(sorted({repr(n) for _, n in pairs if n})) or 'by no ref.name'}, "
                        f"found {str(name)[:100]!r}"))
    for digest, pairs in expected.items():
        listed = any(isinstance(e, dict) and e.get("digest") == digest for e in entries)
        for _, name in pairs:
            if listed and name and not present[name]:
                add(Problem("invalid-layout", "index.json", f"expected ref.name {name!r} on {digest}, found none"))


def _check_file_artifact(root: str, art: FileArtifact, entries: Optional[List[Any]], bad: Set[str],
                         add: Callable[[Problem], None]) -> None:
    """3.6: index.json names the artifact's manifest under its ref, and the manifest says what
    bundle.json says (type, config, each file's layer with its title and mode, in order), so an
    OCI layout reader sees the files the importer writes."""
    mdigest = str(art.manifest.digest)
    if entries is not None:
        named = [e for e in entries if isinstance(e, dict) and e.get("digest") == mdigest]
        if not any(isinstance(e.get("annotations"), dict) and e["annotations"].get(REF_NAME_ANNOTATION) == art.ref
                   for e in named):
            add(Problem("invalid-layout", "index.json", f"expected ref.name {art.ref!r} on {mdigest}, found none"))
        for e in named:
            if e.get("size") != art.manifest.size or e.get("mediaType") != art.manifest.media_type:
                add(Problem("invalid-layout", "index.json", f"expected the entry for artifact {art.ref} to describe "
                            f"{art.manifest.media_type} of {art.manifest.size} bytes"))
    mpath = art.manifest.digest.blob_path
    doc = _read_json(root, mpath, limits.MAX_MANIFEST, bad, add)
    if doc is _UNREAD:
        return
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(layers, list) or any(not isinstance(x, dict) for x in layers):
        add(Problem("invalid-manifest", mpath, f"manifest of artifact {art.ref}: expected an OCI image manifest "
                    "object with a layers array of descriptors"))
        return
    config = doc.get("config")
    if doc.get("artifactType") != art.artifact_type or not isinstance(config, dict) or \
            (config.get("mediaType"), config.get("digest"), config.get("size")) != \
            (art.config.media_type, str(art.config.digest), art.config.size):
        add(Problem("invalid-layout", mpath, f"manifest of artifact {art.ref}: expected artifactType "
                    f"{art.artifact_type} and config {art.config.digest}, found others"))
    got = [(x.get("mediaType"), x.get("digest"), x.get("size"),
            (x.get("annotations") or {}).get(TITLE_ANNOTATION) if isinstance(x.get("annotations"), dict) else None,
            (x.get("annotations") or {}).get(MODE_ANNOTATION) if isinstance(x.get("annotations"), dict) else None)
           for x in layers]
    want = [(f.blob.media_type, str(f.blob.digest), f.blob.size, f.title, mode_text(f.mode)) for f in art.files]
    if got != want:
        add(Problem("invalid-layout", mpath, f"manifest of artifact {art.ref}: its layers (media type, digest, size, "
                    "title, mode) differ from bundle.json's files"))


def _check_carried_index(root: str, image: ImageRecord, bad: Set[str], add: Callable[[Problem], None]) -> None:
    """A multi-platform image's index lists exactly its recorded platform manifests, each for its
    platform (importer/verify/carriedindex.py)."""
    assert image.index is not None
    path = image.index.digest.blob_path
    doc = _read_json(root, path, limits.MAX_INDEX, bad, add)
    if doc is _UNREAD:
        return
    for issue in carried_index_issues(image, doc):
        add(Problem("index-platform-mismatch", path, f"index of {image.name}: {issue}"))


def _check_index_entry(image: ImageRecord, entries: List[Any], add: Callable[[Problem], None]) -> None:
    """3.3: the entries naming a carried image index describe it (3.2 bundles name the primary
    platform's manifest instead, and list no index entry)."""
    assert image.index is not None
    for e in entries:
        if isinstance(e, dict) and e.get("digest") == str(image.index.digest) and (
                e.get("size") != image.index.size or e.get("mediaType") != image.index.media_type):
            add(Problem("invalid-layout", "index.json",
                        f"expected the entry for the index of {image.name} to describe {image.index.media_type} of "
                        f"{image.index.size} bytes, found {str(e.get('mediaType'))[:80]!r} of {e.get('size')!r:.40}"))


def _check_index_entries(image: ImageRecord, entries: List[Any], add: Callable[[Problem], None],
                         index: Optional[BlobRef] = None) -> None:
    """index.json names the image's manifest, with its size and media type, and its refs (on the
    manifest, or in 3.3 on the carried index ``index``)."""
    mdigest = str(image.manifest.digest)
    mine = [e for e in entries if isinstance(e, dict) and e.get("digest") == mdigest]
    named = [e for e in entries if isinstance(e, dict) and e.get("digest") in (
        mdigest, str(index.digest) if index is not None else mdigest)]  # 3.3: the refs name the index
    refs_in_index = {
        str(e.get("annotations", {}).get(REF_NAME_ANNOTATION)) for e in named if isinstance(e.get("annotations"), dict)
    }
    if not mine:
        add(Problem("invalid-layout", "index.json", f"expected an entry for {image.name} ({mdigest}), found none"))
    for e in mine:
        if e.get("size") != image.manifest.size or e.get("mediaType") != image.manifest.media_type:
            add(Problem("invalid-layout", "index.json",
                        f"expected the entry for {image.name} to describe {image.manifest.media_type} of "
                        f"{image.manifest.size} bytes, found {str(e.get('mediaType'))[:80]!r} of "
                        f"{e.get('size')!r:.40}"))
    for ref in image.refs:
        if ref not in refs_in_index:
            add(Problem("invalid-layout", "index.json", f"expected ref.name {ref!r} on {mdigest}"
                        + (f" or on its index {index.digest}" if index is not None else "") + ", found none"))


def _check_image(root: str, image: ImageRecord, entries: Optional[List[Any]], bad: Set[str],
                 add: Callable[[Problem], None], index: Optional[BlobRef] = None) -> None:
    if entries is not None:
        _check_index_entries(image, entries, add, index)
    mpath = image.manifest.digest.blob_path
    doc = _read_json(root, mpath, limits.MAX_MANIFEST, bad, add)
    if doc is _UNREAD:
        pass
    elif not isinstance(doc, dict):
        add(Problem("invalid-manifest", mpath,
                    f"manifest of {image.name}: expected a JSON object (an OCI image manifest), found {_kind(doc)}"))
    else:
        _check_manifest_doc(image, doc, mpath, add)
    cpath = image.config.digest.blob_path
    cfg = _read_json(root, cpath, limits.MAX_CONFIG, bad, add)
    if cfg is _UNREAD:
        return
    if not isinstance(cfg, dict):
        add(Problem("invalid-manifest", cpath,
                    f"config of {image.name}: expected a JSON object (an OCI image config), found {_kind(cfg)}"))
        return
    platform_issue = config_platform_issue(image, cfg)
    if platform_issue is not None:
        add(Problem("config-platform-mismatch", cpath, f"config of {image.name}: {platform_issue}"))
    rootfs = cfg.get("rootfs")
    if not isinstance(rootfs, dict):
        add(Problem("invalid-manifest", cpath,
                    f"config of {image.name}: expected rootfs to be an object, found {_kind(rootfs)}"))
    elif rootfs.get("type") != "layers":
        add(Problem("invalid-manifest", cpath,
                    f"config of {image.name}: expected rootfs.type 'layers', found {_kind(rootfs.get('type'))}"))
    elif rootfs.get("diff_ids") != [str(x.diff_id) for x in image.layers]:
        add(Problem("diffid-mismatch", cpath,
                    f"config of {image.name}: rootfs.diff_ids differ from bundle.json's layers"))


def _check_manifest_doc(image: ImageRecord, doc: Dict[str, Any], mpath: str, add: Callable[[Problem], None]) -> None:
    """An image manifest object: its config and layer descriptors are objects and match bundle.json."""
    issues: List[str] = []
    config = doc.get("config")
    issue = _descriptor_issue(config, "config")
    if issue is not None:
        issues.append(issue)
    layers = doc.get("layers")
    if not isinstance(layers, list):
        issues.append(f"expected layers to be an array of descriptor objects, found {_kind(layers)}")
        layers = []
    for k, layer in enumerate(layers):
        issue = _descriptor_issue(layer, f"layers[{k}]")
        if issue is not None:
            issues.append(issue)
    if "annotations" in doc and not isinstance(doc["annotations"], dict):
        issues.append(f"expected annotations to be an object, found {_kind(doc['annotations'])}")
    for text in issues:
        add(Problem("invalid-manifest", mpath, f"manifest of {image.name}: {text}"))
    if issues or not isinstance(config, dict):
        return
    if config.get("digest") != str(image.config.digest) or config.get("size") != image.config.size or \
            config.get("mediaType") != image.config.media_type:
        add(Problem("invalid-layout", mpath,
                    f"manifest of {image.name}: expected config {image.config.digest}, found {config.get('digest')}"))
    got = [(x.get("digest"), x.get("size"), x.get("mediaType")) for x in layers]
    want = [(str(x.digest), x.size, x.media_type) for x in image.layers]
    if got != want:
        add(Problem("invalid-layout", mpath, f"manifest of {image.name}: its layers differ from bundle.json"))
