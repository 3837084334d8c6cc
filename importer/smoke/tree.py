"""The suite's files, copied out of this package (a folder or the bundle-import.pyz zipapp)
into a temporary folder that is mounted read-only into the container."""

from __future__ import annotations

import contextlib
import os
import pkgutil
import shutil
import tempfile
from typing import Iterator

from importer.errors import BundleError
from importer.smoke.worker import MODULES

#: Where the folder appears inside the container.
MOUNT_POINT = "/sneakernet-smoke"


def _read(package: str, name: str) -> bytes:
    data = pkgutil.get_data(package, name)
    if data is None:
        raise BundleError(f"copying the smoke suite: expected {package}/{name} in the importer, found nothing",
                          hint="this importer is incomplete; use the bundle-import.pyz of the bundle")
    return data


def write_tree(root: str) -> str:
    """Write importer/__init__.py, importer/smoke/__init__.py, importer/format/cudafit.py (and its
    package's __init__.py) and importer/smoke/worker/*.py
    under ``root`` (world-readable: the image may run as another user); return ``root``."""
    files = [("importer", "__init__.py", "importer/__init__.py"),
             ("importer.smoke", "__init__.py", "importer/smoke/__init__.py"),
             ("importer.format", "__init__.py", "importer/format/__init__.py"),  # the decision the
             ("importer.format", "cudafit.py", "importer/format/cudafit.py")]  # exporter makes too
    files += [("importer.smoke.worker", f"{m}.py", f"importer/smoke/worker/{m}.py") for m in MODULES]
    for package, name, rel in files:
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "wb") as f:
            f.write(_read(package, name))
        os.chmod(path, 0o644)
    for dirpath, _, _ in os.walk(root):
        os.chmod(dirpath, 0o755)  # noqa: S103 - the suite's own code, read by the image's user
    return root


@contextlib.contextmanager
def suite_tree() -> Iterator[str]:
    """A temporary folder holding the suite; removed afterwards."""
    root = tempfile.mkdtemp(prefix="sneakernet-smoke-")
    try:
        yield write_tree(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
