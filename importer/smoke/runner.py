"""qualify(): the host gate, then the suite inside the image (or in this Python), then the
gates, the verdict and the facts for the receipt. Every process is bounded in time; a killed
suite still yields a result for every gate."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from importer.errors import BundleError
from importer.smoke import container as ctr
from importer.smoke.host import HostFacts, probe_host
from importer.smoke.results import (
    EXIT_CODES,
    RunOutcome,
    order,
    required_gates,
    restart_gate,
    suite_gates,
    verdict,
)
from importer.smoke.settings import SmokeConfigError, SmokeSettings
from importer.smoke.tree import suite_tree
from importer.smoke.worker.protocol import parse_lines
from importer.smoke.worker.suite import BOOTSTRAP, describe_exit
from importer.streams.commands import run

KILL_MARGIN = 30.0  # the suite enforces --timeout on its children; the host kills it this much later
MAX_OUTPUT = 16 * 1024 * 1024
STDERR_TAIL = 4096


def _tail(f: Any, limit: int = STDERR_TAIL) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return str(f.read().decode("utf-8", "replace"))


def run_bounded(argv: Sequence[str], *, timeout: float, on_timeout: Optional[Callable[[], None]] = None,
                env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                new_session: bool = False) -> RunOutcome:
    """Run ``argv`` with stdout and stderr in temp files (never an undrained pipe). Past
    ``timeout`` call ``on_timeout`` (stop what the command started), then kill the command
    itself; the output it wrote until then is kept."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd,
                                    start_new_session=new_session)
        except OSError as e:
            raise SmokeConfigError(f"starting `{argv[0]}`: {e}", hint="is the engine installed?") from e
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            if on_timeout is not None:
                with contextlib.suppress(Exception):
                    on_timeout()
            if new_session:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the group this call started, nothing else
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out.seek(0)
        text = out.read(MAX_OUTPUT).decode("utf-8", "replace")
        return RunOutcome(events=parse_lines(text), returncode=proc.returncode, timed_out=timed_out,
                          stderr_tail=_tail(err), seconds=time.monotonic() - started)


def _last_line(text: str) -> str:
    """The last line that says something (not the CLI's "Run 'docker run --help'")."""
    lines = [ln.strip() for ln in text.strip().splitlines()
             if ln.strip() and not ln.strip().startswith(("Run '", "See '"))]
    return lines[-1] if lines else ""


def explain(outcome: RunOutcome, *, timeout: float, python: str, container: bool) -> RunOutcome:
    """Fill in ``failure``: why the suite did not report every gate."""
    if outcome.done:
        return outcome
    last = _last_line(outcome.stderr_tail)
    if outcome.timed_out:
        outcome.failure = f"the suite was killed after {timeout + KILL_MARGIN:g} s (--timeout {timeout:g})"
    elif not outcome.events and (outcome.returncode in (126, 127) or "executable file not found" in last):
        outcome.failure = f"could not start `{python}` in the image" + (f": {last}" if last else "")
    else:
        outcome.failure = f"the suite {describe_exit(outcome.returncode)}" + (f": {last}" if last else "")
    if container and not outcome.events and outcome.returncode == 125:
        raise SmokeConfigError("starting the smoke container: the engine refused it (status 125)",
                               context=outcome.stderr_tail.strip() or None,
                               hint="for --device cuda the engine needs the NVIDIA container toolkit "
                               "(`--gpus`); check the --volume paths")
    return outcome


@dataclass
class Qualification:
    settings: SmokeSettings
    host: HostFacts
    gates: List[Dict[str, Any]]
    verdict: str
    image: Optional[Dict[str, Any]] = None
    bundle: Optional[Dict[str, Any]] = None
    engine: Optional[Dict[str, Any]] = None
    environment: Dict[str, Any] = field(default_factory=dict)
    suite: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def _suite_args(settings: SmokeSettings, facts: HostFacts) -> List[str]:
    dc = facts.datacenter(settings.gpus)
    host_gpus = len(facts.selected(settings.gpus))
    nproc = settings.nproc or (host_gpus if settings.device == "cuda" else 0)
    args = ["run", "--device", settings.device, "--host-cuda", facts.cuda_version or "",
            "--datacenter", "unknown" if dc is None else ("yes" if dc else "no"),
            "--host-gpus", str(host_gpus), "--nproc", str(nproc), "--gates", ",".join(settings.gates),
            "--budget", str(settings.timeout), "--rank-timeout", str(settings.rank_timeout)]
    if settings.fault:
        args += ["--fault", settings.fault, "--fault-rank", str(settings.fault_rank)]
    return args


def _check_gpus(settings: SmokeSettings, facts: HostFacts) -> None:
    if settings.gpus is None or not facts.gpus:
        return
    known = {g.index for g in facts.gpus}
    missing = [g for g in settings.gpus if g not in known]
    if missing:
        raise SmokeConfigError(f"selecting GPUs {settings.gpus}: expected indices among {sorted(known)}, "
                               f"found {missing} not on this host", hint="see nvidia-smi -L")


def qualify(settings: SmokeSettings, image: Optional[str], *, bundle: Optional[Dict[str, Any]] = None,
            progress: Optional[Callable[[str], None]] = None) -> Qualification:
    """Run the whole qualification; raises SmokeConfigError (and other BundleErrors) only for
    problems of the setup, before any gate of the image ran."""
    started = time.monotonic()
    say = progress or (lambda _msg: None)
    if not settings.no_container and not image:
        raise SmokeConfigError("running the smoke suite: expected an IMAGE, found none",
                               hint="name the image, or use --no-container to test the current Python")
    say("host: asking NVML for the driver and GPUs")
    facts, host_result = probe_host()
    _check_gpus(settings, facts)
    inherited = dict(os.environ) if settings.no_container else None
    job_env, applied = settings.job_environment(inherited)
    args = _suite_args(settings, facts)
    python = settings.python_for_run()
    image_facts: Optional[ctr.ImageFacts] = None
    engine: Optional[Dict[str, Any]] = None
    second: Optional[RunOutcome] = None
    restart_s: Optional[float] = None
    restart_error: Optional[str] = None
    with suite_tree() as tree:
        if settings.no_container:
            env = dict(os.environ)
            env.update(job_env)
            argv = [python, "-c", BOOTSTRAP, tree, *args]

            def local() -> RunOutcome:
                return explain(run_bounded(argv, timeout=settings.timeout + KILL_MARGIN, env=env, cwd=tree,
                                           new_session=True),
                               timeout=settings.timeout, python=python, container=False)

            say(f"suite: running in {python}")
            first = local()
            if settings.restart:
                say("restart: running the suite again in a fresh interpreter")
                second = local()
        else:
            assert image is not None
            eng = engine_of(settings)
            image_facts = eng.inspect(image)
            engine = eng.describe()
            spec = ctr.ContainerSpec(image=image_facts.run_ref(),
                                     name=f"sneakernet-smoke-{uuid.uuid4().hex[:12]}", tree=tree, python=python,
                                     device=settings.device, gpus=settings.gpus,
                                     env=job_env, volumes=settings.volumes)
            _check_gpu_access(settings, eng, facts)

            def kill() -> None:
                run(eng.kill_argv(spec.name), what=f"killing {spec.name}", check=False, timeout=60)

            def in_container(argv: List[str]) -> RunOutcome:
                return explain(run_bounded(argv, timeout=settings.timeout + KILL_MARGIN, on_timeout=kill),
                               timeout=settings.timeout, python=python, container=True)

            try:
                if not settings.restart:
                    say(f"suite: running in a {eng.kind} container of {image}")
                    first = in_container(eng.run_argv(spec, *args, gpu_count=len(facts.gpus)))
                else:
                    first, second, restart_s, restart_error = _with_restart(eng, spec, args, in_container, say,
                                                                            len(facts.gpus))
            finally:
                for argv in eng.cleanup_argvs(spec.name):
                    with contextlib.suppress(BundleError):
                        run(argv, what=f"removing {spec.name}", check=False, timeout=120)
    gates = suite_gates(first)
    gates["host"] = dict(host_result, name="host")
    gates["host"].pop("event", None)
    if settings.restart:
        mode = "process" if settings.no_container else "container"
        gates["restart"] = restart_gate(mode, second, restart_s, restart_error)
    ordered = order(gates, required_gates(settings.device, settings.restart))
    env_event = first.first("env") or {}
    environment = {"job": dict(sorted(job_env.items())), "defaults": applied,
                   "inForce": env_event.get("inForce")}
    suite = dict(first.to_dict(), python=env_event.get("python"), executable=env_event.get("executable"))
    return Qualification(settings=settings, host=facts, gates=ordered, verdict=verdict(ordered),
                         image=image_facts.to_dict() if image_facts else None, bundle=bundle, engine=engine,
                         environment=environment, suite=suite, seconds=time.monotonic() - started)


def engine_of(settings: SmokeSettings) -> ctr.Engine:
    return ctr.build_engine(settings.engine, docker_host=settings.docker_host, address=settings.address,
                            namespace=settings.namespace, snapshotter=settings.snapshotter,
                            podman_root=settings.podman_root, podman_runroot=settings.podman_runroot,
                            storage_driver=settings.storage_driver, ulimits=settings.ulimits)


def _check_gpu_access(settings: SmokeSettings, eng: ctr.Engine, facts: HostFacts) -> None:
    """CUDA on a host with GPUs needs a way to hand them to the container (CDI spec, NVIDIA runtime)."""
    if settings.device != "cuda" or not facts.gpus or eng.gpu is not None:
        return
    raise SmokeConfigError(
        f"giving the {eng.kind} smoke container the GPUs: expected a CDI spec for nvidia.com/gpu in "
        f"{' or '.join(ctr.CDI_DIRS)}" + (f" or `{ctr.NVIDIA_RUNTIME}` on PATH" if eng.kind == "containerd" else "")
        + ", found neither",
        hint="generate one: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (NVIDIA Container Toolkit); "
        "or --device cpu")


def _with_restart(eng: ctr.Engine, spec: ctr.ContainerSpec, args: List[str],
                  in_container: Callable[[List[str]], RunOutcome], say: Callable[[str], None],
                  gpu_count: int = 0) -> Any:
    """A long-lived container: run the suite (exec), restart it, run it again (docker, podman)."""
    base = eng.base
    second: Optional[RunOutcome] = None
    restart_s: Optional[float] = None
    error: Optional[str] = None
    say(f"suite: starting the long-lived container {spec.name}")
    started = run(eng.run_argv(spec, "idle", gpu_count=gpu_count, detach=True), what=f"starting {spec.name}",
                  check=False, timeout=120)
    try:
        if started.returncode == 125:
            raise SmokeConfigError("starting the smoke container: the engine refused it (status 125)",
                                   context=started.stderr.strip() or None)
        if started.returncode != 0:
            first = RunOutcome(returncode=started.returncode, stderr_tail=started.stderr)
            first = explain(first, timeout=0, python=spec.python, container=True)
            return first, None, None, "the long-lived container did not start"
        first = in_container(ctr.docker_exec(base, spec, *args))
        say(f"restart: {eng.kind} restart {spec.name}")
        t0 = time.monotonic()
        res = run(ctr.docker_restart(base, spec.name), what=f"restarting {spec.name}", check=False, timeout=120)
        restart_s = round(time.monotonic() - t0, 3)
        if res.returncode != 0:
            error = f"{eng.kind} restart exited with status {res.returncode}: {_last_line(res.stderr)}"
        else:
            say("restart: running the suite again")
            second = in_container(ctr.docker_exec(base, spec, *args))
        return first, second, restart_s, error
    finally:
        with contextlib.suppress(BundleError):
            run(ctr.docker_rm(base, spec.name), what=f"removing {spec.name}", check=False, timeout=120)

