"""``bundle copy`` / ``bundle-import copy``: the resumable, verified copy (importer/transfer/copy.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from importer.cli.output import ArgumentParser, emit, guarded, success, with_examples
from importer.errors import Interrupted
from importer.format.text import printable
from importer.streams.progress import human_bytes, stderr_progress
from importer.streams.sizes import parse_size
from importer.transfer.copy import copy_bundle

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def add_copy_arguments(cp: argparse.ArgumentParser) -> None:
    cp.add_argument("src", metavar="SRC", help="a bundle folder, FILE.tar or FILE.tar.parts.json")
    cp.add_argument("dst", metavar="DST", help="the destination folder (for a folder SRC: the new bundle folder)")
    cp.add_argument("--bwlimit", metavar="RATE", help="at most RATE bytes per second (e.g. 20M)")
    cp.add_argument("--replace", action="store_true",
                    help="DST may hold another bundle (a bundle folder, or a tar or parts with their index and "
                    "importer, e.g. last week's) and nothing else: it is removed first (the files are listed)")
    cp.add_argument("--json", action="store_true", help="print the result as JSON")
    cp.add_argument("--quiet", "-q", action="store_true", help="no progress lines")


def cmd_copy(args: argparse.Namespace) -> int:
    make = getattr(args, "make_progress", None) or stderr_progress  # bundle copy: rich on a terminal
    progress: Optional[ProgressFactory] = make(args.quiet)
    rate = parse_size(args.bwlimit, what="--bwlimit") if args.bwlimit else None
    res = copy_bundle(args.src, args.dst, progress=progress, bwlimit=rate, replace=args.replace)
    if args.json:
        emit(success(res.to_dict()))
    else:
        if res.replaced:
            print(f"replaced the other bundle in {printable(res.dst)}: removed {len(res.replaced)} file(s) "
                  f"({printable(', '.join(res.replaced[:3]))}{', ...' if len(res.replaced) > 3 else ''})")
        print(f"copied {len(res.copied)}, resumed {len(res.resumed)}, skipped {len(res.skipped)} file(s) "
              f"({human_bytes(res.bytes_copied)}) in {res.seconds:.1f}s; verified {printable(res.target)}: OK")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``bundle-import copy SRC DST``: copy from removable media to local disk on the far side."""
    argv = list(argv if argv is not None else sys.argv[1:])
    p = ArgumentParser(prog="bundle-import copy",
                       description="Copy a bundle (folder, tar or parts) resumably, then verify the copy.")
    add_copy_arguments(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    with_examples(p, "python3 /media/usb/bundle-import.pyz copy /media/usb/train.tar.parts.json /data/incoming",
                  "bundle-import copy /media/usb/train.bundle /data/train.bundle --bwlimit 50M",
                  "python3 /media/usb/bundle-import.pyz copy /media/usb/train.tar.parts.json /data/incoming --replace")
    args = argparse.Namespace(json="--json" in argv, debug="--debug" in argv, src=None)

    def body() -> int:
        p.parse_args(argv, namespace=args)
        return cmd_copy(args)

    # an OSError is typed naming the file: unreadable-file for SRC's, else file-access
    return guarded(args, body, what="bundle-import copy", path=lambda: args.src,
                   interrupted=lambda e: Interrupted("copying: stopped by SIGINT",
                                                     hint="run the same command again to finish the copy"))
