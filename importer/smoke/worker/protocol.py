"""The line protocol between the suite's processes and the host: one JSON object per line on
stdout, after a marker, so that whatever else the image prints is ignored."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import IO, Any, Dict, List, Optional

MARKER = "@@sneakernet-smoke "
MAX_LINE = 1024 * 1024

PASS = "PASS"  # noqa: S105 - a gate status
FAIL = "FAIL"
SKIP = "SKIP"
WARN = "WARN"
STATUSES = (PASS, FAIL, SKIP, WARN)

#: Gates in report order. host runs on the host; restart is driven by the host.
GATES = ("host", "compat", "torch", "matmul", "compile", "optimizer", "allreduce", "shutdown", "restart")
#: Gates run one after another in the "gates" child process (torch first).
PROCESS_GATES = ("torch", "matmul", "compile", "optimizer")
#: Gates run by the processes of one collective job (one process per GPU, or --nproc on CPU).
RANK_GATES = ("allreduce", "shutdown")
#: Gates the user may select with --gates.
SELECTABLE = PROCESS_GATES + RANK_GATES

#: Environment variables recorded as "in force" (prefixes), plus LD_LIBRARY_PATH.
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "NVIDIA_", "GLOO_")
ENV_NAMES = ("LD_LIBRARY_PATH", "OMP_NUM_THREADS")

FAULTS = ("wrong-sum", "segv", "hang")


def env_in_force(environ: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def result(name: str, status: str, seconds: float, metrics: Optional[Dict[str, Any]] = None,
           error: Optional[str] = None, detail: str = "") -> Dict[str, Any]:
    return {
        "event": "result",
        "gate": name,
        "status": status,
        "seconds": round(max(0.0, seconds), 3),
        "metrics": metrics or {},
        "error": error,
        "detail": detail,
    }


_EMIT_LOCK = threading.Lock()


def emit(event: Dict[str, Any], stream: Optional[IO[str]] = None) -> None:
    """Write one protocol line (whole, flushed; safe from several threads)."""
    out = stream or sys.stdout
    line = MARKER + json.dumps(event, sort_keys=True, default=str) + "\n"
    with _EMIT_LOCK:
        out.write(line)
        out.flush()


def parse_line(line: str) -> Optional[Dict[str, Any]]:
    line = line.strip()
    if not line.startswith(MARKER.strip()):
        return None
    try:
        doc = json.loads(line[len(MARKER.strip()):])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("event"), str) else None


def parse_lines(text: str) -> List[Dict[str, Any]]:
    events = []
    for line in text.splitlines():
        ev = parse_line(line)
        if ev is not None:
            events.append(ev)
    return events


def short_error(exc: BaseException, limit: int = 2000) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2:]


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.start
