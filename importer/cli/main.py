"""bundle-import: verify a bundle, load it into an engine, prove what the engine holds.

Thin: parse arguments, call one library function, render, return an exit code
(docs/errors.md lists them)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer import SCHEMA_MAJOR, __version__
from importer.cli.output import ArgumentParser, emit, guarded, success, with_examples
from importer.cli.smoke import add_smoke_arguments, smoke_after_import, smoke_receipt_base
from importer.cli.smoke import main as smoke_main
from importer.errors import BundleError, FileAccessError, UsageError, os_error, os_error_text
from importer.format.text import printable, printable_block
from importer.input.archive import locate
from importer.pipeline.checkonly import receipt_sections
from importer.pipeline.importing import ImportResult
from importer.pipeline.plan import CHECK_ONLY_RECEIPT, ImportPlan, plan_from_args, wants_registry
from importer.pipeline.postload import render_table
from importer.pipeline.walk import result_for, run_import
from importer.receipts.receipt import check_receipt_path, default_receipt_path, write_receipt
from importer.receipts.run import run_receipt
from importer.registry.sink import add_registry_arguments, registry_sink
from importer.sinks import Sink
from importer.sinks.choose import ENGINES, EngineOptions, choose_sink
from importer.smoke.settings import SmokeConfigError
from importer.streams.progress import stderr_progress
from importer.streams.signals import stop_error, stop_on_signals
from importer.verify.bundle import VerifyReport

EXIT_OK = 0
EXIT_CODES_HELP = """exit codes (docs/errors.md):
  0 ok                      1 unexpected error (a bug)   2 usage or configuration
  3 integrity               4 invalid bundle manifest or unsupported schema
  6 engine                  7 policy (tag conflict, signature)
  8 engine holds something else                          9 delta: base layers missing in the engine
  10 --smoke / smoke: verdict candidate (a required gate skipped)   11 --smoke / smoke: a gate failed
  12 fleet-report: the fleet did not pass (a host failed, is missing or stale)
  130 interrupted (SIGINT)  143 terminated (SIGTERM/SIGHUP)
trust and signatures: docs/security.md"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="bundle-import",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Verify a sneakernet bundle, load it into a container engine and prove "
        "that the engine holds exactly what was built.\n\n"
        "other commands (each has --help):\n"
        "  bundle-import smoke [IMAGE]    qualify this host with an imported image (GPU, torch, NCCL; "
        "docs/qualification.md)\n"
        "  bundle-import copy SRC DST     copy a bundle (folder, tar or parts) resumably, e.g. from a USB "
        "stick, then verify the copy\n"
        "  bundle-import serve BUNDLE     serve a verified bundle read-only as an OCI registry (docs/transfer.md)\n"
        "  bundle-import fleet-report RECEIPT...  one table and verdict from the receipts of many hosts "
        "(docs/fleet.md)\n"
        "  bundle-import sign-receipt RECEIPT... --sign-key KEY  sign receipts for fleet-report --trust",
        epilog=EXIT_CODES_HELP,
    )
    p.add_argument("bundle", metavar="BUNDLE", nargs="?",
                   help="the bundle folder (holding bundle.json), FILE.tar or FILE.tar.parts.json (read in "
                   "place, never unpacked); not needed with --inventory")
    p.add_argument("--verify", action="store_true",
                   help="verify every byte before loading and the engine's copy after (always on; "
                   "accepted for explicit scripts)")
    p.add_argument("--verify-only", action="store_true", help="verify the bundle and stop; needs no engine")
    p.add_argument("--check-only", action="store_true",
                   help="verify the bundle, then prove the engine already holds each of its images exactly (e.g. "
                   "pulled from a registry); loads, tags and removes nothing; exit 8 when one is missing or "
                   "differs (docs/fleet.md)")
    p.add_argument("--name-prefix", metavar="HOST[:PORT]/NS",
                   help="with --check-only: look each image up under the name `bundle push BUNDLE HOST[:PORT]/NS` "
                   "gives it (my/train:1 -> HOST:PORT/NS/my/train:1), the name nodes that pulled from there hold")
    p.add_argument("--shallow", action="store_true",
                   help="with --verify-only on a bundle folder: check every file's size and digest (every "
                   "byte) but do not decompress layers to re-derive their diff_ids (about 4x faster)")
    p.add_argument("--engine", choices=[*ENGINES, "registry"], default=None,
                   help="where to load (default: detected: the engine the options name, else $DOCKER_HOST, "
                   "else the first of Docker, containerd, podman that answers; see docs/engines.md)")
    p.add_argument("--docker-host", metavar="URL", help="docker: daemon address (default: $DOCKER_HOST)")
    p.add_argument("--address", metavar="SOCKET",
                   help="containerd: socket (default: $CONTAINERD_ADDRESS or /run/containerd/containerd.sock)")
    p.add_argument("--namespace", metavar="NS",
                   help="containerd: namespace (default: $CONTAINERD_NAMESPACE or default; Kubernetes uses k8s.io)")
    p.add_argument("--snapshotter", metavar="NAME",
                   help="containerd: snapshotter to unpack into (default: $CONTAINERD_SNAPSHOTTER or overlayfs)")
    p.add_argument("--podman-root", metavar="DIR", help="podman: storage root (podman --root)")
    p.add_argument("--podman-runroot", metavar="DIR", help="podman: run root (podman --runroot)")
    p.add_argument("--storage-driver", metavar="NAME", help="podman: storage driver (overlay, vfs, ...)")
    p.add_argument("--oci-dir", metavar="DIR", help="oci: the OCI image layout folder to write to")
    add_registry_arguments(p)
    p.add_argument("--files-to", metavar="DIR",
                   help="write the files the bundle carries (schema 3.6, `bundle export --files`) below DIR, after "
                   "every byte was verified: staged in DIR/.sneakernet-staging-*, each renamed into place; a file "
                   "already there with the same bytes is kept, one with other bytes refused (--force replaces it); "
                   "an interrupted run resumes. The images go to the engine as usual (a bundle of files alone needs "
                   "none; docs/files.md)")
    p.add_argument("--files-only", action="store_true",
                   help="with --files-to: write the files only, leave the images (no engine needed)")
    p.add_argument("--deep", action="store_true",
                   help="after loading, export every image back out of the engine and hash every layer again "
                   "(proves the stored bytes, not just the metadata)")
    p.add_argument("--inventory", action="store_true",
                   help="print what the engine holds (JSON with a checksum; input of `bundle export --have`) "
                   "and stop; needs no bundle. With --files-to DIR: the files DIR holds, by digest (every regular "
                   "file below it, no link followed; with BUNDLE only the paths its files take), for a file delta "
                   "(docs/files.md)")
    p.add_argument("--receipt", metavar="PATH",
                   help="where to write the import receipt (default: $XDG_STATE_HOME/sneakernet/receipts/"
                   "<bundle>-<time>.import-receipt.json, ~/.local/state/... without XDG_STATE_HOME; its folder "
                   "is checked before anything is imported)")
    p.add_argument("--no-receipt", action="store_true", help="do not write a receipt file")
    p.add_argument("--force", action="store_true",
                   help="move the bundle's tags when the engine has them on other images (nothing else)")
    p.add_argument("--platform", metavar="OS/ARCH[/VARIANT]",
                   help="the platform the engine runs (default: this host's): a bundle whose images are for "
                   "another one is refused before any change (error platform-mismatch); e.g. linux/arm64 "
                   "for a Docker that runs arm64 images emulated")
    p.add_argument("--trust", action="append", default=[], metavar="PUBKEY",
                   help="accept bundles signed by this Ed25519 public key (a .pub file from `bundle keygen`, "
                   "or a folder of *.pub files); repeatable; implies --require-signature")
    p.add_argument("--require-fit", action="store_true",
                   help="refuse (error gpu-unfit, nothing loaded) an image that will not run on this host's "
                   "driver and GPUs; a warning otherwise (docs/gpu-fit.md)")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse a bundle that is not signed by a trusted key")
    p.add_argument("--require-signed", action="append", default=[], metavar="KEY.pub",
                   help="refuse, before any change, an image without a valid cosign signature (carried in the "
                   "bundle, schema 3.5) by this public key (ECDSA P-256 or Ed25519 PEM, e.g. cosign.pub); "
                   "repeatable: any one of the keys; the receipt records which key signed which image")
    p.add_argument("--wait-lock", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for another import into the same engine to end "
                   "(default: fail at once)")
    p.add_argument("--smoke", action="store_true",
                   help="after a successful import, qualify this host with the bundle's images (the smoke "
                   "suite of `bundle-import smoke`; docs/qualification.md)")
    add_smoke_arguments(p, standalone=False)
    p.add_argument("--json", action="store_true", help="print a JSON result on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version",
                   version=f"bundle-import {__version__} (bundle schema up to {SCHEMA_MAJOR}.x)")
    return with_examples(
        p, "python3 /media/usb/train.bundle/bundle-import.pyz /media/usb/train.bundle --verify",
        "bundle-import train.bundle --verify-only",
        "bundle-import train.bundle --engine containerd --namespace k8s.io --receipt receipts/$(hostname)/import.json",
        "bundle-import --inventory --engine podman > have.json")


def _progress(quiet: bool) -> Optional[Callable[[str, int], Callable[[int], None]]]:
    """Progress lines on stderr (a plain line every few seconds without a terminal); --quiet: none."""
    return stderr_progress(quiet)


def _receipt_target(args: argparse.Namespace, plan: ImportPlan) -> Optional[str]:
    """Where this run's receipt goes, checked before anything is done (importer/receipts/receipt.py)."""
    if args.no_receipt:
        return None
    if args.receipt:
        return check_receipt_path(args.receipt)
    suffix = "check-receipt.json" if plan.receipt_kind == CHECK_ONLY_RECEIPT else "import-receipt.json"
    return default_receipt_path(plan.bundle, suffix, on_notice=_say)


def _report_lines(report: VerifyReport) -> str:
    return (f"verified {report.files_checked} files, {report.layers_checked} layers "
            f"({report.bytes_checked} bytes) in {report.seconds:.1f}s: "
            + ("OK" if report.ok else f"{len(report.problems)} problem(s)"))


def cmd_verify_only(args: argparse.Namespace, plan: ImportPlan) -> int:
    """``--verify-only``: the plan's walk with no engine and no receipt; the report printed."""
    report = run_import(plan, None, result_for(plan), progress=_progress(plan.quiet), on_notice=_say).report
    if args.json:
        emit(success({"verification": report.to_dict()}))
    else:
        print(_report_lines(report))
    return EXIT_OK


def make_sink(args: argparse.Namespace) -> Sink:
    """The engine named by --engine, implied by its options, or detected (docs/engines.md)."""
    if wants_registry(args):
        args.selected_by = "--engine registry" if args.engine else "--registry given"
        return registry_sink(args)
    sink, why = choose_sink(EngineOptions.from_args(args))
    args.selected_by = why
    if not args.engine:
        _say(f"engine: {sink.kind} (chosen because {why})")
    return sink


def cmd_inventory(args: argparse.Namespace) -> int:
    """Print what the engine holds (always JSON; --json is accepted)."""
    from importer.inventory.engine import take_inventory, with_ok

    if args.files_to:  # the files a folder holds (1.5): a file delta's base (docs/files.md)
        from importer.inventory.folder import take_folder_inventory

        emit(with_ok(take_folder_inventory(args.files_to, _bundle_titles(args.bundle) if args.bundle else None)))
        return EXIT_OK
    sink = make_sink(args)
    try:
        doc = take_inventory(sink, selected_by=args.selected_by)
    finally:
        sink.close()
    emit(with_ok(doc))  # --json or not: the inventory is JSON
    return EXIT_OK


def _bundle_titles(path: str) -> List[str]:
    """``BUNDLE --inventory --files-to DIR``: the titles of the files BUNDLE carries (only those are read)."""
    from importer.input.opened import open_bundle

    bundle = open_bundle(path)
    if bundle.schema_major() != SCHEMA_MAJOR:
        raise UsageError(f"taking the inventory of --files-to with {path}: expected a schema 3.6 bundle of files, "
                         f"found schema {bundle.schema_major()}", hint="drop BUNDLE to list every file of the folder")
    return sorted({f.title for a in bundle.manifest().file_artifacts for f in a.files})


def _refuse_smoke_engine(args: argparse.Namespace, kind: str) -> None:
    """``--smoke`` runs the images in the engine's containers: an OCI layout or a registry runs none."""
    if args.smoke and not args.no_container and kind not in ("docker", "containerd", "podman"):
        raise SmokeConfigError(
            f"importing with --smoke into {kind}: expected an engine that runs containers (docker, containerd, "
            f"podman), found --engine {kind}",
            hint="import into Docker, containerd or podman, or add --no-container to qualify this Python instead; "
            "nothing was imported")


def cmd_import(args: argparse.Namespace) -> int:
    """Parse -> plan (importer/pipeline/plan.py) -> run_import (importer/pipeline/walk.py) -> receipt and output."""
    plan = plan_from_args(args)
    if not plan.needs_engine and plan.receipt_kind is None:
        return cmd_verify_only(args, plan)
    if args.engine:
        _refuse_smoke_engine(args, args.engine)
    receipt_path = _receipt_target(args, plan)  # before anything changes: never a failure after the work
    if args.smoke:
        args.smoke_receipt_base = smoke_receipt_base(args)
    def engine() -> Sink:
        made = make_sink(args)
        _refuse_smoke_engine(args, made.kind)
        return made

    sink = None if plan.files_to else engine()  # --files-to: a bundle of files alone needs no engine
    result = result_for(plan)
    error: Optional[BundleError] = None
    try:
        run_import(plan, sink, result, progress=_progress(plan.quiet), on_notice=_say, make_sink=engine)
    except BundleError as e:
        error = e
    except OSError as e:  # typed here too, so that the receipt records it
        if args.debug:
            raise
        error = os_error(e, plan.bundle)
    except KeyboardInterrupt as e:
        error = stop_error(e, "importing")
        error.message += ("; NOT everything this run loaded could be removed (listed below)" if result.leftovers
                          else "; what this run loaded was removed, nothing was tagged that was not verified")
        error.hint = ("run the same command again: it verifies everything again and removes staging tags "
                      "an interrupted run left (sneakernet-staging/*)")
    receipt = _receipt(args, plan, result, error)
    if isinstance(error, UsageError) and not isinstance(error, FileAccessError):  # bad arguments, nothing done
        receipt_path = None
    if receipt_path is not None:
        try:
            write_receipt(receipt_path, receipt)
        except OSError as e:  # checked up front; the disk filled since: say so, keep the import's outcome
            _say(f"warning: the receipt could not be written to {receipt_path}: {os_error_text(e)}; "
                 "it is printed with --json")
            receipt_path = None
    if args.json and not (args.smoke and error is None):  # with --smoke: one JSON document, below
        emit(receipt)  # its "ok" and "error": the one JSON document of a failed import too
        args.json_done = True
    elif result.checks and not args.json:
        print(printable_block(render_table(result.checks)))
    if result.files and not args.json:
        print(printable_block(_files_lines(result.files)))
    if receipt_path and not args.json:
        _say(f"receipt: {receipt_path}")
    if result.leftovers:
        host = f" -H {result.engine.address}" if result.engine else ""
        left = " ".join(result.leftovers)
        remove = {"containerd": "ctr images rm", "podman": "podman rmi", "oci": "(edit index.json of)"}.get(
            result.engine.kind if result.engine else "docker", f"docker{host} image rm")
        _say(f"left in the engine by this run: {left}")
        _say(f"  remove with: {remove} {left}")
    if error is not None:
        raise error
    if args.smoke:
        return smoke_after_import(args, result, receipt)
    return EXIT_OK


def _receipt(args: argparse.Namespace, plan: ImportPlan, res: ImportResult,
             error: Optional[BundleError]) -> Dict[str, Any]:
    """The receipt of the run of ``plan`` (its kind the plan's ``receipt_kind``), also of a failed one
    (importer/receipts/run.py)."""
    return run_receipt(os.path.abspath(plan.bundle), res, error, selected_by=getattr(args, "selected_by", None),
                       sections=receipt_sections(res) if plan.receipt_kind == CHECK_ONLY_RECEIPT else None)


def _files_lines(section: Dict[str, Any]) -> str:
    """``--files-to``: what happened to each file (written, resumed, unchanged, replaced), one line each."""
    lines = [f"{f['action']:9} {f['path']}  {f['digest'][:19]}  {f['size']} bytes  {f['mode']}"
             for f in section.get("files", [])]
    return "\n".join([*lines, f"files: {len(lines)} below {section['target']}"])


def _say(line: str) -> None:
    """One line on stderr, escaped: it may quote bundle fields and file names (importer/format/text.py)."""
    print(printable(line), file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["smoke"]:  # `bundle-import smoke [IMAGE]` (a bundle folder named smoke: ./smoke)
        return smoke_main(argv[1:])
    if argv[:1] == ["copy"]:  # `bundle-import copy SRC DST` (a bundle folder named copy: ./copy)
        from importer.cli.copy import main as copy_main

        return copy_main(argv[1:])
    if argv[:1] == ["serve"]:  # `bundle-import serve BUNDLE` (a bundle folder named serve: ./serve)
        from importer.cli.serve import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] in (["fleet-report"], ["sign-receipt"]):  # importer/cli/fleet.py (docs/fleet.md)
        from importer.cli import fleet

        return fleet.main(argv[1:]) if argv[0] == "fleet-report" else fleet.sign_main(argv[1:])
    parser = build_parser()
    args = argparse.Namespace(json="--json" in argv or "--inventory" in argv, debug="--debug" in argv, json_done=False)

    def body() -> int:
        parser.parse_args(argv, namespace=args)
        args.json = args.json or args.inventory  # --inventory is always JSON, a failure too (docs/errors.md)
        if not args.inventory and not args.bundle:
            parser.error("the following arguments are required: BUNDLE (only --inventory works without one)")
        if args.smoke and (args.verify_only or args.inventory or args.check_only):
            parser.error("--smoke runs after an import: not with --verify-only, --inventory or --check-only "
                         "(after --check-only: bundle-import smoke IMAGE)")
        if args.check_only and (args.verify_only or args.inventory or args.force):
            parser.error("--check-only changes nothing: not with --verify-only, --inventory or --force")
        if args.files_to and (args.verify_only or args.check_only):
            parser.error("--files-to writes files: not with --verify-only or --check-only")
        if args.name_prefix and not args.check_only:
            parser.error("--name-prefix goes with --check-only")
        handler: Callable[[argparse.Namespace], int] = cmd_inventory if args.inventory else cmd_import
        if args.bundle and (not args.inventory or args.files_to):
            locate(args.bundle)  # a BUNDLE that names nothing (a typo): a usage error before anything else
        with stop_on_signals():
            return handler(args)

    return guarded(args, body, what="bundle-import", path=lambda: args.bundle)


if __name__ == "__main__":
    sys.exit(main())
