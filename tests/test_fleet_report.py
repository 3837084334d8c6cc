"""``bundle-import fleet-report`` (issue 18, point 4) over real receipts: check-only and import
receipts written against a private dockerd, an import of another build into an OCI layout, a CPU
smoke run in this Python, each by a real run under its own host name (a UTS namespace:
``unshare --uts``), signed with ``bundle sign-receipt`` (cryptography) and ``bundle-import
sign-receipt`` (openssl). The report passes for hosts that proved the image, and fails for a
missing host, a host whose image digest disagrees, a failed check, a smoke verdict short of pass,
and a receipt unsigned, signed by another key or changed after signing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from importer.receipts.receipt import now_utc
from tests.kit.bundlegen import FLEET_REFS as REFS
from tests.kit.bundlegen import fleet_bundle
from tests.kit.clijson import validate
from tests.kit.fleetkit import hosts, on_host, report
from tests.kit.helpers import forget, run_cli

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, docker_host: str) -> dict[str, Path]:
    """Receipts of real runs: node01 and node02 hold the bundle's images in Docker (node01 proved it
    with --check-only, node02 with an import), node03 imported another build into an OCI layout,
    node01 ran the CPU smoke suite (all-reduce only: verdict candidate); keys to sign them."""
    root = tmp_path_factory.mktemp("fleet")
    bundle = fleet_bundle(root / "fleet.bundle")
    other = fleet_bundle(root / "other.bundle", seed=b"# another build\n")
    forget(docker_host, *REFS)
    out: dict[str, Path] = {"root": root, "bundle": bundle}
    runs = {
        "node02.import": ("node02", str(bundle), "--engine", "docker"),
        "node01.check": ("node01", str(bundle), "--check-only", "--engine", "docker"),
        "node03.import": ("node03", str(other), "--engine", "oci", "--oci-dir", str(root / "node03.oci")),
        "node01.smoke": ("node01", "smoke", "--no-container", "--device", "cpu", "--gates", "allreduce"),
    }
    for name, (host, *args) in runs.items():
        path = root / "collected" / host / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = on_host(host, *args, "--receipt", str(path), "-q", docker_host=docker_host)
        assert proc.returncode == (10 if name.endswith("smoke") else 0), f"{name}: {proc.stderr}"
        out[name] = path
    (root / "keys").mkdir()
    for n in ("site", "other"):
        run_cli("bundle", "keygen", "-o", str(root / "keys" / n), check=True)
    return out


def _copy(fleet: dict[str, Path], tmp_path: Path, *names: str) -> Path:
    """A folder of collected receipts: the named ones (with their signatures, if any)."""
    folder = tmp_path / "receipts"
    for name in names:
        src = fleet[name]
        dst = folder / src.parent.name / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        if Path(f"{src}.sig").exists():
            shutil.copy2(f"{src}.sig", f"{dst}.sig")
    return folder


def test_hosts_that_proved_the_image_pass(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    code, doc = report(str(folder), "--hosts", "node[01-02]")
    assert code == 0 and doc["ok"] is True and doc["verdict"] == "pass"
    pinned = json.loads((fleet["bundle"] / "bundle.json").read_text())
    by_host = hosts(doc)
    assert sorted(by_host) == ["node01", "node02"]
    assert by_host["node01"]["proof"]["kind"] == "check-only" and by_host["node02"]["proof"]["kind"] == "import"
    for h in by_host.values():
        assert h["verdict"] == "pass" and h["reasons"] == [] and h["verification"] is True
        assert h["engine"]["kind"] == "docker"
        carried = sorted(i["manifest"]["digest"] for i in pinned["images"])
        assert sorted(i["manifestDigest"] for i in h["images"]) == carried
        assert h["proof"]["signature"]["status"] == "unsigned"  # no --trust: reported, not required
    assert doc["disagreements"] == [] and doc["missingHosts"] == []


def test_a_missing_host_fails_the_report(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    (tmp_path / "hosts.txt").write_text("# the job's nodes\nnode01\nnode02\nnode04\n")
    code, doc = report(str(folder), "--expect-hosts", str(tmp_path / "hosts.txt"))
    assert code == 1 and doc["ok"] is False and doc["missingHosts"] == ["node04"]
    assert hosts(doc)["node04"]["verdict"] == "missing"
    assert [h["verdict"] for h in doc["hosts"]] == ["pass", "pass", "missing"]
    code, doc = report(str(folder), "--hosts", "node01")  # node02 reported but is not expected
    assert code == 1 and doc["unexpectedHosts"] == ["node02"]
    assert "not in the expected hosts" in hosts(doc)["node02"]["reasons"]


def test_a_host_holding_another_build_disagrees(fleet: dict[str, Path], tmp_path: Path) -> None:
    """node03's own import passed, but of another build: its digests are not the fleet's."""
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import", "node03.import")
    code, doc = report(str(folder))
    assert code == 1 and doc["counts"]["passed"] == 2
    by_host = hosts(doc)
    assert by_host["node03"]["proof"]["result"] == "pass" and by_host["node03"]["verdict"] == "fail"
    whats = {d["what"]: d for d in doc["disagreements"]}
    assert set(whats) == {"bundle", *(f"image {ref}" for ref in REFS)}
    fleet_digest = by_host["node01"]["bundleDigest"]
    assert whats["bundle"]["fleet"] == fleet_digest
    assert whats["bundle"]["values"] == {fleet_digest: ["node01", "node02"],
                                         by_host["node03"]["bundleDigest"]: ["node03"]}
    assert any(r.startswith(f"image {REFS[1]} is sha256:") for r in by_host["node03"]["reasons"])


def test_a_failed_check_and_a_candidate_smoke_do_not_pass(fleet: dict[str, Path], tmp_path: Path,
                                                          docker_host: str) -> None:
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import", "node01.smoke")
    code, doc = report(str(folder))
    node01 = hosts(doc)["node01"]
    assert code == 1 and node01["verdict"] == "candidate"  # all-reduce only: the other gates SKIP
    assert node01["gates"]["allreduce"] == "PASS" and node01["gates"]["matmul"] == "SKIP"
    assert node01["busbwGBps"] is not None and node01["busbwGBps"] > 0
    assert node01["qualifications"][0]["image"] == "(this Python, --no-container)"
    code, doc = report(str(folder), "--require", "image,smoke")
    assert "no qualification receipt (bundle-import smoke)" in hosts(doc)["node02"]["reasons"]

    # node02 checks again, against an engine that lost the image: the newer, failed proof counts
    newest = folder / "node02" / "node02.recheck.json"
    before = json.loads((folder / "node02" / "node02.import.json").read_text())["created"]
    while now_utc() == before:  # created has one-second steps: this receipt must be the newer
        time.sleep(0.05)
    proc = on_host("node02", str(fleet["bundle"]), "--check-only", "--engine", "oci", "--oci-dir",
                   str(tmp_path / "empty.oci"), "--receipt", str(newest), "-q")
    assert proc.returncode == 8, proc.stderr
    code, doc = report(str(folder / "node01" / "node01.check.json"), str(folder / "node02"))
    node02 = hosts(doc)["node02"]
    assert code == 1 and node02["proof"]["kind"] == "check-only" and node02["proof"]["errorId"] == "check-only-missing"
    assert node02["superseded"] == [str(folder / "node02" / "node02.import.json")]
    assert node02["reasons"][0].startswith("check-only failed: error[check-only-missing]")


def test_signed_receipts_pass_and_unsigned_changed_or_foreign_ones_fail(fleet: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    keys = fleet["root"] / "keys"
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    node01, node02 = folder / "node01" / "node01.check.json", folder / "node02" / "node02.import.json"
    code, doc = report(str(folder), "--trust", str(keys / "site.pub"))
    assert code == 1 and all("signature unsigned" in h["reasons"][0] for h in doc["hosts"])

    signed = run_cli("bundle", "sign-receipt", str(node01), "--sign-key", str(keys / "site.key"), "--json")
    assert signed.returncode == 0, signed.stderr
    validate("sign-receipt", json.loads(signed.stdout))
    signed = run_cli("importer", "sign-receipt", str(node02), "--sign-key", str(keys / "site.key"), "--json")
    assert signed.returncode == 0, signed.stderr  # openssl on a node without the exporter: the same format
    validate("sign-receipt", json.loads(signed.stdout))
    code, doc = report(str(folder), "--trust", str(keys / "site.pub"))
    assert code == 0, doc
    assert {h["proof"]["signature"]["status"] for h in doc["hosts"]} == {"verified"}
    code, doc = report(str(folder), "--trust", str(keys / "other.pub"))  # signed, by a key not trusted
    assert code == 1 and {h["proof"]["signature"]["status"] for h in doc["hosts"]} == {"untrusted-key"}

    text = node02.read_text()
    node02.write_text(text.replace('"result": "pass"', '"result":  "pass"', 1))  # one byte more, same meaning
    code, doc = report(str(folder), "--trust", str(keys / "site.pub"))
    assert code == 1 and hosts(doc)["node01"]["verdict"] == "pass"
    assert hosts(doc)["node02"]["proof"]["signature"]["status"] == "bad"
    assert "the receipt was changed after signing" in hosts(doc)["node02"]["reasons"][0]
    code, doc = report(str(folder))  # without --trust signatures are reported, not checked
    assert code == 0 and hosts(doc)["node02"]["verdict"] == "pass"
    assert hosts(doc)["node02"]["proof"]["signature"]["status"] == "not-checked"


def test_files_that_are_not_receipts_and_paths_that_name_nothing(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check")
    (folder / "notes.json").write_text('{"hello": "world"}')
    (folder / "broken.json").write_text('{"kind": "import", ')
    code, doc = report(str(folder))
    assert code == 1 and hosts(doc)["node01"]["verdict"] == "pass"
    assert sorted(p["id"] for p in doc["problems"]) == ["not-a-receipt", "not-a-receipt"]
    proc = run_cli("importer", "fleet-report", str(tmp_path / "nowhere"), "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["id"] == "file-access"
    validate("fleet-report", json.loads(proc.stdout))


@pytest.mark.parametrize("spec", ["node[\u00b2]", "node[0\u0661-02]", "node[01-\uff10\uff12]", "node[\u00b9-\u00b3]"])
def test_a_host_range_in_other_digits_is_a_usage_error(spec: str) -> None:
    """Issue 38: a range is ASCII digits; another script's (or a superscript, which isdigit()
    takes and int() refuses) is a usage error naming it, never a crash or a silent rewrite."""
    from importer.errors import UsageError
    from importer.receipts.fleet import expand_hostlist

    assert expand_hostlist("node[01-02]") == ["node01", "node02"]
    with pytest.raises(UsageError, match="expected numbers"):
        expand_hostlist(spec)
