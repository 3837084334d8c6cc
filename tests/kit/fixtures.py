"""The kit's shared pytest fixtures (tests/conftest.py exposes them to every test): the pristine
bundles, made once per session, and a fresh copy of one for a test to damage. A test that needs
to change a bundle takes ``bundle`` or ``multi_bundle`` (its own copy), never ``pristine`` or
``pristine_multi`` itself."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit import engines
from tests.kit.bundlegen import (
    make_bundle,
    make_multiplatform_bundle,
    make_signed_bundle,
    make_signed_files_bundle,
    make_signed_multiplatform_bundle,
    make_signed_picked_bundle,
)
from tests.kit.engines import Registry
from tests.kit.layoutgen import write_layout


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine-free two-image bundle of bundlegen.make_bundle (zstd), made once; read only."""
    return make_bundle(tmp_path_factory.mktemp("pristine") / "b.bundle")


@pytest.fixture(scope="session")
def pristine_multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multi-platform (--all-platforms) bundle of bundlegen.make_multiplatform_bundle; read only."""
    return make_multiplatform_bundle(tmp_path_factory.mktemp("pristine-multi") / "multi.bundle")


@pytest.fixture(scope="session")
def pristine_signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A schema 3.5 bundle of bundlegen.make_signed_bundle (two images, each signed by the kit
    key, one with a ``cuda`` record and an SBOM referrer); read only. The key: bundlegen.kit_key."""
    return make_signed_bundle(tmp_path_factory.mktemp("pristine-signed") / "signed.bundle")


@pytest.fixture(scope="session")
def pristine_multi_signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bundlegen.make_signed_multiplatform_bundle: ``pristine_multi``'s image, its carried index
    and primary platform signed by the kit key, with a ``cuda`` record and an SBOM; read only."""
    return make_signed_multiplatform_bundle(tmp_path_factory.mktemp("pristine-multi-signed") / "multi.bundle")


@pytest.fixture(scope="session")
def pristine_files_signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bundlegen.make_signed_files_bundle (schema 3.7): a signed image and a file artifact signed
    by the kit key; read only."""
    return make_signed_files_bundle(tmp_path_factory.mktemp("pristine-files-signed") / "files.bundle")


@pytest.fixture(scope="session")
def pristine_picked_signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bundlegen.make_signed_picked_bundle: one platform of ``pristine_multi``'s image, with the
    signed index it was picked from (an ``index`` record) and a ``cuda`` record; read only."""
    return make_signed_picked_bundle(tmp_path_factory.mktemp("pristine-picked-signed") / "picked.bundle")


@pytest.fixture(scope="session")
def multi_facts(pristine_multi: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What ``pristine_multi``'s source layout held (layoutgen.write_layout's answer): the index's
    digest and bytes, and each platform's manifest, config and layer digests."""
    facts = write_layout(tmp_path_factory.mktemp("multi-facts") / "layout")
    carried = json.loads((pristine_multi / "bundle.json").read_text())["images"][0]["index"]["digest"]
    assert facts["index"] == carried, "layoutgen.write_layout no longer writes the same bytes each time"
    return facts


@pytest.fixture()
def bundle(pristine: Path, tmp_path: Path) -> Path:
    """This test's own copy of ``pristine``, to damage as it likes."""
    return Path(shutil.copytree(pristine, tmp_path / "b.bundle"))


@pytest.fixture()
def multi_bundle(pristine_multi: Path, tmp_path: Path) -> Path:
    """This test's own copy of ``pristine_multi``, to damage as it likes."""
    return Path(shutil.copytree(pristine_multi, tmp_path / "multi.bundle"))


#: the one user of ``auth_registry``: (name, password)
AUTH_USER = ("alice", "s3cret-pw")


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A private registry that wants a login (htpasswd, bcrypt: ``AUTH_USER``), configured through
    registry.sh; one per test module that imports it."""
    engines.require("docker-registry")
    htpasswd = engines.bcrypt_htpasswd(tmp_path_factory.mktemp("auth"), *AUTH_USER)
    with engines.private_registry(f"i5auth-{os.getpid()}", htpasswd=htpasswd) as reg:
        yield reg
