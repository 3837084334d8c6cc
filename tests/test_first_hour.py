"""A new user's first hour (issue 26): what a command will refuse is refused before the work,
progress without a terminal tells the truth and ends with a done line, errors name the cause."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from importer.cli.smoke import render_gates
from importer.errors import InvalidReference
from importer.format.reference import parse_reference
from importer.streams.progress import StderrProgress
from tests.kit import engines
from tests.kit.bundlegen import make_bundle
from tests.kit.helpers import docker, run_cli
from tests.kit.imagegen import simple_context
from tests.kit.layoutgen import REF, two_platform_layout
from tests.kit.trustkit import keypair


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


# ============================== progress without a terminal
_LINE = re.compile(r"^export: (?P<done>[\d.]+ \S+)(?: / (?P<total>[\d.]+ \S+) \((?P<pct>\d+)%\))? [\d.]+ \S+/s"
                   r"(?: ETA \d+s)?$")
_DONE = re.compile(r"^export: done, (?P<done>[\d.]+ \S+) in [\d.]+s \([\d.]+ \S+/s\)$")


def _export_lines(stderr: str) -> tuple[list[re.Match[str]], list[re.Match[str]]]:
    lines = [line for line in stderr.splitlines() if line.startswith("export:")]
    progress = [m for m in map(_LINE.match, lines) if m]
    done = [m for m in map(_DONE.match, lines) if m]
    assert len(progress) + len(done) == len(lines), stderr  # every export line is one of the two
    return progress, done


def test_a_piped_export_counts_every_platform_and_ends_with_a_done_line(tmp_path: Path) -> None:
    """stderr a pipe (CI logs, ``| tee``): progress lines whose total is every platform carried
    (``--all-platforms`` used to count one), never past 100%, then one done line."""
    built = two_platform_layout(tmp_path / "layout")
    blobs = tmp_path / "layout" / "blobs" / "sha256"
    both = sum((blobs / p["layer"].split(":")[1]).stat().st_size for p in built["platforms"].values())
    proc = run_cli("bundle", "export", f"oci:{tmp_path / 'layout'}:{REF}", "--all-platforms",
                   "-o", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    progress, done = _export_lines(proc.stderr)
    assert progress and all(m["total"] == f"{both} B" and int(m["pct"]) <= 100 for m in progress), proc.stderr
    assert [m["done"] for m in done] == [f"{both} B"], proc.stderr


def test_progress_never_shows_a_percent_it_cannot_know() -> None:
    stream = io.StringIO()
    bar = StderrProgress("export", 0, stream=stream)  # a total the source cannot say: bytes and rate only
    bar(2048)
    bar.close()
    bar.close()  # once
    first, last = stream.getvalue().splitlines()
    assert re.fullmatch(r"export: 2\.0 KiB [\d.]+ \S+/s", first)
    assert re.fullmatch(r"export: done, 2\.0 KiB in [\d.]+s \([\d.]+ \S+/s\)", last)
    stream = io.StringIO()
    bar = StderrProgress("export", 23, stream=stream, interval=0)  # a total that was short: no 8904%
    bar(2048)
    assert "%" not in stream.getvalue() and "ETA" not in stream.getvalue()


@pytest.mark.engine
def test_a_piped_docker_export_shows_no_made_up_percent(docker_host: str, busybox: str, tmp_path: Path) -> None:
    """Docker's image size counts file contents, not the tar bytes read: a tiny image's first line
    read 8904% and a real one ended at 104%; now bytes and rate, then the done line."""
    engines.build_image(docker_host, simple_context(tmp_path / "ctx", busybox, "progress"), "progress/app:1")
    try:
        proc = run_cli("bundle", "export", "progress/app:1", "-o", str(tmp_path / "b"), docker_host=docker_host)
    finally:
        docker(docker_host, "image", "rm", "progress/app:1", check=False)
    assert proc.returncode == 0, proc.stderr
    progress, done = _export_lines(proc.stderr)
    assert all(m["pct"] is None for m in progress) and len(done) == 1, proc.stderr


# ============================== errors name the cause
@pytest.mark.parametrize(("ref", "part"), [
    ("Demo/Hello:1", "found 'Demo' (uppercase: repository names are lowercase)"),
    ("demo/hello:-x", "expected a tag of letters"),
    ("demo//x", "found an empty one ('//' or a trailing '/')"),
    ("demo@sha256:12", "expected 'sha256:' and 64 lowercase hex digits after '@', found 'sha256:12'"),
    ("reg.example:99x/a", "expected a registry host as HOST or HOST:PORT, found 'reg.example:99x'"),
    ("a b", "expected no spaces"),
    ("a\x1b[2Jb", "expected no spaces, found a space or control character"),
    ("x" * 300, "expected at most 255 characters, found 300"),
    ("", "found an empty one"),
    ("app:" + "t" * 129, "expected a tag of letters"),
    ("émoji/app:1", "repository path components"),
])
def test_a_bad_reference_names_the_part_that_is_wrong(ref: str, part: str) -> None:
    with pytest.raises(InvalidReference) as e:
        parse_reference(ref)
    assert part in e.value.message and e.value.hint and "e.g. registry.example:5000/team/app:1" in e.value.hint


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_a_reference_or_one_invalid_reference_error(text: str) -> None:
    try:
        ref = parse_reference(text)
    except InvalidReference as e:
        assert repr(text)[:40] in e.message or len(text) > 255
    else:
        assert ref.path and text.startswith(f"{ref.host}/" if ref.host else ref.path)


@pytest.mark.parametrize("ref", ["app", "app:1", "team/app:1.0-rc_1", "localhost:5000/a/b:c", "[::1]:5000/x:1",
                                 "reg.example/a__b/c---d:v", "app@sha256:" + "a" * 64, "sha256:" + "b" * 64])
def test_good_references_parse(ref: str) -> None:
    assert parse_reference(ref).path


D64 = "sha256:" + "d" * 64


@pytest.mark.parametrize("ref, split, host", [
    ("app", ("app", "", ""), ""),
    ("app:1", ("app", "1", ""), ""),
    ("localhost:5000/a/b:c", ("localhost:5000/a/b", "c", ""), "localhost:5000"),
    ("[::1]:5000/x:1@" + D64, ("[::1]:5000/x", "1", D64), "[::1]:5000"),
    ("reg.example:5000/x@" + D64, ("reg.example:5000/x", "", D64), "reg.example:5000"),
    ("team/app", ("team/app", "", ""), ""),
])
def test_every_reader_of_a_reference_takes_the_one_split(ref: str, split: tuple, host: str) -> None:
    """refs (engines), the registry source, push's map_ref, cosign, serve's repositories, the node
    config's upstreams and the export's transport read the parser's split, so they cannot disagree
    on where the tag, the digest or the host is (issue 27)."""
    from bundle.sources.choose import transport_of
    from bundle.sources.registry import parse_registry_ref
    from importer.format.reference import DOCKER_HUB, split_host_path, split_reference
    from importer.format.refs import split_ref
    from importer.registry.client import map_ref, parse_target
    from importer.serve.nodeconfig import upstreams_of
    from importer.serve.serve import repository_of as served_as
    from importer.verify.cosign import repository_of

    assert split_reference(ref) == split_ref(ref) == split
    assert split_host_path(split[0])[0] == host
    assert repository_of(ref) == split[0]
    parsed = parse_registry_ref(ref)
    assert (parsed.tag or "latest", parsed.digest) == (split[1] or "latest", split[2])
    assert parsed.repo.endswith(split_host_path(split[0])[1])
    dest = map_ref(ref, parse_target("127.0.0.1:5000/ns"))
    assert dest.tag == split[1] and dest.repository.startswith("ns/")
    path = split_host_path(split[0])[1]
    assert served_as(ref) == (path, split[1] or ("" if split[2] else "latest"), split[2])
    assert upstreams_of([ref]) == {host or DOCKER_HUB: [path]}
    assert transport_of(ref) == ("docker-daemon", ref) and transport_of(f"docker://{ref}") == ("docker", ref)


@pytest.mark.parametrize("text, split", [
    ("docker://reg.example/app:1", ("docker", "//reg.example/app:1")),
    ("oci:/srv/layout:app:1", ("oci", "/srv/layout:app:1")), ("oci:", ("oci", "")),
    ("containerd:docker.io/library/x:2", ("containerd", "docker.io/library/x:2")),
    ("docker-daemon:team/app:1", ("docker-daemon", "team/app:1")), ("dir:/tmp/x", ("dir", "/tmp/x")),
    ("docker:5000/team/app:1", ("", "docker:5000/team/app:1")),  # the registry host docker:5000
    ("oci:5000/app", ("", "oci:5000/app")), ("localhost:5000/app:1", ("", "localhost:5000/app:1")),
    ("app:1", ("", "app:1")), ("ftp://x", ("", "ftp://x")), ("DOCKER://x", ("", "DOCKER://x")),
    (":app", ("", ":app")), ("", ("", "")), ("docker-:x", ("", "docker-:x")),
])
def test_a_transport_prefix_is_split_in_one_place(text: str, split: tuple) -> None:
    """skopeo's ``TRANSPORT:REF`` as bundle export and --images-from read it: a known transport
    only, and a registry port after the first ':' makes it a host, not a transport."""
    from importer.format.reference import split_transport
    assert split_transport(text) == split


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="adeiockrs-:/5.", max_size=30))
def test_any_text_is_a_transport_and_its_rest_or_bare(text: str) -> None:
    from importer.format.reference import TRANSPORTS, split_transport
    transport, rest = split_transport(text)
    assert (transport, rest) == ("", text) or (transport in TRANSPORTS and text == f"{transport}:{rest}")


def test_a_registry_host_named_like_a_transport_is_exported_from_docker() -> None:
    """``docker:5000/team/app:1`` names the registry ``docker:5000`` (Docker reads it so); the old
    split at the first ':' took it for a ``docker:`` transport missing its two slashes."""
    from bundle.sources.choose import transport_of
    assert transport_of("docker:5000/team/app:1") == ("docker-daemon", "docker:5000/team/app:1")
    from importer.errors import UsageError
    with pytest.raises(UsageError, match=r"expected docker://HOST\[:PORT\]/REPO:TAG") as e:
        transport_of("docker:127.0.0.1:5000/sn/small:1")
    assert "two slashes" in (e.value.hint or "")


@pytest.mark.parametrize("host, split", [("127.0.0.1:5000", ("127.0.0.1", 5000)), ("[::1]:5000", ("::1", 5000)),
                                         ("[::1]", ("::1", None)), ("reg.example", ("reg.example", None)),
                                         ("::1", ("::1", None)),
                                         # another script's digits are no port ("reg", 5000; or a crash before)
                                         ("reg:\u0665\u0660\u0660\u0660", ("reg:\u0665\u0660\u0660\u0660", None)),
                                         ("reg:\u00b2", ("reg:\u00b2", None)), ("[::1]:\u00b2", ("::1", None)),
                                         ("[::1]:x", ("::1", None))])
def test_a_registry_host_splits_into_address_and_port_in_one_place(host: str, split: tuple) -> None:
    from importer.format.reference import split_host_port
    assert split_host_port(host) == split


@pytest.mark.parametrize("text", ["alpine:3", "docker.io/alpine:3", "index.docker.io/alpine:3",
                                  "registry-1.docker.io/alpine:3", "library/alpine:3",
                                  "docker.io/library/alpine:3"])
def test_every_spelling_of_an_official_image_asks_docker_hub_for_its_library_path(text: str) -> None:
    """``docker://docker.io/alpine`` named Docker Hub's host but asked it for ``alpine``, which Hub
    answers with 401/404: Docker folds every spelling into ``library/alpine``, and so does the source."""
    from bundle.sources.registry import parse_registry_ref
    from importer.format.reference import DOCKER_HUB_API
    ref = parse_registry_ref(text)
    assert (ref.host, ref.repo, ref.tag) == (DOCKER_HUB_API, "library/alpine", "3")
    assert ref.name == "alpine:3"
    team = parse_registry_ref("docker.io/team/app:1")
    assert (team.host, team.repo, team.name) == (DOCKER_HUB_API, "team/app", "team/app:1")


@pytest.mark.parametrize("name, canonical", [
    ("alpine", "docker.io/library/alpine"), ("library/alpine", "docker.io/library/alpine"),
    ("docker.io/alpine", "docker.io/library/alpine"), ("index.docker.io/library/alpine", "docker.io/library/alpine"),
    ("registry-1.docker.io/alpine", "docker.io/library/alpine"), ("team/app", "docker.io/team/app"),
    ("docker.io/team/app", "docker.io/team/app"), ("127.0.0.1:5000/alpine", "127.0.0.1:5000/alpine"),
    ("reg.example/library/x", "reg.example/library/x"), ("localhost/x", "localhost/x"),
])
def test_one_canonical_spelling_of_a_repository(name: str, canonical: str) -> None:
    from importer.format.reference import canonical_repository
    assert canonical_repository(name) == canonical


def test_a_bad_registry_reference_names_the_part_that_is_wrong() -> None:
    from bundle.sources.registry import parse_registry_ref
    for text, part in [("reg.example/x@sha256:12", "expected a digest"), ("reg.example/X:1", "expected a repository"),
                       ("reg.example/x:-1", "expected a tag")]:
        with pytest.raises(InvalidReference) as e:
            parse_registry_ref(text)
        assert part in e.value.message and f"docker://{text}" in e.value.message


def test_the_export_cli_names_the_bad_part_of_an_image_and_a_tag(tmp_path: Path) -> None:
    proc = run_cli("bundle", "export", "Demo/Hello:1", "-o", str(tmp_path / "b"))
    assert proc.returncode == 2 and "error[invalid-reference]" in proc.stderr, proc.stderr
    assert "found 'Demo' (uppercase: repository names are lowercase)" in proc.stderr
    proc = run_cli("bundle", "export", _layout(tmp_path), "--tag", "team/app:-1", "-o", str(tmp_path / "b"))
    assert proc.returncode == 2 and "exporting with --tag 'team/app:-1': expected a tag" in proc.stderr, proc.stderr
    assert not (tmp_path / "b").exists()


def test_a_docker_host_without_a_scheme_is_a_socket_or_refused(tmp_path: Path) -> None:
    """``--docker-host /x.sock`` used to become tcp://localhost:2375 in the docker CLI."""
    sock = tmp_path / "none.sock"
    proc = run_cli("importer", "--inventory", "--docker-host", str(sock))
    assert proc.returncode == 6 and f"unix://{sock}" in proc.stderr and "2375" not in proc.stderr, proc.stderr
    proc = run_cli("importer", "--inventory", "--docker-host", "none.sock")
    assert proc.returncode == 2 and "error[usage]" in proc.stderr, proc.stderr
    assert "reading --docker-host 'none.sock': expected unix:///path/docker.sock, a socket path" in proc.stderr
    proc = run_cli("importer", "smoke", "x:1", "--docker-host", str(sock), "--device", "cpu", "--no-receipt",
                   timeout=300)  # the smoke suite's engine too (it said tcp://localhost:2375/...sock)
    assert proc.returncode != 0 and f"unix://{sock}" in proc.stderr and "2375" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("cli", ["bundle", "importer"])
def test_sign_receipt_with_a_wrong_passphrase_says_so(cli: str, tmp_path: Path) -> None:
    """The importer's openssl signer used to put OpenSSL's error dump in the message."""
    if cli == "importer":
        engines.require("openssl")
    key, _ = keypair(tmp_path, "site", b"right one")
    receipt = tmp_path / "r.json"
    receipt.write_text('{"kind": "import"}')
    proc = run_cli(cli, "sign-receipt", str(receipt), "--sign-key", str(key), "--passphrase-stdin",
                   input="wrong one\n")
    assert proc.returncode != 0 and "error[invalid-key]" in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.endswith("found a wrong passphrase") or first.endswith("found a wrong key or passphrase"), first
    assert "error:0" not in first and "routines" not in first  # no OpenSSL dump in the one line
    assert not (tmp_path / "r.json.sig").exists()


def test_the_smoke_table_keeps_the_end_of_an_error_where_the_reason_is() -> None:
    reason = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    error = "Traceback (most recent call last):\n" + "  File \"x.py\", line 1, in f\n" * 20 + reason
    receipt = {"gates": [{"name": "matmul", "status": "fail", "required": True, "seconds": 1.0, "error": error},
                         {"name": "env", "status": "pass", "required": True, "seconds": 0.1, "detail": "d" * 400}],
               "verdict": "fail", "exitCode": 10, "device": "cuda", "image": {"ref": "x:1"}}
    table = render_gates(receipt)
    matmul, env = table.splitlines()[1:3]
    assert matmul.endswith(reason) and "..." in matmul  # it used to stop 160 characters in, before the reason
    assert len(env) < 200 and env.endswith("...")


def test_an_export_error_names_the_users_path_not_the_staging_folder(tmp_path: Path) -> None:
    """A layer the source lists but does not hold: the export stops, and its error (in the
    staging folder's name while the work ran) names ``-o`` as the user wrote it."""
    from bundle.export import user_paths
    from importer.errors import SourceError

    staging = str(tmp_path / "b.bundle.partial-abc123")
    e = user_paths(SourceError(f"writing {staging}/blobs/sha256/x: no space left", context=f"in {staging}"),
                   staging, str(tmp_path / "b.bundle"))
    assert e.message == f"writing {tmp_path / 'b.bundle'}/blobs/sha256/x: no space left"
    assert str(e) == e.message and e.context == f"in {tmp_path / 'b.bundle'}" and ".partial" not in str(e)


# ============================== help a new user can act on
_COMMANDS = [("bundle", c) for c in ("export", "inspect", "keygen", "sign", "sign-receipt", "pack", "copy", "push")] + [
    ("importer", c) for c in ("", "smoke", "copy", "serve", "fleet-report", "sign-receipt")]


@pytest.mark.parametrize(("cli", "command"), _COMMANDS)
def test_every_command_help_has_an_example_and_says_where_the_docs_are(cli: str, command: str) -> None:
    proc = run_cli(cli, *([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    examples = proc.stdout.split("\nexamples:\n", 1)
    assert len(examples) == 2, proc.stdout
    first = examples[1].splitlines()[0].strip()
    prog = "bundle" if cli == "bundle" else "bundle-import"
    assert first.startswith((f"{prog} {command}".strip(), "python3 ")) and command in first, first
    assert "docs/*.md: " in proc.stdout


def test_the_import_table_names_both_digests_and_stages_end_with_done(tmp_path: Path) -> None:
    """An OCI layout's (and containerd's) image ID is the manifest digest: the table used to show
    only the config digest beside it, two different digests and MATCH."""
    bundle = make_bundle(tmp_path)
    proc = run_cli("importer", str(bundle), "--engine", "oci", "--oci-dir", str(tmp_path / "out"), "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    for stage in ("verify", "load"):  # stderr a pipe: each stage ends with its done line
        assert re.search(rf"^{stage}: done, [\d.]+ \S+ in [\d.]+s \([\d.]+ \S+/s\)$", proc.stderr, re.M), proc.stderr
    header, *rows = proc.stdout.splitlines()[:3]
    assert header.split() == ["IMAGE", "CONFIG", "DIGEST", "MANIFEST", "DIGEST", "ENGINE", "ID", "LAYERS", "RESULT"]
    for row in rows:
        _, config, manifest, engine_id, _, result = row.split()
        assert result == "MATCH" and engine_id == manifest and config != manifest, row
