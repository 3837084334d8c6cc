"""Entry point inside the image: ``run`` (the whole suite), ``gates`` and ``rank`` (its child
processes), ``idle`` (PID 1 of a long-lived container for --restart)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> List[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sneakernet-smoke")
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("run")
    r.add_argument("--device", choices=["cuda", "cpu"], required=True)
    r.add_argument("--host-cuda", default="")
    r.add_argument("--datacenter", choices=["yes", "no", "unknown"], default="unknown")
    r.add_argument("--host-gpus", type=int, default=0)
    r.add_argument("--nproc", type=int, default=0)
    r.add_argument("--gates", type=_names, required=True)
    r.add_argument("--fault", default=None)
    r.add_argument("--fault-rank", type=int, default=0)
    r.add_argument("--budget", type=float, default=900.0)
    r.add_argument("--rank-timeout", type=float, default=300.0)
    r.add_argument("--sizes", type=_ints, default=None)
    g = sub.add_parser("gates")
    g.add_argument("--device", choices=["cuda", "cpu"], required=True)
    g.add_argument("--host-gpus", type=int, default=0)
    g.add_argument("--only", type=_names, required=True)
    k = sub.add_parser("rank")
    k.add_argument("--device", choices=["cuda", "cpu"], required=True)
    k.add_argument("--sizes", type=_ints, required=True)
    k.add_argument("--fault", default=None)
    k.add_argument("--fault-rank", type=int, default=0)
    k.add_argument("--pg-timeout", type=float, default=300.0)
    sub.add_parser("idle")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "run":
        from importer.smoke.worker.suite import Suite

        datacenter = {"yes": True, "no": False}.get(args.datacenter)
        return Suite(device=args.device, host_cuda=args.host_cuda or None, datacenter=datacenter,
                     host_gpus=args.host_gpus, nproc=args.nproc, gates=args.gates, fault=args.fault,
                     fault_rank=args.fault_rank, budget=args.budget, rank_timeout=args.rank_timeout,
                     sizes=args.sizes).run()
    if args.cmd == "gates":
        from importer.smoke.worker.gates import run_gates

        return run_gates(args.device, args.host_gpus, args.only)
    if args.cmd == "rank":
        from importer.smoke.worker.collective import rank_main

        return rank_main(args.device, args.sizes, args.fault, args.fault_rank, args.pg_timeout)
    if args.cmd == "idle":
        from importer.smoke.worker.suite import idle

        return idle()
    build_parser().print_usage(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
