"""``each()``: one function over many items on a few threads, stopping cleanly on the first failure."""

from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Callable, List, Optional


def each(workers: int, fn: Callable[[Any], Any], items: List[Any],
         on_abort: Optional[Callable[[], None]] = None) -> List[Any]:
    """``fn`` over ``items`` on ``workers`` threads, results in order; the first failure cancels
    what has not started yet and is raised. On Ctrl-C/SIGTERM ``on_abort`` stops what is running."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:
            for f in futures:
                f.cancel()
            if on_abort is not None:
                on_abort()
            raise
        for f in futures:
            f.cancel()
        for f in futures:
            failure = f.exception() if f.done() and not f.cancelled() else None
            if failure is not None:
                raise failure
        return [f.result() for f in futures]
