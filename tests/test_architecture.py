"""Structural rules: the importer is stdlib-only (it runs as a zipapp on offline hosts, Python
3.8+), and the format lives in importer/, which never imports the exporter."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMPORTER_FILES = sorted((REPO / "importer").rglob("*.py"))
# Optional accelerators imported lazily by name (importlib), never at module level.
NEWER_APIS = {"removeprefix", "removesuffix", "file_digest", "extraction_filter"}


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_importer_imports_only_the_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    allowed = set(sys.stdlib_module_names) | {"importer", "__future__"}
    bad = [(name, line) for name, line in _imports(tree) if name not in allowed]
    assert not bad, f"{path}: non-stdlib imports {bad}"


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_importer_parses_as_python_3_8(path: Path) -> None:
    src = path.read_text()
    tree = ast.parse(src, filename=str(path), feature_version=(3, 8))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & NEWER_APIS
    assert not used, f"{path}: uses APIs newer than Python 3.8: {used}"
    if any(isinstance(n, (ast.AnnAssign, ast.FunctionDef)) for n in ast.walk(tree)) and "->" in src:
        assert "from __future__ import annotations" in src, f"{path}: annotations need the __future__ import on 3.8"


def test_importer_never_imports_the_exporter() -> None:
    for path in IMPORTER_FILES:
        names = {name for name, _ in _imports(ast.parse(path.read_text()))}
        assert "bundle" not in names, path


def test_pyz_holds_only_the_importer(tmp_path: Path) -> None:
    import zipfile

    from bundle.embed import build_pyz

    data = build_pyz()
    assert data == build_pyz()  # reproducible: same sources, same digest
    (tmp_path / "x.pyz").write_bytes(data)
    names = zipfile.ZipFile(tmp_path / "x.pyz").namelist()
    assert "__main__.py" in names
    assert all(n == "__main__.py" or n.startswith("importer/") for n in names)
    assert "importer/cli.py" in names


def _python38() -> str:
    import shutil

    from tests import engines

    pyenv = sorted(Path.home().glob(".pyenv/versions/3.8*/bin/python3.8"))
    for candidate in [str(p) for p in pyenv] + [shutil.which("python3.8") or ""]:
        if candidate and Path(candidate).exists() and "shims" not in candidate:
            return candidate
    engines.unavailable("no Python 3.8 interpreter to run the importer's floor check")


def test_pyz_verifies_on_python_3_8_with_the_zstd_cli(tmp_path: Path) -> None:
    """Python 3.8 without the zstandard module: the importer falls back to the zstd command."""
    import subprocess

    from tests.bundlegen import make_bundle

    b = make_bundle(tmp_path / "b")
    proc = subprocess.run([_python38(), "-I", str(b / "bundle-import.pyz"), str(b), "--verify-only", "--json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert '"layersChecked": 3' in proc.stdout


def test_pyz_without_any_zstd_decoder_still_verifies(tmp_path: Path) -> None:
    """Python 3.8 alone (no zstandard module, no zstd command on PATH, no compression.zstd): a
    default (zstd) bundle verifies with the pure-Python decoder, which says so once on stderr."""
    import os
    import subprocess

    from tests.bundlegen import make_bundle

    b = make_bundle(tmp_path / "b")
    python = _python38()
    only_python = tmp_path / "bin"
    only_python.mkdir()
    (only_python / "python3").symlink_to(python)
    proc = subprocess.run(["python3", "-I", str(b / "bundle-import.pyz"), str(b), "--verify-only", "--json"],
                          capture_output=True, text=True, check=False,
                          env={"PATH": str(only_python), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert '"layersChecked": 3' in proc.stdout
    assert proc.stderr.count("pure-Python decoder") == 1, proc.stderr
    assert "error" not in proc.stderr
    assert not os.path.exists(only_python / "zstd")
