"""Test-only hold points: with ``SNEAKERNET_TEST_HOLD_AT=<point>`` the importer writes its pid
to ``$SNEAKERNET_TEST_HOLD_FILE`` when it reaches that point and sleeps there (at most
``$SNEAKERNET_TEST_HOLD_SECONDS``, default 120, or until the test removes that file), so a test can
kill it at an exact step (tests/test_interrupt.py) or look at the engine and then let it go on
(tests/test_legacy_hostile.py). Without the variable every call is a no-op.

Points: ``verify`` (bytes are being verified), ``load`` (``docker load`` is receiving layer
bytes), ``loaded`` (the engine holds the staged images; nothing checked or tagged yet),
``tagged`` (the first user tag is applied; staging tags not yet dropped), ``files-staged``
(``--files-to``: one file staged whole, nothing placed yet), ``serve-access`` (``serve``: a
response sent whole, its access-log line not yet written; held through a stop signal)."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional, Set

from importer.streams.signals import stop_requested

HOLD_ENV = "SNEAKERNET_TEST_HOLD_AT"
_done: Set[str] = set()
_lock = threading.Lock()

ProgressFactory = Callable[[str, int], Callable[[int], None]]


def reached(point: str, *, through_stop: bool = False) -> None:
    """Hold at ``point`` when the test asked for it; a stop signal ends the hold unless
    ``through_stop`` (a worker thread a stop must wait for)."""
    if os.environ.get(HOLD_ENV) != point:
        return
    with _lock:
        if point in _done:
            return
        _done.add(point)
    marker = os.environ.get("SNEAKERNET_TEST_HOLD_FILE")
    if marker:
        with open(marker, "w") as f:
            f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + float(os.environ.get("SNEAKERNET_TEST_HOLD_SECONDS", "120"))
    while time.monotonic() < deadline and (through_stop or not stop_requested()):
        if marker and not os.path.exists(marker):  # the test let it go on
            return
        time.sleep(0.05)


def wrap_progress(progress: Optional[ProgressFactory]) -> Optional[ProgressFactory]:
    """Progress callbacks that also pass the ``verify``/``load`` hold points (by label)."""
    if not os.environ.get(HOLD_ENV):
        return progress

    def factory(label: str, total: int) -> Callable[[int], None]:
        inner = progress(label, total) if progress is not None else None

        def on_bytes(n: int) -> None:
            if inner is not None:
                inner(n)
            reached(label)

        return on_bytes

    return factory
