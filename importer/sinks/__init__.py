"""Engine sinks: where a verified bundle is loaded, one module per engine (the clients they talk
through are importer/engines/). Every sink is a small :class:`Sink` core; what only some do is a
small optional protocol each, and what a sink can do is one frozen value, its
:class:`SinkCapabilities`: the pipeline asks that value and narrows the sink with the function
beside each protocol (:func:`delta_completing`, ...), never probes for a method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Set, cast

from importer.engines import EngineImage, EngineInfo
from importer.errors import UsageError
from importer.format.digest import Digest
from importer.format.fileartifacts import FileArtifact
from importer.format.manifest import BundleManifest, ImageRecord
from importer.input.opened import BundleRoot
from importer.input.tarscan import ArchiveScan
from importer.streams.commands import FedCommand

if TYPE_CHECKING:  # what a registry's push reports (importer/registry/: no module there imports a sink)
    from importer.registry.push import PushPlan, PushReport
    from importer.registry.push_files import FilePush

ProgressFn = Callable[[int], None]
ProgressFactory = Callable[[str, int], ProgressFn]

#: what a sink holds of the layers a delta bundle leaves out, from :meth:`DeltaCompleting.prepare_delta`
#: for its own ``load``: each left-out layer (its diff_id or blob digest, as the engine keys it) ->
#: where the engine holds it: an image to re-export it from (docker, podman), a content-store blob
#: to decompress (containerd), or None (held as the bundle names it: containerd, an OCI layout)
DeltaBase = Mapping[Digest, Optional[str]]


@dataclass(frozen=True)
class SinkCapabilities:
    """What a sink can do beyond the core, declared once per class (``capabilities``); each flag is
    True exactly where the class implements the protocol named beside it (tests/test_architecture.py
    holds every sink to it, mypy every signature: importer/sinks/choose.py)."""

    #: ``load`` reads the blobs from a tar or parts in place: its ``root`` may be the opened archive
    #: (importer/input/opened.py); other sinks load from a bundle folder only
    reads_archives: bool = False
    #: :class:`LayerStreaming`: the load stream checks each layer blob it sends (digest, size,
    #: diff_id: read once, decompressed once) and holds back the end of a blob until it matched, so
    #: the verification before it leaves those blobs' bytes to the stream (pipeline/importing.py)
    checks_layers_while_loading: bool = False
    #: :class:`LoadCounting`: ``load`` reports bytes of its own to its progress callback (the blobs
    #: it copies), not the uncompressed layers it streams
    counts_load_bytes: bool = False
    #: :class:`DockerArchiveLoading`: loads a docker-archive stream (schema 1/2 bundles)
    loads_docker_archive: bool = False
    #: :class:`DeltaCompleting`: completes a delta bundle from layers it already holds
    completes_deltas: bool = False
    #: :class:`TagListing`: lists its tags (stale staging tags are found and removed)
    lists_tags: bool = False
    #: :class:`Inventorying`: lists every image it holds (``--inventory``)
    lists_images: bool = False
    #: :class:`Reexporting`: exports an image again, for ``--deep``
    reexports: bool = False
    #: :class:`FileArtifactKeeping`: keeps the files a bundle carries (3.6) as the OCI artifacts
    #: they are, under their refs (the OCI layout)
    takes_file_artifacts: bool = False
    #: :class:`Pushing`: loads by pushing the verified bundle by digest (no tag written) and reading
    #: every image back by digest; ``lookup`` and ``tag`` name references in the registry (a registry:
    #: importer/pipeline/registry.py ``RegistryPayload``), in place of ``load``
    pushes: bool = False


class Sink(Protocol):
    """Load verified images into an engine and read back what it holds."""

    kind: str
    capabilities: SinkCapabilities

    def probe(self) -> EngineInfo:
        """Check the engine answers; report its kind, version and storage."""
        ...

    def lookup(self, name: str) -> Optional[EngineImage]:
        """The image called ``name`` (a tag or an ID), or None."""
        ...

    def load(self, root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[DeltaBase] = None) -> None:
        """Load ``images`` from the bundle at ``root`` (its folder, or with ``reads_archives`` the opened
        tar or parts) untagged; ``external``: what :meth:`DeltaCompleting.prepare_delta` returned for
        a delta bundle. Raise on any failure."""
        ...

    def tag(self, image_id: str, ref: str) -> None: ...

    def remove(self, image_id: str) -> None: ...

    def close(self) -> None:
        """Release what the sink holds open (connections)."""
        ...


class LayerStreaming(Sink, Protocol):
    def streamed_layers(self, images: Sequence[ImageRecord]) -> Set[Digest]:
        """The layer blobs (digests) that loading ``images`` sends through the checking stream."""
        ...


class LoadCounting(Sink, Protocol):
    def load_total(self, images: Sequence[ImageRecord], external: Optional[DeltaBase] = None) -> int:
        """The bytes ``load`` reports to its progress callback."""
        ...


class DockerArchiveLoading(Sink, Protocol):
    def archive_command(self, what: str) -> FedCommand:
        """What takes a docker-archive on its ``stdin`` and loads it (``finish``, ``abort``)."""
        ...


class DeltaCompleting(Sink, Protocol):
    def prepare_delta(self, manifest: BundleManifest) -> DeltaBase:
        """Where the engine holds each layer the delta ``manifest`` leaves out; DeltaBaseMissing
        (nothing loaded) if it lacks one."""
        ...


class TagListing(Sink, Protocol):
    def list_tags(self, like: str = "") -> List[str]:
        """Every ``repository:tag`` the engine holds; ``like`` (a glob such as ``repo/*``): only
        those names are asked for, where the engine can filter (the caller still checks each)."""
        ...


class Inventorying(Sink, Protocol):
    def inventory(self) -> List[EngineImage]: ...


class Reexporting(Sink, Protocol):
    def reexport(self, found: EngineImage, image: ImageRecord, on_bytes: Optional[ProgressFn]) -> ArchiveScan: ...


class FileArtifactKeeping(Sink, Protocol):
    def load_files(self, root: BundleRoot, artifacts: Sequence[FileArtifact],
                   on_bytes: Optional[ProgressFn]) -> List[str]:
        """Keep ``artifacts`` under their refs; the problems found (empty: all kept)."""
        ...

    def ref_digest(self, ref: str) -> Optional[str]:
        """The digest the artifact ``ref`` names there now, or None."""
        ...


@dataclass
class PushOutcome:
    """One push: the images under their tags, each read back (``report``), the file artifacts
    (``files``), the attached artifacts handed on before the tags (3.5, the receipt's records), and
    the plan it runs (``plan``: None for a bundle of files alone)."""

    report: PushReport
    files: List[FilePush]
    handed_on: List[Dict[str, object]]
    plan: Optional[PushPlan] = None


class Pushing(Sink, Protocol):
    """A registry's load, in the load route's steps: planned with nothing sent, pushed by digest, read
    back by digest; then the core ``tag`` (each tag written only now) and the file artifacts."""

    def plan_push(self, root: BundleRoot, manifest: BundleManifest, *, move_tags: bool,
                  local: Dict[str, str]) -> PushOutcome:
        """Where the verified ``manifest``'s images and files go from ``root`` (``local``: blobs
        recompressed into a work folder, by digest), nothing sent; ``move_tags``: a tag on other
        bytes is to be moved, not refused; a delta's base missing refused (exit 9)."""
        ...

    def push_by_digest(self, outcome: PushOutcome, progress: Optional[ProgressFactory]) -> None:
        """Every blob and manifest the registry lacks, by digest, and the carried artifacts: no tag."""
        ...

    def read_back(self, outcome: PushOutcome) -> None:
        """Every image read back by digest into ``outcome.report``."""
        ...

    def push_files(self, root: BundleRoot, outcome: PushOutcome, progress: Optional[ProgressFactory]) -> None:
        """The file artifacts, each under its tag, read back into ``outcome.files``."""
        ...


#: each capability (beside ``reads_archives``, which changes what ``load`` reads) -> the protocol a
#: sink implements exactly where its flag is True (tests/test_architecture.py)
CAPABILITY_PROTOCOLS: Dict[str, type] = {
    "checks_layers_while_loading": LayerStreaming,
    "counts_load_bytes": LoadCounting,
    "loads_docker_archive": DockerArchiveLoading,
    "completes_deltas": DeltaCompleting,
    "lists_tags": TagListing,
    "lists_images": Inventorying,
    "reexports": Reexporting,
    "takes_file_artifacts": FileArtifactKeeping,
    "pushes": Pushing,
}


def _lacks(sink: Sink, what: str) -> UsageError:
    return UsageError(f"{what} with the {sink.kind} engine: expected an engine that can, found one that cannot")


# The narrowing functions: the sink as the protocol its capability names, or a UsageError naming
# the sink (the pipeline refuses earlier, in words of its own, where a run could ask for it).
def layer_streaming(sink: Sink) -> LayerStreaming:
    if not sink.capabilities.checks_layers_while_loading:
        raise _lacks(sink, "checking layers while loading")
    return cast(LayerStreaming, sink)


def load_counting(sink: Sink) -> LoadCounting:
    if not sink.capabilities.counts_load_bytes:
        raise _lacks(sink, "counting its own load bytes")
    return cast(LoadCounting, sink)


def docker_archive_loading(sink: Sink) -> DockerArchiveLoading:
    if not sink.capabilities.loads_docker_archive:
        raise _lacks(sink, "loading a docker-archive")
    return cast(DockerArchiveLoading, sink)


def delta_completing(sink: Sink) -> DeltaCompleting:
    if not sink.capabilities.completes_deltas:
        raise _lacks(sink, "completing a delta bundle")
    return cast(DeltaCompleting, sink)


def tag_listing(sink: Sink) -> TagListing:
    if not sink.capabilities.lists_tags:
        raise _lacks(sink, "listing tags")
    return cast(TagListing, sink)


def inventorying(sink: Sink) -> Inventorying:
    if not sink.capabilities.lists_images:
        raise _lacks(sink, "listing images (--inventory)")
    return cast(Inventorying, sink)


def reexporting(sink: Sink) -> Reexporting:
    if not sink.capabilities.reexports:
        raise UsageError(f"--deep with the {sink.kind} engine: expected an engine that can export images again, "
                         "found one that cannot", hint="run without --deep")
    return cast(Reexporting, sink)


def file_artifact_keeping(sink: Sink) -> FileArtifactKeeping:
    if not sink.capabilities.takes_file_artifacts:
        raise _lacks(sink, "keeping file artifacts")
    return cast(FileArtifactKeeping, sink)


def pushing(sink: Sink) -> Pushing:
    if not sink.capabilities.pushes:
        raise _lacks(sink, "pushing a bundle")
    return cast(Pushing, sink)


class SinkBase:
    """The core's defaults: no capabilities, nothing to close, and a core method a sink lacks
    refuses with a UsageError naming the sink. The registry sink loads by pushing
    (importer/pipeline/registry.py), so it has no load or remove of its own."""

    kind = "engine"
    capabilities = SinkCapabilities()

    def _lacks(self, what: str) -> Exception:
        return UsageError(f"{what} with the {self.kind} engine: expected an engine that can, found one that cannot")

    def lookup(self, name: str) -> Optional[EngineImage]:
        raise self._lacks(f"looking up {name}")

    def load(self, root: BundleRoot, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn],
             external: Optional[DeltaBase] = None) -> None:
        raise self._lacks("loading images one by one")

    def tag(self, image_id: str, ref: str) -> None:
        raise self._lacks(f"tagging {ref}")

    def remove(self, image_id: str) -> None:
        raise self._lacks(f"removing {image_id}")

    def close(self) -> None:
        """Release what the sink holds open (connections); nothing by default."""
