"""``bundle-import serve BUNDLE [--listen ADDR:PORT]``: verify the bundle, then serve it read-only
as an OCI distribution API (importer/serve/serve.py) until SIGINT/SIGTERM; docs/transfer.md."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Sequence

from importer.cli.output import ArgumentParser, guarded, with_examples
from importer.cli.servesecure import add_options, print_node_config, security, start_info, start_lines
from importer.errors import PolicyRejected, UsageError
from importer.format.manifest import LayerRecord
from importer.format.text import printable
from importer.input.archive import locate
from importer.input.opened import OpenedBundle, open_bundle
from importer.registry.transcode import (
    ZSTD_READERS,
    new_workdir,
    remove_workdir,
    signatures_lost,
    signed_and_rewritten,
    transcode,
    zstd_warning,
)
from importer.serve.serve import DEFAULT_LISTEN, BundleRegistry, Catalog, damaged_error, serve_forever, stderr_log
from importer.serve.servelimits import (
    CLIENT_SHARE,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    checked_limits,
    default_per_client,
)
from importer.serve.servetls import GuardedRegistry
from importer.streams.progress import stderr_progress
from importer.streams.signals import stop_error, stop_on_signals
from importer.verify.cosign import images_signed
from importer.verify.opened import verify_or_raise
from importer.verify.signature import TrustPolicy, check_signature, load_trusted_keys


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="bundle-import serve",
        description="Verify a bundle, then serve it read-only as an OCI registry (plain HTTP, or HTTPS with "
        "--tls-self-signed/--tls-cert; Basic auth with --htpasswd) "
        "until SIGINT/SIGTERM: docker/podman/skopeo/ctr pull from it. Every blob is hashed again as it is "
        "sent; a blob that no longer matches is cut before its last byte.")
    p.add_argument("bundle", metavar="BUNDLE",
                   help="the bundle folder, FILE.tar or FILE.tar.parts.json (read in place)")
    p.add_argument("--listen", metavar="ADDR:PORT", default=DEFAULT_LISTEN,
                   help=f"where to listen (default: {DEFAULT_LISTEN}; port 0: a free one, printed at start)")
    p.add_argument("--shallow", action="store_true",
                   help="a bundle folder: verify every file's digest but do not re-derive layer diff_ids")
    p.add_argument("--trust", action="append", default=[], metavar="PUBKEY",
                   help="serve only a bundle signed by this Ed25519 public key (repeatable; docs/security.md)")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse a bundle that is not signed by a trusted key")
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT, metavar="SECONDS",
                   help="close a connection that sends no complete request head for this long after connecting, "
                   f"and between requests (default: {DEFAULT_IDLE_TIMEOUT:g})")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help=f"serve at most N connections at once; more get 503 (default: {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--max-connections-per-client", type=int, default=None, metavar="N",
                   help="of them, at most N from one client address (an IPv6 client: its /64); its next ones get 503 "
                   f"while others are served (default: 1/{CLIENT_SHARE} of --max-connections, rounded up: "
                   f"{default_per_client(DEFAULT_MAX_CONNECTIONS)} of {DEFAULT_MAX_CONNECTIONS}; raise it for "
                   "nodes behind one NAT address)")
    add_options(p)
    p.add_argument("--compression", choices=("keep", "gzip"), default="keep",
                   help="keep: serve the layers as the bundle holds them (default; zstd in a default bundle, read "
                   f"by {ZSTD_READERS}); gzip: recompress zstd layers once at start into a private temp folder "
                   "(each layer's diff_id checked; removed at exit) and serve those, for Docker before 23.0 "
                   "(same image IDs, new manifest digests)")
    p.add_argument("--require-signed", action="append", default=[], metavar="KEY.pub",
                   help="serve only if every image carries a cosign signature by one of these public keys (as "
                   "bundle-import --require-signed checks it; repeatable), checked before anything is served")
    p.add_argument("--allow-recompressed-signed", action="store_true",
                   help="with --require-signed: let --compression gzip rewrite signed images (their signatures "
                   "then name digests serve does not answer for, so `cosign verify` refuses the served images)")
    p.add_argument("--json", action="store_true", help="print one JSON line on stdout once serving (the address)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines and no access log")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return with_examples(p, "python3 /data/bundle-import.pyz serve /data/train.bundle --listen 0.0.0.0:5000",
                         "bundle-import serve train.tar.parts.json --trust publisher.pub")


def _say(line: str) -> None:
    """One line on stderr, escaped (it quotes bundle fields)."""
    stderr_log(printable(line))


def _out(line: str) -> None:
    sys.stdout.write(printable(line) + "\n")
    sys.stdout.flush()


def _recompressed(bundle: OpenedBundle, args: argparse.Namespace, workdir: str) -> Catalog:
    """The catalog of the bundle's images with their layers recompressed (--compression)."""
    manifest = bundle.manifest()

    def note(layer: LayerRecord) -> None:
        if not args.quiet:
            _say(f"serve: recompressing layer {layer.digest.short} ({layer.size} bytes) to {args.compression}")

    done = transcode(bundle, manifest, args.compression, workdir, note)
    args.renamed = done.renamed
    if not args.quiet:
        _say(f"serve: {done.layers} layer(s) recompressed to {args.compression}; "
             f"{len(done.renamed)} manifest(s) rewritten (image IDs unchanged)")
    return Catalog(done.manifest(manifest), _say, local=done.files)


def _signatures(bundle: OpenedBundle, args: argparse.Namespace) -> Optional[List[Dict[str, Any]]]:
    """``--require-signed``: the images' cosign signatures, checked before anything is verified or
    served; what ``--compression`` does to signed images, said (refused under --require-signed
    unless ``--allow-recompressed-signed``) before anything is recompressed."""
    signed = None
    if args.require_signed:
        signed = images_signed(bundle, args.require_signed, None, quiet=args.quiet, on_notice=_say,
                               doing="serving with --require-signed")
    lost = signed_and_rewritten(bundle.manifest(), args.compression)
    if lost and args.require_signed and not args.allow_recompressed_signed:
        raise PolicyRejected(signatures_lost("serving with --require-signed", args.compression, lost),
                             hint="serve with --compression keep (Docker 23.0 and newer, containerd and podman read "
                             "zstd), or pass --allow-recompressed-signed")
    if lost and not args.quiet:
        _say("serve: note: " + signatures_lost("serve", args.compression, lost))
    return signed


def cmd_serve(args: argparse.Namespace) -> int:
    bundle = open_bundle(args.bundle)
    sec = security(args)  # certificate and users: a bad file fails before anything is checked or listens
    sig = check_signature(bundle, TrustPolicy(load_trusted_keys(args.trust), bool(args.require_signature)))
    if not args.quiet:
        _say(sig.line())
    if bundle.schema_major() in (1, 2):
        raise UsageError(f"serving {bundle.path}: expected a schema 3 bundle (OCI blobs), found schema "
                         f"{bundle.schema_major()}", hint="re-export it with this version of `bundle export`")
    limits = checked_limits(args.idle_timeout, args.max_connections, args.max_connections_per_client)
    signed = _signatures(bundle, args)
    if args.print_node_config:
        return print_node_config(bundle, args, sec)
    args.renamed = {}
    server = GuardedRegistry(bundle, Catalog(bundle.manifest(), _say), args.listen,
                             log=None if args.quiet else stderr_log, limits=limits, tls=sec.tls,
                             htpasswd=sec.htpasswd)  # bound now: a taken port fails before verifying
    workdir = ""
    try:
        workdir = new_workdir("sneakernet-serve-") if args.compression != "keep" else ""
        report = verify_or_raise(bundle, progress=stderr_progress(args.quiet), deep=not args.shallow)
        report.signature = sig.to_dict()
        catalog = _recompressed(bundle, args, workdir) if args.compression != "keep" else server.catalog
        server.catalog = catalog
        if catalog.has_zstd() and not args.quiet:
            _say(zstd_warning("serve") + " (a Docker before 23.0 asking is answered with an error saying so)")
        for blob in catalog.missing_layers():
            _say(f"serve: layer {blob.digest} is left out of this delta bundle: pulls that need it fail "
                 "(404 BLOB_UNKNOWN)")
        url = f"{server.scheme}://{server.address}"
        listing = catalog.listing()
        info = start_info(sec, server.address, args.listen, listing[0] if listing else None)
        if args.json:
            doc = {"ok": True, "listening": server.address, "url": url, "bundle": bundle.path, "kind": bundle.kind,
                   "compression": args.compression, "renamedManifests": dict(args.renamed),
                   "bundleDigest": str(bundle.digest), "verification": report.to_dict(), "imageSignatures": signed,
                   "repositories": listing, **info}
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()
            args.json_done = True  # one JSON document: a later error goes to stderr only
        else:
            _out(f"serving {bundle.path} at {url} (verified {report.files_checked} files); "
                 "stop with Ctrl-C or SIGTERM")
            for repo in listing:
                _out(f"  {server.address}/{repo['name']}: {', '.join(repo['tags']) or '(by digest)'}")
            for line in start_lines(info):
                _out(line)
    except BaseException:
        server.server_close()
        remove_workdir(workdir)
        raise
    try:
        serve_forever(server)
    except KeyboardInterrupt as e:  # SIGINT/SIGTERM: the normal way to stop serving
        cut = settle(server)
        _say(f"{stop_error(e, 'serve').message}; {server.stats.requests} request(s), "
             f"{server.stats.bytes_sent} bytes sent, {server.stats.bytes_hashed} bytes hashed"
             + (f"; {cut} request(s) still being answered were cut" if cut else ""))
    finally:
        remove_workdir(workdir)
    error = damaged_error(server, bundle.path)
    if error is not None:
        raise error
    return 0


STOP_GRACE = 2.0  # seconds a stop waits for the requests in flight to be answered and logged


def settle(server: BundleRegistry) -> int:
    """At a stop: the requests answered as it came get their access lines and counts before the
    totals are printed (a connection's thread writes its line after the response's last byte: the
    client can stop the server before that); one still sending after ``STOP_GRACE`` is cut. A second
    stop signal waits no longer. Returns the requests cut."""
    try:
        return server.stats.settle(STOP_GRACE)
    except KeyboardInterrupt:
        return server.stats.in_flight


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = argparse.Namespace(json="--json" in argv, debug="--debug" in argv, bundle=None, json_done=False)

    def body() -> int:
        build_parser().parse_args(argv, namespace=args)
        locate(args.bundle)  # a BUNDLE that names nothing: a usage error before anything else
        with stop_on_signals():
            return cmd_serve(args)

    # a stop here came while verifying: nothing was served (cmd_serve handles a stop while serving)
    return guarded(args, body, what="bundle-import serve", path=lambda: args.bundle,
                   interrupted=lambda e: stop_error(e, "bundle-import serve (verifying, nothing served yet)"))
