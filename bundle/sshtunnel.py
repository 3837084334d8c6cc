"""An SSH tunnel to a registry that only the far side can reach (``bundle push --ssh``).

``ssh -N -L 127.0.0.1:FREE:REGHOST:REGPORT USER@HOST`` with ``ExitOnForwardFailure=yes`` and
``BatchMode=yes`` (no prompt can hang it), started on a free local port; ready when the registry
answers through it; closed (TERM, then KILL, by the pid of the process we started) whatever
happens. The ssh process also gets SIGTERM if this process dies (PR_SET_PDEATHSIG on Linux)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Iterator, List, Optional, Tuple

from importer.errors import TunnelFailed, UsageError
from importer.format.reference import split_host_port
from importer.streams.commands import require_binary

READY_TIMEOUT = 30.0
_FORWARD_REFUSED = ("administratively prohibited", "open failed", "connect failed")
_PORT_BUSY = ("Address already in use", "cannot listen to port", "bind")


@dataclass(frozen=True)
class SshTarget:
    destination: str  # USER@HOST (or a Host alias of ~/.ssh/config)
    port: Optional[int] = None
    identity: Optional[str] = None
    options: Tuple[str, ...] = field(default_factory=tuple)  # extra `-o KEY=VALUE`

    def describe(self) -> str:
        return self.destination + (f" (port {self.port})" if self.port else "")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forward_spec(local_port: int, registry_host: str, default_port: int = 443) -> str:
    """``127.0.0.1:LOCAL:REGHOST:REGPORT`` (IPv6 REGHOST in brackets, as ssh wants it)."""
    host, port = split_host_port(registry_host)
    shown = f"[{host}]" if ":" in host else host
    return f"127.0.0.1:{local_port}:{shown}:{port or default_port}"


def ssh_argv(ssh: str, target: SshTarget, forward: str) -> List[str]:
    argv = [ssh, "-N", "-T",
            "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-o", "ConnectTimeout=20"]
    if target.port:
        argv += ["-p", str(target.port)]
    if target.identity:
        argv += ["-i", target.identity, "-o", "IdentitiesOnly=yes"]
    for opt in target.options:
        argv += ["-o", opt]
    argv += ["-L", forward, "--", target.destination]
    return argv


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _answers(port: int) -> bool:
    """Something speaks HTTP through the tunnel (any status line; TLS registries answer too)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(b"GET /v2/ HTTP/1.0\r\nHost: registry\r\n\r\n")
            return bool(s.recv(16))
    except OSError:
        return False


class SshTunnel:
    """Context manager: yields the local port that reaches the registry."""

    def __init__(self, target: SshTarget, registry_host: str, *, default_port: int = 443,
                 timeout: float = READY_TIMEOUT) -> None:
        if not target.destination or target.destination.startswith("-"):
            raise UsageError(f"reading --ssh: expected USER@HOST, found {target.destination!r}")
        if target.identity and not os.path.isfile(target.identity):
            raise UsageError(f"reading --identity: expected a private key file, found nothing at {target.identity}")
        self.target = target
        self.registry_host = registry_host
        self.default_port = default_port
        self.timeout = timeout
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.local_port = 0
        self._err: Any = None

    def _stderr(self) -> str:
        if self._err is None:
            return ""
        self._err.seek(0)
        return str(self._err.read()[-4000:].decode("utf-8", "replace")).strip()

    def open(self) -> int:
        ssh = require_binary("ssh", hint="install the OpenSSH client (apt-get install openssh-client)")
        last = ""
        for _attempt in range(3):
            self.local_port = free_port()
            argv = ssh_argv(ssh, self.target, forward_spec(self.local_port, self.registry_host, self.default_port))
            self._err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
            preexec = _die_with_parent if sys.platform.startswith("linux") else None
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self._err, preexec_fn=preexec)
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    last = self._stderr()
                    break
                if _answers(self.local_port):
                    return self.local_port
                text = self._stderr()
                if any(s in text for s in _FORWARD_REFUSED):
                    self.close()
                    raise TunnelFailed(
                        f"forwarding through {self.target.describe()} to {self.registry_host}: expected the SSH "
                        "server to open the connection, found it refused",
                        context=text or None,
                        hint="the server must allow it: AllowTcpForwarding yes|local and PermitOpen "
                        f"{self.registry_host} in its sshd_config; REGISTRY is the address as the SSH host sees it",
                    )
                time.sleep(0.2)
            else:
                last = self._stderr() or f"no answer within {self.timeout:.0f}s"
            rc = self.proc.poll()
            self.close()
            if rc is not None and any(s in last for s in _PORT_BUSY):
                continue  # another process took the free port first: try another
            raise TunnelFailed(
                f"opening an SSH tunnel through {self.target.describe()} to {self.registry_host}: expected the "
                f"registry to answer through it, found {f'ssh exited with status {rc}' if rc is not None else 'none'}",
                context=last or None,
                hint="check `ssh " + self.target.destination + " true` works without a prompt (keys, known_hosts), "
                "and that REGISTRY is the registry's address as the SSH host sees it",
            )
        raise TunnelFailed(f"opening an SSH tunnel through {self.target.describe()}: no free local port",
                           context=last or None)

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._err is not None:
            self._err.close()
            self._err = None

    def __enter__(self) -> int:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP raise KeyboardInterrupt here, so ``finally`` blocks (closing the tunnel) run."""
    def handler(signum: int, frame: Optional[FrameType]) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
