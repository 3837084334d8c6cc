"""`bundle export` of Docker's classic store without `docker save` (issue 44, point 1): each layer's
tar rebuilt from its tar-split and its overlay2 diff folder, as dockerd rebuilds it, checked against
its diff_id; `docker save` where the store cannot be read (a remote engine, another graph driver,
not root) or does not match. The bundle is the same byte for byte either way."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundle.sources.docker_store import (
    ClassicStoreReader,
    LayerTar,
    StoreEngine,
    StoreLayer,
    StoreMismatch,
    chain_ids,
)
from importer.engines.dockerclient import DockerClient
from importer.format.digest import Digest
from tests.kit import engines
from tests.kit.clijson import validate
from tests.kit.helpers import docker, forget, run_cli
from tests.kit.imagegen import layered_context

# --- a tar-split made here: the rebuilt tar is the tar, and what does not match is refused ------


def _split(data: bytes, root: Path) -> list[dict[str, object]]:
    """tar-split entries of the tar ``data`` (segments: headers and padding; files: their content,
    written below ``root`` as Docker's diff folder holds it)."""
    entries: list[dict[str, object]] = []
    pos = 0

    def segment(upto: int) -> None:
        nonlocal pos
        if upto > pos:
            entries.append({"type": 2, "payload": _b64(data[pos:upto]), "position": len(entries)})
        pos = upto

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            segment(m.offset_data)
            size = m.size if m.isreg() else 0
            entries.append({"type": 1, "name": m.name, "size": size, "payload": "AAAAAAAAAAA=",
                            "position": len(entries)})
            if m.isreg():
                (root / m.name).parent.mkdir(parents=True, exist_ok=True)
                (root / m.name).write_bytes(data[m.offset_data:m.offset_data + m.size])
                pos = m.offset_data + m.size
            elif m.isdir():
                (root / m.name).mkdir(parents=True, exist_ok=True)
    segment(len(data))
    return entries


def _b64(raw: bytes) -> str:
    import base64
    return base64.b64encode(raw).decode()


def _layer(tmp: Path, entries: list[dict[str, object]], diff: Path, data: bytes = b"") -> StoreLayer:
    meta = tmp / "tar-split.json.gz"
    with gzip.open(meta, "wb") as f:
        for e in entries:
            f.write(json.dumps(e).encode() + b"\n")
    return StoreLayer(Digest.of_bytes(data), "c" * 64, str(meta), str(diff))


def _sample_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, content: bytes | None = None, **kw: object) -> None:
            info = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(info, k, v)
            if content is None:
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        add("etc", type=tarfile.DIRTYPE, mode=0o755)
        add("etc/hello", b"hello\n")
        add("etc/empty", b"")
        add("etc/link", type=tarfile.SYMTYPE, linkname="hello")
        add("etc/hard", type=tarfile.LNKTYPE, linkname="etc/hello")
        add("d" * 120 + "/" + "ü" * 90, b"long and not ascii\n")  # a pax header
        add("big.bin", os.urandom(3 * 1024 * 1024 + 17))
        add("etc/.wh.gone", b"")
    return buf.getvalue()


def _read_all(layer: StoreLayer, n: int = 1 << 20) -> bytes:
    out = []
    with LayerTar(layer) as tar:
        while chunk := tar.read(n):
            assert len(chunk) <= n
            out.append(chunk)
    return b"".join(out)


@pytest.mark.parametrize("n", [1 << 20, 4096, 511])
def test_the_rebuilt_tar_is_the_tar(tmp_path: Path, n: int) -> None:
    data = _sample_tar()
    diff = tmp_path / "diff"
    diff.mkdir()
    layer = _layer(tmp_path, _split(data, diff), diff, data)
    assert _read_all(layer, n) == data


def _hostile(tmp_path: Path, change: str) -> StoreLayer:
    data = _sample_tar()
    diff = tmp_path / "diff"
    diff.mkdir()
    entries = _split(data, diff)
    hello = next(e for e in entries if e.get("name") == "etc/hello")
    if change == "escape":
        hello["name"] = "../outside"
        (tmp_path / "outside").write_bytes(b"hello\n")
    elif change == "twice":
        entries.insert(entries.index(hello) + 1, dict(hello))
    elif change == "shorter":
        (diff / "etc" / "hello").write_bytes(b"hell")
    elif change == "symlink":
        (diff / "etc" / "hello").unlink()
        (diff / "etc" / "hello").symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere").write_bytes(b"hello\n")
    elif change == "fifo":
        (diff / "etc" / "hello").unlink()
        os.mkfifo(diff / "etc" / "hello")
    elif change == "missing":
        (diff / "etc" / "hello").unlink()
    elif change == "type":
        hello["type"] = 3
    elif change == "payload":
        entries[0]["payload"] = "not base64!"
    return _layer(tmp_path, entries, diff, data)


@pytest.mark.parametrize("change", ["escape", "twice", "shorter", "symlink", "fifo", "missing", "type", "payload"])
def test_what_does_not_match_the_tar_split_is_refused(tmp_path: Path, change: str) -> None:
    """Never a guess: a name outside the layer, a name twice (tar-split's own ErrDuplicatePath), a
    file of another size, a link or FIFO where a file was, an entry not understood: StoreMismatch
    (the export then reads `docker save`); a FIFO does not block the read."""
    with pytest.raises(StoreMismatch, match="layer cccccccccccc, tar-split entry"):
        _read_all(_hostile(tmp_path, change))


def test_a_changed_byte_is_left_to_the_diff_id(tmp_path: Path) -> None:
    """A byte changed in the diff folder (same size) rebuilds another tar: its hash is not the
    diff_id, which the export compares (test_a_tampered_layer_never_makes_a_bundle on a real engine)."""
    data = _sample_tar()
    diff = tmp_path / "diff"
    diff.mkdir()
    layer = _layer(tmp_path, _split(data, diff), diff, data)
    (diff / "etc" / "hello").write_bytes(b"jello\n")
    assert Digest.of_bytes(_read_all(layer)) != layer.diff_id


def test_chain_ids_are_dockers() -> None:
    """ChainID(L1) = DiffID(L1), ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln)): the folder
    names dockerd 20.10 gave a busybox image's first two layers."""
    diff_ids = [Digest.parse("sha256:923c82bd8b2cff0c54e9be8c18d74a5f532ff9a3c2d01d3d6d6dfcd0a0d93fa2"),
                Digest.parse("sha256:e95c4447e18c366d386a42aad92f739d2a7d2bb377c6f4940a4ee2e6958c0bc5")]
    assert chain_ids(diff_ids) == ["923c82bd8b2cff0c54e9be8c18d74a5f532ff9a3c2d01d3d6d6dfcd0a0d93fa2",
                                   "bce957affd65247ebf3ca0b2bf7fa8663d8b04b6903cb387a6ccb6457bbb3db0"]


def _never(*_: object, **__: object) -> list:  # type: ignore[type-arg]
    raise AssertionError("not called")


@pytest.mark.parametrize(("host", "engine", "root", "why"), [
    ("tcp://10.0.0.1:2375", StoreEngine("/var/lib/docker", "overlay2", "20.10.24"), True, "is not on this host"),
    (None, StoreEngine("/var/lib/docker", "overlay2", "20.10.24"), False, "does not run as root"),
    (None, StoreEngine("/var/lib/docker", "overlay2", "26.1.5"), True, "also carries OCI manifests"),
    (None, StoreEngine("/var/lib/docker", "vfs", "20.10.24"), True, "its storage driver is vfs"),
    (None, StoreEngine(None, "overlay2", "20.10.24"), True, "no data root"),
])
def test_where_the_store_is_not_read(monkeypatch: pytest.MonkeyPatch, host: str | None, engine: StoreEngine,
                                     root: bool, why: str) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    reader = ClassicStoreReader(DockerClient(host or "unix:///nonexistent.sock"), engine, False, _never)
    assert why in (reader.unusable() or "")


def test_docker_read_is_for_docker_sources(tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", f"oci:{tmp_path}", "--docker-read", "store", "-o", str(tmp_path / "b"))
    assert proc.returncode == 2 and "--docker-read store: expected a Docker source" in proc.stderr, proc.stderr


# --- on the kit's dockerd 20.10 ---------------------------------------------------------------


REPO = "store44/app"


@pytest.fixture(scope="module")
def built(docker_host: str, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two images sharing their base: busybox, text that compresses, random bytes that do not, a
    file deleted in a later layer (a whiteout), a hardlink; the second adds a layer."""
    root = tmp_path_factory.mktemp("store44")
    steps = ['RUN ["/bin/busybox", "sh", "-c", "mkdir -p /d && echo a > /d/a && ln /d/a /d/hl && rm /etc/gone"]']
    ctx = layered_context(root / "one", busybox=busybox, steps=steps, files={
        "/etc/gone": "bye\n", "/srv/text.txt": "library text " * 40000, "/srv/random.bin": os.urandom(1 << 20)})
    one = engines.build_image(docker_host, ctx, f"{REPO}:1")
    two = engines.build_image(docker_host, layered_context(root / "two", base=f"{REPO}:1", files={
        "/srv/more.txt": "more " * 1000}), f"{REPO}:2")
    docker(docker_host, "tag", f"{REPO}:2", f"{REPO}:latest")  # REPO alone names both images (every tag)
    yield {"one": one, "two": two}
    forget(docker_host, f"{REPO}:1", f"{REPO}:2", f"{REPO}:latest")


def _export(out: Path, *args: str, docker_host: str, code: int = 0) -> dict:  # type: ignore[type-arg]
    proc = run_cli("bundle", "export", *args, "-o", str(out), "--json", "-q", docker_host=docker_host,
                   drop_env=("DOCKER_",))
    assert proc.returncode == code, proc.stderr
    doc: dict = json.loads(proc.stdout)  # type: ignore[type-arg]
    validate("export", doc)  # images[].read among them
    doc["stderr"] = proc.stderr
    return doc


PYZ = "bundle-import.pyz"


def _same_bundle(a: Path, b: Path) -> None:
    """bundle.json alike but for its creation time (and the importer, built from this working tree,
    which may change between two exports), every other file but SHA256SUMS (which pins bundle.json)
    byte for byte: every blob, index.json."""
    ja, jb = (json.loads((p / "bundle.json").read_text()) for p in (a, b))
    for doc in (ja, jb):
        doc.pop("created")
        doc.pop("importer")
        doc["files"] = [f for f in doc["files"] if f["path"] != PYZ]
    assert ja == jb
    files = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    assert files == {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    for rel in files - {Path("bundle.json"), Path("SHA256SUMS"), Path(PYZ)}:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


@pytest.mark.engine
def test_the_store_and_docker_save_make_the_same_bundle(docker_host: str, built: dict[str, str],
                                                         tmp_path: Path) -> None:
    """Tagged names, an image ID and a repository without a tag (every tag of it, as `docker save`
    gives them) through the store and through `docker save`: the same bundle byte for byte; --json
    and a line on stderr say which way each image was read."""
    refs = (f"{REPO}:2", built["one"])
    store = _export(tmp_path / "store", *refs, docker_host=docker_host)
    saved = _export(tmp_path / "save", *refs, "--docker-read", "save", docker_host=docker_host)
    _same_bundle(tmp_path / "store", tmp_path / "save")
    assert [i["read"] for i in store["images"]] == ["store", "store"]
    assert [i["read"] for i in saved["images"]] == ["save", "save"]
    assert f"docker: reading {REPO}:2 from Docker's image store (overlay2 in " in store["stderr"]
    assert "through `docker save` (--docker-read save)" in saved["stderr"]
    # a repository without a tag: every tag of it (their images in the order `docker save`'s map has)
    forced = _export(tmp_path / "forced", REPO, "--docker-read", "store", docker_host=docker_host)
    both = _export(tmp_path / "both", REPO, "--docker-read", "save", docker_host=docker_host)
    named = {(i["configDigest"], tuple(i["refs"]), i["manifestDigest"]) for i in forced["images"]}
    assert named == {(i["configDigest"], tuple(i["refs"]), i["manifestDigest"]) for i in both["images"]}
    assert {c: r for c, r, _ in named} == {built["one"]: (f"{REPO}:1",),
                                           built["two"]: (f"{REPO}:2", f"{REPO}:latest")}
    assert {i["read"] for i in forced["images"]} == {"store"}


@pytest.mark.engine
def test_a_delta_and_gzip_are_the_same_either_way(docker_host: str, built: dict[str, str], tmp_path: Path) -> None:
    """--have (the layers of the base left out, measured, not written) and --compression gzip."""
    _export(tmp_path / "base", f"{REPO}:1", docker_host=docker_host)
    have = ("--have", str(tmp_path / "base" / "bundle.json"), "--compression", "gzip")
    _export(tmp_path / "d-store", f"{REPO}:2", *have, docker_host=docker_host)
    _export(tmp_path / "d-save", f"{REPO}:2", *have, "--docker-read", "save", docker_host=docker_host)
    _same_bundle(tmp_path / "d-store", tmp_path / "d-save")
    layers = json.loads((tmp_path / "d-store" / "bundle.json").read_text())["images"][0]["layers"]
    assert [bool(x.get("external")) for x in layers][-1] is False and any(x.get("external") for x in layers)


@pytest.mark.engine
def test_the_vfs_driver_goes_through_docker_save(docker_host_vfs: str, busybox: str, tmp_path: Path) -> None:
    ref = "store44/vfs:1"
    engines.build_image(docker_host_vfs, layered_context(tmp_path / "ctx", busybox=busybox,
                                                         files={"/msg": "vfs\n"}), ref)
    try:
        auto = _export(tmp_path / "auto", ref, docker_host=docker_host_vfs)
        assert [i["read"] for i in auto["images"]] == ["save"]
        assert "through `docker save`: its storage driver is vfs" in auto["stderr"]
        _export(tmp_path / "save", ref, "--docker-read", "save", docker_host=docker_host_vfs)
        _same_bundle(tmp_path / "auto", tmp_path / "save")
        forced = run_cli("bundle", "export", ref, "--docker-read", "store", "-o", str(tmp_path / "f"),
                         docker_host=docker_host_vfs, drop_env=("DOCKER_",))
        assert forced.returncode == 5 and "error[source]" in forced.stderr and "storage driver is vfs" in forced.stderr
        assert not (tmp_path / "f").exists()
    finally:
        forget(docker_host_vfs, ref)


@contextlib.contextmanager
def _tcp_to(unix_path: str) -> Iterator[str]:
    """A loopback TCP port forwarding to the engine's unix socket: an engine that is not on this
    host as far as the exporter can tell (``tcp://127.0.0.1:PORT``)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def pump(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(1 << 16):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                client, _ = server.accept()
                engine = socket.socket(socket.AF_UNIX)
                engine.connect(unix_path)
                for a, b in ((client, engine), (engine, client)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


@pytest.mark.engine
def test_a_remote_engine_goes_through_docker_save(docker_host: str, built: dict[str, str], tmp_path: Path) -> None:
    _export(tmp_path / "local", f"{REPO}:1", docker_host=docker_host)
    with _tcp_to(docker_host.removeprefix("unix://")) as tcp:
        remote = _export(tmp_path / "remote", f"{REPO}:1", docker_host=tcp)
        forced = run_cli("bundle", "export", f"{REPO}:1", "--docker-read", "store", "-o", str(tmp_path / "f"),
                         docker_host=tcp, drop_env=("DOCKER_",))
    assert [i["read"] for i in remote["images"]] == ["save"]
    assert f"through `docker save`: the engine at {tcp} is not on this host" in remote["stderr"]
    _same_bundle(tmp_path / "local", tmp_path / "remote")
    assert forced.returncode == 5 and "is not on this host" in forced.stderr, forced.stderr


def _layer_dirs(docker_host: str, ref: str) -> list[Path]:
    """The overlay2 diff folders of ``ref``'s layers, top first."""
    data = json.loads(docker(docker_host, "image", "inspect", ref).stdout)[0]["GraphDriver"]["Data"]
    return [Path(data["UpperDir"]), *(Path(p) for p in data.get("LowerDir", "").split(":") if p)]


@pytest.mark.engine
def test_a_tampered_layer_never_makes_a_bundle(docker_host: str, busybox: str, tmp_path: Path) -> None:
    """One byte changed in a file of the diff folder (its size kept): the rebuilt layer does not
    hash to its diff_id; auto says so and reads `docker save`, which refuses the layer too (dockerd
    checks its own CRC): a typed error, no bundle; --docker-read store fails naming the layer."""
    ref = "store44/tampered:1"
    secret = os.urandom(64).hex()  # a layer no other image shares
    engines.build_image(docker_host, layered_context(tmp_path / "ctx", files={"/msg": secret}), ref)
    target = _layer_dirs(docker_host, ref)[0] / "msg"
    try:
        target.write_text(secret[:-1] + ("0" if secret[-1] != "0" else "1"))
        auto = run_cli("bundle", "export", ref, "-o", str(tmp_path / "a"), docker_host=docker_host,
                       drop_env=("DOCKER_",))
        assert auto.returncode == 5 and "error[source]" in auto.stderr, auto.stderr
        assert "through `docker save`: layer " in auto.stderr and "not its diff_id" in auto.stderr
        forced = run_cli("bundle", "export", ref, "--docker-read", "store", "-o", str(tmp_path / "f"),
                         docker_host=docker_host, drop_env=("DOCKER_",))
        assert forced.returncode == 5 and "--docker-read store" in forced.stderr and "not its diff_id" in forced.stderr
        assert not (tmp_path / "a").exists() and not (tmp_path / "f").exists()
        assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    finally:
        target.write_text(secret)
        forget(docker_host, ref)


@pytest.mark.engine
def test_an_image_the_store_cannot_give_alone_goes_through_docker_save(
        docker_host: str, built: dict[str, str], tmp_path: Path) -> None:
    """A file missing from a layer's diff folder that dockerd still finds (it reads the layer's
    mount, where the same file of the layer below shows through): that image falls back to
    `docker save` (saying why) and the other is read from the store; the bundle is the same."""
    ref = "store44/twice:1"
    same = os.urandom(4096).hex()
    ctx = layered_context(tmp_path / "ctx", files={"/a/f": same},
                          steps=["COPY two/ /a/"])  # the second layer: the same /a/f, and /a/g
    (ctx / "two").mkdir()
    (ctx / "two" / "f").write_text(same)
    (ctx / "two" / "g").write_text("g\n")
    engines.build_image(docker_host, ctx, ref)
    top = _layer_dirs(docker_host, ref)[0] / "a" / "f"
    saved = top.read_bytes()
    try:
        top.unlink()
        mixed = _export(tmp_path / "mixed", ref, f"{REPO}:1", docker_host=docker_host)
        _export(tmp_path / "save", ref, f"{REPO}:1", "--docker-read", "save", docker_host=docker_host)
        _same_bundle(tmp_path / "mixed", tmp_path / "save")
        assert {tuple(i["refs"]): i["read"] for i in mixed["images"]} == {(ref,): "save", (f"{REPO}:1",): "store"}
        assert f"docker: reading {ref} through `docker save`: layer " in mixed["stderr"]
        assert "cannot be read" in mixed["stderr"]
    finally:
        top.write_bytes(saved)
        forget(docker_host, ref)
