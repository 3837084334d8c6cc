"""Helm chart packages for ``bundle export --chart`` (bundle/helmchart.py): a small chart as
``helm package`` writes it (NAME/Chart.yaml, values, templates in a gzipped tar), hostile ones, and
what ``helm pull`` checks of what it reads (helm's pkg/registry/client.go ``Pull``)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Callable

from tests.kit import engines

CHART_YAML = """apiVersion: v2
name: demo
description: A demo chart <for> tests & such
version: 0.1.0+build.1
appVersion: 1.10
home: https://example.com
sources: [https://src.example.com/demo]
maintainers:
  - name: Ops
    email: ops@example.com
keywords: [gpu, demo]
Deprecated: no
annotations:
  artifacthub.io/images: |
    - name: app
      image: busybox:1.36
  org.opencontainers.image.title: not-the-title
dependencies:
  - name: sub
    version: 1.x.x
    repository: https://charts.example.com
    import-values: [data, {parent: b, child: a}]
"""
#: CHART_YAML's config as helm writes it: json.Marshal(chart.Metadata) (field order, omitempty, <>& escaped,
#: appVersion 1.10 a float made "1.1" by sigs.k8s.io/yaml, Deprecated matched case-insensitively)
CHART_CONFIG = (
    '{"name":"demo","home":"https://example.com","sources":["https://src.example.com/demo"],'
    '"version":"0.1.0+build.1","description":"A demo chart \\u003cfor\\u003e tests \\u0026 such",'
    '"keywords":["gpu","demo"],"maintainers":[{"name":"Ops","email":"ops@example.com"}],"apiVersion":"v2",'
    '"appVersion":"1.1","annotations":{"artifacthub.io/images":"- name: app\\n  image: busybox:1.36\\n",'
    '"org.opencontainers.image.title":"not-the-title"},"dependencies":[{"name":"sub","version":"1.x.x",'
    '"repository":"https://charts.example.com","import-values":["data",{"child":"a","parent":"b"}]}]}')


def chart_tgz(path: Path, chart_yaml: str = CHART_YAML, *, top: str = "demo",
              extra: dict[str, bytes] | None = None, edit: Callable[[tarfile.TarFile], None] | None = None,
              mtime: int = 1_700_000_000) -> Path:
    """A chart package at ``path``: TOP/Chart.yaml, values.yaml, a template, ``extra`` members (names
    as given), then ``edit(tar)`` for what a hostile package adds."""
    members = {f"{top}/Chart.yaml": chart_yaml.encode(), f"{top}/values.yaml": b"replicaCount: 1\n",
               f"{top}/templates/cm.yaml": b"kind: ConfigMap\n", **(extra or {})}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
        if edit is not None:
            edit(tar)
    path.write_bytes(buf.getvalue())
    return path


def prov_file(tgz: Path, title: str, *, digest: str | None = None) -> Path:
    """``TGZ.prov`` as ``helm package --sign`` writes it (helm's pkg/provenance/sign.go ``messageBlock``:
    the metadata as YAML, ``...``, ``files:`` naming ``title`` with the package's sha256, clear-signed);
    ``digest``: another checksum, for a provenance file of another package. The PGP signature is a
    stand-in: nothing here checks it (helm does, on the far side)."""
    import hashlib

    sha = digest or hashlib.sha256(tgz.read_bytes()).hexdigest()
    text = ("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\napiVersion: v2\nname: demo\n"
            "version: 0.1.0+build.1\n\n...\nfiles:\n"
            f"  {title}: sha256:{sha}\n"
            "-----BEGIN PGP SIGNATURE-----\n\nwsBcBAEBCgAQBQJlU2x0CRAstand+in==\n-----END PGP SIGNATURE-----\n")
    path = Path(f"{tgz}.prov")
    path.write_text(text)
    return path


def helm_pull_check(manifest: dict[str, Any], read_blob: Callable[[str], bytes]) -> tuple[dict[str, Any], bytes]:
    """What ``helm pull`` requires of a chart's manifest (pkg/registry/client.go ``Pull``: the config
    of the helm config type, a layer of the chart type, the config JSON a chart.Metadata): (the
    metadata, the chart's bytes)."""
    assert manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    charts = [d for d in manifest["layers"] if d["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"]
    assert len(charts) == 1, manifest["layers"]
    meta = json.loads(read_blob(manifest["config"]["digest"]))
    assert isinstance(meta, dict) and meta["name"] and meta["version"] and meta["apiVersion"]
    return meta, read_blob(charts[0]["digest"])


def oras_pull(layout: Path, digest: str, out: Path, *, home: Path) -> None:
    """``oras pull --oci-layout LAYOUT@DIGEST -o OUT`` with the real oras (PATH, else Debian 13's in
    /opt/sneakernet/trixie-tools, docker/scripts/install-deps.sh), its own HOME; under CI=true a missing
    oras fails the test."""
    tools = Path(os.environ.get("SNEAKERNET_TRIXIE_TOOLS", "/opt/sneakernet/trixie-tools"))
    found = shutil.which("oras") or (str(tools / "usr/bin/oras") if (tools / "usr/bin/oras").is_file() else None)
    if found is None:
        engines.unavailable(f"oras is not installed (docker/scripts/install-deps.sh fetches it into {tools})")
    proc = subprocess.run([found, "pull", "--oci-layout", f"{layout}@{digest}", "-o", str(out)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
