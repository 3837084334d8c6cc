"""``bundle keygen`` and ``bundle sign``, and reading a passphrase (docs/security.md)."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any, Optional

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundle.keys import generate_keypair, key_is_encrypted, load_signing_key, sign_bundle
from importer.cli.fleet import add_sign_receipt_arguments, sign_receipts
from importer.cli.output import emit, success
from importer.input.opened import open_bundle
from importer.verify.keyfiles import InvalidKey
from importer.verify.opened import verify_or_raise

MAX_PASSPHRASE = 4096


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def read_passphrase_stdin() -> bytes:
    """The first line of stdin, without its line end."""
    line = sys.stdin.buffer.readline(MAX_PASSPHRASE + 2)
    if line.endswith(b"\n"):
        line = line[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    if not line:
        raise InvalidKey("reading the passphrase from stdin: expected one non-empty line, found none",
                         hint="e.g. `printf '%s\\n' \"$PASS\" | bundle ... --passphrase-stdin`")
    return line


def signing_key_from_args(args: argparse.Namespace) -> Optional[Ed25519PrivateKey]:
    """Load ``--sign-key`` (asking for its passphrase on stdin or, on a terminal, by prompt)."""
    path: Optional[str] = getattr(args, "sign_key", None)
    if not path:
        if getattr(args, "passphrase_stdin", False):
            raise InvalidKey("reading the signing key: --passphrase-stdin given without --sign-key KEY")
        return None
    passphrase: Optional[bytes] = None
    if args.passphrase_stdin:
        passphrase = read_passphrase_stdin()
    elif key_is_encrypted(path) and sys.stdin.isatty():
        passphrase = getpass.getpass(f"passphrase for {path}: ").encode("utf-8")
    return load_signing_key(path, passphrase)


def add_key_commands(sub: Any) -> None:
    k = sub.add_parser("keygen", help="make an Ed25519 signing key pair (PREFIX.key, PREFIX.pub)")
    k.add_argument("-o", "--output", required=True, metavar="PREFIX",
                   help="write PREFIX.key (private, mode 0600) and PREFIX.pub (public); never overwrites")
    k.add_argument("--passphrase-stdin", action="store_true",
                   help="encrypt the private key with the passphrase read from the first line of stdin")
    k.add_argument("--json", action="store_true", help="print the result as JSON")
    k.set_defaults(handler=cmd_keygen)

    s = sub.add_parser("sign", help="verify a bundle folder, then sign its bundle.json")
    s.add_argument("bundle", metavar="BUNDLE")
    s.add_argument("--sign-key", required=True, metavar="KEY", help="the PREFIX.key written by `bundle keygen`")
    s.add_argument("--passphrase-stdin", action="store_true", help="read the key's passphrase from stdin")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(handler=cmd_sign)

    r = sub.add_parser("sign-receipt", help="sign import, check-only or qualification receipts (RECEIPT.sig) for "
                       "`bundle-import fleet-report --trust` (docs/fleet.md)")
    add_sign_receipt_arguments(r)
    r.set_defaults(handler=cmd_sign_receipt)


def cmd_keygen(args: argparse.Namespace) -> int:
    passphrase = read_passphrase_stdin() if args.passphrase_stdin else None
    pair = generate_keypair(args.output, passphrase)
    doc = {"privateKey": pair.private_path, "publicKey": pair.public_path,
           "fingerprint": pair.fingerprint, "encrypted": pair.encrypted}
    if args.json:
        emit(success(doc))
    else:
        _out(f"wrote {pair.private_path} (private, mode 0600, "
             f"{'passphrase-encrypted' if pair.encrypted else 'NOT encrypted'}) and {pair.public_path}")
        _out(f"fingerprint: {pair.fingerprint}")
        _out(f"on the offline host: bundle-import BUNDLE --trust {pair.public_path}")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    key = signing_key_from_args(args)
    assert key is not None
    bundle = open_bundle(args.bundle)
    folder = bundle.require_folder(
        f"signing {args.bundle}: expected a bundle folder, found a tar or parts",
        hint="sign the folder before packing it (bundle sign DIR, then bundle pack DIR FILE.tar)")
    report = verify_or_raise(bundle)  # never sign what does not verify
    # the bytes opened and verified, and the one object they were parsed into: not read or parsed again
    fingerprint = sign_bundle(folder, key, raw_bundle_json=bundle.raw_bundle_json, manifest=bundle.manifest())
    if args.json:
        emit(success({"bundle": args.bundle, "keyFingerprint": fingerprint, "filesChecked": report.files_checked}))
    else:
        _out(f"verified {report.files_checked} files, signed {args.bundle}/bundle.json with key {fingerprint}")
    return 0


def cmd_sign_receipt(args: argparse.Namespace) -> int:
    """``bundle sign-receipt RECEIPT... --sign-key KEY``: the receipt's exact bytes signed with the
    same Ed25519 keys as bundles (importer/verify/receiptsig.py)."""
    key = signing_key_from_args(args)
    assert key is not None
    raw_public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sign_receipts(args.receipts, key.sign, raw_public, as_json=args.json)
