"""The kit's shared pytest fixtures (tests/conftest.py exposes them to every test): the pristine
bundles, made once per session, and a fresh copy of one for a test to damage. A test that needs
to change a bundle takes ``bundle`` (its own copy), never ``pristine`` itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.kit.bundlegen import make_bundle, make_multiplatform_bundle


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine-free two-image bundle of bundlegen.make_bundle (zstd), made once; read only."""
    return make_bundle(tmp_path_factory.mktemp("pristine") / "b.bundle")


@pytest.fixture(scope="session")
def pristine_multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multi-platform (--all-platforms) bundle of bundlegen.make_multiplatform_bundle; read only."""
    return make_multiplatform_bundle(tmp_path_factory.mktemp("pristine-multi") / "multi.bundle")


@pytest.fixture()
def bundle(pristine: Path, tmp_path: Path) -> Path:
    """This test's own copy of ``pristine``, to damage as it likes."""
    return Path(shutil.copytree(pristine, tmp_path / "b.bundle"))
