"""The benchmark tool runs end to end in its small mode (a tool, not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit import engines

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.engine
def test_bench_small_mode_writes_a_results_table(tmp_path: Path) -> None:
    for tool in ("dockerd", "skopeo", "zstd", "sha256sum", "docker-registry"):
        engines.require(tool)
    engines.require_trixie_docker()  # the containerd-store rows
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--small",
                           "--only", "export,import,pull,verify", "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    for case in ("docker save -o", "bundle export", "docker load -i plain.tar", "bundle-import --verify",
                 "sha256sum -c SHA256SUMS", "bundle-import --verify-only", "skopeo copy",
                 "docker pull (loopback registry, uncompressed)"):
        assert case in table, case
    # both Docker image stores in one run: the containerd store's rows, each ours/peer ratio named
    rows = [line for line in table.splitlines() if "(containerd store)" in line]
    assert any("| **bundle export (content store)** |" in r for r in rows), rows
    assert any("| **bundle export (via docker save)** |" in r for r in rows), rows
    save = next(r for r in rows if r.startswith("| export (containerd store) | docker save -o |"))
    assert "x (content store), " in save and "x (via docker save) |" in save, save
    load = next(r for r in rows if r.startswith("| import (containerd store) | docker load -i plain.tar |"))
    assert load.rstrip(" |").endswith("x"), load
    assert "ours/peer" in table
    results = Path(proc.stderr.strip().splitlines()[-1].split("results in ", 1)[1])
    assert results.read_text().strip() == table.strip()


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
