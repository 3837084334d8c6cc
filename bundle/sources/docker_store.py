"""Docker's classic image store read as dockerd reads it for ``docker save`` (issue 44).

Docker 20.10 writes every layer of ``docker save`` into a temp folder of its own before it sends
the first byte, so an export through the stream cannot overlap the engine's work. Where the
exporter runs as root beside a local daemon (a unix socket) whose graph driver is overlay2, each
layer's tar is rebuilt here exactly as dockerd rebuilds it (moby v20.10 ``layer/layer_store.go``
``assembleTarTo``, vbatts/tar-split ``asm.WriteOutputTarStream``):

- ``DockerRootDir/image/overlay2/imagedb/content/sha256/<image ID hex>`` is the image config,
  byte for byte (its digest is the image ID);
- ``DockerRootDir/image/overlay2/layerdb/sha256/<chain ID hex>/`` holds ``diff`` (the diff_id),
  ``cache-id`` (the layer's folder under ``DockerRootDir/overlay2``) and ``tar-split.json.gz``:
  gzip of one JSON entry a line, in the tar's order: type 2 (a segment: the raw bytes of headers
  and padding, base64 in ``payload``) or type 1 (a file: ``name``, or ``name_raw`` in base64,
  ``size``, and the CRC-64 of its content in ``payload``);
- a file's content is read from ``DockerRootDir/overlay2/<cache-id>/diff/<name>`` (dockerd reads
  the layer's mount, where a file the layer's tar holds is the one in its own ``diff`` folder).

Writing each segment, and the ``size`` bytes of each file of a non-zero size, in order gives the
layer's tar as ``docker save`` sends it, which must hash to the diff_id: every layer is checked
while it is read (the hash ``BlobStore.write_layer`` computes anyway), and anything that does not
match (a file of another size or type, a name outside the layer, an entry not understood, a
diff_id that differs) is a :class:`StoreMismatch`: the caller falls back to ``docker save`` for
that image or, forced (``--docker-read store``), fails. Nothing here is trusted beyond what the
hashes prove: the config must hash to the image ID and name the diff_ids the engine reports, and
each tar to its diff_id."""

from __future__ import annotations

import binascii
import gzip
import json
import os
import posixpath
import re
import stat
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Generator, Iterator, List, Optional, Protocol, Sequence, Tuple, Union

from bundle.sources import SourceImage, order_refs, platform_of
from bundle.sources.protocol import LayerFeed, LayerMismatch, LayerRefused, Stored, StreamedLayer
from bundle.sources.records import as_object, load_json
from importer.engines import EngineImage
from importer.engines.dockerapi import api_call, api_failed, socket_path
from importer.engines.dockerclient import DockerClient
from importer.errors import BundleError, SourceError
from importer.format.digest import CHUNK, Digest, is_digest
from importer.format.limits import MAX_CONFIG
from importer.format.manifest import LayerRecord
from importer.format.refs import familiar, normalize, split_ref
from importer.streams.commands import run

#: ``bundle export --docker-read``: auto (the store where this host can read it, else ``docker save``),
#: store (the store, or fail), save (``docker save`` only)
READ_CHOICES = ("auto", "store", "save")
#: the graph drivers whose layers are read here (vfs, btrfs, zfs...: ``docker save``)
STORE_DRIVERS = ("overlay2",)
#: the last Docker major whose ``docker save`` is the classic layout alone (25+ adds OCI manifests
#: to it, which the store does not keep: their images go through ``docker save``)
LAST_CLASSIC_SAVE = 24
#: the longest tar-split line read (a segment holds a tar header or the archive's end, kilobytes)
MAX_ENTRY = 16 * 1024 * 1024
#: tar-split's entry types (vbatts/tar-split ``tar/storage/entry.go``: FileType = 1, SegmentType = 2)
FILE_ENTRY, SEGMENT_ENTRY = 1, 2
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def say(line: str) -> None:
    """One line on stderr: which way a Docker image is read, and why."""
    sys.stderr.write(f"docker: {line}\n")
    sys.stderr.flush()


class StoreMismatch(LayerRefused):
    """What the store holds does not reproduce the image (or cannot be read): one line saying why."""


@dataclass(frozen=True)
class StoreLayer:
    """One layer as the store keeps it."""

    diff_id: Digest
    chain_id: str  # hex
    tar_split: str  # path of tar-split.json.gz
    diff_dir: str  # the overlay2 folder its files are read from
    size: int = 0  # the content's size as the store records it (the largest layers are read first)


@dataclass(frozen=True)
class StoreImage:
    """One image as the store keeps it: the config byte for byte and its layers, in order."""

    image_id: Digest
    raw_config: bytes
    config: object
    layers: Tuple[StoreLayer, ...]


def chain_ids(diff_ids: Sequence[Digest]) -> List[str]:
    """The layers' chain IDs (hex): ChainID(L1) = DiffID(L1), ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln))."""
    out: List[str] = []
    chain: Optional[Digest] = None
    for diff_id in diff_ids:
        chain = diff_id if chain is None else Digest.of_bytes(f"{chain} {diff_id}".encode())
        out.append(chain.hex)
    return out


def _read_small(path: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise StoreMismatch(f"{path} cannot be read ({e.strerror or e})") from e
    if len(data) > limit:
        raise StoreMismatch(f"{path} is larger than expected ({limit} bytes at most)")
    return data


class ClassicStore:
    """Docker's classic image store under ``data_root`` for ``driver`` (overlay2)."""

    def __init__(self, data_root: str, driver: str) -> None:
        self.data_root = data_root
        self.driver = driver
        image_dir = os.path.join(data_root, "image", driver)
        self.layerdb = os.path.join(image_dir, "layerdb", "sha256")
        self.content = os.path.join(image_dir, "imagedb", "content", "sha256")
        self.layers_dir = os.path.join(data_root, driver)

    def readable(self) -> Optional[str]:
        """None when the store's folders can be read here, else why not (one phrase)."""
        if self.driver not in STORE_DRIVERS:
            return f"its storage driver is {self.driver or 'unknown'} (read here: {', '.join(STORE_DRIVERS)})"
        for path in (self.layerdb, self.content, self.layers_dir):
            if not os.path.isdir(path) or not os.access(path, os.R_OK | os.X_OK):
                return f"{path} cannot be read from this host"
        return None

    def image(self, image_id: Digest, diff_ids: Sequence[str]) -> StoreImage:
        """The image ``image_id`` (whose layers the engine reports as ``diff_ids``) as the store
        keeps it, every link between its files checked; StoreMismatch otherwise."""
        raw_config = _read_small(os.path.join(self.content, image_id.hex), MAX_CONFIG)
        if Digest.of_bytes(raw_config) != image_id:
            raise StoreMismatch(f"the image config in the store does not hash to the image ID {image_id}")
        try:
            config = load_json(raw_config, "the image config")
        except BundleError as e:
            raise StoreMismatch(f"the image config in the store is not JSON ({e.message})") from e
        rootfs = as_object((as_object(config) or {}).get("rootfs"))
        listed = rootfs.get("diff_ids") if rootfs is not None else None
        if not isinstance(listed, list) or not all(isinstance(d, str) and is_digest(d) for d in listed):
            raise StoreMismatch("the image config names no list of sha256 diff_ids")
        if list(listed) != list(diff_ids):
            raise StoreMismatch("the image config's diff_ids differ from those the engine reports")
        if not listed:
            raise StoreMismatch("the image has no layers")
        digests = [Digest.parse(d) for d in listed]
        layers = []
        for diff_id, chain in zip(digests, chain_ids(digests)):
            folder = os.path.join(self.layerdb, chain)
            stored = _read_small(os.path.join(folder, "diff"), 256).decode("ascii", "replace").strip()
            if stored != str(diff_id):
                raise StoreMismatch(f"layer {chain[:12]} of the store records diff_id {stored[:80]!r}, "
                                    f"not {diff_id}")
            cache_id = _read_small(os.path.join(folder, "cache-id"), 256).decode("ascii", "replace").strip()
            if not cache_id or not all(c.isalnum() or c in "-_." for c in cache_id) or cache_id.startswith("."):
                raise StoreMismatch(f"layer {chain[:12]} of the store names an unexpected folder {cache_id[:80]!r}")
            diff_dir = os.path.join(self.layers_dir, cache_id, "diff")
            tar_split = os.path.join(folder, "tar-split.json.gz")
            if not os.path.isfile(tar_split):
                raise StoreMismatch(f"layer {chain[:12]} of the store has no tar-split.json.gz")
            if not os.path.isdir(diff_dir):
                raise StoreMismatch(f"layer {chain[:12]} of the store has no folder {diff_dir}")
            try:
                size = int(_read_small(os.path.join(folder, "size"), 32).strip() or b"0")
            except (StoreMismatch, ValueError):
                size = 0  # only orders the reads
            layers.append(StoreLayer(diff_id, chain, tar_split, diff_dir, size))
        return StoreImage(image_id, raw_config, config, tuple(layers))


class LayerTar:
    """A layer's tar rebuilt from its tar-split and its diff folder, read forward like a file:
    ``read(n)`` returns up to ``n`` bytes (small segments and files joined, a large file in pieces
    of at most ``n``), b"" at the end. Raises StoreMismatch when the store does not match."""

    def __init__(self, layer: StoreLayer) -> None:
        self.layer = layer
        self._meta: Optional[gzip.GzipFile] = None
        self._root = -1
        try:
            self._meta = gzip.open(layer.tar_split, "rb")  # noqa: SIM115 - closed by close(), as the reader is
            self._root = os.open(layer.diff_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            self.close()
            raise StoreMismatch(f"layer {layer.chain_id[:12]} cannot be opened ({e.strerror or e})") from e
        self._pieces = self._generate()
        self._left = b""  # what the last piece held beyond the last read
        self.entries = 0

    def __enter__(self) -> LayerTar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()
            self._meta = None
        if self._root >= 0:
            os.close(self._root)
            self._root = -1

    def readable(self) -> bool:
        return True

    def read(self, n: Optional[int] = -1) -> bytes:
        want = CHUNK if n is None or n < 0 else n
        if want == 0:
            return b""
        parts: List[bytes] = []
        got = 0
        while got < want:
            piece = self._left or next(self._pieces, b"")
            self._left = b""
            if not piece:
                break
            if got + len(piece) > want:
                piece, self._left = piece[:want - got], piece[want - got:]
            parts.append(piece)
            got += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _mismatch(self, what: str) -> StoreMismatch:
        return StoreMismatch(f"layer {self.layer.chain_id[:12]}, tar-split entry {self.entries}: {what}")

    def _entries(self) -> Iterator[Dict[str, object]]:
        meta = self._meta
        assert meta is not None
        while True:
            try:
                line = meta.readline(MAX_ENTRY + 1)
            except (OSError, EOFError, zlib.error) as e:
                raise self._mismatch(f"tar-split.json.gz cannot be read ({e})") from e
            if not line:
                return
            if len(line) > MAX_ENTRY:
                raise self._mismatch(f"an entry longer than {MAX_ENTRY} bytes")
            if not line.strip():
                continue
            self.entries += 1
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise self._mismatch("not JSON") from e
            if not isinstance(entry, dict):
                raise self._mismatch("not a JSON object")
            yield entry

    def _payload(self, entry: Dict[str, object]) -> bytes:
        payload = entry.get("payload")
        if payload is None:
            return b""
        if not isinstance(payload, str):
            raise self._mismatch("a payload that is not base64 text")
        try:
            return binascii.a2b_base64(payload, strict_mode=True)
        except (binascii.Error, ValueError) as e:
            raise self._mismatch("a payload that is not base64") from e

    def _name(self, entry: Dict[str, object]) -> bytes:
        raw = entry.get("name_raw")
        if isinstance(raw, str) and raw:
            try:
                return binascii.a2b_base64(raw, strict_mode=True)
            except (binascii.Error, ValueError) as e:
                raise self._mismatch("a name_raw that is not base64") from e
        name = entry.get("name", "")
        if not isinstance(name, str):
            raise self._mismatch("a name that is not text")
        return name.encode("utf-8", "surrogateescape")

    def _generate(self) -> Iterator[bytes]:
        seen: set[bytes] = set()
        for entry in self._entries():
            kind = entry.get("type")
            if kind == SEGMENT_ENTRY:
                data = self._payload(entry)
                if data:
                    yield data
                continue
            if kind != FILE_ENTRY:
                raise self._mismatch(f"an entry of type {kind!r} (expected 1, a file, or 2, a segment)")
            name = self._name(entry)
            clean = posixpath.normpath(name) if name else b"."
            if clean in seen:  # tar-split's unpacker refuses a name twice (ErrDuplicatePath)
                raise self._mismatch(f"the name {clean!r} twice")
            seen.add(clean)
            size = entry.get("size", 0)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise self._mismatch(f"a size that is not a count of bytes ({size!r})")
            if size == 0:  # directories, links, whiteouts, empty files: their headers are the segments
                continue
            yield from self._file(clean.lstrip(b"/") or b".", size)

    def _file(self, rel: bytes, size: int) -> Iterator[bytes]:
        if rel == b"." or rel == b".." or rel.startswith(b"../"):
            raise self._mismatch(f"a file {rel!r} outside the layer's folder")
        try:
            st = os.stat(rel, dir_fd=self._root, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise self._mismatch(f"{rel!r} is not a regular file in {self.layer.diff_dir}")
            if st.st_size != size:
                raise self._mismatch(f"{rel!r} holds {st.st_size} bytes in {self.layer.diff_dir}, the tar {size}")
            fd = os.open(rel, _OPEN_FLAGS, dir_fd=self._root)
        except OSError as e:
            raise self._mismatch(f"{rel!r} cannot be read in {self.layer.diff_dir} ({e.strerror or e})") from e
        try:
            left = size
            while left > 0:
                try:
                    data = os.read(fd, min(left, CHUNK))
                except OSError as e:
                    raise self._mismatch(f"{rel!r} cannot be read in {self.layer.diff_dir} ({e.strerror or e})") from e
                if not data:
                    raise self._mismatch(f"{rel!r} ended {left} bytes early in {self.layer.diff_dir}")
                left -= len(data)
                yield data
        finally:
            os.close(fd)


@dataclass(frozen=True)
class StoreEngine:
    """What ``docker info`` said of the engine: its data root, graph driver and version."""

    data_root: Optional[str]
    driver: str
    version: str


class SaveFn(Protocol):
    """``DockerDaemonSource.save``: the images ``refs`` name, read from ``docker save``."""

    def __call__(self, refs: Sequence[str]) -> LayerFeed: ...


@dataclass
class _Group:
    """One image of the export: the names ``docker save`` of the refs gives it, in its order."""

    image_id: str
    diff_ids: List[str]
    names: List[str] = field(default_factory=list)

    def save_refs(self) -> List[str]:
        """What ``docker save`` is given for this image alone: its names, else its ID."""
        return list(self.names) or [self.image_id]

    def label(self) -> str:
        return ", ".join(order_refs(self.names)) or self.image_id[:19]


_ID_RE = re.compile(r"sha256:[0-9a-f]{1,64}|[0-9a-f]{64}")
_Result = Union[LayerRecord, StoreMismatch]


class _SaveAll(Exception):
    """The whole export goes through ``docker save`` (the reason)."""


class ClassicStoreReader:
    """``bundle export`` of Docker's classic store: each image read from the store where it
    matches (:class:`ClassicStore`, the layers a few at a time), else through ``docker save``
    (``forced``: a SourceError instead), with one line on stderr for each image saying which."""

    def __init__(self, docker: DockerClient, engine: StoreEngine, forced: bool, save: SaveFn) -> None:
        self.docker = docker
        self.engine = engine
        self.forced = forced
        self.save = save
        self.client = DockerClient(docker.host, api=True)  # the API on the socket for inspect

    def unusable(self) -> Optional[str]:
        """Why the store cannot be read here (one phrase), or None."""
        host = self.docker.host
        if host and not host.startswith("unix://"):
            return f"the engine at {host} is not on this host"
        if not self.engine.data_root:
            return "the engine reports no data root"
        if os.geteuid() != 0:
            return "the store's files are root's and this export does not run as root"
        major = self.engine.version.split(".", 1)[0]
        if not major.isdigit():
            return f"the engine's version {self.engine.version!r} is not one this reader knows"
        if int(major) > LAST_CLASSIC_SAVE:
            return (f"Docker {self.engine.version}'s `docker save` also carries OCI manifests, which the store "
                    "does not keep")
        return ClassicStore(self.engine.data_root, self.engine.driver).readable()

    def feed(self, refs: Sequence[str]) -> LayerFeed:
        """The images ``refs`` name, their layers sent to the export loop a few at a time (each
        checked there against its diff_id; the layers the offline host holds hashed, not written)."""
        try:
            why = self.unusable()
            if why is not None:
                raise _SaveAll(why)
            try:
                groups = self._groups(refs)
            except BundleError as e:  # the engine's answers (inspect, list) failed: `docker save` says why
                raise _SaveAll(f"looking the images up failed ({e.message})") from e
        except _SaveAll as e:
            self._refuse(", ".join(refs), str(e))
            say(f"reading {', '.join(refs)} through `docker save`: {e}")
            return (yield from self.save(refs))
        assert self.engine.data_root is not None
        classic = ClassicStore(self.engine.data_root, self.engine.driver)
        plans: Dict[str, StoreImage] = {}
        failed: Dict[str, str] = {}
        for image_id, group in groups.items():
            try:
                plans[image_id] = classic.image(Digest.parse(image_id), group.diff_ids)
            except StoreMismatch as e:
                self._refuse(group.label(), str(e))
                failed[image_id] = str(e)
                continue
            say(f"reading {group.label()} from Docker's image store ({classic.driver} in {classic.data_root}, "
                f"{len(plans[image_id].layers)} layer(s)), not through `docker save`")
        done = yield from self._read(plans)
        images: List[SourceImage] = []
        for image_id, plan in plans.items():
            group = groups[image_id]
            bad = next((r for r in (done[str(layer.diff_id)] for layer in plan.layers)
                        if isinstance(r, StoreMismatch)), None)
            if bad is not None:
                self._refuse(group.label(), str(bad))
                failed[image_id] = str(bad)
                continue
            layers = []
            for layer in plan.layers:
                got = done[str(layer.diff_id)]
                assert not isinstance(got, StoreMismatch)
                layers.append(got)
            images.append(SourceImage(refs=order_refs(group.names), raw_config=plan.raw_config, layers=tuple(layers),
                                      platform=platform_of(plan.config), read="store"))
        for image_id, reason in failed.items():
            group = groups[image_id]
            say(f"reading {group.label()} through `docker save`: {reason}")
            images += yield from self.save(group.save_refs())
        return images

    def _refuse(self, what: str, reason: str) -> None:
        """``--docker-read store``: a SourceError saying why the store cannot give ``what``."""
        if self.forced:
            raise SourceError(f"exporting {what} with --docker-read store: expected Docker's image store to "
                              f"reproduce the image, found it cannot: {reason}",
                              hint="drop --docker-read store: auto reads `docker save` where the store does "
                              "not match (a damaged or changed store: rebuild or re-pull the image)")

    def _groups(self, refs: Sequence[str]) -> Dict[str, _Group]:
        """Each image the refs name, with the names ``docker save`` of the refs gives it (moby
        v20.10 ``image/tarexport/save.go`` ``parseNames``): a tagged name its tag, an ID or a
        digest none, a repository without a tag every tag and digest of it (sorted as the engine's
        reference store sorts them)."""
        groups: Dict[str, _Group] = {}

        def group(image_id: str, found: Optional[EngineImage] = None) -> _Group:
            if image_id not in groups:
                found = found or self.client.inspect(image_id)
                if found is None or found.image_id != image_id:
                    raise _SaveAll(f"image {image_id[:19]} vanished while it was looked up")
                groups[image_id] = _Group(image_id, list(found.diff_ids))
            return groups[image_id]

        def name(image_id: str, short: str, found: Optional[EngineImage] = None) -> None:
            named = group(image_id, found)
            if short not in named.names:
                named.names.append(short)

        listing: Optional[List[Tuple[str, str]]] = None
        for ref in refs:
            found = self.client.inspect(ref)
            if found is None:
                raise _SaveAll(f"{ref} was not found in the engine")
            repo, tag, digest = split_ref(ref)
            if _ID_RE.fullmatch(ref) or digest:  # an image ID, or NAME@DIGEST: no name
                group(found.image_id, found)
            elif tag:
                name(found.image_id, familiar(normalize(ref)), found)
            else:
                if listing is None:
                    listing = self._references()
                full_repo = split_ref(normalize(repo))[0]
                assocs = sorted((full, image_id) for full, image_id in listing if split_ref(full)[0] == full_repo)
                if not assocs:  # no reference of that name: an ID prefix (the engine's search)
                    group(found.image_id, found)
                for full, image_id in assocs:
                    if split_ref(full)[2]:  # a digest: the image, no name
                        group(image_id, found if image_id == found.image_id else None)
                    else:
                        name(image_id, familiar(full), found if image_id == found.image_id else None)
        return groups

    def _references(self) -> List[Tuple[str, str]]:
        """(reference in full, image ID) for every tag and digest the engine holds."""
        out: List[Tuple[str, str]] = []
        what = "listing Docker's images"
        path = socket_path(self.docker.host)
        if path is not None:
            status, raw = api_call(path, "GET", "/images/json", what=what, limit=64 * 1024 * 1024)
            if status != 200:
                raise api_failed("GET", "/images/json", status, raw, what=what)
            try:
                rows: object = json.loads(raw.decode("utf-8", "replace"))
            except ValueError as e:
                raise _SaveAll("the engine's image list is not JSON") from e
            for row in rows if isinstance(rows, list) else []:
                if not isinstance(row, dict) or not isinstance(row.get("Id"), str):
                    continue
                for key in ("RepoTags", "RepoDigests"):
                    for ref in row.get(key) or []:
                        if isinstance(ref, str) and not ref.startswith("<none>"):
                            out.append((normalize(ref), row["Id"]))
            return out
        res = run(self.docker.argv("image", "ls", "--no-trunc", "--digests", "--format", "{{json .}}"),
                  what=what, timeout=120)
        for line in res.stdout.decode("utf-8", "replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            repo, tag, digest, image_id = (row.get(k) for k in ("Repository", "Tag", "Digest", "ID"))
            if not isinstance(repo, str) or repo == "<none>" or not isinstance(image_id, str):
                continue
            if isinstance(tag, str) and tag != "<none>":
                out.append((normalize(f"{repo}:{tag}"), image_id))
            if isinstance(digest, str) and digest != "<none>":
                out.append((normalize(f"{repo}@{digest}"), image_id))
        return out

    def _read(self, plans: Dict[str, StoreImage]) -> Generator[Union[StreamedLayer, List[StreamedLayer]],
                                                                 Union[Stored, List[Stored]], Dict[str, _Result]]:
        """Every distinct layer of ``plans`` read once by the export loop, a few at a time (the
        largest first): its LayerRecord (carried, or left out where the offline host holds it), or
        the StoreMismatch it met."""
        jobs: Dict[str, StoreLayer] = {}
        for plan in plans.values():
            for layer in plan.layers:
                jobs.setdefault(str(layer.diff_id), layer)
        ordered = sorted(jobs.items(), key=lambda job: -job[1].size)
        sent = yield [StreamedLayer(f"layer {layer.chain_id[:12]}", _opener(layer), expected=layer.diff_id)
                      for _, layer in ordered]
        if not isinstance(sent, list) or len(sent) != len(ordered):
            raise SourceError(f"reading Docker's image store: expected {len(ordered)} layers back from the export, "
                              "found otherwise")
        return {key: _result(layer, got) for (key, layer), got in zip(ordered, sent)}


def _opener(layer: StoreLayer) -> Callable[[], LayerTar]:
    return lambda: LayerTar(layer)


def _result(layer: StoreLayer, got: Stored) -> _Result:
    """A layer the loop stored, or why the store did not give it."""
    if not isinstance(got, LayerMismatch):
        return got
    if got.found is None:
        return StoreMismatch(got.reason)
    if got.measured:
        return StoreMismatch(f"layer {layer.chain_id[:12]} reads as {got.found}, not its diff_id {layer.diff_id}")
    return StoreMismatch(f"layer {layer.chain_id[:12]} reads as {got.found}, not its diff_id {layer.diff_id} "
                         f"(a file in {layer.diff_dir} changed)")
