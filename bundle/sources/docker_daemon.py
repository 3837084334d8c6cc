"""``docker-daemon:`` source: one streamed ``docker save`` of all requested images.

Both layouts are parsed from the same sequential read: the classic one (``<id>/layer.tar``,
``<config-hex>.json``, ``manifest.json``; Docker < 25) and the Docker 25+ one (an OCI layout
whose ``blobs/sha256/<hex>`` hold uncompressed layers and JSON, plus the legacy
``manifest.json`` pointing into ``blobs/``). Members arrive in lexical order, so layers come
before the manifest that names them: each layer is compressed into the blob store as it passes,
and the mapping is made at the end. Nothing uncompressed is written to disk; no layer is held
in memory.

Docker's containerd image store (Docker 25+ with the containerd snapshotter, ``docker info``
``DriverStatus`` ``driver-type io.containerd.snapshotter.v1``) keeps each layer compressed as it
was built or pulled and names the image by its manifest digest. There the layers are carried as
the engine keeps them (no recompression) and the manifest byte for byte, so the bundle's manifest
digest is the image ID the build host shows: read straight from the engine's own content store
(``DockerRootDir/containerd/daemon/io.containerd.content.v1.content``) where this host can read it
(plain file reads, no ``save`` stream), else from the ``docker save`` stream, whose blobs are the
stored ones (``SNEAKERNET_DOCKER_CONTENT_STORE=0`` forces the stream).

Docker's classic store is read without ``docker save`` where this host can read it (root beside a
local engine, overlay2, Docker < 25): bundle/sources/docker_store.py rebuilds each layer's tar as
dockerd does and checks it against its diff_id; an image it cannot give exactly goes through the
stream. ``--docker-read`` (``read``) forces either way; each image records how it was read
(``SourceImage.read``) and a ``docker:`` line on stderr says it."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import json
import os
import posixpath
import re
import tarfile
from typing import Callable, ContextManager, Dict, Generator, Iterator, List, Optional, Sequence, Tuple, Union

from bundle.sources import ResolvedImage, SourceImage, SourceInfo, order_refs, platform_of
from bundle.sources.blobcopy import BlobProvider, keep_manifest, pick_manifest, resolve_platform, sniff_compression
from bundle.sources.docker_store import READ_CHOICES, ClassicStoreReader, StoreEngine, say
from bundle.sources.oci_layout import OciLayoutSource
from bundle.sources.protocol import (
    CheckedRefs,
    LayerFeed,
    Resolved,
    Selection,
    SourceBase,
    Stored,
    StreamedImages,
    StreamedLayer,
)
from bundle.sources.readahead import ReadAhead
from bundle.sources.records import Descriptor, as_object, json_object, list_of, load_json
from bundle.sources.tarstream import TarStream
from importer.engines.dockerapi import api_save, socket_path
from importer.engines.dockerclient import DockerClient
from importer.errors import BundleError, CommandFailed, ImageNotFound, SourceError, UsageError
from importer.format.digest import CHUNK, Digest, Readable
from importer.format.limits import MAX_CONFIG, MAX_DOCKER_SAVE_JSON, read_limited
from importer.format.manifest import LayerRecord
from importer.format.platform import host
from importer.format.refs import familiar, normalize
from importer.streams.commands import command_stdout, run
from importer.streams.readers import PrefixedReader

CONTENT_STORE_ENV = "SNEAKERNET_DOCKER_CONTENT_STORE"
#: where dockerd's managed containerd keeps its content store, under DockerRootDir
CONTENT_STORE_DIR = ("containerd", "daemon", "io.containerd.content.v1.content")
_ID_RE = re.compile(r"(sha256:)?[0-9a-f]{12,64}")


def _looks_like_tar(head: bytes) -> bool:
    if len(head) >= 262 and head[257:262] == b"ustar":
        return True
    return len(head) >= 512 and head[:512] == b"\0" * 512  # an empty layer


def _norm(name: str) -> str:
    name = posixpath.normpath(name.lstrip("/"))
    return name[2:] if name.startswith("./") else name


class DockerDaemonSource(SourceBase):
    """A Docker engine: one ``docker save`` stream, or its containerd content store."""

    kind = "docker-daemon"
    knows_sizes_ahead = False  # `docker image inspect`'s Size counts file contents, not the tar read
    writes_legacy_schemas = True  # schemas 1 and 2 are its `docker save` archive
    picks_platform_in_engine = True  # Docker exports the platform its engine runs

    def __init__(self, host: Optional[str] = None, read: str = "auto") -> None:
        if read not in READ_CHOICES:
            raise UsageError(f"exporting from Docker with --docker-read {read!r}: expected one of "
                             f"{', '.join(READ_CHOICES)}")
        self.docker = DockerClient(host)
        self.data_root: Optional[str] = None
        #: --docker-read: auto (the engine's store where this host can read it, else `docker save`),
        #: store (the store or fail), save (`docker save` only)
        self.read = read
        self.driver = ""
        self.version = ""
        #: Docker's containerd content store, where resolve() read the images from it
        self.content: Optional[_ContentStore] = None

    def info(self) -> SourceInfo:
        engine = self.docker.probe()
        self.data_root = engine.data_root
        self.driver = engine.storage_driver
        self.version = engine.version
        return SourceInfo("docker-daemon", {
            "engine": "docker",
            "engineVersion": engine.version,
            "storageDriver": engine.storage_driver,
            "imageStore": engine.image_store,
        })

    def check_refs(self, refs: Sequence[str], selection: Selection) -> CheckedRefs:
        """Fail early, naming the image, if one is missing; their total size as Docker counts it."""
        total = 0
        for ref in refs:
            res = run(self.docker.argv("image", "inspect", "--format", "{{.Size}}", ref),
                      what=f"looking up {ref}", check=False, timeout=120)
            if res.returncode != 0:
                raise ImageNotFound(
                    f"exporting {ref}: expected the image in Docker at {self.docker.host or 'the default socket'}, "
                    "found none",
                    context=res.stderr.strip() or None,
                    hint="check the name with `docker image ls`, or pass --docker-host",
                )
            with contextlib.suppress(ValueError):
                total += int(res.stdout.decode().strip() or 0)
        return CheckedRefs(total)

    def image_env(self, ref: str) -> Optional[List[str]]:
        """``Config.Env`` as ``docker image inspect`` shows it ([] when it cannot say)."""
        res = run(self.docker.argv("image", "inspect", "--format", "{{json .Config.Env}}", ref),
                  what=f"reading the env of {ref}", check=False, timeout=120)
        try:
            env: object = json.loads(res.stdout.decode("utf-8", "replace") or "null")
        except ValueError:
            return []
        return [e for e in env if isinstance(e, str)] if isinstance(env, list) else []

    def legacy_save_argv(self, refs: Sequence[str]) -> List[str]:
        if self.read == "store":
            raise UsageError("exporting with --schema 1 or 2 and --docker-read store: those schemas are a "
                             "`docker save` archive", hint="drop --docker-read store, or use --schema 3")
        return self.docker.argv("save", *refs)

    def resolve(self, refs: Sequence[str], selection: Selection) -> List[Resolved]:
        """The engine's containerd content store where this host can read it (each image resolved
        like an OCI layout's), else the classic store (rebuilt layer by layer, :meth:`stream`), else
        one ``docker save`` stream (:meth:`stream`); ``--docker-read`` forces a way."""
        self.content = None
        if self.docker.image_store == "containerd":
            content = self._content_store(refs) if self.read != "save" else None
            if content is not None:
                self.content = content
                return list(_resolve_content_store(content, refs))
            if self.read == "store":
                raise SourceError(f"exporting {', '.join(refs)} with --docker-read store: expected Docker's "
                                  "containerd content store readable on this host, found it is not",
                                  hint="run the export as root beside the engine, or drop --docker-read store "
                                  "(auto reads `docker save` where the store cannot be read)")
            say(f"reading {', '.join(refs)} through `docker save` ("
                + ("--docker-read save" if self.read == "save" else "Docker's containerd content store cannot be "
                   "read here") + ")")
        elif self.read != "save":
            return [StreamedImages(tuple(refs), read="store")]
        else:
            say(f"reading {', '.join(refs)} through `docker save` (--docker-read save)")
        return [StreamedImages(tuple(refs), read="save")]

    def blobs(self, image: ResolvedImage) -> BlobProvider:
        """The content store :meth:`resolve` read the image from."""
        if self.content is None:
            raise SourceError(f"{image.what}: expected Docker's containerd content store, found none")
        return self.content

    def stream(self, images: StreamedImages) -> LayerFeed:
        if images.read == "store":
            reader = ClassicStoreReader(self.docker, StoreEngine(self.data_root, self.driver, self.version),
                                        self.read == "store", self.save)
            return reader.feed(images.refs)
        return self.save(images.refs)

    def save(self, refs: Sequence[str]) -> LayerFeed:
        """The images ``refs`` name, read from one ``docker save`` stream."""
        what = f"streaming `docker save` of {', '.join(refs)}"
        path = socket_path(self.docker.host)  # the API over the socket: no docker CLI copying every byte
        opener = api_save(path, refs, what=what) if path else command_stdout(self.docker.argv("save", *refs),
                                                                            what=what)
        try:
            # read ahead by a thread: the engine's save goes on while the layers are hashed and written
            with opener as stream, ReadAhead(stream) as ahead:
                images = yield from read_docker_save(ahead)
                while ahead.read(CHUNK):  # drain trailing padding so docker exits 0
                    pass
        except CommandFailed as e:
            raise SourceError(
                f"exporting {', '.join(refs)}: `docker save` failed with status {e.returncode}",
                context=e.stderr_tail.strip() or None,
                hint="check that the engine is healthy and the images exist",
            ) from e
        except (http.client.HTTPException, ConnectionError) as e:
            raise SourceError(
                f"exporting {', '.join(refs)}: expected the whole `docker save` stream from the Docker API, "
                f"found it cut off ({type(e).__name__}: {e})",
                hint="check that the engine is healthy (its log says why it stopped) and export again",
            ) from e
        return [dataclasses.replace(image, read="save") for image in images]

    def _content_store(self, refs: Sequence[str]) -> Optional[_ContentStore]:
        """The engine's own content store when this host can read every blob the images need
        (a local daemon: the manifests, configs and layers are there under their digests), else
        None (read the ``docker save`` stream)."""
        if os.environ.get(CONTENT_STORE_ENV, "1") == "0" or not self.data_root:
            return None
        if self.docker.host and socket_path(self.docker.host) is None:
            return None  # tcp/ssh/a context: the daemon's data root is not on this host
        path = os.path.join(self.data_root, *CONTENT_STORE_DIR)
        if not os.access(os.path.join(path, "blobs", "sha256"), os.R_OK | os.X_OK):
            return None
        content = _ContentStore(path)
        try:
            for ref in refs:
                image_id, _ = content.target(self.docker, ref)
                manifest = pick_manifest(content, Descriptor("", Digest.parse(image_id)), host(),
                                         f"exporting {ref} from Docker's content store")
                if not all(content.has(d.digest) for d in [manifest.config, *manifest.layers]):
                    return None
        except BundleError:  # e.g. an index without this platform: the save stream says why
            return None
        return content


class _ContentStore(OciLayoutSource):
    """Docker's containerd content store (``blobs/sha256/<hex>``, like an OCI layout) as a blob provider."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.where = f"Docker's containerd content store {self.dir}"
        self.targets: Dict[str, Tuple[str, Tuple[str, ...]]] = {}

    def has(self, digest: Digest) -> bool:
        return os.path.isfile(os.path.join(self.dir, digest.blob_path))

    def target(self, docker: DockerClient, ref: str) -> Tuple[str, Tuple[str, ...]]:
        """(image ID = the target's digest, the name the bundle gives it) for ``ref``."""
        if ref not in self.targets:
            res = run(docker.argv("image", "inspect", "--format", "{{.Id}}", ref), what=f"looking up {ref}",
                      timeout=120)
            image_id = res.stdout.decode().strip()
            Digest.parse(image_id, what=f"the ID Docker reports for {ref}")
            bare = ref[len("sha256:"):] if ref.startswith("sha256:") else ref
            is_id = _ID_RE.fullmatch(ref) is not None and image_id[len("sha256:"):].startswith(bare)
            self.targets[ref] = (image_id, () if is_id else (familiar(normalize(ref)),))
        return self.targets[ref]


def _resolve_content_store(content: _ContentStore, refs: Sequence[str]) -> Iterator[ResolvedImage]:
    """Every image read from the content store: blobs as stored, the manifest kept."""
    by_id: Dict[str, Tuple[str, ...]] = {}
    first: Dict[str, str] = {}
    for ref in refs:  # one image per ID, all its requested names (looked up by _content_store)
        image_id, names = content.targets[ref]
        by_id[image_id] = order_refs([*by_id.get(image_id, ()), *names])
        first.setdefault(image_id, ref)
    for image_id, names in by_id.items():
        what = f"exporting {', '.join(names) or image_id[:19]} from {content.where}"
        target = Descriptor("", Digest.parse(image_id))
        manifest = pick_manifest(content, target, host(), what)
        yield ResolvedImage(first[image_id], names, target, what, (resolve_platform(content, manifest, what),),
                            read="content-store")


def read_docker_save(stream: Readable) -> LayerFeed:
    """Parse a ``docker save`` tar stream (classic or Docker 25+ layout) in one pass: each layer
    sent to the export loop as it passes (bundle/exportloop.py), the images made of the records it
    sends back once manifest.json is read (the loop then leaves out the layers the offline host holds)."""
    layers: Dict[str, LayerRecord] = {}  # member name -> stored layer
    docs: Dict[str, bytes] = {}  # member name -> small JSON bytes
    links: Dict[str, str] = {}  # member name -> target member name
    try:
        # headers parsed by tarfile, each member's data read straight from the stream's blocks
        for member, f in TarStream(stream).members():
            name = _norm(member.name)
            if member.issym():
                links[name] = _norm(posixpath.join(posixpath.dirname(name), member.linkname))
                continue
            if member.islnk():
                links[name] = _norm(member.linkname)
                continue
            if not member.isfile():
                continue
            top_json = "/" not in name and name.endswith(".json")
            label = f"reading the `docker save` stream: {name}"
            if name.endswith("/layer.tar"):
                layers[name] = _record((yield _member(label, f)))
            elif name.startswith("blobs/sha256/"):
                head = f.read(512)
                packed = sniff_compression(head)
                if packed is not None:  # Docker's containerd store: the layer as the engine keeps it
                    layers[name] = _record((yield _member(label, PrefixedReader(head, f), packed)))
                elif _looks_like_tar(head) or not head.lstrip().startswith(b"{"):
                    layers[name] = _record((yield _member(label, PrefixedReader(head, f))))
                else:
                    docs[name] = head + read_limited(f, MAX_DOCKER_SAVE_JSON - len(head), name)
            elif top_json:
                docs[name] = read_limited(f, MAX_DOCKER_SAVE_JSON, name)
    except tarfile.TarError as e:  # cut short, a member claiming more bytes than the stream holds, a bad header
        raise SourceError(f"reading the `docker save` stream: expected a whole tar archive, found it cut short or "
                          f"damaged ({e})",
                          hint="the engine stopped sending (its log says why); export again") from e
    if "manifest.json" not in docs:
        raise SourceError("reading the `docker save` stream: expected manifest.json, found none",
                          hint="the engine returned an incomplete archive; retry, or check `docker save` by hand")
    entries = load_json(docs["manifest.json"], "manifest.json of docker save")
    if not isinstance(entries, list):
        raise SourceError("reading manifest.json of docker save: expected a list, found something else")
    images = []
    for entry in entries:
        images.append((yield from _image_from_entry(entry, layers, docs, links)))
    return images


def _member(label: str, f: Readable, form: str = "tar") -> StreamedLayer:
    """A layer member of the stream, read by the loop where it stands (never opened again)."""
    return StreamedLayer(label, _opened(f), form)


def _opened(f: Readable) -> Callable[[], ContextManager[Readable]]:
    return lambda: contextlib.nullcontext(f)


def _record(sent: Union[Stored, List[Stored]]) -> LayerRecord:
    """What the loop sent back for a ``docker save`` layer: always its record (nothing is expected of it)."""
    if not isinstance(sent, LayerRecord):
        raise SourceError(f"reading the `docker save` stream: expected a stored layer, found {type(sent).__name__}")
    return sent


def _resolve(name: str, links: Dict[str, str]) -> str:
    seen = 0
    while name in links and seen < 16:
        name = links[name]
        seen += 1
    return name


def _image_from_entry(value: object, layers: Dict[str, LayerRecord], docs: Dict[str, bytes],
                      links: Dict[str, str]) -> Generator[StreamedLayer, Union[Stored, List[Stored]], SourceImage]:
    entry = as_object(value)
    config_member = entry.get("Config") if entry is not None else None
    if entry is None or not isinstance(config_member, str):
        raise SourceError("reading manifest.json of docker save: expected entries with Config, found otherwise")
    config_name = _resolve(_norm(config_member), links)
    raw_config = docs.get(config_name)
    if raw_config is None or len(raw_config) > MAX_CONFIG:
        raise SourceError(f"reading docker save: expected the config {config_name}, found none")
    want_hex = posixpath.basename(config_name).removesuffix(".json")
    digest = Digest.of_bytes(raw_config)
    if digest.hex != want_hex:
        raise SourceError(f"reading docker save: config {config_name} hashes to {digest}, not its name")
    records: List[LayerRecord] = []
    what = "reading manifest.json of docker save"
    for layer_name in list_of(entry, "Layers", what):
        key = _resolve(_norm(str(layer_name)), links)
        record = layers.get(key)
        if record is None and key in docs:  # a tiny layer sniffed as JSON: store it now
            tiny = StreamedLayer(f"reading docker save: {key}", _opened(io.BytesIO(docs[key])), counted=False)
            record = _record((yield tiny))
            layers[key] = record
        if record is None:
            raise SourceError(f"reading docker save: expected layer {layer_name}, found none in the stream")
        records.append(record)
    config = load_json(raw_config, config_name)
    rootfs = as_object((as_object(config) or {}).get("rootfs"))
    diff_ids = (rootfs.get("diff_ids") if rootfs is not None else None) or []
    got = [str(r.diff_id) for r in records]
    if diff_ids != got:
        raise SourceError(
            f"reading docker save of {entry.get('RepoTags')}: the layers' diff_ids differ from the config's",
            context=f"config: {diff_ids}\nstream: {got}",
            hint="the engine returned an inconsistent archive; retry the export",
        )
    refs: Tuple[str, ...] = order_refs([str(t) for t in list_of(entry, "RepoTags", what)])
    for raw_manifest in _manifests_naming(docs, digest):  # the engine's own manifest, when it fits byte for byte
        kept = keep_manifest(raw_manifest, raw_config, records)
        if kept is not None:
            return SourceImage(refs=refs, raw_config=raw_config, layers=kept[0], platform=platform_of(config),
                               raw_manifest=raw_manifest, manifest_media_type=kept[1], config_media_type=kept[2])
    return SourceImage(refs=refs, raw_config=raw_config, layers=tuple(records), platform=platform_of(config))


def _manifests_naming(docs: Dict[str, bytes], config: Digest) -> List[bytes]:
    """The image manifests among the stream's blobs (Docker 25+) whose config is ``config``."""
    out = []
    needle = str(config).encode()
    for name, raw in docs.items():
        if not name.startswith("blobs/sha256/") or needle not in raw:
            continue
        if Digest.of_bytes(raw).hex != posixpath.basename(name):
            continue
        with contextlib.suppress(BundleError):
            doc = json_object(load_json(raw, name), name)
            named = as_object(doc.get("config"))
            if named is not None and named.get("digest") == str(config):
                out.append(raw)
    return out
