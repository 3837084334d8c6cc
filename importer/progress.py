"""Plain progress lines on stderr (bytes, rate, ETA), only when stderr is a terminal."""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional, TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class StderrProgress:
    """Thread-safe byte counter printing at most one line every ``interval`` seconds."""

    def __init__(self, label: str, total: int, *, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, interval: float = 1.0) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval = interval
        self.done = 0
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last = 0.0

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if self.enabled and now - self._last >= self.interval:
                self._last = now
                self.stream.write(self.line(now) + "\n")
                self.stream.flush()

    def line(self, now: Optional[float] = None) -> str:
        elapsed = max(1e-6, (now or time.monotonic()) - self._start)
        rate = self.done / elapsed
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = ""
        if rate > 0 and self.total > self.done:
            eta = f" ETA {int((self.total - self.done) / rate)}s"
        return (f"{self.label}: {human_bytes(self.done)} / {human_bytes(self.total)}{pct} "
                f"{human_bytes(rate)}/s{eta}")

    def close(self) -> None:
        if self.enabled:
            self.stream.write(self.line() + " done\n")
            self.stream.flush()
