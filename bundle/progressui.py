"""Progress for the exporter's commands: rich's bar (bytes, rate, ETA) on a terminal, the
importer's plain stderr lines otherwise (cron, ssh, CI logs), none with --quiet. One place, so
``bundle export`` and ``bundle pack|copy|push`` show the same progress."""

from __future__ import annotations

from typing import Callable, Optional

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from importer.streams.progress import stderr_progress

_RICH: Optional[Progress] = None


def progress_factory(quiet: bool) -> Optional[Callable[[str, int], Callable[[int], None]]]:
    """One progress style: on a terminal rich's bar with bytes, rate and ETA; otherwise the
    importer's plain stderr line every few seconds (cron, ssh, CI logs); --quiet: none."""
    if quiet:
        return None
    err = Console(stderr=True)
    if not err.is_terminal:
        return stderr_progress(False)

    def make(label: str, total: int) -> Callable[[int], None]:
        global _RICH
        if _RICH is None:
            _RICH = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True)
            _RICH.start()
        bar = _RICH
        task = bar.add_task(label, total=total or None)
        return lambda n: bar.advance(task, n)

    return make


def stop_progress() -> None:
    global _RICH
    if _RICH is not None:
        _RICH.stop()
        _RICH = None
