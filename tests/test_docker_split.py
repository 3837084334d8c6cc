"""The classic store's load in two (importer/sinks/dockersplit.py, issue 44 point 3): the first
third of the bytes loads as an image of its own under a staging name while the rest streams; the
second load names every layer and goes out only once the first answered; every layer is checked
in either stream; the partial name never outlives the load, passed or failed, and a failure in
either part leaves the engine's layer store as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import pytest

from importer.errors import BundleError, DecompressFailed, DiffIDMismatch, DigestMismatch
from importer.format.manifest import ImageRecord
from importer.format.staging import new_run_id, staging_ref
from importer.input.opened import open_bundle
from importer.sinks import dockersplit
from importer.sinks.docker import DockerSink
from importer.sinks.dockersplit import head_count, load_in_two
from importer.streams.commands import Result
from tests.kit import engines
from tests.kit.bundlegen import many_layers_bundle
from tests.kit.fuzzkit import flip_byte

LAYERS = 12
RUN = new_run_id()


def _staged(bundle: Path) -> List[ImageRecord]:
    images = open_bundle(str(bundle)).manifest().images
    return [dataclasses.replace(images[0], refs=(staging_ref(RUN, 0),), label=images[0].name)]


class _Body(io.BytesIO):
    def close(self) -> None:  # keep the bytes to read them back
        self.ended = True


class _Cmd:
    """A FedCommand that keeps what it was fed and records the order of calls in ``log``."""

    def __init__(self, name: str, log: List[str], fail: Optional[BaseException] = None) -> None:
        self.name, self.log, self.fail = name, log, fail
        self.stdin: Any = _Body()

    def finish(self) -> Result:
        self.log.append(f"{self.name} finish at {len(self.stdin.getvalue())}")
        if self.fail is not None:
            raise self.fail
        return Result(0, b"", "")

    def abort(self) -> None:
        self.log.append(f"{self.name} abort")

    def members(self) -> dict[str, bytes]:
        with tarfile.open(fileobj=io.BytesIO(self.stdin.getvalue()), mode="r:") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def _run(bundle: Path, images: List[ImageRecord], count: int, log: List[str],
         first_fails: Optional[BaseException] = None) -> tuple[_Cmd, List[_Cmd], List[str]]:
    first = _Cmd("first", log, first_fails)
    seconds: List[_Cmd] = []
    forgot: List[str] = []

    def open_second() -> _Cmd:
        seconds.append(_Cmd("second", log))
        return seconds[-1]

    def forget(ref: str) -> None:
        log.append("forget")
        forgot.append(ref)

    with contextlib.suppress(BundleError):
        load_in_two(first, open_second, str(bundle), images, count, None, forget)
    return first, seconds, forgot


def test_how_many_layers_go_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = _staged(many_layers_bundle(tmp_path / "b", LAYERS))
    assert head_count(images) == 0  # under SPLIT_ABOVE: one load
    monkeypatch.setattr(dockersplit, "SPLIT_ABOVE", 0)
    sizes = [x.uncompressed_size for x in images[0].layers]
    n = head_count(images)
    assert 0 < n < LAYERS
    assert sum(sizes[:n]) * 3 >= sum(sizes) > sum(sizes[:n - 1]) * 3  # the smallest prefix holding a third
    assert head_count([dataclasses.replace(images[0], refs=("many/layers:1",))]) == 0  # not a staging name
    assert head_count([dataclasses.replace(images[0], refs=())]) == 0  # loaded untagged
    assert head_count([dataclasses.replace(images[0], layers=images[0].layers[-2:])]) == 0  # the last holds most


def test_two_archives_the_second_naming_every_layer_after_its_first_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = many_layers_bundle(tmp_path / "b", LAYERS)
    images = _staged(bundle)
    monkeypatch.setattr(dockersplit, "SPLIT_ABOVE", 0)
    n = head_count(images)
    log: List[str] = []
    first, seconds, forgot = _run(bundle, images, n, log)
    layers = images[0].layers
    partial = staging_ref(RUN, 1)  # the run's staging names are 0..len(images)-1
    assert forgot == [partial] and len(seconds) == 1
    one, two = first.members(), seconds[0].members()
    config_name = next(k for k in one if k.endswith(".json") and k != "manifest.json")
    config = json.loads(one[config_name])
    real = json.loads((bundle / images[0].config.digest.blob_path).read_bytes())
    assert config == {"architecture": real["architecture"], "os": real["os"],
                      "rootfs": {"type": "layers", "diff_ids": [str(x.diff_id) for x in layers[:n]]}}
    assert json.loads(one["manifest.json"]) == [{"Config": config_name, "RepoTags": [partial],
                                                 "Layers": [f"{x.diff_id.hex}/layer.tar" for x in layers[:n]]}]
    assert [k for k in one if k.endswith("layer.tar")] == [f"{x.diff_id.hex}/layer.tar" for x in layers[:n]]
    assert [k for k in two if k.endswith("layer.tar")] == [f"{x.diff_id.hex}/layer.tar" for x in layers[n:]]
    assert json.loads(two["manifest.json"])[0]["Layers"] == [f"{x.diff_id.hex}/layer.tar" for x in layers]
    assert json.loads(two["manifest.json"])[0]["RepoTags"] == list(images[0].refs)
    # the first body ended before the second began; its answer was read before manifest.json went out
    assert first.stdin.ended
    at = int(log[0].rsplit(" ", 1)[1])
    assert log[0].startswith("first finish") and log[1].startswith("second finish") and log[2] == "forget", log
    assert seconds[0].stdin.getvalue().find(b"manifest.json") >= at


@pytest.mark.parametrize("where", ["first", "second"])
def test_a_damaged_layer_in_either_part_names_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      where: str) -> None:
    bundle = many_layers_bundle(tmp_path / "b", LAYERS)
    images = _staged(bundle)
    monkeypatch.setattr(dockersplit, "SPLIT_ABOVE", 0)
    n = head_count(images)
    bad = images[0].layers[0 if where == "first" else n + 1]
    flip_byte(bundle / bad.digest.blob_path)
    log: List[str] = []
    with pytest.raises((DigestMismatch, DecompressFailed, DiffIDMismatch)) as err:
        load_in_two(_Cmd("first", log), lambda: _Cmd("second", log), str(bundle), images, n, None,
                    lambda ref: log.append("forget"))
    assert str(bad.digest) in err.value.message
    if where == "first":  # cut before its manifest.json; the second never opened
        assert log == ["first abort", "forget"], log
    else:  # the second cut; the first's answer waited for (its layers registered), then its name removed
        assert log[0] == "second abort" and log[1].startswith("first finish") and log[2] == "forget", log


def test_the_first_load_refused_stops_the_second_before_its_manifest(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = many_layers_bundle(tmp_path / "b", LAYERS)
    images = _staged(bundle)
    monkeypatch.setattr(dockersplit, "SPLIT_ABOVE", 0)
    log: List[str] = []
    refused = BundleError("loading the bundle into Docker: no space left on device")
    _, seconds, _ = _run(bundle, images, head_count(images), log, first_fails=refused)
    assert log[0].startswith("first finish") and log[1] == "second abort" and log[2] == "forget", log
    assert b"manifest.json" not in seconds[0].stdin.getvalue()
    with pytest.raises(BundleError, match="no space left"):
        load_in_two(_Cmd("first", [], refused), lambda: _Cmd("second", []), str(bundle), images,
                    head_count(images), None, lambda ref: None)


# ============================== against a real Docker 20.10 (classic store)
def _layer_ids(docker_host: str) -> set[str]:
    name = docker_host.rsplit("/dockerd-", 1)[1].split("/", 1)[0]
    db = engines.dockerd_dir(name) / "data" / "image" / "overlay2" / "layerdb" / "sha256"
    return {p.name for p in db.iterdir()} if db.exists() else set()


def _loads_since(docker_host: str, since: float) -> List[str]:
    out = engines.docker(docker_host, "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
                         "--filter", "type=image", "--filter", "event=load", "--format", "{{.ID}}")
    return out.split()


@pytest.mark.engine
@pytest.mark.parametrize("damaged", [None, "first", "second"])
def test_the_engine_holds_the_image_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     docker_host: str, damaged: Optional[str]) -> None:
    bundle = many_layers_bundle(tmp_path / "b", LAYERS)
    images = _staged(bundle)
    monkeypatch.setattr(dockersplit, "SPLIT_ABOVE", 0)
    n = head_count(images)
    sink = DockerSink(docker_host)
    assert sink.probe() and sink.image_store == "classic"
    before_layers, before_images = _layer_ids(docker_host), sorted(engines.docker(docker_host, "images", "-aq").split())
    if damaged:
        flip_byte(bundle / images[0].layers[1 if damaged == "first" else n + 1].digest.blob_path)
    since = time.time() - 0.5
    load: Callable[[], None] = lambda: sink.load(str(bundle), images, None)  # noqa: E731
    if damaged:
        with pytest.raises((DigestMismatch, DecompressFailed, DiffIDMismatch)):
            load()
        assert sorted(engines.docker(docker_host, "images", "-aq").split()) == before_images  # (listed in no set order)
        assert _layer_ids(docker_host) == before_layers  # the first part's layers went with its name
        assert not [r for r in sink.list_tags("sneakernet-staging/*")]
        return
    load()
    found = sink.lookup(images[0].refs[0])
    assert found is not None and found.image_id == str(images[0].config.digest)
    assert len(_layer_ids(docker_host) - before_layers) == LAYERS
    loads = _loads_since(docker_host, since)
    assert len(loads) == 2 and loads[-1] == str(images[0].config.digest), loads  # two loads: the part, the whole
    assert sink.list_tags("sneakernet-staging/*") == [images[0].refs[0]]  # the partial name is gone
    assert loads[0] not in engines.docker(docker_host, "images", "-aq", "--no-trunc")
    sink.remove(images[0].refs[0])
