"""docs/errors.md lists every error id with its exit code, and every verification problem id."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Type

import pytest

import bundle
import importer
from importer.errors import BundleError

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")


def _subclasses(cls: Type[BundleError]) -> Iterator[Type[BundleError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _error_classes() -> List[Type[BundleError]]:
    for pkg in (importer, bundle):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not mod.name.endswith("__main__"):
                importlib.import_module(mod.name)
    return [BundleError, *_subclasses(BundleError)]


def _doc_rows() -> Dict[str, List[str]]:
    """First cell (the id, in backticks) -> the row's cells, for every table row of the doc."""
    rows: Dict[str, List[str]] = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([a-z0-9-]+)`", cells[0]) if line.startswith("|") else None
        if m:
            rows.setdefault(m.group(1), cells)
    return rows


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.reference)
def test_every_error_id_is_documented_with_its_exit_code(cls: Type[BundleError]) -> None:
    row = _doc_rows().get(cls.reference)
    assert row is not None, f"docs/errors.md: add a row for `{cls.reference}` ({cls.__module__}.{cls.__name__})"
    assert row[1] == str(cls.exit_code), f"docs/errors.md: `{cls.reference}` exits {cls.exit_code}, not {row[1]}"


def _problem_ids() -> Set[str]:
    """Problem ids written as literals in importer/ (Problem("id", ...), PartIssue("id", ...))."""
    found: Set[str] = set()
    for path in (REPO / "importer").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found |= set(re.findall(r'\b(?:Problem|PartIssue)\(\s*"([a-z0-9-]+)"', text))
    return found


def test_every_problem_id_is_documented() -> None:
    section = DOC.split("## Verification problems", 1)[1]
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M))
    missing = sorted(_problem_ids() - documented)
    assert not missing, f"docs/errors.md, Verification problems: add {missing}"


def test_every_exit_code_is_documented() -> None:
    section = DOC.split("## Exit codes", 1)[1].split("##", 1)[0]
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", section, flags=re.M)}
    assert {0} | {cls.exit_code for cls in _error_classes()} <= documented
