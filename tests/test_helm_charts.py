"""``bundle export --chart CHART.tgz``: a Helm chart carried as Helm's OCI artifact (bundle/helmchart.py,
docs/kubernetes.md "Charts"), read from the bundle's OCI layout as helm pull reads it and with the
real oras; hostile packages refused in one helm-chart line, nothing written."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Callable

import pytest

from bundle.helmchart import ChartError, read_chart
from tests.kit.chartkit import CHART_CONFIG, CHART_YAML, chart_tgz, helm_pull_check, oras_pull, prov_file
from tests.kit.helpers import run_cli, run_pyz

REF = "charts/demo:0.1.0_build.1"


def _export(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    out = tmp_path / "charts.bundle"
    run_cli("bundle", "export", *args, "-o", str(out), "-q", check=True)
    return out, json.loads((out / "bundle.json").read_text())


def _blob(bundle: Path) -> Callable[[str], bytes]:
    return lambda digest: (bundle / "blobs" / "sha256" / digest[7:]).read_bytes()


def test_a_chart_is_carried_as_helm_pushes_it(tmp_path: Path) -> None:
    tgz = chart_tgz(tmp_path / "demo-0.1.0+build.1.tgz")
    os.utime(tgz, (1_700_000_000, 1_700_000_000))
    bundle, doc = _export(tmp_path, "--chart", str(tgz))
    assert doc["schemaVersion"] == "3.6"
    (art,) = doc["artifacts"]
    assert art["ref"] == REF and art["artifactType"] == "application/vnd.cncf.helm.config.v1+json"
    assert [f["title"] for f in art["files"]] == ["demo-0.1.0+build.1.tgz"]
    index = json.loads((bundle / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == REF]
    manifest = json.loads(_blob(bundle)(entry["digest"]))
    meta, chart = helm_pull_check(manifest, _blob(bundle))
    assert chart == tgz.read_bytes()  # the .tgz byte for byte
    assert _blob(bundle)(manifest["config"]["digest"]).decode() == CHART_CONFIG  # json.Marshal(chart.Metadata)
    assert meta["appVersion"] == "1.1" and "deprecated" not in meta
    notes = manifest["annotations"]  # helm's generateOCIAnnotations
    assert notes["org.opencontainers.image.title"] == "demo"
    assert notes["org.opencontainers.image.version"] == "0.1.0+build.1"
    assert notes["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"  # the .tgz's mtime, as helm push
    assert notes["org.opencontainers.image.authors"] == "Ops (ops@example.com)"
    assert notes["artifacthub.io/images"].startswith("- name: app")
    # the real oras reads it from the layout, and the importer writes it with --files-to
    pulled = tmp_path / "pulled"
    oras_pull(bundle, entry["digest"], pulled, home=tmp_path)
    assert (pulled / "demo-0.1.0+build.1.tgz").read_bytes() == tgz.read_bytes()
    proc = run_pyz(bundle, "--files-to", str(tmp_path / "dest"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "dest" / "demo-0.1.0+build.1.tgz").read_bytes() == tgz.read_bytes()


def test_charts_under_another_repository_beside_files(tmp_path: Path) -> None:
    one = chart_tgz(tmp_path / "demo.tgz")
    two = chart_tgz(tmp_path / "gpu.tgz", CHART_YAML.replace("name: demo", "name: gpu-stack")
                    .replace("version: 0.1.0+build.1", "version: v25.3.4"), top="gpu-stack")
    (tmp_path / "notes.txt").write_text("hi\n")
    bundle, doc = _export(tmp_path, "--chart", str(one), "--chart", str(two), "--chart-repository", "team/charts",
                          "--file", str(tmp_path / "notes.txt"), "--artifact-ref", "docs/notes:1")
    assert [a["ref"] for a in doc["artifacts"]] == ["docs/notes:1", "team/charts/demo:0.1.0_build.1",
                                                   "team/charts/gpu-stack:v25.3.4"]
    proc = run_pyz(bundle, "--verify-only", "-q")
    assert proc.returncode == 0, proc.stderr


def _member(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = "") -> Callable:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return add


def _zero_member(tar: tarfile.TarFile) -> None:  # a 6 MiB file of zeros: a few KiB compressed, past helm's 5 MiB
    info = tarfile.TarInfo("demo/big.bin")
    info.size = 6 * 1024 * 1024
    tar.addfile(info, io.BytesIO(bytes(info.size)))


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefg", "bcdefgh"))

HOSTILE = {
    "not gzip": (lambda p: p.write_bytes(b"name: demo\n"), "expected a gzipped tar"),
    "gzip, not tar": (lambda p: p.write_bytes(__import__("gzip").compress(b"\x01" * 2000)), "damaged"),
    "no Chart.yaml": (lambda p: chart_tgz(p, top="demo", edit=None, extra={}) and _rewrite(p, drop="Chart.yaml"),
                      "not a Helm chart"),
    "traversal": (lambda p: chart_tgz(p, edit=_member("demo/../../etc/passwd")), "out of the chart's folder"),
    "absolute": (lambda p: chart_tgz(p, edit=_member("demo//etc/passwd")), "absolute"),
    "top-level Chart.yaml": (lambda p: chart_tgz(p, edit=_member("Chart.yaml")), "outside it"),
    "Chart.yaml a symlink": (lambda p: _rewrite(chart_tgz(p), drop="Chart.yaml", edit=_member(
        "demo/Chart.yaml", kind=tarfile.SYMTYPE, link="/etc/passwd")), "not a Helm chart"),
    "a member past helm's 5 MiB": (lambda p: chart_tgz(p, edit=_zero_member), "5 MiB"),
    "alias bomb": (lambda p: chart_tgz(p, BOMB), "alias bomb"),
    "not semver": (lambda p: chart_tgz(p, CHART_YAML.replace("0.1.0+build.1", "latest")), "is invalid"),
    "no version": (lambda p: chart_tgz(p, CHART_YAML.replace("version: 0.1.0+build.1\n", "")), "version is required"),
    "null maintainer": (lambda p: chart_tgz(p, CHART_YAML.replace("maintainers:\n", "maintainers:\n  - null\n")),
                        "null nodes"),
    "name a list": (lambda p: chart_tgz(p, CHART_YAML.replace("name: demo", "name: [demo]")), "expected a string"),
    "no OCI name": (lambda p: chart_tgz(p, CHART_YAML.replace("name: demo", "name: Demo_App")), "OCI reference"),
    "not UTF-8": (lambda p: chart_tgz(p, "x"), "UTF-8"),
}


def _rewrite(path: Path, *, drop: str, edit: Callable | None = None) -> Path:
    """The package at ``path`` again without its member TOP/``drop``, then ``edit``."""
    with tarfile.open(path) as src:
        kept = [(m, src.extractfile(m).read()) for m in src.getmembers() if m.isreg() and not m.name.endswith(drop)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m, data in kept:
            tar.addfile(m, io.BytesIO(data))
        if edit is not None:
            edit(tar)
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_package_is_one_clear_error(tmp_path: Path, case: str) -> None:
    make, said = HOSTILE[case]
    path = tmp_path / "chart.tgz"
    if case == "not UTF-8":
        chart_tgz(path, extra={"demo/Chart.yaml": b"name: d\xffmo\n"})
    else:
        make(path)
    with pytest.raises(ChartError) as e:
        read_chart(str(path))
    assert said in str(e.value), str(e.value)


def test_a_signed_chart_carries_its_provenance_file_as_helm_push_does(tmp_path: Path) -> None:
    """``CHART.tgz.prov`` beside the package (helm package --sign) goes as helm push sends it: the
    second layer, helm's provenance media type, byte for byte, so `helm pull --verify` finds it;
    --files-to writes it beside the .tgz (helm install --verify reads the pair)."""
    from bundle.helmchart import PROV_LAYER

    tgz = chart_tgz(tmp_path / "demo-0.1.0+build.1.tgz")
    prov = prov_file(tgz, "demo-0.1.0+build.1.tgz")
    bundle, doc = _export(tmp_path, "--chart", str(tgz))
    (art,) = doc["artifacts"]
    assert [f["title"] for f in art["files"]] == ["demo-0.1.0+build.1.tgz", "demo-0.1.0+build.1.tgz.prov"]
    index = json.loads((bundle / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == REF]
    manifest = json.loads(_blob(bundle)(entry["digest"]))
    helm_pull_check(manifest, _blob(bundle))
    assert [d["mediaType"] for d in manifest["layers"]][1] == PROV_LAYER
    assert _blob(bundle)(manifest["layers"][1]["digest"]) == prov.read_bytes()
    proc = run_pyz(bundle, "--files-to", str(tmp_path / "dest"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "dest" / "demo-0.1.0+build.1.tgz.prov").read_bytes() == prov.read_bytes()


@pytest.mark.parametrize("case", ["other-package", "renamed", "not-signed", "link", "too-big", "fifo"])
def test_a_provenance_file_helm_would_refuse_is_one_clear_error(tmp_path: Path, case: str) -> None:
    from bundle.helmchart import MAX_PROV

    tgz = chart_tgz(tmp_path / "demo-0.1.0+build.1.tgz")
    prov = Path(f"{tgz}.prov")
    if case == "other-package":
        prov_file(tgz, "demo-0.1.0+build.1.tgz", digest="ab" * 32)
    elif case == "renamed":
        prov_file(tgz, "demo-0.2.0.tgz")
    elif case == "not-signed":
        prov.write_text("files:\n  demo-0.1.0+build.1.tgz: sha256:00\n")
    elif case == "link":
        real = prov_file(tgz, "demo-0.1.0+build.1.tgz").rename(tmp_path / "real.prov")
        prov.symlink_to(real)
    elif case == "too-big":
        prov.write_bytes(b"-----BEGIN PGP SIGNED MESSAGE-----\n" + b"x" * MAX_PROV)
    else:
        os.mkfifo(prov)
    proc = run_cli("bundle", "export", "--chart", str(tgz), "-o", str(tmp_path / "out"), "-q", timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error[helm-chart]: exporting --chart"), proc.stderr
    assert "provenance file" in proc.stderr.splitlines()[0] and "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "out")


def test_through_the_cli_nothing_is_written(tmp_path: Path) -> None:
    path = chart_tgz(tmp_path / "chart.tgz", edit=_member("demo/../../x"))
    proc = run_cli("bundle", "export", "--chart", str(path), "-o", str(tmp_path / "out"), "-q")
    assert proc.returncode == 2 and proc.stderr.startswith("error[helm-chart]: exporting --chart"), proc.stderr
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["chart.tgz"]


def test_go_conversions() -> None:
    from bundle.helmchart import _float32_g, go_json
    assert [_float32_g(x) for x in (1.10, 1.0, 1e6, 123456.0, 0.00001)] == ["1.1", "1", "1e+06", "123456", "1e-05"]
    assert go_json({"a": "<&>\u2028é"}) == b'{"a":"\\u003c\\u0026\\u003e\\u2028\xc3\xa9"}'


def test_helm_pull_reads_the_chart_from_serve(tmp_path: Path) -> None:
    """`helm pull oci://SERVE/charts/demo --version ...` against `bundle-import serve`: the manifest
    by the chart's tag, helm's checks on it, the config and the chart blob by digest, as helm's
    client asks for them (no helm binary here); and the real oras pulls the same .tgz from it."""
    import http.client

    from tests.kit.fileskit import run_oras
    from tests.kit.servekit import serving

    tgz = chart_tgz(tmp_path / "demo-0.1.0+build.1.tgz")
    bundle, _ = _export(tmp_path, "--chart", str(tgz))
    repo, tag = REF.split(":")
    with serving(bundle / "bundle-import.pyz", bundle) as served:
        def get(path: str, accept: str = "") -> bytes:
            conn = http.client.HTTPConnection(served.addr, timeout=60)
            try:
                conn.request("GET", path, headers={"Accept": accept} if accept else {})
                resp = conn.getresponse()
                body = resp.read()
                assert resp.status == 200, (path, resp.status, body[:200])
                return body
            finally:
                conn.close()

        assert tag in json.loads(get(f"/v2/{repo}/tags/list"))["tags"]
        manifest = json.loads(get(f"/v2/{repo}/manifests/{tag}", "application/vnd.oci.image.manifest.v1+json"))
        meta, chart = helm_pull_check(manifest, lambda digest: get(f"/v2/{repo}/blobs/{digest}"))
        assert chart == tgz.read_bytes() and meta["name"] == "demo"
        pulled = tmp_path / "pulled"
        run_oras("pull", "--plain-http", f"{served.addr}/{REF}", "-o", str(pulled), home=tmp_path)
        assert (pulled / "demo-0.1.0+build.1.tgz").read_bytes() == tgz.read_bytes()
