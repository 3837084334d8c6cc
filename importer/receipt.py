"""The import receipt: what was expected, what the engine holds, and how long it took.

Schema: ``schemas/receipt/import-v1.schema.json``. Written atomically."""

from __future__ import annotations

import datetime
import json
import platform
import socket
from typing import Any, Dict, List, Optional

from importer import __version__
from importer.fsutil import atomic_write_bytes

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
