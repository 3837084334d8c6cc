"""One rank of the collective job: init the process group (NCCL on GPUs, gloo on the CPU),
all-reduce tensors of several sizes, check every element, time it, destroy the process group,
exit. Injected faults (for tests): a wrong sum, a SIGSEGV at exit, a hang at exit."""

from __future__ import annotations

import datetime
import importlib
import os
import signal
import time
from typing import Any, Dict, List, Optional, Sequence

from importer.smoke.worker.protocol import emit, short_error

CPU_SIZES = (4 * 1024, 1024 * 1024, 8 * 1024 * 1024)
GPU_SIZES = (1024 * 1024, 32 * 1024 * 1024, 256 * 1024 * 1024, 1024 * 1024 * 1024)


def _iters(nbytes: int, device: str) -> int:
    if device == "cpu":
        return 5
    return 20 if nbytes <= 256 * 1024 * 1024 else 5


def _measure(torch: Any, dist: Any, dev: Any, device: str, nbytes: int, rank: int, world: int,
             fault: Optional[str]) -> Dict[str, Any]:
    n = max(1, nbytes // 4)
    base = torch.arange(n, dtype=torch.float32, device=dev) % 13  # small integers: exact in fp32
    x = base + float(rank + 1)
    expected = base * world + float(world * (world + 1) // 2)
    dist.all_reduce(x)
    if fault == "wrong-sum" and rank == world - 1:
        x[::2] += 1.0
    if device == "cuda":
        torch.cuda.synchronize()
    wrong = int((x != expected).sum())
    iters = _iters(nbytes, device)
    buf = base.clone()
    dist.all_reduce(buf)  # warm-up
    dist.barrier()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if device == "cuda":
        torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / iters
    return {"bytes": n * 4, "seconds": per, "wrong": wrong, "iters": iters}


def rank_main(device: str, sizes: Sequence[int], fault: Optional[str], fault_rank: int, pg_timeout: float) -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    backend = "nccl" if device == "cuda" else "gloo"
    dist: Any = None
    try:
        torch = importlib.import_module("torch")
        dist = torch.distributed
        dev = torch.device("cpu")
        if device == "cuda":
            torch.cuda.set_device(local)
            dev = torch.device("cuda", local)
        kw: Dict[str, Any] = {}
        if device == "cuda":
            kw["device_id"] = dev  # eager NCCL init, bound to this rank's GPU
        t0 = time.perf_counter()
        try:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=pg_timeout), **kw)
        except TypeError:  # torch < 2.3: no device_id
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=pg_timeout))
        init_s = time.perf_counter() - t0
        results: List[Dict[str, Any]] = []
        for nbytes in sizes:
            results.append(_measure(torch, dist, dev, device, nbytes, rank, world, fault))
        emit({"event": "rank-result", "rank": rank, "world": world, "backend": backend,
              "initSeconds": init_s, "sizes": results})
    except Exception as e:
        emit({"event": "rank-error", "rank": rank, "error": short_error(e)})
        try:
            if dist is not None and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: S110 - best effort after the real error was reported
            pass
        return 1
    dist.destroy_process_group()
    emit({"event": "destroyed", "rank": rank})
    if fault == "segv" and rank == fault_rank:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang" and rank == fault_rank:
        while True:
            time.sleep(60)
    return 0
