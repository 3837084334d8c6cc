"""Make ``docker save`` archives in memory, in both layouts, for engine-free tests.

``classic``: Docker < 25 (``<id>/layer.tar``, ``<config-hex>.json``, ``manifest.json``,
``repositories``), members in lexical order as the daemon writes them.
``v25``: Docker 25+ (``blobs/sha256/<hex>`` holding uncompressed layers and JSON, ``index.json``,
``oci-layout`` and the legacy ``manifest.json`` whose paths point into ``blobs/``)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass


def layer_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FakeImage:
    tag: str
    layers: list[bytes]

    @property
    def config(self) -> bytes:
        return json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{sha(x)}" for x in self.layers]},
            "history": [{"created_by": f"layer {i}"} for i in range(len(self.layers))],
        }).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def docker_save(images: list[FakeImage], layout: str = "classic") -> bytes:
    members: dict[str, bytes] = {}
    manifest = []
    for image in images:
        cfg = image.config
        if layout == "classic":
            members[f"{sha(cfg)}.json"] = cfg
            names = []
            for i, layer in enumerate(image.layers):
                layer_id = sha(f"{sha(cfg)}-{i}".encode())
                members[f"{layer_id}/VERSION"] = b"1.0"
                members[f"{layer_id}/json"] = b"{}"
                members[f"{layer_id}/layer.tar"] = layer
                names.append(f"{layer_id}/layer.tar")
            manifest.append({"Config": f"{sha(cfg)}.json", "RepoTags": [image.tag], "Layers": names})
        else:
            members[f"blobs/sha256/{sha(cfg)}"] = cfg
            for layer in image.layers:
                members[f"blobs/sha256/{sha(layer)}"] = layer
            oci_manifest = json.dumps({
                "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": f"sha256:{sha(cfg)}", "size": len(cfg)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": f"sha256:{sha(x)}", "size": len(x)} for x in image.layers],
            }).encode()
            members[f"blobs/sha256/{sha(oci_manifest)}"] = oci_manifest
            manifest.append({"Config": f"blobs/sha256/{sha(cfg)}", "RepoTags": [image.tag],
                             "Layers": [f"blobs/sha256/{sha(x)}" for x in image.layers]})
    members["manifest.json"] = json.dumps(manifest).encode()
    if layout != "classic":
        members["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
        members["index.json"] = b'{"schemaVersion":2,"manifests":[]}'
    members["repositories"] = b"{}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(members):
            _add(tar, name, members[name])
    return buf.getvalue()


def sample_images() -> list[FakeImage]:
    base = layer_tar({"bin/tool": b"#!/bin/sh\necho tool\n" * 50, "etc/os-release": b"ID=fake\n"})
    empty = b"\0" * 1024
    top = layer_tar({"app/main.py": b"print('hi')\n" * 1000})
    return [FakeImage("fake/base:1", [base, empty]), FakeImage("fake/app:2", [base, empty, top])]
