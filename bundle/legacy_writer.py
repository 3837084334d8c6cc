"""Write schema 1 and 2 bundles: the ``docker save`` stream kept whole (schema 1) or
zstd-compressed (schema 2), hashed as it passes, with bundle.json read from the same pass."""

from __future__ import annotations

import datetime
import json
import os
import tarfile
from typing import Any, Callable, Dict, List, Optional, Sequence

import zstandard

from bundle.embed import build_pyz
from importer import __version__
from importer.errors import CommandFailed, SourceError
from importer.format.digest import CHUNK, Digest
from importer.format.legacy import ARCHIVES, MEDIA_TYPES
from importer.format.limits import MAX_CONFIG, parse_json, read_limited
from importer.format.manifest import BUNDLE_JSON, IMPORTER_PYZ, SUMS_FILE
from importer.format.sums import format_sums
from importer.streams.commands import command_stdout
from importer.streams.fsutil import atomic_write_bytes
from importer.streams.readers import HashingReader, HashingWriter

ProgressFn = Callable[[int], None]


def write_legacy_bundle(root: str, save_argv: Sequence[str], refs: Sequence[str], schema: int,
                        source: Dict[str, Any], *, level: Optional[int] = None,
                        on_bytes: Optional[ProgressFn] = None) -> Dict[str, Any]:
    """Stream ``save_argv`` (``docker save REFS...``) into the bundle's archive at ``root``;
    return bundle.json."""
    archive = ARCHIVES[schema]
    docs: Dict[str, bytes] = {}
    path = os.path.join(root, archive)
    argv = list(save_argv)
    try:
        with command_stdout(argv, what=f"streaming `docker save` of {', '.join(refs)}") as stream, \
                open(path, "wb") as f:
            out = HashingWriter(f)
            if schema == 2:
                cctx = zstandard.ZstdCompressor(level=3 if level is None else level, threads=-1, write_checksum=True)
                sink: Any = cctx.stream_writer(out, closefd=False, write_size=CHUNK)  # type: ignore[arg-type]
            else:
                sink = out
            tee = HashingReader(stream, on_bytes, tee=sink)
            with tarfile.open(fileobj=tee, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    name = member.name.lstrip("./")
                    small_blob = name.startswith("blobs/sha256/") and member.size <= MAX_CONFIG
                    if member.isfile() and ((name.endswith(".json") and "/" not in name) or small_blob):
                        fobj = tar.extractfile(member)
                        if fobj is not None:
                            data = read_limited(fobj, MAX_CONFIG, name)
                            if data[:1] == b"{" or data[:1] == b"[":
                                docs[name] = data
            while tee.read(CHUNK):
                pass
            if schema == 2:
                sink.close()
            f.flush()
            os.fsync(f.fileno())
    except CommandFailed as e:
        raise SourceError(f"exporting {', '.join(refs)}: `docker save` failed with status {e.returncode}",
                          context=e.stderr_tail.strip() or None) from e
    if "manifest.json" not in docs:
        raise SourceError("reading the `docker save` stream: expected manifest.json, found none")
    images: List[Dict[str, Any]] = []
    for entry in parse_json(docs["manifest.json"], "manifest.json"):
        config_name = str(entry.get("Config", "")).lstrip("./")
        raw_config = docs.get(config_name)
        if raw_config is None:
            raise SourceError(f"reading docker save: expected the config {config_name}, found none")
        config = parse_json(raw_config, config_name)
        images.append({
            "refs": list(entry.get("RepoTags") or []),
            "configDigest": str(Digest.of_bytes(raw_config)),
            "diffIds": list((config.get("rootfs") or {}).get("diff_ids") or []),
        })
    files = [{"path": archive, "digest": f"sha256:{out.hasher.hexdigest()}", "size": out.count}]
    if schema == 2:
        pyz = build_pyz()
        atomic_write_bytes(os.path.join(root, IMPORTER_PYZ), pyz, mode=0o755)
        files.append({"path": IMPORTER_PYZ, "digest": str(Digest.of_bytes(pyz)), "size": len(pyz)})
    doc: Dict[str, Any] = {
        "schemaVersion": f"{schema}.0",
        "mediaType": MEDIA_TYPES[schema],
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tool": {"name": "sneakernet", "version": __version__},
        "source": source,
        "images": images,
        "archive": files[0],
        "uncompressedDigest": f"sha256:{tee.hasher.hexdigest()}",
        "uncompressedSize": tee.count,
        "files": files,
    }
    raw_bj = (json.dumps(doc, indent=2) + "\n").encode()
    atomic_write_bytes(os.path.join(root, BUNDLE_JSON), raw_bj)
    entries = [(str(f["path"]), Digest.parse(f["digest"])) for f in files]
    entries.append((BUNDLE_JSON, Digest.of_bytes(raw_bj)))
    atomic_write_bytes(os.path.join(root, SUMS_FILE), format_sums(entries))
    return doc
