"""SIGINT/SIGTERM/SIGHUP stop an import cleanly: the first signal raises :class:`StopRequested`
(a KeyboardInterrupt) in the main thread, so the ordinary ``except``/``finally`` cleanup runs
(abort ``docker load``, remove this run's staging tags, write the receipt saying fail);
further signals during that cleanup are reported and otherwise ignored."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from types import FrameType
from typing import Any, Dict, Iterator, Optional

from importer.errors import Interrupted

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_stop = threading.Event()


def stop_requested() -> bool:
    """True once a stop signal arrived (worker threads can give up early)."""
    return _stop.is_set()


class Terminated(Interrupted):
    """Stopped by SIGTERM or SIGHUP (SIGINT is ``interrupted``)."""

    reference = "terminated"
    exit_code = 143


class StopRequested(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def stop_error(exc: BaseException, what: str) -> Interrupted:
    """The error for the receipt and the exit code: 130 for SIGINT, 143 otherwise."""
    if isinstance(exc, StopRequested) and exc.signum != signal.SIGINT:
        return Terminated(f"{what}: stopped by {exc.name}")
    return Interrupted(f"{what}: stopped by SIGINT")


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Install the handlers for the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stop.clear()

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        if _stop.is_set():
            sys.stderr.write(f"bundle-import: {signal.Signals(signum).name} again: already stopping, "
                             "cleaning up first\n")
            return
        _stop.set()
        raise StopRequested(signum)

    old: Dict[int, Any] = {}
    for name in STOP_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is not None:
            old[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)
