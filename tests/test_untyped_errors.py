"""Every error the CLIs give is typed, and what they print from a bundle is escaped.

Inputs a review found to end in ``error[internal]``, a traceback or raw terminal output: an
unreadable bundle file (as a user the file permissions apply to), a folder nested 1,100 deep
inside a bundle folder, rich markup in ``created`` (``bundle inspect``), and escape sequences or
newlines in bundle fields and file names (both CLIs' human output; ``--json`` stays exact)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from importer.format.text import printable
from tests.kit import engines
from tests.kit.helpers import REPO, run_cli
from tests.kit.trustkit import error_id, regenerate_sums

# ESC sequences (clear screen, set the window title), BEL, a newline that would forge a line, a C1 CSI
HOSTILE = "x\x1b[2J\x1b]0;owned\x07\nforged: OK\x9b1m"
RAW = ("\x1b", "\x07", "\x9b", "\nforged")
ESCAPED = ("\\x1b[2J", "\\x07", "\\nforged: OK", "\\x9b1m")




def _cli(module: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return run_cli(module, *args, prefix=prefix, env={"NO_COLOR": "1"}, drop_env=("FORCE_COLOR", "TERM", "COLUMNS"),
                   timeout=300, cwd=REPO)


def _edit(bundle: Path, edit: dict[str, object]) -> None:
    doc = json.loads((bundle / "bundle.json").read_text())
    for dotted, value in edit.items():
        target = doc
        keys = dotted.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value  # type: ignore[index]
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(bundle)


def _assert_typed(proc: subprocess.CompletedProcess[str], exit_code: int, ident: str) -> None:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert error_id(proc.stderr) == ident, out
    assert proc.returncode == exit_code, out


def _assert_escaped(proc: subprocess.CompletedProcess[str]) -> None:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    for raw in RAW:
        assert raw not in out, f"raw {raw!r} printed:\n{out!r}"
    for shown in ESCAPED:
        assert shown in out, f"expected {shown!r} in:\n{out!r}"


# ============================================================================ unreadable files


def _without_file_permission_override(bundle: Path) -> tuple[str, ...]:
    """A command prefix under which file permissions apply: nothing when not root; as root,
    setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set (uid 0 then
    has only the owner's rights, like any user: a chmod 000 file cannot be opened)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        engines.unavailable("setpriv (util-linux) is needed to read files as root without CAP_DAC_OVERRIDE")
    prefix = (setpriv, "--bounding-set=-dac_override,-dac_read_search")
    probe = bundle.parent / "probe"
    probe.write_text("x")
    probe.chmod(0)
    ok = subprocess.run([*prefix, "cat", str(probe)], capture_output=True, check=False).returncode
    probe.unlink()
    if ok == 0:
        engines.unavailable("setpriv could not drop CAP_DAC_OVERRIDE here (no CAP_SETPCAP?)")
    return prefix


def _blob_path(bundle: Path) -> Path:
    digest = json.loads((bundle / "bundle.json").read_text())["images"][0]["config"]["digest"]
    return bundle / "blobs" / "sha256" / digest[7:]


@pytest.mark.parametrize("what", ["bundle.json", "SHA256SUMS", "blob", "blobs-folder"])
def test_unreadable_bundle_file_is_a_typed_error_naming_it(bundle: Path, what: str) -> None:
    prefix = _without_file_permission_override(bundle)
    target = {"bundle.json": bundle / "bundle.json", "SHA256SUMS": bundle / "SHA256SUMS",
              "blob": _blob_path(bundle), "blobs-folder": bundle / "blobs" / "sha256"}[what]
    target.chmod(0)
    try:
        proc = _cli("importer", str(bundle), "--verify-only", prefix=prefix)
    finally:
        target.chmod(0o755)
    # bundle.json: nothing can be judged without it; the others are collected as problems
    _assert_typed(proc, 3, "unreadable-file" if what == "bundle.json" else "verification-failed")
    rel = str(target.relative_to(bundle))
    assert rel in proc.stderr and "Permission denied" in proc.stderr, proc.stderr
    if what != "bundle.json":
        assert f"[unreadable-file] {rel}:" in proc.stderr, proc.stderr
    if what == "blobs-folder":  # the blobs in it are not "missing": the folder is named once
        assert "[missing-file]" not in proc.stderr, proc.stderr


def test_unreadable_bundle_json_is_a_typed_error_for_bundle_inspect(bundle: Path) -> None:
    prefix = _without_file_permission_override(bundle)
    (bundle / "bundle.json").chmod(0)
    try:
        proc = _cli("bundle", "inspect", str(bundle), prefix=prefix)
    finally:
        (bundle / "bundle.json").chmod(0o644)
    _assert_typed(proc, 3, "unreadable-file")
    assert "bundle.json" in proc.stderr and "Permission denied" in proc.stderr, proc.stderr


# ============================================================================ absurd depth


def test_folder_nested_1100_deep_is_limit_exceeded(bundle: Path) -> None:
    chain = [bundle / "blobs" / "d"]
    for _ in range(1099):
        chain.append(chain[-1] / "d")
    for folder in chain:  # os.makedirs recurses, one frame per level
        folder.mkdir()
    (chain[-1] / "f").write_text("x")
    try:
        proc = _cli("importer", str(bundle), "--verify-only")
    finally:
        (chain[-1] / "f").unlink()
        for folder in reversed(chain):  # so does shutil.rmtree
            folder.rmdir()
    _assert_typed(proc, 3, "limit-exceeded")
    assert "blobs/d/d/d" in proc.stderr and "deep" in proc.stderr, proc.stderr


# ============================================================================ rich markup


@pytest.mark.parametrize(("where", "markup"), [("created", "[/bold][red]x[/red] :thumbs_up:"),
                                               ("folder name", "[red]x[bold] :thumbs_up:")])
def test_rich_markup_from_a_bundle_is_printed_literally(bundle: Path, tmp_path: Path, where: str,
                                                        markup: str) -> None:
    if where == "created":
        _edit(bundle, {"created": markup})
    else:
        bundle = bundle.rename(tmp_path / markup)
    proc = _cli("bundle", "inspect", str(bundle))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert markup in proc.stdout, proc.stdout


# ============================================================================ escape sequences


@pytest.mark.parametrize("field", ["created", "tool.version"])
def test_bundle_inspect_escapes_control_characters_of_a_field(bundle: Path, field: str) -> None:
    _edit(bundle, {field: HOSTILE})
    proc = _cli("bundle", "inspect", str(bundle))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_escaped(proc)
    doc = json.loads(_cli("bundle", "inspect", str(bundle), "--json").stdout)  # JSON stays exact
    assert (doc["created"] if field == "created" else doc["toolVersion"]) == HOSTILE


def test_bundle_inspect_escapes_control_characters_of_the_folder_name(bundle: Path, tmp_path: Path) -> None:
    moved = bundle.rename(tmp_path / f"b{HOSTILE}")
    proc = _cli("bundle", "inspect", str(moved))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_escaped(proc)
    assert json.loads(_cli("bundle", "inspect", str(moved), "--json").stdout)["bundle"] == str(moved)


def test_importer_escapes_a_file_name_in_problem_lines(bundle: Path) -> None:
    (bundle / "blobs" / HOSTILE).write_text("not listed")
    proc = _cli("importer", str(bundle), "--verify-only")
    _assert_typed(proc, 3, "verification-failed")
    _assert_escaped(proc)
    assert "[unlisted-file] blobs/x\\x1b[2J" in proc.stderr, proc.stderr
    doc = json.loads(_cli("importer", str(bundle), "--verify-only", "--json").stdout)  # exact in JSON
    assert {p["path"] for p in doc["problems"]} == {f"blobs/{HOSTILE}"}


def test_importer_escapes_the_bundle_path_in_error_messages(tmp_path: Path) -> None:
    empty = tmp_path / f"b{HOSTILE}"
    empty.mkdir()
    proc = _cli("importer", str(empty), "--verify-only")
    _assert_typed(proc, 4, "invalid-manifest")
    _assert_escaped(proc)


@pytest.mark.parametrize("cli", ["importer", "bundle"])
def test_a_ref_with_control_characters_is_refused_and_shown_escaped(bundle: Path, cli: str) -> None:
    _edit(bundle, {"images.0.refs": [f"fake/base:{HOSTILE}"]})
    args = ("inspect", str(bundle)) if cli == "bundle" else (str(bundle), "--verify-only")
    proc = _cli(cli, *args)
    _assert_typed(proc, 4, "invalid-manifest")
    for raw in RAW:
        assert raw not in proc.stdout + proc.stderr, proc.stderr
    assert "\\x1b[2J" in proc.stderr, proc.stderr


def test_printable_escapes_exactly_the_control_characters() -> None:
    assert printable("app:1 ünïcode [b]") == "app:1 ünïcode [b]"
    assert printable("a\x00\t\r\n\x1b\x7f\x85\x9f\u2028\u202e") == \
        "a\\x00\\t\\r\\n\\x1b\\x7f\\x85\\x9f\\u2028\\u202e"
