"""``containerd:`` source: images straight from containerd's content store.

containerd keeps every layer compressed as it was pulled or built (gzip or zstd), so the blobs
are copied byte for byte (``ctr content get``) and only decompressed to compute diff_ids: no
``save`` stream, no recompression. Names are looked up as containerd stores them
(``docker.io/library/app:1``) and recorded in the bundle in Docker's short form (``app:1``)."""

from __future__ import annotations

import contextlib
from typing import BinaryIO, Dict, Iterator, List, Optional, Sequence, Tuple

from bundle.sources import ResolvedImage, SourceInfo
from bundle.sources.blobcopy import BlobProvider, add_layer_sizes, manifests_for, resolve_target
from bundle.sources.protocol import CheckedRefs, Resolved, Selection, SourceBase
from bundle.sources.records import Descriptor
from importer.engines.ctrclient import CtrClient
from importer.errors import CommandFailed, ImageNotFound, SourceError
from importer.format.digest import Digest
from importer.format.refs import familiar, normalize
from importer.streams.commands import command_stdout


class ContainerdSource(SourceBase):
    """containerd's content store, read with ``ctr`` (blobs as stored)."""

    kind = "containerd"

    def __init__(self, address: Optional[str] = None, namespace: Optional[str] = None) -> None:
        self.ctr = CtrClient(address, namespace)
        self.where = f"containerd at {self.ctr.address} (namespace {self.ctr.namespace})"
        #: reference -> (the name containerd stores, the image's manifest or index)
        self._targets: Dict[str, Tuple[str, Descriptor]] = {}

    def info(self) -> SourceInfo:
        version = self.ctr.version(hint="start containerd, or pass --address SOCKET [--namespace NS]")
        return SourceInfo("containerd", {"engine": "containerd", "engineVersion": version,
                                         "namespace": self.ctr.namespace})

    def _target(self, ref: str) -> Tuple[str, Descriptor]:
        if ref not in self._targets:
            rows = self.ctr.rows(f"name=={normalize(ref)}")
            if not rows:
                raise ImageNotFound(f"exporting {ref}: expected the image in {self.where}, found none",
                                    hint="check the name with `ctr --address SOCKET -n NS images ls`, "
                                         "or pass --address/--namespace")
            name, media_type, digest = rows[0]
            self._targets[ref] = (name, Descriptor(media_type, Digest.parse(
                digest, what=f"exporting {ref}: the digest {self.where} lists for {name}")))
        return self._targets[ref]

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        sizes: Dict[str, int] = {}
        notes: List[str] = []
        for ref in refs:
            add_layer_sizes(manifests_for(self, self._target(ref)[1], selection.platform, selection.choice,
                                          f"exporting {ref} from {self.where}", strict=selection.platform_given,
                                          notes=notes), sizes)
        return CheckedRefs(sum(sizes.values()), tuple(notes))

    # === BlobProvider
    @contextlib.contextmanager
    def open_blob(self, digest: str, what: str) -> Iterator[BinaryIO]:
        try:
            with command_stdout(self.ctr.argv("content", "get", digest), what=what) as stream:
                yield stream
        except CommandFailed as e:
            raise SourceError(f"{what}: expected the blob {digest[:19]} in {self.where}, found none or a "
                              f"failing read (exit {e.returncode})", context=e.stderr_tail.strip() or None,
                              hint="the image may be only partly pulled; `ctr images check` shows what is missing"
                              ) from e

    def blobs(self, image: ResolvedImage) -> BlobProvider:
        return self

    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        by_target: Dict[str, Tuple[str, ...]] = {}
        for ref in refs:  # one image per target digest, all its requested names
            name, target = self._target(ref)
            by_target[str(target.digest)] = (*by_target.get(str(target.digest), ()), familiar(name))
        images: List[Resolved] = []
        for ref in refs:
            target = self._target(ref)[1]
            if str(target.digest) not in by_target:
                continue
            images.append(resolve_target(self, target, ref, by_target.pop(str(target.digest)),
                                         platform=selection.platform, choice=selection.choice,
                                         what=f"exporting {ref} from {self.where}"))
        return images
