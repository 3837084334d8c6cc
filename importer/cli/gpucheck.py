"""``sneakernet-gpu-check``: qualify this GPU host with the current Python, in under 8 minutes.

The smoke suite of ``bundle-import smoke`` with ``--no-container --device cuda`` (host/NVML,
compat, torch, bf16 matmul, torch.compile, fused AdamW, NCCL all-reduce over every visible GPU,
clean shutdown). Prints the receipt on stdout, a one-line summary on stderr, and exits with the
suite's code (0 pass, 11 a gate failed, 10 a required gate skipped: verdict candidate, 2 a
configuration error).

    sneakernet-gpu-check [RECEIPT] [more smoke flags, e.g. --gpus 0,1 --env NCCL_NVLS_ENABLE=0]
    sneakernet-gpu-check --receipt RECEIPT [smoke flags]

Installed by pip as a console script; from a checkout: ``bash scripts/gpu-check.sh``; from a
bundle: ``PYTHONPATH=BUNDLE/bundle-import.pyz python3 -m importer.cli.gpucheck``. Stdlib only.
Needs a CUDA build of torch in this Python; the host gate reads NVML through nvidia-ml-py
(pynvml) when installed, else through nvidia-smi. Nothing is installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

SUITE_TIMEOUT = 400  # --timeout: the suite kills its own children past it
RANK_TIMEOUT = 240
HARD_TIMEOUT = 470  # the last resort: the whole smoke process group is killed
USAGE = ("usage: sneakernet-gpu-check [RECEIPT | --receipt RECEIPT] [smoke flags: --gpus LIST --env NAME=VALUE "
         "--gates LIST --timeout S ...]")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def split_args(argv: Sequence[str]) -> Tuple[Optional[str], List[str]]:
    """The receipt path (a first argument that is not an option, or ``--receipt PATH``) and the
    smoke flags, passed on as given. ``--gpus 0,1`` alone is a smoke flag, never a receipt path."""
    rest = list(argv)
    receipt: Optional[str] = None
    if rest and not rest[0].startswith("-"):
        receipt = rest.pop(0)
    flags: List[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--receipt" or arg.startswith("--receipt="):
            if arg == "--receipt":
                if i + 1 >= len(rest):
                    raise ValueError("--receipt needs a path")
                value = rest[i + 1]
                i += 2
            else:
                value = arg.split("=", 1)[1]
                i += 1
            if receipt is not None and receipt != value:
                raise ValueError(f"two receipt paths given: {receipt!r} and {value!r}")
            receipt = value
            continue
        flags.append(arg)
        i += 1
    return receipt, flags


def _python_path() -> str:
    """The folder (or zipapp) that holds this ``importer`` package, for the child's sys.path."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(here)


def _summary(receipt_path: str) -> None:
    with open(receipt_path, encoding="utf-8") as f:
        r = json.load(f)
    host = r.get("host") or {}
    gpus = ", ".join(g.get("name", "?") for g in host.get("gpus") or []) or "no GPU"
    _err(f"gpu-check: verdict {r.get('verdict')} (exit {r.get('exitCode')}); driver {host.get('driverVersion')} "
         f"(CUDA {host.get('cudaDriverVersion')}); {gpus}")
    for g in r.get("gates") or []:
        _err(f"  {g.get('name', ''):<10} {g.get('status', ''):<5} {g.get('error') or g.get('detail') or ''}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)  # noqa: T201
        print(__doc__.split("\n\n")[1])  # noqa: T201
        print("\nexamples:\n  sneakernet-gpu-check\n  sneakernet-gpu-check /tmp/q01.json --gpus 0,1")  # noqa: T201
        return 0
    try:
        receipt, flags = split_args(args)
    except ValueError as e:
        _err(f"gpu-check: {e}\n{USAGE}")
        return 2
    if receipt is None:
        receipt = os.path.join(tempfile.mkdtemp(prefix="sneakernet-gpu-check."), "qualification.json")
    receipt = os.path.abspath(receipt)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _err(f"gpu-check: {stamp} on {socket.gethostname()}; receipt {receipt}")
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "-L"], stdout=sys.stderr, check=False)
    else:
        _err("gpu-check: no nvidia-smi on PATH")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_python_path(), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "importer", "smoke", "--no-container", "--device", "cuda",
           "--timeout", str(SUITE_TIMEOUT), "--rank-timeout", str(RANK_TIMEOUT), "--receipt", receipt, *flags]
    proc = subprocess.Popen(cmd, stdout=sys.stderr, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=HARD_TIMEOUT)
    except subprocess.TimeoutExpired:
        _err(f"gpu-check: the suite ran past {HARD_TIMEOUT}s; killing it")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 130

    if os.path.isfile(receipt) and os.path.getsize(receipt) > 0:
        with open(receipt, encoding="utf-8") as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
        try:
            _summary(receipt)
        except (OSError, ValueError) as e:
            _err(f"gpu-check: could not summarize {receipt}: {e}")
    else:
        _err(f"gpu-check: no receipt was written (exit {rc}); see the errors above")
    return rc


if __name__ == "__main__":
    sys.exit(main())
