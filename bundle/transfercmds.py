"""``bundle pack|copy|push`` and ``bundle export --archive/--split``: carrying a bundle.

Thin: parse, call bundle/archive.py, bundle/copy.py or bundle/push.py, render (``--json`` for
scripts). Progress lines only when stderr is a terminal."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import uuid
from typing import Any, Callable, Optional, Tuple

from bundle.archive import PackResult, check_archive_target, pack_bundle
from bundle.embed import far_side_lines, first_run_check
from bundle.export import user_paths
from bundle.progressui import progress_factory
from bundle.push import push
from bundle.sshtunnel import SshTarget
from importer.cli.copy import add_copy_arguments, cmd_copy
from importer.cli.output import emit, success
from importer.errors import BundleError, UsageError
from importer.registry.access import access_from_args, add_access_arguments
from importer.registry.client import DEFAULT_CHUNK
from importer.registry.transcode import CHOICES, ZSTD_READERS, has_zstd
from importer.streams.fatfs import is_fat, split_for
from importer.streams.progress import human_bytes
from importer.streams.sizes import parse_size

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def _progress(args: argparse.Namespace) -> Optional[ProgressFactory]:
    """rich on a terminal, plain stderr lines every few seconds otherwise; --quiet: none (bundle/progressui.py)."""
    return progress_factory(bool(getattr(args, "quiet", False)))


def _log(args: argparse.Namespace) -> Callable[[str], None]:
    if getattr(args, "quiet", False):
        return lambda _line: None
    return lambda line: print(f"note: {line}", file=sys.stderr)


def _split(args: argparse.Namespace) -> Optional[int]:
    return parse_size(args.split, what="--split", minimum=1) if getattr(args, "split", None) else None


def _archive_split(args: argparse.Namespace, archive: str) -> Optional[int]:
    """--split, or the parts a FAT target needs (said on stderr in one line, before any byte is written)."""
    split, note = split_for(archive, _split(args))
    if note:
        print(f"note: {note}", file=sys.stderr)
    args.split = str(split) if split is not None else None  # export --archive: finish_export packs with it
    return split


def add_transfer_commands(sub: Any) -> None:
    pk = sub.add_parser("pack", help="pack a bundle folder into one tar, or into parts no larger than SIZE")
    pk.add_argument("bundle", metavar="DIR", help="the bundle folder")
    pk.add_argument("archive", metavar="FILE.tar", help="the tar to write (with --split: FILE.tar.partNNN + "
                    "FILE.tar.parts.json); bundle-import.pyz is written beside it")
    pk.add_argument("--split", metavar="SIZE", help="cut into parts of at most SIZE (e.g. 3900M for FAT32, 4G)")
    pk.add_argument("--force", action="store_true", help="replace an earlier archive and its parts")
    pk.add_argument("--json", action="store_true", help="print the result as JSON")
    pk.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    pk.set_defaults(handler=cmd_pack)

    cp = sub.add_parser("copy", help="copy a bundle (folder, tar or parts) resumably, then verify the copy "
                        "(also in the importer: python3 bundle-import.pyz copy SRC DST)")
    add_copy_arguments(cp)
    cp.set_defaults(handler=cmd_copy, make_progress=lambda quiet: _progress(argparse.Namespace(quiet=quiet)))

    ps = sub.add_parser("push", help="push the bundle's images into a registry (optionally through SSH)")
    ps.add_argument("bundle", metavar="BUNDLE", help="a bundle folder, FILE.tar or FILE.tar.parts.json")
    ps.add_argument("registry", metavar="REGISTRY[/NAMESPACE]",
                    help="e.g. 127.0.0.1:5000/team: my/app:1 goes to 127.0.0.1:5000/team/my/app:1")
    ps.add_argument("--concurrency", type=int, default=4, metavar="N", help="parallel blob uploads (default 4)")
    ps.add_argument("--chunk-size", metavar="SIZE", default=str(DEFAULT_CHUNK),
                    help="bytes per upload request (default 16M; lower it behind a proxy body limit)")
    ps.add_argument("--compression", choices=CHOICES, default="keep",
                    help="the layers' compression in the registry: keep (default; a default bundle's are zstd, read "
                    f"by {ZSTD_READERS}), gzip (for Docker before 23.0) or zstd; recompressed on the way, each "
                    "layer's diff_id checked: same image IDs, new manifest digests (in --json: renamedManifests)")
    ps.add_argument("--require-signed", action="append", default=[], metavar="KEY.pub",
                    help="push only if every image carries a cosign signature by one of these public keys (as "
                    "bundle-import --require-signed checks it; repeatable), checked before anything is sent")
    ps.add_argument("--allow-recompressed-signed", action="store_true",
                    help="with --require-signed: let --compression rewrite signed images (their signatures then "
                    "name digests the registry does not get, so `cosign verify` refuses the pushed images)")
    add_access_arguments(ps)
    ps.add_argument("--ssh", metavar="USER@HOST",
                    help="push through `ssh -L` to HOST; REGISTRY is then the registry as HOST sees it")
    ps.add_argument("--ssh-port", type=int, metavar="N", help="SSH port (default 22 or ~/.ssh/config)")
    ps.add_argument("--identity", metavar="FILE", help="SSH private key (ssh -i)")
    ps.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra ssh -o option, e.g. UserKnownHostsFile=FILE (repeatable)")
    ps.add_argument("--json", action="store_true", help="print the result as JSON")
    ps.add_argument("--quiet", "-q", action="store_true", help="no progress or retry notes")
    ps.set_defaults(handler=cmd_push)


def add_archive_options(e: argparse.ArgumentParser) -> None:
    """``bundle export ... --archive FILE.tar [--split SIZE]``."""
    e.add_argument("--archive", metavar="FILE.tar",
                   help="also write the bundle as one tar (bundle.json and the importer first); without -o the "
                   "folder is only a staging area, removed blob by blob as it is packed")
    e.add_argument("--split", metavar="SIZE", help="with --archive: parts of at most SIZE (e.g. 3900M for FAT32)")


def export_target(args: argparse.Namespace) -> Tuple[str, bool]:
    """(the folder to export into, whether packing consumes it)."""
    archive = getattr(args, "archive", None)
    if getattr(args, "split", None) and not archive:
        raise UsageError("exporting: expected --archive FILE.tar with --split, found none")
    if archive and getattr(args, "schema", 3) != 3:
        raise UsageError(f"exporting: --archive needs --schema 3, found --schema {args.schema}")
    if archive:  # refused now, not after a long export
        check_archive_target(archive, split=_archive_split(args, archive), force=args.force)
    if args.output:
        return args.output, False
    if not archive:
        raise UsageError("exporting: expected -o DIR or --archive FILE.tar, found neither")
    parent = os.path.dirname(os.path.abspath(archive))
    if is_fat(parent):  # FAT cannot hold a blob of 4 GiB or more even for a moment: stage on local disk
        parent = tempfile.gettempdir()
    # export_images() builds it as NAME.partial-* and renames it into place when whole
    return os.path.join(parent, f".{os.path.basename(archive)}.export-{uuid.uuid4().hex[:12]}"), True


def finish_export(args: argparse.Namespace, folder: str, consume: bool) -> Optional[PackResult]:
    """Pack the exported folder when --archive was given (removing the staging folder after)."""
    if not getattr(args, "archive", None):
        return None
    try:
        return pack_bundle(folder, args.archive, split=_split(args), force=args.force, consume=consume,
                           progress=_progress(args))
    except BundleError as e:  # the staging folder is gone: name the archive the user asked for
        raise (user_paths(e, folder, args.archive) if consume else e) from e.__cause__
    finally:
        if consume:
            shutil.rmtree(folder, ignore_errors=True)


def pack_lines(res: PackResult) -> str:
    if res.parts:
        biggest = max(p.size for p in res.parts)
        text = (f"wrote {len(res.parts)} part(s) of at most {human_bytes(biggest)} "
                f"({human_bytes(res.size)} in all) and {res.archive}")
    else:
        text = f"wrote {res.archive} ({human_bytes(res.size)})"
    if res.importer:
        text += "\n" + far_side_lines(res.importer, res.archive)
        if res.importer_digest is not None:
            text += "\n" + first_run_check(res.importer, res.importer_digest)
    return text


def cmd_pack(args: argparse.Namespace) -> int:
    res = pack_bundle(args.bundle, args.archive, split=_archive_split(args, args.archive), force=args.force,
                      progress=_progress(args))
    if args.json:
        emit(success(res.to_dict()))
    else:
        print(pack_lines(res))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        raise UsageError(f"reading --concurrency: expected at least 1, found {args.concurrency}")
    if (args.ssh_port or args.identity or args.ssh_option) and not args.ssh:
        raise UsageError("reading the SSH options: expected --ssh USER@HOST with them, found none")
    ssh = SshTarget(args.ssh, args.ssh_port, args.identity, tuple(args.ssh_option)) if args.ssh else None
    outcome = push(args.bundle, args.registry, access=access_from_args(args), concurrency=args.concurrency,
                   chunk_size=parse_size(args.chunk_size, what="--chunk-size", minimum=4096), ssh=ssh,
                   progress=_progress(args), log=_log(args), compression=args.compression,
                   require_signed=args.require_signed, allow_recompressed_signed=args.allow_recompressed_signed)
    rep = outcome.report
    if args.json:
        emit(success(outcome.to_dict()))
        return 0
    for r in rep.refs:
        print(f"{r.pullable}  {r.image.manifest.digest.short}  {r.status}  read back: OK")
    for art in outcome.artifacts:
        print(f"{art['kind']} {art['reference']} of {art['image']} -> {art['repository']}")
    for digest in rep.untagged:
        print(f"skipped untagged image {digest[:19]} (a registry names images by repository:tag)")
    for p in outcome.files:
        print(f"{p.pullable}  {p.artifact.manifest.digest.short}  {p.status}  {len(p.artifact.files)} file(s), "
              f"{human_bytes(p.artifact.size)}  read back: OK  (oras pull {p.pullable})")
    print(f"blobs: {rep.blobs_uploaded} uploaded ({human_bytes(rep.bytes_uploaded)}), {rep.blobs_mounted} mounted, "
          f"{rep.blobs_present} already there; {rep.stats.get('retries', 0)} retries, "
          f"{rep.stats.get('resumes', 0)} resumed, {rep.stats.get('restarts', 0)} restarted; {rep.seconds:.1f}s"
          + (f"; via {outcome.via}" if outcome.via else ""))
    if outcome.renamed:
        print(f"layers recompressed to {args.compression}: {len(outcome.renamed)} manifest(s) have new digests "
              "(image IDs unchanged)")
    if rep.refs:
        zstd = any(has_zstd(r.image) for r in rep.refs)
        print(f"on the nodes: docker pull {rep.refs[0].pullable}"
              + (f"  (zstd layers: {ZSTD_READERS}; for Docker before 23.0 push with --compression gzip)"
                 if zstd else ""))
    return 0
