"""The qualification receipt (``schemas/receipt/qualification-v1.schema.json``): what ran,
where, with which settings and environment, every gate's result and the verdict.

Since receiptVersion 1.1 it also says what it qualified, for ``fleet-report`` (docs/fleet.md):
``where`` (``image``: the gates ran in the engine's container of ``image``; ``host-python``:
in this Python, ``--no-container``) and ``gpus`` (how many GPUs the gates ran on, and their
models, as torch in the suite saw them: none on ``--device cpu``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List

from importer import __version__
from importer.receipts.receipt import host_facts, now_utc
from importer.smoke.runner import Qualification
from importer.streams.fsutil import atomic_write_bytes

RECEIPT_VERSION = "1.1"
IMAGE = "image"
HOST_PYTHON = "host-python"


def qualified_gpus(q: Qualification) -> Dict[str, Any]:
    """The GPUs the gates ran on: the torch gate's CUDA devices (what the suite saw inside the
    image or this Python); none on ``--device cpu`` or when torch saw no CUDA device."""
    if q.settings.device != "cuda":
        return {"count": 0, "models": []}
    torch = next((g for g in q.gates if isinstance(g, dict) and g.get("name") == "torch"), None)
    metrics = torch.get("metrics") if isinstance(torch, dict) else None
    devices = metrics.get("devices") if isinstance(metrics, dict) and metrics.get("cudaAvailable") else None
    names = [str(d.get("name")) for d in devices or [] if isinstance(d, dict) and d.get("name")]
    models: List[str] = list(dict.fromkeys(names))  # each model once, in index order
    return {"count": len(names), "models": models}


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
        "where": HOST_PYTHON if q.settings.no_container else IMAGE,
        "gpus": qualified_gpus(q),
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
