#!/usr/bin/env python3
"""Files bench (issue 42 point 6): one big incompressible file through export, parts and import,
against ``cp`` and ``sha256sum`` of the same file on the same disk. Not a test: a tool.

    python3 bench/files.py --size 20G --runs 1     # the issue's check: needs about 3x SIZE free
    python3 bench/files.py --small                 # smoke mode: 16 MiB, 1 run, results to a temp dir

Every step runs in one folder on one disk (``--dir``, default the system temp dir): the source
file (a seeded AES-CTR stream, written once), then per round ``cp FILE X`` (X deleted), ``sha256sum
FILE`` and ``openssl dgst -sha256 FILE`` (SHA-NI, as Python's hashlib), ``bundle export --file``
(hash and copy in one pass), ``bundle pack --split 4000M`` (the bundle deleted after it),
``bundle-import.pyz T.tar.parts.json --files-to D --files-only`` (D and the parts deleted after it).
For each step: wall and CPU (bench/run.py's measure), peak RSS of the
process tree (its VmHWM polled every 0.2 s; "-" when a step ended before the first poll),
throughput, the ratio to its baseline (export and import against cp + sha256sum, pack against cp)
and the peak disk used beyond the step's output (statvfs of the disk polled every 0.2 s: the
highest use during the step minus the use once it ended). Before that, the same three steps on a
256 MiB file (at most SIZE) give the peak RSS the big run is compared with (memory flat: it must not
grow with SIZE). Everything it made is deleted at the end, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.run import Case, Sample, machine, measure, parse_size  # noqa: E402

PY = sys.executable
BLOCK = 8 << 20
REF_SIZE = 256 << 20  # the size whose peak RSS the big run's is compared with (at most SIZE)
BASE = {"export": ("cp", "sha256sum"), "pack": ("cp",), "import": ("cp", "sha256sum")}
# coreutils' sha256sum (9.1 here) has no SHA-NI code; OpenSSL, which Python's hashlib uses, does
FAST = {"export": ("cp", "openssl"), "import": ("cp", "openssl")}


def make_file(path: Path, size: int) -> None:
    """SIZE incompressible bytes (AES-256-CTR of zeros, fixed key: the same file every time)."""
    block: Callable[[int], bytes] = os.urandom  # without cryptography: slower, not reproducible
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        enc = Cipher(algorithms.AES(bytes(range(32))), modes.CTR(bytes(16))).encryptor()
        zeros = bytes(BLOCK)
        block = lambda n: enc.update(zeros[:n])  # noqa: E731
    except ImportError:
        pass
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(BLOCK, left)
            f.write(block(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())


def disk_used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def tree_hwm() -> int:
    """The largest VmHWM (KiB) among this process's descendants. wait4's ru_maxrss cannot tell:
    a child starts with its parent's high-water mark (this process's ~50 MiB), exec or not."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, grew = {os.getpid()}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in tree and p not in tree}
        tree |= new
        grew = bool(new)
    best = 0
    for pid in tree - {os.getpid()}:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best, int(line.split()[1]))
        except (OSError, ValueError):
            pass
    return best


def timed(case: Case, env: dict[str, str], work: Path) -> tuple[Sample, int, int]:
    """bench/run.py's measure, with the disk and the process tree's VmHWM polled every 0.2 s:
    (sample with maxrss_kib the polled peak, output bytes on the disk, peak bytes beyond the output)."""
    os.sync()
    before = peak = disk_used(work)
    hwm = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal peak, hwm
        while not stop.wait(0.2):
            peak = max(peak, disk_used(work))
            hwm = max(hwm, tree_hwm())

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        sample = measure(case, env, work)
        os.sync()
    finally:
        stop.set()
        t.join()
    after = disk_used(work)
    peak = max(peak, after)
    sample.maxrss_kib = hwm  # 0: ended before the first poll
    return sample, after - before, peak - after


def steps(src: Path, work: Path, tag: str) -> list[tuple[str, Case, Path | None]]:
    """(step, case, what to delete after it) for one round, baselines first."""
    b, parts, dest = work / f"b{tag}", work / f"parts{tag}", work / f"d{tag}"
    pyz = parts / "bundle-import.pyz"
    return [
        ("cp", Case("baseline", "cp FILE X", False, None, lambda: ["cp", str(src), str(work / "x")]),
         work / "x"),
        ("sha256sum", Case("baseline", "sha256sum FILE", False, None, lambda: ["sha256sum", str(src)]), None),
        ("openssl", Case("baseline", "openssl dgst -sha256 FILE", False, None,
                         lambda: ["openssl", "dgst", "-sha256", str(src)]), None),
        ("export", Case("ours", "bundle export --file", True, None,
                        lambda: [PY, "-m", "bundle", "export", "--file", f"{src}=model.safetensors",
                                 "--artifact-ref", "bench/weights:1", "-o", str(b), "-q"]), None),
        ("pack", Case("ours", "bundle pack --split 4000M", True, lambda: parts.mkdir(),
                      lambda: [PY, "-m", "bundle", "pack", str(b), str(parts / "t.tar"), "--split", "4000M",
                               "-q"]), b),
        ("import", Case("ours", "bundle-import.pyz parts --files-to", True, None,
                        lambda: [PY, str(pyz), str(parts / "t.tar.parts.json"), "--files-to", str(dest),
                                 "--files-only", "--no-receipt", "-q"]), None),
    ]


def run_round(src: Path, work: Path, env: dict[str, str], only: set[str], tag: str,
              digest: str) -> dict[str, tuple[Sample, int, int]]:
    got: dict[str, tuple[Sample, int, int]] = {}
    dest = work / f"d{tag}"
    try:
        for step, case, drop in steps(src, work, tag):
            if step not in only:
                continue
            got[step] = timed(case, env, work)
            s = got[step][0]
            print(f"bench: {step:9} {s.wall:7.1f}s cpu {s.cpu:6.1f}s rss {s.maxrss_kib / 1024:5.0f} MiB "
                  f"out {got[step][1] / (1 << 20):8.0f} MiB beyond {got[step][2] / (1 << 20):6.0f} MiB",
                  file=sys.stderr)
            if drop is not None:
                remove(drop)
        if "import" in only:  # the import wrote the same bytes (it verified them; this says so again)
            out = subprocess.run(["sha256sum", str(dest / "model.safetensors")], capture_output=True, text=True,
                                 check=True).stdout.split()[0]
            if out != digest:
                raise SystemExit(f"bench: the imported file's sha256 is {out}, the source's {digest}")
    finally:
        for p in (work / "x", work / f"b{tag}", work / f"parts{tag}", dest):
            remove(p)
    return got


def remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


def render(rows: list[dict[str, object]], meta: dict[str, object]) -> str:
    size = int(meta["size_bytes"])  # type: ignore[call-overload]
    lines = [f"# sneakernet files benchmark {meta['date']}", "",
             f"One file of {size / (1 << 30):.2f} GiB ({size} bytes, incompressible), runs: {meta['runs']}, "
             f"disk: {meta['disk']}. {meta['note']}",
             "Machine: " + ", ".join(f"{k}: {v}" for k, v in dict(meta["machine"]).items()),  # type: ignore[call-overload]
             f"Reproduce: `{meta['command']}` at commit {meta['commit']}.", "",
             "| step | case | wall median (min-max) s | CPU s | MB/s | peak RSS MiB "
             f"| peak RSS MiB at {int(meta['ref_bytes']) >> 20} MiB "  # type: ignore[call-overload]
             "| output MiB | peak disk beyond output MiB | ours/baseline |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ref = f"{r['rss_ref_mib']:.0f}" if r.get("rss_ref_mib") is not None else ""
        rss = f"{r['peak_rss_mib']:.0f}" if r["peak_rss_mib"] else "-"
        ratio = f"**{r['ratio']:.2f}x** {r['baseline']}" if r.get("ratio") is not None else ""
        if r.get("ratio_openssl") is not None:
            ratio = f"{r['ratio_openssl']:.2f}x cp + openssl; {ratio}"
        name = f"**{r['case']}**" if r["ours"] else str(r["case"])
        lines.append(f"| {r['step']} | {name} | {r['wall_median']:.1f} ({r['wall_min']:.1f}-{r['wall_max']:.1f}) | "
                     f"{r['cpu_median']:.1f} | {r['mb_s']:.0f} | {rss} | {ref} | "
                     f"{int(r['output_bytes']) / (1 << 20):.0f} | "  # type: ignore[call-overload]
                     f"{int(r['beyond_bytes']) / (1 << 20):.0f} | {ratio} |")  # type: ignore[call-overload]
    lines += ["", "Goals (issue 42 point 6): " + "; ".join(str(g) for g in meta["goals"])]  # type: ignore[attr-defined]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="20G", help="the file's size (default 20G; needs about 3x free)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: a temp dir)")
    ap.add_argument("--small", action="store_true", help="smoke mode: 16M, 1 run, results to a temp dir")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    command = "python3 bench/files.py " + " ".join(sys.argv[1:])
    if args.small:
        args.size, args.runs = "16M", 1
        args.out = tempfile.mkdtemp(prefix="sneakernet-bench-results.")
    size = parse_size(args.size)
    ref_size = min(REF_SIZE, size)
    # bytecode as an installed package has it (as bench/run.py does)
    subprocess.run([PY, "-m", "compileall", "-q", "-j0", str(REPO / "bundle"), str(REPO / "importer")],
                   capture_output=True, check=False)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sneakernet-files-bench.", dir=parent))
    all_steps = {"cp", "sha256sum", "openssl", "export", "pack", "import"}
    try:
        free = shutil.disk_usage(work).free
        if free < 3 * size + (1 << 30):
            raise SystemExit(f"bench: {work} has {free / (1 << 30):.1f} GiB free; a {args.size} file needs about "
                             f"{(3 * size + (1 << 30)) / (1 << 30):.1f} GiB (source, parts, imported copy)")
        rss_ref: dict[str, int] = {}
        ref_src = work / "ref.safetensors"
        print(f"bench: the {ref_size >> 20} MiB reference run (peak RSS)", file=sys.stderr)
        make_file(ref_src, ref_size)
        ref_digest = subprocess.run(["sha256sum", str(ref_src)], capture_output=True, text=True,
                                    check=True).stdout.split()[0]
        for step, (s, _, _) in run_round(ref_src, work, env, {"export", "pack", "import"}, "-ref",
                                          ref_digest).items():
            rss_ref[step] = s.maxrss_kib
        remove(ref_src)
        src = work / "model.safetensors"
        print(f"bench: writing {size} incompressible bytes to {src}", file=sys.stderr)
        make_file(src, size)
        digest = subprocess.run(["sha256sum", str(src)], capture_output=True, text=True, check=True).stdout.split()[0]
        samples: dict[str, list[tuple[Sample, int, int]]] = {s: [] for s in all_steps}
        for r in range(args.runs):
            print(f"bench: round {r + 1}/{args.runs}", file=sys.stderr)
            for step, one in run_round(src, work, env, all_steps, "", digest).items():
                samples[step].append(one)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows: list[dict[str, object]] = []
    walls = {step: statistics.median(s.wall for s, _, _ in got) for step, got in samples.items()}
    for step, case, _ in steps(Path("FILE"), Path("W"), ""):
        got = samples[step]
        base = BASE.get(step)
        rows.append({
            "step": step, "case": case.name, "ours": case.ours, "runs": len(got),
            "wall_median": walls[step], "wall_min": min(s.wall for s, _, _ in got),
            "wall_max": max(s.wall for s, _, _ in got),
            "cpu_median": statistics.median(s.cpu for s, _, _ in got),
            "mb_s": size / walls[step] / 1e6,
            "peak_rss_mib": max(s.maxrss_kib for s, _, _ in got) / 1024,
            "rss_ref_mib": rss_ref[step] / 1024 if step in rss_ref else None,
            "output_bytes": got[-1][1], "beyond_bytes": max(b for _, _, b in got),
            "baseline": " + ".join(base) if base else "",
            "ratio": walls[step] / sum(walls[b] for b in base) if base else None,
            "ratio_openssl": walls[step] / sum(walls[b] for b in FAST[step]) if step in FAST else None,
        })
    flat = all(float(r["peak_rss_mib"]) <= 1.25 * float(r["rss_ref_mib"]) + 8  # type: ignore[arg-type]
               for r in rows if r["ours"])
    one_file = all(int(r["beyond_bytes"]) <= size for r in rows if r["ours"])  # type: ignore[call-overload]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    meta: dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "size_bytes": size, "ref_bytes": ref_size, "runs": args.runs,
        "disk": f"{parent} ({shutil.disk_usage(parent).total >> 30} GiB)",
        "commit": commit, "command": command, "machine": machine(), "sha256": digest,
        "note": "Other sessions may share the machine and the disk (a ratio is read within one run; the "
                "disk poll sees their writes too).",
        "goals": [f"memory flat (peak RSS of every step at most 1.25x "
                  f"its {ref_size >> 20} MiB run's + 8 MiB): "
                  f"{'met' if flat else 'NOT met'}",
                  f"disk at most one file's size beyond the output: {'met' if one_file else 'NOT met'}"],
    }
    table = render(rows, meta)
    print(table)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    stem = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M") + f"-files-{args.size}"
    (Path(args.out) / f"{stem}.md").write_text(table)
    (Path(args.out) / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"bench: results in {Path(args.out) / stem}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
