"""The import receipt: what was expected, what the engine holds, and how long it took.

Schema: ``schemas/receipt/import-v1.schema.json``. Written atomically.

Where receipts go (README.md, "Receipts"): ``--receipt PATH`` exactly there, else
``$XDG_STATE_HOME/sneakernet/receipts/`` (``~/.local/state/sneakernet/receipts/`` without it) as
``<bundle>-<UTC time>.import-receipt.json``; when that folder cannot be made or written (a
read-only home), a private ``sneakernet-receipts-<uid>`` folder of the temp dir, with a notice.
The destination is checked before anything is imported (:func:`receipt_destination`): a run
never fails after its work because of the receipt."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import socket
import stat
import tempfile
from typing import Any, Callable, Dict, List, Optional

from importer import __version__
from importer.errors import UnwritableReceipt, os_error_text
from importer.streams.fsutil import atomic_write_bytes

RECEIPT_VERSION = "1.0"


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_facts() -> Dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def build_import_receipt(
    *,
    bundle_path: str,
    bundle_digest: Optional[str],
    schema_version: Optional[str],
    engine: Optional[Dict[str, Any]],
    verification: Optional[Dict[str, Any]],
    images: List[Dict[str, Any]],
    timings: Dict[str, float],
    result: str,
    error: Optional[Dict[str, Any]] = None,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """``extra``: further optional sections (signature, preflight, staging), added as given."""
    return {
        "ok": result == "pass" and error is None,  # --json: true exactly when the import exits 0
        "receiptVersion": RECEIPT_VERSION,
        "kind": "import",
        "tool": {"name": "sneakernet", "version": __version__},
        "created": now_utc(),
        "bundle": {"path": bundle_path, "digest": bundle_digest, "schemaVersion": schema_version},
        "host": host_facts(),
        "engine": engine,
        "verification": verification,
        "images": images,
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "result": result,
        "error": error,
        **(extra or {}),
    }


def write_receipt(path: str, receipt: Dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(receipt, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def state_dir() -> str:
    """``$XDG_STATE_HOME/sneakernet/receipts``, else ``~/.local/state/sneakernet/receipts``."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "sneakernet", "receipts")


def _temp_dir() -> str:
    """A private folder of the temp dir (mode 0700, ours, not a link), made if needed."""
    path = os.path.join(tempfile.gettempdir(), f"sneakernet-receipts-{os.getuid() if hasattr(os, 'getuid') else 0}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise PermissionError(13, "not a private folder of this user", path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", path)
    return path


def check_receipt_path(path: str, option: str = "--receipt") -> str:
    """``path`` (absolute) if a receipt can be written there: its folder exists (it is made, as
    ``mkdir -p`` would, when missing: ``receipts/$(hostname)/...``) and is writable, and ``path`` is
    not a folder. Else :class:`UnwritableReceipt`, before any work is done."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    found = ""
    if not os.path.lexists(folder):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            found = f"{folder} cannot be made ({os_error_text(e)})"
    if found:
        pass
    elif not os.path.isdir(folder):
        found = "no such folder" if not os.path.lexists(folder) else "something that is not a folder"
        found = f"{found} at {folder}"
    elif os.path.isdir(path):
        found = "a folder of that name"
    elif not os.access(folder, os.W_OK | os.X_OK):
        found = f"{folder} not writable (read-only or no permission)"
    if found:
        raise UnwritableReceipt(
            f"checking where the receipt goes ({option} {path}): expected a file in a writable folder, found {found}",
            hint=f"give {option} a path in a writable folder, or --no-receipt; nothing was done")
    return path


def _writable_dir(path: str) -> None:
    os.makedirs(path, 0o700, exist_ok=True)
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", path)


def default_receipt_path(bundle: str, suffix: str, on_notice: Optional[Callable[[str], None]] = None) -> str:
    """A new receipt path in :func:`state_dir` (or the temp dir, with a notice):
    ``<bundle name>-<UTC time>.<suffix>``, never an existing file."""
    folder = state_dir()
    try:
        _writable_dir(folder)
    except OSError as e:
        try:
            fallback = _temp_dir()
        except OSError as e2:
            raise UnwritableReceipt(
                f"choosing where the receipt goes: expected {folder} or a private folder of the temp dir writable, "
                f"found {os_error_text(e)} and {os_error_text(e2)}",
                hint="pass --receipt PATH in a writable folder, or --no-receipt; nothing was done") from None
        if on_notice is not None:
            on_notice(f"note: receipts cannot go to {folder} ({os_error_text(e)}); writing to {fallback} instead "
                      "(set XDG_STATE_HOME, or pass --receipt PATH)")
        folder = fallback
    name = os.path.basename(os.path.abspath(bundle).rstrip(os.sep)) or "bundle"
    if name == "bundle.json":
        name = os.path.basename(os.path.dirname(os.path.abspath(bundle))) or "bundle"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(folder, f"{name}-{stamp}.{suffix}")
    n = 2
    while os.path.lexists(path):
        path = os.path.join(folder, f"{name}-{stamp}-{n}.{suffix}")
        n += 1
    return path
