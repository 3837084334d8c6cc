"""The plan of one ``bundle-import`` run, as data: which steps run, in which order, with which
options. ``--verify-only``, ``--check-only``, an import into an engine and an import into a
registry are four plans, not four branches of the command line; :func:`plan_from_args` makes the
one the arguments ask for and importer/pipeline/walk.py ``run_import`` walks it.

Every plan starts with the same front steps, run by the walk itself: ``open`` (the bundle, once),
``signature`` (the trust policy, before anything else reads it), ``schema`` (a schema 1/2 bundle
turns an engine or registry import into ``legacy-import``) and, with ``--require-signed``,
``image-signatures``. The steps after them are those of the plan's route, each route one
orchestrator of this floor (:data:`ROUTE_STEPS`) that takes the plan and reads its options and
optional steps (:meth:`ImportPlan.runs`) from it, never from the command line's arguments;
``receipt`` is written by the caller (importer/cli/main.py) from the result the walk filled in,
of the plan's :attr:`~ImportPlan.receipt_kind` (a failed run gets one too)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from importer.errors import UsageError

VERIFY_ONLY = "verify-only"  # verify every byte and stop; no engine
CHECK_ONLY = "check-only"  # prove the engine already holds each image; changes nothing
IMPORT = "import"  # a schema 3 bundle into an engine (importer/pipeline/importing.py)
LEGACY_IMPORT = "legacy-import"  # a schema 1/2 bundle into an engine (importer/pipeline/legacy.py)
REGISTRY = "registry"  # push by digest into a registry, read back, then tag (importer/pipeline/registry.py)
FILES = "files"  # --files-to DIR with --files-only, or a bundle of files alone: no engine (importer/pipeline/files.py)
MODES = (VERIFY_ONLY, CHECK_ONLY, IMPORT, LEGACY_IMPORT, REGISTRY, FILES)

FRONT_STEPS = ("open", "signature", "schema")
IMAGE_SIGNATURES = "image-signatures"  # --require-signed: before the engine is asked anything
DEEP = "deep"  # --deep: every image exported back out of the engine, every layer hashed again
RECEIPT = "receipt"
WRITE_FILES = "write-files"  # --files-to DIR: the files the bundle carries (3.6), after the images
# the steps of each route, in the order the route runs them (DEEP only with --deep; RECEIPT: the plan's
# receipt_kind); each run reports the steps it entered (ImportResult.steps), and tests/test_import_plan.py and
# tests/test_import_steps.py compare them with these
ROUTE_STEPS: Dict[str, Tuple[str, ...]] = {
    VERIFY_ONLY: ("verify",),
    CHECK_ONLY: ("probe", "verify", "read-back", DEEP, RECEIPT),
    IMPORT: ("probe", "lock", "preflight", "verify", "staging-load", "read-back", DEEP, "tag",
             "drop-stale-staging", WRITE_FILES, RECEIPT),
    LEGACY_IMPORT: ("probe", "lock", "preflight", "verify", "staging-load", "read-back", DEEP, "tag",
                    "drop-stale-staging", WRITE_FILES, RECEIPT),
    # the same load route (importer/pipeline/load.py) over a registry: staging-load pushes by digest (no tag
    # written); no DEEP (a registry exports nothing again: --deep refused when the arguments are read)
    REGISTRY: ("probe", "lock", "preflight", "verify", "staging-load", "read-back", "tag", "drop-stale-staging",
               WRITE_FILES, RECEIPT),
    FILES: ("verify", WRITE_FILES, RECEIPT),
}
IMPORT_RECEIPT, CHECK_ONLY_RECEIPT = "import", "check-only"  # the receipt's "kind" (schemas/receipt/)
RECEIPT_KINDS = {CHECK_ONLY: CHECK_ONLY_RECEIPT, IMPORT: IMPORT_RECEIPT, LEGACY_IMPORT: IMPORT_RECEIPT,
                 REGISTRY: IMPORT_RECEIPT, FILES: IMPORT_RECEIPT}


@dataclass(frozen=True)
class ImportPlan:
    """One run of ``bundle-import BUNDLE``: its mode (:data:`MODES`) and the options its steps use."""

    mode: str
    bundle: str
    trust: Tuple[str, ...] = ()  # --trust: Ed25519 keys (implies a required signature)
    require_signature: bool = False
    require_signed: Tuple[str, ...] = ()  # --require-signed: cosign keys, one of them signed each image
    deep: bool = False  # --deep (import, check-only)
    shallow: bool = False  # --shallow (verify-only of a folder: no layer decompressed)
    force: bool = False
    lock_wait: float = 0.0
    name_prefix: Optional[str] = None  # --check-only --name-prefix
    platform: Optional[str] = None  # --platform, parsed by the import step (its error after the signature's)
    require_fit: bool = False
    compression: str = "keep"  # --compression (registry): the layers as pushed (importer/registry/transcode.py)
    allow_recompressed_signed: bool = False  # --allow-recompressed-signed: with --require-signed
    quiet: bool = False  # no progress and no notice lines
    quiet_image_signatures: bool = False  # no line per verified image signature (also with --json --verify-only)
    legacy_major: Optional[int] = None  # set by the schema step: a schema 1/2 bundle
    files_to: Optional[str] = None  # --files-to DIR: the files the bundle carries (3.6) written below DIR
    files_to_engine: bool = False  # --engine oci: the engine itself takes the files (3.6) into its layout

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown import mode {self.mode!r}")  # pragma: no cover (a bug, not input)

    @property
    def steps(self) -> Tuple[str, ...]:
        """Every step of the run, in order."""
        front = FRONT_STEPS + ((IMAGE_SIGNATURES,) if self.require_signed else ())
        route = tuple(s for s in ROUTE_STEPS[self.mode] if (s != DEEP or self.deep)
                      and (s != WRITE_FILES or self.files_to))
        return front + route

    def runs(self, step: str) -> bool:
        """Whether ``step`` is one of this run's steps: the routes ask this (``DEEP``), not the flags."""
        return step in self.steps

    @property
    def receipt_kind(self) -> Optional[str]:
        """The receipt's kind ("import", "check-only"); None: the run writes none (--verify-only)."""
        return RECEIPT_KINDS.get(self.mode)

    @property
    def needs_engine(self) -> bool:
        return self.mode not in (VERIFY_ONLY, FILES)

    def for_images(self, images: int) -> ImportPlan:
        """The plan once the bundle was opened: one with no image (files alone, 3.6) needs no engine
        with ``--files-to`` (mode ``files``); without it there is nothing to import, unless the
        files go to a registry (``--engine registry`` pushes them) or an OCI layout (``--engine
        oci`` writes them into it)."""
        if images or self.mode != IMPORT or self.files_to_engine:
            return self
        if not self.files_to:
            raise UsageError(f"importing {self.bundle}: expected images to import, found a bundle of files alone",
                             hint="give --files-to DIR to write its files (or --verify-only); nothing was done")
        return dataclasses.replace(self, mode=FILES)

    def for_schema(self, major: Optional[int]) -> ImportPlan:
        """The plan once the schema step read the bundle: a schema 1/2 bundle (``major``) is loaded
        as one docker-archive (an engine or registry import becomes ``legacy-import``; the legacy
        importer refuses a registry); verify-only and check-only keep their mode and learn it."""
        if major is None:
            return self
        mode = LEGACY_IMPORT if self.mode in (IMPORT, REGISTRY) else self.mode
        return dataclasses.replace(self, mode=mode, legacy_major=major)


def wants_registry(args: argparse.Namespace) -> bool:
    """``--engine registry``, or ``--registry`` without ``--engine``: the registry sink."""
    return args.engine == "registry" or (not args.engine and bool(getattr(args, "registry", None)))


def mode_from_args(args: argparse.Namespace) -> str:
    """The mode the arguments ask for (before the bundle is opened: a schema 3 bundle assumed)."""
    if getattr(args, "verify_only", False):
        return VERIFY_ONLY
    if getattr(args, "files_only", False):
        return FILES
    if getattr(args, "check_only", False):
        return CHECK_ONLY
    return REGISTRY if wants_registry(args) else IMPORT


def plan_from_args(args: argparse.Namespace) -> ImportPlan:
    """The plan of ``bundle-import``'s parsed arguments (importer/cli/main.py)."""
    mode = mode_from_args(args)
    quiet = bool(getattr(args, "quiet", False))
    if mode != VERIFY_ONLY and wants_registry(args) and getattr(args, "deep", False):
        raise UsageError(
            "reading --deep with the registry engine: expected an engine that can export an image again "
            "(docker, containerd, podman, oci), found --engine registry, which cannot",
            hint="drop --deep: the registry's read-back already compares every manifest, config and diff_id "
            "with the bundle; nothing was done")
    compression = getattr(args, "compression", None) or "keep"
    if compression != "keep" and not wants_registry(args):
        raise UsageError(
            f"reading --compression {compression}: expected --engine registry (the layers' compression in a "
            "registry), found another engine", hint="an engine stores the layers uncompressed: drop --compression; "
            "nothing was done")
    if getattr(args, "files_only", False) and not getattr(args, "files_to", None):
        raise UsageError("reading --files-only: expected --files-to DIR (where the files go), found none",
                         hint="bundle-import BUNDLE --files-to DIR --files-only; nothing was done")
    return ImportPlan(
        mode=mode,
        files_to=getattr(args, "files_to", None),
        files_to_engine=getattr(args, "engine", None) == "oci" and not getattr(args, "files_only", False),
        bundle=args.bundle,
        trust=tuple(getattr(args, "trust", None) or ()),
        require_signature=bool(getattr(args, "require_signature", False)),
        require_signed=tuple(getattr(args, "require_signed", None) or ()),
        deep=bool(getattr(args, "deep", False)),
        shallow=bool(getattr(args, "shallow", False)),
        force=bool(getattr(args, "force", False)),
        lock_wait=float(getattr(args, "wait_lock", 0.0) or 0.0),
        name_prefix=getattr(args, "name_prefix", None),
        platform=getattr(args, "platform", None),
        require_fit=bool(getattr(args, "require_fit", False)),
        compression=compression,
        allow_recompressed_signed=bool(getattr(args, "allow_recompressed_signed", False)),
        quiet=quiet,
        quiet_image_signatures=quiet or (mode == VERIFY_ONLY and bool(getattr(args, "json", False))),
    )
