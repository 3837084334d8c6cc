"""The first hour with the CLIs (issue 16): discoverable commands and exit codes, receipts that
never turn a successful import into a failure, outputs that never destroy what is not a bundle.

Engine-free: bundles from tests/kit/bundlegen.py, imported into an OCI layout (``--engine oci``)."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from tests.kit.helpers import REPO, run_cli, start_cli


def error_id(stderr: str) -> str:
    m = re.search(r"^error\[([a-z0-9-]+)\]", stderr, flags=re.M)
    return m.group(1) if m else ""


# ============================== 7. discoverability
def test_help_lists_the_subcommands_and_every_exit_code_the_importer_gives() -> None:
    out = run_cli("importer", "--help", check=True).stdout
    assert "bundle-import smoke [IMAGE]" in out and "bundle-import copy SRC DST" in out
    doc = (REPO / "docs" / "errors.md").read_text(encoding="utf-8").split("## Exit codes", 1)[1].split("##", 1)[0]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", doc, flags=re.M)} - {5}  # 5: the exporter's source
    epilog = out.split("exit codes", 1)[1]
    shown = {int(c) for c in re.findall(r"(?:^|\s)(\d+) [a-z-]", epilog)}
    assert codes <= shown, f"--help leaves out exit codes {sorted(codes - shown)}"


def test_smoke_help_names_the_candidate_code() -> None:
    out = run_cli("importer", "smoke", "--help", check=True).stdout
    assert "10 a required gate skipped" in out and "2 configuration error" in out


def test_smoke_with_an_engine_that_cannot_run_containers_is_refused_before_importing(bundle: Path,
                                                                                   tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    proc = run_cli("importer", str(bundle), "--engine", "oci", "--oci-dir", str(layout), "--smoke",
                   "--receipt", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and error_id(proc.stderr) == "smoke-config", proc.stderr
    assert "nothing was imported" in proc.stderr
    assert not layout.exists() and not (tmp_path / "r.json").exists()


def test_bundle_json_given_as_bundle_is_read_as_its_folder(bundle: Path) -> None:
    proc = run_cli("importer", str(bundle / "bundle.json"), "--verify-only", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    info = json.loads(run_cli("bundle", "inspect", str(bundle / "bundle.json"), "--json", check=True).stdout)
    assert info["bundle"] == str(bundle)


def test_a_layout_folder_without_oci_prefix_says_what_was_meant(bundle: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    run_cli("importer", str(bundle), "--engine", "oci", "--oci-dir", str(layout), "--no-receipt", check=True)
    proc = run_cli("bundle", "export", str(layout), "-o", str(tmp_path / "out"),
                   docker_host="unix:///nonexistent/docker.sock")
    assert proc.returncode == 2 and error_id(proc.stderr) == "usage", proc.stderr
    assert f"oci:{layout}" in proc.stderr and "Docker" not in proc.stderr.split("hint:")[1]
    assert "connecting" not in proc.stderr and not (tmp_path / "out").exists()
    ok = run_cli("bundle", "export", f"oci:{layout}:fake/app:2", "-o", str(tmp_path / "out"), "-q")
    assert ok.returncode == 0, ok.stderr


def test_a_typo_is_a_usage_error_that_probes_no_engine_and_writes_nothing(tmp_path: Path) -> None:
    proc = run_cli_in(tmp_path, "help", "--docker-host", "unix:///nonexistent/docker.sock")
    assert proc.returncode == 2 and error_id(proc.stderr) == "bundle-not-found", proc.stderr
    assert "engine" not in proc.stderr and "Docker" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def run_cli_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m importer ARGS`` run from ``cwd`` (where a receipt used to land)."""
    return run_cli("importer", *args, cwd=cwd, env={"XDG_STATE_HOME": str(cwd / "state")}, timeout=300)


# ============================== 3. receipts
def _import(cwd: Path, bundle: Path, layout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli_in(cwd, str(bundle), "--engine", "oci", "--oci-dir", str(layout), *args)


def test_a_receipt_in_a_missing_folder_gets_its_folder(bundle: Path, tmp_path: Path) -> None:
    """docs/fleet.md's per-node ``receipts/$(hostname)/check.json`` works as written: the folder is
    made as ``mkdir -p`` would (it used to be refused)."""
    layout = tmp_path / "layout"
    receipt = tmp_path / "receipts" / "node-1" / "x.json"
    proc = _import(tmp_path, bundle, layout, "--receipt", str(receipt), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(receipt.read_text())["result"] == "pass"


def test_a_receipt_folder_that_cannot_be_made_is_refused_before_importing(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    layout = tmp_path / "layout"
    proc = _import(tmp_path, bundle, layout, "--receipt", str(tmp_path / "afile" / "sub" / "x.json"), "--json")
    assert proc.returncode == 2 and error_id(proc.stderr) == "receipt-unwritable", proc.stderr
    assert f"{tmp_path / 'afile' / 'sub'} cannot be made" in proc.stderr
    assert "nothing was done" in proc.stderr and not layout.exists()  # nothing imported


def test_an_unusable_state_folder_falls_back_to_the_temp_dir_with_a_note(bundle: Path, tmp_path: Path) -> None:
    """A home that cannot hold the receipts folder (read-only, or a file in the way: the same for
    root) costs a note, never the import's success."""
    (tmp_path / "state").write_text("a file where the state folder would be")
    proc = _import(tmp_path, bundle, tmp_path / "layout")
    assert proc.returncode == 0, proc.stderr
    assert "receipts cannot go to" in proc.stderr and "sneakernet-receipts-" in proc.stderr
    path = re.search(r"^receipt: (.+)$", proc.stderr, flags=re.M)
    assert path and "sneakernet-receipts-" in path.group(1)
    assert json.loads(Path(path.group(1)).read_text())["result"] == "pass"
    Path(path.group(1)).unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bundle", "layout", "state"]


@pytest.mark.parametrize("where", ["afile/sub/x.json", "folder", "afile/x.json"])
def test_every_unwritable_receipt_path_is_refused_before_importing(where: str, bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("")
    layout = tmp_path / "layout"
    proc = _import(tmp_path, bundle, layout, "--receipt", str(tmp_path / where))
    assert proc.returncode == 2 and error_id(proc.stderr) == "receipt-unwritable", proc.stderr
    assert not layout.exists()


def test_default_receipt_goes_to_the_state_folder(bundle: Path, tmp_path: Path) -> None:
    proc = _import(tmp_path, bundle, tmp_path / "layout")
    assert proc.returncode == 0, proc.stderr
    (receipt,) = (tmp_path / "state" / "sneakernet" / "receipts").glob("b.bundle-*Z.import-receipt.json")
    assert f"receipt: {receipt}" in proc.stderr and json.loads(receipt.read_text())["result"] == "pass"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bundle", "layout", "state"]


def test_a_run_refused_for_its_arguments_writes_no_receipt(bundle: Path, tmp_path: Path) -> None:
    proc = _import(tmp_path, bundle, tmp_path / "layout", "--smoke")
    assert proc.returncode == 2, proc.stderr
    assert [p for p in tmp_path.rglob("*.json") if "b.bundle" not in p.parts] == []
    assert "receipt:" not in proc.stderr


def test_smoke_with_a_bad_receipt_path_is_refused_before_the_suite_runs(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    proc = run_cli_in(tmp_path, "smoke", "--no-container", "--device", "cpu", "--gates", "shutdown",
                      "--receipt", str(tmp_path / "afile" / "q.json"), "--json")
    assert proc.returncode == 2 and error_id(proc.stderr) == "receipt-unwritable", proc.stderr
    assert "Traceback" not in proc.stderr and "smoke:" not in proc.stderr  # the suite never started


def test_smoke_after_import_with_a_bad_receipt_path_imports_nothing(bundle: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    (tmp_path / "afile").write_text("")
    proc = _import(tmp_path, bundle, layout, "--smoke", "--no-container", "--device", "cpu",
                   "--smoke-receipt", str(tmp_path / "afile" / "q.json"))
    assert proc.returncode == 2 and error_id(proc.stderr) == "receipt-unwritable", proc.stderr
    assert "--smoke-receipt" in proc.stderr and not layout.exists()


# ============================== 4. outputs that are not bundles are never replaced
@pytest.fixture()
def layout(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "layout"
    run_cli("importer", str(bundle), "--engine", "oci", "--oci-dir", str(out), "--no-receipt", check=True)
    return out


def _export(layout: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bundle", "export", f"oci:{layout}:fake/app:2", "-o", str(out), "-q", *args)


def test_export_force_refuses_a_folder_of_other_files(layout: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "thesis.tex").write_text("years of work")
    proc = _export(layout, data, "--force")
    assert proc.returncode == 2 and error_id(proc.stderr) == "destination-in-use", proc.stderr
    assert "thesis.tex" in proc.stderr and (data / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in data.iterdir()) == ["sub", "thesis.tex"]
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


def test_export_force_refuses_a_file(layout: Path, tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("keep")
    proc = _export(layout, tmp_path / "notes", "--force")
    assert proc.returncode == 2 and error_id(proc.stderr) == "destination-in-use", proc.stderr
    assert (tmp_path / "notes").read_text() == "keep"


def test_export_force_replaces_a_bundle_and_fills_an_empty_folder(layout: Path, bundle: Path, tmp_path: Path) -> None:
    before = json.loads((bundle / "bundle.json").read_text())
    assert len(before["images"]) == 2
    proc = _export(layout, bundle, "--force")
    assert proc.returncode == 0, proc.stderr
    assert [i["refs"] for i in json.loads((bundle / "bundle.json").read_text())["images"]] == [["fake/app:2"]]
    (tmp_path / "empty").mkdir()
    assert _export(layout, tmp_path / "empty").returncode == 0
    assert (tmp_path / "empty" / "bundle.json").is_file()


def test_copy_refuses_a_non_bundle_destination_and_leaves_it_untouched(bundle: Path, layout: Path,
                                                                      tmp_path: Path) -> None:
    """An OCI layout has index.json, oci-layout and blobs/ like a bundle: merging overwrote its index."""
    index = (layout / "index.json").read_bytes()
    for cli in ("bundle", "importer"):
        proc = run_cli(cli, "copy", str(bundle), str(layout), "-q")
        assert proc.returncode == 2 and error_id(proc.stderr) == "destination-in-use", proc.stderr
        assert (layout / "index.json").read_bytes() == index
        assert not list(layout.rglob("*.partial")) and not (layout / "bundle.json").exists()
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("mine")
    proc = run_cli("bundle", "copy", str(bundle), str(data), "-q")
    assert proc.returncode == 2 and "x.txt" in proc.stderr, proc.stderr
    assert [p.name for p in data.iterdir()] == ["x.txt"]


def test_copy_refuses_another_bundle_at_dst(bundle: Path, layout: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert _export(layout, other).returncode == 0
    proc = run_cli("bundle", "copy", str(bundle), str(other), "-q")
    assert proc.returncode == 2 and error_id(proc.stderr) == "destination-in-use", proc.stderr


def test_copy_resumes_into_a_partial_copy_of_the_same_bundle(bundle: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    run_cli("bundle", "copy", str(bundle), str(dst), "-q", check=True)
    biggest = max((p for p in (dst / "blobs" / "sha256").iterdir()), key=lambda p: p.stat().st_size)
    data = biggest.read_bytes()
    biggest.unlink()
    Path(str(biggest) + ".partial").write_bytes(data[: len(data) // 2])
    (dst / "bundle.json").unlink()  # written last: an interrupted copy has none
    proc = run_cli("importer", "copy", str(bundle), str(dst), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["resumed"] == [f"blobs/sha256/{biggest.name}"] and "bundle.json" in doc["copied"]
    again = run_cli("bundle", "copy", str(bundle), str(dst), "--json")  # a whole copy: all skipped
    assert again.returncode == 0 and json.loads(again.stdout)["copied"] == [], again.stderr


# ============================== 5. progress: honest totals, lines without a terminal, --quiet
def test_progress_lines_without_a_terminal_and_quiet_silences_them(bundle: Path, tmp_path: Path) -> None:
    """stderr here is a pipe (as under cron, ssh, CI): a plain line, bytes of the right total."""
    size = sum(f["size"] for f in json.loads((bundle / "bundle.json").read_text())["files"])
    proc = run_cli("importer", str(bundle), "--verify-only")
    line = re.search(r"^verify: (.+) / (.+?) \(\d+%\) .+/s", proc.stderr, flags=re.M)
    assert proc.returncode == 0 and line, proc.stderr
    assert line.group(2) == f"{size / 1024:.1f} KiB"  # every file bundle.json lists, layers included
    assert "verify:" not in run_cli("importer", str(bundle), "--verify-only", "-q").stderr
    proc = run_cli("bundle", "copy", str(bundle), str(tmp_path / "c"))
    assert proc.returncode == 0 and re.search(r"^copy: .+ / .+ KiB", proc.stderr, flags=re.M), proc.stderr
    proc = run_cli("bundle", "copy", str(bundle), str(tmp_path / "d"), "--quiet")
    assert proc.returncode == 0 and "copy:" not in proc.stderr


def test_progress_totals_match_the_bytes_reported(bundle: Path, tmp_path: Path) -> None:
    from bundle.archive import pack_bundle
    from importer.input.opened import open_bundle
    from importer.pipeline.plan import IMPORT, ImportPlan
    from importer.pipeline.walk import result_for, run_import
    from importer.sinks.oci_layout import OciLayoutSink
    from importer.streams.progress import PLAIN_INTERVAL, StderrProgress
    from importer.transfer.copy import copy_bundle
    from importer.verify.opened import verify_or_raise

    seen: list[list[object]] = []

    def factory(label: str, total: int) -> Callable[[int], None]:
        entry: list[object] = [label, total, 0]
        seen.append(entry)

        def add(n: int) -> None:
            entry[2] = int(entry[2]) + n  # type: ignore[call-overload]
        return add

    verify_or_raise(open_bundle(str(bundle)), progress=factory)
    pack_bundle(str(bundle), str(tmp_path / "p.tar"), split=64 * 1024, progress=factory)
    copy_bundle(str(tmp_path / "p.tar.parts.json"), str(tmp_path / "c"), progress=factory)
    plan = ImportPlan(mode=IMPORT, bundle=str(bundle), quiet=True)
    run_import(plan, OciLayoutSink(str(tmp_path / "layout")), result_for(plan), progress=factory)
    labels = [e[0] for e in seen]
    assert labels == ["pack", "copy", "verify", "load"] or set(labels) >= {"verify", "pack", "copy", "load"}
    for label, total, done in seen:
        assert total and done == total, (label, total, done)  # load: the OCI layout counts stored blobs

    stream = io.StringIO()  # not a terminal: a line every few seconds, never silence
    bar = StderrProgress("verify", 1000, stream=stream)
    assert bar.enabled and bar.interval == PLAIN_INTERVAL
    bar(400)  # a first chunk: no rate measured yet, so no ETA (issue 40)
    assert re.fullmatch(r"verify: 400 B / 1000 B \(40%\) [\d.]+ \S+/s\n", stream.getvalue())


# ============================== issue 40, 5: honest output everywhere
def test_the_first_eta_waits_for_a_measured_rate_on_and_off_a_terminal() -> None:
    """A rate from the first chunk (a buffer read in a millisecond) made ETAs of 0s or days: no ETA
    before 2 s and 1 MiB, in the plain lines and rich's bar alike, and both in binary units."""
    from rich.progress import Progress

    from bundle.progressui import _Numbers
    from importer.streams.progress import StderrProgress

    bar = StderrProgress("push", 100 << 20, stream=io.StringIO(), interval=0)
    bar(4 << 20)
    start = bar._start
    assert "ETA" not in bar.line(start + 0.001) and "ETA" not in bar.line(start + 1.9)
    assert bar.line(start + 4).endswith("4.0 MiB / 100.0 MiB (4%) 1.0 MiB/s ETA 1m36s"), bar.line(start + 4)
    small = StderrProgress("load", 100 << 20, stream=io.StringIO())
    small(1000)
    assert "ETA" not in small.line(small._start + 60)  # a minute, but 1000 bytes: no rate worth an ETA

    clock = [0.0]
    rich = Progress(_Numbers(), get_time=lambda: clock[0], disable=True)
    task = rich.add_task("push", total=100 << 20)
    rich.advance(task, 4 << 20)
    assert str(_Numbers().render(rich.tasks[0])) == "4.0 MiB / 100.0 MiB"  # no rate over no time, no ETA
    clock[0] = 4.0
    assert str(_Numbers().render(rich.tasks[0])) == "4.0 MiB / 100.0 MiB  1.0 MiB/s  ETA 1m36s"


def _closed_pipe() -> int:
    read, write = os.pipe()
    os.close(read)  # stderr's reader is gone: every write is EPIPE
    return write


@pytest.mark.parametrize("how", ["2>&-", "EPIPE"])
def test_a_closed_stderr_never_stops_a_run(how: str, layout: Path, tmp_path: Path) -> None:
    """``2>&-`` (or a reader that went away) used to end the export in error[source] ... Bad file
    descriptor: progress is off, the bundle is written, --json still says what was done."""
    argv = ["bundle", "export", f"oci:{layout}:fake/app:2", "-o", str(tmp_path / "b"), "--json"]
    if how == "2>&-":
        proc = start_cli(*argv, prefix=("bash", "-c", 'exec "$@" 2>&-', "bash"), stderr=None)
    else:
        fd = _closed_pipe()
        proc = start_cli(*argv, stderr=fd)
        os.close(fd)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and json.loads(out)["ok"] is True, out
    check = run_cli("importer", str(tmp_path / "b"), "--verify-only")
    assert check.returncode == 0, check.stderr
    fd = _closed_pipe()
    importer = start_cli("importer", str(tmp_path / "b"), "--verify-only", "--json", stderr=fd)
    os.close(fd)
    out, _ = importer.communicate(timeout=300)
    assert importer.returncode == 0 and json.loads(out)["verification"]["ok"] is True, out
    fd = _closed_pipe()  # the smoke suite too (it has its own error boundary): the verdict is still printed
    smoke = start_cli("importer", "smoke", "--no-container", "--device", "cpu", "--gates", "shutdown", "--no-receipt",
                      "--json", stderr=fd)
    os.close(fd)
    out, _ = smoke.communicate(timeout=300)
    assert smoke.returncode == 10 and json.loads(out)["verdict"] == "candidate", out  # CUDA gates skipped on CPU


def test_the_paste_line_is_a_line_of_its_own_quoted_for_a_shell(layout: Path, tmp_path: Path) -> None:
    """``import on the far side: python3 ...`` wrapped with the label into the command on a narrow
    terminal: the command now stands alone, and a path with a space is quoted."""
    out = tmp_path / "my bundles" / "b"
    proc = run_cli("bundle", "export", f"oci:{layout}:fake/app:2", "-o", str(out), "-q", env={"COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = lines.index("import on the far side:")
    assert lines[at + 1] == f"python3 '{out}/bundle-import.pyz' '{out}' --verify"
    argv = shlex.split(lines[at + 1])
    assert argv[1:] == [f"{out}/bundle-import.pyz", str(out), "--verify"]
    packed = run_cli("bundle", "pack", str(out), str(tmp_path / "b.tar"), "-q", check=True).stdout.splitlines()
    assert packed[packed.index("import on the far side:") + 1].startswith("python3 ")


def test_debug_after_the_subcommand_and_exit_codes_in_bundle_help(bundle: Path) -> None:
    assert run_cli("bundle", "inspect", str(bundle), "--debug").returncode == 0
    proc = run_cli("bundle", "inspect", str(bundle / "nothing"), "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr  # --debug took effect: the traceback
    out = run_cli("bundle", "--help", check=True).stdout
    doc = (REPO / "docs" / "errors.md").read_text(encoding="utf-8").split("## Exit codes", 1)[1].split("##", 1)[0]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", doc, flags=re.M)} - {10, 11, 12}  # bundle-import's
    shown = {int(c) for c in re.findall(r"(?:^|\s)(\d+) [a-z]", out.split("exit codes", 1)[1])}
    assert codes <= shown, f"bundle --help leaves out exit codes {sorted(codes - shown)}"


def test_bundle_import_points_to_bundle_import(bundle: Path) -> None:
    proc = run_cli("bundle", "import", str(bundle), "--json")
    assert proc.returncode == 2 and error_id(proc.stderr) == "usage", proc.stderr
    assert "bundle-import" in proc.stderr.split("hint:")[1] and json.loads(proc.stdout)["ok"] is False


def test_inspect_shows_each_images_compression(layout: Path, tmp_path: Path) -> None:
    _export(layout, tmp_path / "z", "--compression", "zstd").check_returncode()
    _export(layout, tmp_path / "g", "--compression", "gzip").check_returncode()
    for name, kind in (("z", "zstd"), ("g", "gzip")):
        out = run_cli("bundle", "inspect", str(tmp_path / name), check=True).stdout
        header, row = [line for line in out.splitlines() if "IMAGE" in line or "fake/app:2" in line][:2]
        cells = [c.strip() for c in re.split(r"[│┃]", row)]
        heads = [c.strip() for c in re.split(r"[│┃]", header)]
        assert cells[heads.index("COMPRESSION")] == kind, out


def test_every_silent_choice_of_an_export_gets_one_line(layout: Path, tmp_path: Path) -> None:
    from tests.kit.layoutgen import named_indexes_layout

    bare = tmp_path / "bare"
    named_indexes_layout(bare, ["latest"])
    inventory = json.loads(run_cli("importer", "--inventory", "--engine", "oci", "--oci-dir", str(layout),
                                   check=True).stdout)
    inventory["engine"].update(kind="docker", version="20.10.24")  # a Docker that reads no zstd
    from importer.inventory.engine import checksum

    inventory["checksum"] = checksum(inventory)
    have = tmp_path / "have.json"
    have.write_text(json.dumps(inventory))
    proc = run_cli("bundle", "export", f"oci:{bare}:latest", "-o", str(tmp_path / "b"), "-q", "--have", str(have),
                   "--docker-host", "unix:///nonexistent.sock")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert any("--compression auto chose gzip" in n and "docker 20.10.24" in n for n in notes), proc.stderr
    assert any("carried untagged" in n and "--tag" in n for n in notes), proc.stderr
    assert any(n.startswith("note: --docker-host is ignored") for n in notes), proc.stderr
    assert len(notes) == len(set(notes))


def test_inventory_writes_json_on_failure_as_the_docs_say(tmp_path: Path) -> None:
    proc = run_cli("importer", "--inventory", "--engine", "docker", "--docker-host", f"unix://{tmp_path}/no.sock")
    assert proc.returncode == 6 and error_id(proc.stderr) == "engine-unavailable", proc.stderr
    assert json.loads(proc.stdout)["error"]["id"] == "engine-unavailable"  # no --json: --inventory is JSON


def test_the_import_table_gives_the_whole_reason_of_a_mismatch(tmp_path: Path) -> None:
    """The table had no room for the reason at all: each row that did not match gets a details line, whole."""
    from importer.engines import EngineImage
    from importer.input.opened import open_bundle
    from importer.pipeline.postload import check_image, render_table
    from tests.kit.bundlegen import make_bundle

    image = open_bundle(str(make_bundle(tmp_path / "b"))).manifest().images[0]
    found = EngineImage(image_id="sha256:" + "e" * 64, diff_ids=["sha256:" + "f" * 64] * 7, tags=[],
                        config_digest="sha256:" + "c" * 64)
    check = check_image(image, found, "overlay2")
    table = render_table([check])
    assert check.result == "mismatch" and f"  {image.name}: {check.detail}" in table.splitlines(), table
    assert "sha256:" + "c" * 64 in table and "layers: expected" in table
