"""importer/streams/hashlane.py: sha256 on a thread of its own behind a bounded queue (bundle pack)."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from importer.streams import hashlane
from importer.streams.hashlane import HashLane


def test_segments_are_the_sha256_of_the_bytes_between_cuts() -> None:
    """Big and small updates (batched), memoryview slices, an empty segment; a buffer the caller
    writes into again after handing it over is hashed as it was (copied: the lane lags behind)."""
    lane = HashLane("test sha256", segments=True, depth=2, batch=4096)
    buf = bytearray(b"a" * 3000)
    segments: list[bytes] = [b"", b"", b""]
    for data in [b"x" * 10, memoryview(b"y" * 70000)[5:60000], buf, b"", bytes(range(256)) * 40]:
        lane.update(data)
        segments[0] += bytes(data)
    buf[:] = b"b" * 3000  # after the update: must not change what was hashed
    lane.cut()
    lane.cut()  # an empty segment
    lane.update(b"z" * 5)
    segments[2] = b"z" * 5
    lane.cut()
    lane.update(b"not cut: no digest of its own")
    whole, cut = lane.close()
    assert cut == [hashlib.sha256(s).hexdigest() for s in segments]
    assert whole == hashlib.sha256(b"".join(segments) + b"not cut: no digest of its own").hexdigest()
    plain = HashLane("test sha256")  # no segments: cut() is nothing
    plain.update(b"abc")
    plain.cut()
    plain.update(memoryview(b"def"))
    assert plain.close() == (hashlib.sha256(b"abcdef").hexdigest(), [])
    assert not [t for t in threading.enumerate() if t.name == "test sha256"]


def test_the_queue_is_bounded_and_stop_ends_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane that cannot keep up holds the writer back (flat memory: ``depth`` batches waiting,
    one being hashed, one being filled); stop() ends the thread, dropping what is left."""
    release = threading.Event()
    real = hashlib.sha256

    class Slow:
        def __init__(self) -> None:
            self._h = real()

        def update(self, data: bytes) -> None:
            release.wait()
            self._h.update(data)

        def hexdigest(self) -> str:
            return self._h.hexdigest()

    monkeypatch.setattr(hashlane.hashlib, "sha256", Slow)
    lane = HashLane("slow sha256", depth=2, batch=1)
    handed = []

    def writer() -> None:
        for i in range(20):
            lane.update(b"%d" % i)
            handed.append(i)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while len(handed) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert t.is_alive() and len(handed) == 3  # 1 taken by the thread, 2 queued, the 4th put waits
    release.set()
    t.join(5)
    assert not t.is_alive() and len(handed) == 20
    lane.stop()
    assert not [x for x in threading.enumerate() if x.name == "slow sha256"]
