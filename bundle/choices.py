"""The choices ``bundle export`` makes without being asked, each said in one ``note:`` line on
stderr (issue 40): the compression ``--compression auto`` took from a ``--have`` inventory, an
image carried without a name, an option that had nothing to act on. Nothing here changes what
is exported; the lines only tell what was."""

from __future__ import annotations

import argparse
import contextlib
from typing import List, Optional, Sequence

from bundle.sources.choose import transport_of
from importer.errors import UsageError
from importer.format.manifest import BundleManifest
from importer.inventory.have import engines_read_zstd, zstd_is_fast_on


def compression_note(compression: str, schema: int, have: Sequence[str]) -> Optional[str]:
    """Why ``--compression auto`` chose gzip (the default is zstd), when a ``--have`` inventory made it."""
    if compression != "auto" or schema != 3 or not have:
        return None
    reads = engines_read_zstd(have)
    if reads is not None and not reads[0]:
        why = f"its engine ({reads[1]}) reads no zstd layers"
    elif zstd_is_fast_on(have) is False:
        why = "it has no fast zstd decoder (no zstandard module, no zstd command, Python < 3.14)"
    else:
        return None
    return (f"note: --compression auto chose gzip, not zstd: the --have inventory's host says {why}; "
            "layers the source keeps compressed are carried as they are (--compression zstd overrides)")


def untagged_notes(manifest: Optional[BundleManifest]) -> List[str]:
    """One line per image the bundle carries without a name (a digest reference, an OCI layout's bare tag)."""
    if manifest is None:
        return []
    return [f"note: image {image.config.digest.short} is carried untagged (its source named it by digest or a "
            "bare tag): the far side loads it without a name; --tag NAME:TAG names it"
            for image in manifest.images if not image.refs]


def ignored_option_notes(args: argparse.Namespace, images: Sequence[str]) -> List[str]:
    """An option given that this export has nothing to use for: it is ignored, and said so."""
    kinds = set()
    for ref in images:
        with contextlib.suppress(UsageError):  # the export itself said what is wrong with a reference
            kinds.add(transport_of(ref)[0])
    notes = []
    if args.docker_host and kinds and "docker-daemon" not in kinds:
        notes.append("--docker-host is ignored: no image comes from Docker")
    if args.level is not None and args.schema == 1:
        notes.append("--level is ignored: --schema 1 compresses nothing")
    if args.allow_unfit and not args.have:
        notes.append("--allow-unfit is ignored: it goes with --have INVENTORY (the host whose fit is judged)")
    if args.images_from_allow_local and not args.images_from:
        notes.append("--images-from-allow-local is ignored: it goes with --images-from FILE")
    return [f"note: {n}" for n in notes]


def choice_notes(args: argparse.Namespace, images: Sequence[str], manifest: Optional[BundleManifest]) -> List[str]:
    """Every note of an export: ignored options, the compression chosen, untagged images."""
    chosen = compression_note(args.compression, args.schema, args.have)
    return [*ignored_option_notes(args, images), *([chosen] if chosen else []), *untagged_notes(manifest)]
