"""Plain progress lines on stderr: bytes done / total (percent), rate, ETA.

One style for both CLIs (``bundle`` draws the same columns with rich on a terminal): a line
every second on a terminal, every :data:`PLAIN_INTERVAL` seconds otherwise (cron, ``ssh host
...``, CI logs), so a long verify never looks hung; ``--quiet`` turns it off. The library only
calls the callbacks (``progress(label, total)(n)``); printing happens here.

Honest numbers: one unit system, binary (KiB, MiB, GiB: :func:`human_bytes`), on and off a
terminal and in every summary; no ETA until a rate was measured over :data:`ETA_MIN_SECONDS` and
:data:`ETA_MIN_BYTES` (:func:`eta_seconds`: a first chunk read from a buffer, or a registry's slow
start, made absurd first ETAs); a stderr that is closed or gone (``2>&-``, EPIPE) turns progress
off and stops nothing else (importer/cli/output.py ``kept_stderr``)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional, TextIO

#: Seconds between two lines when stderr is not a terminal.
PLAIN_INTERVAL = 5.0
#: The first ETA waits for a rate measured over at least this many seconds and bytes.
ETA_MIN_SECONDS = 2.0
ETA_MIN_BYTES = 1 << 20
ProgressFactory = Callable[[str, int], Callable[[int], None]]


def stderr_gone() -> bool:
    """stderr is closed or its reader went away (``2>&-``, EPIPE): progress has nowhere to go."""
    return sys.stderr is None or bool(getattr(sys.stderr, "gone", False))


def stderr_progress(quiet: bool) -> Optional[ProgressFactory]:
    """The progress factory of a CLI: None with --quiet or no stderr, else :class:`StderrProgress` lines."""
    if quiet or stderr_gone():
        return None
    return lambda label, total: StderrProgress(label, total)


def eta_seconds(done: int, total: int, elapsed: float) -> Optional[float]:
    """Seconds left at the rate so far, or None while it is not known: no total (or a total that was
    short), or a rate measured over less than :data:`ETA_MIN_SECONDS` and :data:`ETA_MIN_BYTES`."""
    if total <= 0 or done >= total or elapsed < ETA_MIN_SECONDS or done < ETA_MIN_BYTES:
        return None
    return (total - done) / (done / elapsed)


def eta_text(seconds: float) -> str:
    """``ETA 42s``, ``ETA 3m05s``, ``ETA 2h07m``: both progress styles."""
    s = int(seconds)
    if s < 60:
        return f"ETA {s}s"
    if s < 3600:
        return f"ETA {s // 60}m{s % 60:02d}s"
    return f"ETA {s // 3600}h{s % 3600 // 60:02d}m"


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
                self._write(self.line(now) + "\n")

    def _write(self, text: str) -> None:
        """A stderr that is closed or gone turns this progress off; the work goes on."""
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def line(self, now: Optional[float] = None) -> str:
        """Bytes done of the total, percent, rate, ETA. A total of 0 is unknown (a source that
        cannot say its size in the bytes counted): bytes and rate only, never a made-up percent;
        bytes past the total (a total that was short) show no percent either."""
        elapsed = max(1e-6, (now or time.monotonic()) - self._start)
        rate = self.done / elapsed
        known = self.total > 0 and self.done <= self.total
        of = f" / {human_bytes(self.total)} ({100 * self.done / self.total:.0f}%)" if known else ""
        left = eta_seconds(self.done, self.total, elapsed) if known else None
        eta = "" if left is None else f" {eta_text(left)}"
        return f"{self.label}: {human_bytes(self.done)}{of} {human_bytes(rate)}/s{eta}"

    def close(self) -> None:
        """The done line: bytes, time, rate (once; later calls print nothing)."""
        with self._lock:
            if not self.enabled:
                return
            self.enabled = False
            elapsed = max(1e-6, time.monotonic() - self._start)
            self._write(f"{self.label}: done, {human_bytes(self.done)} in {elapsed:.1f}s "
                        f"({human_bytes(self.done / elapsed)}/s)\n")


def close_progress(on_bytes: object) -> None:
    """Print the done line of a progress callback that has one (:class:`StderrProgress`)."""
    close = getattr(on_bytes, "close", None)
    if callable(close):
        close()
