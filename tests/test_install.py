"""The README's install block works as written on a host whose system Python is externally
managed (Debian 12, Ubuntu 24.04): run line by line in a clean copy of the checkout, with a real
``pip install`` of the dependencies (from PyPI, pip's cache reused), then the installed commands
answer ``--help``. One venv for the whole test, bounded in time."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.kit.helpers import REPO
from tests.test_docs_commands import commands_of

INSTALL_LINES = ["python3 -m venv .venv", ".venv/bin/python3 -m pip install .", ". .venv/bin/activate"]


def _checkout_copy(dest: Path) -> Path:
    """The tracked and new files of this checkout (what a fresh clone holds), nothing built."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
    return dest


def test_the_readme_install_block_is_the_one_this_test_runs() -> None:
    readme = [c.text for c in commands_of(REPO / "README.md")]
    at = readme.index(INSTALL_LINES[0])
    assert readme[at:at + len(INSTALL_LINES)] == INSTALL_LINES


@pytest.mark.engine
def test_the_readme_install_works_in_a_clean_venv(tmp_path: Path) -> None:
    clone = _checkout_copy(tmp_path / "sneakernet")
    script = " && ".join([*INSTALL_LINES, "bundle --help", "bundle export --help", "bundle-import --help",
                          "sneakernet-gpu-check --help", "command -v bundle"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith(str(clone / ".venv" / "bin" / "bundle"))
    assert "usage: bundle export" in proc.stdout
    docs = clone / ".venv" / "share" / "doc" / "sneakernet" / "docs"
    assert (docs / "errors.md").is_file() and (docs / "qualification.md").is_file()  # what --help names
    assert f"docs/*.md: {docs}" in proc.stdout  # --help says where they are, in the install
