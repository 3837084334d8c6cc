"""One import path (issue 27 point 3): ``bundle-import``'s arguments become an ImportPlan (its mode
and steps as data, importer/pipeline/plan.py) and one orchestrator walks it
(importer/pipeline/walk.py ``run_import``). The walks here are real: a bundle from the kit, an
OCI image layout as the engine (no daemon needed), the real signature keys."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from importer.cli.main import build_parser
from importer.errors import CheckOnlyMissing, PolicyRejected, UsageError, VerificationFailed
from importer.pipeline.checkonly import CheckOnlyResult
from importer.pipeline.plan import (
    CHECK_ONLY,
    IMPORT,
    LEGACY_IMPORT,
    REGISTRY,
    VERIFY_ONLY,
    ImportPlan,
    plan_from_args,
)
from importer.pipeline.walk import result_for, run_import
from importer.sinks.oci_layout import OciLayoutSink
from tests.kit.trustkit import keypair, sign

REPO = Path(__file__).resolve().parents[1]
FRONT = ["open", "signature", "schema"]
CHECK = ["probe", "verify", "read-back", "receipt"]
LOAD = ["probe", "lock", "preflight", "verify", "staging-load", "read-back", "tag", "drop-stale-staging", "receipt"]


def plan_of(*argv: str) -> ImportPlan:
    return plan_from_args(build_parser().parse_args(["B", *argv]))


@pytest.mark.parametrize("argv, mode, steps", [
    ([], IMPORT, FRONT + LOAD),
    (["--verify", "--engine", "docker"], IMPORT, FRONT + LOAD),
    (["--deep"], IMPORT, FRONT + LOAD[:6] + ["deep"] + LOAD[6:]),
    (["--verify-only"], VERIFY_ONLY, [*FRONT, "verify"]),
    (["--verify-only", "--shallow", "--engine", "registry"], VERIFY_ONLY, [*FRONT, "verify"]),
    (["--verify-only", "--require-signed", "k.pub"], VERIFY_ONLY, [*FRONT, "image-signatures", "verify"]),
    (["--check-only"], CHECK_ONLY, FRONT + CHECK),
    (["--check-only", "--deep"], CHECK_ONLY, FRONT + CHECK[:3] + ["deep", "receipt"]),
    (["--check-only", "--engine", "registry"], CHECK_ONLY, FRONT + CHECK),
    (["--engine", "registry"], REGISTRY, FRONT + LOAD),  # the one load route
    (["--registry", "127.0.0.1:5000/ns", "--engine", "oci"], IMPORT, FRONT + LOAD),  # --engine wins, as make_sink
])
def test_each_mode_is_a_plan_of_steps(argv: List[str], mode: str, steps: List[str]) -> None:
    plan = plan_of(*argv)
    assert plan.mode == mode
    assert list(plan.steps) == steps
    assert plan.needs_engine is (mode != VERIFY_ONLY)


@pytest.mark.parametrize("argv", [["--registry", "127.0.0.1:5000/ns", "--deep"], ["--engine", "registry", "--deep"],
                                  ["--check-only", "--engine", "registry", "--deep"]])
def test_deep_with_a_registry_is_refused_before_anything(argv: List[str]) -> None:
    """A registry cannot export an image again: --deep used to be dropped silently on an import."""
    with pytest.raises(UsageError, match=r"--deep with the registry engine.*found --engine registry"):
        plan_of(*argv)
    assert plan_of("--verify-only", "--engine", "registry", "--deep").mode == VERIFY_ONLY


def test_the_plan_carries_the_options_its_steps_use() -> None:
    plan = plan_of("--force", "--wait-lock", "2.5", "--platform", "linux/arm64", "--require-fit", "--trust",
                   "a.pub", "--trust", "b.pub", "--require-signed", "c.pub", "-q")
    assert (plan.force, plan.lock_wait, plan.platform, plan.require_fit) == (True, 2.5, "linux/arm64", True)
    assert (plan.trust, plan.require_signed, plan.quiet, plan.quiet_image_signatures) == (
        ("a.pub", "b.pub"), ("c.pub",), True, True)
    assert plan_of("--check-only", "--name-prefix", "h:5000/ns").name_prefix == "h:5000/ns"
    # --json quiets the per-image signature lines of --verify-only (its stdout is the document), not an import's
    assert plan_of("--verify-only", "--json").quiet_image_signatures is True
    assert plan_of("--json").quiet_image_signatures is False


def test_receipt_kind_per_mode() -> None:
    assert plan_of().receipt_kind == "import"
    assert plan_of("--engine", "registry").receipt_kind == "import"
    assert plan_of("--check-only").receipt_kind == "check-only"
    assert plan_of("--verify-only").receipt_kind is None


def test_a_schema_1_or_2_bundle_turns_an_import_into_a_legacy_import() -> None:
    for argv in ([], ["--engine", "registry"]):  # the legacy importer then refuses a registry
        legacy = plan_of(*argv).for_schema(2)
        assert (legacy.mode, legacy.legacy_major) == (LEGACY_IMPORT, 2)
        assert legacy.receipt_kind == "import" and list(legacy.steps) == FRONT + LOAD
    for argv, mode in ((["--verify-only"], VERIFY_ONLY), (["--check-only"], CHECK_ONLY)):
        kept = plan_of(*argv).for_schema(1)
        assert (kept.mode, kept.legacy_major) == (mode, 1)
    assert plan_of().for_schema(None) == plan_of()


def test_the_architecture_doc_walks_the_plan_the_code_makes() -> None:
    """docs/architecture.md's walk of `bundle-import B --verify` names the steps plan_from_args gives it."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    walk = doc[doc.index("## The walk of one import through the rooms"):doc.index("## Modules")]
    m = re.search(r"mode `import`,\s+steps `([^`]+)`", walk)
    assert m is not None
    assert re.split(r",\s+", m.group(1)) == list(plan_of("--verify").steps)
    m = re.search(r"`--verify-only` is `([^`]+)`", walk)
    assert m is not None and re.split(r",\s+", m.group(1)) == list(plan_of("--verify-only").steps)


# ------------------------------------------------------------------ the walk, for real


def test_one_walk_imports_checks_and_verifies(bundle: Path, tmp_path: Path) -> None:
    """The same run_import does an import, a check-only and a verify-only: each plan's route ran
    (images loaded, then found checked, then the report alone)."""
    layout = OciLayoutSink(str(tmp_path / "layout"))
    imported = ImportPlan(mode=IMPORT, bundle=str(bundle), quiet=True)
    res = run_import(imported, layout, result_for(imported))
    assert res.ok and [c.status for c in res.checks] == ["loaded", "loaded"]
    assert res.staging_refs and res.lock_file and res.signature is not None and res.bundle_digest

    checked = plan_from_args(build_parser().parse_args([str(bundle), "--check-only", "-q"]))
    res = run_import(checked, layout, result_for(checked))
    assert isinstance(res, CheckOnlyResult) and res.ok
    assert [c.status for c in res.checks] == ["checked", "checked"] and not res.staging_refs

    verified = plan_from_args(build_parser().parse_args([str(bundle), "--verify-only", "--shallow"]))
    notices: List[str] = []
    res = run_import(verified, None, result_for(verified), on_notice=notices.append)
    assert res.report.ok and res.report.layers_checked == 0 and res.engine is None  # shallow: no layer decompressed
    assert res.report.signature is not None and res.report.signature["status"] == "unsigned"
    assert notices and "signature" in notices[0]


def test_the_walk_runs_the_signature_step_before_the_route(bundle: Path, tmp_path: Path) -> None:
    """A bundle signed by another key: refused by the front step, the engine never asked (the
    layout is not even made), and the result says which bundle it judged."""
    key, _ = keypair(tmp_path, "publisher")
    _, other = keypair(tmp_path, "other")
    sign(bundle, key)
    plan = ImportPlan(mode=IMPORT, bundle=str(bundle), trust=(str(other),), quiet=True)
    result = result_for(plan)
    with pytest.raises(PolicyRejected):
        run_import(plan, OciLayoutSink(str(tmp_path / "layout")), result)
    assert not (tmp_path / "layout").exists() and result.engine is None and result.signature is None


def test_a_bad_platform_is_refused_by_the_import_step(bundle: Path, tmp_path: Path) -> None:
    """--platform is parsed where the import uses it: after the signature step (which the result records)."""
    plan = ImportPlan(mode=IMPORT, bundle=str(bundle), platform="linux", quiet=True)
    result = result_for(plan)
    with pytest.raises(UsageError, match="--platform"):
        run_import(plan, OciLayoutSink(str(tmp_path / "layout")), result)
    assert result.signature is not None and result.engine is None


def test_a_damaged_bundle_stops_every_plan_at_verify(bundle: Path, tmp_path: Path) -> None:
    blob = max((bundle / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    for mode in (VERIFY_ONLY, CHECK_ONLY, IMPORT):
        plan = ImportPlan(mode=mode, bundle=str(bundle), quiet=True)
        result = result_for(plan)
        with pytest.raises(VerificationFailed):
            run_import(plan, OciLayoutSink(str(tmp_path / "layout")) if plan.needs_engine else None, result)
        assert not result.checks and not result.staging_refs


# ------------------------------------------------------------------ bundle.json, parsed once


class Parses:
    """Counts, during a real run, the JSON parses of bundle.json's exact bytes (any caller of
    json.loads) and the typed objects built from them (schema 3 and schema 1/2 models)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import json

        import importer.format.legacy as legacy
        import importer.format.manifest as manifest

        self.text = ""
        self.json = self.typed = 0
        real_loads, real_3, real_legacy = json.loads, manifest.check_structure, legacy.check_legacy

        def loads(s: Any, *a: Any, **kw: Any) -> Any:
            self.json += (s.decode("utf-8", "replace") if isinstance(s, bytes) else s) == self.text
            return real_loads(s, *a, **kw)

        def typed(real: Any) -> Any:
            def build(*a: Any) -> Any:
                self.typed += 1
                return real(*a)
            return build

        monkeypatch.setattr(json, "loads", loads)
        monkeypatch.setattr(manifest, "check_structure", typed(real_3))
        monkeypatch.setattr(legacy, "check_legacy", typed(real_legacy))

    def of(self, plan: ImportPlan, sink: Any, bundle_json: Path) -> Tuple[int, int]:
        """(JSON parses, typed objects built) of one run_import of ``plan``."""
        self.text, self.json, self.typed = bundle_json.read_text(encoding="utf-8"), 0, 0
        assert run_import(plan, sink, result_for(plan)).report.ok
        return self.json, self.typed


def test_bundle_json_is_parsed_once_into_one_typed_object_per_run(bundle: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27 point 3: every step of a run (signature, schema, --require-signed, preflight,
    verification, the load, the read-back) reads the one object the opened bundle parsed; the
    issue counted 4 parses per import. A folder, a tar, a schema 2 bundle; each plan."""
    from bundle.archive import pack_bundle

    parses = Parses(monkeypatch)
    layout = OciLayoutSink(str(tmp_path / "layout"))
    bj = bundle / "bundle.json"
    assert parses.of(ImportPlan(mode=IMPORT, bundle=str(bundle), quiet=True, deep=True), layout, bj) == (1, 1)
    assert parses.of(ImportPlan(mode=CHECK_ONLY, bundle=str(bundle), quiet=True), layout, bj) == (1, 1)
    assert parses.of(ImportPlan(mode=VERIFY_ONLY, bundle=str(bundle), quiet=True), None, bj) == (1, 1)
    pack_bundle(str(bundle), str(tmp_path / "b.tar"))
    tar = str(tmp_path / "b.tar")
    assert parses.of(ImportPlan(mode=VERIFY_ONLY, bundle=tar, quiet=True), None, bj) == (1, 1)
    assert parses.of(ImportPlan(mode=CHECK_ONLY, bundle=tar, quiet=True), layout, bj) == (1, 1)
    legacy = REPO / "tests" / "golden" / "bundles" / "v2"
    assert parses.of(ImportPlan(mode=VERIFY_ONLY, bundle=str(legacy), quiet=True), None,
                     legacy / "bundle.json") == (1, 1)


def test_sign_pack_and_copy_read_bundle_json_through_the_shared_opener(bundle: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 point 3: `bundle sign` parses bundle.json once (it parsed it twice: once for the
    verification, again in sign_bundle); `bundle pack` once; `bundle copy` once for the source and
    once for the copy it verifies."""
    import argparse

    from bundle.archive import pack_bundle
    from bundle.keycmds import cmd_sign
    from importer.transfer.copy import copy_bundle

    key, _ = keypair(tmp_path, "k")
    parses = Parses(monkeypatch)
    parses.text = (bundle / "bundle.json").read_text(encoding="utf-8")
    args = argparse.Namespace(bundle=str(bundle), sign_key=str(key), passphrase_stdin=False, json=True)
    assert cmd_sign(args) == 0 and (bundle / "bundle.json.sig").is_file()
    assert (parses.json, parses.typed) == (1, 1)
    parses.json = parses.typed = 0
    pack_bundle(str(bundle), str(tmp_path / "b.tar"))
    assert (parses.json, parses.typed) == (1, 1)
    parses.json = parses.typed = 0
    assert copy_bundle(str(tmp_path / "b.tar"), str(tmp_path / "usb")).verification is not None
    assert (parses.json, parses.typed) == (2, 2)


def test_the_parse_counter_sees_a_second_parse(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter above is not blind: a step that parsed bundle.json again would be counted."""
    from importer.format.manifest import load_bundle_manifest
    from importer.verify import opened

    parses = Parses(monkeypatch)
    real = opened.verify_opened

    def parses_again(b: Any, **kw: Any) -> Any:
        load_bundle_manifest(b.raw_bundle_json)
        return real(b, **kw)

    monkeypatch.setattr(opened, "verify_opened", parses_again)
    assert parses.of(ImportPlan(mode=VERIFY_ONLY, bundle=str(bundle), quiet=True), None,
                     bundle / "bundle.json") == (2, 2)


# ------------------------------------------------------------------ the plan, the one source of what runs


def test_an_optional_step_runs_when_the_plan_lists_it() -> None:
    """The routes ask the plan (ImportPlan.runs), not the flags: --deep is a step only where the
    route has one (a registry cannot export an image again)."""
    assert plan_of("--deep").runs("deep") and plan_of("--check-only", "--deep").runs("deep")
    assert not plan_of().runs("deep") and not plan_of("--verify-only", "--deep").runs("deep")
    assert not ImportPlan(mode=REGISTRY, bundle="B", deep=True).runs("deep")
    assert plan_of("--require-signed", "k.pub").runs("image-signatures") and not plan_of().runs("image-signatures")


def test_the_routes_read_their_options_from_the_plan(bundle: Path, tmp_path: Path) -> None:
    """--deep in the plan: the import and the check-only route each export every image back out of
    the layout and hash it (its timing and result recorded); without it neither does."""
    layout = OciLayoutSink(str(tmp_path / "layout"))
    for mode in (IMPORT, CHECK_ONLY):
        plan = ImportPlan(mode=mode, bundle=str(bundle), quiet=True, deep=True)
        res = run_import(plan, layout, result_for(plan))
        assert res.ok and "deepSeconds" in res.timings
        assert [c.deep is not None and c.deep.ok for c in res.checks] == [True, True]
        shallow = ImportPlan(mode=mode, bundle=str(bundle), quiet=True)
        res = run_import(shallow, layout, result_for(shallow))
        assert res.ok and "deepSeconds" not in res.timings and all(c.deep is None for c in res.checks)
    checked = result_for(ImportPlan(mode=CHECK_ONLY, bundle=str(bundle), name_prefix="h:5000/ns", deep=True))
    assert isinstance(checked, CheckOnlyResult)
    with pytest.raises(CheckOnlyMissing, match="with prefix h:5000/ns"):  # not under those names in the layout
        run_import(ImportPlan(mode=CHECK_ONLY, bundle=str(bundle), quiet=True, name_prefix="h:5000/ns", deep=True),
                   layout, checked)
    assert checked.section() == {"namePrefix": "h:5000/ns", "deep": True, "names": 2}


def test_the_receipt_kind_is_the_plans(bundle: Path, tmp_path: Path) -> None:
    """importer/cli/main.py writes the receipt of the plan's kind (it used to read --check-only)."""
    from importer.cli.main import main

    for argv, kind in ((["--engine", "oci"], "import"), (["--check-only", "--engine", "oci"], "check-only")):
        receipt = tmp_path / f"{kind}.json"
        assert main([str(bundle), *argv, "--oci-dir", str(tmp_path / "layout"), "-q", "--receipt",
                     str(receipt)]) == 0
        doc = json.loads(receipt.read_text())
        assert doc["kind"] == kind and ("checkOnly" in doc) is (kind == "check-only")


def ran(plan: ImportPlan) -> List[str]:
    """The steps a run of ``plan`` reports when it completes: all of the plan's but the receipt (the caller's)."""
    return [s for s in plan.steps if s != "receipt"]


@pytest.mark.parametrize("mode", [IMPORT, CHECK_ONLY, VERIFY_ONLY])
def test_the_route_runs_the_steps_the_plan_lists_in_its_order(mode: str, bundle: Path, tmp_path: Path) -> None:
    """plan.steps is what a run does, in that order (the receipt step is the caller's): the plan is
    the one account of a run, not a comment beside the code (with --deep, into an OCI layout). Each
    run reports the steps it entered (``result.steps``)."""
    if mode == CHECK_ONLY:  # the images to check: imported first
        done = ImportPlan(mode=IMPORT, bundle=str(bundle), quiet=True)
        run_import(done, OciLayoutSink(str(tmp_path / "layout")), result_for(done))
    plan = ImportPlan(mode=mode, bundle=str(bundle), quiet=True, deep=mode != VERIFY_ONLY)
    sink = OciLayoutSink(str(tmp_path / "layout")) if plan.needs_engine else None
    res = run_import(plan, sink, result_for(plan))
    assert res.report.ok and res.steps == ran(plan)
    again = ImportPlan(mode=mode, bundle=str(bundle), quiet=True)  # everything held: the same steps, none skipped
    res = run_import(again, sink, result_for(again))
    assert res.steps == ran(again)
    if mode == VERIFY_ONLY:  # a schema 2 bundle: the same steps, its own verifier
        legacy = ImportPlan(mode=mode, bundle=str(REPO / "tests" / "golden" / "bundles" / "v2"), quiet=True)
        res = run_import(legacy, None, result_for(legacy))
        assert res.report.ok and res.steps == ["open", "signature", "schema", "verify"] == ran(legacy)


def test_a_failed_run_reports_the_step_it_stopped_at(bundle: Path, tmp_path: Path) -> None:
    """A run that raises reports the steps it entered, the last the one that failed: a damaged
    layer stops an import at verify, before anything is loaded."""
    blob = max((bundle / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    plan = ImportPlan(mode=IMPORT, bundle=str(bundle), quiet=True)
    result = result_for(plan)
    with pytest.raises(VerificationFailed):
        run_import(plan, OciLayoutSink(str(tmp_path / "layout")), result)
    assert result.steps == ran(plan)[:ran(plan).index("verify") + 1]
