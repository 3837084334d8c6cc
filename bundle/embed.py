"""Build ``bundle-import.pyz``: the stdlib importer as a reproducible zipapp."""

from __future__ import annotations

import io
import os
import shlex
import zipfile

import importer

_EPOCH = (1980, 1, 1, 0, 0, 0)


def first_run_check(pyz: str, digest: object) -> str:
    """The line that tells the user how to check the importer with stock tools before running any
    code from the medium (docs/security.md, "First run: check the importer before running it")."""
    hexdigest = str(digest).split(":", 1)[-1]
    return (f"importer: {pyz} is sha256 {hexdigest}; on the far side, before running it, check it with "
            f"`sha256sum {shlex.quote(pyz)}` (it must print that digest; note it now, apart from the medium) or "
            "verify the signed bundle.json by hand (docs/security.md, First run)")


def far_side_lines(pyz: str, target: str, options: str = "") -> str:
    """``import on the far side:`` and, on a line of its own, the command to paste (paths quoted for a
    shell), so that no terminal width or log wraps the label into it; ``options`` as written."""
    return f"import on the far side:\npython3 {shlex.quote(pyz)} {shlex.quote(target)} --verify{options}"


def build_pyz() -> bytes:
    """The zipapp bytes: same importer sources give the same bytes (and digest)."""
    pkg_dir = os.path.dirname(os.path.abspath(importer.__file__))
    files = []
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, os.path.dirname(pkg_dir)).replace(os.sep, "/")
                files.append((rel, full))
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)

        with open(os.path.join(pkg_dir, "__main__.py"), "rb") as f:  # importer/launch.py runs on any python3
            add("__main__.py", f.read())
        for rel, full in sorted(files):
            with open(full, "rb") as f:
                add(rel, f.read())
    return buf.getvalue()
