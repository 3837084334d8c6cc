"""The bundle fuzzer, run by the test command with a fixed seed and a fixed number of cases, the same
cases every run however loaded the machine (``SNEAKERNET_FUZZ_SECONDS`` for a run of that many
seconds instead, ``SNEAKERNET_FUZZ_SEED`` for another seed; docs/security.md "Fuzzing" has the last
long run's counts). The cases are written to a tmpfs (/dev/shm) where there is one: on this ext4
disk, fsync and unlink made each case 2-3 times slower. Every mutated bundle must end in a
typed error or a pass, never ``internal``, never a hang; a bundle the importer accepts must
pass the independent reference check (tests/kit/fuzzkit.py); and a signed bundle that
``--require-signed`` admits must pass the policy oracle (every manifest of every image signed
by the key as its repository, or listed by a signed index)."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.fuzzkit import (
    MULTI_TARGETS,
    SIGNED_TARGETS,
    TARGETS,
    budget_seconds,
    policy_problems,
    reference_problems,
    run_case,
)


def test_the_reference_check_accepts_the_pristine_bundle(pristine: Path) -> None:
    assert reference_problems(pristine) == []


def test_the_reference_check_is_not_vacuous(pristine: Path, tmp_path: Path) -> None:
    from tests.kit.trustkit import regenerate_sums

    b = tmp_path / "b"
    shutil.copytree(pristine, b)
    (b / "index.json").write_text('{"schemaVersion": 2, "manifests": []}')
    regenerate_sums(b)  # SHA256SUMS agrees, bundle.json's pin does not
    assert reference_problems(b)


def test_the_reference_check_accepts_the_pristine_multiplatform_bundle(pristine_multi: Path) -> None:
    assert reference_problems(pristine_multi) == []


def test_the_reference_check_reads_the_carried_index(pristine_multi: Path, tmp_path: Path) -> None:
    from tests.kit.fuzzkit import replace_blob

    b = tmp_path / "b"
    shutil.copytree(pristine_multi, b)
    old = json.loads((b / "bundle.json").read_text())["images"][0]["index"]["digest"]
    index = json.loads((b / "blobs/sha256" / old[7:]).read_bytes())
    index["manifests"][0]["platform"], index["manifests"][1]["platform"] = \
        index["manifests"][1]["platform"], index["manifests"][0]["platform"]
    replace_blob(b, old, json.dumps(index).encode())
    assert reference_problems(b)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """Where the fuzz cases are written: a folder on /dev/shm (tmpfs) when it is writable, else tmp_path."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)):
        yield tmp_path
        return
    work = Path(tempfile.mkdtemp(prefix="sneakernet-fuzz-", dir=shm))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Cases per run: at least what the earlier time boxes (60 s, 20 s, 7 s each) reached on the loaded
# 2-core machine (987, 333, 70-111 cases); by 1,250 and 400 the importer's branch coverage on this
# seed (coverage.py) has stopped growing: 5,143 arcs, and 5,160 after 2,000 cases
SINGLE_CASES = 1250
MULTI_CASES = 400
SIGNED_CASES = 100


def test_fuzz_bundles_tars_and_parts(pristine: Path, scratch: Path) -> None:
    _fuzz(pristine, scratch, TARGETS, SINGLE_CASES)


def test_fuzz_the_carried_index_of_a_multiplatform_bundle(pristine_multi: Path, scratch: Path) -> None:
    """Issue 24 class 4: 0 accepted-bad among mutations of the carried index (and the other
    platforms' manifests and configs)."""
    _fuzz(pristine_multi, scratch, MULTI_TARGETS, MULTI_CASES)


# ============================================================ schema 3.5: cuda, artifacts, signatures (issue 38)


@pytest.fixture(params=["pristine_signed", "pristine_multi_signed", "pristine_picked_signed", "pristine_files_signed"])
def signed(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(request.param))


def _key(bundle: Path) -> Path:
    from tests.kit.bundlegen import kit_key

    return kit_key(bundle)[1]


def test_the_reference_check_and_the_policy_oracle_accept_the_signed_bundles(signed: Path) -> None:
    from importer.input.opened import open_bundle
    from importer.verify.cosign import images_signed

    doc = json.loads((signed / "bundle.json").read_text())
    assert doc["schemaVersion"] in ("3.5", "3.7") and any("cuda" in img for img in doc["images"])
    assert "signature" in {a["kind"] for img in doc["images"] for a in img["artifacts"]}
    assert reference_problems(signed) == []
    assert policy_problems(signed, [_key(signed)]) == []
    assert len(images_signed(open_bundle(str(signed)), [str(_key(signed))], None, quiet=True,
                             on_notice=lambda _: None)) == len(doc["images"]) + len(doc.get("artifacts", []))


def _drop_signatures(bundle: Path, keep: str) -> None:
    """Every signature but the one of ``keep`` (a digest) taken out of the bundle, its record,
    blobs and files entries (bundle.json and SHA256SUMS re-pinned): a bundle whose other
    manifests nobody signed. (The oracle weighs every signature the bundle holds, wherever it
    sits: a record dropped with its blobs left behind is still signed, as far as the key goes.)"""
    from tests.kit.trustkit import regenerate_sums

    doc = json.loads((bundle / "bundle.json").read_text())
    gone = set()
    for image in doc["images"]:
        gone |= {b["digest"] for a in image["artifacts"] if a["kind"] == "signature" and a["subject"] != keep
                 for b in (a["manifest"], *a["blobs"])}
        image["artifacts"] = [a for a in image["artifacts"] if a["kind"] != "signature" or a["subject"] == keep]
    gone -= {b["digest"] for image in doc["images"] for a in image["artifacts"] for b in (a["manifest"], *a["blobs"])}
    for digest in gone:
        (bundle / "blobs/sha256" / digest[7:]).unlink()
    doc["files"] = [f for f in doc["files"] if f["digest"] not in gone]
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)


def test_the_policy_oracle_is_not_vacuous(pristine_multi_signed: Path, tmp_path: Path) -> None:
    """Only the primary platform's signature left: the index and two platforms are signed by
    nothing. The oracle says so (and so does the importer); without the key, nothing is signed."""
    from importer.errors import BundleError
    from importer.input.opened import open_bundle
    from importer.verify.cosign import images_signed

    b = Path(shutil.copytree(pristine_multi_signed, tmp_path / "b"))
    image = json.loads((b / "bundle.json").read_text())["images"][0]
    _drop_signatures(b, image["manifest"]["digest"])
    assert reference_problems(b) == []
    problems = policy_problems(b, [_key(pristine_multi_signed)])
    assert len(problems) == 3 and image["index"]["digest"][:19] in "".join(problems), problems
    with pytest.raises(BundleError) as e:
        images_signed(open_bundle(str(b)), [str(_key(pristine_multi_signed))], None, quiet=True,
                      on_notice=lambda _: None)
    assert e.value.reference == "image-signature-invalid"
    from tests.kit.supplykit import ecdsa_key

    _, other = ecdsa_key(tmp_path, "other")
    assert len(policy_problems(pristine_multi_signed, [other])) == 4  # 3 platforms and the index


def test_the_fuzzer_catches_a_policy_that_admits_on_one_signature(pristine_multi_signed: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug (one verified signature covers every manifest, the rule before issue 38):
    a case the fuzzer runs with one platform signed is reported as accepted-bad."""
    from importer.verify import cosign
    from tests.kit import fuzzkit

    def any_signature_covers_all(image: object, proofs: dict, reads: object) -> dict:
        return {str(d): next(iter(proofs)) for d in cosign.needed_manifests(image)} if proofs else {}  # type: ignore[arg-type]

    b = Path(shutil.copytree(pristine_multi_signed, tmp_path / "planted" / "multi.bundle"))
    shutil.copy(pristine_multi_signed.parent / "cosign.pub", b.parent)
    shutil.copy(pristine_multi_signed.parent / "cosign.key", b.parent)
    _drop_signatures(b, json.loads((b / "bundle.json").read_text())["images"][0]["manifest"]["digest"])
    ok = run_case(b, tmp_path / "case", random.Random(1), "cuda")
    assert not ok.admitted and ok.policy_code == 7 and not ok.defects
    monkeypatch.setattr(cosign, "_coverage", any_signature_covers_all)
    outcomes = [run_case(b, tmp_path / "case", random.Random(seed), "cuda") for seed in range(8)]
    admitted = [o for o in outcomes if o.admitted]  # a cuda mutation leaves the signatures as they are
    assert admitted and all(any("policy oracle refuses" in d for d in o.defects) for o in admitted), outcomes
    assert fuzzkit.policy_problems(b, [b.parent / "cosign.pub"])


def test_fuzz_the_cuda_and_artifacts_records_and_the_signatures(signed: Path, scratch: Path) -> None:
    """Issue 38: bundle.json's ``cuda`` and ``artifacts`` records, the signature manifests and
    payloads (re-signed by the kit key or another, or a fresh statement the kit key signed),
    each case verified and run with ``--require-signed``: 0 accepted-bad (by the reference check
    or the policy oracle), never ``internal``."""
    _fuzz(signed, scratch, SIGNED_TARGETS, SIGNED_CASES)


def _fuzz(pristine: Path, tmp_path: Path, targets: tuple[str, ...], cases: int) -> None:
    """``cases`` cases, or with SNEAKERNET_FUZZ_SECONDS set, as many as that many seconds allow."""
    seed = int(os.environ.get("SNEAKERNET_FUZZ_SEED", "20261203"))
    rnd = random.Random(seed)
    timed = "SNEAKERNET_FUZZ_SECONDS" in os.environ
    deadline = time.monotonic() + budget_seconds(0)
    counts: collections.Counter[str] = collections.Counter()
    exits: collections.Counter[int] = collections.Counter()
    policy: collections.Counter[str] = collections.Counter()
    defects: list[str] = []
    n = 0
    while (time.monotonic() < deadline or n < len(targets)) if timed else n < cases:
        target = targets[n % len(targets)]
        case_rnd = random.Random(rnd.getrandbits(64))
        outcome = run_case(pristine, tmp_path / "case", case_rnd, target)
        counts[target] += 1
        exits[outcome.exit_code] += 1
        if outcome.policy_code is not None:
            policy["admitted" if outcome.admitted else f"refused {outcome.policy_code}"] += 1
        for defect in outcome.defects:
            defects.append(f"case {n} ({target}, {'re-pinned' if outcome.repinned else 'raw'}, seed {seed}): "
                           f"{defect} | {outcome.stderr.strip()[:300]}")
        n += 1
    print(f"fuzz: {n} cases, seed {seed}, per target {dict(counts)}, exit codes {dict(sorted(exits.items()))}"
          + (f", --require-signed {dict(sorted(policy.items()))}" if policy else ""))
    assert not defects, "\n".join(defects[:20])
    assert exits[0] < n, "every mutated bundle was accepted: the mutations changed nothing"


def test_index_entries_of_odd_types_beside_the_artifacts_are_typed_errors(pristine_signed: Path,
                                                                          tmp_path: Path) -> None:
    """Case 379 of the fixed-seed run: index.json entries whose ref.name or digest is a list
    (re-pinned) ended in error[internal] (unhashable type) in the artifacts' layout check."""
    import json
    import shutil

    from tests.kit.fuzzkit import repin_file
    from tests.kit.helpers import run_pyz

    for odd in ({"annotations": {"org.opencontainers.image.ref.name": ["a"]}}, {"digest": ["sha256:" + "0" * 64]}):
        b = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        shutil.copytree(pristine_signed, b)
        index = json.loads((b / "index.json").read_text())
        index["manifests"].append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                   "digest": "sha256:" + "1" * 64, "size": 2, **odd})
        (b / "index.json").write_text(json.dumps(index))
        repin_file(b, "index.json")
        proc = run_pyz(b, "--verify-only")
        assert proc.returncode in (3, 4) and "error[internal]" not in proc.stderr, proc.stderr


def test_the_fuzzer_catches_a_policy_that_ignores_the_files(pristine_files_signed: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: the oracle judges file artifacts too. The file artifact's signature taken out (its
    record, blobs and files entries): the importer refuses it and the oracle names it; with a
    planted bug (the rule before issue 42: images only), the case is reported as accepted-bad."""
    from importer.verify import cosign
    from tests.kit import fuzzkit
    from tests.kit.trustkit import regenerate_sums

    b = Path(shutil.copytree(pristine_files_signed, tmp_path / "planted" / "files.bundle"))
    for name in ("cosign.pub", "cosign.key"):
        shutil.copy(pristine_files_signed.parent / name, b.parent)
    doc = json.loads((b / "bundle.json").read_text())
    gone = {x["digest"] for s in doc["artifacts"][0].pop("signatures") for x in (s["manifest"], *s["blobs"])}
    for digest in gone:
        (b / "blobs/sha256" / digest[7:]).unlink()
    doc["files"] = [f for f in doc["files"] if f["digest"] not in gone]
    (b / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(b)
    assert reference_problems(b) == []
    assert [p[:13] for p in policy_problems(b, [_key(b)])] == ["artifacts[0]:"]
    ok = run_case(b, tmp_path / "case", random.Random(1), "cuda")
    assert not ok.admitted and ok.policy_code == 7 and not ok.defects
    real = cosign.check_bundle
    monkeypatch.setattr(cosign, "check_bundle", lambda m, keys, read, doing: real(
        dataclasses.replace(m, file_artifacts=()), keys, read, doing))
    outcomes = [run_case(b, tmp_path / "case", random.Random(seed), "cuda") for seed in range(4)]
    admitted = [o for o in outcomes if o.admitted]
    assert admitted and all(any("policy oracle refuses" in d for d in o.defects) for o in admitted), outcomes
    assert fuzzkit.policy_problems(b, [b.parent / "cosign.pub"])
