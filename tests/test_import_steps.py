"""Every route reports the steps it ran (issue 41 point 1): ``result.steps`` of a real run, compared
with the plan's steps (importer/pipeline/plan.py), for all five routes: ``verify-only``,
``check-only`` and ``import`` of a schema 3 bundle into a private dockerd, ``legacy-import`` of a
schema 2 bundle into it, and ``registry`` into a loopback registry. The runs are the command's own
(its parser, its sink, run_import), in this process.

The registry runs the same load route (importer/pipeline/registry.py ``RegistryPayload``), so what
its steps mean is checked here too: a tag conflict refused before any blob is sent, every tag
written only after every image was read back by digest, one import per registry at a time."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional

import pytest

from importer.cli.main import build_parser, make_sink
from importer.pipeline.importing import ImportResult
from importer.pipeline.lock import engine_lock
from importer.pipeline.plan import CHECK_ONLY, IMPORT, LEGACY_IMPORT, REGISTRY, VERIFY_ONLY, plan_from_args
from importer.pipeline.walk import result_for, run_import
from importer.registry.client import parse_target
from tests.kit import engines
from tests.kit.helpers import REPO, docker, run_cli
from tests.kit.transferkit import FlakyProxy, random_bundle

pytestmark = pytest.mark.engine
LEGACY = REPO / "tests" / "golden" / "bundles" / "v2"


def walked(*argv: str, legacy: Optional[int] = None) -> tuple[str, List[str], ImportResult]:
    """(the mode run, the steps its plan lists but the caller's receipt, the result) of one run."""
    args = build_parser().parse_args([*argv, "-q"])
    plan = plan_from_args(args)
    sink = make_sink(args) if plan.needs_engine else None
    try:
        res = run_import(plan, sink, result_for(plan))
    finally:
        if sink is not None:
            sink.close()
    ran = plan.for_schema(legacy)
    return ran.mode, [s for s in ran.steps if s != "receipt"], res


def test_every_route_reports_the_steps_its_plan_lists(docker_host: str, pristine: Path) -> None:
    docker_args = ("--engine", "docker", "--docker-host", docker_host)
    mode, steps, res = walked(str(pristine), "--verify-only")
    assert mode == VERIFY_ONLY and res.report.ok and res.steps == steps == ["open", "signature", "schema", "verify"]

    mode, steps, res = walked(str(pristine), *docker_args, "--deep", "--force")
    assert mode == IMPORT and res.ok and "deep" in steps and res.steps == steps

    mode, steps, res = walked(str(pristine), *docker_args, "--check-only")
    assert mode == CHECK_ONLY and res.ok and res.steps == steps

    for ref in ("fake/base:1", "fake/app:2"):
        docker(docker_host, "image", "rm", ref, check=False)
    mode, steps, res = walked(str(LEGACY), *docker_args, legacy=2)
    assert mode == LEGACY_IMPORT and res.ok and {c.status for c in res.checks} == {"loaded"}
    assert res.steps == steps and "staging-load" in steps

    with engines.private_registry(f"steps-{os.getpid()}") as reg:
        mode, steps, res = walked(str(pristine), "--engine", "registry", "--registry", f"{reg.addr}/steps")
    assert mode == REGISTRY and res.ok and res.steps == steps == [
        "open", "signature", "schema", "probe", "lock", "preflight", "verify", "staging-load", "read-back", "tag",
        "drop-stale-staging"]  # the one load route (pipeline/load.py), as for an engine


def _status(addr: str, repo: str, reference: str) -> int:
    """HTTP status of a manifest HEAD straight at the registry (no proxy, no importer code)."""
    req = urllib.request.Request(f"http://{addr}/v2/{repo}/manifests/{reference}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _import(bundle: Path, target: str, *extra: str,
            env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return run_cli("importer", str(bundle), "--engine", "registry", "--registry", target, "--no-receipt", "-q",
                   *extra, env=env, timeout=300)


def test_the_registry_route_refuses_first_tags_last_and_locks(tmp_path: Path) -> None:
    """Into a real registry through a proxy: (1) a tag on another manifest is refused (exit 7)
    before a single write request; (2) a read-back that fails (the registry answers no manifest
    by digest) leaves every tag unwritten (exit 8), though each manifest is there by digest; (3) a
    second import into the same registry finds the lock held (exit 6), and with --wait-lock waits."""
    first = random_bundle(tmp_path / "first.bundle", mb=(1, 1), seed=1)
    other = random_bundle(tmp_path / "other.bundle", mb=(1, 1), seed=7)  # the same refs, other bytes
    images = json.loads((first / "bundle.json").read_text())["images"]
    env = {"SNEAKERNET_LOCK_DIR": str(tmp_path / "locks")}
    with engines.private_registry(f"steps-tags-{os.getpid()}") as reg:
        assert _import(first, f"{reg.addr}/c", env=env).returncode == 0

        with FlakyProxy(reg.port) as proxy:
            proc = _import(other, f"127.0.0.1:{proxy.port}/c", env=env)
        assert proc.returncode == 7 and "error[tag-conflict]" in proc.stderr, proc.stderr
        writes = [line for line in proxy.lines if line.split(" ", 1)[0] in ("POST", "PUT", "PATCH")]
        assert writes == [], writes

        with FlakyProxy(reg.port, fail_first=1000, fail_match=b"GET /v2/late/", fail_status=404) as proxy:
            proc = _import(first, f"127.0.0.1:{proxy.port}/late", env=env)
        assert proc.returncode == 8 and "error[post-load-mismatch]" in proc.stderr, proc.stderr
        assert "@sha256:" in proc.stderr and "the registry does not have it" in proc.stderr  # read back by digest
        assert proxy.failed and any(line.startswith("PUT /v2/late/") for line in proxy.lines)
        for image in images:
            repo, tag = image["refs"][0].rsplit(":", 1)
            assert _status(reg.addr, f"late/{repo}", image["manifest"]["digest"]) == 200  # pushed by digest
            assert _status(reg.addr, f"late/{repo}", tag) == 404  # never tagged

        address = str(parse_target(f"{reg.addr}/c"))
        os.environ["SNEAKERNET_LOCK_DIR"] = env["SNEAKERNET_LOCK_DIR"]
        try:
            held = engine_lock(address, bundle="held-by-the-test")
            held.__enter__()
            proc = _import(first, f"{reg.addr}/c", env=env)
            assert proc.returncode == 6 and "error[engine-locked]" in proc.stderr, proc.stderr
            releaser = threading.Timer(2.0, held.__exit__, (None, None, None))
            releaser.start()
            proc = _import(first, f"{reg.addr}/c", "--wait-lock", "120", env=env)
            releaser.join()
        finally:
            os.environ.pop("SNEAKERNET_LOCK_DIR", None)
        assert proc.returncode == 0, proc.stderr
