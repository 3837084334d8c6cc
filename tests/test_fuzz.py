"""The bundle fuzzer, run by the test command with a fixed seed and a budget of about a minute
(``SNEAKERNET_FUZZ_SECONDS`` for a longer run, ``SNEAKERNET_FUZZ_SEED`` for another seed;
docs/security.md "Fuzzing" has the last long run's counts). Every mutated bundle must end in a
typed error or a pass, never ``internal``, never a hang; and a bundle the importer accepts must
pass the independent reference check (tests/kit/fuzzkit.py)."""

from __future__ import annotations

import collections
import os
import random
import time
from pathlib import Path

from tests.kit.fuzzkit import MULTI_TARGETS, TARGETS, budget_seconds, reference_problems, run_case


def test_the_reference_check_accepts_the_pristine_bundle(pristine: Path) -> None:
    assert reference_problems(pristine) == []


def test_the_reference_check_is_not_vacuous(pristine: Path, tmp_path: Path) -> None:
    import shutil

    from tests.kit.trustkit import regenerate_sums

    b = tmp_path / "b"
    shutil.copytree(pristine, b)
    (b / "index.json").write_text('{"schemaVersion": 2, "manifests": []}')
    regenerate_sums(b)  # SHA256SUMS agrees, bundle.json's pin does not
    assert reference_problems(b)



def test_the_reference_check_accepts_the_pristine_multiplatform_bundle(pristine_multi: Path) -> None:
    assert reference_problems(pristine_multi) == []


def test_the_reference_check_reads_the_carried_index(pristine_multi: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from tests.kit.fuzzkit import replace_blob

    b = tmp_path / "b"
    shutil.copytree(pristine_multi, b)
    old = json.loads((b / "bundle.json").read_text())["images"][0]["index"]["digest"]
    index = json.loads((b / "blobs/sha256" / old[7:]).read_bytes())
    index["manifests"][0]["platform"], index["manifests"][1]["platform"] = \
        index["manifests"][1]["platform"], index["manifests"][0]["platform"]
    replace_blob(b, old, json.dumps(index).encode())
    assert reference_problems(b)


def test_fuzz_bundles_tars_and_parts(pristine: Path, tmp_path: Path) -> None:
    _fuzz(pristine, tmp_path, TARGETS, 60)


def test_fuzz_the_carried_index_of_a_multiplatform_bundle(pristine_multi: Path, tmp_path: Path) -> None:
    """Issue 24 class 4: 0 accepted-bad among mutations of the carried index (and the other
    platforms' manifests and configs)."""
    _fuzz(pristine_multi, tmp_path, MULTI_TARGETS, 20)


def _fuzz(pristine: Path, tmp_path: Path, targets: tuple[str, ...], seconds: float) -> None:
    seed = int(os.environ.get("SNEAKERNET_FUZZ_SEED", "20261203"))
    rnd = random.Random(seed)
    deadline = time.monotonic() + budget_seconds(seconds)
    counts: collections.Counter[str] = collections.Counter()
    exits: collections.Counter[int] = collections.Counter()
    defects: list[str] = []
    n = 0
    while time.monotonic() < deadline or n < len(targets):
        target = targets[n % len(targets)]
        case_rnd = random.Random(rnd.getrandbits(64))
        outcome = run_case(pristine, tmp_path / "case", case_rnd, target)
        counts[target] += 1
        exits[outcome.exit_code] += 1
        for defect in outcome.defects:
            defects.append(f"case {n} ({target}, {'re-pinned' if outcome.repinned else 'raw'}, seed {seed}): "
                           f"{defect} | {outcome.stderr.strip()[:300]}")
        n += 1
    print(f"fuzz: {n} cases, seed {seed}, per target {dict(counts)}, exit codes {dict(sorted(exits.items()))}")
    assert not defects, "\n".join(defects[:20])
    assert exits[0] < n, "every mutated bundle was accepted: the mutations changed nothing"
