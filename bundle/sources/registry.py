"""The ``docker://`` source: images read straight from a registry over the distribution API, on
the importer's own client (importer/registry/client.py: token and basic auth from the docker
config, podman/skopeo auth.json, their credential helpers, ``--authfile``, ``--username``; CA
certificates from ``--cert-dir`` or certs.d; ``--insecure``, a loopback registry over plain HTTP:
importer/registry/access.py).

``docker://HOST[:PORT]/REPO:TAG`` or ``docker://HOST[:PORT]/REPO@sha256:...`` (no host: Docker
Hub). Manifests and indexes are kept byte for byte (their digests survive); blobs are copied as
stored and checked on the way like every source's (importer's blobcopy: digest, size, diff_id).
A blob download that drops is resumed from the bytes already read (``Range``), a few times.
A hostile registry cannot fill the disk: every blob is read up to the size its descriptor declares
(one byte more is refused, as is a Content-Length that says more), manifests and indexes up to
MAX_MANIFEST, and indexes nest at most MAX_INDEX_DEPTH levels deep (LimitExceeded); a document of
the wrong shape is a SourceError.
A tagged reference is carried under its full name (``HOST:PORT/REPO:TAG``, as ``docker pull``
names it); a reference by digest is carried untagged (``--tag`` names it)."""

from __future__ import annotations

import contextlib
import http.client
import io
from dataclasses import dataclass
from typing import ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

from bundle.sources import ResolvedImage, SourceInfo
from bundle.sources.attached import RegistryArtifacts
from bundle.sources.blobcopy import BlobProvider, add_layer_sizes, manifests_for, resolve_target
from bundle.sources.protocol import Attached, CheckedRefs, Resolved, Selection, SourceBase
from bundle.sources.records import ClosingReader, Descriptor, JsonObject, as_object, kind_of, list_of, load_json
from importer.errors import ImageNotFound, InvalidReference, LimitExceeded, RegistryError, SourceError
from importer.format.digest import CHUNK, Digest, is_digest
from importer.format.limits import MAX_INDEX, MAX_INDEX_DEPTH, MAX_MANIFEST
from importer.format.reference import (
    DOCKER_HUB_API,
    OFFICIAL_PREFIX,
    is_docker_hub,
    official_path,
    split_host_path,
    split_reference,
    valid_path,
    valid_tag,
)
from importer.registry.access import RegistryAccess
from importer.registry.client import RegistryClient, RegistryTarget
from importer.streams.readers import Readable

RESUMES = 5
MAX_DOCUMENT = max(MAX_MANIFEST, MAX_INDEX)  # a manifest or an index read from /manifests/


@dataclass(frozen=True)
class RegistryRef:
    """``HOST[:PORT]/REPO`` and a tag or a digest."""

    host: str
    repo: str
    tag: str = ""
    digest: str = ""

    @property
    def reference(self) -> str:
        return self.digest or self.tag

    @property
    def name(self) -> str:
        """The name the bundle gives a tagged image (``docker pull`` names it so)."""
        hub = self.host == DOCKER_HUB_API
        repo = self.repo[len(OFFICIAL_PREFIX):] if hub and self.repo.startswith(OFFICIAL_PREFIX) else self.repo
        return f"{repo}:{self.tag}" if hub else f"{self.host}/{self.repo}:{self.tag}"

    def __str__(self) -> str:
        return f"{self.host}/{self.repo}{'@' + self.digest if self.digest else ':' + self.tag}"


def parse_registry_ref(text: str) -> RegistryRef:
    """``[HOST[:PORT]/]REPO[:TAG|@DIGEST]`` (what follows ``docker://``); no host: Docker Hub."""
    where = f"docker://{text}"
    name, tag, digest = split_reference(text)
    if digest and not is_digest(digest):
        raise InvalidReference(f"reading {where}: expected a digest 'sha256:' + 64 hex after '@', found {digest!r}")
    host_name, repo = split_host_path(name)
    if not host_name:
        host_name, repo = DOCKER_HUB_API, official_path(name)
    if is_docker_hub(host_name):  # what a reference calls Docker Hub is asked at its API host, where
        # an official image's path has its library/ (docker.io/alpine is Docker Hub's library/alpine)
        host_name, repo = DOCKER_HUB_API, official_path(repo)
    if not valid_path(repo):
        raise InvalidReference(f"reading {where}: expected a repository of lowercase path components, found {repo!r}",
                               hint="write it as docker://HOST[:PORT]/REPO:TAG or docker://HOST[:PORT]/REPO@sha256:...")
    if tag and not valid_tag(tag):
        raise InvalidReference(f"reading {where}: expected a tag of [A-Za-z0-9_.-] (at most 128), found {tag!r}")
    if not tag and not digest:
        tag = "latest"
    return RegistryRef(host_name, repo, tag, digest)


class RepositoryBlobs:
    """A BlobProvider for one reference's repository: blobcopy's reads go to ``ref``'s registry
    and repository, named here rather than by a cursor the source moves between images."""

    def __init__(self, source: RegistrySource, ref: RegistryRef) -> None:
        self.source, self.ref = source, ref
        self.where = source.where

    def open_blob(self, digest: str, what: str) -> ContextManager[Readable]:
        return self.source.open_blob(self.ref, digest, what)


class _ResumingBlob:
    """A blob read to its end: when the connection drops (an error, or an end before ``size``)
    the download is opened again at the bytes already read, up to RESUMES times; the caller
    hashes what it reads, so a resumed blob is checked as a whole."""

    def __init__(self, client: RegistryClient, repo: str, digest: Digest, size: int, what: str) -> None:
        self.client, self.repo, self.digest, self.size, self.what = client, repo, digest, size, what
        self.pos = 0
        self.resumes = 0
        self.f: Optional[ClosingReader] = None
        self._open()

    def _open(self) -> None:
        f, start = self.client.open_blob(self.repo, self.digest, offset=self.pos, what=self.what, size=self.size)
        skip = self.pos - start  # the registry sent the blob from its start: drop what was read already
        while skip > 0:
            chunk = f.read(min(CHUNK, skip))
            if not chunk:
                f.close()
                raise http.client.IncompleteRead(b"")
            skip -= len(chunk)
        self.f = f

    def _resume(self, why: str) -> None:
        self.resumes += 1
        if self.f is not None:
            with contextlib.suppress(Exception):
                self.f.close()
            self.f = None
        if self.resumes > RESUMES:
            raise RegistryError(
                f"{self.what}: expected the whole blob ({self.size} bytes), "
                f"found the download cut {self.resumes} times (last at byte {self.pos}: {why})",
                hint="check the network path to the registry (proxy, tunnel) and run the export again")
        self.client.log(f"{self.what}: download cut at byte {self.pos} ({why}); resuming")
        try:
            self._open()
        except (OSError, http.client.HTTPException) as e:
            self._resume(f"{type(e).__name__}: {e}")

    def read(self, n: int = -1) -> bytes:
        """At most the descriptor's size: a byte past it is refused (an endless body stops here)."""
        if self.pos >= self.size:
            self._refuse_more()
            return b""
        want = min(n if n is not None and n > 0 else CHUNK, self.size - self.pos)
        while True:
            try:
                data = self.f.read(want) if self.f is not None else b""
            except (OSError, http.client.HTTPException) as e:
                self._resume(f"{type(e).__name__}: {e}")
                continue
            if data:
                self.pos += len(data)
                return data
            self._resume("the connection ended early")

    def _refuse_more(self) -> None:
        try:
            extra = self.f.read(1) if self.f is not None else b""
        except (OSError, http.client.HTTPException):
            extra = b""  # the answer ends (or breaks) where the blob does: what was read is checked
        if extra:
            self.close()
            raise LimitExceeded(f"{self.what}: expected {self.size} bytes (the size its descriptor declares), "
                                "found more", hint="the registry sends more than the image's manifest declares; "
                                "do not trust this registry")

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def _list(doc: JsonObject, key: str, digest: str) -> List[object]:
    return list_of(doc, key, f"reading the manifest {digest[:19]}",
                   hint="the registry answered with a damaged manifest; do not trust this registry")


class RegistrySource(SourceBase):
    """Images in one or more registries (one client per registry host)."""

    kind = "registry"
    carries_attached = True  # cosign-tagged signatures, attestations, SBOMs and referrers

    def __init__(self, refs: Sequence[str] = (), *, access: Optional[RegistryAccess] = None) -> None:
        self.access = access or RegistryAccess()
        #: the registries the references name (checked before anything is read)
        self.hosts = sorted({parse_registry_ref(r).host for r in refs})
        self.clients: Dict[str, RegistryClient] = {}
        self.where = "the registry"
        self._targets: Dict[str, Tuple[RegistryRef, Descriptor]] = {}
        self._manifests: Dict[str, bytes] = {}  # digest -> exact bytes (manifests and indexes)
        self._sizes: Dict[str, int] = {}  # blob digest -> size its descriptor gives
        self._depth: Dict[str, int] = {}  # manifest digest -> levels below the reference's (0)

    def client(self, host_name: str) -> RegistryClient:
        if host_name not in self.clients:
            client = RegistryClient(RegistryTarget(host_name), access=self.access)
            client.ping()
            self.clients[host_name] = client
        return self.clients[host_name]

    def close(self) -> None:
        """Every registry connection closed (bundle/export.py calls it however the export ends)."""
        for client in self.clients.values():
            client.close()
        self.clients.clear()

    def info(self) -> SourceInfo:
        """The registries, each asked ``GET /v2/`` (plain HTTP or HTTPS, the login it wants)."""
        return SourceInfo("registry", {"registries": self.hosts,
                                       "schemes": {h: self.client(h).scheme for h in self.hosts}})

    # === references
    def _target(self, text: str) -> Tuple[RegistryRef, Descriptor]:
        """The reference's manifest (or index) descriptor, its bytes kept."""
        if text not in self._targets:
            ref = parse_registry_ref(text)
            client = self.client(ref.host)
            what = f"exporting docker://{text}"
            got = client.get_manifest(ref.repo, ref.reference, MAX_DOCUMENT)
            if got is None:
                raise ImageNotFound(f"{what}: expected {ref} in the registry, found none (HTTP 404)",
                                    hint="check the name and tag (skopeo list-tags docker://HOST/REPO)")
            raw, media_type, _header = got
            digest = str(Digest.of_bytes(raw))
            if ref.digest and digest != ref.digest:
                raise SourceError(f"{what}: expected the manifest to hash to {ref.digest}, found {digest}",
                                  hint="the registry answered with other bytes; do not trust this registry")
            self._keep_manifest(digest, raw)
            self._targets[text] = (ref, Descriptor(media_type.split(";")[0].strip(), Digest.parse(digest), len(raw)))
        return self._targets[text]

    def _keep_manifest(self, digest: str, raw: bytes) -> None:
        self._manifests[digest] = raw
        value = load_json(raw, f"the manifest {digest[:19]}")
        doc = as_object(value)
        if doc is None:
            raise SourceError(f"reading the manifest {digest[:19]}: expected a JSON object, found {kind_of(value)}",
                              hint="the registry answered with something that is not an image; check the reference")
        layers, manifests = _list(doc, "layers", digest), _list(doc, "manifests", digest)
        # the sizes their descriptors declare (a damaged descriptor is named when blobcopy reads it)
        for desc in [Descriptor.of(v) for v in [doc.get("config"), *layers, *manifests]]:
            if desc is not None and desc.size is not None:
                self._sizes[str(desc.digest)] = desc.size
        depth = self._depth.setdefault(digest, 0)
        for desc in [Descriptor.of(v) for v in manifests]:
            if desc is not None:
                self._manifests.setdefault(str(desc.digest), b"")  # fetched from /manifests/ when read
                self._depth.setdefault(str(desc.digest), depth + 1)

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        sizes: Dict[str, int] = {}
        notes: List[str] = []
        for text in refs:
            ref, target = self._target(text)
            add_layer_sizes(manifests_for(self.repository_blobs(ref), target, selection.platform, selection.choice,
                                          f"exporting docker://{text}", strict=selection.platform_given,
                                          notes=notes), sizes)
        return CheckedRefs(sum(sizes.values()), tuple(notes))

    # === blobs of one reference's repository (no cursor: the reference is passed along)
    def repository_blobs(self, ref: RegistryRef) -> RepositoryBlobs:
        """The BlobProvider of ``ref``'s repository (an image is read through it)."""
        return RepositoryBlobs(self, ref)

    @contextlib.contextmanager
    def open_blob(self, ref: RegistryRef, digest: str, what: str) -> Iterator[Readable]:
        client = self.client(ref.host)
        if digest in self._manifests:  # a manifest or an index: from /manifests/, bytes kept
            raw = self._manifests[digest]
            if not raw:
                if self._depth.get(digest, 0) > MAX_INDEX_DEPTH:
                    raise LimitExceeded(f"{what}: expected indexes nested at most {MAX_INDEX_DEPTH} levels deep, "
                                        "found deeper", hint="the registry serves indexes that name indexes without "
                                        "end; do not trust this registry")
                got = client.get_manifest(ref.repo, digest, MAX_DOCUMENT)
                if got is None:
                    raise SourceError(f"{what}: expected the manifest {digest[:19]} in {ref.host}/{ref.repo}, "
                                      "found none (HTTP 404)", hint="the index names a manifest the registry lacks")
                raw = got[0]
                self._keep_manifest(digest, raw)
            yield io.BytesIO(raw)
            return
        size = self._sizes.get(digest)
        if size is None:
            raise SourceError(f"{what}: expected a size for the blob {digest[:19]} in its descriptor, found none",
                              hint="the image's manifest is incomplete; a blob is read only up to its declared size")
        blob = _ResumingBlob(client, ref.repo, Digest.parse(digest, what=what), size, what)
        try:
            yield blob
        finally:
            blob.close()

    # === what an export carries
    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        by_target: Dict[str, Tuple[str, ...]] = {}
        for text in refs:  # one image per manifest digest, all its requested names
            ref, target = self._target(text)
            names = (ref.name,) if ref.tag else ()
            by_target[str(target.digest)] = (*by_target.get(str(target.digest), ()), *names)
        images: List[Resolved] = []
        for text in refs:
            ref, target = self._target(text)
            if str(target.digest) not in by_target:
                continue
            images.append(resolve_target(self.repository_blobs(ref), target, text, by_target.pop(str(target.digest)),
                                         platform=selection.platform, choice=selection.choice,
                                         what=f"exporting docker://{text}"))
        return images

    def blobs(self, image: ResolvedImage) -> BlobProvider:
        """The blobs of the image's repository (the reference is looked up again: no cursor)."""
        return self.repository_blobs(self._target(image.ref)[0])

    def attached(self, image: ResolvedImage) -> Optional[Attached]:
        """What the registry attached to the image's manifests (and index) (bundle/sources/attached.py);
        the index the platform was picked from, when the reference names one."""
        ref, target = self._target(image.ref)
        raw_target = self._manifests.get(str(target.digest)) or b""
        picked = (raw_target, target.media_type) if raw_target and b'"manifests"' in raw_target and \
            Digest.of_bytes(raw_target) == target.digest else None
        return Attached(RegistryArtifacts(self.client(ref.host), ref.host, ref.repo), picked)
