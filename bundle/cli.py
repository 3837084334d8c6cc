"""bundle: export images into a verified bundle, and inspect bundles. Thin over the library."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bundle.archive import PackResult
from bundle.artifactsign import load_artifact_key
from bundle.asimage import files_as_image
from bundle.bootstrap import Bootstrap, add_bootstrap_options, bootstrap_target, write_bootstrap
from bundle.choices import choice_notes
from bundle.embed import far_side_lines, first_run_check
from bundle.export import ExportResult, export_images, user_paths
from bundle.fileartifact import scan_files
from bundle.gpufit import cuda_lines
from bundle.helmchart import add_chart_options, read_charts
from bundle.imagelist import platform_of, read_image_lists
from bundle.keycmds import add_key_commands, signing_key_from_args
from bundle.progressui import progress_factory, stop_progress
from bundle.pullcheck import add_check_command, add_manifest_images, add_manifest_options, check_examples, print_why
from bundle.tlscert import add_tls_command
from bundle.transfercmds import add_archive_options, add_transfer_commands, export_target, finish_export, pack_lines
from importer import __version__
from importer.cli.output import ArgumentParser, emit, guarded, success, with_examples
from importer.errors import BundleError, Interrupted, UsageError
from importer.format.manifest import BundleManifest
from importer.format.mediatypes import compression_of
from importer.format.text import printable
from importer.registry.access import access_from_args, add_access_arguments
from importer.streams.progress import human_bytes
from importer.verify.inspection import inspect_bundle

#: ``bundle --help`` ends with these (docs/errors.md; 10-12 are bundle-import's smoke and fleet-report)
EXIT_CODES_HELP = """exit codes (docs/errors.md):
  0 ok                      1 unexpected error (a bug)   2 usage or configuration
  3 integrity               4 invalid bundle manifest or unsupported schema
  5 source (the images could not be read)                6 engine or registry
  7 policy (signature, tag)                              8 bundle check: a pull would fail
  9 delta: base layers missing in the registry
  130 interrupted (SIGINT)  143 terminated (SIGTERM/SIGHUP)
importing is bundle-import's (python3 BUNDLE/bundle-import.pyz BUNDLE --verify)"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="bundle", description="Carry container images across an air gap.",
                       epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"bundle {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="export images from Docker, containerd or an OCI layout into a bundle")
    e.add_argument("images", nargs="*", metavar="IMAGE",
                   help="image references: name:tag or ID (Docker; also docker-daemon:REF), containerd:REF "
                   "(blobs copied as stored), oci:DIR[:REF], docker://HOST[:PORT]/REPO:TAG|@DIGEST (a registry)")
    e.add_argument("--images-from", action="append", default=[], metavar="FILE",
                   help="the images listed in FILE too (repeatable): one reference per line (# comments), a "
                   "hauler `kind: Images` manifest or a zarf.yaml (their bare names are read from the registry, "
                   "docker://); docs/engines.md")
    e.add_argument("--images-from-allow-local", action="store_true",
                   help="let a hauler manifest or zarf.yaml name local sources too (oci:, containerd:, "
                   "docker-daemon:, a path); without it such an entry is refused (a plain list, your own, may always)")
    add_manifest_options(e)  # --images-from-manifests, --why (bundle/pullcheck.py)
    e.add_argument("-o", "--output", metavar="DIR", help="the bundle folder to create (optional with --archive)")
    add_archive_options(e)
    e.add_argument("--schema", type=int, default=3, choices=[1, 2, 3],
                   help="bundle schema major: 3 (default) content-addressed OCI layout; 2 one zstd "
                   "docker-archive + importer; 1 a plain docker-archive loadable with `docker load -i`")
    e.add_argument("--compression", choices=["auto", "zstd", "gzip"], default="auto",
                   help="layer compression (schema 3, Docker sources). auto (default): zstd, or gzip when a "
                   "--have inventory says the offline host has no fast zstd decoder (zstandard module, "
                   "zstd command, Python 3.14+) or an engine that reads no zstd (Docker before 23.0, containerd "
                   "before 1.5; zstd is read by Docker >= 23, containerd >= 1.5, podman); the importer decodes "
                   "zstd without them too, but slowly; auto stores a layer uncompressed while it does not compress "
                   "(random weights, archives: no compression work, a bundle hardly larger), judged across the whole "
                   "layer, not its head (one that turns out compressible is compressed whole). auto keeps "
                   "layers a source stores compressed as they are (and the manifest); zstd or gzip given "
                   "explicitly compresses every layer and recompresses those too (the manifest, so the image ID, "
                   "then changes)")
    e.add_argument("--level", type=int, help="compression level (zstd default 3, gzip default 6)")
    e.add_argument("--docker-host", metavar="URL", help="Docker daemon address (default: $DOCKER_HOST)")
    e.add_argument("--docker-read", choices=["auto", "store", "save"], default="auto",
                   help="how Docker's images are read. auto (default): from the engine's own store where this "
                   "export runs as root beside a local engine (the classic store's overlay2 layers, rebuilt as "
                   "`docker save` sends them and checked against their diff_ids, several at a time; the containerd "
                   "store's blobs), else, or for an image whose store does not match, through `docker save`, "
                   "saying so; store: from the store or fail; save: through `docker save` only")
    e.add_argument("--address", metavar="SOCKET",
                   help="containerd socket for containerd: images (default: $CONTAINERD_ADDRESS, else "
                   "/run/containerd/containerd.sock)")
    e.add_argument("--namespace", metavar="NS",
                   help="containerd namespace for containerd: images (default: $CONTAINERD_NAMESPACE, else default)")
    e.add_argument("--tag", action="append", default=[], metavar="REF",
                   help="the name the image carries in the bundle, instead of the source's (once per IMAGE, "
                   "in order; e.g. for an OCI layout whose ref name is a bare tag)")
    add_access_arguments(e, "docker:// sources: ")
    e.add_argument("--platform", action="append", default=[], metavar="OS/ARCH[/VARIANT]",
                   help="which manifest of a multi-platform image (an index) to carry, e.g. linux/arm64 "
                   "(docker://, containerd: and oci: sources; default: this host's platform; arm64 means arm64/v8 as "
                   "containerd says). Repeat it (or a comma list) to carry several platforms of one image. A "
                   "single-platform image is carried as it is")
    e.add_argument("--all-platforms", action="store_true",
                   help="carry every platform of a multi-platform image and its index byte for byte (docker://, "
                   "containerd: and oci: sources; bundle schema 3.2); an engine imports the platform it runs")
    e.add_argument("--force", action="store_true",
                   help="replace this export's output: the bundle folder at -o (one holding bundle.json) and "
                   "the archive and its parts at --archive; anything else there is refused")
    e.add_argument("--have", action="append", default=[], metavar="FILE",
                   help="write a delta bundle without the layers the offline host holds: FILE is its "
                   "`bundle-import --inventory` output or an earlier bundle's bundle.json (repeatable); with "
                   "--files/--file also without the files the far side holds (its `bundle-import --inventory "
                   "--files-to DIR`: a file delta, schema 3.8)")
    e.add_argument("--allow-unfit", action="store_true",
                   help="with --have INVENTORY: carry an image even when it will not run on that host's driver "
                   "and GPUs (docs/gpu-fit.md); it is refused otherwise")
    e.add_argument("--sign-key", metavar="KEY",
                   help="sign bundle.json with this Ed25519 key (`bundle keygen`); writes bundle.json.sig")
    e.add_argument("--passphrase-stdin", action="store_true", help="read the signing key's passphrase from stdin")
    e.add_argument("--no-referrers", action="store_true",
                   help="docker:// and oci: sources: leave out what is attached to the images (cosign "
                   "signatures, attestations, SBOMs, OCI referrers; carried by default, docs/supply-chain.md)")
    e.add_argument("--require-signed", action="append", default=[], metavar="KEY.pub",
                   help="refuse an image without a valid cosign signature by this public key (ECDSA P-256 or "
                   "Ed25519 PEM, e.g. cosign.pub); repeatable: any one of the keys")
    e.add_argument("--sign-artifacts-key", action="append", default=[], metavar="KEY",
                   help="sign each file artifact (--files, --file, --chart) as `cosign sign --key` would: an "
                   "unencrypted PEM ECDSA P-256 or Ed25519 private key; bundle-import --require-signed KEY.pub and "
                   "cosign verify accept the files then (schema 3.7, docs/files.md); repeatable")
    e.add_argument("--files", action="append", default=[], metavar="DIR",
                   help="carry every regular file below DIR (paths relative to DIR kept, modes recorded) as one OCI "
                   "artifact, one raw layer per file, beside the images or alone (schema 3.6, docs/files.md); "
                   "repeatable; a link, device or FIFO in DIR is refused")
    e.add_argument("--file", action="append", default=[], metavar="PATH[=NAME]",
                   help="carry this file too (as NAME, a path, default its base name); repeatable")
    e.add_argument("--artifact-ref", metavar="NAME:TAG",
                   help="the name the files carry in the bundle, like an image's (required with --files/--file)")
    e.add_argument("--model", action="store_true",
                   help="pack the files as a CNCF ModelPack model (weights, config, docs layer types; the model "
                   "config) instead of plain files")
    e.add_argument("--as-image", action="store_true",
                   help="with --files/--file and --artifact-ref: package the files as a runnable-format image "
                   "instead (FROM scratch, one tar layer per file, weights uncompressed, each at its path below "
                   "the image's root) for containerd/CRI-O ImageVolume and docker load; an ordinary image of the "
                   "bundle from there on (docs/files.md)")
    add_chart_options(e)  # --chart, --chart-repository (bundle/helmchart.py)
    add_bootstrap_options(e)  # --for k3s|rke2|apptainer, --serve-address (bundle/bootstrap.py)
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    e.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    e.set_defaults(handler=cmd_export)

    i = sub.add_parser("inspect", help="show what a bundle holds (reads bundle.json only)")
    i.add_argument("bundle", metavar="BUNDLE")
    i.add_argument("--json", action="store_true")
    i.set_defaults(handler=cmd_inspect)
    add_key_commands(sub)
    add_tls_command(sub)
    add_transfer_commands(sub)
    add_check_command(sub)
    for name, parser in sub.choices.items():
        with_examples(parser, *EXAMPLES[name])
        if "--debug" not in parser._option_string_actions:  # `bundle export X --debug`, as `bundle --debug export X`
            parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return p


#: ``bundle COMMAND --help`` ends with these (README.md, "Use", has them all)
EXAMPLES = {
    "export": ["bundle export my/train:1 -o /media/usb/train.bundle",
               "bundle export oci:./layout:team/app:1 --archive /media/usb/app.tar --split 3900M",
               "bundle export docker://registry.example:5000/team/app:1 --all-platforms -o app.bundle"],
    "inspect": ["bundle inspect /media/usb/train.bundle", "bundle inspect train.bundle --json"],
    "keygen": ["bundle keygen -o keys/publisher", "bundle keygen -o keys/publisher --passphrase-stdin < pass.txt"],
    "sign": ["bundle sign /media/usb/train.bundle --sign-key keys/publisher.key"],
    "sign-receipt": ["bundle sign-receipt receipts/node-1/check.json --sign-key keys/site.key"],
    "pack": ["bundle pack train.bundle /media/usb/train.tar",
             "bundle pack train.bundle /media/usb/train.tar --split 3900M   # FAT32"],
    "copy": ["bundle copy /media/usb/train.tar.parts.json /data/incoming --bwlimit 50M"],
    "tls-cert": ["bundle tls-cert /etc/sneakernet/serve-tls --name gpu-gw.example --name 10.0.0.5"],
    "push": ["bundle push train.bundle 127.0.0.1:5000/team",
             "bundle push train.bundle 127.0.0.1:5000/team --ssh ops@offline-gw"],
    "check": list(check_examples()),
}



def summary_line(m: BundleManifest) -> str:
    """Images, the layers carried (compressed vs uncompressed: what compression saved), the
    external ones a delta leaves out, and the whole bundle (importer and metadata included)."""
    stored = m.stored_layers()
    packed = sum(x.size for x in stored)
    plain = sum(x.uncompressed_size for x in stored)
    ratio = f" ({packed / plain:.0%})" if plain else ""
    external = len(m.unique_layers()) - len(stored)
    left_out = f" + {external} external (on the host already, not carried)" if external else ""
    return (f"{len(m.images)} image(s), {len(stored)} layer(s){left_out}, layers {human_bytes(packed)} "
            f"of {human_bytes(plain)}{ratio}, bundle {human_bytes(m.compressed_bytes())}")


def file_artifact_summary(m: BundleManifest) -> List[Dict[str, Any]]:
    """``--json``'s ``fileArtifacts``: the files carried as OCI artifacts (schema 3.6)."""
    return [{"ref": a.ref, "artifactType": a.artifact_type, "manifestDigest": str(a.manifest.digest),
             "files": len(a.files), "bytes": a.size} for a in m.file_artifacts]


def file_artifact_lines(m: BundleManifest) -> str:
    """One line per artifact of files printed; the import line's ``--files-to DIR`` when there are any."""
    for art in m.file_artifacts:
        held = art.held_files()  # a file delta (3.8): what the far side holds is named, not carried
        left = f"; {len(held)} held on the far side left out ({human_bytes(sum(f.blob.size for f in held))})" \
            if held else ""
        print(f"artifact {art.ref}: {len(art.files)} file(s), {human_bytes(art.size)} ({art.artifact_type}){left}")
    return " --files-to DIR" if m.file_artifacts else ""


def _listed_images(args: argparse.Namespace) -> Tuple[List[str], List[str]]:
    """The IMAGE arguments, then those of every ``--images-from`` list (each once, first order
    kept); the platform the lists name (hauler), agreeing with ``--platform``."""
    listed = read_image_lists(args.images_from, allow_local=args.images_from_allow_local)
    images = list(dict.fromkeys([*args.images, *(i.ref for i in listed)]))
    if not images and not (args.files or args.file or args.chart):
        raise UsageError("exporting: expected at least one IMAGE or --images-from FILE, found none",
                         hint="bundle export IMAGE... -o DIR, or bundle export --images-from images.txt -o DIR")
    return images, list(platform_of(listed, args.platform))


def artifact_keys_from_args(args: argparse.Namespace, has_files: bool) -> List[Any]:
    """``--sign-artifacts-key``: read before the export (a bad key costs nothing); files to sign needed."""
    if args.sign_artifacts_key and not has_files:
        raise UsageError("exporting with --sign-artifacts-key: expected files to sign (--files, --file or --chart), "
                         "found none", hint="images are signed in their registry (cosign sign); drop the option")
    if args.sign_artifacts_key and getattr(args, "as_image", False):
        raise UsageError("exporting with --sign-artifacts-key and --as-image: expected file artifacts to sign, found "
                         "the files packaged as an image", hint="sign the image where it is pushed (cosign sign --key "
                         "cosign.key REG/REPO@DIGEST), or drop --as-image to carry signed files")
    return [load_artifact_key(path) for path in args.sign_artifacts_key]


def cmd_export(args: argparse.Namespace) -> int:
    if args.why:
        return print_why(args)
    add_manifest_images(args)  # what --images-from-manifests pulls (and the --have nodes' driver images) joins IMAGE
    images, platforms = _listed_images(args)
    files = scan_files(args.files, args.file, args.artifact_ref, model=args.model, schema=args.schema, have=args.have)
    charts = read_charts(args.chart, args.chart_repository, schema=args.schema)
    sign_key = signing_key_from_args(args)  # before the export: a wrong passphrase costs nothing
    artifact_keys = artifact_keys_from_args(args, files is not None or bool(charts))
    out_dir, consume = export_target(args)  # -o DIR, or a staging folder consumed by --archive
    boot_dir = bootstrap_target(args, images)  # --for: checked before the export
    images, files, as_image = files_as_image(args, images, files)  # --as-image: the files as an image
    # --as-image: one uncompressed tar layer per file, as ImageVolume mounts and `docker load` reads it
    compression = "none" if as_image is not None and args.compression == "auto" else args.compression
    try:
        result = export_images(images, out_dir, docker_host=args.docker_host, docker_read=args.docker_read,
                               compression=compression, level=args.level, schema=args.schema,
                               force=args.force, progress=progress_factory(args.quiet), have=args.have,
                               sign_key=sign_key, address=args.address, namespace=args.namespace,
                               tags=args.tag, platforms=platforms, access=access_from_args(args),
                               all_platforms=args.all_platforms, referrers=not args.no_referrers,
                               require_signed=args.require_signed, files=files, allow_unfit=args.allow_unfit,
                               charts=charts, artifact_keys=artifact_keys, source=as_image)
    except BundleError as e:  # --archive: the export folder is staging, the user named the archive
        raise (user_paths(e, out_dir, args.archive) if consume else e) from e.__cause__
    finally:
        stop_progress()
    for note in [*result.notes, *choice_notes(args, images, result.manifest)]:  # every silent choice, one line
        print(note, file=sys.stderr)
    if result.recompressed:
        print(f"note: --compression {args.compression} recompressed {result.recompressed} layer(s) the source "
              "keeps in another compression: those images get a manifest of the bundle's own, so on a host "
              "with Docker's containerd store their image ID is not the build host's (--compression auto "
              "carries the layers as stored and keeps it)", file=sys.stderr)
    if result.manifest is None:
        info = inspect_bundle(result.path)
        if args.json:
            emit(success({"bundle": result.path, "schemaVersion": info["schemaVersion"],
                          "images": info["images"], "seconds": round(result.seconds, 3)}))
        else:
            print(f"wrote {result.path}: schema {info['schemaVersion']}, {len(info['images'])} image(s), "
                  f"{human_bytes(info['totals']['bytes'])} in {result.seconds:.1f}s")
        return 0
    m = result.manifest
    boot = _bootstrap(args, result, boot_dir, consume)  # before --archive consumes the folder
    packed = finish_export(args, result.path, consume)
    if packed is not None and consume:  # only the archive remains: the folder was a staging area
        if args.json:
            emit(success({"archive": packed.to_dict(), **({"bootstrap": boot.to_dict()} if boot else {})}))
        else:
            print(pack_lines(packed))
            for line in boot.lines() if boot is not None else ():
                print(line)
        return 0
    summary = _export_summary(result, packed)
    if boot is not None:
        summary["bootstrap"] = boot.to_dict()
    if args.json:
        emit(success(summary))
    else:
        for line in result.gpu_fit.lines() if result.gpu_fit is not None else ():
            print(line)
        print(f"wrote {result.path}: {summary_line(m)} in {result.seconds:.1f}s")
        for signed in result.signed_images or []:
            print(f"image {signed.image}: cosign signature by {signed.key.path} "
                  f"({signed.key.fingerprint[:19]}) verified")
        if result.signed_by:
            print(f"signed bundle.json with key {result.signed_by}")
        trust = " --trust PUBKEY" if result.signed_by else ""
        print(far_side_lines(os.path.join(result.path, "bundle-import.pyz"), result.path,
                             trust + file_artifact_lines(m)))
        if m.importer is not None:
            print(first_run_check(os.path.join(result.path, m.importer.path), m.importer.digest))
        if packed is not None:
            print(pack_lines(packed))
        for line in boot.lines() if boot is not None else ():
            print(line)
    return 0


def _bootstrap(args: argparse.Namespace, result: ExportResult, target: Optional[str],
               consume: bool) -> Optional[Bootstrap]:
    """``--for``: its files beside the bundle (bundle/bootstrap.py)."""
    if target is None or result.manifest is None:
        return None
    name = os.path.basename(args.archive).removesuffix(".tar") if consume else os.path.basename(result.path)
    try:
        return write_bootstrap(result.path, result.manifest, args.bootstrap_for, target,
                               serve_address=args.serve_address, progress=progress_factory(args.quiet), name=name)
    except BaseException:
        if consume:  # the staging folder --archive would have packed: nothing half-done left
            shutil.rmtree(result.path, ignore_errors=True)
        raise
    finally:
        stop_progress()


def _export_summary(result: ExportResult, packed: Optional[PackResult]) -> Dict[str, Any]:
    """What ``bundle export --json`` prints for a written bundle (schemas/cli/export.schema.json)."""
    m = result.manifest
    assert m is not None
    return {
        "bundle": result.path,
        "schemaVersion": m.schema_version,
        "images": [{"refs": list(i.refs), "configDigest": str(i.config.digest),
                    "manifestDigest": str(i.manifest.digest), "layers": len(i.layers),
                    "artifacts": len(i.artifacts),
                    **({"read": result.reads[str(i.config.digest)]} if str(i.config.digest) in result.reads else {})}
                   for i in m.images],
        "fileArtifacts": file_artifact_summary(m),
        "bytes": m.compressed_bytes(),
        "uncompressedBytes": m.uncompressed_bytes(),
        "seconds": round(result.seconds, 3),
        "imageSignatures": [s.to_dict() for s in result.signed_images] if result.signed_images else None,
        "signature": {"keyFingerprint": result.signed_by} if result.signed_by else None,
        "archive": packed.to_dict() if packed is not None else None,
        "importer": ({"path": os.path.join(result.path, m.importer.path), "digest": str(m.importer.digest),
                      "size": m.importer.size} if m.importer is not None else None),
        "gpuFit": result.gpu_fit.to_dict() if result.gpu_fit is not None else None,
    }


def _t(value: object, style: str = "") -> Text:
    """A bundle field or file name for rich: control characters escaped (importer/format/text.py), and
    as a Text, so that rich reads no markup (``[/bold]``) or emoji codes in it."""
    return Text(printable(str(value)), style=style)


def _compression(layers: List[Dict[str, Any]]) -> str:
    """How an image's layers are stored: ``zstd``, ``gzip``, ``none``, or a mix with counts
    (``zstd 3, none 1``); ``-`` where bundle.json does not say (schema 1/2: one docker-archive)."""
    kinds = [compression_of(x["mediaType"]) for x in layers if x.get("mediaType")]
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    if len(counts) <= 1:
        return next(iter(counts), "-")
    return ", ".join(f"{k} {n}" for k, n in counts.items())


def cmd_inspect(args: argparse.Namespace) -> int:
    info = inspect_bundle(args.bundle)
    if args.json:
        emit(success(info))
        return 0
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(Text.assemble(
        _t(info["bundle"], "bold"), f"  schema {printable(str(info['schemaVersion']))}  created ",
        _t(info["created"]), "  by sneakernet ", _t(info["toolVersion"]),
        f"  signed: {'yes' if info['signed'] else 'no'}"))
    table = Table("IMAGE", "PLATFORM", "CONFIG", "LAYERS", "COMPRESSION", "COMPRESSED", "UNCOMPRESSED",
                  "SHARED LAYERS")
    for image in info["images"]:
        shared = sum(1 for layer in image["layers"] if layer["sharedWith"])
        plats = image.get("platforms") or [image.get("platform") or {}]
        platform = ", ".join("/".join(str(p[k]) for k in ("os", "architecture", "variant") if p.get(k)) or "-"
                             for p in plats)  # a multi-platform image: every platform carried, primary first
        table.add_row(_t(", ".join(image["refs"]) or "(untagged)"), _t(platform), _t(image["configDigest"][:19]),
                      str(len(image["layers"])), _compression(image["layers"]), human_bytes(image["compressedSize"]),
                      human_bytes(image["uncompressedSize"]), str(shared))
    console.print(table)
    for line in cuda_lines(info["images"]):
        console.print(_t(line))
    for image in info["images"]:  # schema 3.5: signatures, attestations, SBOMs, referrers carried with it
        for art in image.get("artifacts") or []:
            console.print(Text.assemble(
                "  ", _t(", ".join(image["refs"]) or "(untagged)"), ": ", (art["kind"], "bold"), " ",
                _t(art["tag"] or art["artifactType"] or "-"), "  ", _t(art["manifestDigest"][:19]),
                f"  {human_bytes(art['size'])}"))
    if info.get("artifacts"):  # schema 3.6: files carried as OCI artifacts
        files = Table("ARTIFACT", "TYPE", "MANIFEST", "FILES", "SIZE")
        for art in info["artifacts"]:
            files.add_row(_t(art["ref"]), _t(art["artifactType"]), _t(art["manifestDigest"][:19]),
                          str(len(art["files"])), human_bytes(art["size"]))
        console.print(files)
    if info.get("delta"):
        console.print(Text.assemble(("delta bundle", "bold"), ": the offline host must already hold "
                                    f"{len(info['delta']['requires'])} layer(s):"))
        for req in info["delta"]["requires"]:
            console.print(Text.assemble(
                "  ", _t(req["diffId"]), f"  ({human_bytes(req['uncompressedSize'])}, used by ",
                _t(", ".join(req["usedBy"])), ")"))
    totals = info["totals"]
    console.print(Text(f"{totals['files']} files, {human_bytes(totals['bytes'])} on disk; "
                       f"{totals['uniqueLayers']} unique layers, {human_bytes(totals['uncompressedBytes'])} "
                       "uncompressed"))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = argparse.Namespace(json="--json" in argv, debug="--debug" in argv)

    def body() -> int:
        if next((a for a in argv if not a.startswith("-")), None) == "import":
            raise UsageError("reading the command line of bundle: there is no `bundle import`; importing is "
                             "bundle-import's, the importer inside every bundle (and installed beside bundle)",
                             hint="python3 BUNDLE/bundle-import.pyz BUNDLE --verify, or bundle-import BUNDLE --verify "
                             "(bundle-import --help)")
        build_parser().parse_args(argv, namespace=args)
        try:
            rc: int = args.handler(args)
        finally:
            stop_progress()
        return rc

    # the importer's one error boundary (importer/cli/output.py): the same lines and exit codes
    return guarded(args, body, what="bundle", path=lambda: getattr(args, "bundle", None),
                   interrupted=lambda e: Interrupted("bundle: stopped by SIGINT", hint="run the same command again"))
