"""A new user's first hour (issue 26): what a command will refuse is refused before the work,
progress without a terminal tells the truth and ends with a done line, errors name the cause."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli
from tests.test_platforms import REF, two_platform_layout


def _layout(tmp_path: Path) -> str:
    two_platform_layout(tmp_path / "layout")
    return f"oci:{tmp_path / 'layout'}:{REF}"


# ============================== refuse before the work
def test_an_archive_that_will_be_refused_is_refused_before_exporting(tmp_path: Path) -> None:
    """``--archive FILE`` over an earlier archive (no --force) used to be refused only after the
    whole export; now before the first byte is read."""
    src = _layout(tmp_path)
    (tmp_path / "b.tar").write_bytes(b"an earlier archive")
    proc = run_cli("bundle", "export", src, "--archive", str(tmp_path / "b.tar"))
    assert proc.returncode == 2, proc.stderr
    assert f"packing into {tmp_path / 'b.tar'}: expected no earlier archive or parts there" in proc.stderr
    assert "export:" not in proc.stderr  # no progress: nothing was exported
    assert (tmp_path / "b.tar").read_bytes() == b"an earlier archive"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar", "layout"]
    folder = tmp_path / "folder.tar"
    folder.mkdir()
    proc = run_cli("bundle", "export", src, "-o", str(tmp_path / "b.bundle"), "--archive", str(folder))
    assert proc.returncode == 2 and "found a folder" in proc.stderr, proc.stderr
    assert "export:" not in proc.stderr and not (tmp_path / "b.bundle").exists()
