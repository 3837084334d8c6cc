#!/usr/bin/env python3
"""Regenerate the golden bundles of every schema version (tests/golden/bundles/v1, v2, v3).

They are made from the fake `docker save` stream of tests/kit/fakesave.py through the real
writers, so no engine is needed. Run only when a NEW schema version is added (write the new
version's folder); never regenerate an old version's folder: the point is that bundles made
by older releases keep importing. Usage: python3 tests/golden/make_golden_bundles.py [v1|v2|v3]
"""

from __future__ import annotations

import io
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bundle.blobstore import BlobStore  # noqa: E402
from bundle.exportloop import read_docker_save  # noqa: E402
from bundle.legacy_writer import write_legacy_bundle  # noqa: E402
from bundle.writer import write_bundle  # noqa: E402
from tests.kit.fakesave import docker_save, sample_images  # noqa: E402

OUT = REPO / "tests" / "golden" / "bundles"
CREATED = "2026-12-02T00:00:00Z"
SOURCE = {"kind": "golden", "note": "tests/golden/make_golden_bundles.py"}


def make(version: str) -> Path:
    dst = OUT / version
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    raw = docker_save(sample_images())
    if version == "v3":
        store = BlobStore(str(dst), fsync=False)
        images = read_docker_save(io.BytesIO(raw), store)
        write_bundle(str(dst), store, images, SOURCE, created=CREATED)
    else:
        with tempfile.NamedTemporaryFile(suffix=".tar") as f:
            f.write(raw)
            f.flush()
            refs = [i.tag for i in sample_images()]
            write_legacy_bundle(str(dst), ["cat", f.name], refs, int(version[1]), SOURCE)
    return dst


if __name__ == "__main__":
    for v in sys.argv[1:] or ["v1", "v2", "v3"]:
        print(make(v))
