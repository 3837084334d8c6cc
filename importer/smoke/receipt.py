"""The qualification receipt (``schemas/receipt/qualification-v1.schema.json``): what ran,
where, with which settings and environment, every gate's result and the verdict."""

from __future__ import annotations

import json
from typing import Any, Dict

from importer import __version__
from importer.receipts.receipt import host_facts, now_utc
from importer.smoke.runner import Qualification
from importer.streams.fsutil import atomic_write_bytes

RECEIPT_VERSION = "1.0"


def build_qualification_receipt(q: Qualification) -> Dict[str, Any]:
    return {
        "ok": q.verdict == "pass",  # --json: true exactly when the verdict exits 0
        "receiptVersion": RECEIPT_VERSION,
        "kind": "qualification",
        "tool": {"name": "sneakernet", "version": __version__},
        "created": now_utc(),
        "verdict": q.verdict,
        "exitCode": q.exit_code,
        "device": q.settings.device,
        "image": q.image,
        "bundle": q.bundle,
        "engine": q.engine,
        "host": dict(host_facts(), **q.host.to_dict()),
        "settings": q.settings.to_dict(),
        "environment": q.environment,
        "gates": q.gates,
        "suite": q.suite,
        "timings": {"totalSeconds": round(q.seconds, 3)},
    }


def write_qualification_receipt(path: str, receipt: Dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(receipt, indent=2) + "\n").encode("utf-8"))
