"""Plain progress lines on stderr: bytes done / total (percent), rate, ETA.

One style for both CLIs (``bundle`` draws the same columns with rich on a terminal): a line
every second on a terminal, every :data:`PLAIN_INTERVAL` seconds otherwise (cron, ``ssh host
...``, CI logs), so a long verify never looks hung; ``--quiet`` turns it off. The library only
calls the callbacks (``progress(label, total)(n)``); printing happens here."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional, TextIO

#: Seconds between two lines when stderr is not a terminal.
PLAIN_INTERVAL = 5.0
ProgressFactory = Callable[[str, int], Callable[[int], None]]


def stderr_progress(quiet: bool) -> Optional[ProgressFactory]:
    """The progress factory of a CLI: None with --quiet, else :class:`StderrProgress` lines."""
    if quiet:
        return None
    return lambda label, total: StderrProgress(label, total)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class StderrProgress:
    """Thread-safe byte counter printing at most one line every ``interval`` seconds."""

    def __init__(self, label: str, total: int, *, stream: Optional[TextIO] = None,
                 enabled: bool = True, interval: Optional[float] = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.interval = interval if interval is not None else 1.0 if tty else PLAIN_INTERVAL
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
        """Bytes done of the total, percent, rate, ETA. A total of 0 is unknown (a source that
        cannot say its size in the bytes counted): bytes and rate only, never a made-up percent;
        bytes past the total (a total that was short) show no percent either."""
        elapsed = max(1e-6, (now or time.monotonic()) - self._start)
        rate = self.done / elapsed
        known = self.total > 0 and self.done <= self.total
        of = f" / {human_bytes(self.total)} ({100 * self.done / self.total:.0f}%)" if known else ""
        eta = ""
        if known and rate > 0 and self.total > self.done:
            eta = f" ETA {int((self.total - self.done) / rate)}s"
        return f"{self.label}: {human_bytes(self.done)}{of} {human_bytes(rate)}/s{eta}"

    def close(self) -> None:
        """The done line: bytes, time, rate (once; later calls print nothing)."""
        with self._lock:
            if not self.enabled:
                return
            self.enabled = False
            elapsed = max(1e-6, time.monotonic() - self._start)
            self.stream.write(f"{self.label}: done, {human_bytes(self.done)} in {elapsed:.1f}s "
                              f"({human_bytes(self.done / elapsed)}/s)\n")
            self.stream.flush()


def close_progress(on_bytes: object) -> None:
    """Print the done line of a progress callback that has one (:class:`StderrProgress`)."""
    close = getattr(on_bytes, "close", None)
    if callable(close):
        close()
