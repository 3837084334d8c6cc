"""The benchmark tool runs end to end in its small mode (a tool, not a timed test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.coldcache import MemoryCgroup, _own_memory_cgroup, evict
from bench.recipe import DOCKERFILE, write_context
from tests.kit import engines

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.engine
def test_bench_small_mode_writes_a_results_table(tmp_path: Path) -> None:
    for tool in ("dockerd", "skopeo", "zstd", "sha256sum", "docker-registry"):
        engines.require(tool)
    engines.require_trixie_docker()  # the containerd-store rows
    # the issue 44 options in the same run (one engine-backed run for the suite): 3 layers (one
    # build step fewer than the default 4), and the imports cold (inputs evicted, each import in a
    # memory cgroup; root and a memory cgroup needed)
    if _own_memory_cgroup() is None or os.geteuid() != 0:
        engines.unavailable("bench --cold needs root and a memory cgroup")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--small", "--layers", "3", "--cold",
                           "--cold-memory", "160M", "--only", "export,import,pull,verify",
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "results")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    assert "(3 layers)" in table and "each import in a memory cgroup of 160 MiB" in table, table
    assert "| read MiB | temp disk MiB | output MiB | ours/peer |" in table, table
    for case in ("docker save -o", "bundle export", "docker load -i plain.tar", "bundle-import --verify",
                 "sha256sum -c SHA256SUMS", "bundle-import --verify-only", "skopeo copy",
                 "docker pull (loopback registry, uncompressed)"):
        assert case in table, case
    # both Docker image stores in one run: the containerd store's rows, each ours/peer ratio named
    rows = [line for line in table.splitlines() if "(containerd store" in line]
    assert any("| **bundle export (content store)** |" in r for r in rows), rows
    assert any("| **bundle export (via docker save)** |" in r for r in rows), rows
    save = next(r for r in rows if r.startswith("| export (containerd store) | docker save -o |"))
    assert "x (content store), " in save and "x (via docker save) |" in save, save
    load = next(r for r in rows if r.startswith("| import (containerd store, cold) | docker load -i plain.tar |"))
    assert load.rstrip(" |").endswith("x"), load
    assert "ours/peer" in table
    results = Path(proc.stderr.strip().splitlines()[-1].split("results in ", 1)[1])
    assert results.read_text().strip() == table.strip()
    assert results.name.endswith("-48M-3layers-cold.md") and results.parent == tmp_path / "results", results
    data = json.loads(results.with_suffix(".json").read_text())
    assert data["meta"]["layers"] == data["meta"]["layers_containerd"] == 3, data["meta"]
    for row in data["rows"]:
        assert row["temp_disk_bytes"] >= 0 and row["disk_peak_bytes"] >= 0, row
    # cold: every byte of each import's input came from the disk (evicted first), none from memory
    cold = {(r["group"], r["case"]): r["read_bytes_median"] for r in data["rows"] if "cold" in r["group"]}
    bundles = {"import (cold)": tmp_path / "work" / "artifacts" / "b",
               "import (containerd store, cold)": tmp_path / "work" / "cartifacts" / "b"}
    for group, bundle in bundles.items():
        size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        assert cold[(group, "bundle-import --verify")] >= size, (group, cold, size)
        assert cold[(group, "docker load -i plain.tar")] >= (bundle.parent / "plain.tar").stat().st_size, cold


@pytest.mark.engine
def test_bench_serve_small_mode_compares_with_docker_registry(tmp_path: Path) -> None:
    for tool in ("dockerd", "skopeo", "docker-registry"):
        engines.require(tool)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "serve.py"), "--small", "--bundle-as", "parts",
                           "--idle", "8", "--work", str(tmp_path / "work")], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    ours = next(line for line in table.splitlines() if line.startswith("| **bundle-import serve** |"))
    assert ours.rstrip(" |").endswith("x"), ours  # its ratio to the registry
    assert any(line.startswith("| docker-registry |") for line in table.splitlines()), table
    idle = next(line for line in table.splitlines() if line.startswith("| **bundle-import serve, 8 idle conns** |"))
    assert idle.rstrip(" |").endswith("x"), idle  # pulls still complete with 8 silent connections held open
    results = Path(proc.stderr.strip().splitlines()[-1].split("results in ", 1)[1])
    assert results.read_text().strip() == table.strip()
    assert json.loads(results.with_suffix(".json").read_text())["meta"]["bundle_as"] == "parts"


def test_bench_files_small_mode_measures_export_parts_and_import(tmp_path: Path) -> None:
    """bench/files.py (issue 42 point 6): needs no engine; a file through export, parts and import
    against cp and sha256sum, everything it made deleted."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "files.py"), "--small", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    for step, ratio in (("export", "x** cp + sha256sum |"), ("pack", "x** cp |"), ("import", "x** cp + sha256sum |")):
        row = next(line for line in table.splitlines() if line.startswith(f"| {step} | **bundle"))
        assert row.endswith(ratio), row
        assert ("x cp + openssl; **" in row) == (step != "pack"), row  # hashing at SHA-NI speed too
    assert "disk at most one file's size beyond the output: met" in table, table
    results = Path(proc.stderr.strip().splitlines()[-1].split("results in ", 1)[1])
    assert results.read_text().strip() == table.strip()
    assert json.loads(results.with_suffix(".json").read_text())["meta"]["size_bytes"] == 16 << 20
    assert list(tmp_path.iterdir()) == []  # the source, bundle, parts and imported copy are gone


def test_recipe_spreads_the_mix_over_the_layers_asked(tmp_path: Path) -> None:
    """--layers N: busybox and N-1 equal slices of the mix, each its own COPY (one layer) and blob."""
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF" + bytes(100))
    total = 6 << 20
    ctx = write_context(tmp_path / "mixed", total, str(busybox), small_files=40, layers=5)
    lines = (ctx / DOCKERFILE).read_text().splitlines()
    assert len(lines) == 6 and lines[1:] == ["COPY busybox /bin/busybox",
                                             *[f"COPY l{k:03d} /data/l{k:03d}" for k in range(4)]], lines
    randoms = [(ctx / f"l{k:03d}" / "random.bin").read_bytes() for k in range(4)]
    assert {len(r) for r in randoms} == {total // 3 // 4} and len(set(randoms)) == 4  # no two layers alike
    for k in range(4):
        assert len(list((ctx / f"l{k:03d}" / "small").rglob("*.txt"))) == 10
        lib = sum(p.stat().st_size for p in (ctx / f"l{k:03d}" / "lib").rglob("*") if p.is_file())
        assert total // 2 // 4 - (1 << 20) <= lib <= total // 2 // 4 + (1 << 20), lib
    ctx = write_context(tmp_path / "inc", total, str(busybox), recipe="incompressible", layers=3)
    assert len((ctx / DOCKERFILE).read_text().splitlines()) == 4
    assert (ctx / "l001" / "random.bin").stat().st_size == total * 7 // 8 // 2
    assert not (ctx / "l001" / "small").exists()
    # left out: the 4 layers of the earlier tables, unchanged
    ctx = write_context(tmp_path / "plain", total, str(busybox), small_files=10)
    assert (ctx / DOCKERFILE).read_text().splitlines()[1:] == [
        "COPY busybox /bin/busybox", "COPY random.bin /data/random.bin", "COPY lib /data/lib", "COPY small /data/small"]
    with pytest.raises(ValueError, match="at least 2 layers"):
        write_context(tmp_path / "one", total, str(busybox), layers=1)


def test_temp_disk_is_the_median_run_with_a_noisy_run_shown_as_max() -> None:
    """statvfs counts every writer on the disk: one run beside another job's writes (issue 44's
    1 GiB 100-layer bench, bundle-import round 1 of 3: 1977 MiB, rounds 2 and 3: 940) must not
    become the case's temp disk; the table shows the median and names the max beside it."""
    from bench.run import Case, Sample, fmt_row, render

    mib = 1 << 20

    def row(temps_mib: list[int]) -> dict[str, object]:
        case = Case("import", "bundle-import --verify", True, None, lambda: [])
        case.samples = [Sample(1.0, 1.0, 1024, 1.0, disk_peak=(1113 + t) * mib, disk_end=1113 * mib)
                        for t in temps_mib]
        return fmt_row(case)

    noisy = row([1977, 940, 940])
    assert noisy["temp_disk_median_bytes"] == 940 * mib and noisy["temp_disk_bytes"] == 1977 * mib, noisy
    assert noisy["temp_disk_runs_bytes"] == [1977 * mib, 940 * mib, 940 * mib], noisy
    assert noisy["disk_peak_median_bytes"] == (1113 + 940) * mib, noisy
    steady = row([932, 937, 938])
    meta = {"date": "d", "image_bytes": 1 << 30, "layers": 100, "runs": 3, "machine": {}}
    lines = render([noisy, {**steady, "ours": False, "case": "docker load -i plain.tar"}], meta).splitlines()
    assert "| 940 (max 1977) | 0 |" in lines[-2], lines[-2]
    assert "| 937 | 0 |" in lines[-1], lines[-1]


def test_cold_reads_come_from_disk_twice_in_the_memory_cgroup(tmp_path: Path) -> None:
    """bench/coldcache.py: evicted, a file is read from disk once; read twice inside a memory cgroup
    smaller than the file, twice (the bundle larger than the page cache, at 32 MiB)."""
    if _own_memory_cgroup() is None or os.geteuid() != 0:
        engines.unavailable("bench --cold needs root and a memory cgroup")
    data = tmp_path / "bundle.bin"
    data.write_bytes(os.urandom(32 << 20))
    twice = ["sh", "-c", 'cat "$0" >/dev/null && cat "$0" >/dev/null', str(data)]

    def read_bytes(argv: list[str]) -> int:
        proc = subprocess.Popen(argv)
        _, status, usage = os.wait4(proc.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return usage.ru_inblock * 512

    assert evict([tmp_path]) == 32 << 20
    once = read_bytes(twice)  # the second read from the page cache the first one filled
    assert 32 << 20 <= once < 40 << 20, once
    assert read_bytes(twice) < 1 << 20  # warm: nothing from disk
    cgroup = MemoryCgroup(12 << 20)
    try:
        evict([data])
        assert read_bytes(cgroup.wrap(twice)) >= 60 << 20  # both reads from disk
    finally:
        cgroup.close()
    assert not cgroup.path.exists()


@pytest.mark.engine
@pytest.mark.parametrize("docker_store", engines.DOCKER_STORES, indirect=True)
def test_bench_image_load_gives_the_files_a_build_gives(tmp_path: Path, docker_store: str,
                                                        docker_store_host: str, busybox: str) -> None:
    """bench/imageload.py (--setup load): the context loaded without a build has one layer per COPY
    line and the same files (names, modes, bytes) as `docker build` of it; in the containerd store
    its layers are gzip blobs, as a build leaves them."""
    import tarfile

    from bench.imageload import copy_lines, load_context

    ctx = write_context(tmp_path / "ctx", 3 << 20, busybox, small_files=12, layers=3)
    env = engines.docker_env(docker_store_host)
    tag = f"bench-load-{docker_store}"
    image_id = load_context(ctx, f"{tag}:loaded", env, gzip=docker_store == "containerd")
    assert not (ctx / ".load").exists()  # its temp layers are gone
    engines.build_image(docker_store_host, ctx, f"{tag}:built")
    found = {}
    for kind in ("loaded", "built"):
        info = json.loads(engines.docker(docker_store_host, "image", "inspect", f"{tag}:{kind}"))[0]
        assert len(info["RootFS"]["Layers"]) == len(copy_lines(ctx)) == 3, info["RootFS"]
        if kind == "loaded" and docker_store == "classic":  # (the containerd store's ID is the manifest's digest)
            assert info["Id"] == image_id
        box = engines.docker(docker_store_host, "create", f"{tag}:{kind}", "/bin/busybox").strip()
        out = tmp_path / f"{kind}.tar"
        engines.docker(docker_store_host, "export", "-o", str(out), box)
        engines.docker(docker_store_host, "rm", box)
        with tarfile.open(out) as t:
            found[kind] = {m.name: (m.type, m.mode, m.size, t.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                           for m in t.getmembers() if not m.name.startswith(("dev", "etc", "proc", "sys", ".docker"))}
    assert found["loaded"] == found["built"] and len(found["loaded"]) > 20
    if docker_store == "containerd":
        saved = tmp_path / "saved.tar"
        engines.docker(docker_store_host, "save", "-o", str(saved), f"{tag}:loaded")
        with tarfile.open(saved) as t:
            manifest = json.loads(t.extractfile("manifest.json").read())  # type: ignore[union-attr]
            heads = {t.extractfile(name).read(2) for name in manifest[0]["Layers"]}  # type: ignore[union-attr]
        assert heads == {b"\x1f\x8b"}, heads
    engines.docker(docker_store_host, "image", "rm", f"{tag}:loaded", f"{tag}:built")


def test_bench_image_load_refuses_a_dockerfile_it_cannot_follow(tmp_path: Path) -> None:
    from bench.imageload import copy_lines
    from tests.kit.imagegen import layered_context

    ctx = layered_context(tmp_path / "ctx", files={"/a": "x"}, steps=["RUN rm /a"])
    with pytest.raises(ValueError, match=r"expected `COPY SRC /DST` or `FROM scratch`, found 'RUN rm /a'"):
        copy_lines(ctx)
