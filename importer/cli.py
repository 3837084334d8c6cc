"""bundle-import: verify a bundle, load it into an engine, prove what the engine holds.

Thin: parse arguments, call one library function, render, return an exit code
(docs/errors.md lists them)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer import SCHEMA_MAJOR, __version__
from importer.digest import Digest
from importer.errors import BundleError, Interrupted, UsageError, VerificationFailed
from importer.importing import ImportResult, import_bundle, verify_or_raise
from importer.legacy import (
    bundle_major,
    import_legacy_bundle,
    load_legacy_manifest,
    raise_if_problems,
    verify_legacy,
)
from importer.postload import render_table
from importer.progress import StderrProgress
from importer.receipt import build_import_receipt, write_receipt
from importer.verify import VerifyReport

EXIT_OK = 0
LEGACY_MAJORS = (1, 2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bundle-import",
        description="Verify a sneakernet bundle, load it into a container engine and prove "
        "that the engine holds exactly what was built.",
        epilog="Exit codes: 0 ok, 1 unexpected error, 2 usage, 3 integrity, 4 invalid bundle "
        "manifest or unsupported schema, 6 engine, 7 policy (tag conflict, signature), "
        "8 engine holds something else, 130 interrupted. See docs/errors.md.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle folder (holding bundle.json)")
    p.add_argument("--verify", action="store_true",
                   help="verify every byte before loading and the engine's copy after (always on; "
                   "accepted for explicit scripts)")
    p.add_argument("--verify-only", action="store_true", help="verify the bundle and stop; needs no engine")
    p.add_argument("--engine", choices=["docker"], default="docker", help="where to load (default: docker)")
    p.add_argument("--docker-host", metavar="URL", help="Docker daemon address (default: $DOCKER_HOST)")
    p.add_argument("--receipt", metavar="PATH",
                   help="where to write the import receipt (default: ./<bundle>.import-receipt.json)")
    p.add_argument("--no-receipt", action="store_true", help="do not write a receipt file")
    p.add_argument("--force", action="store_true", help="move existing tags that point to other images")
    p.add_argument("--json", action="store_true", help="print a JSON result on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version",
                   version=f"bundle-import {__version__} (bundle schema up to {SCHEMA_MAJOR}.x)")
    return p


def _progress(quiet: bool) -> Optional[Callable[[str, int], Callable[[int], None]]]:
    if quiet or not sys.stderr.isatty():
        return None
    return lambda label, total: StderrProgress(label, total)


def _default_receipt(bundle: str) -> str:
    name = os.path.basename(os.path.abspath(bundle).rstrip("/")) or "bundle"
    return os.path.abspath(f"{name}.import-receipt.json")


def _report_lines(report: VerifyReport) -> str:
    return (f"verified {report.files_checked} files, {report.layers_checked} layers "
            f"({report.bytes_checked} bytes) in {report.seconds:.1f}s: "
            + ("OK" if report.ok else f"{len(report.problems)} problem(s)"))


def cmd_verify_only(args: argparse.Namespace) -> int:
    major, raw = bundle_major(args.bundle)
    if major in LEGACY_MAJORS:
        report = verify_legacy(args.bundle, load_legacy_manifest(raw, major), raw)
        raise_if_problems(args.bundle, report)
    else:
        report = verify_or_raise(args.bundle, progress=_progress(args.quiet))
    if args.json:
        print(json.dumps({"ok": True, "verification": report.to_dict()}, indent=2))
    else:
        print(_report_lines(report))
    return EXIT_OK


def make_sink(args: argparse.Namespace) -> Any:
    if args.engine == "docker":
        from importer.sinks.docker import DockerSink

        return DockerSink(args.docker_host)
    raise UsageError(f"choosing an engine: expected docker, found {args.engine!r}")


def cmd_import(args: argparse.Namespace) -> int:
    sink = make_sink(args)
    result = ImportResult(root=args.bundle, bundle_digest="", report=VerifyReport(root=args.bundle))
    error: Optional[BundleError] = None
    try:
        major, raw = bundle_major(args.bundle)
        if major in LEGACY_MAJORS:
            result.bundle_digest = str(Digest.of_bytes(raw))
            import_legacy_bundle(args.bundle, sink, force=args.force, result=result, raw_bundle_json=raw,
                                 major=major)
        else:
            import_bundle(args.bundle, sink, force=args.force, progress=_progress(args.quiet), result=result)
    except BundleError as e:
        error = e
    except KeyboardInterrupt:
        error = Interrupted("importing: interrupted; what this run loaded was removed")
    receipt = _receipt(args, result, error)
    receipt_path = None
    if not args.no_receipt:
        receipt_path = args.receipt or _default_receipt(args.bundle)
        write_receipt(receipt_path, receipt)
    if args.json:
        print(json.dumps(receipt, indent=2))
    elif result.checks:
        print(render_table(result.checks))
    if receipt_path and not args.json:
        print(f"receipt: {receipt_path}", file=sys.stderr)
    if result.leftovers:
        print("left in the engine (remove with `docker image rm`): " + " ".join(result.leftovers), file=sys.stderr)
    if error is not None:
        raise error
    return EXIT_OK


def _receipt(args: argparse.Namespace, res: ImportResult, error: Optional[BundleError]) -> Dict[str, Any]:
    manifest = res.report.manifest
    verification = res.report.to_dict() if manifest is not None else None
    if isinstance(error, VerificationFailed):
        verification = {"ok": False, "problems": [_problem_dict(p) for p in error.problems]}
    return build_import_receipt(
        bundle_path=os.path.abspath(args.bundle),
        bundle_digest=res.bundle_digest or None,
        schema_version=manifest.schema_version if manifest else None,
        engine=res.engine.to_dict() if res.engine else None,
        verification=verification,
        images=[c.to_dict() for c in res.checks],
        timings=res.timings,
        result="pass" if error is None and res.ok else "fail",
        error=error.to_dict() if error is not None else None,
    )


def _problem_dict(p: object) -> Any:
    to_dict = getattr(p, "to_dict", None)
    return to_dict() if callable(to_dict) else str(p)


def render_error(e: BundleError) -> None:
    print(f"error[{e.reference}]: {e.message}", file=sys.stderr)
    if e.context:
        print(textwrap.indent(e.context, "  "), file=sys.stderr)
    if e.hint:
        print(f"hint: {e.hint}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = cmd_verify_only if args.verify_only else cmd_import
    try:
        return handler(args)
    except BundleError as e:
        if args.debug:
            raise
        if args.json and args.verify_only:
            problems: List[Any] = [_problem_dict(p) for p in getattr(e, "problems", [])]
            print(json.dumps({"ok": False, "error": e.to_dict(), "problems": problems}, indent=2))
        render_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        print("error[interrupted]: stopped by the user", file=sys.stderr)
        return 130
    except Exception as e:  # the last resort: never a bare traceback for users
        if args.debug:
            raise
        print(f"error[internal]: {type(e).__name__}: {e}", file=sys.stderr)
        print("hint: this is a bug in bundle-import; re-run with --debug and report the traceback",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
