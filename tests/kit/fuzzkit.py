"""The bundle fuzzer (tests/test_fuzz.py, docs/security.md "Fuzzing"): seeded mutations of a small
bundle, each run through the importer's verification and inspection in-process, and a reference
check, written apart from the importer, that says which accepted bundles must have been refused.

Targets: bundle.json, index.json, an image manifest, an image config (JSON mutations, raw or
re-pinned so every digest, size and SHA256SUMS line still matches), SHA256SUMS (line-level byte
mutations), the parts index of a split bundle (JSON mutations), the tar headers of a packed
bundle (byte flips, raw or with the header checksum recomputed) and, in a multi-platform bundle,
the carried image index (manifests dropped, added, duplicated or swapped, platform fields
changed, wrong types, null; issue 24 class 4); in a schema 3.5 bundle (bundlegen.make_signed_*),
bundle.json's ``cuda`` and ``artifacts`` records and the cosign signature manifests and payloads,
each case run again with ``--require-signed`` and judged by the policy oracle
(:func:`policy_problems`, written apart from importer/verify/cosign.py; issue 38)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import jsonschema
import zstandard

from bundle.archive import pack_bundle
from tests.kit.trustkit import regenerate_sums

REPO = Path(__file__).resolve().parents[2]
BUNDLE_SCHEMA = json.loads((REPO / "schemas" / "bundle" / "v3.schema.json").read_text())
TARGETS = ("bundle.json", "index.json", "manifest", "config", "SHA256SUMS", "parts-index", "tar-header")
#: targets of a multi-platform (schema 3.2) bundle: its carried image index (``images[].index``)
MULTI_TARGETS = ("carried-index", "carried-index", "manifest", "config", "bundle.json")
#: targets of a schema 3.5 bundle made by bundlegen.make_signed_bundle or
#: make_signed_multiplatform_bundle (issue 38): bundle.json's ``cuda`` and ``artifacts`` records,
#: and the cosign signature manifests and payloads; each case also runs ``--require-signed`` with
#: the kit key, judged by policy_problems
SIGNED_TARGETS = ("cuda", "artifacts", "artifacts", "signature-manifest", "signature-payload", "signature-payload",
                  "bundle.json")
CASE_SECONDS = 30


# ============================================================================ JSON mutations

_ODD_STRINGS = ["", "\x1b[31mred", "a\nb", "\u2028", "../../etc/passwd", "/abs", "sha256:" + "0" * 64,
                "sha256:" + "A" * 64, "x" * 5000, "[/bold]", "\udcff", "app:1", "blobs/sha256/x"]
_ODD_NUMBERS = [-1, 0, 1, 2**31, 2**63, 2**64 + 1, 10**400, 1.5, True, None]


def _odd_value(rnd: random.Random, known: list[Any]) -> Any:
    kind = rnd.randrange(7)
    if kind == 0:
        return rnd.choice(_ODD_STRINGS)
    if kind == 1:
        return rnd.choice(_ODD_NUMBERS)
    if kind == 2:
        return rnd.choice([[], {}, [None], {"": None}, [[]] * 3])
    if kind == 3 and known:
        return rnd.choice(known)  # a value from elsewhere in the document (a digest, a size, a ref)
    if kind == 4:
        nested: Any = 0
        for _ in range(rnd.choice([10, 200, 900])):  # json.dumps stops near 1000
            nested = [nested]
        return nested
    if kind == 5:
        return rnd.choice(["sha256:" + f"{rnd.getrandbits(256):064x}", "sha512:" + "0" * 128])
    return rnd.randrange(-3, 10**6)


def _paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if len(prefix) > 40:  # inside a deep nest a mutation made
        return
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, (*prefix, i))


def _leaves(doc: Any) -> list[Any]:
    found: list[Any] = []
    for path in _paths(doc):
        value = _get(doc, path)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            found.append(value)
    return found


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def mutate_json(doc: Any, rnd: random.Random, rounds: int = 0, known: list[Any] | None = None) -> Any:
    """1-3 structural mutations: replace a node, delete a member, duplicate or drop a list item,
    add a member, swap two values of the document. ``known``: more values an odd value may be
    taken from (digests and names from elsewhere in the bundle)."""
    doc = json.loads(json.dumps(doc))
    known = _leaves(doc) + list(known or [])
    for _ in range(rounds or rnd.randint(1, 3)):
        paths = list(_paths(doc))
        path = rnd.choice(paths)
        op = rnd.randrange(5)
        if not path:
            if op == 0:
                return _odd_value(rnd, known)  # the whole document replaced: [], null, 1, ...
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op in (0, 1):
            parent[key] = _odd_value(rnd, known)
        elif op == 2:
            del parent[key]
        elif op == 3 and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(parent[key])))
        elif op == 3 and isinstance(parent, dict):
            parent[rnd.choice(["external", "extra", "diffId", "size", "refs", "platform"])] = \
                _odd_value(rnd, known)
        else:  # swap two values that do not contain each other
            other = rnd.choice(paths)
            if other and other[:len(path)] != path and path[:len(other)] != other:
                mine, theirs = _get(doc, path), _get(doc, other)
                parent[key] = theirs
                _get(doc, other[:-1])[other[-1]] = mine
    return doc


_ODD_PLATFORM_VALUES = ["arm64", "amd64", "ppc64le", "s390x", "aarch64", "x86_64", "v8", "v7", "", "windows",
                        "linux", None, 7, [], {}, "\udc80", "\x1b[2J"]


def mutate_index(doc: Any, rnd: random.Random) -> Any:
    """1-3 mutations aimed at an image index's manifests and their platforms (else JSON ones)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(rnd.randint(1, 3)):
        entries = doc.get("manifests") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries or rnd.random() < 0.2:
            return mutate_json(doc, rnd, rounds=1)
        i, j = rnd.randrange(len(entries)), rnd.randrange(len(entries))
        op = rnd.randrange(8)
        if op == 0:
            del entries[i]
        elif op == 1:
            entries.insert(j, json.loads(json.dumps(entries[i])))
        elif op == 2 and isinstance(entries[i], dict) and isinstance(entries[j], dict):
            entries[i]["platform"], entries[j]["platform"] = entries[j].get("platform"), entries[i].get("platform")
        elif op == 3:
            entries[i], entries[j] = entries[j], entries[i]  # order only: still the same index
        elif op == 4 and isinstance(entries[i], dict):
            entries.append({**entries[i], "digest": rnd.choice(["sha256:" + f"{rnd.getrandbits(256):064x}",
                                                                entries[i].get("digest")])})
        elif op in (5, 6) and isinstance(entries[i], dict) and isinstance(entries[i].get("platform"), dict):
            key = rnd.choice(["os", "architecture", "variant", "os.version"])
            entries[i]["platform"][key] = rnd.choice(_ODD_PLATFORM_VALUES)
        else:
            target = entries[i] if isinstance(entries[i], dict) and rnd.random() < 0.7 else None
            if target is not None:
                target[rnd.choice(["platform", "digest", "size", "mediaType"])] = rnd.choice(
                    [None, 0, "x", [], {}, {"os": "linux"}])
            else:
                entries[i] = rnd.choice([None, 1, "x", []])
    return doc


def mutate_lines(raw: bytes, rnd: random.Random) -> bytes:
    """Line-level byte mutations of a SHA256SUMS file."""
    lines = raw.split(b"\n")
    op = rnd.randrange(8)
    i = rnd.randrange(len(lines))
    if op == 0:
        return b""
    if op == 1:
        del lines[i]
    elif op == 2:
        lines.insert(i, lines[i])
    elif op == 3:
        lines[i] = lines[i] + rnd.choice([b"\r", b" ", b"\0", "\u2028".encode(), b"\x0b"])
    elif op == 4:
        return raw.replace(b"\n", rnd.choice([b"\r\n", b"\r", "\u2028".encode(), b"\x0c"]))
    elif op == 5:
        lines[i] = lines[i].upper()
    elif op == 6:
        lines[i] = lines[i].replace(b"  ", rnd.choice([b" ", b" *", b"\t", b"   "]), 1)
    else:
        lines.insert(i, rnd.choice([b"", b"#", b"0" * 64 + b"  ../x", b"0" * 64 + b"  /etc/passwd"]))
    return b"\n".join(lines)


# ============================================================================ re-pinning


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _retarget(doc: Any, old: str, new: str, size: int) -> bool:
    """Point every descriptor (and bundle.json files entry) of digest ``old`` at ``new``."""
    changed = False
    if isinstance(doc, dict):
        if doc.get("digest") == old:
            doc["digest"] = new
            if "size" in doc:
                doc["size"] = size
            if doc.get("path") == f"blobs/sha256/{old[7:]}":
                doc["path"] = f"blobs/sha256/{new[7:]}"
            changed = True
        for value in doc.values():
            changed |= _retarget(value, old, new, size)
    elif isinstance(doc, list):
        for value in doc:
            changed |= _retarget(value, old, new, size)
    return changed


def replace_blob(bundle: Path, old: str, data: bytes) -> None:
    """Store ``data`` in place of blob ``old`` and re-pin everything that names it: manifests
    naming a changed config (and image indexes naming a changed manifest) are re-pinned in turn,
    then index.json, bundle.json, SHA256SUMS."""
    blobs = bundle / "blobs" / "sha256"
    new = "sha256:" + _sha(data)
    (blobs / old[7:]).unlink(missing_ok=True)
    (blobs / new[7:]).write_bytes(data)
    for path in sorted(blobs.iterdir()):
        if path.name == new[7:]:
            continue
        try:
            doc = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError, FileNotFoundError):  # not JSON, or re-pinned already
            continue
        if isinstance(doc, dict) and ("layers" in doc or "manifests" in doc) and _retarget(doc, old, new, len(data)):
            replace_blob(bundle, "sha256:" + path.name, json.dumps(doc).encode())
    index = json.loads((bundle / "index.json").read_bytes())
    if _retarget(index, old, new, len(data)):
        (bundle / "index.json").write_text(json.dumps(index))
    repin_file(bundle, "index.json")
    doc = json.loads((bundle / "bundle.json").read_bytes())
    _retarget(doc, old, new, len(data))
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)


def flip_byte(path: Path, at: int | None = None) -> None:
    """Flip the lowest bit of one byte of ``path`` in place (the middle one unless ``at``): damage
    no digest can miss, nothing re-pinned, and JSON stays text (only the digest check can see it)."""
    with open(path, "r+b") as f:
        offset = os.fstat(f.fileno()).st_size // 2 if at is None else at
        f.seek(offset)
        byte = f.read(1)
        assert byte, f"{path} has no byte {offset}"
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def rewrite_index(bundle: Path, change: Callable[[Any], Any]) -> None:
    """The first image's carried image index (a multi-platform bundle's), changed by ``change``
    (its parsed JSON in, the new JSON out) and re-pinned everywhere."""
    old = str(json.loads((bundle / "bundle.json").read_text())["images"][0]["index"]["digest"])
    doc = json.loads((bundle / "blobs/sha256" / old[7:]).read_bytes())
    replace_blob(bundle, old, json.dumps(change(doc)).encode())


def repin_file(bundle: Path, rel: str) -> None:
    """bundle.json's files entry of ``rel`` (not content-addressed) follows the file; then SHA256SUMS."""
    doc = json.loads((bundle / "bundle.json").read_bytes())
    data = (bundle / rel).read_bytes()
    for entry in doc.get("files", []):
        if isinstance(entry, dict) and entry.get("path") == rel:
            entry["digest"], entry["size"] = "sha256:" + _sha(data), len(data)
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)


# ============================================================================ the reference check


def _decompress(data: bytes, media_type: str) -> bytes:
    if media_type.endswith("+zstd"):
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if media_type.endswith("gzip"):
        return gzip.decompress(data)
    return data


def reference_problems(bundle: Path) -> list[str]:
    """What an independent reader finds wrong with a bundle folder (empty: it is sound)."""
    try:
        return _reference_problems(bundle)
    except RecursionError:
        return ["a JSON document nested too deep to check"]
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a document of the wrong shape
        return [f"a document of the wrong shape: {type(e).__name__}: {e}"]


def _descriptor(d: Any) -> bool:
    """An OCI descriptor as the importer must insist on: mediaType, digest, non-negative size."""
    return isinstance(d, dict) and isinstance(d.get("mediaType"), str) and isinstance(d.get("digest"), str) \
        and isinstance(d.get("size"), int) and not isinstance(d.get("size"), bool) and d["size"] >= 0


def _reference_problems(bundle: Path) -> list[str]:
    try:
        doc = json.loads((bundle / "bundle.json").read_bytes())
    except (ValueError, OSError) as e:
        return [f"bundle.json: {e}"]
    problems = [f"bundle.json schema: {e.message}"
                for e in jsonschema.Draft202012Validator(BUNDLE_SCHEMA).iter_errors(doc)][:5]
    if problems:
        return problems
    files = {f["path"]: f for f in doc["files"]}
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if not p.is_dir() or p.is_symlink()}
    extra = on_disk - set(files) - {"bundle.json", "SHA256SUMS", "bundle.json.sig"}
    problems += [f"{p}: unlisted" for p in sorted(extra)]
    for path, entry in files.items():
        full = bundle / path
        if full.is_symlink() or not full.is_file():
            problems.append(f"{path}: not a regular file")
            continue
        data = full.read_bytes()
        if len(data) != entry["size"] or "sha256:" + _sha(data) != entry["digest"]:
            problems.append(f"{path}: size or digest differs")
    sums = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=bundle,
                          capture_output=True, check=False)
    if sums.returncode != 0:
        problems.append("SHA256SUMS: sha256sum -c refuses it")
    names = {line[66:].decode("utf-8", "replace")  # <64 hex><space><space or *><name>, as sha256sum -c reads it
             for line in (bundle / "SHA256SUMS").read_bytes().split(b"\n") if line}
    if names != set(files) | {"bundle.json"} | ({"bundle.json.sig"} & on_disk):
        problems.append("SHA256SUMS: does not list exactly the bundle's files")
    if problems:
        return problems
    index = json.loads((bundle / "index.json").read_bytes())
    if json.loads((bundle / "oci-layout").read_bytes()) != {"imageLayoutVersion": "1.0.0"}:
        problems.append("oci-layout: not version 1.0.0")
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        return [*problems, "index.json: not an object with a manifests array"]
    problems += [f"index.json manifests[{i}]: {d}" for i, d in enumerate(index["manifests"]) if not _descriptor(d)]
    indexed = [(m.get("digest"), m.get("size"), m.get("mediaType")) for m in index["manifests"] if isinstance(m, dict)]
    records: dict[str, dict] = {}
    for top in doc["images"]:
        problems += _reference_index_problems(bundle, top)
    problems += _reference_artifact_problems(doc, files)
    for image in [r for top in doc["images"] for r in (top, *top.get("platforms", []))]:
        name = image["refs"][0] if image.get("refs") else image["manifest"]["digest"]
        manifest = json.loads((bundle / "blobs/sha256" / image["manifest"]["digest"][7:]).read_bytes())
        config = json.loads((bundle / "blobs/sha256" / image["config"]["digest"][7:]).read_bytes())
        if not isinstance(manifest, dict) or not _descriptor(manifest.get("config")) or \
                not isinstance(manifest.get("layers"), list) or not all(_descriptor(x) for x in manifest["layers"]):
            return [*problems, f"{name}: the manifest is not an object of descriptors"]
        rootfs = config.get("rootfs") if isinstance(config, dict) else None
        if not isinstance(rootfs, dict) or rootfs.get("type") != "layers" or \
                not isinstance(rootfs.get("diff_ids"), list):
            return [*problems, f"{name}: the config has no rootfs object of type layers"]
        mine = [m for m in indexed if m[0] == image["manifest"]["digest"]]
        if not mine or any(m != (image["manifest"]["digest"], image["manifest"]["size"],
                                 image["manifest"]["mediaType"]) for m in mine):
            problems.append(f"{name}: manifest not in index.json with its size")
        if {k: manifest["config"][k] for k in ("digest", "size", "mediaType")} != \
                {k: image["config"][k] for k in ("digest", "size", "mediaType")}:
            problems.append(f"{name}: manifest names another config")
        named = [(x["digest"], x["size"]) for x in manifest["layers"]]
        if named != [(x["digest"], x["size"]) for x in image["layers"]]:
            problems.append(f"{name}: manifest names other layers")
        if image.get("platform", {}).get("os") and _platform(image["platform"]) != _platform(config):
            problems.append(f"{name}: the config is for another platform than recorded")
        if config["rootfs"]["diff_ids"] != [x["diffId"] for x in image["layers"]]:
            problems.append(f"{name}: config names other diff_ids")
        for layer in image["layers"]:
            if layer.get("external"):
                problems.append(f"{name}: an external layer in a full bundle")
                continue
            known = {k: layer.get(k) for k in ("mediaType", "size", "diffId", "uncompressedSize", "external")}
            seen = records.setdefault(layer["digest"], known)  # unknown fields are ignored by readers
            if seen != known:
                problems.append(f"{name}: two records of {layer['digest'][:19]} disagree")
            plain = _decompress((bundle / "blobs/sha256" / layer["digest"][7:]).read_bytes(), layer["mediaType"])
            if "sha256:" + _sha(plain) != layer["diffId"] or len(plain) != layer["uncompressedSize"]:
                problems.append(f"{name}: layer {layer['digest'][:19]} does not decompress to its diffId")
    return problems


_ALIASES = {"aarch64": "arm64", "x86_64": "amd64"}
_VARIANT = {"arm64": "v8", "arm": "v7"}


def _platform(p: Any) -> tuple:
    """(os, architecture, variant) as containerd compares them (aliases, default variants)."""
    if not isinstance(p, dict) or not all(isinstance(p.get(k, ""), str) for k in ("os", "architecture", "variant")):
        return ("?",)
    arch = _ALIASES.get(p.get("architecture", ""), p.get("architecture", ""))
    variant = p.get("variant") or _VARIANT.get(arch, "")
    return p.get("os", ""), arch, "v8" if arch == "arm64" and variant == "8" else variant


_DERIVED_SUFFIX = {"signature": ".sig", "attestation": ".att", "sbom": ".sbom", "referrers-index": ""}


def _tag_of(ref: str) -> str:
    _head, sep, tail = ref.split("@", 1)[0].rpartition(":")
    return tail if sep and "/" not in tail else ""


def _reference_artifact_problems(doc: dict, files: dict[str, dict]) -> list[str]:
    """Schema 3.5 records, what JSON Schema cannot say (schemas/bundle/v3.schema.json, the
    ``artifact`` tag's description): each is about its own image (its subject one of the image's
    manifests, its index, or an ``index`` record's own digest), its tag is the one derived from
    its subject, no image is tagged with such a name; every blob it names is a file of that size."""
    problems, derived = [], set()
    for n, image in enumerate(doc["images"]):
        records = image.get("artifacts", [])
        own = {image["manifest"]["digest"], *(p["manifest"]["digest"] for p in image.get("platforms", []))}
        own |= {image["index"]["digest"]} if "index" in image else set()
        own |= {r["manifest"]["digest"] for r in records
                if r["kind"] == "index" and r["subject"] == r["manifest"]["digest"]}
        for k, record in enumerate(records):
            where = f"images[{n}].artifacts[{k}]"
            if record["subject"] not in own:
                problems.append(f"{where}: its subject is no manifest of its image")
            if "tag" in record:
                derived.add(record["tag"])
                if record["kind"] not in _DERIVED_SUFFIX or \
                        record["tag"] != f"sha256-{record['subject'][7:]}{_DERIVED_SUFFIX[record['kind']]}":
                    problems.append(f"{where}: its tag is not the one derived from its subject")
            for blob in (record["manifest"], *record["blobs"]):
                listed = files.get(f"blobs/sha256/{blob['digest'][7:]}")
                if listed is None or listed["size"] != blob["size"]:
                    problems.append(f"{where}: names {blob['digest'][:19]}, not a file of the bundle of that size")
    problems += [f"images[{n}]: tagged {ref!r}, the name an artifact is handed on under"
                 for n, image in enumerate(doc["images"]) for ref in image["refs"] if _tag_of(ref) in derived]
    return problems


def _reference_index_problems(bundle: Path, image: dict) -> list[str]:
    """A carried index lists exactly the image's recorded platform manifests, each for its platform."""
    if "index" not in image:
        return []
    index = json.loads((bundle / "blobs/sha256" / image["index"]["digest"][7:]).read_bytes())
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list) or \
            not all(_descriptor(m) and isinstance(m.get("platform"), dict) for m in index["manifests"]):
        return ["carried index: not an index of descriptors with platforms"]
    got = sorted((m["digest"], m["size"], m["mediaType"], _platform(m["platform"])) for m in index["manifests"])
    want = sorted((r["manifest"]["digest"], r["manifest"]["size"], r["manifest"]["mediaType"],
                   _platform(r.get("platform"))) for r in (image, *image.get("platforms", [])))
    if got != want or len({w[3] for w in want}) != len(want) or ("?",) in {w[3] for w in got}:
        return ["carried index: does not list exactly the recorded platform manifests"]
    return []


# ============================================================================ schema 3.5: cuda, artifacts, signatures

SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
_CUDA_KEYS = ["cudaVersion", "torchCuda", "disableRequire", "require", "compatLibs", "NVIDIA_REQUIRE_CUDA"]
_ODD_CUDA = ["12.4", "12.4.1", "999.0", "cuda>=99.0", "driver>=470", "550.54.15", {"NVIDIA_REQUIRE_CUDA": 7},
             {"NVIDIA_REQUIRE_X": "cuda>=1"}, {"OTHER": "x"}, ["550"], [550], False, "true"]


def _all_images(doc: Any) -> list[dict]:
    return [img for img in doc.get("images", []) if isinstance(img, dict)] if isinstance(doc, dict) else []


def _file_artifacts(doc: Any) -> list[dict]:
    """bundle.json's top-level ``artifacts`` (3.6 files; 3.7 with ``signatures``)."""
    found = doc.get("artifacts") if isinstance(doc, dict) else None
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []


def _identities(doc: Any) -> list[str]:
    """Repositories a payload may name: the bundle's own and a few that are none of its images'."""
    refs = [r for img in _all_images(doc) for r in img.get("refs", []) if isinstance(r, str)]
    refs += [a["ref"] for a in _file_artifacts(doc) if isinstance(a.get("ref"), str)]
    return [_repository(r) for r in refs] + ["registry.example:5000/fuzz/other", "docker.io/multi/app",
                                              "registry.example:5000/fuzz/app:2", ""]


def _manifest_digests(doc: Any) -> list[str]:
    """Every manifest and index digest bundle.json names (the images', the artifacts')."""
    found = []
    for img in _all_images(doc):
        for rec in (img, *img.get("platforms", []), *img.get("artifacts", [])):
            for key in ("manifest", "index"):
                if isinstance(rec, dict) and isinstance(rec.get(key), dict):
                    found.append(rec[key].get("digest"))
    for art in _file_artifacts(doc):
        for rec in (art, *(s for s in art.get("signatures", []) if isinstance(s, dict))):
            if isinstance(rec.get("manifest"), dict):
                found.append(rec["manifest"].get("digest"))
    return [d for d in found if isinstance(d, str)]


def _mutate_cuda(doc: dict, rnd: random.Random) -> None:
    image = rnd.choice([img for img in _all_images(doc) if "cuda" in img] or _all_images(doc))
    if rnd.random() < 0.3 and isinstance(image.get("cuda"), dict):  # one field given an odd value
        key = rnd.choice(_CUDA_KEYS)
        target = image["cuda"]["require"] if key.startswith("NVIDIA") and isinstance(
            image["cuda"].get("require"), dict) else image["cuda"]
        target[key] = rnd.choice([*_ODD_CUDA, _odd_value(rnd, [])])
    else:
        image["cuda"] = mutate_json(image.get("cuda"), rnd, known=_ODD_CUDA)


def _mutate_artifacts(doc: dict, rnd: random.Random) -> None:
    """JSON mutations of one image's records or of one record, with the bundle's digests, derived
    tags and repositories at hand; or a record moved or copied to another image."""
    images = _all_images(doc)
    image = rnd.choice([img for img in images if img.get("artifacts")] or images)
    digests = _manifest_digests(doc)
    known = digests + [f"sha256-{d[7:]}{x}" for d in digests for x in ("", ".sig", ".sbom")] + _identities(doc)
    files = [a for a in _file_artifacts(doc) if a.get("signatures")]
    if files and rnd.random() < 0.4:  # 3.7: a file artifact's signature records, as an image's (or swapped)
        art = rnd.choice(files)
        if rnd.random() < 0.2 and images:
            image.setdefault("artifacts", []).append(rnd.choice(art["signatures"]))
        else:
            art["signatures"] = mutate_json(art["signatures"], rnd, known=known)
        return
    records = image.get("artifacts")
    op = rnd.random()
    if op < 0.15 and isinstance(records, list) and records and len(images) > 1:
        other = rnd.choice([img for img in images if img is not image])
        record = records.pop(rnd.randrange(len(records))) if rnd.random() < 0.5 else rnd.choice(records)
        other.setdefault("artifacts", []).append(record)
    elif op < 0.6 and isinstance(records, list) and records:
        i = rnd.randrange(len(records))
        records[i] = mutate_json(records[i], rnd, known=known)
    else:
        image["artifacts"] = mutate_json(records, rnd, known=known)


def _signature_records(doc: Any) -> list[dict]:
    """The images' signature records and (3.7) the file artifacts'."""
    files = [s for a in _file_artifacts(doc) for s in a.get("signatures", []) if isinstance(s, dict)]
    return [a for img in _all_images(doc) for a in img.get("artifacts", [])
            if isinstance(a, dict) and a.get("kind") == "signature"] + files


def _mutate_signature_manifest(bundle: Path, doc: dict, rnd: random.Random, repinned: bool) -> None:
    """One signature manifest mutated (its layers, their digests and annotations); the others'
    payload digests and signatures at hand."""
    records = _signature_records(doc)
    old = rnd.choice(records)["manifest"]["digest"]
    known: list[Any] = []
    for rec in records:
        raw = json.loads((bundle / "blobs/sha256" / rec["manifest"]["digest"][7:]).read_bytes())
        known += _leaves(raw)
    manifest = json.loads((bundle / "blobs/sha256" / old[7:]).read_bytes())
    layers = manifest.get("layers")
    if rnd.random() < 0.25 and isinstance(layers, list) and layers:  # a layer of another signature added
        other = json.loads((bundle / "blobs/sha256" / rnd.choice(records)["manifest"]["digest"][7:]).read_bytes())
        layers.insert(rnd.randrange(len(layers) + 1), rnd.choice(other["layers"]))
        data = json.dumps(manifest).encode()
    else:
        data = json.dumps(mutate_json(manifest, rnd, known=known)).encode()
    if repinned:
        replace_blob(bundle, old, data)
    else:
        (bundle / "blobs/sha256" / old[7:]).write_bytes(data)


_ATTACKER: list[Any] = []


def _attacker_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not _ATTACKER:
        _ATTACKER.append(ec.generate_private_key(ec.SECP256R1()))
    return _ATTACKER[0]


def _mutate_signature_payload(bundle: Path, doc: dict, rnd: random.Random, repinned: bool, key: Any) -> None:
    """One signature's payload: mutated (its signature kept, or made again by the kit key or by
    another key), or a fresh statement the kit key signed: another manifest or index of the bundle,
    a random digest, as the bundle's own or another repository (what the publisher's key may
    really have signed)."""
    import base64

    from tests.kit.supplykit import payload, sign_bytes

    old_manifest = rnd.choice(_signature_records(doc))["manifest"]["digest"]
    manifest = json.loads((bundle / "blobs/sha256" / old_manifest[7:]).read_bytes())
    layer = manifest["layers"][0]
    old = layer["digest"]
    digests = [*_manifest_digests(doc), "sha256:" + f"{rnd.getrandbits(256):064x}"]
    mode = rnd.randrange(4)
    if mode == 3:
        data = payload(rnd.choice(digests), rnd.choice(_identities(doc)))
    else:
        data = json.dumps(mutate_json(json.loads((bundle / "blobs/sha256" / old[7:]).read_bytes()), rnd,
                                      known=digests + _identities(doc))).encode()
    if mode in (1, 3):
        layer.setdefault("annotations", {})[SIGNATURE_ANNOTATION] = base64.b64encode(sign_bytes(key, data)).decode()
    elif mode == 2:
        layer.setdefault("annotations", {})[SIGNATURE_ANNOTATION] = base64.b64encode(
            sign_bytes(_attacker_key(), data)).decode()
    if not repinned:
        (bundle / "blobs/sha256" / old[7:]).write_bytes(data)
        return
    if mode != 0:
        replace_blob(bundle, old_manifest, json.dumps(manifest).encode())
    replace_blob(bundle, old, data)  # re-pins the signature manifest naming it in turn


def _repository(ref: str) -> str:
    """HOST/REPO of HOST/REPO:TAG or HOST/REPO@DIGEST (written here, apart from the importer), every
    Docker Hub spelling as ``docker.io/library/NAME`` (Docker's normalisation; cosign writes
    ``index.docker.io/...``): one repository, one identity."""
    name = ref.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return _canonical(head if sep and "/" not in tail else name)


def _canonical(repo: str) -> str:
    """A repository (no tag) with every Docker Hub spelling as ``docker.io/library/NAME``."""
    first, slash, rest = repo.partition("/")
    host = first if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")) else ""
    if host and host not in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        return repo
    path = rest if host else repo
    return "docker.io/" + (path if "/" in path else "library/" + path)


def _blob(bundle: Path, digest: Any) -> bytes | None:
    """A blob of the bundle by digest, None unless the file holds bytes of that digest."""
    if not isinstance(digest, str) or len(digest) != 71 or not digest.startswith("sha256:") or \
            any(c not in "0123456789abcdef" for c in digest[7:]):
        return None
    path = bundle / "blobs/sha256" / digest[7:]
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 4 * 1024 * 1024:
        return None
    data = path.read_bytes()
    return data if _sha(data) == digest[7:] else None


def _json_of(data: bytes | None) -> Any:
    try:
        return json.loads(data.decode("utf-8")) if data is not None else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _verifies(public: Any, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    try:
        if isinstance(public, ec.EllipticCurvePublicKey) and isinstance(public.curve, ec.SECP256R1):
            public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(signature, data)
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def vouched(bundle: Path, keys: list[Path]) -> set[tuple[str, str]]:
    """Every (manifest digest, repository) a key holder really signed, by what the bundle holds:
    any blob that is a manifest with layers carrying a signature annotation, each such layer's
    blob read as a simple-signing payload, the signature checked with ``cryptography``. Where in
    the bundle a signature sits does not matter here: only what the key vouched for."""
    import base64
    import binascii

    from cryptography.hazmat.primitives import serialization

    publics = [serialization.load_pem_public_key(k.read_bytes()) for k in keys]
    found: set[tuple[str, str]] = set()
    for path in sorted((bundle / "blobs" / "sha256").iterdir()):
        doc = _json_of(_blob(bundle, "sha256:" + path.name))
        layers = doc.get("layers") if isinstance(doc, dict) else None
        for layer in layers if isinstance(layers, list) else []:
            notes = layer.get("annotations") if isinstance(layer, dict) else None
            text = notes.get(SIGNATURE_ANNOTATION) if isinstance(notes, dict) else None
            data = _blob(bundle, layer.get("digest")) if isinstance(text, str) else None
            claims = _json_of(data)
            critical = claims.get("critical") if isinstance(claims, dict) else None
            if data is None or not isinstance(critical, dict):
                continue
            image, identity = critical.get("image"), critical.get("identity")
            digest = image.get("docker-manifest-digest") if isinstance(image, dict) else None
            reference = identity.get("docker-reference") if isinstance(identity, dict) else None
            if not isinstance(digest, str) or not isinstance(reference, str):
                continue
            try:
                signature = base64.b64decode(str(text))
            except (binascii.Error, ValueError):
                continue
            if any(_verifies(p, signature, data) for p in publics):
                found.add((digest, _canonical(reference)))
    return found


def policy_problems(bundle: Path, keys: list[Path]) -> list[str]:
    """The policy oracle (issue 38), written apart from importer/verify/cosign.py: what
    ``--require-signed`` must not have admitted. Every manifest of every image of bundle.json
    (each platform's and the carried index) must be named by a signature a key verifies, whose
    repository is that of one of the image's refs, or be listed by digest in an index (any blob
    of the bundle holding those bytes) whose own digest is so signed. Every file artifact (3.6)
    must have its manifest digest so signed as the repository of its ref (3.7)."""
    try:
        doc = json.loads((bundle / "bundle.json").read_bytes())
        statements = vouched(bundle, keys)
        problems = []
        for n, image in enumerate(doc["images"]):
            needed = [image["manifest"]["digest"], *(p["manifest"]["digest"] for p in image.get("platforms", []))]
            needed += [image["index"]["digest"]] if "index" in image else []
            mine = {_repository(r) for r in image["refs"]}
            signed = {d for d, r in statements if r in mine}
            listed: set[str] = set()
            for index in signed:
                got = _json_of(_blob(bundle, index))
                entries = got.get("manifests") if isinstance(got, dict) else None
                listed |= {e["digest"] for e in entries if isinstance(e, dict) and isinstance(e.get("digest"), str)} \
                    if isinstance(entries, list) else set()
            problems += [f"images[{n}]: {d[:19]} is admitted, but no verified signature as {sorted(mine)} names it "
                         "and no signed index lists it" for d in needed if d not in signed | listed]
        for n, art in enumerate(doc.get("artifacts", [])):
            if (art["manifest"]["digest"], _repository(art["ref"])) not in statements:
                problems.append(f"artifacts[{n}]: {art['ref']} is admitted, but no verified signature as "
                                f"{_repository(art['ref'])!r} names its manifest {art['manifest']['digest'][:19]}")
        return problems
    except (KeyError, TypeError, AttributeError, ValueError, OSError) as e:
        return [f"the oracle cannot read the admitted bundle: {type(e).__name__}: {e}"]


# ============================================================================ one case


@dataclass
class Outcome:
    target: str
    repinned: bool
    exit_code: int
    stderr: str
    seconds: float
    inspect_error: str = ""
    reference: list[str] = field(default_factory=list)
    #: the same bundle with ``--require-signed KIT-KEY`` (a signed pristine only): its exit code
    #: (None: not run), whether its image-signatures step admitted the images, the oracle's word
    policy_code: int | None = None
    policy_stderr: str = ""
    admitted: bool = False
    policy: list[str] = field(default_factory=list)

    @property
    def defects(self) -> list[str]:
        found = []
        if self.exit_code == 1 or "error[internal]" in self.stderr:
            found.append("internal error")
        if self.policy_code == 1 or "error[internal]" in self.policy_stderr:
            found.append("internal error with --require-signed: " + self.policy_stderr.strip()[:300])
        if self.admitted and self.policy:
            found.append("--require-signed admitted it, but the policy oracle refuses it: "
                         + "; ".join(self.policy[:3]))
        if self.admitted and self.policy_code != self.exit_code:
            found.append(f"--require-signed admitted it, then exited {self.policy_code}; without it: {self.exit_code}")
        if self.policy_code == 0 and not self.admitted:
            found.append("--require-signed exited 0 without admitting the images")
        if self.exit_code == 0 and self.reference:
            found.append("accepted, but the reference check refuses it: " + "; ".join(self.reference[:3]))
        if self.inspect_error:
            found.append("inspect: " + self.inspect_error)
        return found


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def stop(*_: Any) -> None:
        raise TimeoutError(f"over {seconds}s")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _run_importer(target: Path, *extra: str) -> tuple[int, str]:
    from importer.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main([str(target), "--verify-only", "--quiet", *extra])
        except SystemExit as e:  # argparse
            code = int(e.code or 0)
        except TimeoutError:
            raise
        except BaseException as e:
            code, err = 1, io.StringIO(f"error[internal]: escaped main(): {type(e).__name__}: {e}")
    return code, err.getvalue()


def _run_policy(target: Path, key: Path) -> tuple[int, str, bool]:
    """``bundle-import TARGET --verify-only --require-signed KEY`` in-process; whether the walk's
    image-signatures step returned (admitted every image) is seen through a wrapper around it."""
    from importer.pipeline import walk

    seen: list[Any] = []
    real = walk.images_signed

    def watched(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        seen.append(result)
        return result

    walk.images_signed = watched
    try:
        code, stderr = _run_importer(target, "--require-signed", str(key))
    finally:
        walk.images_signed = real
    return code, stderr, bool(seen)


def _inspect(target: Path) -> str:
    from importer.errors import BundleError
    from importer.verify.inspection import inspect_bundle

    try:
        inspect_bundle(str(target))
    except BundleError:
        return ""
    except TimeoutError:
        raise
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""


def run_case(pristine: Path, work: Path, rnd: random.Random, target: str) -> Outcome:
    """Mutate a copy of ``pristine`` at ``target``, then verify and inspect it."""
    import time

    if work.exists():
        shutil.rmtree(work)
    bundle = work / "b.bundle"
    shutil.copytree(pristine, bundle)
    repinned = rnd.random() < 0.6
    doc = json.loads((bundle / "bundle.json").read_bytes())
    subject: Path = bundle
    key = pristine.parent / "cosign.pub"
    if target in ("cuda", "artifacts"):
        (_mutate_cuda if target == "cuda" else _mutate_artifacts)(doc, rnd)
        (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
        if repinned:
            regenerate_sums(bundle)
    elif target == "signature-manifest":
        _mutate_signature_manifest(bundle, doc, rnd, repinned)
    elif target == "signature-payload":
        from tests.kit.bundlegen import kit_key

        _mutate_signature_payload(bundle, doc, rnd, repinned, kit_key(pristine)[0])
    elif target == "bundle.json":
        mutated = mutate_json(doc, rnd)
        (bundle / "bundle.json").write_text(json.dumps(mutated, indent=2))
        if repinned:
            regenerate_sums(bundle)
    elif target == "index.json":
        (bundle / "index.json").write_text(json.dumps(mutate_json(json.loads((bundle / "index.json").read_bytes()),
                                                                  rnd)))
        if repinned:
            repin_file(bundle, "index.json")
    elif target == "carried-index":
        old = doc["images"][0]["index"]["digest"]
        data = json.dumps(mutate_index(json.loads((bundle / "blobs/sha256" / old[7:]).read_bytes()), rnd)).encode()
        if repinned:
            replace_blob(bundle, old, data)
        else:
            (bundle / "blobs/sha256" / old[7:]).write_bytes(data)
    elif target in ("manifest", "config"):
        image = rnd.choice([r for img in doc["images"] for r in (img, *img.get("platforms", []))])
        old = image[target]["digest"]
        raw = (bundle / "blobs/sha256" / old[7:]).read_bytes()
        data = json.dumps(mutate_json(json.loads(raw), rnd)).encode()
        if repinned:
            replace_blob(bundle, old, data)
        else:
            (bundle / "blobs/sha256" / old[7:]).write_bytes(data)
    elif target == "SHA256SUMS":
        (bundle / "SHA256SUMS").write_bytes(mutate_lines((bundle / "SHA256SUMS").read_bytes(), rnd))
    elif target == "parts-index":
        pack_bundle(str(bundle), str(work / "b.tar"), split=64 * 1024)
        index_path = work / "b.tar.parts.json"
        index_path.write_text(json.dumps(mutate_json(json.loads(index_path.read_bytes()), rnd)))
        subject = index_path
    else:  # tar-header
        pack_bundle(str(bundle), str(work / "b.tar"))
        subject = work / "b.tar"
        data = bytearray(subject.read_bytes())
        headers = _header_offsets(bytes(data))
        at = rnd.choice(headers)
        for _ in range(rnd.randint(1, 4)):
            field_at = rnd.choice([0, 100, 124, 136, 148, 156, 157, 257, 345, rnd.randrange(512)])
            data[at + field_at + rnd.randrange(8)] = rnd.randrange(256)
        if repinned:
            block = data[at:at + 512]
            block[148:156] = b" " * 8
            block[148:156] = b"%06o\0 " % sum(block)
            data[at:at + 512] = block
        subject.write_bytes(bytes(data))
    started = time.monotonic()
    signed = key.is_file() and subject == bundle
    with _deadline(CASE_SECONDS):
        code, stderr = _run_importer(subject)
        inspect_error = _inspect(subject)
        policy = _run_policy(subject, key) if signed else (None, "", False)
    outcome = Outcome(target, repinned, code, stderr, time.monotonic() - started, inspect_error)
    outcome.policy_code, outcome.policy_stderr, outcome.admitted = policy
    if outcome.admitted:
        outcome.policy = policy_problems(bundle, [key])
    if code == 0 and subject == bundle:
        outcome.reference = reference_problems(bundle)
    elif code == 0:  # a tar or parts that verified: the reference reads it unpacked
        unpacked = work / "unpacked"
        unpacked.mkdir()
        joined = b"".join(p.read_bytes() for p in sorted(work.glob("b.tar.part[0-9]*"))) if target == "parts-index" \
            else subject.read_bytes()
        proc = subprocess.run(["tar", "-x", "-C", str(unpacked)], input=joined, capture_output=True, check=False)
        outcome.reference = reference_problems(unpacked) if proc.returncode == 0 else ["GNU tar refuses the archive"]
    return outcome


def _header_offsets(data: bytes) -> list[int]:
    """Offsets of the header blocks of a tar we wrote (ustar/pax, regular members)."""
    offsets, at = [], 0
    while at + 512 <= len(data) and data[at:at + 512] != b"\0" * 512:
        offsets.append(at)
        size = int(data[at + 124:at + 136].strip(b"\0 ") or b"0", 8)
        at += 512 + size + (-size % 512)
    return offsets or [0]


def budget_seconds(default: float) -> float:
    return float(os.environ.get("SNEAKERNET_FUZZ_SECONDS", default))


