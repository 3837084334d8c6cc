"""The diff_id check beside the engine's unpack (importer/input/unpackcheck.py): a second read of
each compressed layer, its digest checked again, decompressed within the recorded size. Hostile
layers (a wrong diff_id, a bomb past the recorded size, a blob changed between the stream's read
and this one, damaged compression) are refused and ``on_fail`` is called at once (the Docker sink
cuts the load there); a stopped check ends without a verdict; a check never started is started
by ``finish``, never skipped. Which layers the Docker sink leaves to it: every compressed layer it
sends, each once, and none when an image would load untagged."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Callable, List, Tuple, Type

import pytest

from importer.errors import BundleError, DecompressFailed, DiffIDMismatch, DigestMismatch, LimitExceeded, SizeMismatch
from importer.format.manifest import ImageRecord
from importer.input.opened import open_bundle
from importer.input.unpackcheck import UnpackCheck
from importer.sinks.docker import DockerSink
from tests.kit.bundlegen import big_bundle, bomb_bundle, lying_bundle, make_bundle
from tests.kit.fuzzkit import flip_byte


def _images(bundle: Path) -> List[ImageRecord]:
    return list(open_bundle(str(bundle)).manifest().images)


def _check(bundle: Path) -> UnpackCheck:
    """The check the Docker sink makes for every image of ``bundle`` (all tagged, compressed)."""
    check = DockerSink._unpack_check(str(bundle), _images(bundle))
    assert check is not None
    return check


class _Calls:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_true_bundle_passes_every_layer(tmp_path: Path, compression: str) -> None:
    check = _check(make_bundle(tmp_path / "b", compression=compression))
    check.on_fail = calls = _Calls()
    check.start()
    check.finish()
    assert check.checked == len(check.layers) > 1 and calls.n == 0


@pytest.mark.parametrize("make,error", [(lying_bundle, DiffIDMismatch), (bomb_bundle, LimitExceeded)],
                         ids=["wrong-diff-id", "bomb-past-recorded-size"])
def test_a_hostile_layer_is_named_and_cuts_at_once(tmp_path: Path, make: Callable[[Path], Tuple[Path, str]],
                                                    error: Type[BundleError]) -> None:
    """A wrong diff_id, and a layer holding more than its recorded size (refused at the bound,
    not after decompressing it all): the layer is named and ``on_fail`` called once."""
    bundle, _ = make(tmp_path / "hostile")
    check = _check(bundle)
    check.on_fail = calls = _Calls()
    check.start()
    with pytest.raises(error) as err:
        check.finish()
    assert calls.n == 1 and check.layers[-1][1] in err.value.message, err.value.message
    assert check.checked == len(check.layers) - 1  # the hostile layer is the last one


@pytest.mark.parametrize("change", ["flip", "truncate", "extend"])
def test_a_blob_changed_between_the_two_reads_is_refused(tmp_path: Path, change: str) -> None:
    """The stream checked the digest of what it sent; this read checks it again, so the bytes
    decompressed here are the bytes the engine got, or the import fails."""
    bundle = make_bundle(tmp_path / "b")
    check = _check(bundle)
    layer = check.layers[-1][0]
    path = bundle / layer.digest.blob_path
    if change == "flip":
        flip_byte(path)
    elif change == "truncate":
        path.write_bytes(path.read_bytes()[: layer.size // 2])
    else:
        path.write_bytes(path.read_bytes() + b"\0" * 4096)
    check.on_fail = calls = _Calls()
    with pytest.raises((DigestMismatch, DecompressFailed, SizeMismatch)) as err:
        check.finish()  # never started: finish starts it (a check is never skipped)
    assert str(layer.digest) in err.value.message and calls.n == 1


def test_on_fail_that_raises_does_not_hide_the_verdict(tmp_path: Path) -> None:
    bundle, _ = lying_bundle(tmp_path / "lying")
    check = _check(bundle)

    def broken() -> None:
        raise OSError("the engine went away")

    check.on_fail = broken
    with pytest.raises(DiffIDMismatch):
        check.finish()


def test_stop_ends_the_thread_without_a_verdict(tmp_path: Path) -> None:
    """Stopped at once, the check does not read the 24 MiB layer to its end (a stop that only
    waited for the thread would let it finish every layer)."""
    bundle = big_bundle(tmp_path / "b", compression="zstd", mib=24)
    check = _check(bundle)
    check.start()
    check.stop()
    assert not any(t.name == "unpackcheck" and t.is_alive() for t in threading.enumerate())
    assert check.error is None and check.checked < len(check.layers)


def test_the_docker_sink_leaves_every_compressed_layer_once_and_none_for_an_untagged_image(tmp_path: Path) -> None:
    images = _images(make_bundle(tmp_path / "b", compression="zstd"))
    check = DockerSink._unpack_check(str(tmp_path / "b"), images)
    assert check is not None
    sent = {x.digest for image in images for x in image.layers}
    assert {x.digest for x, _ in check.layers} == sent and len(check.layers) == len(sent)
    untagged = [dataclasses.replace(images[0], refs=()), *images[1:]]
    assert DockerSink._unpack_check(str(tmp_path / "b"), untagged) is None
    stored = _images(big_bundle(tmp_path / "s", compression="none"))
    none_check = DockerSink._unpack_check(str(tmp_path / "s"), stored)
    assert none_check is not None and none_check.layers == []  # a stored layer: its digest is its diff_id
