"""Atomic, idempotent import: an importer killed with SIGKILL at several points (verifying, while
`docker load` receives the archive, after the load before tagging, after the first tag) leaves
no tagged image that fails verification, and the re-run succeeds and removes the staging tags
the killed run left; SIGTERM/SIGINT stop cleanly (receipt says fail, nothing left); the engine
lock keeps a second import out (or makes it wait); stale staging cleanup never touches a user's
tag. The importer is held at an exact step by the test-only hold points (importer/streams/testhooks.py).

Engine matrix (issue 13): everything runs on Docker's classic store; on its containerd store
(fixture ``docker_store``, the images built and exported there, loaded as an OCI archive) a
representative subset runs, to keep the suite short: SIGKILL while ``docker load`` receives the
archive and after the first tag, SIGTERM during the load, and the stale-staging cleanup. The
other hold points exercise the same importer code before and after the load on either store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from importer.pipeline.lock import EngineLocked, engine_lock
from tests.kit.engines import DOCKER_STORES
from tests.kit.helpers import docker, run_pyz, start_pyz
from tests.kit.trustkit import (
    BASE_REF,
    SEC_REFS,
    build_sec_images,
    engine_listing,
    error_id,
    export_bundle,
    remove_images,
    staging_tags,
    tagged_images_verify,
)

HOLD_TIMEOUT = 120


@pytest.fixture(scope="module")
def _sec_bundles() -> dict[str, Path]:
    return {}


@pytest.fixture
def sec_bundle(docker_store: str, docker_store_host: str, busybox: str, _sec_bundles: dict,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sec images built in this store's engine and exported from it (once per store)."""
    if docker_store not in _sec_bundles:
        build_sec_images(docker_store_host, busybox, tmp_path_factory.mktemp(f"ctx-{docker_store}"))
        _sec_bundles[docker_store] = export_bundle(docker_store_host,
                                                   tmp_path_factory.mktemp(f"b-{docker_store}") / "sec.bundle")
    return _sec_bundles[docker_store]  # type: ignore[no-any-return]


@pytest.fixture
def clean_engine(sec_bundle: Path, docker_store_host: str) -> str:
    remove_images(docker_store_host)
    for line in staging_tags(docker_store_host):
        docker(docker_store_host, "image", "rm", line.split()[1], check=False)
    return docker_store_host


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    d = tmp_path / "locks"
    d.mkdir()
    return d


def _env(lock_dir: Path, point: str | None = None, marker: Path | None = None) -> dict[str, str]:
    """What an importer started here sets beside DOCKER_HOST: its lock dir, where it holds."""
    env = {"SNEAKERNET_LOCK_DIR": str(lock_dir)}
    if point:
        env.update(SNEAKERNET_TEST_HOLD_AT=point, SNEAKERNET_TEST_HOLD_FILE=str(marker),
                   SNEAKERNET_TEST_HOLD_SECONDS=str(HOLD_TIMEOUT))
    return env


def _start_held(bundle: Path, docker_host: str, lock_dir: Path, point: str, tmp_path: Path,
                *args: str) -> subprocess.Popen[str]:
    marker = tmp_path / f"held-{point}"
    proc = start_pyz(bundle / "bundle-import.pyz", str(bundle), "--docker-host", docker_host, "--receipt",
                     str(tmp_path / f"held-{point}.json"), *args, docker_host=docker_host,
                     env=_env(lock_dir, point, marker))
    deadline = time.monotonic() + HOLD_TIMEOUT
    while not marker.exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the importer ended (rc {proc.returncode}) before reaching {point!r}:\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the importer did not reach {point!r} in {HOLD_TIMEOUT}s")
        time.sleep(0.05)
    return proc


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _kill_hard(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the importer alone (as the OOM killer would); wait for what it had started
    (an orphaned `docker load` sees its input end) so the re-run starts from a settled engine."""
    kids = _descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    deadline = time.monotonic() + 120
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(k) for k in kids), "the importer's children outlived it"


@pytest.mark.engine
@pytest.mark.parametrize(("point", "docker_store"), [
    *[(p, "classic") for p in ("verify", "load", "loaded", "tagged")],
    ("load", "containerd"), ("tagged", "containerd"),
], indirect=["docker_store"])
def test_sigkill_then_rerun(point: str, sec_bundle: Path, clean_engine: str, lock_dir: Path,
                            tmp_path: Path) -> None:
    proc = _start_held(sec_bundle, clean_engine, lock_dir, point, tmp_path)
    _kill_hard(proc)
    # the invariant: whatever the engine tags under a bundle ref is exactly what bundle.json pins
    present = tagged_images_verify(clean_engine, sec_bundle)
    if point == "tagged":
        assert len(present) == 1
    else:
        assert present == []
    if point in ("loaded", "tagged"):
        assert staging_tags(clean_engine), "the kill should have left this run's staging tags"
    receipt = tmp_path / "rerun.json"
    rerun = run_pyz(sec_bundle, "--docker-host", clean_engine, "--receipt", str(receipt),
                         env={"SNEAKERNET_LOCK_DIR": str(lock_dir)})
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(tagged_images_verify(clean_engine, sec_bundle)) == sorted(SEC_REFS)
    assert not staging_tags(clean_engine)
    doc = json.loads(receipt.read_text())
    assert doc["result"] == "pass"
    if point in ("loaded", "tagged"):
        assert len(doc["staging"]["staleRemoved"]) == 2
        assert {i["status"] for i in doc["images"]} == {"already-present"}


@pytest.mark.engine
@pytest.mark.parametrize(("point", "sig", "rc", "ident", "docker_store"), [
    ("load", signal.SIGTERM, 143, "terminated", "classic"),
    ("loaded", signal.SIGINT, 130, "interrupted", "classic"),
    ("verify", signal.SIGHUP, 143, "terminated", "classic"),
    ("load", signal.SIGTERM, 143, "terminated", "containerd"),
], indirect=["docker_store"])
def test_signal_stops_cleanly(point: str, sig: signal.Signals, rc: int, ident: str, sec_bundle: Path,
                              clean_engine: str, lock_dir: Path, tmp_path: Path) -> None:
    before = engine_listing(clean_engine)
    proc = _start_held(sec_bundle, clean_engine, lock_dir, point, tmp_path)
    proc.send_signal(sig)  # at "verify" the hold is in a worker thread; the stop lands in the main one
    _, err = proc.communicate(timeout=HOLD_TIMEOUT + 60)
    assert proc.returncode == rc, err
    assert f"error[{ident}]" in err and signal.Signals(sig).name in err
    doc = json.loads((tmp_path / f"held-{point}.json").read_text())
    assert doc["result"] == "fail" and doc["error"]["id"] == ident and doc["error"]["exitCode"] == rc
    assert doc["staging"]["leftovers"] == []
    assert engine_listing(clean_engine) == before  # what the run loaded was removed
    assert not staging_tags(clean_engine)


@pytest.mark.engine
def test_second_import_into_the_same_engine_fails_clearly_or_waits(sec_bundle: Path, clean_engine: str,
                                                                   lock_dir: Path, tmp_path: Path) -> None:
    first = _start_held(sec_bundle, clean_engine, lock_dir, "verify", tmp_path)
    try:
        second = run_pyz(sec_bundle, "--docker-host", clean_engine, "--no-receipt",
                              env={"SNEAKERNET_LOCK_DIR": str(lock_dir)})
        assert second.returncode == 6 and error_id(second.stderr) == "engine-locked", second.stderr
        assert f"pid {first.pid}" in second.stderr and str(sec_bundle) in second.stderr
        waiting = start_pyz(sec_bundle / "bundle-import.pyz", str(sec_bundle), "--docker-host", clean_engine,
                            "--no-receipt", "--wait-lock", "120", docker_host=clean_engine, env=_env(lock_dir))
        time.sleep(2)
        assert waiting.poll() is None  # it waits while the first one holds the lock
    finally:
        _kill_hard(first)  # the kernel drops a dead holder's flock
    _, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    assert "waiting for the engine lock" in err and f"pid {first.pid}" in err
    assert sorted(tagged_images_verify(clean_engine, sec_bundle)) == sorted(SEC_REFS)


@pytest.mark.engine
@pytest.mark.parametrize("docker_store", sorted(DOCKER_STORES), indirect=True)
def test_stale_cleanup_removes_only_staging_tags(sec_bundle: Path, clean_engine: str, lock_dir: Path,
                                                 tmp_path: Path) -> None:
    assert run_pyz(sec_bundle, "--docker-host", clean_engine, "--no-receipt").returncode == 0
    stale = "sneakernet-staging/0123456789ab:0"
    users = ["sneakernet-staging/mine:latest", "sneakernet-staging/0123456789ab:v1", "mine/sneakernet-staging:1",
             "sneakernet-staging-lookalike/x:0"]
    for ref in [stale, *users]:
        docker(clean_engine, "tag", BASE_REF, ref)
    try:
        receipt = tmp_path / "r.json"
        proc = run_pyz(sec_bundle, "--docker-host", clean_engine, "--receipt", str(receipt))
        assert proc.returncode == 0, proc.stderr
        assert json.loads(receipt.read_text())["staging"]["staleRemoved"] == [stale]
        tags = {line.split()[1] for line in engine_listing(clean_engine)}
        assert stale not in tags and set(users) <= tags
    finally:
        for ref in users:
            docker(clean_engine, "image", "rm", ref, check=False)


def test_engine_lock_is_per_engine_and_dies_with_its_holder(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNEAKERNET_LOCK_DIR", str(lock_dir))
    with engine_lock("unix:///run/a.sock", bundle="/b1") as path:
        assert Path(path).parent == lock_dir
        assert json.loads(Path(path).read_text())["pid"] == os.getpid()
        with engine_lock("unix:///run/b.sock", bundle="/b2"):  # another engine: no contention
            pass
        with pytest.raises(EngineLocked, match=f"pid {os.getpid()}") as caught, \
                engine_lock("unix:///run/a.sock", bundle="/b3"):
            pass
        assert caught.value.exit_code == 6 and "--wait-lock" in (caught.value.hint or "")
    with engine_lock("unix:///run/a.sock", bundle="/b4"):  # released
        pass
    # a holder killed with SIGKILL releases it too
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; sys.path.insert(0, sys.argv[1]);"
                               "from importer.pipeline.lock import engine_lock\n"
                               "with engine_lock('unix:///run/a.sock', bundle='/held'):\n"
                               " print('held', flush=True); time.sleep(60)", str(Path(__file__).parents[1])],
                              stdout=subprocess.PIPE, text=True, env={**os.environ})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(EngineLocked, match="/held"), engine_lock("unix:///run/a.sock", bundle="/b5"):
        pass
    holder.kill()
    holder.wait()
    with engine_lock("unix:///run/a.sock", bundle="/b6", wait=5):
        pass
