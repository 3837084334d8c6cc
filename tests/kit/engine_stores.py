"""Private containerd and podman stores for tests (the dockerd helpers are in tests/kit/engines.py).

containerd: ``docker/scripts/containerd.sh start|stop NAME`` (own config, root, state, socket
and pidfile under ``$SNEAKERNET_RUN/containerd-NAME``; stopped by pid).
podman: no daemon; a store is a folder ``$SNEAKERNET_RUN/podman-NAME`` holding ``root/``,
``runroot/``, ``tmp/`` and private ``containers.conf``/``storage.conf`` (passed through
``CONTAINERS_CONF``/``CONTAINERS_STORAGE_CONF``, so the host's configuration is never read or
changed). ``podman run`` here needs ``--ulimit nofile=1024:1024 --ulimit nproc=1024:1024``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.kit import engines

CONTAINERD_SH = engines.SCRIPTS / "containerd.sh"
PODMAN_RUN_ARGS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "none",
                   "--pull", "never")


def run_dir() -> Path:
    return Path(os.environ.get("SNEAKERNET_RUN", "/tmp/sneakernet-run")).absolute()


# --- containerd --------------------------------------------------------------------------


def start_containerd(name: str, *, fresh: bool = True) -> str:
    """Start private containerd ``name``; return its socket path."""
    if fresh:
        engines._run(["bash", str(CONTAINERD_SH), "purge", name], timeout=120)
    sock = engines._run(["bash", str(CONTAINERD_SH), "start", name], timeout=120).stdout.strip()
    if not sock.startswith("/"):
        raise engines.EngineError(f"containerd.sh start {name} printed {sock!r}, expected a socket path")
    return sock


def stop_containerd(name: str, *, purge: bool = False) -> None:
    engines._run(["bash", str(CONTAINERD_SH), "purge" if purge else "stop", name], timeout=120)


def containerd_dir(name: str) -> Path:
    return run_dir() / f"containerd-{name}"


def ctr(address: str, namespace: str, *args: str, timeout: float = 300) -> str:
    return engines._run([engines.require("ctr"), "--address", address, "--namespace", namespace, *args],
                        timeout=timeout).stdout


# --- podman --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodmanStore:
    dir: Path
    driver: str

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def runroot(self) -> Path:
        """podman refuses a runroot longer than 50 characters: a short path keyed by the store."""
        key = hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
        return Path(f"/tmp/snpr-{key}")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CONTAINERS_CONF"] = str(self.dir / "containers.conf")
        env["CONTAINERS_STORAGE_CONF"] = str(self.dir / "storage.conf")
        env["TMPDIR"] = str(self.dir / "tmp")
        return env

    def global_args(self) -> list[str]:
        return ["--root", str(self.root), "--runroot", str(self.runroot), "--storage-driver", self.driver]

    def importer_args(self) -> list[str]:
        return ["--engine", "podman", "--podman-root", str(self.root), "--podman-runroot", str(self.runroot),
                "--storage-driver", self.driver]

    def podman(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([engines.require("podman"), *self.global_args(), *args], capture_output=True,
                              text=True, env=self.env(), timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise engines.EngineError(f"podman {' '.join(args)} exited {proc.returncode}\n{proc.stderr}")
        return proc

    def inspect(self, name: str) -> dict:  # type: ignore[type-arg]
        return json.loads(self.podman("image", "inspect", name).stdout)[0]  # type: ignore[no-any-return]

    def layer_dir(self, diff_id: str, parent_chain: list[str]) -> Path:
        """Where the storage driver keeps the files of the layer with this diff_id (and parents)."""
        layers = json.loads((self.root / f"{self.driver}-layers" / "layers.json").read_text())
        by_id = {x["id"]: x for x in layers}
        for layer in layers:
            if layer.get("diff-digest") != diff_id:
                continue
            chain, cur = [], layer
            while cur is not None:
                chain.append(cur.get("diff-digest"))
                cur = by_id.get(cur.get("parent", ""))
            if list(reversed(chain)) == [*parent_chain, diff_id]:
                sub = "diff" if self.driver == "overlay" else ""
                base = self.root / self.driver / ("dir" if self.driver == "vfs" else "") / layer["id"]
                return base / sub if sub else base
        raise engines.EngineError(f"no {self.driver} layer with diff_id {diff_id} in {self.root}")


def podman_store(name: str, driver: str) -> PodmanStore:
    """A fresh private podman store ``name`` with storage driver ``driver`` (vfs, overlay)."""
    store = PodmanStore(run_dir() / f"podman-{name}", driver)
    purge_podman_store(store)
    for sub in ("root", "tmp"):
        (store.dir / sub).mkdir(parents=True, exist_ok=True)
    store.runroot.mkdir(parents=True, exist_ok=True)
    (store.dir / "containers.conf").write_text(
        "[engine]\n"
        'events_logger = "file"\n'
        f'events_logfile_path = "{store.dir}/events.log"\n'
        'cgroup_manager = "cgroupfs"\n'
        f'tmp_dir = "{store.dir}/tmp"\n'
        f'image_copy_tmp_dir = "{store.dir}/tmp"\n'
        "[network]\n"
        f'network_config_dir = "{store.dir}/networks"\n'
    )
    (store.dir / "storage.conf").write_text(
        "[storage]\n"
        f'driver = "{driver}"\n'
        f'graphroot = "{store.root}"\n'
        f'runroot = "{store.runroot}"\n'
    )
    return store


def purge_podman_store(store: PodmanStore) -> None:
    """Unmount anything under the store (innermost first), then remove it."""
    for folder in (store.dir, store.runroot):
        if not folder.exists():
            continue
        prefix = str(folder)
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4].encode().decode("unicode_escape")
            if target == prefix or target.startswith(prefix + "/"):
                mounts.append(target)
        for target in reversed(mounts):
            subprocess.run(["umount", target], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)
