"""Decompress once: into Docker, the import verifies the compressed blobs before touching the
engine and checks each layer's diff_id while it streams into ``docker load``. A bundle whose
blobs all match bundle.json but whose layer does not decompress to its diff_id (an exporter that
lied, or a digest collision) must still load nothing."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from importer.engines.dockerapi import TRANSPORT_ENV, ApiLoad
from importer.errors import DiffIDMismatch
from importer.input.opened import open_bundle
from importer.sinks.docker import DockerSink
from tests.kit.bundlegen import BIG_REFS, big_bundle, bomb_bundle, lying_bundle, make_bundle
from tests.kit.engines import DOCKER_STORES
from tests.kit.fuzzkit import flip_byte
from tests.kit.helpers import docker, image_ids, run_cli

pytestmark = pytest.mark.engine


def test_a_layer_that_lies_about_its_diff_id_loads_nothing(docker_host: str, tmp_path: Path) -> None:
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    shallow = run_cli("importer", str(bundle), "--verify-only", "--shallow")
    assert shallow.returncode == 0, shallow.stderr  # every listed digest matches: only decompressing tells
    deep = run_cli("importer", str(bundle), "--verify-only")
    assert deep.returncode == 3 and diff_id in deep.stderr, deep.stderr
    docker(docker_host, "image", "rm", "fake/app:2", "fake/base:1", check=False)  # nothing present: all streamed
    before = image_ids(docker_host)
    proc = run_cli("importer", str(bundle), "--verify", "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 3, proc.stderr
    # found while streaming into docker load (decompress once) or by a deep pre-verify
    assert ("error[diffid-mismatch]" in proc.stderr or "error[verification-failed]" in proc.stderr), proc.stderr
    assert diff_id in proc.stderr
    assert image_ids(docker_host) == before  # no image, no staging tag, no dangling layer chain image


def test_a_lying_layer_of_an_image_already_present_is_still_caught(docker_host: str, tmp_path: Path) -> None:
    """The genuine fake/app:2 is in the engine, so nothing is streamed for it; its layers are
    still decompressed and checked before the import reports success."""
    genuine = make_bundle(tmp_path / "genuine")
    assert run_cli("importer", str(genuine), "--docker-host", docker_host, "--force", "--no-receipt").returncode == 0
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    before = image_ids(docker_host)
    proc = run_cli("importer", str(bundle), "--docker-host", docker_host, "--no-receipt")
    assert proc.returncode == 3, proc.stderr
    assert "error[diffid-mismatch]" in proc.stderr and diff_id in proc.stderr
    assert image_ids(docker_host) == before


@pytest.mark.parametrize("transport", ["api", "cli"])
def test_containerd_store_checks_each_diff_id_beside_the_unpack_and_keeps_nothing_on_a_lie(
        docker_host_ctrstore: str, tmp_path: Path, transport: str) -> None:
    """Docker's containerd store gets the layers as carried (compressed, byte for byte); the
    verification before the load no longer decompresses (it passes a bundle whose digests all
    match), the stream checks every blob's digest, and the diff_ids are checked from a second read
    while the engine unpacks (importer/input/unpackcheck.py). The lie is found there: the engine
    had named the image under this run's staging tag only, and that name is gone, also a while
    later (the engine names what it imports when the stream ends, so the importer waits for the
    names before it cuts the load and removes them). The cut is the same over the Engine API
    socket and through the docker CLI (``SNEAKERNET_DOCKER_TRANSPORT=cli``: the CLI is stopped)."""
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    docker(docker_host_ctrstore, "image", "rm", "fake/app:2", "fake/base:1", check=False)
    before = image_ids(docker_host_ctrstore)
    env = {TRANSPORT_ENV: "cli"} if transport == "cli" else None
    proc = run_cli("importer", str(bundle), "--verify", "--docker-host", docker_host_ctrstore, "--no-receipt",
                   env=env)
    assert proc.returncode == 3, proc.stderr
    assert "error[diffid-mismatch]" in proc.stderr and diff_id in proc.stderr, proc.stderr
    assert "decompressing" in proc.stderr, proc.stderr
    _nothing_named_a_while(docker_host_ctrstore, before)
    # the true bundle loads through the same path, and its images are what bundle.json says
    genuine = make_bundle(tmp_path / "genuine")
    ok = run_cli("importer", str(genuine), "--verify", "--docker-host", docker_host_ctrstore, "--no-receipt",
                 env=env)
    assert ok.returncode == 0, ok.stderr
    assert "fake/app:2" in docker(docker_host_ctrstore, "image", "ls", "--format",
                                  "{{.Repository}}:{{.Tag}}").stdout


def test_the_load_is_cut_only_once_the_engine_named_what_it_imports(
        docker_host_ctrstore: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker names the images of an archive when its stream ends, whether or not the client is
    still connected: a load cut before that would get its staging names after the importer removed
    them. So a failed check waits for the names (or the engine's answer) before it cuts, and every
    staging name exists at the cut; the sink raises the layer's own error, never the engine's."""
    bundle, diff_id = lying_bundle(tmp_path / "lying")
    sink = DockerSink(docker_host_ctrstore)
    sink.probe()
    images = list(open_bundle(str(bundle)).manifest().images)
    refs = [f"sneakernet-staging/0123456789ab:{n}" for n in range(len(images))]
    staged = [dataclasses.replace(image, refs=(ref,)) for image, ref in zip(images, refs)]
    named_at_cut: list[list[bool]] = []
    cut = ApiLoad.abort

    def recording_cut(self: ApiLoad) -> None:
        named_at_cut.append([sink.lookup(ref) is not None for ref in refs])
        cut(self)

    monkeypatch.setattr(ApiLoad, "abort", recording_cut)
    try:
        with pytest.raises(DiffIDMismatch) as err:
            sink.load(str(bundle), staged, None)
        assert diff_id in err.value.message
        assert named_at_cut and named_at_cut[0] == [True] * len(refs), named_at_cut
    finally:
        for ref in refs:
            docker(docker_host_ctrstore, "image", "rm", ref, check=False)
    assert not [ref for ref in refs if sink.lookup(ref) is not None]


def _nothing_named_a_while(host: str, before: object) -> None:
    """No image and no staging tag this run made, now and for two seconds on (a name the engine
    made after the importer cleaned up would show up late)."""
    deadline = time.monotonic() + 2.0
    while True:
        assert image_ids(host) == before  # no image, no staging tag
        listed = docker(host, "image", "ls", "-a", "--format", "{{.Repository}}:{{.Tag}}").stdout
        assert "sneakernet-staging" not in listed and "fake/app" not in listed, listed
        if time.monotonic() > deadline:
            return
        time.sleep(0.25)


@pytest.mark.parametrize("docker_store", sorted(DOCKER_STORES), indirect=True)
def test_a_bomb_past_its_recorded_size_is_refused_and_keeps_nothing(docker_store_host: str, tmp_path: Path) -> None:
    """A layer whose diff_id is true but whose bundle.json size is a quarter of what it holds:
    an engine that checks only diff_ids would store it all. Into either Docker store the import
    decompresses within the recorded size and refuses it (exit 3, ``limit-exceeded``); into the
    classic store before manifest.json is sent, into the containerd store while the engine unpacks
    (the load is cut); either way nothing this run named is left."""
    bundle, _ = bomb_bundle(tmp_path / "bomb")
    docker(docker_store_host, "image", "rm", "fake/app:2", "fake/base:1", check=False)
    before = image_ids(docker_store_host)
    proc = run_cli("importer", str(bundle), "--verify", "--docker-host", docker_store_host, "--no-receipt")
    assert proc.returncode == 3, proc.stderr
    assert "error[limit-exceeded]" in proc.stderr and "recorded uncompressed size" in proc.stderr, proc.stderr
    _nothing_named_a_while(docker_store_host, before)


@pytest.mark.parametrize("docker_store", sorted(DOCKER_STORES), indirect=True)
def test_layer_blobs_are_checked_in_the_load_stream_and_a_changed_one_loads_nothing(
        docker_store_host: str, tmp_path: Path) -> None:
    """Into either Docker store the verification before the load leaves the layer blobs' bytes to
    the load stream (each read once; a stored layer hashed once for digest and diff_id): the
    receipt counts them apart. A byte changed in a stored layer is refused as a verification
    before the load would refuse it (exit 3, ``verification-failed``, the blob named), and the
    engine holds nothing new: the blob's last chunk was never sent, ``index.json`` or
    ``manifest.json`` never followed."""
    host = docker_store_host
    genuine = big_bundle(tmp_path / "genuine")
    docker(host, "image", "rm", *BIG_REFS, check=False)
    proc = run_cli("importer", str(genuine), "--verify", "--docker-host", host, "--json", "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    verification = json.loads(proc.stdout)["verification"]
    layers = {x["digest"]: x["size"] for img in json.loads((genuine / "bundle.json").read_text())["images"]
              for x in img["layers"]}
    assert verification["layersCheckedWhileLoading"] == len(layers)
    assert verification["bytesCheckedWhileLoading"] == sum(layers.values())
    docker(host, "image", "rm", *BIG_REFS, check=False)

    changed = big_bundle(tmp_path / "changed")
    top = json.loads((changed / "bundle.json").read_text())["images"][1]["layers"][1]
    path = changed / "blobs" / "sha256" / top["digest"].split(":")[1]
    flip_byte(path)
    before = image_ids(host)
    proc = run_cli("importer", str(changed), "--verify", "--docker-host", host, "--json", "--no-receipt")
    assert proc.returncode == 3, proc.stderr
    assert "error[verification-failed]" in proc.stderr and top["digest"].split(":")[1] in proc.stderr, proc.stderr
    assert image_ids(host) == before
    listed = docker(host, "image", "ls", "-a", "--format", "{{.Repository}}:{{.Tag}}").stdout
    assert "sneakernet-staging" not in listed and "big/" not in listed, listed
