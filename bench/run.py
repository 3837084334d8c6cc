#!/usr/bin/env python3
"""Side-by-side benchmark: sneakernet vs docker save/load, zstd, sha256sum and skopeo.

Puts the synthetic image (bench/recipe.py) in a private dockerd (``docker load`` of its layers,
bench/imageload.py; ``--setup build`` builds it), then runs each case
alternating with its peers, ``--runs`` times, and records wall time, CPU time and peak RSS of
the measured process tree (and the CPU time dockerd + containerd spent). Prints a table with
ratios ours/peer and writes it to bench/results/. Not a test: a tool.

    python3 bench/run.py                 # 3 GiB image, 3 runs (about 30-40 min on 2 cores)
    python3 bench/run.py --size 10G --runs 1 --only export,import   # the memory check
    python3 bench/run.py --small         # CI smoke mode: 48 MiB, 1 run, results to a temp dir
    python3 bench/run.py --size 1G --runs 2 --only export,import --stores containerd
    python3 bench/run.py --size 10G --layers 80 --runs 1 --only export,import      # issue 44's headline
    python3 bench/run.py --size 1G --layers 100 --only export,import               # per-layer costs
    python3 bench/run.py --size 10G --layers 80 --only import --stores containerd --cold --cold-memory 1G

Disk (estimated, mixed recipe): about 8x SIZE free on the disk of --work and SNEAKERNET_RUN for
--only export,import with both stores (the image in each store, two docker save tars, a zstd
tar, two bundles, an export's output and dockerd's temp copy for docker save; the build context
and dockerd's copy of it while building), 5.5x with --stores classic, 4x with --stores
containerd; the pull group adds 2x. The results file records the run's real peak
(bench_disk_peak_bytes). Every case also records what its process tree read from disk (read
MiB) and the disk it wrote and removed again (temp disk MiB: the file systems' peak during the
command above the larger of their use before and after it; every writer on them counts).

Both Docker image stores by default (``--stores classic,containerd``): the classic one (overlay2)
and the containerd image store (Debian 13's dockerd 26 with the containerd snapshotter,
docker/scripts/dockerd.sh --containerd-store), the same image loaded (or built) in each. On the containerd
store ``bundle export`` is measured reading the engine's content store and, forced through the
``docker save`` stream (SNEAKERNET_DOCKER_CONTENT_STORE=0), beside ``docker save -o``; the import
beside ``docker load -i`` of that store's own save. On the classic store ``bundle export`` is
measured reading the image store's overlay2 layers (the default where it runs as root) and through
``docker save`` (``--docker-read save``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.coldcache import MemoryCgroup, evict  # noqa: E402
from bench.imageload import load_context  # noqa: E402
from bench.pullprobe import push_uncompressed  # noqa: E402
from bench.recipe import RECIPES, write_context  # noqa: E402

REF = "bench/img:1"
CTR_EXPORT = "export (containerd store)"
CTR_IMPORT = "import (containerd store)"
PY = sys.executable


@dataclass
class Sample:
    wall: float
    cpu: float
    maxrss_kib: int
    engine_cpu: float
    io_stall: float = 0.0  # seconds some task waited on IO (PSI "some"), whole machine
    out_bytes: int = 0
    read_bytes: int = 0  # what the block layer read for the measured process tree (ru_inblock)
    disk_peak: int = 0  # the disks' highest use during the command, above the use before it
    disk_end: int = 0  # their use after it, above the use before it (its output, the engine's growth)


@dataclass
class Case:
    group: str
    name: str
    ours: bool
    setup: Callable[[], None] | None
    argv: Callable[[], list[str]]
    cwd: Path | None = None
    output: Callable[[], Path | None] | None = None
    env: dict[str, str] | None = None  # another engine's environment (the containerd store)
    run_dir: Path | None = None  # that engine's state folder, for its CPU time
    tag: str = ""  # names an ours row's ratio where a group has several
    inputs: Callable[[], list[Path]] | None = None  # files it reads: evicted from the page cache under --cold
    samples: list[Sample] = field(default_factory=list)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def sh(cmd: str) -> list[str]:
    return ["bash", "-o", "pipefail", "-c", cmd]


def engine_pids(run_dir: Path) -> list[int]:
    pids = []
    for pidfile in [run_dir / "docker.pid", *run_dir.glob("exec/**/containerd.pid")]:
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(pidfile.read_text().strip()))
    return pids


def cpu_of(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def io_stall() -> float:
    """Seconds, since boot, that at least one task stalled on IO (/proc/pressure/io "some";
    0 where the kernel has no PSI). A case whose wall is far above its CPU time and stalls
    most of it is bound by the disk, not by a CPU stage."""
    try:
        for line in Path("/proc/pressure/io").read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def du(path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def disks_used(paths: list[Path]) -> int:
    """Bytes in use on the file systems holding ``paths`` (each counted once)."""
    seen: dict[int, int] = {}
    for p in paths:
        with contextlib.suppress(OSError):
            st = os.statvfs(p)
            seen[os.stat(p).st_dev] = (st.f_blocks - st.f_bfree) * st.f_frsize
    return sum(seen.values())


class DiskWatch:
    """The highest use of ``paths``' disks, polled every second on a thread until :meth:`stop`."""

    def __init__(self, paths: list[Path]) -> None:
        self.start = self.peak = disks_used(paths)
        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.wait(1.0):
                self.peak = max(self.peak, disks_used(paths))

        threading.Thread(target=poll, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def tree_hwm(root: int) -> int:
    """The largest VmHWM (KiB, each process's own peak RSS) in the process tree under ``root``."""
    best, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best, int(line.split()[1]))
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return best


def measure(case: Case, env: dict[str, str], run_dir: Path, *, disks: list[Path] | None = None,
            cold: MemoryCgroup | None = None) -> Sample:
    """Run ``case`` once. ``disks``: folders whose file systems' use is polled every 0.1 s (after a
    sync before and after: the previous case's writeback is not charged to this one) for the
    sample's disk_peak and disk_end, and with them the process tree's VmHWM (its peak RSS).
    ``cold``: the case's inputs are evicted from the page cache first and the command runs in that
    memory cgroup (bench/coldcache.py)."""
    if case.setup:
        case.setup()
    env = case.env or env
    run_dir = case.run_dir or run_dir
    argv = case.argv()
    if cold is not None:
        if case.inputs:
            evict(case.inputs())
        argv = cold.wrap(argv)
    disk0 = peak = hwm = 0
    stop = threading.Event()
    poller = None
    child: list[int] = []
    if disks:
        os.sync()
        disk0 = peak = disks_used(disks)

        def poll() -> None:
            nonlocal peak, hwm
            while not stop.wait(0.1):
                peak = max(peak, disks_used(disks))
                if child:
                    hwm = max(hwm, tree_hwm(child[0]))

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
    pids = engine_pids(run_dir)
    e0 = cpu_of(pids)
    io0 = io_stall()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=case.cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    child.append(proc.pid)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    stall = io_stall() - io0
    engine = cpu_of(pids) - e0
    stop.set()
    disk1 = 0
    if poller is not None:
        poller.join()
        peak = max(peak, disks_used(disks or []))
        os.sync()
        disk1 = disks_used(disks or [])
        peak = max(peak, disk1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bench: {case.group}/{case.name} exited {proc.returncode}: {err.decode()[-2000:]}")
    out = du(case.output()) if case.output else 0
    # the polled VmHWM where the command ran past the first poll: wait4's ru_maxrss starts at this
    # process's own (a child inherits its parent's high-water mark across fork and exec)
    return Sample(wall, usage.ru_utime + usage.ru_stime, hwm or usage.ru_maxrss, engine, out_bytes=out,
                  io_stall=stall, read_bytes=usage.ru_inblock * 512, disk_peak=max(0, peak - disk0),
                  disk_end=disk1 - disk0)


def fmt_row(case: Case) -> dict[str, object]:
    walls = [s.wall for s in case.samples]
    temps = [s.disk_peak - max(0, s.disk_end) for s in case.samples]
    return {
        "tag": case.tag,
        "group": case.group, "case": case.name, "ours": case.ours, "runs": len(walls),
        "wall_median": statistics.median(walls), "wall_min": min(walls), "wall_max": max(walls),
        "cpu_median": statistics.median(s.cpu for s in case.samples),
        "peak_rss_mib": max(s.maxrss_kib for s in case.samples) / 1024,
        "engine_cpu_median": statistics.median(s.engine_cpu for s in case.samples),
        "io_stall_median": statistics.median(s.io_stall for s in case.samples),
        "output_bytes": case.samples[-1].out_bytes,
        "read_bytes_median": statistics.median(s.read_bytes for s in case.samples),
        # what it wrote and removed again: the disks' peak above both their use before and after.
        # statvfs counts every writer on those disks, so one run beside another job's writes can
        # show a GiB that is not the command's (issue 44: bundle-import of the 1 GiB 100-layer image, round
        # 1 of 3: 1977 MiB, rounds 2 and 3: 940 each): the median is the command's, the max the worst run's
        "temp_disk_bytes": max(temps),
        "temp_disk_median_bytes": statistics.median(temps),
        "temp_disk_runs_bytes": temps,
        "disk_peak_bytes": max(s.disk_peak for s in case.samples),
        "disk_peak_median_bytes": statistics.median(s.disk_peak for s in case.samples),
        "disk_end_bytes": case.samples[-1].disk_end,
    }


def temp_disk_cell(row: dict[str, object]) -> str:
    """The table's temp disk: the median of the runs, and their max where it is 10% (and 16 MiB)
    above it (another writer on the disk during that run, or a case whose use varies)."""
    most = int(row.get("temp_disk_bytes", 0)) >> 20  # type: ignore[call-overload]
    median = int(row.get("temp_disk_median_bytes", row.get("temp_disk_bytes", 0))) >> 20  # type: ignore[call-overload]
    return f"{median} (max {most})" if most > median * 1.1 and most - median >= 16 else f"{median}"


def machine() -> dict[str, object]:
    def cmd(*a: str) -> str:
        try:
            return subprocess.run(a, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return ""
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    import zstandard
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(int(mem) / (1 << 20), 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "zstandard": zstandard.__version__, "docker": cmd("dockerd", "--version"),
        "docker_containerd_store": cmd(str(Path(os.environ.get("SNEAKERNET_TRIXIE_DOCKER",
                                                                "/opt/sneakernet/trixie-docker"))
                                           / "usr" / "sbin" / "dockerd"), "--version"),
        "skopeo": cmd("skopeo", "--version"), "zstd": cmd("zstd", "--version"),
        "sha256sum": cmd("sha256sum", "--version").splitlines()[0] if cmd("sha256sum", "--version") else "",
    }


def render(rows: list[dict[str, object]], meta: dict[str, object]) -> str:
    lines = [f"# sneakernet benchmark {meta['date']}", "",
             f"Image: {meta['image_bytes'] / (1 << 30):.2f} GiB ({meta['layers']} layers), "  # type: ignore[operator]
             f"runs per case: {meta['runs']}, recipe: {meta.get('recipe', 'mixed')}"
             + (f", cold: the import's inputs evicted from the page cache, each import in a memory cgroup of "
                f"{int(meta['cold_memory']) >> 20} MiB" if meta.get("cold_memory") else "")  # type: ignore[call-overload]
             + ".",
             "Machine: " + ", ".join(f"{k}: {v}" for k, v in dict(meta["machine"]).items()), "",  # type: ignore[call-overload]
             f"Setup ({meta.get('setup', 'build')}): " + ", ".join(
                 f"{k} {float(v):.0f} s" for k, v in dict(meta.get("setup_seconds") or {}).items()) + ".", "",  # type: ignore[call-overload]
             "| group | case | wall median (min-max) s | CPU s | peak RSS MiB | dockerd+containerd CPU s "
             "| IO stall s | read MiB | temp disk MiB | output MiB | ours/peer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    by_group: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        by_group.setdefault(str(r["group"]), []).append(r)
    for group, items in by_group.items():
        ours = [r for r in items if r["ours"]]
        for r in items:
            ratio = ""
            if ours and not r["ours"]:  # several ours rows: one ratio each, named by its tag
                ratio = ", ".join(
                    f"{float(o['wall_median']) / float(r['wall_median']):.2f}x"  # type: ignore[arg-type]
                    + (f" ({o['tag']})" if len(ours) > 1 and o.get("tag") else "") for o in ours)
            lines.append(
                f"| {group} | {'**' if r['ours'] else ''}{str(r['case']).replace('|', chr(92) + '|')}"
                f"{'**' if r['ours'] else ''} | "
                f"{r['wall_median']:.1f} ({r['wall_min']:.1f}-{r['wall_max']:.1f}) | {r['cpu_median']:.1f} | "
                f"{r['peak_rss_mib']:.0f} | {r['engine_cpu_median']:.1f} | {r['io_stall_median']:.1f} | "
                f"{float(r.get('read_bytes_median', 0)) / (1 << 20):.0f} | "  # type: ignore[arg-type]
                f"{temp_disk_cell(r)} | "
                f"{int(r['output_bytes']) / (1 << 20):.0f} | {ratio} |")  # type: ignore[call-overload]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="3G", help="image size (default 3G)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="export,import,pull,verify,push",
                    help="groups to run (pull: the docker-pull probe, shown with import; it needs "
                    "room for one more uncompressed copy of the image)")
    ap.add_argument("--small", action="store_true", help="CI mode: 48M, 1 run, results to a temp dir")
    ap.add_argument("--out", default=None, help="results folder (default bench/results; with --small a temp dir)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--level", type=int, default=None, help="zstd level for bundle export")
    ap.add_argument("--recipe", default="mixed", choices=RECIPES,
                    help="image recipe: mixed (random, library-like and small files; default) or "
                    "incompressible (mostly random bytes plus real shared libraries: issue 30's field case)")
    ap.add_argument("--stores", default="classic,containerd",
                    help="Docker image stores to measure (classic: every group; containerd: export and import)")
    ap.add_argument("--layers", type=int, default=None,
                    help="spread the recipe over this many layers (busybox, then N-1 equal slices of the mix; "
                    "default: the recipe's 4 layers, as in the earlier tables). Issue 44's cases: --size 10G "
                    "--layers 80 and --size 1G --layers 100")
    ap.add_argument("--cold", action="store_true",
                    help="the import groups read their input from disk every time: each input evicted from the "
                    "page cache before the command and the command run in a memory cgroup of --cold-memory "
                    "(bench/coldcache.py), so a bundle larger than that is read from disk again on its second "
                    "read, as one larger than the host's page cache is (root and a memory cgroup needed)")
    ap.add_argument("--cold-memory", default="512M",
                    help="--cold's memory limit for the measured command, its page cache included (default "
                    "512M; keep it above the command's peak RSS and below the bundle's size)")
    ap.add_argument("--setup", default="load", choices=("load", "build"),
                    help="how the image gets into each store: load (default: the context's COPY lines as the "
                    "layers of a docker-archive streamed into `docker load`, gzip layers for the containerd "
                    "store, bench/imageload.py; minutes for 10 GiB) or build (`docker build`, one step a layer: "
                    "12.5 and 28 minutes for 10 GiB in 80 layers on the 2-core VM)")
    args = ap.parse_args()
    if args.small:
        args.size, args.runs = "48M", 1
        args.out = args.out or tempfile.mkdtemp(prefix="sneakernet-bench-results.")
    args.out = args.out or str(REPO / "bench" / "results")
    groups = set(args.only.split(","))
    stores = set(args.stores.split(","))
    # bytecode as an installed package has it (pip compiles on install): where PYTHONDONTWRITEBYTECODE
    # is set, every `python3 -m bundle` would otherwise compile ~110 modules again (~0.4 s a run)
    subprocess.run([PY, "-m", "compileall", "-q", "-j0", str(REPO / "bundle"), str(REPO / "importer")],
                   capture_output=True, check=False)
    if not stores or stores - {"classic", "containerd"}:
        ap.error(f"--stores: expected classic and/or containerd, found {args.stores!r}")
    if args.layers is not None and not 2 <= args.layers <= 120:
        ap.error(f"--layers: expected 2 to 120 (overlay2 stacks at most 128), found {args.layers}")
    size = parse_size(args.size)
    cold = None
    if args.cold:
        try:
            cold = MemoryCgroup(parse_size(args.cold_memory))
        except RuntimeError as problem:
            ap.error(str(problem))
    imp, cimp = "import", CTR_IMPORT
    cold_groups = {imp: "import (cold)", cimp: CTR_IMPORT[:-1] + ", cold)"}
    work = Path(args.work or tempfile.mkdtemp(prefix="sneakernet-bench."))
    run_root = Path(os.environ.get("SNEAKERNET_RUN", "/tmp/sneakernet-run"))
    os.environ["SNEAKERNET_RUN"] = str(run_root)
    scripts = REPO / "docker" / "scripts"
    registries: list[str] = []
    daemons: list[str] = []  # purged (stopped by pid through the script) at the end

    def start_dockerd(name: str, *extra: str) -> tuple[dict[str, str], Path]:
        daemons.append(name)
        url = subprocess.run(["bash", str(scripts / "dockerd.sh"), "start", name, *extra], capture_output=True,
                             text=True, check=True).stdout.strip()
        return ({**os.environ, "DOCKER_HOST": url, "DOCKER_BUILDKIT": "0", "PYTHONPATH": str(REPO)},
                run_root / f"dockerd-{name}")

    def inspect(e: dict[str, str]) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(subprocess.run(["docker", "image", "inspect", REF], env=e,
                                                                check=True, capture_output=True, text=True).stdout)
        return found[0]

    work.mkdir(parents=True, exist_ok=True)
    run_root.mkdir(parents=True, exist_ok=True)
    disks = [work, run_root]  # the engines' state, their temp folders and ours: one disk here
    bench_disk = DiskWatch(disks)
    try:
        env, run_dir = start_dockerd("bench") if "classic" in stores else ({**os.environ}, run_root)
        host = env.get("DOCKER_HOST", "")
        if "containerd" in stores:
            cenv, crun_dir = start_dockerd("bench-ctrstore", "--containerd-store")
        print(f"bench: building a {args.size} image in {work}", file=sys.stderr)
        t_build = time.monotonic()
        ctx = write_context(work / "ctx", size, "/bin/busybox",
                            small_files=200 if args.small else None, recipe=args.recipe, layers=args.layers)
        build_s = {"context": time.monotonic() - t_build}  # how long the setup took: the context, each build
        for name, e in ([("classic", env)] if "classic" in stores else []) + (
                [("containerd", cenv)] if "containerd" in stores else []):
            t_build = time.monotonic()
            if args.setup == "load":
                load_context(ctx, REF, e, gzip=name == "containerd")
            else:
                subprocess.run(["docker", "build", "-q", "--network", "none", "-t", REF, str(ctx)], env=e,
                               check=True, capture_output=True)
            build_s[name] = time.monotonic() - t_build
        print(f"bench: context and {'loads' if args.setup == 'load' else 'builds'} took "
              + ", ".join(f"{k} {v:.0f} s" for k, v in build_s.items()),
              file=sys.stderr)
        shutil.rmtree(ctx)
        level = ["--level", str(args.level)] if args.level is not None else []
        cases: list[Case] = []
        presents: dict[str, Callable[[], None]] = {}  # group -> makes sure the image is there first
        warm: list[Path] = []  # bundles read by the verify and push groups
        if "classic" in stores:
            image = inspect(env)
            out = work / "out"

            def fresh_out() -> None:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()

            pulled: list[str] = []  # the pull probe's ref, removed with the image

            def image_absent() -> None:
                subprocess.run(["docker", "image", "rm", "-f", REF, *pulled], env=env, capture_output=True)

            def image_present() -> None:
                if subprocess.run(["docker", "image", "inspect", REF], env=env, capture_output=True).returncode:
                    subprocess.run(["docker", "load", "-i", str(art / "plain.tar")], env=env, check=True,
                                   capture_output=True)

            if "export" in groups:
                cases += [
                    Case("export", "docker save >/dev/null", False, fresh_out,
                         lambda: sh(f"docker save {REF} >/dev/null")),
                    Case("export", "docker save -o", False, fresh_out,
                         lambda: ["docker", "save", "-o", str(out / "plain.tar"), REF], output=lambda: out),
                    Case("export", "docker save | zstd -T0 -3", False, fresh_out,
                         lambda: sh(f"docker save {REF} | zstd -T0 -3 -q -o {out}/x.tar.zst"), output=lambda: out),
                    Case("export", "skopeo copy -> oci (zstd)", False, fresh_out,
                         lambda: ["skopeo", "copy", "-q", "--src-daemon-host", host, "--dest-compress-format",
                                  "zstd", f"docker-daemon:{REF}", f"oci:{out}/sk:img"], output=lambda: out),
                    Case("export", "bundle export (image store)", True, fresh_out,
                         lambda: [PY, "-m", "bundle", "export", REF, "-o", str(out / "b"), "-q", *level],
                         output=lambda: out, tag="image store"),
                    Case("export", "bundle export (via docker save)", True, fresh_out,
                         lambda: [PY, "-m", "bundle", "export", REF, "-o", str(out / "b"), "-q",
                                  "--docker-read", "save", *level], output=lambda: out, tag="via docker save"),
                ]
            # artifacts for the import/verify/push groups
            art = work / "artifacts"
            art.mkdir(exist_ok=True)
            subprocess.run(["docker", "save", "-o", str(art / "plain.tar"), REF], env=env, check=True)
            if "import" in groups:  # for `zstd -dc | docker load` only
                subprocess.run(sh(f"zstd -T0 -3 -q -f {art}/plain.tar -o {art}/plain.tar.zst"), check=True)
            subprocess.run([PY, "-m", "bundle", "export", REF, "-o", str(art / "b"), "-q", "--force", *level],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            bundle_dir = art / "b"
            warm.append(bundle_dir)
            presents.update({"export": image_present, "verify": image_present, "push": image_present})
            if "import" in groups:
                cases += [
                    Case(imp, "docker load -i plain.tar", False, image_absent,
                         lambda: ["docker", "load", "-q", "-i", str(art / "plain.tar")],
                         inputs=lambda: [art / "plain.tar"]),
                    Case(imp, "zstd -dc | docker load", False, image_absent,
                         lambda: sh(f"zstd -dcq {art}/plain.tar.zst | docker load -q"),
                         inputs=lambda: [art / "plain.tar.zst"]),
                    Case(imp, "bundle-import --verify", True, image_absent,
                         lambda: [PY, "-m", "importer", str(bundle_dir), "--verify", "--no-receipt", "-q"],
                         inputs=lambda: [bundle_dir]),
                ]
            if "import" in groups and "pull" in groups and shutil.which("docker-registry"):
                # probe for the loopback-registry load path: `docker pull` of uncompressed layers
                # (Docker 20.10 cannot pull zstd) from a registry on 127.0.0.1
                port = free_port()
                registries.append(f"bench-pull-{port}")
                subprocess.run(["bash", str(scripts / "registry.sh"), "start", registries[-1], str(port)],
                               check=True, capture_output=True)
                pulled.append(f"127.0.0.1:{port}/probe/img:1")
                push_uncompressed(art / "plain.tar", work / "raw", pulled[0])
                shutil.rmtree(work / "raw")
                cases.insert(len(cases) - 1, Case(
                    imp, "docker pull (loopback registry, uncompressed)", False, image_absent,
                    lambda: ["docker", "pull", "-q", pulled[0]]))
            if "verify" in groups:
                cases += [
                    Case("verify", "sha256sum -c SHA256SUMS", False, None,
                         lambda: ["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle_dir),
                    Case("verify", "bundle-import --verify-only", True, None,
                         lambda: [PY, "-m", "importer", str(bundle_dir), "--verify-only", "-q"]),
                ]
            has_push = subprocess.run([PY, "-m", "bundle", "push", "--help"], env=env,
                                      capture_output=True).returncode == 0
            if "push" in groups and has_push:
                push_port = free_port()
                registries.append(f"bench-{push_port}")
                registry = registries[-1]

                def fresh_registry() -> None:
                    subprocess.run(["bash", str(scripts / "registry.sh"), "purge", registry], capture_output=True)
                    subprocess.run(["bash", str(scripts / "registry.sh"), "start", registry, str(push_port)],
                                   check=True, capture_output=True)

                cases += [
                    Case("push", "skopeo copy oci -> registry", False, fresh_registry,
                         lambda: ["skopeo", "copy", "-q", "--dest-tls-verify=false", f"oci:{bundle_dir}:{REF}",
                                  f"docker://127.0.0.1:{push_port}/skopeo/img:1"]),
                    Case("push", "bundle push", True, fresh_registry,
                         lambda: [PY, "-m", "bundle", "push", str(bundle_dir), f"127.0.0.1:{push_port}/ours",
                                  "--insecure"]),
                ]
        if "containerd" in stores:
            cimage = inspect(cenv)
            if "classic" not in stores:
                image = cimage
            cout, cart = work / "cout", work / "cartifacts"
            cart.mkdir(exist_ok=True)

            def cfresh_out() -> None:
                shutil.rmtree(cout, ignore_errors=True)
                cout.mkdir()

            def cimage_absent() -> None:
                subprocess.run(["docker", "image", "rm", "-f", REF], env=cenv, capture_output=True)

            def cimage_present() -> None:
                if subprocess.run(["docker", "image", "inspect", REF], env=cenv, capture_output=True).returncode:
                    subprocess.run(["docker", "load", "-i", str(cart / "plain.tar")], env=cenv, check=True,
                                   capture_output=True)

            via_save = {**cenv, "SNEAKERNET_DOCKER_CONTENT_STORE": "0"}
            export_ctr = [PY, "-m", "bundle", "export", REF, "-q", *level]
            if "export" in groups:
                presents[CTR_EXPORT] = cimage_present
                cases += [
                    Case(CTR_EXPORT, "docker save -o", False, cfresh_out,
                         lambda: ["docker", "save", "-o", str(cout / "plain.tar"), REF], output=lambda: cout,
                         env=cenv, run_dir=crun_dir),
                    Case(CTR_EXPORT, "bundle export (content store)", True, cfresh_out,
                         lambda: [*export_ctr, "-o", str(cout / "b")], output=lambda: cout, env=cenv,
                         run_dir=crun_dir, tag="content store"),
                    Case(CTR_EXPORT, "bundle export (via docker save)", True, cfresh_out,
                         lambda: [*export_ctr, "-o", str(cout / "b")], output=lambda: cout, env=via_save,
                         run_dir=crun_dir, tag="via docker save"),
                ]
            subprocess.run(["docker", "save", "-o", str(cart / "plain.tar"), REF], env=cenv, check=True)
            subprocess.run([*export_ctr, "-o", str(cart / "b"), "--force"], env=cenv, check=True,
                           stdout=subprocess.DEVNULL)
            if "import" in groups:
                cases += [
                    Case(cimp, "docker load -i plain.tar", False, cimage_absent,
                         lambda: ["docker", "load", "-q", "-i", str(cart / "plain.tar")], env=cenv,
                         run_dir=crun_dir, inputs=lambda: [cart / "plain.tar"]),
                    Case(cimp, "bundle-import --verify", True, cimage_absent,
                         lambda: [PY, "-m", "importer", str(cart / "b"), "--verify", "--no-receipt", "-q"],
                         env=cenv, run_dir=crun_dir, inputs=lambda: [cart / "b"]),
                ]
        if cold:  # each import case once more, its input from disk: beside the warm ones, in the same rounds
            cases += [dataclasses.replace(c, group=cold_groups[c.group], samples=[]) for c in cases
                      if c.group in cold_groups and c.inputs is not None]
        # warm the page cache once so verify compares hashing, not the first read
        for bundle in warm:
            subprocess.run(["cat", *[str(p) for p in bundle.rglob("*") if p.is_file()]], stdout=subprocess.DEVNULL)
        for r in range(args.runs):
            for case in cases:  # alternating: every case once per round
                if case.group in presents:
                    presents[case.group]()
                sample = measure(case, env, run_dir, disks=disks,
                                 cold=cold if case.group in cold_groups.values() else None)
                case.samples.append(sample)
                print(f"bench: round {r + 1}/{args.runs} {case.group:7} {case.name:32} {sample.wall:7.1f}s "
                      f"cpu {sample.cpu:6.1f}s engine {sample.engine_cpu:6.1f}s io-stall {sample.io_stall:6.1f}s "
                      f"rss {sample.maxrss_kib / 1024:6.0f} MiB read {sample.read_bytes >> 20} MiB "
                      f"temp disk {max(0, sample.disk_peak - max(0, sample.disk_end)) >> 20} MiB", file=sys.stderr)
        rows = [fmt_row(c) for c in cases]
        meta: dict[str, object] = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "image_bytes": int(image["Size"]),
            "layers": len(image["RootFS"]["Layers"]), "runs": args.runs, "recipe": args.recipe, "machine": machine(),
            "stores": sorted(stores), "layers_asked": args.layers, "setup_seconds": build_s, "setup": args.setup,
            "cold_memory": cold.limit if cold else None,
            # the whole bench's peak disk use above its start (the context, both engines, the artifacts)
            "bench_disk_peak_bytes": bench_disk.peak - bench_disk.start,
        }
        if "containerd" in stores:  # the same build there: its layers as that store keeps them (gzip)
            meta["image_bytes_containerd"] = int(cimage["Size"])
            meta["layers_containerd"] = len(cimage["RootFS"]["Layers"])
        table = render(rows, meta)
        print(table)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        stem = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M") + f"-{args.size}" + (
            "" if args.recipe == "mixed" else f"-{args.recipe}") + (
            "" if args.layers is None else f"-{args.layers}layers") + ("-cold" if cold else "")
        (Path(args.out) / f"{stem}.md").write_text(table)
        (Path(args.out) / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        print(f"bench: results in {Path(args.out) / stem}.md", file=sys.stderr)
    finally:
        bench_disk.stop()
        if cold:
            cold.close()
        for name in registries:
            subprocess.run(["bash", str(scripts / "registry.sh"), "purge", name], capture_output=True)
        for name in daemons:
            subprocess.run(["bash", str(scripts / "dockerd.sh"), "purge", name], capture_output=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
