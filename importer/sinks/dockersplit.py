"""The classic store's load in two (issue 44 point 3).

Docker 20.10 copies a whole archive into its temp folder before it registers the first layer
(moby ``image/tarexport/load.go``), so one ``docker load`` is our stream, then the engine's
registration of every layer, one after the other. Here the first layers of the first image
(about a third of the bytes: :data:`HEAD_SHARE`) go first, as an image of their own under a
staging name of this run (:func:`write_partial_archive`); while the engine registers them, the
rest streams as a second load. That load's ``manifest.json`` names every layer, those of the
first load too (no member holds them: the engine takes a layer it holds by its chain ID and
reads no file for it), and is sent only once the first load answered, so those layers are
there when the engine looks. Both streams check every layer as one load does
(importer/sinks/dockerarchive.py), before the member that names an image.

The partial image's name is removed when the load ends, passed or failed: its layers then belong
to the whole image, or to nothing and the engine deletes them. A failure or a stop (SIGINT,
SIGTERM) once the first body is complete waits for the engine's answer to it (it registers those
layers whether or not we listen), then removes the name. A run killed hard leaves it as a staging
name, which the next import removes (importer/pipeline/staging.py). An import under
:data:`SPLIT_ABOVE` bytes, a delta, or one whose first image has no staging name loads in one."""

from __future__ import annotations

import contextlib
from typing import Callable, Optional, Sequence

from importer.errors import BundleError
from importer.format.manifest import ImageRecord
from importer.format.staging import is_staging_ref, sibling_staging_ref
from importer.input.opened import BundleRoot
from importer.sinks import ProgressFn
from importer.sinks.dockerarchive import archive_layers, write_docker_archive, write_partial_archive
from importer.streams.commands import FedCommand, feed

#: uncompressed bytes below which an import loads in one (its stream is a fraction of a second)
SPLIT_ABOVE = 128 << 20
#: the first load holds at least 1/HEAD_SHARE of the bytes: its registration (about 2.5x its stream
#: here) then covers the second stream, which is the rest
HEAD_SHARE = 3


def head_count(images: Sequence[ImageRecord]) -> int:
    """How many of the first image's layers load first (0: the import loads in one)."""
    if not images or not images[0].refs or not is_staging_ref(images[0].refs[0]):
        return 0
    total = sum(x.uncompressed_size for _, _, x in archive_layers(images))
    if total < SPLIT_ABOVE:
        return 0
    seen, size = set(), 0
    for n, layer in enumerate(images[0].layers[:-1], 1):
        if layer.external:
            return 0
        if layer.diff_id not in seen:
            seen.add(layer.diff_id)
            size += layer.uncompressed_size
        if size * HEAD_SHARE >= total:
            return n
    return 0  # the last layer holds most of the bytes: nothing to gain


class _Answer:
    """The first load's answer, read once: before the second load's ``manifest.json``, or when
    the load fails before that."""

    def __init__(self, cmd: FedCommand) -> None:
        self.cmd = cmd
        self.read = False

    def __call__(self) -> None:
        if not self.read:
            self.read = True
            self.cmd.finish()


def load_in_two(first: FedCommand, open_second: Callable[[], FedCommand], root: BundleRoot,
                images: Sequence[ImageRecord], count: int, on_bytes: Optional[ProgressFn],
                forget: Callable[[str], None]) -> None:
    """Load ``images`` as two loads (see the module doc): ``first`` takes the first ``count``
    layers of ``images[0]``, ``open_second()`` the rest; ``forget(name)`` removes the partial
    image's name at the end. Raises what a single load raises."""
    image = images[0]
    partial = sibling_staging_ref(image.refs[0], len(images))  # the run's staging names are 0..len-1
    answer = _Answer(first)
    try:
        try:
            write_partial_archive(first.stdin, root, image, count, partial, on_bytes)
            first.stdin.close()  # the body is complete: the engine registers these layers from now
        except (BrokenPipeError, ConnectionResetError):
            answer()  # the engine hung up: its own words
            raise
        except BaseException:
            answer.read = True
            first.abort()  # cut before manifest.json: the engine names nothing
            raise
        feed(open_second(), lambda out: write_docker_archive(
            out, root, images, with_tags=True, on_bytes=on_bytes,
            sent={x.diff_id for x in image.layers[:count]}, before_manifest=answer))
    except BaseException:
        if not answer.read:  # failed or stopped while the engine registers the first layers (their
            with contextlib.suppress(BundleError, OSError):  # body is complete): wait, then remove them
                answer()
        raise
    finally:
        with contextlib.suppress(BundleError, OSError):
            forget(partial)
