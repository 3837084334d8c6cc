"""`bundle-import serve` (issue 18, point 1): a verified bundle (folder, tar, parts) served read-only
as an OCI distribution API from the bundle's own pyz. Engine-free here: the API answered over
real HTTP (manifests by tag and digest, blobs, HEAD, Range, catalog, tags, error JSON), a byte
flipped after verification cutting every response of that blob before its end, verification
before listening, SIGINT/SIGTERM. tests/test_serve_engines.py pulls with Docker, podman,
containerd and skopeo."""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import signal
import socket
import threading
from pathlib import Path

import pytest

from tests.kit.clijson import validate
from tests.kit.fuzzkit import flip_byte
from tests.kit.helpers import run_cli, run_zipapp
from tests.kit.servekit import blob_bytes, bundle_doc, cut_body, pyz, request, serve_args, serving
from tests.kit.servekit import made as made  # the fixture: one per module

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.mark.parametrize("kind", ["folder", "tar", "parts"])
def test_the_api_from_folder_tar_and_parts(made: dict[str, Path], kind: str) -> None:
    doc = bundle_doc(made)
    app = doc["images"][1]
    assert app["refs"] == ["carry/app:2"]
    with serving(pyz(made), made[kind]) as s:
        validate("serve", s.start)
        assert s.start["kind"] == kind and s.start["verification"]["ok"]
        assert s.start["repositories"] == [{"name": "carry/app", "tags": ["2"]}, {"name": "carry/base", "tags": ["1"]}]
        status, headers, body = request(s.addr, "GET", "/v2/")
        assert status == 200 and headers["docker-distribution-api-version"] == "registry/2.0"
        assert json.loads(request(s.addr, "GET", "/v2/_catalog")[2]) == {"repositories": ["carry/app", "carry/base"]}
        assert json.loads(request(s.addr, "GET", "/v2/carry/app/tags/list")[2]) == {"name": "carry/app",
                                                                                   "tags": ["2"]}
        manifest = blob_bytes(made["folder"], app["manifest"]["digest"])
        for ref in ("2", app["manifest"]["digest"]):
            status, headers, body = request(s.addr, "GET", f"/v2/carry/app/manifests/{ref}",
                                            {"Accept": OCI_MANIFEST})
            assert status == 200 and body == manifest  # the exact bytes, by tag and by digest
            assert headers["content-type"] == OCI_MANIFEST
            assert headers["docker-content-digest"] == app["manifest"]["digest"]
            assert headers["content-length"] == str(len(manifest))
            status, headers, body = request(s.addr, "HEAD", f"/v2/carry/app/manifests/{ref}")
            assert (status, body, headers["content-length"]) == (200, b"", str(len(manifest)))
            assert headers["docker-content-digest"] == app["manifest"]["digest"]
        for blob in [app["config"], *app["layers"]]:
            want = blob_bytes(made["folder"], blob["digest"])
            status, headers, body = request(s.addr, "GET", f"/v2/carry/app/blobs/{blob['digest']}")
            assert status == 200 and hashlib.sha256(body).hexdigest() == blob["digest"][7:] and body == want
            assert headers["docker-content-digest"] == blob["digest"] and int(headers["content-length"]) == blob["size"]
            status, headers, body = request(s.addr, "HEAD", f"/v2/carry/app/blobs/{blob['digest']}")
            assert (status, body, int(headers["content-length"])) == (200, b"", blob["size"])
        layer = app["layers"][1]
        want = blob_bytes(made["folder"], layer["digest"])
        size = len(want)
        for spec, first, last in (("bytes=10-99", 10, 99), (f"bytes={size - 5}-", size - 5, size - 1),
                                  ("bytes=-100", size - 100, size - 1), (f"bytes=1000-{size + 50}", 1000, size - 1),
                                  ("bytes=1048570-2097160", 1048570, 2097160)):
            status, headers, body = request(s.addr, "GET", f"/v2/carry/app/blobs/{layer['digest']}", {"Range": spec})
            assert status == 206 and body == want[first:last + 1], spec
            assert headers["content-range"] == f"bytes {first}-{last}/{size}"
        status, headers, _ = request(s.addr, "GET", f"/v2/carry/app/blobs/{layer['digest']}",
                                     {"Range": f"bytes={size}-"})
        assert status == 416 and headers["content-range"] == f"bytes */{size}"
        assert s.stop() == 0
        log = s.stderr()
    assert f'"GET /v2/carry/app/blobs/{layer["digest"]}" 206 90 ' in log  # the access log


def _errors(addr: str, method: str, path: str) -> tuple[int, list[str]]:
    status, headers, body = request(addr, method, path)
    assert headers["content-type"] == "application/json"
    return status, [e["code"] for e in json.loads(body)["errors"]]


def test_unknown_names_manifests_and_blobs_get_distribution_errors(made: dict[str, Path]) -> None:
    doc = bundle_doc(made)
    base, app = doc["images"]
    top = app["layers"][1]["digest"]  # a layer of carry/app only
    with serving(pyz(made), made["folder"]) as s:
        assert _errors(s.addr, "GET", "/v2/nope/manifests/1") == (404, ["NAME_UNKNOWN"])
        assert _errors(s.addr, "GET", "/v2/library/carry/app/tags/list") == (404, ["NAME_UNKNOWN"])
        assert _errors(s.addr, "GET", "/v2/carry/app/manifests/3") == (404, ["MANIFEST_UNKNOWN"])
        assert _errors(s.addr, "GET", f"/v2/carry/app/manifests/{base['manifest']['digest']}") == (
            404, ["MANIFEST_UNKNOWN"])  # the other repository's image
        assert _errors(s.addr, "GET", f"/v2/carry/base/blobs/{top}") == (404, ["BLOB_UNKNOWN"])
        assert _errors(s.addr, "GET", "/v2/carry/app/blobs/sha256:" + "0" * 64) == (404, ["BLOB_UNKNOWN"])
        assert _errors(s.addr, "GET", "/v2/carry/app/blobs/sha256:xyz") == (400, ["DIGEST_INVALID"])
        assert _errors(s.addr, "PUT", "/v2/carry/app/manifests/9") == (405, ["UNSUPPORTED"])
        assert _errors(s.addr, "POST", "/v2/carry/app/blobs/uploads/") == (405, ["UNSUPPORTED"])
        assert s.stop() == 0



@pytest.mark.parametrize("kind", ["folder", "tar"])
def test_a_blob_damaged_after_verification_is_cut_before_its_end(made: dict[str, Path], kind: str,
                                                                  tmp_path: Path) -> None:
    doc = bundle_doc(made)
    layer = doc["images"][1]["layers"][1]  # 3 MiB of random bytes
    config = doc["images"][1]["config"]
    if kind == "folder":
        target = tmp_path / "b"
        shutil.copytree(made["folder"], target)
        damaged, offset = target / "blobs" / "sha256" / layer["digest"][7:], 2 * 1024 * 1024 + 7
    else:
        target = tmp_path / "carry.tar"
        shutil.copy(made["tar"], target)
        data = target.read_bytes()
        head = blob_bytes(made["folder"], layer["digest"])[:4096]
        damaged, offset = target, data.index(head) + 2 * 1024 * 1024 + 7  # inside the member, not its header
    with serving(pyz(made), target) as s:  # verified: then the byte changes under the server
        flip_byte(damaged, offset)
        url = f"/v2/carry/app/blobs/{layer['digest']}"
        status, length, got = cut_body(s.addr, url)
        assert status == 200 and length == layer["size"] and got < layer["size"]
        status, length, got = cut_body(s.addr, url, {"Range": "bytes=0-99"})  # the damage is far from it
        assert (status, length, got) == (206, 100, 0)
        status, length, got = cut_body(s.addr, url, {"Range": f"bytes={got}-"})  # a client resuming
        assert status == 206 and got < length
        status, _, body = request(s.addr, "GET", f"/v2/carry/app/blobs/{config['digest']}")
        assert status == 200 and hashlib.sha256(body).hexdigest() == config["digest"][7:]  # the rest still served
        rc = s.stop()
        err = s.stderr()
    assert rc == 3, err
    assert "error[serve-blob-damaged]" in err and layer["digest"] in err
    assert f"CUT: {layer['digest']} no longer matches bundle.json" in err


def test_nothing_is_served_from_a_bundle_that_fails_verification(made: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "b"
    shutil.copytree(made["folder"], target)
    layer = bundle_doc(made)["images"][1]["layers"][1]
    flip_byte(target / "blobs" / "sha256" / layer["digest"][7:], 100)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = serve_args(target)
    args[args.index("127.0.0.1:0")] = f"127.0.0.1:{port}"
    proc = run_zipapp(pyz(made), *args, timeout=300)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["error"]["id"] == "verification-failed" and doc["problems"]
    validate("serve", doc)
    with socket.socket() as probe:  # nothing listens there any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_taken_port_is_a_usage_error(made: dict[str, Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_cli("importer", "serve", str(made["folder"]), "--listen", f"127.0.0.1:{port}", "--json",
                       timeout=300)
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["error"]["id"] == "serve-listen" and f"127.0.0.1:{port}" in doc["error"]["message"]
    validate("serve", doc)
    proc = run_cli("importer", "serve", str(made["folder"]), "--listen", "5000", timeout=300)
    assert proc.returncode == 2 and "error[usage]" in proc.stderr and "ADDR:PORT" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_it_cleanly_even_mid_blob(made: dict[str, Path], sig: int) -> None:
    layer = bundle_doc(made)["images"][1]["layers"][0]
    with serving(pyz(made), made["parts"]) as s:
        host, port = s.addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("GET", f"/v2/carry/app/blobs/{layer['digest']}")
        resp = conn.getresponse()
        assert resp.read(1000)  # a client in the middle of a blob
        rc = s.stop(sig)
        conn.close()
        err = s.stderr()
    assert rc == 0, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err
    with socket.socket() as probe:
        assert probe.connect_ex((host, int(port))) != 0


def test_concurrent_clients_each_get_whole_verified_blobs(made: dict[str, Path]) -> None:
    doc = bundle_doc(made)
    blobs = [b for image in doc["images"] for b in [image["config"], *image["layers"]]]
    results: list[tuple[str, str]] = []
    lock = threading.Lock()
    with serving(pyz(made), made["tar"]) as s:
        def pull(i: int) -> None:
            blob = blobs[i % len(blobs)]
            repo = "carry/base" if blob in [doc["images"][0]["config"], *doc["images"][0]["layers"]] else "carry/app"
            status, _, body = request(s.addr, "GET", f"/v2/{repo}/blobs/{blob['digest']}")
            with lock:
                results.append((blob["digest"], f"sha256:{hashlib.sha256(body).hexdigest()}" if status == 200
                                else str(status)))

        threads = [threading.Thread(target=pull, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert s.stop() == 0
    assert len(results) == 16 and all(want == got for want, got in results), results
