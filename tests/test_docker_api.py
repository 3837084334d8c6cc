"""The Docker Engine API transport (importer/engines/dockerapi.py) against the real private dockerd:
the bulk streams go over the socket, the CLI path stays equivalent, and daemon errors and cut
streams surface as clear errors with nothing loaded."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from importer.engines.dockerapi import TRANSPORT_ENV, ApiLoad, _ChunkedBody, api_errors, api_save, socket_path
from importer.errors import CommandFailed
from importer.sinks.docker import DockerSink
from tests.kit.bundlegen import make_bundle
from tests.kit.helpers import docker, image_facts, image_ids, run_cli

pytestmark = pytest.mark.engine


def test_socket_path_only_for_unix_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    assert socket_path("unix:///run/d.sock") == "/run/d.sock"
    assert socket_path("tcp://127.0.0.1:2375") is None
    assert socket_path("ssh://user@host") is None
    assert socket_path(None) is None  # the CLI knows contexts and the default socket
    monkeypatch.setenv(TRANSPORT_ENV, "cli")
    assert socket_path("unix:///run/d.sock") is None


def test_api_errors_reads_the_message_stream() -> None:
    raw = b'{"stream":"Loaded image: a:1\\n"}\n{"errorDetail":{"message":"unexpected EOF"},"error":"unexpected EOF"}\n'
    assert api_errors(raw) == ["unexpected EOF"]
    assert api_errors(b'{"stream":"Loaded image ID: sha256:ab\\n"}\n') == []


@pytest.mark.parametrize("transport", ["api", "cli"])
def test_both_transports_import_and_export_the_same_image(transport: str, docker_host: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if transport == "cli":
        monkeypatch.setenv(TRANSPORT_ENV, "cli")
    else:
        monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    bundle = make_bundle(tmp_path / "b")
    doc = json.loads((bundle / "bundle.json").read_text())
    docker(docker_host, "image", "rm", "fake/app:2", "fake/base:1", check=False)  # so the load really happens
    proc = run_cli("importer", str(bundle), "--docker-host", docker_host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    out_doc = json.loads(proc.stdout)
    assert out_doc["engine"]["transport"] == transport  # the child inherited TRANSPORT_ENV
    assert [i["status"] for i in out_doc["images"]] == ["loaded", "loaded"]
    assert [i["result"] for i in out_doc["images"]] == ["match", "match"]
    app = image_facts(docker_host, "fake/app:2")
    assert app is not None and app[0] == doc["images"][1]["config"]["digest"]
    out = tmp_path / "again"
    run_cli("bundle", "export", "fake/app:2", "-o", str(out), docker_host=docker_host, check=True)
    again = json.loads((out / "bundle.json").read_text())
    assert again["images"][0]["config"] == doc["images"][1]["config"]
    assert [x["diffId"] for x in again["images"][0]["layers"]] == [x["diffId"] for x in doc["images"][1]["layers"]]


def test_a_cut_archive_loads_nothing_and_the_daemon_says_why(docker_host: str) -> None:
    path = socket_path(docker_host)
    assert path is not None
    before = image_ids(docker_host)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b'{"not": "a config"}'
        info = tarfile.TarInfo("x.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    load = ApiLoad(path, what="loading a broken archive")
    load.stdin.write(buf.getvalue())
    with pytest.raises(CommandFailed) as err:
        load.finish()  # no manifest.json: the daemon refuses it
    assert "loading a broken archive" in str(err.value) and err.value.stderr_tail.strip()
    load = ApiLoad(path, what="loading a cut archive")
    load.stdin.write(buf.getvalue()[:700])
    load.abort()
    assert image_ids(docker_host) == before


def test_saving_a_missing_image_names_it(docker_host: str) -> None:
    path = socket_path(docker_host)
    assert path is not None
    with pytest.raises(CommandFailed) as err, api_save(path, ["no/such-image:1"], what="saving"):
        pass
    assert err.value.returncode == 404 and "no/such-image:1" in str(err.value) and err.value.stderr_tail.strip()
    proc = run_cli("bundle", "export", "no/such-image:1", "-o", "/tmp/never-written", docker_host=docker_host)
    assert proc.returncode == 5 and "no/such-image:1" in proc.stderr


def _unchunk(raw: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end], 16)
        if size == 0:
            assert raw[end:] == b"\r\n\r\n"
            return bytes(out)
        out += raw[end + 2:end + 2 + size]
        assert raw[end + 2 + size:end + 4 + size] == b"\r\n"
        pos = end + 4 + size


def test_the_body_is_sent_by_its_own_thread_in_order_and_complete() -> None:
    """The load body's sending thread keeps the writes' order and framing (HTTP/1.1 chunks) and
    sends the last chunk only at close."""
    ours, peer = socket.socketpair()
    received = bytearray()

    def read_all() -> None:
        while True:
            data = peer.recv(1 << 20)
            if not data:
                return
            received.extend(data)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    body = _ChunkedBody(ours)
    pieces = [os.urandom(n) for n in (10, 300_000, 5, 2 << 20, 1, 70_000)]
    for piece in pieces:
        body.write(piece)
    body.close()
    ours.shutdown(socket.SHUT_WR)
    reader.join(30)
    assert _unchunk(bytes(received)) == b"".join(pieces)
    ours.close()
    peer.close()


def test_a_peer_that_hangs_up_fails_the_writer_and_abort_never_blocks() -> None:
    """The daemon hangs up mid-body: the next write (or close) raises the send's own error, so
    the caller reads the daemon's answer; a peer that stops reading with the queue full does
    not block an abort."""
    ours, peer = socket.socketpair()
    peer.close()
    body = _ChunkedBody(ours)
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        for _ in range(100):
            body.write(os.urandom(1 << 20))
        body.close()
    ours.close()
    stalled, silent = socket.socketpair()  # never read: the kernel buffer and the queue fill up
    body = _ChunkedBody(stalled)
    failed: list[BaseException] = []

    def write_much() -> None:
        try:
            for _ in range(40):
                body.write(b"x" * (1 << 20))
        except OSError as e:
            failed.append(e)

    writer = threading.Thread(target=write_much, daemon=True)
    writer.start()
    writer.join(2)  # blocked on the full queue by now
    stalled.shutdown(socket.SHUT_RDWR)  # what ApiLoad.abort does first
    body.stop()
    writer.join(10)
    assert not writer.is_alive() and failed  # the writer was told, not left blocked
    stalled.close()
    silent.close()


def test_the_sinks_small_requests_go_over_the_socket_as_the_cli_would_make_them(docker_host: str,
                                                                                tmp_path: Path) -> None:
    """Tag, list, look up and remove through the Engine API (no docker process per request): a
    reference with a registry port and no tag is tagged :latest, as `docker tag` does; a missing
    image is None, removing one names the daemon's answer."""
    bundle = make_bundle(tmp_path / "b")
    assert run_cli("importer", str(bundle), "--docker-host", docker_host, "--no-receipt", "--force").returncode == 0
    sink = DockerSink(docker_host)
    assert sink.client.socket is not None
    sink.probe()
    held = sink.lookup("fake/app:2")
    assert held is not None and held.image_id.startswith("sha256:")
    sink.tag(held.image_id, "127.0.0.1:5000/team/app")
    try:
        assert "127.0.0.1:5000/team/app:latest" in sink.list_tags()
        again = sink.lookup("127.0.0.1:5000/team/app:latest")
        assert again is not None and again.image_id == held.image_id
    finally:
        sink.remove("127.0.0.1:5000/team/app:latest")
    assert "127.0.0.1:5000/team/app:latest" not in sink.list_tags()
    assert sink.lookup("no/such-image:1") is None
    with pytest.raises(CommandFailed) as err:
        sink.remove("no/such-image:1")
    assert err.value.returncode == 404 and "no/such-image" in err.value.stderr_tail
    assert sink.lookup("fake/app:2") is not None  # the tag removed, the image kept


def test_the_staging_cleanup_lists_only_names_like_its_own(docker_host: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The stale-staging cleanup asks the engine for names like ``sneakernet-staging/*`` only
    (Docker's reference filter): the containerd store computes every image's size for a listing,
    0.2 s for one image of 100 layers on every import, 0.02 s filtered (issue 44 point 3). The
    same answer over the socket and through the CLI."""
    bundle = make_bundle(tmp_path / "b")
    assert run_cli("importer", str(bundle), "--docker-host", docker_host, "--no-receipt", "--force").returncode == 0
    staged, other = "sneakernet-staging/0123456789ab:3", "sneakernet-stagingx/y:1"
    docker(docker_host, "tag", "fake/app:2", staged)
    docker(docker_host, "tag", "fake/app:2", other)
    try:
        for transport in ("api", "cli"):
            monkeypatch.setenv(TRANSPORT_ENV, transport)
            sink = DockerSink(docker_host)
            assert (sink.client.socket is not None) == (transport == "api")
            assert sink.list_tags("sneakernet-staging/*") == [staged], transport
            assert {staged, other, "fake/app:2"} <= set(sink.list_tags()), transport
    finally:
        docker(docker_host, "image", "rm", staged, other, check=False)
