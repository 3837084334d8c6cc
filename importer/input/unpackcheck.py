"""Checking layers' diff_ids beside the engine's unpack, from a second read of each blob.

``docker load`` into Docker's containerd store works in two phases: the stream, in which the
engine writes every blob into its content store (on a 2-core host it keeps about 1.5 cores busy),
then, once ``index.json`` arrived, the unpack of each layer into a snapshot (one core). A diff_id
check inside the stream (importer/input/layercheck.py) competes with the first phase; this one
runs in the second, on the core the engine leaves idle. The stream still checks every blob's
digest and size and sends a blob's last chunk only once they matched, so the engine's content
store never commits a blob that is not what bundle.json names.

:meth:`UnpackCheck.start` is called once every blob went out and before ``index.json``: a thread
reads each compressed layer again through the same opened bundle (from the page cache where the
host's memory holds it), hashes it (its digest must match again: the bytes decompressed are the
bytes sent) and decompresses it within its recorded size, checking diff_id and size. A failure
calls ``on_fail`` at once (the Docker sink cuts the load's connection, so the engine stops
unpacking what may be a bomb), and :meth:`finish` raises it: the caller removes what the load
named (this run's staging tags only; the user's tags are applied after every check passed).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, List, Optional, Sequence, Tuple

from importer.format.digest import CHUNK
from importer.format.manifest import LayerRecord
from importer.input.layers import open_layer
from importer.input.opened import BundleRoot


class UnpackCheck:
    """Check ``layers`` ((record, what) pairs, each once) in a thread started by :meth:`start`."""

    def __init__(self, root: BundleRoot, layers: Sequence[Tuple[LayerRecord, str]]) -> None:
        self.root = root
        self.layers: List[Tuple[LayerRecord, str]] = list(layers)
        self.on_fail: Optional[Callable[[], None]] = None
        self.error: Optional[BaseException] = None
        self.checked = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="unpackcheck", daemon=True)
            self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        try:
            for layer, what in self.layers:
                with open_layer(self.root, layer, what) as reader:
                    while reader.read(CHUNK):
                        if self._stop.is_set():
                            return
                    reader.finish()
                self.checked += 1
        except BaseException as e:  # handed over by finish()
            self.error = e
            if self.on_fail is not None:
                with contextlib.suppress(Exception):
                    self.on_fail()

    def finish(self) -> None:
        """Wait for every layer's verdict; raise the first problem (start() first, if not yet)."""
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop without a verdict (interrupted): the thread ends at its next chunk."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
