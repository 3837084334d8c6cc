#!/usr/bin/env python3
"""N concurrent pulls from ``bundle-import serve`` against Debian's ``docker-registry`` serving the
same image (issue 18): throughput and the server's CPU time and peak RSS.

Builds the synthetic image (bench/recipe.py) in a private dockerd, exports it as a gzip bundle,
pushes that bundle into a private docker-registry (``bundle push``: the same manifests and blobs),
and serves the bundle with ``bundle-import serve`` (from its own pyz). Each round pulls the image
``--clients`` times at once with ``skopeo copy docker://... dir:`` (each client checks every digest
and writes the blobs) from one server, then the other, alternating. Results go to bench/results/.
Not a test: a tool.

    python3 bench/serve.py                       # 1 GiB image, 8 clients, 3 rounds
    python3 bench/serve.py --small               # 48 MiB, 4 clients, 1 round, results to a temp dir
    python3 bench/serve.py --size 256M --clients 16 --runs 2 --bundle-as parts
    python3 bench/serve.py --small --idle 32      # also: pulls while 32 idle connections sit on serve

With ``--idle N`` each round also pulls from serve while N connections that never send a byte are
held open to it (each one the server closes at --idle-timeout is opened again at once): the
figure of issue 24 that idle clients do not lock real ones out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.recipe import write_context  # noqa: E402
from bench.run import cpu_of, du, free_port, machine, parse_size  # noqa: E402

REF = "bench/img:1"
PY = sys.executable


def rss_kib(pid: int) -> int:
    """Peak RSS (VmHWM) of a running process, KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class IdleHolder:
    """``n`` connections to ``addr`` that never send a byte; one the server closes is reopened."""

    def __init__(self, addr: str, n: int) -> None:
        host, port = addr.rsplit(":", 1)
        self.target = (host, int(port))
        self.n = n
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def __enter__(self) -> IdleHolder:
        if self.n:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.n:
            self._thread.join(30)

    def _hold(self) -> None:
        sel = selectors.DefaultSelector()
        for _ in range(self.n):
            sel.register(socket.create_connection(self.target), selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    gone = not sock.recv(4096)
                except OSError:
                    gone = True
                if gone:
                    sel.unregister(sock)
                    sock.close()
                    sel.register(socket.create_connection(self.target), selectors.EVENT_READ)
                    self.reopened += 1
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()


def pull_round(addr: str, clients: int, out: Path, server_pid: int, idle: int = 0) -> dict[str, float]:
    """``clients`` skopeo pulls at once (while ``idle`` silent connections are held to the server);
    wall time of the whole round and the server's CPU."""
    with IdleHolder(addr, idle) as holder:
        result = _pull_round(addr, clients, out, server_pid)
    result["idle_reopened"] = holder.reopened
    return result


def _pull_round(addr: str, clients: int, out: Path, server_pid: int) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cpu0 = cpu_of([server_pid])
    t0 = time.monotonic()
    procs = [subprocess.Popen(["skopeo", "--insecure-policy", "copy", "-q", "--src-tls-verify=false",
                               f"docker://{addr}/{REF}", f"dir:{out / str(i)}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(clients)]
    errors = [(p.wait(), p.stderr.read().decode() if p.stderr else "") for p in procs]
    wall = time.monotonic() - t0
    bad = [e for rc, e in errors if rc != 0]
    if bad:
        raise SystemExit(f"bench: a pull from {addr} failed: {bad[0][-2000:]}")
    pulled = du(out)
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "server_cpu": cpu_of([server_pid]) - cpu0, "bytes": pulled}


def small_responses(addr: str, digest: str, repo: str, count: int = 200) -> dict[str, float]:
    """``count`` one-byte Range requests of a blob on one kept-alive connection, against one full GET
    of the same blob on another: small responses must not each wait for a delayed ACK (issue 44)."""
    import http.client

    host, port = addr.rsplit(":", 1)
    path = f"/v2/{repo}/blobs/{digest}"
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    t0 = time.monotonic()
    for i in range(count):
        conn.request("GET", path, headers={"Range": f"bytes={i}-{i}"})
        resp = conn.getresponse()
        if resp.status != 206 or len(resp.read()) != 1:
            raise SystemExit(f"bench: a one-byte Range request to {addr} answered {resp.status}")
    ranges = time.monotonic() - t0
    conn.close()
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    t0 = time.monotonic()
    conn.request("GET", path)
    resp = conn.getresponse()
    got = 0
    while True:
        chunk = resp.read(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    whole = time.monotonic() - t0
    conn.close()
    return {"ranges": ranges, "whole": whole, "count": count, "bytes": got}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="image size (default 1G)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent pulls per round (default 8)")
    ap.add_argument("--runs", type=int, default=3, help="rounds per server (default 3)")
    ap.add_argument("--bundle-as", choices=["folder", "tar", "parts"], default="folder",
                    help="what serve reads (default: the folder)")
    ap.add_argument("--idle", type=int, default=0, metavar="N",
                    help="also pull from serve while N idle connections are held open to it (default: 0, not)")
    ap.add_argument("--small", action="store_true", help="CI mode: 48M, 4 clients, 1 round, results to a temp dir")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = ap.parse_args()
    if args.small:
        args.size, args.clients, args.runs = "48M", 4, 1
        args.out = tempfile.mkdtemp(prefix="sneakernet-bench-results.")
    size = parse_size(args.size)
    work = Path(args.work or tempfile.mkdtemp(prefix="sneakernet-bench-serve."))
    run_root = Path(os.environ.get("SNEAKERNET_RUN", "/tmp/sneakernet-run"))
    os.environ["SNEAKERNET_RUN"] = str(run_root)
    scripts = REPO / "docker" / "scripts"
    dockerd, registry = "bench-serve", f"bench-serve-{os.getpid()}"
    served: subprocess.Popen[bytes] | None = None
    try:
        url = subprocess.run(["bash", str(scripts / "dockerd.sh"), "start", dockerd], capture_output=True, text=True,
                             check=True).stdout.strip()
        env = {**os.environ, "DOCKER_HOST": url, "DOCKER_BUILDKIT": "0", "PYTHONPATH": str(REPO)}
        print(f"bench: building a {args.size} image in {work}", file=sys.stderr)
        ctx = write_context(work / "ctx", size, "/bin/busybox", small_files=200 if args.small else None)
        subprocess.run(["docker", "build", "-q", "--network", "none", "-t", REF, str(ctx)], env=env, check=True,
                       capture_output=True)
        shutil.rmtree(ctx)
        bundle = work / "b"  # gzip: Debian 12's Docker 20.10 pulls it too (docs/transfer.md)
        subprocess.run([PY, "-m", "bundle", "export", REF, "-o", str(bundle), "-q", "--compression", "gzip"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        target = bundle
        if args.bundle_as != "folder":
            target = work / "b.tar"
            subprocess.run([PY, "-m", "bundle", "pack", str(bundle), str(target),
                            *(["--split", "64M"] if args.bundle_as == "parts" else [])], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            if args.bundle_as == "parts":
                target = work / "b.tar.parts.json"
        reg_port = free_port()
        subprocess.run(["bash", str(scripts / "registry.sh"), "start", registry, str(reg_port)], check=True,
                       capture_output=True)
        subprocess.run([PY, "-m", "bundle", "push", str(bundle), f"127.0.0.1:{reg_port}"], env=env, check=True,
                       capture_output=True)
        reg_pid = int((run_root / f"registry-{registry}" / "registry.pid").read_text().strip())
        # every client of this bench (the pulls and the idle connections) comes from 127.0.0.1: one client
        # address to serve, so its share of the connections is all of them (the default is a quarter)
        served = subprocess.Popen([PY, "-I", str(bundle / "bundle-import.pyz"), "serve", str(target), "--listen",
                                   "127.0.0.1:0", "--json", "--quiet", "--max-connections-per-client", "64"],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        assert served.stdout is not None
        start = json.loads(served.stdout.readline() or b"{}")
        if not start.get("ok"):
            raise SystemExit("bench: bundle-import serve did not start")
        servers = {"bundle-import serve": (start["listening"], served.pid, 0),
                   "docker-registry": (f"127.0.0.1:{reg_port}", reg_pid, 0)}
        if args.idle:
            servers[f"bundle-import serve, {args.idle} idle conns"] = (start["listening"], served.pid, args.idle)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for r in range(args.runs):
            for name, (addr, pid, idle) in servers.items():  # alternating, one round each
                s = pull_round(addr, args.clients, work / "pulled", pid, idle)
                samples[name].append(s)
                print(f"bench: round {r + 1}/{args.runs} {name:20} {args.clients} pulls {s['wall']:7.1f}s "
                      f"server cpu {s['server_cpu']:6.1f}s", file=sys.stderr)
        image_bytes = sum(f.stat().st_size for f in (bundle / "blobs" / "sha256").iterdir())
        biggest = max((bundle / "blobs" / "sha256").iterdir(), key=lambda f: f.stat().st_size)
        small = {name: small_responses(addr, f"sha256:{biggest.name}", REF.split(":")[0])
                 for name, (addr, _pid, idle) in servers.items() if not idle}
        rows = []
        for name, items in samples.items():
            wall = statistics.median(s["wall"] for s in items)
            rows.append({
                "server": name, "ours": name.startswith("bundle-import serve"), "clients": args.clients,
                "runs": len(items), "idle_reopened": sum(s["idle_reopened"] for s in items),
                "wall_median": wall, "wall_min": min(s["wall"] for s in items),
                "wall_max": max(s["wall"] for s in items),
                "server_cpu_median": statistics.median(s["server_cpu"] for s in items),
                "server_peak_rss_mib": rss_kib(servers[name][1]) / 1024,
                "pulled_bytes": items[-1]["bytes"],
                "throughput_mib_s": args.clients * image_bytes / wall / (1 << 20),
            })
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "bundle_blob_bytes": image_bytes, "bundle_as": args.bundle_as, "clients": args.clients,
                "runs": args.runs, "machine": machine()}
        lines = [f"# bundle-import serve vs docker-registry {meta['date']}", "",
                 f"{args.clients} concurrent `skopeo copy docker://... dir:` pulls of one image "
                 f"({image_bytes / (1 << 20):.0f} MiB of gzip blobs), {args.runs} round(s) per server; "
                 f"serve reads the bundle as a {args.bundle_as}.",
                 "Machine: " + ", ".join(f"{k}: {v}" for k, v in dict(meta["machine"]).items()), "",  # type: ignore[call-overload]
                 "| server | wall median (min-max) s | throughput MiB/s | server CPU s | server peak RSS MiB "
                 "| ours/peer |", "| --- | --- | --- | --- | --- | --- |"]
        peer = next(r for r in rows if not r["ours"])
        for row in rows:
            ratio = f"{row['wall_median'] / peer['wall_median']:.2f}x" if row["ours"] else ""  # type: ignore[operator]
            lines.append(f"| {'**' if row['ours'] else ''}{row['server']}{'**' if row['ours'] else ''} | "
                         f"{row['wall_median']:.1f} ({row['wall_min']:.1f}-{row['wall_max']:.1f}) | "
                         f"{row['throughput_mib_s']:.0f} | {row['server_cpu_median']:.1f} | "
                         f"{row['server_peak_rss_mib']:.0f} | {ratio} |")
        lines += ["", f"Small responses: 200 one-byte Range requests on one kept-alive connection against one full "
                  f"GET of the largest blob ({biggest.stat().st_size / (1 << 20):.0f} MiB) (goal: under 10x).", "",
                  "| server | 200 one-byte ranges s | one full GET s | ranges/full |", "| --- | --- | --- | --- |"]
        for name, sm in small.items():
            lines.append(f"| {name} | {sm['ranges']:.2f} | {sm['whole']:.2f} | {sm['ranges'] / sm['whole']:.1f}x |")
        meta["small_responses"] = small
        if args.idle:
            reopened = sum(int(r["idle_reopened"]) for r in rows)
            lines += ["", f"With {args.idle} idle connections held open to serve during its rounds (each one serve "
                      f"closed at its idle timeout reopened at once: {reopened} times)."]
        table = "\n".join(lines) + "\n"
        print(table)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        stem = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M") + f"-serve-{args.size}" + (
            f"-{args.bundle_as}" if args.bundle_as != "folder" else "")
        (Path(args.out) / f"{stem}.md").write_text(table)
        (Path(args.out) / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        print(f"bench: results in {Path(args.out) / stem}.md", file=sys.stderr)
    finally:
        if served is not None and served.poll() is None:
            served.send_signal(signal.SIGTERM)
            served.wait(60)
        subprocess.run(["bash", str(scripts / "registry.sh"), "purge", registry], capture_output=True)
        subprocess.run(["bash", str(scripts / "dockerd.sh"), "purge", dockerd], capture_output=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
