"""The suite's conductor inside the image. It never imports torch itself: it reports the
environment, decides the CUDA compatibility mode before any CUDA process starts, runs the torch
gates in a child process (restarted past a crash, killed past the time budget) and one process
per rank for the collective gates, each killed when it outlives its timeout; every outcome is a
result line on stdout, so the host can write the receipt whatever happened."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

from importer.smoke.worker import compat
from importer.smoke.worker.collective import CPU_SIZES, GPU_SIZES
from importer.smoke.worker.protocol import (
    FAIL,
    MAX_LINE,
    PASS,
    PROCESS_GATES,
    SKIP,
    WARN,
    Stopwatch,
    emit,
    env_in_force,
    parse_line,
    result,
)

BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
             "from importer.smoke.worker.__main__ import main; sys.exit(main())")
KILL_GRACE = 5.0


def tree_root() -> str:
    """The folder holding the ``importer`` package this suite was started from."""
    import importer

    return os.path.dirname(os.path.dirname(os.path.abspath(importer.__file__)))


def worker_argv(*args: str) -> List[str]:
    return [sys.executable, "-c", BOOTSTRAP, tree_root(), *args]


def signal_name(returncode: int) -> str:
    try:
        return f"{signal.Signals(-returncode).name} ({-returncode})"
    except ValueError:
        return f"signal {-returncode}"


def describe_exit(returncode: Optional[int]) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"died by signal {signal_name(returncode)}"
    return f"exited with status {returncode}"


class Child:
    """A child process whose stdout protocol lines are collected by a thread."""

    def __init__(self, argv: Sequence[str], env: Dict[str, str], *, forward_starts: bool = False) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env)
        self.events: List[Dict[str, Any]] = []
        self.forward_starts = forward_starts
        self.killed = False
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: Optional[IO[bytes]]) -> None:
        assert stream is not None
        while True:
            line = stream.readline(MAX_LINE)
            if not line:
                break
            ev = parse_line(line.decode("utf-8", "replace"))
            if ev is not None:
                self.events.append(ev)
                if self.forward_starts and ev.get("event") == "start":
                    emit(ev)  # live, so the host knows which gate ran if the whole suite is killed

    def wait(self, deadline: float) -> Optional[int]:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(KILL_GRACE)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=KILL_GRACE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Suite:
    def __init__(self, *, device: str, host_cuda: Optional[str], datacenter: Optional[bool], host_gpus: int,
                 nproc: int, gates: Sequence[str], fault: Optional[str], fault_rank: int, budget: float,
                 rank_timeout: float, sizes: Optional[Sequence[int]]) -> None:
        self.device = device
        self.host_cuda = compat.parse_version(host_cuda)
        self.datacenter = datacenter
        self.host_gpus = host_gpus
        self.nproc = nproc
        self.gates = list(gates)
        self.fault = fault
        self.fault_rank = fault_rank
        self.deadline = time.monotonic() + budget
        self.rank_timeout = rank_timeout
        self.sizes = list(sizes) if sizes else list(GPU_SIZES if device == "cuda" else CPU_SIZES)
        self.env = dict(os.environ)
        self.compat_root = "/"
        self.rank_limit = rank_timeout
        self.results: Dict[str, Dict[str, Any]] = {}

    def report(self, res: Dict[str, Any]) -> None:
        self.results[res["gate"]] = res
        emit(res)

    # === compat: decided before any CUDA process starts
    def decide(self) -> Tuple[compat.CompatDecision, Dict[str, Any]]:
        image_cuda, source = compat.image_cuda_from_env(self.env)
        dirs = compat.find_compat_dirs(self.compat_root)
        compat_dir = dirs[0] if dirs else None
        decision = compat.decide_compat(device=self.device, host_cuda=self.host_cuda, image_cuda=image_cuda,
                                        datacenter=self.datacenter, compat_dir=compat_dir)
        if decision.use_compat_libs and compat_dir:
            old = self.env.get("LD_LIBRARY_PATH")
            self.env["LD_LIBRARY_PATH"] = compat_dir + (":" + old if old else "")
        facts = {"hostCuda": compat.fmt(self.host_cuda), "imageCuda": compat.fmt(image_cuda),
                 "imageCudaSource": source, "datacenter": self.datacenter, "compatDirs": dirs,
                 "ldLibraryPath": self.env.get("LD_LIBRARY_PATH")}
        return decision, facts

    def finish_compat(self, decision: compat.CompatDecision, facts: Dict[str, Any], seconds: float) -> None:
        status, reason = decision.status, decision.reason
        torch_res = self.results.get("torch") or {}
        torch_cuda = (torch_res.get("metrics") or {}).get("torch") and (torch_res.get("metrics") or {}).get("cuda")
        facts["torchCuda"] = torch_cuda
        if self.device == "cuda" and facts["imageCuda"] is None and torch_cuda and self.host_cuda is not None:
            # the image declares nothing: judge by the CUDA torch was built for
            decision = compat.decide_compat(device=self.device, host_cuda=self.host_cuda,
                                            image_cuda=compat.parse_version(str(torch_cuda)),
                                            datacenter=self.datacenter, compat_dir=None)
            status = decision.status
            reason = f"no CUDA_VERSION in the image; torch was built for CUDA {torch_cuda}: {decision.reason}"
        error = None
        torch_status = torch_res.get("status")
        if self.device == "cuda" and torch_status == FAIL and status in (PASS, WARN):
            status, error = FAIL, f"{reason}; but CUDA did not initialise: {torch_res.get('error')}"
        elif self.device == "cuda" and torch_status == PASS and status == FAIL:
            status, reason = WARN, f"{reason}; yet CUDA initialised in the image (its torch brings what it needs)"
        elif status == FAIL:
            error = reason
        metrics = dict(facts, mode=decision.mode, useCompatLibs=decision.use_compat_libs)
        self.report(result("compat", status, seconds, metrics, error, reason))

    # === torch gates, in a child process restarted past a crash
    def run_process_gates(self) -> None:
        todo = ["torch"] + [g for g in PROCESS_GATES[1:] if g in self.gates]
        for g in PROCESS_GATES[1:]:
            if g not in self.gates:
                self.report(result(g, SKIP, 0.0, None, None, "not selected (--gates)"))
        while todo:
            child = Child(worker_argv("gates", "--device", self.device, "--host-gpus", str(self.host_gpus),
                                      "--only", ",".join(todo)), self.env, forward_starts=True)
            rc = child.wait(self.deadline)
            started: Optional[str] = None
            for ev in child.events:
                if ev.get("event") == "start":
                    started = str(ev.get("gate"))
                elif ev.get("event") == "result" and ev.get("gate") in todo:
                    self.report(ev)
                    todo.remove(str(ev["gate"]))
                    started = None
            if not todo:
                break
            why = ("was killed: the suite's time budget ran out" if child.killed
                   else describe_exit(rc))
            if started is not None and started in todo:
                self.report(result(started, FAIL, 0.0, None, f"the gates process {why} while running {started}"))
                todo.remove(started)
                if not child.killed and started != "torch":
                    continue  # restart the process for the gates after the crashed one
            for g in todo:
                self.report(result(g, FAIL if g == "torch" else SKIP, 0.0, None,
                                   f"the gates process {why} before running {g}" if g == "torch" else None,
                                   f"not run: the gates process {why}"))
            break

    # === collective gates: one process per rank
    def run_ranks(self) -> None:
        wanted = [g for g in ("allreduce", "shutdown") if g in self.gates]
        for g in ("allreduce", "shutdown"):
            if g not in wanted:
                self.report(result(g, SKIP, 0.0, None, None, "not selected (--gates)"))
        if not wanted:
            return
        torch_res = self.results.get("torch") or {}
        if torch_res.get("status") != PASS:
            reason = torch_res.get("error") or torch_res.get("detail") or "not run"
            for g in wanted:
                self.report(result(g, SKIP, 0.0, None, None, f"not run: the torch gate did not pass ({reason})"))
            return
        world = self.nproc
        if world <= 0:
            world = int((torch_res.get("metrics") or {}).get("deviceCount") or 0) if self.device == "cuda" else 2
        if world <= 0:
            for g in wanted:
                self.report(result(g, SKIP, 0.0, None, None, "no GPU to run ranks on"))
            return
        if time.monotonic() >= self.deadline - 1:
            for g in wanted:
                self.report(result(g, SKIP, 0.0, None, None, "not run: the suite's time budget (--timeout) ran out"))
            return
        watch = Stopwatch()
        emit({"event": "start", "gate": "allreduce"})
        emit({"event": "start", "gate": "shutdown"})
        port = free_port()
        children: List[Child] = []
        for rank in range(world):
            env = dict(self.env)
            env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            if self.device == "cpu":
                env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            args = ["rank", "--device", self.device, "--sizes", ",".join(str(s) for s in self.sizes),
                    "--pg-timeout", str(int(self.rank_timeout))]
            if self.fault:
                args += ["--fault", self.fault, "--fault-rank", str(self.fault_rank)]
            children.append(Child(worker_argv(*args), env))
        deadline = min(time.monotonic() + self.rank_timeout, self.deadline)
        self.rank_limit = deadline - time.monotonic()
        for child in children:
            child.wait(deadline)
        seconds = watch.seconds
        if "allreduce" in wanted:
            self.report(self.judge_allreduce(children, world, seconds))
        if "shutdown" in wanted:
            self.report(self.judge_shutdown(children, seconds))

    def judge_allreduce(self, children: List[Child], world: int, seconds: float) -> Dict[str, Any]:
        per_rank: Dict[int, Dict[str, Any]] = {}
        errors: List[str] = []
        for rank, child in enumerate(children):
            for ev in child.events:
                if ev.get("event") == "rank-result":
                    per_rank[rank] = ev
                elif ev.get("event") == "rank-error":
                    errors.append(f"rank {rank}: {ev.get('error')}")
            if rank not in per_rank and not any(e.startswith(f"rank {rank}:") for e in errors):
                why = "was killed after the rank timeout" if child.killed else describe_exit(child.proc.returncode)
                errors.append(f"rank {rank} reported no all-reduce result ({why})")
        sizes: List[Dict[str, Any]] = []
        wrong_total = 0
        factor = 2.0 * (world - 1) / world
        for i, _nbytes in enumerate(self.sizes):
            rows = [per_rank[r]["sizes"][i] for r in sorted(per_rank) if i < len(per_rank[r].get("sizes", []))]
            if not rows:
                continue
            t = max(float(r["seconds"]) for r in rows)
            wrong = sum(int(r["wrong"]) for r in rows)
            wrong_total += wrong
            algbw = rows[0]["bytes"] / t / 1e9 if t > 0 else 0.0
            sizes.append({"bytes": rows[0]["bytes"], "seconds": t, "algbwGBps": round(algbw, 4),
                          "busbwGBps": round(algbw * factor, 4), "wrong": wrong, "iters": rows[0].get("iters")})
        backend = next((ev.get("backend") for ev in per_rank.values()), "nccl" if self.device == "cuda" else "gloo")
        metrics = {"world": world, "backend": backend, "sizes": sizes, "wrong": wrong_total,
                   "busbwFactor": factor}
        if wrong_total:
            bad = [f"{s['bytes']} B: {s['wrong']} wrong" for s in sizes if s["wrong"]]
            errors.append(f"all-reduce returned wrong sums ({', '.join(bad)})")
        if errors:
            return result("allreduce", FAIL, seconds, metrics, "; ".join(errors))
        return result("allreduce", PASS, seconds, metrics)

    def judge_shutdown(self, children: List[Child], seconds: float) -> Dict[str, Any]:
        problems: List[str] = []
        ranks: List[Dict[str, Any]] = []
        for rank, child in enumerate(children):
            rc = child.proc.returncode
            destroyed = any(ev.get("event") == "destroyed" for ev in child.events)
            entry: Dict[str, Any] = {"rank": rank, "exitCode": rc, "destroyed": destroyed, "killed": child.killed}
            if rc is not None and rc < 0:
                entry["signal"] = signal_name(rc).split(" ")[0]
            ranks.append(entry)
            if child.killed:
                problems.append(f"rank {rank} hung: still running after {self.rank_limit:.0f} s"
                                f"{' after destroy_process_group' if destroyed else ''}; killed (SIGKILL)")
            elif rc is not None and rc < 0:
                problems.append(f"rank {rank} exited by signal {signal_name(rc)}"
                                f"{' after destroy_process_group' if destroyed else ''}")
            elif rc != 0:
                problems.append(f"rank {rank} exited with status {rc}")
            elif not destroyed:
                problems.append(f"rank {rank} exited without destroy_process_group")
        metrics = {"ranks": ranks, "rasEnable": self.env.get("NCCL_RAS_ENABLE")}
        if problems:
            hint = ""
            crashed = any("signal" in p for p in problems)
            if self.device == "cuda" and crashed and self.env.get("NCCL_RAS_ENABLE") != "0":
                hint = "NCCL RAS (on by default since NCCL 2.24) can crash ranks at exit: try --env NCCL_RAS_ENABLE=0"
            return result("shutdown", FAIL, seconds, metrics, "; ".join(problems), hint)
        return result("shutdown", PASS, seconds, metrics)

    def run(self) -> int:
        emit({"event": "env", "python": platform.python_version(), "executable": sys.executable,
              "machine": platform.machine(), "inForce": env_in_force(self.env), "device": self.device})
        watch = Stopwatch()
        decision, facts = self.decide()
        compat_s = watch.seconds
        emit({"event": "compat-decided", **decision.to_dict(), "ldLibraryPath": facts["ldLibraryPath"]})
        self.run_process_gates()
        self.finish_compat(decision, facts, compat_s)
        self.run_ranks()
        emit({"event": "done"})
        return 0


def idle() -> int:
    """PID 1 of a long-lived smoke container (--restart): wait for SIGTERM, then exit 0."""
    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while not stop.wait(3600):
        pass
    return 0
