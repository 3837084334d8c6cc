"""The pyz on a python3 older than its 3.8 floor (issue 40: RHEL/Rocky 8 and Ubuntu 18.04 ship 3.6,
Debian 10 ships 3.7), with the real interpreters: it looks for a newer python3.N on PATH and
re-executes with it, saying so; with none (or only one that does not answer), one sentence that
says what it needs, what it found and how to install it; never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from importer.launch import REEXEC_ENV
from tests.kit.helpers import run_pyz
from tests.kit.trustkit import old_python


def _path_with(tmp_path: Path, links: dict[str, str]) -> str:
    """A PATH of one folder holding ``links`` (name -> target); ``target`` "broken" is a
    python3.N that answers nothing (a pyenv shim for a version not installed)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, target in links.items():
        if target == "broken":
            (folder / name).write_text("#!/bin/sh\necho 'pyenv: python3.9: command not found' >&2\nexit 127\n")
            (folder / name).chmod(0o755)
        else:
            (folder / name).symlink_to(target)
    return str(folder)


@pytest.mark.parametrize("minor", [6, 7])
def test_an_old_python_alone_gets_one_sentence(minor: int, pristine: Path, tmp_path: Path) -> None:
    old = old_python(minor)
    path = _path_with(tmp_path, {"python3": old, "python3.9": "broken"})
    proc = run_pyz(pristine, "--verify-only", python=old, env={"PATH": path})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"expected Python 3.8 or newer, found Python 3.{minor}." in lines[0]
    assert "dnf install python39" in lines[0] and "apt install python3.8" in lines[0]


@pytest.mark.parametrize("minor", [6, 7])
def test_an_old_python_runs_the_importer_with_a_newer_one(minor: int, pristine: Path, tmp_path: Path) -> None:
    """A newer python3.N on PATH (a shim that answers nothing is passed over) runs the same
    command line: the bundle verifies, and the user is told which interpreter ran it."""
    import sys

    old = old_python(minor)
    newer = f"python3.{sys.version_info.minor}"
    path = _path_with(tmp_path, {"python3": old, "python3.14": "broken", newer: sys.executable})
    proc = run_pyz(pristine, "--verify-only", "--json", python=old, env={"PATH": path})
    assert proc.returncode == 0, proc.stderr
    assert f"this python3 is 3.{minor}." in proc.stderr and f"running it with {path}/{newer}" in proc.stderr
    assert '"ok": true' in proc.stdout


def test_a_newer_python_that_comes_up_old_is_not_run_again(pristine: Path, tmp_path: Path) -> None:
    """The re-executed importer never re-executes again (a wrapper that starts an old python)."""
    old = old_python(6)
    path = _path_with(tmp_path, {"python3.11": old})  # a "3.11" that is 3.6: it answers 3.6, so never used
    proc = run_pyz(pristine, "--verify-only", python=old, env={"PATH": path, REEXEC_ENV: "1"})
    assert proc.returncode == 2 and "expected Python 3.8 or newer" in proc.stderr, proc.stderr
    assert os.environ.get(REEXEC_ENV) is None
