"""``bundle copy`` / ``bundle-import copy``: the resumable, verified copy (importer/copying.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Optional, Sequence

from importer.copying import copy_bundle
from importer.errors import BundleError, os_error
from importer.progress import StderrProgress, human_bytes
from importer.sizes import parse_size
from importer.text import printable, render_error

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def add_copy_arguments(cp: argparse.ArgumentParser) -> None:
    cp.add_argument("src", metavar="SRC", help="a bundle folder, FILE.tar or FILE.tar.parts.json")
    cp.add_argument("dst", metavar="DST", help="the destination folder (for a folder SRC: the new bundle folder)")
    cp.add_argument("--bwlimit", metavar="RATE", help="at most RATE bytes per second (e.g. 20M)")
    cp.add_argument("--json", action="store_true", help="print the result as JSON")
    cp.add_argument("--quiet", "-q", action="store_true", help="no progress lines")


def cmd_copy(args: argparse.Namespace) -> int:
    progress: Optional[ProgressFactory] = None
    if not args.quiet and not args.json and sys.stderr.isatty():
        progress = lambda label, total: StderrProgress(label, total)  # noqa: E731
    rate = parse_size(args.bwlimit, what="--bwlimit") if args.bwlimit else None
    res = copy_bundle(args.src, args.dst, progress=progress, bwlimit=rate)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        print(f"copied {len(res.copied)}, resumed {len(res.resumed)}, skipped {len(res.skipped)} file(s) "
              f"({human_bytes(res.bytes_copied)}) in {res.seconds:.1f}s; verified {printable(res.target)}: OK")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``bundle-import copy SRC DST``: copy from removable media to local disk on the far side."""
    p = argparse.ArgumentParser(prog="bundle-import copy",
                                description="Copy a bundle (folder, tar or parts) resumably, then verify the copy.")
    add_copy_arguments(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    args = p.parse_args(argv)
    try:
        try:
            return cmd_copy(args)
        except OSError as e:  # typed, naming the file: unreadable-file for SRC's, else file-access
            if args.debug:
                raise
            raise os_error(e, args.src) from e
    except BundleError as e:
        if args.debug:
            raise
        render_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        print("error[interrupted]: stopped; run the same command again to finish the copy", file=sys.stderr)
        return 130
