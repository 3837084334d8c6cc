#!/usr/bin/env python3
"""The GPU-fit agreement run (docs/gpu-fit.md, "Agreement run on a GPU host"): on a host with
NVIDIA GPUs, the fit decision (importer/format/cudafit.py ``decide``, the one ``bundle export
--have`` and ``bundle-import --require-fit`` make) for each local image, then each image actually
started with its GPUs, and a table of decision against outcome.

For every IMAGE (already in the engine; nothing is pulled):

1. its ``Config.Env`` (``CUDA_VERSION``, ``NVIDIA_REQUIRE_*``, ``NVIDIA_DISABLE_REQUIRE``) from
   ``docker image inspect``, and, in one container without GPUs, its forward-compatibility
   libraries (``/usr/local/cuda*/compat/libcuda.so.*``) and torch's CUDA (``torch/version.py``);
2. the decision against this host (driver, its CUDA, GPUs, the toolkit's mode; ``--gpu-flag cdi``
   judges as the CDI mode, which checks no ``NVIDIA_REQUIRE_*``);
3. ``docker run --rm --network none --gpus all IMAGE true`` (``--device nvidia.com/gpu=all`` with
   CDI; podman always CDI): did the container start (the toolkit's admission, rule 1);
4. with ``--cuda-probe``: ``python3 -c 'import torch; torch.cuda.init()'`` in the image with the
   GPUs (the compat libraries first on LD_LIBRARY_PATH when the decision uses them): did CUDA
   initialise (the runtime against the driver, rule 2). Images without torch say ``no-torch``.

Every container run has ``--timeout`` seconds (then it is removed with ``rm -f``). The table
(Markdown, on stdout and in ``--out``) has one row per image; ``--json`` writes the rows too.
Exit 0: every checked outcome agrees with the decision; 1: one disagrees; 2: usage, no GPU here,
no engine.

    python3 scripts/gpu-fit-agreement.py IMAGE... [--engine docker|podman] [--gpu-flag auto|gpus|cdi]
        [--timeout 120] [--cuda-probe] [--out agreement.md] [--json agreement.json]

Stdlib and this checkout's importer only (run it from a checkout; the test suite runs the table
writing only, with a fake runner: tests/test_gpu_fit_agreement.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from importer.format import cudafit  # this checkout's importer, after the path

TIMEOUT = 120.0
_COMPAT = re.compile(r"/usr/local/cuda[^/]*/compat/libcuda\.so\.([0-9]{1,9}(?:\.[0-9]{1,9}){1,3})$")
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([0-9]{1,4}\.[0-9]{1,4})['\"]", re.M)
# what the image shows without GPUs: its compat libraries, torch's version.py cuda line
SCAN = ("ls -1 /usr/local/cuda*/compat/libcuda.so.* 2>/dev/null; "
        "for f in /usr/lib/python3*/*-packages/torch/version.py /usr/local/lib/python3*/*-packages/torch/version.py "
        "/opt/conda/lib/python3*/site-packages/torch/version.py; do [ -f \"$f\" ] && grep '^cuda' \"$f\"; done; true")
PROBE = ("import torch, sys\n"
         "torch.cuda.init()\n"
         "print('cuda-ok', torch.cuda.device_count(), torch.version.cuda)\n")
# what the container toolkit says when it refuses a container (libnvidia-container's --require check)
REFUSALS = ("unsatisfied condition", "requirement error", "nvidia-container-cli")
# the compat libraries first, as the smoke suite puts them (docs/qualification.md)
PROBE_COMPAT = ('d=$(ls -d /usr/local/cuda*/compat 2>/dev/null | tail -n 1); '
                'LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec python3 -c "$0"')


@dataclass
class Ran:
    """What one command did: exit status (None: killed at the timeout), output."""

    returncode: Optional[int]
    stdout: str = ""
    stderr: str = ""

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def last_line(self) -> str:
        lines = [ln.strip() for ln in (self.stderr or self.stdout).strip().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""


#: runs ``argv`` with a timeout in seconds; the container name to remove when it is killed
Runner = Callable[[List[str], float, Optional[str]], Ran]


@dataclass
class Row:
    image: str
    cuda: Optional[str] = None
    decision: str = ""
    reason: str = ""
    expect_start: Optional[bool] = None
    started: Optional[str] = None  # started, refused, timeout, error
    expect_cuda: Optional[bool] = None
    cuda_init: Optional[str] = None  # ok, fail, no-torch, timeout, not-run
    detail: str = ""
    needs: Dict[str, Any] = field(default_factory=dict)

    @property
    def agree(self) -> Optional[bool]:
        """True: every outcome checked is the decision's; False: one is not; None: nothing to compare."""
        verdicts: List[bool] = []
        if self.expect_start is not None and self.started in ("started", "refused"):
            verdicts.append(self.expect_start == (self.started == "started"))
        if self.expect_cuda is not None and self.cuda_init in ("ok", "fail"):
            verdicts.append(self.expect_cuda == (self.cuda_init == "ok"))
        if not verdicts:
            return None
        return all(verdicts)

    def to_dict(self) -> Dict[str, Any]:
        return {"image": self.image, "imageCuda": self.cuda, "decision": self.decision, "reason": self.reason,
                "expectStart": self.expect_start, "started": self.started, "expectCuda": self.expect_cuda,
                "cudaInit": self.cuda_init, "agree": self.agree, "detail": self.detail, "needs": self.needs}


def run_command(argv: List[str], timeout: float, name: Optional[str] = None) -> Ran:
    """The real runner: ``argv`` bounded by ``timeout``; a container ``name`` is removed when killed."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        if name:
            subprocess.run([argv[0], "rm", "-f", name], capture_output=True, timeout=60, check=False)
        return Ran(None, "", f"killed after {timeout:g} s")
    except FileNotFoundError:
        return Ran(127, "", f"{argv[0]}: not found")
    return Ran(proc.returncode, proc.stdout.decode("utf-8", "replace")[-65536:],
               proc.stderr.decode("utf-8", "replace")[-65536:])


def gpu_args(engine: str, flag: str) -> List[str]:
    """How the container gets every GPU: ``--gpus all`` (Docker, the toolkit's hook: legacy mode
    checks NVIDIA_REQUIRE_*), or CDI ``--device nvidia.com/gpu=all`` (podman; docker with cdi)."""
    if flag == "gpus" or (flag == "auto" and engine == "docker"):
        return ["--gpus", "all"]
    return ["--device", "nvidia.com/gpu=all"]


def uses_cdi(engine: str, flag: str) -> bool:
    return gpu_args(engine, flag)[0] == "--device"


def image_needs(engine: str, image: str, runner: Runner, timeout: float, *, scan: bool = True) -> cudafit.ImageNeeds:
    """The image's CUDA needs, as the exporter records them: its env, compat libraries, torch's CUDA."""
    res = runner([engine, "image", "inspect", "--format", "{{json .Config.Env}}", image], timeout, None)
    if res.returncode != 0:
        raise LookupError(f"{image}: not in the engine ({res.last_line() or 'inspect failed'})")
    try:
        env = json.loads(res.stdout.strip() or "null")
    except ValueError:
        env = None
    libs: List[str] = []
    torch_cuda: Optional[str] = None
    if scan:
        name = f"gpu-fit-scan-{uuid.uuid4().hex[:10]}"
        seen = runner([engine, "run", "--rm", "--name", name, "--network", "none", "--pull", "never",
                       "--entrypoint", "sh", image, "-c", SCAN], timeout, name)
        if seen.returncode == 0:
            for line in seen.stdout.splitlines():
                m = _COMPAT.search(line.strip())
                if m:
                    libs.append(m.group(1))
            found = _TORCH_CUDA.search(seen.stdout)
            torch_cuda = found.group(1) if found else None
    return cudafit.needs_from_env(env if isinstance(env, list) else [], compat_libs=libs, torch_cuda=torch_cuda)


def judge(image: str, needs: cudafit.ImageNeeds, target: cudafit.Target, *, engine: str, flag: str,
          runner: Runner, timeout: float, cuda_probe: bool) -> Row:
    """Decide, start the image with its GPUs, probe CUDA if asked: one row."""
    fit = cudafit.decide(needs, target)
    row = Row(image, fit.image_cuda, fit.status, fit.reason, needs=needs.to_dict())
    # rule 1: the container toolkit refuses to start it exactly when admission says no
    row.expect_start = not (fit.status == cudafit.UNFIT and fit.admitted is False)
    if fit.status in (cudafit.FITS, cudafit.FITS_MINOR, cudafit.FITS_FORWARD):
        row.expect_cuda = True
    elif fit.status == cudafit.UNFIT and fit.admitted is not False:
        row.expect_cuda = False  # it starts; CUDA init fails (error 35, 804)
    name = f"gpu-fit-start-{uuid.uuid4().hex[:10]}"
    start = runner([engine, "run", "--rm", "--name", name, "--network", "none", "--pull", "never",
                    *gpu_args(engine, flag), "--entrypoint", "true", image], timeout, name)
    if start.timed_out:
        row.started = "timeout"
    elif start.returncode == 0:
        row.started = "started"
    elif any(m in start.stderr for m in REFUSALS):
        row.started = "refused"  # the container toolkit would not start it (rule 1)
    else:
        row.started = "error"  # something else: no `true` in the image, no toolkit, the engine
    row.detail = "" if row.started == "started" else f"start: {start.last_line()}"
    if cuda_probe and row.started == "started":
        name = f"gpu-fit-probe-{uuid.uuid4().hex[:10]}"
        argv = [engine, "run", "--rm", "--name", name, "--network", "none", "--pull", "never",
                *gpu_args(engine, flag)]
        if fit.use_compat_libs:
            argv += ["--entrypoint", "sh", image, "-c", PROBE_COMPAT, PROBE]
        else:
            argv += ["--entrypoint", "python3", image, "-c", PROBE]
        probe = runner(argv, timeout, name)
        text = probe.stdout + probe.stderr
        if probe.timed_out:
            row.cuda_init = "timeout"
        elif probe.returncode == 0 and "cuda-ok" in probe.stdout:
            row.cuda_init = "ok"
        elif "No module named 'torch'" in text or probe.returncode == 127 or "executable file not found" in text:
            row.cuda_init = "no-torch"
        else:
            row.cuda_init = "fail"
        if row.cuda_init != "ok":
            row.detail = "; ".join(x for x in (row.detail, f"cuda: {probe.last_line()}") if x)
    elif not cuda_probe:
        row.cuda_init = "not-run"
    return row


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|").replace("\n", " ")


def write_table(rows: Sequence[Row], target: cudafit.Target, *, gpu: str) -> str:
    """The Markdown table: the host, then one row per image, decision against outcome; then
    each row's reason and detail whole, and the count that agreed."""
    gpus = ", ".join(dict.fromkeys(g.name for g in target.gpus)) or "none"
    out = [f"host: driver {target.driver or '?'} (CUDA {target.cuda or '?'}), {len(target.gpus)} GPU(s): {gpus}; "
           f"toolkit mode {target.toolkit_mode or '?'}; GPUs by {gpu}", "",
           "| IMAGE | IMAGE CUDA | DECISION | EXPECT START | STARTED | EXPECT CUDA | CUDA INIT | AGREE |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        agree = {True: "yes", False: "**NO**", None: "n/a"}[r.agree]
        out.append("| " + " | ".join(_cell(c) for c in (r.image, r.cuda, r.decision, r.expect_start, r.started,
                                                        r.expect_cuda, r.cuda_init)) + f" | {agree} |")
    out.append("")
    for r in rows:
        out.append(f"- {r.image}: {r.decision}: {r.reason}" + (f" ({r.detail})" if r.detail else ""))
    agreed = sum(1 for r in rows if r.agree is True)
    disagreed = sum(1 for r in rows if r.agree is False)
    out += ["", f"agreement: {agreed} agree, {disagreed} disagree, {len(rows) - agreed - disagreed} not comparable, "
            f"of {len(rows)} image(s)"]
    return "\n".join(out) + "\n"


def host_target(engine: str, flag: str) -> cudafit.Target:
    """This host as the import's fit check sees it (importer/inventory/gpuhost.py)."""
    from importer.inventory import gpuhost

    target = cudafit.target_from_gpu_doc(gpuhost.probe())
    if uses_cdi(engine, flag):  # CDI injection checks no NVIDIA_REQUIRE_*: judge it as the cdi mode does
        target = dataclasses.replace(target, toolkit_mode="cdi")
    return target


def main(argv: Optional[Sequence[str]] = None, *, runner: Runner = run_command,
         target: Optional[cudafit.Target] = None) -> int:
    p = argparse.ArgumentParser(prog="gpu-fit-agreement.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", metavar="IMAGE", nargs="+", help="images already in the engine")
    p.add_argument("--engine", choices=("docker", "podman"), default="docker")
    p.add_argument("--gpu-flag", choices=("auto", "gpus", "cdi"), default="auto",
                   help="auto: --gpus all with docker, CDI with podman")
    p.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per container run (default %(default)s)")
    p.add_argument("--cuda-probe", action="store_true", help="also initialise CUDA with the image's torch")
    p.add_argument("--no-scan", action="store_true", help="judge by the image's env alone (no container without GPUs)")
    p.add_argument("--out", metavar="FILE", help="write the Markdown table here too")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON here")
    args = p.parse_args(list(argv) if argv is not None else None)
    if not args.timeout > 0:
        p.error("--timeout: expected a positive number of seconds")
    if target is None:
        target = host_target(args.engine, args.gpu_flag)
    if not target.known or target.driver_cuda() is None or not target.gpus:
        sys.stderr.write("error: this host shows no NVIDIA GPU and driver (NVML, nvidia-smi): the agreement run "
                         "needs a GPU host\n")
        return 2
    rows: List[Row] = []
    for image in args.images:
        try:
            needs = image_needs(args.engine, image, runner, args.timeout, scan=not args.no_scan)
        except LookupError as e:
            rows.append(Row(image, decision="not-judged", reason=str(e)))
            continue
        rows.append(judge(image, needs, target, engine=args.engine, flag=args.gpu_flag, runner=runner,
                          timeout=args.timeout, cuda_probe=args.cuda_probe))
    gpu = " ".join(gpu_args(args.engine, args.gpu_flag))
    table = write_table(rows, target, gpu=gpu)
    sys.stdout.write(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"host": {"driver": target.driver, "cuda": target.cuda, "toolkitMode": target.toolkit_mode,
                                "gpus": [g.name for g in target.gpus]}, "gpuFlag": gpu,
                       "rows": [r.to_dict() for r in rows]}, f, indent=2)
            f.write("\n")
    return 1 if any(r.agree is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
