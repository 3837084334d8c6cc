"""Every route reports the steps it ran (issue 41 point 1): ``result.steps`` of a real run, compared
with the plan's steps (importer/pipeline/plan.py), for all five routes: ``verify-only``,
``check-only`` and ``import`` of a schema 3 bundle into a private dockerd, ``legacy-import`` of a
schema 2 bundle into it, and ``registry`` into a loopback registry. The runs are the command's own
(its parser, its sink, run_import), in this process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import pytest

from importer.cli.main import build_parser, make_sink
from importer.pipeline.importing import ImportResult
from importer.pipeline.plan import CHECK_ONLY, IMPORT, LEGACY_IMPORT, REGISTRY, VERIFY_ONLY, plan_from_args
from importer.pipeline.walk import result_for, run_import
from tests.kit import engines
from tests.kit.helpers import REPO, docker

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
        "open", "signature", "schema", "probe", "verify", "push", "read-back"]
