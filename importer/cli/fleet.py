"""``bundle-import fleet-report RECEIPT...`` (importer/receipts/fleet.py) and
``bundle-import sign-receipt RECEIPT... --sign-key KEY`` (importer/verify/receiptsig.py): the
receipts of a cluster's nodes joined into one table and verdict, and signing them on a node that
has python3 and openssl only (``bundle sign-receipt`` does the same with the exporter). docs/fleet.md."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, List, Optional, Sequence

from importer.cli.output import ArgumentParser, emit, guarded, success, with_examples
from importer.errors import UsageError
from importer.format.text import printable_block
from importer.receipts.fleet import (
    REQUIREMENTS,
    build_report,
    expand_hostlist,
    expected_bundle,
    expected_digest,
    load_receipts,
    read_host_file,
    receipt_files,
    render_table,
)
from importer.streams.signals import stop_on_signals
from importer.verify.receiptsig import openssl_signer, sign_receipt_file
from importer.verify.signature import load_trusted_keys

#: the fleet did not pass (a host failed, is missing or stale): a code of its own, so exit 1 means only "a bug"
EXIT_NOT_PASSED = 12
MAX_PASSPHRASE = 4096


def _out(text: str) -> None:
    sys.stdout.write(printable_block(text) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="bundle-import fleet-report",
        description="Join the import, check-only and qualification receipts of many hosts into one table (host, "
        "engine, image digest, verify, device and where the smoke ran, each gate, NCCL bus bandwidth, verdict; one "
        "row per host and engine) and one verdict. docs/fleet.md says exactly what PASS means.",
        epilog=f"exit codes: 0 every host passed; {EXIT_NOT_PASSED} a host failed, is missing or stale (no "
        "receipt naming the bundle named, or older than it), disagrees on a digest, has a bad or (with --trust) "
        "missing signature, or a file is not a receipt; 2 usage (a path that names nothing, a bad key, host list "
        "or digest); 4 --bundle's bundle.json cannot be read",
    )
    p.add_argument("receipts", metavar="RECEIPT", nargs="+",
                   help="receipt files, or folders searched for *.json files (RECEIPT.sig beside each: its signature)")
    p.add_argument("--hosts", metavar="LIST",
                   help="the hosts that must have reported, comma-separated; Slurm ranges work (node[01-16])")
    p.add_argument("--expect-hosts", metavar="FILE",
                   help="the hosts that must have reported, one per line (e.g. `scontrol show hostnames`, "
                   "`kubectl get nodes -o name`)")
    p.add_argument("--require", metavar="LIST", default="image",
                   help="what every host needs: image (an import or check-only receipt that passed; the default), "
                   "smoke (a qualification that passed on the host's GPUs in the bundle's image), or image,smoke")
    p.add_argument("--bundle", action="append", default=[], metavar="BUNDLE",
                   help="the bundle the fleet must hold (folder, tar or parts index; only bundle.json is read): every "
                   "host needs receipts naming its digest, written at or after its created time; repeatable")
    p.add_argument("--expect-digest", action="append", default=[], metavar="sha256:HEX",
                   help="as --bundle, by the bundle.json digest alone (receipts must name it; no time is judged); "
                   "repeatable")
    p.add_argument("--allow-cpu", action="store_true",
                   help="--require smoke: accept a qualification run on the CPU (--device cpu); noted per host")
    p.add_argument("--allow-host-python", action="store_true",
                   help="--require smoke: accept a qualification run in the host's Python (--no-container) instead "
                   "of the bundle's image; noted per host")
    p.add_argument("--trust", action="append", default=[], metavar="PUBKEY",
                   help="require every counted receipt to be signed by this Ed25519 public key (a .pub file of "
                   "`bundle keygen`, or a folder of them); repeatable")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return with_examples(p, "bundle-import fleet-report receipts/*/check.json",
                         "bundle-import fleet-report receipts/ --bundle /data/train.bundle --require image,smoke",
                         "bundle-import fleet-report receipts/ --trust site.pub --json")


def cmd_report(args: argparse.Namespace) -> int:
    require = [x.strip() for x in args.require.split(",") if x.strip()]
    bad = [x for x in require if x not in REQUIREMENTS]
    if bad or not require:
        raise UsageError(f"reading --require: expected a list of {', '.join(REQUIREMENTS)}, found {args.require!r}")
    expected: Optional[List[str]] = None
    if args.hosts is not None or args.expect_hosts:
        expected = (expand_hostlist(args.hosts) if args.hosts else []) + (
            read_host_file(args.expect_hosts) if args.expect_hosts else [])
        expected = list(dict.fromkeys(expected))
    named = {b.digest: b for b in [expected_digest(d) for d in args.expect_digest]}
    named.update({b.digest: b for b in [expected_bundle(path) for path in args.bundle]})  # --bundle's has a time
    bundles = list(named.values())
    keys = load_trusted_keys(args.trust)
    receipts, problems = load_receipts(receipt_files(args.receipts), keys)
    report = build_report(receipts, problems, expected=expected, require=require, keys=keys,
                          allow_cpu=args.allow_cpu, allow_host_python=args.allow_host_python, bundles=bundles)
    if args.json:
        emit(report)
    else:
        _out(render_table(report))
    return 0 if report["ok"] else EXIT_NOT_PASSED


def _run(prog: str, parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int],
         argv: Sequence[str]) -> int:
    args = argparse.Namespace(json="--json" in argv, debug="--debug" in argv)

    def body() -> int:
        parser.parse_args(list(argv), namespace=args)
        with stop_on_signals():
            return handler(args)

    return guarded(args, body, what=prog)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``bundle-import fleet-report RECEIPT...``"""
    return _run("bundle-import fleet-report", build_parser(), cmd_report,
                list(argv if argv is not None else sys.argv[1:]))


# ============================================================================ sign-receipt


def add_sign_receipt_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("receipts", metavar="RECEIPT", nargs="+", help="receipt files to sign (writes RECEIPT.sig)")
    p.add_argument("--sign-key", required=True, metavar="KEY", help="the PREFIX.key written by `bundle keygen`")
    p.add_argument("--passphrase-stdin", action="store_true", help="read the key's passphrase from stdin")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def sign_receipts(paths: Sequence[str], sign: Any, raw_public: bytes, *, as_json: bool) -> int:
    """Sign every receipt of ``paths``; print what was written."""
    from importer.verify.signature import fingerprint

    written = [sign_receipt_file(path, sign, raw_public) for path in paths]
    if as_json:
        emit(success({"signatures": written, "keyFingerprint": fingerprint(raw_public)}))
    else:
        for path in written:
            _out(f"wrote {path} (key {fingerprint(raw_public)})")
    return 0


def _passphrase_stdin() -> bytes:
    line = sys.stdin.buffer.readline(MAX_PASSPHRASE + 2).rstrip(b"\r\n")
    if not line:
        raise UsageError("reading the passphrase from stdin: expected one non-empty line, found none")
    return line


def cmd_sign_receipt(args: argparse.Namespace) -> int:
    passphrase = _passphrase_stdin() if args.passphrase_stdin else None
    sign, raw_public = openssl_signer(args.sign_key, passphrase)
    return sign_receipts(args.receipts, sign, raw_public, as_json=args.json)


def sign_main(argv: Optional[Sequence[str]] = None) -> int:
    """``bundle-import sign-receipt RECEIPT... --sign-key KEY`` (with the openssl command)."""
    p = ArgumentParser(prog="bundle-import sign-receipt",
                       description="Sign receipts (RECEIPT.sig beside each) with a `bundle keygen` key, using the "
                       "openssl command (OpenSSL 3), for `bundle-import fleet-report --trust PUBKEY`. docs/fleet.md.")
    add_sign_receipt_arguments(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    with_examples(p, "bundle-import sign-receipt receipts/node-1/check.json --sign-key site.key",
                  "bundle-import sign-receipt r.json --sign-key site.key --passphrase-stdin < pass.txt")
    return _run("bundle-import sign-receipt", p, cmd_sign_receipt, list(argv if argv is not None else sys.argv[1:]))
