"""Progress for the exporter's commands: rich's bar (bytes, rate, ETA) on a terminal, the
importer's plain stderr lines otherwise (cron, ssh, CI logs), none with --quiet or a closed
stderr. One place, so ``bundle export`` and ``bundle pack|copy|push`` show the same progress, and
the same numbers as those lines: binary units (``human_bytes``), the rate since the start, and no
ETA before a rate was measured (``eta_seconds``; rich's own columns use decimal units and show an
ETA from the first chunk)."""

from __future__ import annotations

from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task
from rich.text import Text

from importer.streams.progress import eta_seconds, eta_text, human_bytes, stderr_gone, stderr_progress

_RICH: Optional[Progress] = None


class _Numbers(ProgressColumn):
    """Bytes done / total, rate, ETA: the plain line's numbers (importer/streams/progress.py)."""

    def render(self, task: Task) -> Text:
        done, total, elapsed = int(task.completed), int(task.total or 0), task.elapsed or 0.0
        of = f" / {human_bytes(total)}" if total > 0 and done <= total else ""
        rate = f"  {human_bytes(done / elapsed)}/s" if elapsed > 0 else ""
        left = eta_seconds(done, total, elapsed)
        return Text(f"{human_bytes(done)}{of}{rate}" + (f"  {eta_text(left)}" if left is not None else ""),
                    style="progress.download")


def progress_factory(quiet: bool) -> Optional[Callable[[str, int], Callable[[int], None]]]:
    """One progress style: on a terminal rich's bar with bytes, rate and ETA; otherwise the
    importer's plain stderr line every few seconds (cron, ssh, CI logs); --quiet: none."""
    if quiet or stderr_gone():
        return None
    err = Console(stderr=True)
    if not err.is_terminal:
        return stderr_progress(False)

    def make(label: str, total: int) -> Callable[[int], None]:
        global _RICH
        if _RICH is None:
            _RICH = Progress("[progress.description]{task.description}", BarColumn(), _Numbers(),
                             console=err, transient=True)
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
