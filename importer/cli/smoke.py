"""``bundle-import smoke [IMAGE]`` and the smoke half of ``bundle-import BUNDLE --smoke``:
parse, qualify, render, write the receipt, exit 0 pass / 11 a gate failed / 10 a required gate
skipped (verdict candidate) / 2 configuration error."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer import __version__
from importer.cli.output import ArgumentParser, emit, failure, kept_stderr, render_error, with_examples
from importer.errors import BundleError, InternalError, os_error_text
from importer.format.text import printable_block
from importer.receipts.receipt import check_receipt_path, default_receipt_path
from importer.smoke.container import ENGINES
from importer.smoke.receipt import build_qualification_receipt, write_qualification_receipt
from importer.smoke.results import EXIT_CANDIDATE, EXIT_GATE_FAILED
from importer.smoke.runner import qualify
from importer.smoke.settings import (
    DEFAULT_RANK_TIMEOUT,
    DEFAULT_TIMEOUT,
    ENGINE_OPTIONS,
    SmokeSettings,
    build_settings,
    choose_engine,
)
from importer.smoke.worker.protocol import SELECTABLE
from importer.streams.signals import stop_error

EXIT_CONFIG = 2
RECEIPT_SUFFIX = "qualification.json"


def _out(text: str = "") -> None:
    """A line or table for people (or a JSON document, ASCII already): its strings quote the
    bundle, the engine and the image, so control characters are shown escaped."""
    sys.stdout.write(printable_block(text) + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def add_smoke_arguments(p: argparse.ArgumentParser, *, standalone: bool) -> None:
    """The smoke flags; ``standalone`` adds those the import parser already has."""
    g = p.add_argument_group("smoke suite" + ("" if standalone else " (with --smoke)"))
    g.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="run the GPU gates on CUDA (default) or the same gates on the CPU (gloo, inductor with "
                   "g++); without a GPU, CUDA gates are SKIP, never PASS")
    g.add_argument("--no-container", action="store_true",
                   help="run the suite in this Python instead of inside the image (hosts without an engine)")
    g.add_argument("--gpus", metavar="LIST", help="GPU indices to use, e.g. 0,1 (becomes CUDA_VISIBLE_DEVICES)")
    g.add_argument("--env", metavar="NAME=VALUE", action="append", default=[],
                   help="a job-scoped variable for the smoke run only (repeatable), e.g. NCCL_P2P_DISABLE=1")
    g.add_argument("--env-file", metavar="FILE", action="append", default=[],
                   help="job-scoped variables, NAME=VALUE per line (Docker's format); --env wins")
    g.add_argument("--restart", action="store_true",
                   help="run the suite, restart the container (docker restart), run it again")
    g.add_argument("--timeout", metavar="S", type=float, default=DEFAULT_TIMEOUT,
                   help=f"time budget of the whole suite in seconds (default {DEFAULT_TIMEOUT:g})")
    g.add_argument("--rank-timeout", metavar="S", type=float, default=DEFAULT_RANK_TIMEOUT,
                   help="a rank of the collective gates still running after S seconds is killed and FAILs "
                   f"(default {DEFAULT_RANK_TIMEOUT:g})")
    g.add_argument("--nproc", metavar="N", type=int, default=0,
                   help="processes for the all-reduce (default: one per selected GPU; 2 on the CPU)")
    g.add_argument("--gates", metavar="LIST",
                   help=f"run only these gates (torch always runs): {','.join(SELECTABLE)}; the others are "
                   "SKIP, so the verdict is at best candidate")
    g.add_argument("--volume", metavar="HOST:CONTAINER", action="append", default=[],
                   help="bind a host path read-only into the smoke container (repeatable)")
    g.add_argument("--ulimit", metavar="NAME=SOFT[:HARD]", action="append", default=[],
                   help="a resource limit of the smoke container (docker, podman; repeatable), e.g. for a host that "
                   "refuses podman's defaults: --ulimit nofile=1024:1024 --ulimit nproc=1024:1024")
    g.add_argument("--python", metavar="PATH",
                   help="the interpreter to run the suite with (default: python3 in the image; this Python "
                   "with --no-container)")
    g.add_argument("--inject-fault", metavar="FAULT", help=argparse.SUPPRESS)  # tests: wrong-sum, segv:R, hang:R
    if standalone:
        p.add_argument("image", metavar="IMAGE", nargs="?", help="the image to qualify (already in the engine)")
        p.add_argument("--receipt", metavar="PATH",
                       help="where to write the receipt (default: $XDG_STATE_HOME/sneakernet/receipts/smoke-<time>."
                       f"{RECEIPT_SUFFIX}, ~/.local/state/... without XDG_STATE_HOME; checked before the suite runs)")
        p.add_argument("--no-receipt", action="store_true", help="do not write a receipt file")
        e = p.add_argument_group("engine (the image's; default docker, or the engine whose options are given)")
        e.add_argument("--engine", choices=list(ENGINES), default=None,
                       help="run the smoke container in Docker (default), containerd (ctr run; Kubernetes nodes) or "
                       "podman")
        e.add_argument("--docker-host", metavar="URL", help="docker: daemon address (default: $DOCKER_HOST)")
        e.add_argument("--address", metavar="SOCKET", help="containerd: socket (default: $CONTAINERD_ADDRESS or "
                       "/run/containerd/containerd.sock)")
        e.add_argument("--namespace", metavar="NS", help="containerd: namespace (default: $CONTAINERD_NAMESPACE or "
                       "default; Kubernetes uses k8s.io)")
        e.add_argument("--snapshotter", metavar="NAME", help="containerd: snapshotter the image is unpacked into "
                       "(default: $CONTAINERD_SNAPSHOTTER or overlayfs)")
        e.add_argument("--podman-root", metavar="DIR", help="podman: storage root (podman --root)")
        e.add_argument("--podman-runroot", metavar="DIR", help="podman: run root (podman --runroot)")
        e.add_argument("--storage-driver", metavar="NAME", help="podman: storage driver (overlay, vfs, ...)")
        p.add_argument("--json", action="store_true", help="print the receipt on stdout")
        p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
        p.add_argument("--debug", action="store_true", help="show tracebacks")
    else:
        g.add_argument("--smoke-receipt", metavar="PATH",
                       help="where to write the qualification receipt (default: beside the import receipt, "
                       f"<bundle>-<time>.{RECEIPT_SUFFIX}; with several images, .N before .json)")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="bundle-import smoke",
        description="Qualify this host with an imported image: driver and CUDA compatibility, torch, bf16 "
        "matmul, torch.compile, fused AdamW, all-reduce, clean shutdown. Writes qualification.json.",
        epilog=f"Exit codes: 0 pass, {EXIT_GATE_FAILED} a gate failed, {EXIT_CANDIDATE} a required gate skipped "
        "(verdict candidate), 2 configuration error. See docs/qualification.md.",
    )
    add_smoke_arguments(p, standalone=True)
    p.add_argument("--version", action="version", version=f"bundle-import smoke {__version__}")
    return with_examples(p, "bundle-import smoke my/train:1 --gpus 0,1",
                         "bundle-import smoke my/train:1 --device cpu --receipt receipts/$(hostname)/q.json",
                         "bundle-import smoke --no-container --device cpu")


def settings_from_args(args: argparse.Namespace, engine: Optional[str] = None,
                       engine_options: Optional[Dict[str, Optional[str]]] = None) -> SmokeSettings:
    """``engine``/``engine_options``: the engine an import chose; else ``--engine`` and its options."""
    if engine is None:
        engine_options = {k: getattr(args, k, None) for k in ENGINE_OPTIONS}
        engine = choose_engine(getattr(args, "engine", None), engine_options)
    return build_settings(engine=engine, engine_options=engine_options, device=args.device,
                          no_container=args.no_container, gpus=args.gpus, env=args.env,
                          env_files=args.env_file, restart=args.restart, timeout=args.timeout,
                          rank_timeout=args.rank_timeout, nproc=args.nproc, gates=args.gates,
                          fault=args.inject_fault, volumes=args.volume, python=args.python,
                          docker_host=(engine_options or {}).get("docker_host"), ulimits=args.ulimit)


def _progress(quiet: bool) -> Optional[Callable[[str], None]]:
    if quiet:
        return None
    return lambda msg: _err(f"smoke: {msg}")


#: characters of a gate's detail in the table; an error keeps its last ERROR_CELL (the receipt has all)
DETAIL_CELL = 160
ERROR_CELL = 600


def render_gates(receipt: Dict[str, Any]) -> str:
    lines = [f"{'gate':<10} {'status':<6} {'req':<3} {'seconds':>8}  detail"]
    for g in receipt["gates"]:
        text = (g.get("error") or g.get("detail") or "").replace("\n", " ")
        if g.get("error") and len(text) > ERROR_CELL:
            text = "..." + text[-(ERROR_CELL - 3):]  # an error's reason is its end (the last line said)
        elif len(text) > DETAIL_CELL:
            text = text[:DETAIL_CELL - 3] + "..."
        lines.append(f"{g['name']:<10} {g['status']:<6} {'yes' if g['required'] else 'no':<3} "
                     f"{g['seconds']:>8.1f}  {text}")
    what = (receipt.get("image") or {}).get("ref") or "this Python"
    lines.append(f"verdict: {receipt['verdict']} (exit {receipt['exitCode']}) for {what} on {receipt['device']}")
    return "\n".join(lines)


def _run_one(settings: SmokeSettings, image: Optional[str], receipt_path: Optional[str],
             bundle: Optional[Dict[str, Any]], quiet: bool) -> Dict[str, Any]:
    q = qualify(settings, image, bundle=bundle, progress=_progress(quiet))
    receipt = build_qualification_receipt(q)
    if receipt_path:
        try:
            write_qualification_receipt(receipt_path, receipt)
        except OSError as e:  # checked before the suite ran; the disk filled since: say so, keep the verdict
            _err(f"warning: the qualification receipt could not be written to {receipt_path}: {os_error_text(e)}")
    return receipt


def _receipt_path(args: argparse.Namespace) -> Optional[str]:
    """``bundle-import smoke``: where the receipt goes, checked before the suite runs."""
    if args.no_receipt:
        return None
    if args.receipt:
        return check_receipt_path(args.receipt)
    return default_receipt_path("smoke", RECEIPT_SUFFIX, on_notice=_err)


def smoke_receipt_base(args: argparse.Namespace) -> Optional[str]:
    """``--smoke``: the qualification receipt path (``.N.json`` for several images), checked
    before the import."""
    if getattr(args, "no_receipt", False) and not args.smoke_receipt:
        return None
    if args.smoke_receipt:
        return check_receipt_path(args.smoke_receipt, "--smoke-receipt")
    return default_receipt_path(args.bundle, RECEIPT_SUFFIX, on_notice=_err)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``bundle-import smoke``; a closed or broken stderr stops nothing (importer/cli/output.py
    ``kept_stderr``, as every other CLI has it through ``guarded``)."""
    with kept_stderr():
        return _main(argv)


def _main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = argparse.Namespace(json="--json" in argv, debug="--debug" in argv)
    try:
        args = build_parser().parse_args(argv, namespace=args)
        settings = settings_from_args(args)
        path = _receipt_path(args)
        receipt = _run_one(settings, args.image, path, None, args.quiet)
    except (KeyboardInterrupt, Exception) as e:
        if args.debug and not isinstance(e, KeyboardInterrupt):
            raise
        err = (e if isinstance(e, BundleError) else stop_error(e, "bundle-import smoke")
               if isinstance(e, KeyboardInterrupt) else InternalError.of(e, "bundle-import smoke"))
        code = err.exit_code
        if args.json:
            emit(failure(err, verdict=None, exitCode=code))
        render_error(err)
        return code
    if args.json:
        _out(json.dumps(receipt, indent=2))
    else:
        _out(render_gates(receipt))
        if path:
            _err(f"receipt: {path}")
    return int(receipt["exitCode"])


def _receipt_paths(args: argparse.Namespace, count: int) -> List[Optional[str]]:
    path = getattr(args, "smoke_receipt_base", None)
    if path is None:
        return [None] * count
    if count == 1:
        return [path]
    stem = path[:-5] if path.endswith(".json") else path
    return [f"{stem}.{n}.json" for n in range(1, count + 1)]


def imported_engine(args: argparse.Namespace, info: Any) -> Any:
    """(kind, options) of the engine the import loaded into: the smoke containers run there."""
    kind = info.kind if info is not None else (getattr(args, "engine", None) or "docker")
    extra = (getattr(info, "extra", None) or {}) if info is not None else {}
    options: Dict[str, Optional[str]] = {k: getattr(args, k, None) for k in ENGINE_OPTIONS
                                         if ENGINE_OPTIONS[k][0] == kind}
    if kind == "containerd" and info is not None:
        options.update(address=info.address or options.get("address"), namespace=extra.get("namespace"),
                       snapshotter=extra.get("snapshotter"))
    return kind, options


def smoke_after_import(args: argparse.Namespace, result: Any, import_receipt: Dict[str, Any]) -> int:
    """``bundle-import BUNDLE --verify --smoke``: qualify every image the import just proved.
    Exit 1 if any image failed, else 2 if the setup failed, else 10 if any is only a candidate, else 0."""
    images: List[str] = []
    for check in result.checks:
        if check.image.refs:
            images.append(check.image.refs[0])
        else:
            images.append(check.found.image_id if check.found is not None else str(check.image.config.digest))
    bundle = {"path": os.path.abspath(args.bundle), "digest": result.bundle_digest or None}
    receipts: List[Dict[str, Any]] = []
    code = 0
    error: Optional[Dict[str, Any]] = None
    try:
        kind, options = imported_engine(args, result.engine)
        settings = settings_from_args(args, kind, options)
        if settings.no_container:
            images = images[:1]  # the current Python is qualified once, whatever the images
        for image, path in zip(images, _receipt_paths(args, len(images))):
            receipt = _run_one(settings, image, path, bundle, args.quiet)
            receipts.append(receipt)
            if not args.json:
                _out(render_gates(receipt))
                if path:
                    _err(f"qualification receipt: {path}")
    except BundleError as e:
        if args.debug:
            raise
        render_error(e)
        code = EXIT_CONFIG
        error = e.to_dict()
    codes = [int(r["exitCode"]) for r in receipts]
    if 1 in codes:
        code = 1
    elif code == 0 and EXIT_CANDIDATE in codes:
        code = EXIT_CANDIDATE
    if args.json:
        emit({"ok": code == 0, "import": import_receipt, "qualifications": receipts, "exitCode": code,
              "error": error})
    return code
