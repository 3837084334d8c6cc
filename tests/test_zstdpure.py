"""The pure-Python zstd decoder (importer/streams/zstdpure.py) against frames made by the `zstandard`
module and the zstd command, byte for byte; its bounds; and the fallback that uses it."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import zstandard

from importer.errors import BundleError, LimitExceeded
from importer.streams import compression, zstdpure
from importer.streams.zstdpure import ZstdFormatError
from tests.kit.engines import require

REPO = Path(__file__).resolve().parents[1]


def _samples() -> Dict[str, bytes]:
    rnd = random.Random(7)
    text = b"".join(p.read_bytes() for p in sorted((REPO / "importer").rglob("*.py")))
    binary = b"".join(p.read_bytes()[:200_000] for p in sorted(Path(sys.executable).resolve().parent.glob("*"))[:8]
                      if p.is_file())
    pieces: List[bytes] = []
    for _ in range(300):
        k = rnd.randrange(4)
        if k == 0:
            start = rnd.randrange(len(text) - 6000)
            pieces.append(text[start:start + rnd.randint(1, 6000)])
        elif k == 1:
            pieces.append(rnd.randbytes(rnd.randint(1, 4000)))
        elif k == 2:
            pieces.append(bytes([rnd.randrange(256)]) * rnd.randint(1, 80_000))
        else:  # a long match far back (offsets up to ~1 MiB)
            joined = b"".join(pieces[-40:])
            start = rnd.randrange(max(1, len(joined) - 70_000))
            pieces.append(joined[start:start + rnd.randint(3, 70_000)])
    return {
        "empty": b"",
        "one byte": b"x",
        "text": text,
        "binary": binary,
        "incompressible": rnd.randbytes(700_000),
        "zeros (long matches)": bytes(3_000_000),
        "mixed": b"".join(pieces),
    }


SAMPLES = _samples()


def _stream(cctx: Any, data: bytes) -> bytes:
    """Compressed the way bundle/blobstore.py does: a stream writer, content size unknown."""
    out = io.BytesIO()
    with cctx.stream_writer(out, closefd=False) as w:
        for i in range(0, len(data), 1 << 20):
            w.write(data[i:i + (1 << 20)])
    return out.getvalue()


@pytest.mark.parametrize("name", list(SAMPLES))
@pytest.mark.parametrize("level", [1, 3, 9, 19, -5])
def test_frames_of_the_zstandard_module(name: str, level: int) -> None:
    data = SAMPLES[name]
    for threads in (0, 2):
        for checksum in (True, False):
            cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=checksum)
            with_size = cctx.compress(data)  # one shot: content size in the header
            assert zstdpure.decompress(with_size) == data, (threads, checksum, "content size")
            assert zstdpure.decompress(_stream(cctx, data)) == data, (threads, checksum, "stream")


def test_the_exporters_own_layer_blobs(tmp_path: Path) -> None:
    from bundle.blobstore import BlobStore

    data = SAMPLES["mixed"] + SAMPLES["binary"]
    for level in (1, 3, 19):
        store = BlobStore(str(tmp_path / str(level)), fsync=False)
        layer = store.write_layer(io.BytesIO(data), compression="zstd", level=level)
        blob = Path(store.path_of(layer.digest)).read_bytes()
        assert zstdpure.decompress(blob) == data


def test_concatenated_and_skippable_frames() -> None:
    parts = [SAMPLES["text"], b"", SAMPLES["incompressible"][:5000], SAMPLES["mixed"][:300_000]]
    frames = [zstandard.ZstdCompressor(level=i + 1, write_checksum=bool(i % 2)).compress(p)
              for i, p in enumerate(parts)]
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    stream = frames[0] + skippable + b"".join(frames[1:])
    assert zstdpure.decompress(stream) == b"".join(parts)
    assert zstdpure.decompress(b"") == b""


CLI_OPTIONS = [["-1"], ["-3"], ["-19"], ["--ultra", "-22"], ["-3", "--no-check"], ["-3", "-T2"],
               ["-19", "--long=25"], ["--fast=3"], ["-3", "--no-content-size"]]


@pytest.mark.parametrize("options", CLI_OPTIONS, ids=" ".join)
def test_frames_of_the_zstd_command(tmp_path: Path, options: List[str]) -> None:
    zstd = require("zstd")  # installed by install-deps.sh: a skip here fails under CI=true
    data = SAMPLES["mixed"] + SAMPLES["binary"] + SAMPLES["text"]
    src = tmp_path / "data"
    src.write_bytes(data)
    made = subprocess.run([zstd, "-q", "-c", *options, str(src)], capture_output=True, check=True).stdout
    piped = subprocess.run([zstd, "-q", "-c", *options], input=data, capture_output=True, check=True).stdout
    assert zstdpure.decompress(made) == data
    assert zstdpure.decompress(piped + made) == data + data  # two frames, one after the other


def test_a_window_above_the_limit_is_refused() -> None:
    # frame header: no single segment, window descriptor exponent 18 -> 2^28 bytes
    frame = (0xFD2FB528).to_bytes(4, "little") + bytes([0x00, 18 << 3]) + b"\x01\x00\x00"
    with pytest.raises(ZstdFormatError, match="window"):
        zstdpure.decompress(frame)


def test_damaged_frames_raise_the_format_error_only_and_never_hang() -> None:
    """Every single-byte change and every truncation of a few frames: the decoder either returns
    (the diff_id check catches changed output) or raises ZstdFormatError; nothing else, quickly."""
    rnd = random.Random(3)
    sources = [SAMPLES["mixed"][:40_000], SAMPLES["text"][:30_000], SAMPLES["binary"][:30_000]]
    started = time.monotonic()
    tried = refused = 0
    for data in sources:
        frame = zstandard.ZstdCompressor(level=9, write_checksum=True).compress(data)
        variants = [frame[:n] for n in range(0, len(frame), max(1, len(frame) // 60))]
        for _ in range(250):
            b = bytearray(frame)
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
            variants.append(bytes(b))
        for bad in variants:
            tried += 1
            try:
                out = zstdpure.decompress(bad)
            except ZstdFormatError:
                refused += 1
                continue
            assert len(out) <= len(data) + zstdpure.BLOCK_MAX
    assert tried > 800 and refused > tried // 2
    assert time.monotonic() - started < 120


@pytest.fixture
def only_the_pure_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compression, "_zstd_module", lambda: None)
    monkeypatch.setattr(compression.shutil, "which", lambda name: None)
    monkeypatch.setattr(compression, "_noted", False)


def test_the_pure_fallback_stops_a_bomb_at_the_recorded_size(only_the_pure_decoder: None) -> None:
    assert compression._zstd_module() is None and compression.shutil.which("zstd") is None  # the fixture holds
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(50_000_000))
    assert len(bomb) < 10_000
    with pytest.raises(LimitExceeded):
        with compression.open_decompressed(io.BytesIO(bomb), "zstd", bound=1_000_000, what="layer 1/1") as r:
            while r.read(1 << 16):
                pass
        pytest.fail("read past the bound")


def test_the_pure_fallback_notes_itself_once_with_the_expected_time(
        only_the_pure_decoder: None, capsys: pytest.CaptureFixture[str]) -> None:
    data = SAMPLES["text"]
    blob = zstandard.ZstdCompressor().compress(data)
    for _ in range(2):
        with compression.open_decompressed(io.BytesIO(blob), "zstd", bound=len(data), what="layer 1/2 of x") as r:
            assert r.read(len(data) + 1) == data
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "pure-Python decoder" in err and "layer 1/2 of x" in err and "takes about" in err


def test_a_damaged_layer_is_decompress_failed_with_the_pure_fallback(only_the_pure_decoder: None,
                                                                      tmp_path: Path) -> None:
    from importer.format.manifest import load_bundle_manifest
    from importer.input.layers import check_layer
    from tests.kit.bundlegen import make_bundle

    b = make_bundle(tmp_path / "b")
    manifest = load_bundle_manifest((b / "bundle.json").read_bytes())
    layer = max(manifest.images[0].layers, key=lambda x: x.size)
    blob = b / layer.digest.blob_path
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0x55
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))
    with pytest.raises(BundleError) as info:
        check_layer(str(b), layer, "layer 1")
    assert info.value.reference in ("decompress-failed", "digest-mismatch", "size-mismatch", "diffid-mismatch")


# ============================== export --compression auto, from the inventory's decoders

def _inventory_file(tmp_path: Path, decoders: Any, name: str, engine_kind: str = "docker",
                    engine_version: str = "26.1.5") -> str:
    """An inventory whose host has ``decoders``; its engine reads zstd unless told otherwise."""
    from importer.engines import EngineImage, EngineInfo
    from importer.inventory.engine import build_inventory, checksum

    engine = EngineInfo(engine_kind, engine_version, "overlay2", "classic", "unix:///var/run/docker.sock")
    doc = build_inventory(engine, [EngineImage("sha256:" + "a" * 64, ["sha256:" + "1" * 64], ["x:1"])])
    if decoders is None:  # as an inventory 1.0 was written
        del doc["decoders"]
        doc["inventoryVersion"] = "1.0"
    else:
        doc["decoders"] = decoders
    doc["checksum"] = checksum(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_inventory_lists_the_hosts_decoders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema

    from importer.inventory.engine import load_inventory

    schema = json.loads((REPO / "schemas" / "inventory" / "inventory-v1.schema.json").read_text())
    doc = load_inventory(Path(_inventory_file(tmp_path, compression.host_decoders(), "i.json")).read_bytes())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["decoders"][0] == "gzip" and doc["decoders"][-1] == "zstd-pure-python"
    assert "zstandard" in doc["decoders"]  # this test environment has the module
    monkeypatch.setattr(compression, "importlib", type("I", (), {"import_module": staticmethod(_no_module)}))
    monkeypatch.setattr(compression.shutil, "which", lambda name: None)
    assert compression.host_decoders() == ["gzip", "zstd-pure-python"]
    monkeypatch.setattr(compression.shutil, "which", lambda name: "/usr/bin/zstd")
    assert compression.host_decoders() == ["gzip", "zstd-cli", "zstd-pure-python"]


def _no_module(name: str) -> Any:
    raise ImportError(name)


def test_auto_compression_follows_the_have_inventory(tmp_path: Path) -> None:
    from bundle.export import choose_compression

    slow = _inventory_file(tmp_path, ["gzip", "zstd-pure-python"], "slow.json")
    cli = _inventory_file(tmp_path, ["gzip", "zstd-cli", "zstd-pure-python"], "cli.json")
    py314 = _inventory_file(tmp_path, ["gzip", "compression.zstd", "zstd-pure-python"], "py314.json")
    old = _inventory_file(tmp_path, None, "old.json")
    assert choose_compression([]) == "zstd"  # nothing known: zstd (the pure decoder still imports it)
    assert choose_compression([slow]) == "gzip"
    assert choose_compression([cli]) == "zstd"
    assert choose_compression([py314]) == "zstd"
    assert choose_compression([old]) == "zstd"  # a 1.0 inventory does not say
    assert choose_compression([old, slow]) == "gzip"
    assert choose_compression([cli, slow]) == "gzip"  # one of the hosts would decode slowly
    bundle_json = tmp_path / "bundle.json"
    bundle_json.write_text(json.dumps({"mediaType": "application/vnd.sneakernet.bundle.v3+json", "images": []}))
    assert choose_compression([str(bundle_json)]) == "zstd"


def test_export_defaults_to_auto() -> None:
    from bundle.cli import build_parser

    args = build_parser().parse_args(["export", "x:1", "-o", "out"])
    assert args.compression == "auto"


def test_auto_compression_is_gzip_for_an_engine_that_reads_no_zstd(tmp_path: Path) -> None:
    """Issue 25: the inventory's engine version decides too (Docker 20.10 pulls and loads no zstd
    layer; containerd from 1.5 does), whatever decoders python3 has on that host."""
    from bundle.export import choose_compression
    from importer.inventory.have import engine_reads_zstd

    fast = ["gzip", "zstandard", "zstd-pure-python"]
    docker20 = _inventory_file(tmp_path, fast, "d20.json", "docker", "20.10.24+dfsg1")
    docker23 = _inventory_file(tmp_path, fast, "d23.json", "docker", "23.0.0")
    ctr14 = _inventory_file(tmp_path, fast, "c14.json", "containerd", "v1.4.13")
    ctr17 = _inventory_file(tmp_path, fast, "c17.json", "containerd", "1.7.24~ds1")
    podman = _inventory_file(tmp_path, fast, "p.json", "podman", "4.3.1")
    assert choose_compression([docker20]) == "gzip"
    assert choose_compression([docker23]) == "zstd"
    assert choose_compression([ctr14]) == "gzip"
    assert choose_compression([ctr17]) == "zstd"
    assert choose_compression([podman]) == "zstd"
    assert choose_compression([docker23, docker20]) == "gzip"  # one of the hosts cannot read zstd
    # hostile or odd versions say nothing rather than guess
    assert engine_reads_zstd("docker", "") is None
    assert engine_reads_zstd("docker", "dev") is None
    assert engine_reads_zstd("docker", "9" * 5000) is None
    assert engine_reads_zstd("docker", "1" * 5 + ".1") is None
    assert engine_reads_zstd("other", "30.0") is None
    # another script's digits are no version (issue 38): as 'dev', not Docker 23 or containerd 1.5
    for version in ("\u0662\u0663.\u0660", "\uff12\uff13.\uff10", "2\u0663.0", "23.\u00b9", "\u00b2\u00b3.0"):
        assert engine_reads_zstd("docker", version) is None and engine_reads_zstd("containerd", version) is None
