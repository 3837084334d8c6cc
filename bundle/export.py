"""export_images(): read images from a source into a new bundle folder.

The bundle is built in ``<DIR>.partial-<random>`` beside the target and renamed into place
only when complete, so a bundle folder under its final name is always whole."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundle import gpufit
from bundle.artifactsign import carry_signed
from bundle.blobstore import BlobStore
from bundle.exportloop import Carry, carry_images
from bundle.fileartifact import FileSet, NoImages
from bundle.gpufit import FitCheck
from bundle.helmchart import ChartPackage
from bundle.keys import sign_bundle
from bundle.legacy_writer import write_legacy_bundle
from bundle.sources import SourceImage
from bundle.sources.blobcopy import PlatformChoice
from bundle.sources.choose import open_source as open_any
from bundle.sources.protocol import ExportSource, Selection
from bundle.writer import write_bundle
from importer.errors import (
    PLACE_ERRNOS,
    WRITE_ERRNOS,
    BundleError,
    DestinationInUse,
    InvalidReference,
    UsageError,
    write_error,
)
from importer.format.digest import Digest
from importer.format.manifest import BundleManifest, valid_ref
from importer.format.platform import host, parse_platforms
from importer.format.reference import parse_reference
from importer.input.opened import read_bundle_file
from importer.inventory.have import engines_read_zstd, have_platform, merge_have, zstd_is_fast_on
from importer.pipeline.preflight import InsufficientSpace, SpaceNeed, check_space
from importer.registry.access import RegistryAccess
from importer.streams.fatfs import FIX, FileTooBigForFat, is_fat
from importer.streams.progress import close_progress, human_bytes
from importer.verify.cosign import CosignKey, SignedImage, check_bundle, checked_reader, load_cosign_keys

ProgressFactory = Callable[[str, int], Callable[[int], None]]
#: what a bundle holds beside the images' blobs: the importer (about 400 KiB), bundle.json, SHA256SUMS, index.json
EXPORT_MARGIN = 1024 * 1024


@dataclass
class ExportResult:
    path: str
    manifest: Optional[BundleManifest]  # None for schema 1 and 2 bundles
    seconds: float
    schema: int = 3
    signed_by: Optional[str] = None  # key fingerprint when exported with a signing key
    recompressed: int = 0  # layers recompressed because --compression was asked explicitly
    notes: Tuple[str, ...] = ()  # lines for the user: platforms a default export left out
    gpu_fit: Optional[FitCheck] = None  # --have INVENTORY: each image judged on that host (docs/gpu-fit.md)
    signed_images: Optional[List[SignedImage]] = None  # --require-signed: which key signed which image
    #: config digest -> how a Docker source read the image ("store", "save", "content-store"; --json's ``read``)
    reads: Dict[str, str] = field(default_factory=dict)


def open_source(refs: Sequence[str], given: Optional[ExportSource] = None, **options: Any
                ) -> Tuple[ExportSource, List[str]]:
    """The source of the images ``refs`` name (bundle/sources/choose.py), or ``given`` (``--as-image``'s,
    bundle/asimage.py); for none (an export of files alone, schema 3.6) one that holds no image."""
    if given is not None:
        return given, list(refs)
    return open_any(refs, **options) if refs else (NoImages(), [])


def choose_compression(have: Sequence[str]) -> str:
    """``--compression auto``: zstd, unless a ``--have`` inventory says its host has no fast zstd
    decoder (no zstandard module, no zstd command, Python < 3.14): then gzip, which every python3
    decodes at C speed, where the importer's pure-Python zstd fallback manages a few MB/s
    (docs/benchmarks.md); gzip too when an inventory's engine reads no zstd layer (Docker before
    23.0, containerd before 1.5)."""
    fast = zstd_is_fast_on(have) if have else None
    reads = engines_read_zstd(have) if have else None
    return "gzip" if fast is False or (reads is not None and not reads[0]) else "zstd"


def export_images(
    refs: Sequence[str],
    out_dir: str,
    *,
    docker_host: Optional[str] = None,
    compression: str = "auto",
    level: Optional[int] = None,
    schema: int = 3,
    force: bool = False,
    progress: Optional[ProgressFactory] = None,
    have: Sequence[str] = (),
    sign_key: Optional[Ed25519PrivateKey] = None,
    address: Optional[str] = None,
    namespace: Optional[str] = None,
    tags: Sequence[str] = (),
    platforms: Sequence[str] = (),
    access: Optional[RegistryAccess] = None,
    all_platforms: bool = False,
    allow_unfit: bool = False,
    referrers: bool = True,
    require_signed: Sequence[str] = (),
    files: Optional[FileSet] = None, charts: Sequence[ChartPackage] = (),
    docker_read: str = "auto", artifact_keys: Sequence[Any] = (),  # --sign-artifacts-key (bundle/artifactsign.py)
    source: Optional[ExportSource] = None,  # read ``refs`` from it, not from the source their prefix names
) -> ExportResult:
    """``tags``: one per ref, in order: the name each image carries in the bundle instead of the
    source's (schema 3). ``access``: a ``docker://`` source's logins, CA certificates and
    ``--insecure`` (importer/registry/access.py); ``docker_read``: ``--docker-read`` (auto|store|save)."""
    compression, asked = _check_options(schema, compression, sign_key, have)
    if not refs and files is None and not charts:
        raise UsageError("exporting: expected at least one image, found none")
    _check_tags(refs, tags, schema)
    cosign_keys = _cosign_keys(require_signed, schema)
    started = time.monotonic()
    out_dir = os.path.abspath(out_dir)
    parent = _check_output(out_dir, force)
    source, names = open_source(refs, source, docker_host=docker_host, address=address, namespace=namespace,
                                access=access, docker_read=docker_read)
    with contextlib.closing(source):  # its connections closed however the export ends
        selection = _selection(source, schema, have, platforms, all_platforms, referrers or bool(cosign_keys))
        have_layers = merge_have(have) if have else None
        source_info = source.info()
        checked = source.check_refs(names, selection)
        fit = gpufit.precheck(source, names, have, allow_unfit) if schema == 3 else None
        check_export_space(out_dir, checked.size, len(names), exact=source.knows_sizes_ahead and not have and not asked,
                           say=progress is not None)
        signed_by, signed_images, store = None, None, None
        staging = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".partial-", dir=parent)
        try:
            # a size the source cannot know ahead (Docker's counts file contents): unknown, never a wrong total
            exact = checked.size + (files.size if files else 0) if source.knows_sizes_ahead else 0
            on_bytes = progress("export", exact) if progress else None
            source_doc = {"kind": source_info.kind, **source_info.details}
            if schema < 3:
                write_legacy_bundle(staging, source.legacy_save_argv(names), names, schema, source_doc,
                                    level=level, on_bytes=on_bytes)
                manifest = None
            else:
                store = BlobStore(staging)
                store.recompress_to = compression if asked else None
                store.adaptive = not asked  # auto: a layer that does not compress is stored as it is
                images = carry_images(source, names, selection, Carry(store, compression, level, on_bytes, have_layers))
                gpufit.postcheck(fit, store, images)
                manifest = write_bundle(staging, store, _ordered(images, names, tags), source_doc,
                                        file_artifacts=carry_signed(store, files, charts, on_bytes, artifact_keys))
                signed_images, signed_by = _sign_and_check(staging, manifest, cosign_keys, sign_key)
            close_progress(on_bytes)
            os.chmod(staging, 0o755)  # noqa: S103 - a bundle folder is world-readable like any export
            if os.path.lexists(out_dir):
                _check_replaceable(out_dir)  # again: it may have changed while the images were read
                shutil.rmtree(out_dir)
            os.replace(staging, out_dir)
        except BaseException as e:
            with contextlib.suppress(OSError):
                shutil.rmtree(staging)
            _typed(e, staging, out_dir)
            raise
    return ExportResult(out_dir, manifest, time.monotonic() - started, schema, signed_by,
                        len(store.recompressed) if store is not None else 0, checked.notes, fit,
                        signed_images, reads=_reads(images) if store is not None else {})


def _reads(images: Sequence[SourceImage]) -> Dict[str, str]:
    """Config digest -> how a Docker source read each image (``bundle export --json``'s ``read``)."""
    return {str(Digest.of_bytes(i.raw_config)): i.read for i in images if i.read}


def check_export_space(out_dir: str, size: int, images: int, *, exact: bool, say: bool = True) -> None:
    """Free space at the target before anything is written (importer/pipeline/preflight.py measures
    it): the images' ``size`` as the source reports it, the importer and the documents
    (:data:`EXPORT_MARGIN`). ``exact`` (the blobs as the source stores them, copied as they are): too
    little is refused; otherwise ``size`` is an estimate (Docker's counts the files uncompressed, a
    delta leaves layers out, a recompression changes them), and too little is said (``say``) and
    the export goes on."""
    need = SpaceNeed(os.path.dirname(out_dir), f"the bundle: {images} image(s) "
                     f"{'of' if exact else 'of up to'} {human_bytes(size)}, the importer and metadata",
                     size + EXPORT_MARGIN + images * 64 * 1024)
    short = [c for c in check_space([need]) if not c.ok]
    if not short:
        return
    left = killed_leftovers(out_dir)
    delete = (f"delete {', '.join(left[:3])}{' ...' if len(left) > 3 else ''} (left by an export that was killed; "
              "a failed one removes its own), or " if left else "")
    if exact:
        raise InsufficientSpace(
            f"exporting to {out_dir}: expected enough free space for the bundle, found too little on "
            + "; ".join(c.text() for c in short),
            hint=f"nothing was written; {delete}free space there, or export to a larger disk (then `bundle copy` or "
            "`bundle pack --split` onto this one)")
    if say:
        sys.stderr.write(f"note: the bundle may not fit in {os.path.dirname(out_dir)} (it holds up to the images' "
                         f"size as the source reports it; compressed it is usually smaller): {short[0].text()}"
                         + (f"; {delete.removesuffix(', or ')}" if left else "") + "\n")


def killed_leftovers(out_dir: str) -> List[str]:
    """The staging folders an export killed outright left beside ``out_dir`` (``DIR.partial-*``; for
    ``--archive``, ``.FILE.tar.export-*``): they hold space no later run frees by itself."""
    parent, name = os.path.dirname(out_dir), os.path.basename(out_dir)
    hidden = re.fullmatch(r"(\..+\.export-)[0-9a-f]{12}", name)
    prefix = hidden.group(1) if hidden else name + ".partial-"
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return [os.path.join(parent, n) for n in sorted(names) if n.startswith(prefix) and n != name]


def _typed(error: BaseException, staging: str, out_dir: str) -> None:
    """Raise what a failed export says (the staging folder removed): a BundleError naming the
    user's folder, a failed write naming its place; return for anything else (raised as it is)."""
    if isinstance(error, BundleError):
        raise user_paths(error, staging, out_dir) from error.__cause__
    failed = export_write_error(error, staging, out_dir) if isinstance(error, OSError) else None
    if failed is not None:
        raise failed from error


def export_write_error(err: OSError, staging: str, out_dir: str) -> Optional[BundleError]:
    """A write into the staging folder that failed (out of space, permissions, an I/O error),
    naming the file, the target's folder and the space left there; None for other errors (the
    source's), which stay as they are."""
    path = err.filename if isinstance(err.filename, str) else None
    if err.errno == errno.EFBIG and is_fat(staging):  # FAT32 stops a file at 4 GiB - 1
        return FileTooBigForFat(f"exporting to {out_dir}: expected files under 4 GiB on its FAT file system, found "
                                f"one that grew past it ({path or 'a blob'})",
                                hint=f"nothing was written (the staging folder was removed); {FIX}")
    if path is None and err.errno not in WRITE_ERRNOS:
        return None
    if path is not None and not os.path.abspath(path).startswith(os.path.dirname(out_dir) + os.sep):
        return None
    if err.errno not in PLACE_ERRNOS:
        return None
    return write_error(err, f"exporting to {out_dir}", path, os.path.dirname(out_dir),
                       note=f"the bundle was being built in {staging}, removed: nothing is left under {out_dir}")


def _cosign_keys(require_signed: Sequence[str], schema: int) -> Tuple[CosignKey, ...]:
    """``--require-signed`` keys, loaded before the export (a bad key file costs nothing)."""
    keys = load_cosign_keys(require_signed)
    if keys and schema < 3:
        raise UsageError(f"exporting with --schema {schema} and --require-signed: image signatures are carried "
                         "by schema 3 bundles (3.5)", hint="drop --schema or use --schema 3")
    return keys


def _sign_and_check(staging: str, manifest: BundleManifest, cosign_keys: Sequence[CosignKey],
                    sign_key: Optional[Ed25519PrivateKey]) -> Tuple[Optional[List[SignedImage]], Optional[str]]:
    """``--require-signed``: every image's cosign signature checked, refused before the bundle gets its
    name; ``--sign-key``: bundle.json.sig, then SHA256SUMS again listing it. (which key signed which
    image, the bundle signing key's fingerprint)"""
    signed_images = None
    if cosign_keys:
        doing = "exporting with --require-signed"
        signed_images = check_bundle(manifest, cosign_keys, checked_reader(
            lambda rel, limit, what: read_bundle_file(staging, rel, limit, what), doing), doing)
    return signed_images, (sign_bundle(staging, sign_key) if sign_key is not None else None)


def _check_output(out_dir: str, force: bool) -> str:
    """``-o DIR`` must be new or empty, or (``--force``) a bundle folder to replace: said before the
    export starts. Returns the folder it goes in (created), where the staging folder is made."""
    if os.path.lexists(out_dir) and not _empty_folder(out_dir):
        if not force:
            raise UsageError(f"exporting to {out_dir}: expected a new or empty folder, found an existing one",
                             hint="choose another -o, or pass --force to replace it (a bundle folder only)")
        _check_replaceable(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    return parent


def _selection(source: ExportSource, schema: int, have: Sequence[str], platforms: Sequence[str],
               all_platforms: bool, attached: bool) -> Selection:
    """What the source carries: the platforms asked for (else the one the ``--have`` inventory's host
    runs), and the artifacts attached to each image (``attached``: unless --no-referrers, and always
    with --require-signed). Schemas 1 and 2 need a source that writes them (Docker)."""
    if schema < 3 and not source.writes_legacy_schemas:
        raise UsageError(f"exporting from {source.kind} with --schema {schema}: schemas 1 and 2 are a "
                         "`docker save` archive and need a Docker source", hint="drop --schema or use --schema 3")
    attached = attached and source.carries_attached
    if platforms or all_platforms:
        return _pick_platform(source, platforms, all_platforms, attached)
    offline = have_platform(have) if have and not source.picks_platform_in_engine else None
    # the platform the offline host's inventory names (1.2+), else this host's
    return Selection(platform=offline or host(), attached=attached)


def user_paths(error: BundleError, staging: str, user: str) -> BundleError:
    """``error`` saying ``user`` (the path the user gave) where it said the staging folder the
    work happened in (``NAME.partial-*``, removed by now: a path nobody can look at)."""
    for name in ("message", "context", "hint"):
        text = getattr(error, name)
        if text:
            setattr(error, name, text.replace(staging, user))
    error.args = (error.message,)
    return error


def _check_options(schema: int, compression: str, sign_key: Optional[Ed25519PrivateKey],
                   have: Sequence[str]) -> Tuple[str, bool]:
    """The options agree with the schema: (the compression, chosen when "auto"; asked explicitly)."""
    if schema not in (1, 2, 3):
        raise UsageError(f"exporting: expected --schema 1, 2 or 3, found {schema}")
    if schema < 3 and sign_key is not None:
        raise UsageError(f"exporting with --schema {schema}: signatures (--sign-key) need schema 3",
                         hint="drop --schema or use --schema 3")
    if schema < 3 and have:
        raise UsageError(f"exporting with --schema {schema}: delta bundles (--have) need schema 3",
                         hint="drop --schema or use --schema 3")
    asked = compression != "auto"
    if compression == "auto":
        compression = choose_compression(have if schema == 3 else ())
    if schema < 3 and compression != "zstd":
        raise UsageError(f"exporting with --schema {schema}: --compression is fixed by the schema "
                         f"({'none' if schema == 1 else 'zstd'} for the whole archive)",
                         hint="use --schema 3 for per-layer zstd or gzip")
    if compression == "none" and schema == 3:  # --as-image's own: its layers are the uncompressed tars they are
        return compression, False
    if compression not in ("zstd", "gzip"):
        raise UsageError(f"exporting: expected --compression auto, zstd or gzip, found {compression!r}")
    return compression, asked


def _ordered(images: List[SourceImage], names: Sequence[str], tags: Sequence[str]) -> List[SourceImage]:
    """The user's order (docker save lists images in its own order), renamed by ``tags``."""
    images.sort(key=lambda im: min((names.index(r) for r in im.refs if r in names), default=len(names)))
    return _renamed(images, tags) if tags else images


def _pick_platform(source: ExportSource, values: Sequence[str], all_platforms: bool, attached: bool) -> Selection:
    """``--platform``: which manifest of an image index the source carries (default: this host's);
    several ``--platform`` or ``--all-platforms``: a multi-platform image (bundle schema 3.2), the
    host's platform (else the first named) as the primary that older importers load."""
    wanted = parse_platforms(values) if values else []
    if all_platforms and wanted:
        raise UsageError(f"exporting with --all-platforms and --platform {','.join(str(p) for p in wanted)}: "
                         "expected one of them", hint="--all-platforms carries every platform of the index")
    if source.picks_platform_in_engine and (all_platforms or len(wanted) > 1):
        raise UsageError(f"exporting from {source.kind} with several platforms: expected one (its engine exports "
                         "the platform it runs)", hint="read multi-platform images from docker://, containerd: or an "
                         "OCI layout (oci:DIR[:REF])")
    if all_platforms or len(wanted) > 1:
        primary = next((p for p in wanted if p.matches(host())), wanted[0]) if wanted else host()
        return Selection(platform=primary, choice=PlatformChoice(every=all_platforms, wanted=tuple(wanted)),
                         attached=attached)
    if source.picks_platform_in_engine:
        if not wanted[0].matches(host()):
            raise UsageError(f"exporting from {source.kind} with --platform {wanted[0]}: expected this host's "
                             f"platform ({host()}), found another", hint="its engine exports the platform it runs; "
                             "read other platforms from containerd:REF or an OCI layout (oci:DIR[:REF])")
        return Selection(attached=attached)
    return Selection(platform=wanted[0], platform_given=True, attached=attached)


def _empty_folder(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


def _check_replaceable(out_dir: str) -> None:
    """``--force`` replaces a bundle folder (holding bundle.json) or an empty folder, nothing else:
    never a folder of other files, a file or a link."""
    if _empty_folder(out_dir):
        return
    if os.path.isdir(out_dir) and not os.path.islink(out_dir) and os.path.isfile(os.path.join(out_dir, "bundle.json")):
        return
    if os.path.islink(out_dir) or not os.path.isdir(out_dir):
        found = "a link" if os.path.islink(out_dir) else "a file"
    else:
        names = sorted(os.listdir(out_dir))
        found = f"a folder without bundle.json holding {len(names)} other entries ({', '.join(names[:3])}" + \
            (", ...)" if len(names) > 3 else ")")
    raise DestinationInUse(
        f"exporting to {out_dir} with --force: expected a bundle folder (holding bundle.json) or an empty folder "
        f"to replace, found {found}",
        hint="choose a new -o DIR; --force never deletes what is not a bundle (remove it yourself if you mean it)")


def _check_tags(refs: Sequence[str], tags: Sequence[str], schema: int) -> None:
    if not tags:
        return
    if schema < 3:
        raise UsageError(f"exporting with --schema {schema} and --tag: schemas 1 and 2 carry the names "
                         "`docker save` writes", hint="tag the images in Docker first, or use --schema 3")
    if len(tags) != len(refs):
        raise UsageError(f"exporting with --tag: expected one --tag per image ({len(refs)}), found {len(tags)}",
                         hint="give --tag once for each IMAGE, in the same order")
    for t in tags:
        if parse_reference(t, what="exporting with --tag").digest or not valid_ref(t):
            raise InvalidReference(f"exporting with --tag {t!r}: expected a name and tag such as "
                                   "registry.example/team/app:1, found a digest",
                                   hint="a bundle's image gets a tag; the digest is the bundle's own")


def _renamed(images: List[SourceImage], tags: Sequence[str]) -> List[SourceImage]:
    """Each image (in the order of the refs) named by its --tag only."""
    if len(images) != len(tags):
        raise UsageError(f"exporting with --tag: expected {len(tags)} distinct images, found {len(images)} "
                         "(two IMAGE arguments name the same image)",
                         hint="give each image once, with one --tag")
    return [dataclasses.replace(image, refs=(tag,)) for image, tag in zip(images, tags)]
