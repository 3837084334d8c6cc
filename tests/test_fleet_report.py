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
from typing import Any

import pytest

from importer.receipts.receipt import now_utc
from tests.kit.bundlegen import FLEET_REFS as REFS
from tests.kit.bundlegen import fleet_bundle
from tests.kit.clijson import validate
from tests.kit.fleetkit import hosts, on_host, report, report_and_table, rows, table_row
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
    assert code == 12 and doc["ok"] is False and doc["missingHosts"] == ["node04"]
    assert hosts(doc)["node04"]["verdict"] == "missing"
    assert [h["verdict"] for h in doc["hosts"]] == ["pass", "pass", "missing"]
    code, doc = report(str(folder), "--hosts", "node01")  # node02 reported but is not expected
    assert code == 12 and doc["unexpectedHosts"] == ["node02"]
    assert "not in the expected hosts" in hosts(doc)["node02"]["reasons"]


def test_a_host_holding_another_build_disagrees(fleet: dict[str, Path], tmp_path: Path) -> None:
    """node03's own import passed, but of another build: its digests are not the fleet's."""
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import", "node03.import")
    code, doc = report(str(folder))
    assert code == 12 and doc["counts"]["passed"] == 2
    by_host = hosts(doc)
    assert by_host["node03"]["proof"]["result"] == "pass" and by_host["node03"]["verdict"] == "fail"
    whats = {d["what"]: d for d in doc["disagreements"]}
    assert set(whats) == {"bundle", *(f"image {ref}" for ref in REFS)}
    fleet_digest = by_host["node01"]["bundleDigest"]
    assert whats["bundle"]["fleet"] == fleet_digest
    assert whats["bundle"]["values"] == {fleet_digest: ["node01", "node02"],
                                         by_host["node03"]["bundleDigest"]: ["node03"]}
    assert any(r.startswith(f"image {REFS[1]} is sha256:") for r in by_host["node03"]["reasons"])


def test_a_failed_check_and_a_candidate_smoke_do_not_pass(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import", "node01.smoke")
    code, doc = report(str(folder))
    node01 = hosts(doc)["node01"]
    assert code == 12 and node01["verdict"] == "candidate"  # all-reduce only: the other gates SKIP
    assert node01["gates"]["allreduce"] == "PASS" and node01["gates"]["matmul"] == "SKIP"
    assert node01["busbwGBps"] is not None and node01["busbwGBps"] > 0
    assert node01["qualifications"][0]["image"] == "(this Python, --no-container)"
    code, doc = report(str(folder), "--require", "image,smoke")
    assert "no qualification receipt (bundle-import smoke)" in hosts(doc)["node02"]["reasons"]

    # node03 checks again, in the same engine (its OCI layout), which lost the images: the newer,
    # failed proof counts, the import is superseded
    folder = _copy(fleet, tmp_path / "again", "node03.import")
    newest = folder / "node03" / "node03.recheck.json"
    before = json.loads((folder / "node03" / "node03.import.json").read_text())["created"]
    while now_utc() == before:  # created has one-second steps: this receipt must be the newer
        time.sleep(0.05)
    proc = on_host("node03", str(fleet["root"] / "other.bundle"), "--check-only", "--engine", "oci", "--oci-dir",
                   str(tmp_path / "empty.oci"), "--receipt", str(newest), "-q")
    assert proc.returncode == 8, proc.stderr
    code, doc = report(str(folder))
    node03 = hosts(doc)["node03"]
    assert code == 12 and node03["proof"]["kind"] == "check-only" and node03["proof"]["errorId"] == "check-only-missing"
    assert node03["superseded"] == [str(folder / "node03" / "node03.import.json")]
    assert node03["reasons"][0].startswith("check-only failed: error[check-only-missing]")


def test_two_engines_on_one_host_are_two_rows(fleet: dict[str, Path], tmp_path: Path) -> None:
    """Issue 39: node02's Docker holds the bundle; a check of an OCI layout on node02 that lacks it
    is another engine's row that fails, not a newer receipt that supersedes Docker's."""
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    before = json.loads((folder / "node02" / "node02.import.json").read_text())["created"]
    while now_utc() == before:  # the OCI check is the newer receipt of the host
        time.sleep(0.05)
    proc = on_host("node02", str(fleet["bundle"]), "--check-only", "--engine", "oci", "--oci-dir",
                   str(tmp_path / "empty.oci"), "--receipt", str(folder / "node02" / "node02.oci.json"), "-q")
    assert proc.returncode == 8, proc.stderr
    code, doc, table = report_and_table(str(folder))
    by_row = rows(doc)
    assert code == 12 and sorted(by_row) == [("node01", "docker"), ("node02", "docker"), ("node02", "oci")]
    docker, oci = by_row["node02", "docker"], by_row["node02", "oci"]
    assert docker["verdict"] == "pass" and docker["superseded"] == [] and docker["proof"]["kind"] == "import"
    assert oci["verdict"] == "fail" and oci["proof"]["errorId"] == "check-only-missing" and oci["row"] == "node02 (oci)"
    assert table_row(table, "node02", "docker")["VERDICT"] == "PASS"
    assert table_row(table, "node02", "oci")["VERDICT"] == "FAIL"
    assert any(line.startswith("node02 (oci): check-only failed: error[check-only-missing]")
               for line in table.splitlines())
    assert doc["counts"] == dict(doc["counts"], hosts=3, passed=2, failed=1)


# ============================== issue 39: what a qualification qualified, and against which bundle

H100 = "NVIDIA H100 80GB HBM3"


def _qualification(fleet: dict[str, Path], folder: Path, node: str, name: str, *, device: str = "cuda",
                   where: str = "image", gpus: int = 8, host_gpus: int = 8, **changes: Any) -> Path:
    """A qualification receipt of ``node`` made from the real CPU run's (node01.smoke): a passed
    run on ``device`` with ``gpus`` GPUs, in the Docker image the proof shows held (``where``
    image) or in this Python. No machine the tests run on has a GPU: these are the receipts such a
    run writes, as inputs (receipt fields are data the report checks, unless signed)."""
    doc = json.loads(fleet["node01.smoke"].read_text())
    check = json.loads(fleet["node01.check"].read_text())
    image = check["images"][0]
    doc["host"]["hostname"] = node
    doc["host"]["gpus"] = [{"index": n, "name": H100, "uuid": f"GPU-{n}", "memoryTotalBytes": 80 << 30,
                            "pciBusId": f"0000000{n}:18:00.0", "brand": "NVIDIA", "datacenter": True}
                           for n in range(host_gpus)]
    doc.update(verdict="pass", exitCode=0, ok=True, device=device, where=where,
               gpus={"count": gpus if device == "cuda" else 0, "models": [H100] if device == "cuda" and gpus else []})
    for gate in doc["gates"]:
        gate.update(status="PASS", error=None)
    if where == "image":
        doc["image"] = {"ref": image["refs"][0], "id": image["found"]["imageId"], "repoTags": image["refs"],
                        "repoDigests": [], "platform": "linux/amd64", "cudaVersion": "12.4", "requireCuda": None}
        doc["engine"] = {"kind": "docker", "address": check["engine"]["address"], "gpuAccess": "docker-gpus"}
    doc.update(changes)
    path = folder / node / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_a_gpu_run_in_the_bundles_image_passes_and_the_table_says_where(fleet: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    for host in ("node01", "node02"):
        _qualification(fleet, folder, host, f"{host}.smoke")
    code, doc, table = report_and_table(str(folder), "--require", "image,smoke", "--bundle", str(fleet["bundle"]))
    assert code == 0 and doc["verdict"] == "pass", doc
    pinned = json.loads((fleet["bundle"] / "bundle.json").read_text())
    assert doc["bundles"] == [{"digest": hosts(doc)["node01"]["bundleDigest"], "created": pinned["created"],
                               "path": str(fleet["bundle"]), "source": "bundle"}]
    for host in ("node01", "node02"):
        q = hosts(doc)[host]["qualifications"][0]
        assert q["device"] == "cuda" and q["where"] == "image" and q["gpuCount"] == 8 and q["gpuModels"] == [H100]
        assert q["qualifies"] is True and q["why"] is None and hosts(doc)[host]["notes"] == []
        cells = table_row(table, host, "docker")
        assert (cells["DEVICE"], cells["WHERE"], cells["VERDICT"]) == ("cuda:8", "image", "PASS")
    assert f"bundle {doc['bundles'][0]['digest']} (created {pinned['created']}" in table


def test_a_cpu_smoke_never_qualifies_a_gpu_host_silently(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    _qualification(fleet, folder, "node01", "node01.smoke")
    _qualification(fleet, folder, "node02", "node02.smoke", device="cpu")  # in the image, on the CPU
    code, doc, table = report_and_table(str(folder), "--require", "image,smoke", "--bundle", str(fleet["bundle"]))
    node02 = hosts(doc)["node02"]
    assert code == 12 and node02["verdict"] == "fail" and hosts(doc)["node01"]["verdict"] == "pass"
    assert node02["qualifications"][0]["qualifies"] is False
    assert "ran on the CPU (--device cpu), which qualifies no GPU (--allow-cpu accepts CPU runs)" \
        in node02["reasons"][0]
    assert table_row(table, "node02", "docker")["DEVICE"] == "cpu"
    assert table_row(table, "node02", "docker")["VERDICT"] == "FAIL"

    code, doc, table = report_and_table(str(folder), "--require", "image,smoke", "--bundle", str(fleet["bundle"]),
                                        "--allow-cpu")
    node02 = hosts(doc)["node02"]
    assert code == 0 and doc["allow"] == {"cpu": True, "hostPython": False}
    ref = node02["qualifications"][0]["image"]
    assert ref in REFS and node02["verdict"] == "pass" and node02["notes"] == [
        f"{ref}: qualified on the CPU (--allow-cpu) although the host has 8 GPU(s)"]
    assert f"node02: note: {ref}: qualified on the CPU (--allow-cpu) although the host has 8 GPU(s)" in table


def test_a_host_python_smoke_is_not_the_bundles_image(fleet: dict[str, Path], tmp_path: Path) -> None:
    """node01's real CPU run in this Python (--no-container) and a GPU run in this Python on node02."""
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import", "node01.smoke")
    _qualification(fleet, folder, "node02", "node02.smoke", where="host-python", image=None, engine=None)
    code, doc, table = report_and_table(str(folder), "--require", "image,smoke")
    node01, node02 = hosts(doc)["node01"], hosts(doc)["node02"]
    assert code == 12 and node01["verdict"] == "fail" and node02["verdict"] == "fail"
    real = node01["qualifications"][0]
    assert (real["device"], real["where"], real["gpuCount"], real["qualifies"]) == ("cpu", "host-python", 0, False)
    assert "ran on the CPU" in node01["reasons"][-1]
    assert "ran in this Python (--no-container), not in the bundle's image (--allow-host-python accepts such runs)" \
        in node02["reasons"][0]
    assert [table_row(table, h, "docker")["WHERE"] for h in ("node01", "node02")] == ["python", "python"]
    assert table_row(table, "node02", "docker")["DEVICE"] == "cuda:8"

    code, doc, table = report_and_table(str(folder), "--require", "image,smoke", "--allow-host-python")
    node01, node02 = hosts(doc)["node01"], hosts(doc)["node02"]
    assert node02["verdict"] == "pass" and node02["notes"] == [
        "(this Python, --no-container): qualified in this Python (--allow-host-python), not in the bundle's image"]
    assert node01["verdict"] == "fail"  # still on the CPU (and only a candidate)
    code, doc = report(str(folder), "--require", "image,smoke", "--allow-host-python", "--allow-cpu")
    assert hosts(doc)["node01"]["verdict"] == "candidate" and code == 12  # the real run skipped gates


def test_a_smoke_receipt_before_device_recording_does_not_qualify(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check")
    path = _qualification(fleet, folder, "node01", "node01.smoke", receiptVersion="1.0")
    old = json.loads(path.read_text())
    del old["where"], old["gpus"]
    path.write_text(json.dumps(old))
    code, doc, table = report_and_table(str(folder), "--require", "image,smoke", "--allow-cpu", "--allow-host-python")
    node01 = hosts(doc)["node01"]
    assert code == 12 and node01["verdict"] == "fail"
    assert "receipt predates device recording; re-run the smoke" in node01["reasons"][0]
    assert node01["qualifications"][0]["where"] is None and node01["qualifications"][0]["qualifies"] is False
    assert table_row(table, "node01", "docker")["DEVICE"] == "?"
    code, doc = report(str(folder))  # only the image required: the old smoke is shown, not judged
    assert code == 0


def test_receipts_of_another_or_an_older_bundle_are_stale(fleet: dict[str, Path], tmp_path: Path) -> None:
    """The rollout never ran: every node still has the receipts of the bundle before. With the
    bundle named, no host passes; node03 (another build) is stale, node04 missing."""
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import", "node03.import")
    for host in ("node01", "node02"):
        _qualification(fleet, folder, host, f"{host}.smoke")
    fresh = fleet_bundle(tmp_path / "new.bundle", seed=b"# this week's build\n")  # made after every receipt
    digest = hosts(report(str(folder))[1])["node01"]["bundleDigest"]
    code, doc, table = report_and_table(str(folder), "--require", "image,smoke", "--bundle", str(fresh),
                                        "--hosts", "node[01-04]")
    by_host = hosts(doc)
    assert code == 12 and [by_host[h]["verdict"] for h in sorted(by_host)] == ["stale", "stale", "fail", "missing"]
    assert doc["counts"]["stale"] == 2 and doc["counts"]["missing"] == 1 and doc["disagreements"] == []
    assert by_host["node03"]["reasons"][0].startswith("no receipt names bundle")  # and it never ran the smoke
    assert by_host["node03"]["reasons"][1] == "no qualification receipt (bundle-import smoke)"
    assert by_host["node01"]["reasons"][0].startswith("no receipt names bundle sha256:")
    assert "the rollout has not reached this host" in by_host["node01"]["reasons"][0]
    assert "no qualification ran an image of bundle" in by_host["node01"]["reasons"][1]
    assert table_row(table, "node01", "docker")["VERDICT"] == "STALE"
    assert "2 stale, 1 missing" in table.splitlines()[-1]

    # by digest: the fleet's bundle passes on node01 and node02; node03 holds another build
    code, doc = report(str(folder), "--require", "image,smoke", "--expect-digest", digest)
    by_host = hosts(doc)
    assert code == 12 and [by_host[h]["verdict"] for h in sorted(by_host)] == ["pass", "pass", "fail"]
    node03 = json.loads((folder / "node03" / "node03.import.json").read_text())
    assert by_host["node03"]["proof"] is None and by_host["node03"]["superseded"] == [
        str(folder / "node03" / "node03.import.json")]  # a receipt of another bundle does not count
    assert by_host["node03"]["reasons"][0] == (
        f"no receipt names bundle {digest}: the newest (import, {node03['created']}) names "
        f"{node03['bundle']['digest']}; the rollout has not reached this host")
    assert doc["bundles"] == [{"digest": digest, "created": None, "path": None, "source": "expect-digest"}]

    # receipts naming the bundle but written before it was (a clock, an edit): not newer than the bundle
    old = folder / "node01" / "node01.check.json"
    receipt = json.loads(old.read_text())
    receipt["created"] = "2000-01-01T00:00:00Z"
    old.write_text(json.dumps(receipt))
    smoke = folder / "node02" / "node02.smoke.json"
    receipt = json.loads(smoke.read_text())
    receipt["created"] = "2000-01-01T00:00:00Z"
    smoke.write_text(json.dumps(receipt))
    code, doc = report(str(folder / "node01"), str(folder / "node02"), "--require", "image,smoke",
                       "--bundle", str(fleet["bundle"]))
    by_host = hosts(doc)
    assert code == 12 and by_host["node01"]["verdict"] == "stale" and by_host["node02"]["verdict"] == "stale"
    assert "are older than the bundle (created " in by_host["node01"]["reasons"][0]
    assert by_host["node02"]["reasons"] == [
        f"its qualifications of bundle {digest} are older than the bundle (created "
        f"{json.loads((fleet['bundle'] / 'bundle.json').read_text())['created']}): re-run the smoke"]
    code, doc = report(str(folder / "node01"), str(folder / "node02"), "--require", "image,smoke",
                       "--expect-digest", digest)  # by digest no time is judged
    assert code == 0, doc


def test_bad_bundle_digest_and_receipt_inputs_are_one_line(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check")
    for argv, error_id, code in (([ "--bundle", str(tmp_path / "nowhere")], "bundle-not-found", 2),
                                 (["--expect-digest", "sha256:ABC"], "usage", 2),
                                 (["--expect-digest", "md5:" + "0" * 32], "usage", 2)):
        proc = run_cli("importer", "fleet-report", str(folder), *argv)
        assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"error[{error_id}]: "), proc.stderr
        proc = run_cli("importer", "fleet-report", str(folder), *argv, "--json")
        assert proc.returncode == code and json.loads(proc.stdout)["error"]["id"] == error_id
        validate("fleet-report", json.loads(proc.stdout))
    nodate = tmp_path / "nodate.bundle"
    shutil.copytree(fleet["bundle"], nodate)
    pinned = json.loads((nodate / "bundle.json").read_text())
    pinned["created"] = "last tuesday"
    (nodate / "bundle.json").write_text(json.dumps(pinned))
    proc = run_cli("importer", "fleet-report", str(folder), "--bundle", str(nodate))
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert "expected bundle.json's created as an RFC 3339 time" in proc.stderr
    assert "--expect-digest sha256:" in proc.stderr

    # receipts with every new field of the wrong type, NaN and a negative bandwidth, one too big
    bad: list[dict[str, Any]] = [{"device": 5, "where": ["image"], "gpus": "eight"},
                                 {"where": "docker", "gpus": {"count": -1, "models": "H100"}},
                                 {"gpus": {"count": True, "models": [1, None]}, "verdict": {"x": 1}},
                                 {"image": "not an object", "bundle": {"digest": 7}, "host": {"hostname": "node01",
                                                                                               "gpus": "many"}}]
    for n, changes in enumerate(bad):
        path = _qualification(fleet, folder, "node01", f"bad{n}", **changes)
        doc = json.loads(path.read_text())
        if isinstance(doc["image"], dict):
            doc["image"]["ref"] = f"bad/{n}:1"  # one qualification per image counts: each its own
        path.write_text(json.dumps(doc))
    weird = json.loads((folder / "node01" / "bad0.json").read_text())
    weird["image"] = {"ref": "other:1", "id": 12}
    weird["gates"][6]["metrics"] = {"sizes": [{"bytes": 8, "busbwGBps": float("nan")},
                                              {"bytes": 16, "busbwGBps": -3.0}]}
    (folder / "node01" / "bad0.json").write_text(json.dumps(weird))
    with open(folder / "huge.json", "wb") as f:
        f.truncate(33 * 1024 * 1024)
    code, doc = report(str(folder), "--require", "image,smoke")
    node01 = hosts(doc)["node01"]
    assert code == 12 and node01["verdict"] == "fail"
    assert [p["id"] for p in doc["problems"]] == ["not-a-receipt"] and "larger than" in doc["problems"][0]["message"]
    assert all(q["qualifies"] is False for q in node01["qualifications"])
    bad0 = next(q for q in node01["qualifications"] if q["path"].endswith("bad0.json"))
    assert bad0["busbwGBps"] is None and bad0["imageId"] is None and bad0["device"] is None  # NaN, -3, 12, 5
    assert any("in a form bundle-import smoke does not write" in q["why"] for q in node01["qualifications"])


def test_a_long_reason_is_printed_whole(fleet: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(fleet, tmp_path, "node01.check")
    path = folder / "node01" / "node01.check.json"
    receipt = json.loads(path.read_text())
    receipt.update(result="fail", ok=False, error={"id": "check-only-missing", "message": "m" * 3000 + " end"})
    path.write_text(json.dumps(receipt))
    code, _, table = report_and_table(str(folder))
    assert code == 12 and ("m" * 3000 + " end") in table


def test_signed_receipts_pass_and_unsigned_changed_or_foreign_ones_fail(fleet: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    keys = fleet["root"] / "keys"
    folder = _copy(fleet, tmp_path, "node01.check", "node02.import")
    node01, node02 = folder / "node01" / "node01.check.json", folder / "node02" / "node02.import.json"
    code, doc = report(str(folder), "--trust", str(keys / "site.pub"))
    assert code == 12 and all("signature unsigned" in h["reasons"][0] for h in doc["hosts"])

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
    assert code == 12 and {h["proof"]["signature"]["status"] for h in doc["hosts"]} == {"untrusted-key"}

    text = node02.read_text()
    node02.write_text(text.replace('"result": "pass"', '"result":  "pass"', 1))  # one byte more, same meaning
    code, doc = report(str(folder), "--trust", str(keys / "site.pub"))
    assert code == 12 and hosts(doc)["node01"]["verdict"] == "pass"
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
    assert code == 12 and hosts(doc)["node01"]["verdict"] == "pass"
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
