"""Every shell command in README.md and docs/*.md works as written (issue 16, points 8 and 9).

The commands are read from the fenced code blocks (``json`` blocks aside). Each one is either RUN
here, in the order of its document, against images and bundles this test makes (the docs'
placeholders and example paths replaced by real ones), and must exit 0 (or the code the entry
says), or listed in SPECS with the reason it cannot run here (a GPU, a registry, ssh, another
engine). A command the docs gain that SPECS does not name fails the test, and so does an entry
whose command left the docs: the docs cannot drift silently. Blocks that are not commands
(diagrams, output, file formats) are named in NOT_COMMANDS.

Docker commands go to the private dockerd of the session (``docker_host``, via DOCKER_HOST);
``bundle``/``bundle-import``/``sneakernet-gpu-check`` run this checkout's code (shims on PATH)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from tests.kit import engines
from tests.kit.helpers import REPO, run_cli
from tests.kit.imagegen import layered_context, simple_context

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# --- extraction ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    doc: str  # README.md, docs/engines.md
    line: int
    block: int  # the fenced block's first line
    text: str  # continuation lines joined, trailing "# comment" removed

    @property
    def key(self) -> str:
        """The text with runs of blanks as one (docs align columns): how SPECS names it."""
        return re.sub(r"\s+", " ", self.text)


def fenced_blocks(path: Path) -> Iterator[Tuple[int, str, List[str]]]:
    """(line of the opening fence, info string, lines) of every fenced block."""
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, info, body = i + 1, m.group(1), []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        yield start, info, body


def _strip_comment(text: str) -> str:
    """Drop a trailing `# comment` (a # after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and text[i - 1] in " \t":
            return text[:i].rstrip()
    return text.rstrip()


def commands_of(path: Path) -> Iterator[Command]:
    doc = str(path.relative_to(REPO))
    for start, info, body in fenced_blocks(path):
        if info in ("json", "text") or (doc, body[0].strip() if body else "") in NOT_COMMANDS:
            continue
        current: Optional[List[object]] = None  # [line, text]
        pending = False  # the previous line ended with a backslash
        for n, raw in enumerate(body, start + 1):
            stripped = raw.strip()
            continues = current is not None and (pending or (raw[:1].isspace() and stripped[:1] in "[-"))
            if continues and current is not None:
                part = stripped
                pending = part.endswith("\\")
                current[1] = f"{current[1]} {part.rstrip(chr(92)).rstrip() if pending else part}"
                continue
            if current is not None:
                yield Command(doc, int(current[0]), start, _strip_comment(str(current[1])))  # type: ignore[arg-type]
                current = None
            if not stripped or stripped.startswith("#"):
                pending = False
                continue
            pending = stripped.endswith("\\")
            current = [n, stripped.rstrip("\\").rstrip() if pending else stripped]
        if current is not None:
            yield Command(doc, int(current[0]), start, _strip_comment(str(current[1])))  # type: ignore[arg-type]


def all_commands() -> List[Command]:
    return [c for p in DOCS for c in commands_of(p)]


# --- what each command is --------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    skip: str = ""  # why it cannot run here ("" = run it)
    rc: int = 0
    subs: Dict[str, str] = field(default_factory=dict)  # placeholder -> value, over PLACEHOLDERS
    setup: str = ""  # shell run first (in the world), e.g. to remove what an earlier command made
    fresh: bool = False  # a new world first: the command is an alternative to the one before
    cwd: str = "."  # relative to the world
    docker: bool = True  # False: no Docker reachable (DOCKER_HOST nowhere, `docker` fails)


def run(**kw: object) -> Spec:
    return Spec(**kw)  # type: ignore[arg-type]


def skip(reason: str) -> Spec:
    return Spec(skip=reason)


GPU = "GPU-only: qualifies a GPU host (CPU and GPU-less paths: tests/test_smoke_*.py)"
CONTAINERD = "needs a containerd (tests/test_containerd_sink.py, test_delta_containerd.py)"
PODMAN = "needs a podman store (tests/test_engine_sinks.py)"
REGISTRY = "needs a registry (tests/test_registry_push.py, test_delta_registry.py)"
LISTS = "needs the listed images (tests/test_images_from.py exports plain, hauler and zarf lists)"
MULTI = "needs a multi-platform image (tests/test_multiplatform.py builds one and exports it)"
REGISTRY_SRC = "needs a registry holding the image (tests/test_export_registry.py)"
SSH = "needs ssh to another host (tests/test_registry_push.py runs --ssh against a private sshd)"
SERVE_CERT = ("makes a certificate pair by hand on a host with openssl; --tls-self-signed runs the same calls "
              "(importer/serve/selfsigned.py, tests/test_serve_tls.py)")
SERVE = "serves until stopped (tests/test_serve.py; pulls by every engine: tests/test_serve_engines.py)"
FLEET = ("runs on the nodes of a cluster (tests/test_check_only.py, tests/test_fleet_report.py run each "
         "command against private engines)")
FIRST_RUN = ("run as a block by tests/test_importer_copies.py::test_first_run_check_by_hand_on_a_tar, against a "
             "signed tar with a good and with a swapped importer beside it")
FILES = ("a model folder and bundles at those paths (tests/test_files.py runs each shape through the CLI and "
         "the pyz on a folder the kit makes)")
INSTALL = "run as written by tests/test_install.py, in a clean copy of the checkout (pip from PyPI)"
NEW = "{W}/new.bundle"
HELM = "needs helm and a chart (no helm binary is packaged; tests/data/ holds charts rendered by hand)"
K8S = ("needs the images the manifests name in their registries and node inventories (tests/test_pull_check.py "
       "exports them from a loopback registry and checks; tests/test_k8s_images.py --why)")
CHARTS = "a chart package (tests/test_helm_charts.py exports charts and reads them as helm pull does)"
SUPPLY = ("needs a registry holding signed images (tests/test_supply_chain.py signs with cosign and "
          "cryptography, exports, inspects and imports with --require-signed)")
SIGNED_FILES = ("needs a PEM signing key: tests/test_files_signed.py signs files with openssl's P-256 and Ed25519 "
                "keys, imports them with --require-signed and checks the pushed and served ones with cosign verify")
BENCH = ("a benchmark of tens of minutes to hours on a quiet machine (its results are the tables of "
         "docs/benchmarks.md); tests/test_bench.py runs bench/run.py in --small mode with --layers and --cold")
BOOTSTRAP = ("needs images.txt's registries; tests/test_bootstrap_formats.py exports --for k3s/rke2/apptainer from "
             "the kit's layout, imports the k3s archive with ctr and reads the apptainer files with skopeo")

NOT_COMMANDS: Dict[Tuple[str, str], str] = {
    ("README.md", "online build host                                   offline GPU host"):
        "a diagram; its two commands run in the quickstart and in docs/bundle-format.md",
    ("docs/bundle-format.md", "train.bundle/"): "a file tree",
    ("docs/bundle-format.md", "<64 lowercase hex>  <path>"): "the SHA256SUMS line format",
    ("docs/deltas.md", "error[delta-base-missing]: checking the base of a delta bundle: expected the registry "
     "127.0.0.1:5000 to hold 2 layer(s) the bundle leaves out, found 2 missing"): "an error message",
    ("docs/errors.md", '{"ok": false, "error": {"id": "bundle-not-found", "exitCode": 2, "message": "...", '
     '"context": null, "hint": "..."}}'): "the JSON error shape",
    ("docs/errors.md", "error[digest-mismatch]: checking layer 3/7 of registry.example/team/app:1.0: expected "
     "digest sha256:ab12…, found sha256:9f00…"): "an error message",
    ("docs/kubernetes.md", "mirrors:"): "a registries.yaml that bundle export --for k3s writes",
}

SPECS: Dict[str, Spec] = {
    # docs/benchmarks.md: issue 44's cases (bench/run.py, not a test)
    "python3 bench/run.py --size 10G --layers 80 --runs 1 --only export,import --stores classic": skip(BENCH),
    "python3 bench/run.py --size 10G --layers 80 --runs 1 --only export,import --stores containerd --cold "
    "--cold-memory 1G": skip(BENCH),
    "python3 bench/run.py --size 10G --layers 80 --runs 1 --only export,import --stores classic "
    "--recipe incompressible": skip(BENCH),
    "python3 bench/run.py --size 10G --layers 80 --runs 1 --only export,import --stores containerd "
    "--recipe incompressible": skip(BENCH),
    "python3 bench/run.py --size 1G --layers 100 --runs 3 --only export,import": skip(BENCH),
    "python3 bench/run.py --size 1G --layers 100 --runs 3 --only export,import --recipe incompressible": skip(BENCH),
    # README.md: install (run as written, in a clean copy of the checkout: tests/test_install.py)
    "python3 -m venv .venv": skip(INSTALL),
    ".venv/bin/python3 -m pip install .": skip(INSTALL),
    ". .venv/bin/activate": skip(INSTALL),
    # README.md: quickstart without Docker (a docker-archive by hand, skopeo, --engine oci)
    "mkdir -p hello/rootfs && echo 'hello from the air gap' > hello/rootfs/hello.txt": run(docker=False),
    "tar -C hello/rootfs -cf hello/layer.tar hello.txt": run(docker=False),
    "printf '{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{\"type\":\"layers\",\"diff_ids\":"
    "[\"sha256:%s\"]}}' \"$(sha256sum hello/layer.tar | cut -d' ' -f1)\" > hello/config.json": run(docker=False),
    "printf '[{\"Config\":\"config.json\",\"RepoTags\":[\"demo/hello:1\"],\"Layers\":[\"layer.tar\"]}]' "
    "> hello/manifest.json": run(docker=False),
    "tar -C hello -cf hello.tar config.json manifest.json layer.tar": run(docker=False),
    "skopeo copy docker-archive:hello.tar oci:hello.oci:demo/hello:1": run(docker=False),
    "bundle export oci:hello.oci:demo/hello:1 -o hello.bundle": run(docker=False),
    "python3 hello.bundle/bundle-import.pyz hello.bundle --verify-only": run(docker=False),
    "python3 hello.bundle/bundle-import.pyz hello.bundle --engine oci --oci-dir hello.out": run(docker=False),
    "skopeo inspect oci:hello.out:demo/hello:1": run(docker=False),
    # README.md: quickstart with Docker
    "docker load -i hello.tar": run(),
    "bundle export demo/hello:1 -o hello-docker.bundle": run(),
    "docker rmi demo/hello:1": run(),
    "python3 hello-docker.bundle/bundle-import.pyz hello-docker.bundle --verify": run(),
    "docker image inspect --format '{{.Id}}' demo/hello:1": run(),
    # README.md: set up, use
    "bash docker/scripts/demo.sh": skip("installs packages (apt, pip) and starts its own dockerd; the demo of a "
                                        "fresh machine, not of this checkout's test session"),
    "bash docker/scripts/test.sh": skip("the whole suite, this test included"),
    "bundle export IMAGE... -o DIR [--schema 1|2|3] [--compression auto|zstd|gzip] [--level N] "
    "[--docker-host URL] [--json]": run(subs={"DIR": NEW}, setup="rm -rf {W}/new.bundle"),
    "bundle export IMAGE... --have have.json -o DIR": run(subs={"IMAGE...": "my/train:2", "DIR": NEW},
                                                          setup="rm -rf {W}/new.bundle"),
    "bundle export containerd:REF... --address SOCKET [--namespace NS] -o DIR": skip(CONTAINERD),
    "bundle export oci:LAYOUT[:REF] -o DIR": run(subs={"DIR": NEW}, setup="rm -rf {W}/new.bundle"),
    "bundle export docker://HOST[:PORT]/REPO:TAG -o DIR": skip(REGISTRY_SRC),
    "bundle export SRC... --all-platforms -o DIR": skip(MULTI),
    "bundle export docker://registry.internal:5000/team/train:7 --all-platforms -o /media/usb/train.bundle":
        skip(REGISTRY_SRC),
    "bundle export oci:/srv/layout:team/app:1 --platform linux/amd64,linux/arm64 -o DIR": skip(MULTI),
    "bundle export --images-from images.txt -o DIR": skip(LISTS),
    "bundle export --images-from images.txt -o /media/usb/stack.bundle": skip(LISTS),
    "bundle export --images-from hauler-manifest.yaml --images-from zarf.yaml -o /media/usb/platform.bundle":
        skip(LISTS),
    "bundle export docker://registry.internal:5000/team/train:7 -o /media/usb/train.bundle": skip(REGISTRY_SRC),
    "bundle export docker://registry.internal:5000/team/train@sha256:4f1c... --tag team/train:7 -o DIR":
        skip(REGISTRY_SRC),
    # the test's layout is amd64 only: --platform linux/arm64 of it is refused (platform-not-found)
    "bundle export oci:LAYOUT:REF --platform linux/arm64 -o DIR": run(subs={"REF": "my/train:1", "DIR": NEW},
                                                                     setup="rm -rf {W}/new.bundle", rc=5),
    # docs/engines.md: one platform of an index (tests/test_platforms.py exports each platform of a
    # two-platform index); the test's layout is amd64 only, and --platform linux/arm64 of it is
    # refused (it used to pass here)
    "bundle export oci:/srv/layout:team/app:1 --platform linux/arm64 -o /media/usb/app-arm64.bundle": skip(
        MULTI.replace("tests/test_multiplatform.py builds one", "tests/test_platforms.py builds one")),
    "bundle export SRC... --tag REF... -o DIR": run(subs={"SRC...": "oci:{W}/layout:my/train:1",
                                                          "REF...": "local/renamed:1", "DIR": NEW},
                                                    setup="rm -rf {W}/new.bundle"),
    "bundle inspect DIR [--json]": run(),
    "bundle-import DIR [--verify] [--engine docker] [--docker-host URL] [--receipt PATH] [--force] [--json]": run(),
    "bundle-import DIR --verify-only [--json]": run(),
    "bundle-import DIR --verify --deep --engine containerd --address SOCKET --namespace k8s.io "
    "[--snapshotter overlayfs]": skip(CONTAINERD),
    "bundle-import DIR --verify --deep --engine podman --podman-root DIR --podman-runroot DIR "
    "[--storage-driver overlay]": skip(PODMAN),
    "bundle-import DIR --engine oci --oci-dir OUT": run(subs={"OUT": "{W}/out.oci"}),
    "bundle-import --inventory [--engine ...] > have.json": run(),
    "bundle-import --inventory --registry HOST:PORT[/NS] > have.json": skip(REGISTRY),
    "python3 -I DIR/bundle-import.pyz DIR --verify": run(),
    "bundle pack DIR FILE.tar [--split 3900M]": run(),
    "bundle export IMAGE... --archive FILE.tar [--split SIZE]": run(subs={"FILE.tar": "{W}/new2.tar"}),
    "bundle-import FILE.tar.parts.json --verify": run(),
    "bundle copy SRC DST [--bwlimit RATE]": run(),
    "bundle push BUNDLE REGISTRY[/NS] [--ssh USER@HOST [--ssh-port N] [--identity FILE]] [--insecure]":
        skip(REGISTRY),
    "bundle-import BUNDLE --verify --engine registry --registry HOST:PORT[/NS]": skip(REGISTRY),
    "bundle-import serve BUNDLE [--listen ADDR:PORT]": skip(SERVE),
    "bundle push BUNDLE REGISTRY[/NS] --compression gzip": skip(REGISTRY + "; recompressed for Docker 20.10: "
                                                               "tests/test_cluster_path.py"),
    "bundle-import serve BUNDLE --tls-self-signed DIR [--htpasswd FILE] [--compression gzip]":
        skip(SERVE + "; over TLS with a login: tests/test_serve_tls.py, tests/test_serve_engines.py"),
    "bundle-import serve BUNDLE --print-node-config": skip("prints node files for a served bundle: "
                                                          "tests/test_serve_tls.py runs it"),
    "bundle export IMAGE... --have have.json --allow-unfit -o DIR": skip("needs a GPU host's inventory: "
                                                                         "tests/test_gpufit.py exports against six"),
    "bundle-import DIR --require-fit --require-signed cosign.pub":
        skip("tests/test_gpufit.py (--require-fit) and tests/test_supply_chain.py (--require-signed)"),
    "bundle export --files DIR --artifact-ref NAME:TAG --sign-artifacts-key artifacts.key -o OUT": skip(SIGNED_FILES),
    "bundle-import OUT --files-to DIR --require-signed artifacts.pub": skip(SIGNED_FILES),
    "bundle keygen -o PREFIX [--passphrase-stdin]": run(subs={"PREFIX": "{W}/keys/new"}),
    "bundle export IMAGE... -o DIR --sign-key PREFIX.key [--passphrase-stdin]": run(subs={"DIR": NEW},
                                                                                  setup="rm -rf {W}/new.bundle"),
    "bundle sign DIR --sign-key PREFIX.key": run(),
    "bundle-import DIR --trust PREFIX.pub [--require-signature] [--wait-lock SECONDS]":
        run(subs={"DIR": "{W}/signed.bundle"}),
    "bundle-import DIR --verify --smoke [--device cuda|cpu] [--gpus 0,1] [--env NAME=VALUE]...": skip(GPU),
    "bundle-import smoke IMAGE [--device cuda|cpu] [--no-container] [--restart] [--receipt PATH] [--json]":
        skip(GPU),
    "sneakernet-gpu-check [RECEIPT] [--gpus 0,1]": skip(GPU + "; its arguments: tests/test_smoke_suite.py"),
    # docs/bundle-format.md
    "skopeo inspect oci:/media/usb/train.bundle:my/train:1": run(),
    "skopeo inspect --raw oci:/media/usb/train.bundle:my/train:1": run(),
    "bundle export registry.example/team/app:1.0 --compression gzip -o /media/usb/app.bundle": run(),
    "skopeo copy --dest-daemon-host unix:///var/run/docker.sock "
    "oci:/media/usb/app.bundle:registry.example/team/app:1.0 docker-daemon:registry.example/team/app:1.0": run(),
    "python3 /media/usb/train.bundle/bundle-import.pyz /media/usb/train.bundle --verify": run(),
    # docs/deltas.md
    "python3 /media/usb/train.bundle/bundle-import.pyz --inventory > have.json": run(),
    "bundle export my/train:2 --have have.json -o /media/usb/train-2.delta": run(setup="rm -rf {W}/usb/train-2.delta"),
    "python3 /media/usb/train-2.delta/bundle-import.pyz /media/usb/train-2.delta --verify": run(),
    "bundle-import --inventory --engine containerd --namespace k8s.io > have.json": skip(CONTAINERD),
    "python3 /media/usb/train-2.delta/bundle-import.pyz /media/usb/train-2.delta --engine containerd "
    "--namespace k8s.io": skip(CONTAINERD),
    "bundle-import --inventory --registry 127.0.0.1:5000 > have.json": skip(REGISTRY),
    "python3 /media/usb/train-2.delta/bundle-import.pyz /media/usb/train-2.delta --registry 127.0.0.1:5000":
        skip(REGISTRY),
    # docs/engines.md
    "bundle-import BUNDLE --engine docker [--docker-host URL] [--verify] [--deep]": run(),
    "bundle-import BUNDLE --engine containerd --address SOCKET --namespace NS [--snapshotter NAME]": skip(CONTAINERD),
    "bundle-import BUNDLE --engine podman --podman-root DIR --podman-runroot DIR [--storage-driver NAME]":
        skip(PODMAN),
    "bundle-import BUNDLE --engine oci --oci-dir DIR": run(subs={"DIR": "{W}/out.oci"}),
    "bundle-import --inventory [--engine ... and its options] [--json]": run(),
    "bundle-import --inventory --engine containerd --address /run/containerd/containerd.sock --namespace k8s.io "
    "> have.json": skip(CONTAINERD),
    # docs/qualification.md, docs/validation.md
    "bundle-import smoke IMAGE [--device cuda|cpu] [--no-container] [--receipt PATH] [--gpus 0,1] "
    "[--env NAME=VALUE]... [--env-file FILE] [--restart] [--docker-host URL] [--timeout S] [--rank-timeout S] "
    "[--nproc N] [--gates LIST] [--volume HOST:CONTAINER]... [--python PATH] [--json]": skip(GPU),
    "bundle-import smoke IMAGE --engine containerd [--address SOCKET] [--namespace NS] [--snapshotter NAME]":
        skip(GPU + "; on containerd's CPU path: tests/test_smoke_engines.py"),
    "bundle-import smoke IMAGE --engine podman [--podman-root DIR] [--podman-runroot DIR] [--storage-driver NAME] "
    "[--ulimit NAME=SOFT[:HARD]]": skip(GPU + "; on podman's CPU path: tests/test_smoke_engines.py"),
    "bundle-import BUNDLE --verify --smoke [the same smoke flags] [--smoke-receipt PATH]": skip(GPU),
    "python3 BUNDLE/bundle-import.pyz smoke IMAGE ...": skip(GPU),
    "sneakernet-gpu-check [RECEIPT] [smoke flags]": skip(GPU),
    "sneakernet-gpu-check /tmp/qualification.json": skip(GPU),
    "sneakernet-gpu-check /tmp/q01.json --gpus 0,1 --env NCCL_NVLS_ENABLE=0": skip(GPU),
    "sneakernet-gpu-check --gpus 0,1": skip(GPU + "; without GPUs: tests/test_smoke_suite.py"),
    "python3 BUNDLE/bundle-import.pyz BUNDLE --verify --smoke --smoke-receipt /tmp/qualification.json": skip(GPU),
    # docs/security.md
    "printf '%s\\n' \"$PASSPHRASE\" | bundle keygen -o /secure/sneakernet-2025 --passphrase-stdin": run(),
    "sed -n 's/^ \"signature\": \"\\(.*\\)\"$/\\1/p' bundle.json.sig | base64 -d > /tmp/sig.bin":
        run(cwd="signed.bundle"),
    "openssl pkeyutl -verify -pubin -inkey /etc/sneakernet/trusted.d/publisher.pub -rawin -in bundle.json "
    "-sigfile /tmp/sig.bin": run(cwd="signed.bundle"),
    "sha256sum -c --strict SHA256SUMS": run(cwd="signed.bundle"),
    "grep -q \"$(sha256sum bundle-import.pyz | cut -d' ' -f1)\" bundle.json && echo \"importer pinned\"":
        run(cwd="signed.bundle"),
    # docs/security.md, "First run" (a signed tar, a good and a swapped importer beside it)
    "cd /media/usb": skip(FIRST_RUN),
    "tar --occurrence=1 -xOf train.tar bundle.json > /tmp/bundle.json": skip(FIRST_RUN),
    "tar --occurrence=1 -xOf train.tar bundle.json.sig > /tmp/bundle.json.sig": skip(FIRST_RUN),
    "sed -n 's/^ \"signature\": \"\\(.*\\)\"$/\\1/p' /tmp/bundle.json.sig | base64 -d > /tmp/sig.bin":
        skip(FIRST_RUN),
    "openssl pkeyutl -verify -pubin -inkey /etc/sneakernet/trusted.d/publisher.pub -rawin -in /tmp/bundle.json "
    "-sigfile /tmp/sig.bin": skip(FIRST_RUN),
    "grep -q \"$(sha256sum bundle-import.pyz | cut -d' ' -f1)\" /tmp/bundle.json && echo \"importer pinned\"":
        skip(FIRST_RUN),
    # docs/transfer.md
    # each block as a reader pastes it: no set-up removing what an earlier command wrote
    # (the template's own usb/train.tar parts, made for the other docs, are not on the reader's stick)
    "bundle pack /data/train.bundle /media/usb/whole/train.tar": run(setup="rm -f {W}/usb/train.tar*"),
    "bundle pack /data/train.bundle /media/usb/fat32/train.tar --split 3900M": run(),
    "bundle export my/train:1 --archive /media/usb/train.tar --split 3900M": run(),
    "python3 /media/usb/bundle-import.pyz /media/usb/train.tar.parts.json --verify-only": run(),
    "python3 /media/usb/bundle-import.pyz /media/usb/train.tar.parts.json --verify": run(),
    "bundle export my/train:1 my/eval:1 --archive /media/usb/train.tar --split 3900M --force": run(),
    "sync; umount /media/usb": skip("unmounts the USB disk"),
    "python3 /media/usb/bundle-import.pyz copy /media/usb/train.tar.parts.json /data/incoming --replace": run(),
    "python3 /data/incoming/bundle-import.pyz /data/incoming/train.tar.parts.json --verify": run(),
    "bundle copy SRC DST [--bwlimit RATE] [--json]": run(fresh=True),
    "python3 bundle-import.pyz copy SRC DST [--bwlimit RATE] [--json]": run(fresh=True, cwd="usb"),
    "rsync -a --partial --append-verify /data/train.bundle/ offline:/data/train.bundle/": skip(SSH),
    "scp -r /data/train.bundle offline:/data/": skip(SSH),
    "rsync -a --partial --progress /media/out/train.tar.part[0-9]* /media/out/train.tar.parts.json "
    "/media/out/bundle-import.pyz offline:/data/incoming/": skip(SSH),
    "ssh offline python3 /data/incoming/bundle-import.pyz /data/incoming/train.tar.parts.json --verify-only":
        skip(SSH),
    "bundle push BUNDLE REGISTRY[/NAMESPACE] [--insecure] [--concurrency N] [--chunk-size SIZE] "
    "[--username USER --password-stdin] [--json]": skip(REGISTRY),
    "bundle export my/train:1 -o /data/train.bundle --compression gzip": run(setup="rm -rf {W}/data/train.bundle"),
    "bundle push /data/train.bundle 127.0.0.1:5000/team": skip(REGISTRY),
    "bundle push /data/train.bundle 127.0.0.1:5000/team --ssh ops@offline-gw [--ssh-port 2222] "
    "[--identity ~/.ssh/id_ed25519]": skip(SSH),
    "ssh -N -o ExitOnForwardFailure=yes -L 127.0.0.1:15000:127.0.0.1:5000 ops@offline-gw &": skip(SSH),
    "TUNNEL=$!": skip(SSH),
    "bundle push /data/train.bundle 127.0.0.1:15000/team": skip(SSH),
    "kill \"$TUNNEL\"": skip(SSH),
    "python3 bundle-import.pyz train.tar.parts.json --verify --engine registry --registry 127.0.0.1:5000/team "
    "[--insecure]": skip(REGISTRY),
    "bundle-import --inventory --registry 127.0.0.1:5000[/team] > have.json": skip(REGISTRY),
    "docker pull 127.0.0.1:5000/team/my/train:1": skip(REGISTRY),
    "docker pull registry.internal:5000/team/my/train:1": skip(REGISTRY),
    "ctr -n k8s.io images pull --plain-http registry.internal:5000/team/my/train:1": skip(REGISTRY),
    "nerdctl --insecure-registry pull registry.internal:5000/team/my/train:1": skip(REGISTRY),
    "bundle-import serve BUNDLE [--listen ADDR:PORT] [--compression keep|gzip] [--trust PUBKEY] "
    "[--require-signature] [--shallow] [--quiet] [--json]": skip(SERVE),
    "python3 /data/incoming/bundle-import.pyz serve /data/incoming/train.tar.parts.json --listen 0.0.0.0:5000":
        skip(SERVE),
    "python3 /data/incoming/bundle-import.pyz serve /data/incoming/train.tar.parts.json --listen 0.0.0.0:5000 "
    "--tls-self-signed /data/serve-tls --tls-name gpu-gw --tls-name 10.0.0.5":
        skip(SERVE + "; TLS: tests/test_serve_tls.py"),
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.crt -days 3650 "
    "-subj \"/CN=serve CA\" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign":
        skip(SERVE_CERT),
    "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key -out server.csr "
    "-subj /CN=gpu-gw": skip(SERVE_CERT),
    "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -set_serial 1 -days 825 -extfile <(printf "
    "'subjectAltName=DNS:gpu-gw,IP:10.0.0.5\\nextendedKeyUsage=serverAuth\\n') -out server.crt": skip(SERVE_CERT),
    "python3 -c 'import base64,getpass,hashlib,os; s=os.urandom(16); r=600000; b=lambda x: "
    "base64.b64encode(x).decode().rstrip(\"=\").replace(\"+\",\".\"); print(\"alice:$pbkdf2-sha256$%d$%s$%s\" % "
    "(r, b(s), b(hashlib.pbkdf2_hmac(\"sha256\", getpass.getpass().encode(), s, r))))' >> /data/serve-htpasswd":
        skip("asks for a password on the terminal; tests/test_serve_tls.py serves lines of this format "
             "(importer/serve/htpasswd.pbkdf2_line)"),
    "python3 /data/incoming/bundle-import.pyz serve /data/incoming/train.tar.parts.json --listen 0.0.0.0:5000 "
    "--tls-self-signed /data/serve-tls --tls-name gpu-gw --print-node-config":
        skip("needs the example's bundle; tests/test_serve_tls.py prints and checks the node configuration, "
             "tests/test_serve_engines.py pulls through it"),
    "python3 bundle-import.pyz serve /data/train.bundle --print-node-config --node-registry "
    "registry.internal:5000/team --node-ca /etc/pki/site-ca.crt --json":
        skip("needs the example's bundle; tests/test_serve_tls.py runs --node-registry"),
    "docker pull 127.0.0.1:5000/my/train:1": skip(SERVE),
    "docker pull gpu-gw:5000/my/train:1": skip(SERVE),
    "podman pull --tls-verify=false gpu-gw:5000/my/train:1": skip(SERVE),
    "ctr -n k8s.io images pull --plain-http gpu-gw:5000/my/train:1": skip(SERVE),
    "skopeo inspect --tls-verify=false docker://gpu-gw:5000/my/train:1": skip(SERVE),
    # docs/fleet.md: many hosts, their launchers, a registry (each part runs for real in
    # tests/test_check_only.py, test_fleet_report.py, test_serve_engines.py, test_smoke_engines.py)
    "python3 bundle-import.pyz /data/train.bundle --verify-only": skip(REGISTRY + "; the step before a push"),
    "bundle push /data/train.bundle registry.internal:5000/team": skip(REGISTRY),
    # docs/fleet.md, old Docker and several platforms: run for real in tests/test_cluster_path.py
    "python3 /data/incoming/bundle-import.pyz serve /data/incoming/train.tar.parts.json --listen 0.0.0.0:5000 "
    "--compression gzip": skip(SERVE + "; tests/test_cluster_path.py runs it with Docker 20.10"),
    "bundle push /data/train.bundle registry.internal:5000/team --compression gzip":
        skip(REGISTRY + "; tests/test_cluster_path.py runs it against a docker-registry"),
    "python3 /data/incoming/bundle-import.pyz /data/incoming/train.tar.parts.json --engine registry --registry "
    "registry.internal:5000/team --compression gzip":
        skip(REGISTRY + "; tests/test_offline_registry.py runs it into a docker-registry, pulled by Docker 20.10"),
    "docker pull --platform linux/arm64 gpu-gw:5000/my/train:1": skip(SERVE + "; tests/test_cluster_path.py"),
    "skopeo inspect --raw oci:/data/train.bundle:my/train:1":
        skip("an --all-platforms bundle; tests/test_cluster_path.py runs it on one"),
    "python3 bundle-import.pyz /shared/train.bundle --check-only --name-prefix registry.internal:5000/team "
    "--receipt /shared/receipts/node01/check.json": skip(FLEET),
    "python3 bundle-import.pyz /shared/train.bundle --check-only --engine containerd --namespace k8s.io "
    "--name-prefix registry.internal:5000/team": skip(FLEET),
    "python3 bundle-import.pyz smoke registry.internal:5000/team/my/train:1 "
    "--receipt /shared/receipts/node01/smoke.json": skip(GPU),
    "srun -N 16 --ntasks-per-node=1 sh -c 'python3 /shared/bundle-import.pyz /shared/train.bundle --check-only "
    "--name-prefix registry.internal:5000/team --receipt /shared/receipts/$(hostname)/check.json'": skip(FLEET),
    "srun -N 16 --ntasks-per-node=1 --gpus-per-node=8 sh -c 'python3 /shared/bundle-import.pyz smoke "
    "registry.internal:5000/team/my/train:1 --receipt /shared/receipts/$(hostname)/smoke.json'": skip(FLEET),
    "pdsh -w 'node[01-16]' 'python3 /shared/bundle-import.pyz /shared/train.bundle --check-only --name-prefix "
    "registry.internal:5000/team --receipt /shared/receipts/$(hostname)/check.json'": skip(FLEET),
    "python3 /shared/bundle-import.pyz sign-receipt /shared/receipts/node01/check.json "
    "--sign-key /secure/fleet.key": skip(FLEET),
    "bundle sign-receipt /shared/receipts/node01/smoke.json --sign-key /secure/fleet.key": skip(FLEET),
    # docs/gpu-fit.md: the agreement run needs a GPU host (tests/test_gpu_fit_agreement.py: the table, a fake engine)
    "python3 scripts/gpu-fit-agreement.py nvidia/cuda:12.4.1-runtime-ubuntu22.04 "
    "nvidia/cuda:13.0.0-runtime-ubuntu24.04 my/train:1 --cuda-probe --out agreement.md --json agreement.json":
        skip(GPU),
    "python3 bundle-import.pyz fleet-report /shared/receipts --hosts 'node[01-16]' --require image,smoke "
    "--bundle /shared/train.bundle": skip(FLEET),
    "python3 bundle-import.pyz fleet-report /shared/receipts --expect-hosts hosts.txt --trust /secure/fleet.pub "
    "--json > fleet.json": skip(FLEET),
    # docs/supply-chain.md: a registry holding signed images (tests/test_supply_chain.py runs each step)
    "bundle inspect /media/usb/train.bundle": skip(SUPPLY),
    "bundle export docker://registry.internal:5000/team/train:7 --require-signed cosign.pub -o /media/usb/train.bundle":
        skip(SUPPLY),
    "python3 /media/usb/train.bundle/bundle-import.pyz /media/usb/train.bundle --require-signed cosign.pub":
        skip(SUPPLY),
    "COSIGN_PASSWORD=... cosign generate-key-pair": skip(SUPPLY),
    "bundle push /media/usb/train.bundle registry.local:5000/team": skip(SUPPLY),
    "cosign verify --key cosign.pub --insecure-ignore-tlog=true registry.local:5000/team/train@sha256:...":
        skip(SUPPLY),
    "cosign sign --key cosign.key --tlog-upload=false --allow-insecure-registry --yes "
    "127.0.0.1:5000/team/train@sha256:...": skip(SUPPLY),
    # docs/files.md: a model folder and images at those paths (tests/test_files.py runs each shape through the
    # CLI and the pyz: --files with --model, --file PATH=NAME, files beside an image, --files-only, tar and parts)
    "bundle export --files ./llama-3.1-8b --artifact-ref models/llama:3.1 --model -o /media/usb/llama.bundle":
        skip(FILES),
    "bundle export my/train:1 --files ./weights --artifact-ref models/train-weights:7 -o train.bundle": skip(FILES),
    "bundle export --file ./data.parquet --file ./notes.txt=docs/README.txt --artifact-ref data/set:1 "
    "-o data.bundle": skip(FILES),
    "python3 /media/usb/llama.bundle/bundle-import.pyz /media/usb/llama.bundle --files-to /srv/models/llama":
        skip(FILES),
    "python3 train.bundle/bundle-import.pyz train.bundle --files-to /srv/weights": skip(FILES),
    "python3 train.bundle/bundle-import.pyz train.bundle --files-to /srv/weights --files-only": skip(FILES),
    "python3 bundle-import.pyz llama.tar.parts.json --files-to /srv/models/llama": skip(FILES),
    # docs/files.md, Deltas: tests/test_files_delta.py runs the round trip (inventory, --have, --files-to --force)
    "python3 bundle-import.pyz --inventory --files-to /srv/models/llama > have.json": skip(FILES),
    "python3 llama-3.1.bundle/bundle-import.pyz llama-3.1.bundle --inventory --files-to /srv/models/llama "
    "> have.json": skip(FILES),
    "bundle export --files ./llama-3.2 --artifact-ref models/llama:3.2 --model --have have.json -o llama-3.2.delta":
        skip(FILES),
    "python3 llama-3.2.delta/bundle-import.pyz llama-3.2.delta --files-to /srv/models/llama --force": skip(FILES),
    # docs/files.md, --as-image: tests/test_files_asimage.py exports one and loads it into Docker
    "bundle export --files ./llama-3.1-8b --artifact-ref models/llama:3.1 --as-image -o /media/usb/llama-image.bundle":
        skip(FILES),
    # docs/kubernetes.md
    "python3 bundle-import.pyz --inventory --engine containerd > node-a.json": skip(CONTAINERD),
    "helm template gpu-operator nvidia/gpu-operator --version v25.3.4 -n gpu-operator > rendered.yaml": skip(HELM),
    "helm template web ./web -n shop >> rendered.yaml": skip(HELM),
    "bundle export --images-from-manifests rendered.yaml --have node-a.json --have node-b.json -o cluster.bundle":
        skip(K8S),
    "bundle export --images-from-manifests rendered.yaml --have node-a.json --why "
    "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04": skip(K8S),
    "bundle check --manifests rendered.yaml --against cluster.bundle --have node-a.json --have node-b.json":
        skip(K8S),
    "helm package ./web": skip(HELM),
    "bundle export --images-from-manifests rendered.yaml --chart web-1.2.0.tgz --chart gpu-operator-v25.3.4.tgz "
    "--have node-a.json -o cluster.bundle": skip(CHARTS),
    "helm pull oci://MIRROR:5000/charts/web --version 1.2.0 --plain-http": skip(HELM),
    "helm install web oci://MIRROR:5000/charts/web --version 1.2.0 --plain-http": skip(HELM),
    "bundle-import serve cluster.bundle --listen 0.0.0.0:5000 --compression gzip": skip(CHARTS),
    "enroot import docker://MIRROR:5000#nvidia/cuda:12.4.1-base-ubuntu22.04": skip("no enroot here (text only)"),
    "bundle export --images-from images.txt --all-platforms -o cluster.bundle --for k3s --serve-address "
    "10.0.0.5:5000": skip(BOOTSTRAP),
    "bundle export --images-from images.txt -o hpc.bundle --for apptainer": skip(BOOTSTRAP),
    "apptainer build cuda.sif oci-archive:nvcr.io_nvidia_cuda_12.4.1-base-ubuntu22.04.oci.tar":
        skip("no apptainer here (tests/test_bootstrap_formats.py reads the file with skopeo)"),
}

# The docs' placeholders (whole words) and example paths, and what stands for them here.
PLACEHOLDERS: Dict[str, str] = {
    "FILE.tar.parts.json": "{W}/usb/train.tar.parts.json",
    "FILE.tar": "{W}/new.tar",
    "PREFIX.key": "{W}/keys/publisher.key",
    "PREFIX.pub": "{W}/keys/publisher.pub",
    "PREFIX": "{W}/keys/publisher",
    "IMAGE...": "my/train:1",
    "IMAGE": "my/train:1",
    "LAYOUT": "{W}/layout",
    "DIR": "{W}/train.bundle",
    "BUNDLE": "{W}/train.bundle",
    "SRC": "{W}/train.bundle",
    "DST": "{W}/copy.bundle",
    "SIZE": "256K",
}
PATHS: List[Tuple[str, str]] = [
    ("unix:///var/run/docker.sock", "{DOCKER_HOST}"),
    ("/etc/sneakernet/trusted.d/", "{W}/keys/"),
    ("/media/usb/", "{W}/usb/"),
    ("/media/out/", "{W}/usb/"),
    ("/data/", "{W}/data/"),
    ("/secure/", "{W}/secure/"),
    ("/tmp/", "{W}/tmp/"),
]


def concrete(cmd: str, spec: Spec, world: Path, docker_host: str) -> str:
    """The command as this test runs it: optional [groups] dropped, placeholders and paths replaced."""
    text = cmd
    while True:  # innermost [--opt], [:REF], [/NS], [NAME] first; a `...` after a group repeats it: gone too
        new = re.sub(r"\s*\[[-:/A-Z][^\[\]]*\](?:\.\.\.)?", "", text)
        if new == text:
            break
        text = new
    for old, new_value in PATHS:
        text = text.replace(old, new_value)
    table = {**PLACEHOLDERS, **spec.subs}
    for name in sorted(table, key=len, reverse=True):
        text = re.sub(rf"(?<![\w./-]){re.escape(name)}(?![\w.])" if not name.endswith("...")
                      else rf"(?<![\w./-]){re.escape(name)}", table[name].replace("\\", "\\\\"), text)
    return text.replace("{W}", str(world)).replace("{DOCKER_HOST}", docker_host)


# --- the classification (no engine) ----------------------------------------------------------

def test_every_docs_command_is_run_or_listed_with_a_reason() -> None:
    found = all_commands()
    assert len(found) > 80  # the extraction reads the docs (a broken parser finds nothing)
    texts = {c.key for c in found}
    unlisted = [f"{c.doc}:{c.line}: {c.key}" for c in found if c.key not in SPECS]
    assert not unlisted, "commands in the docs that this test neither runs nor lists with a reason:\n" + \
        "\n".join(unlisted)
    stale = [t for t in SPECS if t not in texts]
    assert not stale, "SPECS names commands the docs no longer have:\n" + "\n".join(stale)
    blocks = {(str(p.relative_to(REPO)), b[0].strip()) for p in DOCS for _, _, b in fenced_blocks(p) if b}
    assert not set(NOT_COMMANDS) - blocks, "NOT_COMMANDS names blocks the docs no longer have"
    assert all(s.skip or s.rc in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) for s in SPECS.values())


def test_parts_are_globbed_without_the_index() -> None:
    """`FILE.tar.part*` also matches FILE.tar.parts.json: a `cat ... | tar -x` then feeds the index
    into tar. Docs and hints name the parts with `part[0-9]*`."""
    bad = []
    for path in [*DOCS, *sorted((REPO / "importer").rglob("*.py")), *sorted((REPO / "bundle").rglob("*.py"))]:
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if re.search(r"\.part\*", line):
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_extraction_joins_continuations_and_drops_comments() -> None:
    cmds = [c.text for c in commands_of(REPO / "docs" / "transfer.md")]
    assert "python3 /media/usb/bundle-import.pyz /media/usb/train.tar.parts.json --verify-only" in cmds
    assert any(c.startswith("rsync -a --partial --progress ") and c.endswith("offline:/data/incoming/") for c in cmds)
    assert "bundle push BUNDLE REGISTRY[/NAMESPACE] [--insecure] [--concurrency N] [--chunk-size SIZE] " \
           "[--username USER --password-stdin] [--json]" in cmds
    world = Path("/w")
    spec = SPECS["bundle export SRC... --tag REF... -o DIR"]
    assert concrete("bundle export SRC... --tag REF... -o DIR", spec, world, "unix:///d.sock") == \
        "bundle export oci:/w/layout:my/train:1 --tag local/renamed:1 -o /w/new.bundle"
    assert concrete("bundle export oci:LAYOUT[:REF] -o DIR", SPECS["bundle export oci:LAYOUT[:REF] -o DIR"], world,
                    "x") == "bundle export oci:/w/layout -o /w/new.bundle"


# --- running them ----------------------------------------------------------------------------

SHIMS = {
    "bundle": "exec {py} -m bundle \"$@\"",
    "bundle-import": "exec {py} -m importer \"$@\"",
    "sneakernet-gpu-check": "exec {py} -m importer.cli.gpucheck \"$@\"",
}


def _bin_dir(root: Path, *, docker: bool) -> Path:
    d = root / ("bin" if docker else "bin-nodocker")
    d.mkdir(exist_ok=True)
    for name, body in SHIMS.items():
        f = d / name
        f.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} {body.format(py=sys.executable)}\n")
        f.chmod(0o755)
    if not docker:
        f = d / "docker"
        f.write_text("#!/bin/sh\necho 'this command must not need docker' >&2\nexit 99\n")
        f.chmod(0o755)
    return d


def _sh(cmd: str, *, cwd: Path, env: Dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _env(root: Path, docker_host: str, *, docker: bool) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DOCKER_"))}
    env["PATH"] = f"{_bin_dir(root, docker=docker)}{os.pathsep}{env.get('PATH', '')}"
    env["DOCKER_HOST"] = docker_host if docker else f"unix://{root}/no-docker.sock"
    env["PASSPHRASE"] = "correct horse battery staple"
    return env


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, docker_host: str, busybox: str) -> Path:
    """The world every document starts from: the example images in the private dockerd, and the
    bundles, parts, layout, keys and have.json the docs' commands take as given."""
    root = tmp_path_factory.mktemp("docs")
    train = engines.build_image(docker_host, simple_context(root / "ctx1", busybox, "train 1\n"), "my/train:1")
    assert train
    engines.build_image(docker_host, layered_context(root / "ctx2", base="my/train:1", files={"/msg2": "train 2\n"}),
                        "my/train:2")
    engines.docker(docker_host, "tag", "my/train:1", "my/eval:1")
    engines.docker(docker_host, "tag", "my/train:1", "registry.example/team/app:1.0")

    w = root / "world"
    for d in ("usb", "data", "secure", "tmp", "keys"):
        (w / d).mkdir(parents=True)
    env = _env(root, docker_host, docker=True)
    setup = [
        "bundle keygen -o keys/publisher",
        "bundle export my/train:1 -o train.bundle",
        "bundle export my/train:1 -o signed.bundle --sign-key keys/publisher.key",
        "bundle-import train.bundle --engine oci --oci-dir layout",
        "cp -a train.bundle usb/train.bundle && cp -a train.bundle data/train.bundle",
        "bundle pack train.bundle usb/train.tar --split 256K",
        "bundle-import --inventory --engine oci --oci-dir layout > have.json",
        "rm -f *.import-receipt.json",
    ]
    for cmd in setup:
        proc = _sh(cmd, cwd=w, env=env, timeout=300)
        assert proc.returncode == 0, f"setup: {cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert len(list((w / "usb").glob("train.tar.part[0-9]*"))) > 1
    return root


def _documents_with_runs() -> List[str]:
    docs = []
    for c in all_commands():
        spec = SPECS.get(c.key)
        if spec is not None and not spec.skip and c.doc not in docs:
            docs.append(c.doc)
    return docs


@pytest.mark.engine
@pytest.mark.parametrize("doc", _documents_with_runs())
def test_docs_commands_run_as_written(doc: str, template: Path, docker_host: str, tmp_path: Path) -> None:
    """Each document's runnable commands, in order, in a copy of the world (a new copy where an
    entry says `fresh`): exit code as SPECS says; every failure of the document is reported."""
    world = tmp_path / "world"
    shutil.copytree(template / "world", world, symlinks=True)
    failures = []
    ran = 0
    for c in (c for c in all_commands() if c.doc == doc):
        spec = SPECS[c.key]
        if spec.skip:
            continue
        if spec.fresh:
            shutil.rmtree(world)
            shutil.copytree(template / "world", world, symlinks=True)
        env = _env(template, docker_host, docker=spec.docker)
        if spec.setup:
            _sh(spec.setup.replace("{W}", str(world)), cwd=world, env=env)
        cmd = concrete(c.text, spec, world, docker_host)
        proc = _sh(cmd, cwd=world / spec.cwd, env=env)
        ran += 1
        if proc.returncode != spec.rc:
            failures.append(f"{c.doc}:{c.line}: {c.text}\n  ran: {cmd}\n  exit {proc.returncode} "
                            f"(expected {spec.rc})\n  stdout: {proc.stdout[-1500:]}\n  stderr: {proc.stderr[-1500:]}")
    assert ran
    assert not failures, "\n\n".join(failures)


@pytest.mark.engine
def test_readme_quickstart_needs_no_docker(template: Path, docker_host: str, tmp_path: Path) -> None:
    """The first quickstart, alone, with Docker unreachable: oci: layout in, --engine oci out, and
    the layout it wrote holds the image skopeo reads back."""
    cmds = [c for c in all_commands() if c.doc == "README.md" and not SPECS[c.key].skip]
    first = []
    for c in cmds:
        if SPECS[c.key].docker:
            break
        first.append(c)
    assert any("--engine oci" in c.text for c in first) and any(c.text.startswith("skopeo inspect") for c in first)
    env = _env(template, docker_host, docker=False)
    for c in first:
        proc = _sh(c.text, cwd=tmp_path, env=env)
        assert proc.returncode == 0, f"{c.text}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    import json

    inspected = json.loads(proc.stdout)
    assert inspected["Layers"] and inspected["Os"] == "linux"
    assert (tmp_path / "hello.out" / "index.json").is_file()


WEEKLY = "bundle export my/train:1 my/eval:1 --archive /media/usb/train.tar --split 3900M --force"


@pytest.mark.engine
def test_the_weekly_usb_routine_works_two_weeks_running(template: Path, docker_host: str, tmp_path: Path) -> None:
    """docs/transfer.md's weekly USB block, pasted as written two weeks running with a new build of
    my/train:1 the second week (issue 40, point 4): the export replaces the stick's archive, the
    copy replaces last week's bundle in /data/incoming (it refused to before), and the import
    verifies this week's bundle."""
    week = [c for c in all_commands() if c.doc == "docs/transfer.md"
            and c.block == next(w.block for w in all_commands() if w.key == WEEKLY)]
    runnable = [c for c in week if not SPECS[c.key].skip]
    assert [c.key.split()[0] for c in runnable] == ["bundle", "python3", "python3"], [c.key for c in week]
    world = tmp_path / "world"
    shutil.copytree(template / "world", world, symlinks=True)
    env = _env(template, docker_host, docker=True)
    before = engines.docker(docker_host, "image", "inspect", "--format", "{{.Id}}", "my/train:1").strip()
    digests = []
    try:
        for n in (1, 2):
            if n == 2:  # a new build under the same name
                engines.build_image(docker_host, layered_context(tmp_path / "week2", base="my/train:1",
                                                                 files={"/week": "2\n"}), "my/train:1")
            for c in runnable:
                proc = _sh(concrete(c.text, SPECS[c.key], world, docker_host), cwd=world, env=env, timeout=300)
                assert proc.returncode == 0, f"week {n}: {c.text}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            index = json.loads((world / "data" / "incoming" / "train.tar.parts.json").read_text())
            digests.append(index["bundle"]["digest"])
            assert sorted(p.name for p in (world / "data" / "incoming").iterdir()) == sorted(
                [*(p["name"] for p in index["parts"]), "train.tar.parts.json", "bundle-import.pyz"])
        assert digests[0] != digests[1]
    finally:
        engines.docker(docker_host, "tag", before, "my/train:1")


def _unpack_commands() -> List[Tuple[str, str]]:
    """The `tar -x` commands the docs and the importer's hints give inline (not in a fenced block)."""
    found = []
    sources = [*DOCS, REPO / "importer" / "pipeline" / "importing.py", REPO / "importer" / "cli" / "main.py"]
    for path in sources:
        text = re.sub(r"\"\s*\n\s*\"", "", path.read_text(encoding="utf-8"))  # join Python's split strings
        for span in re.findall(r"`([^`\n]*tar -x[^`\n]*)`" if path.suffix == ".md"
                               else r"\(([^()]*tar -x[^()]*)\)", text.replace("\n", " ")):
            for cmd in span.split(";"):
                cmd = re.sub(r"^\s*(for parts|parts|unpack first|unpack it):?\s*", "", cmd).strip()
                if "tar -x" in cmd and cmd.startswith(("mkdir", "cat", "tar")):
                    found.append((str(path.relative_to(REPO)), cmd))
    return found


@pytest.mark.engine
def test_inline_unpack_commands_give_back_the_bundle(template: Path, docker_host: str, tmp_path: Path) -> None:
    """`mkdir B && tar -xf FILE.tar -C B` and `cat FILE.tar.part[0-9]* | tar -x -C B` (docs/transfer.md,
    the importer's hints) unpack the tar and the parts into a bundle that verifies."""
    cmds = _unpack_commands()
    assert any("part[0-9]*" in c for _, c in cmds) and any("tar -xf" in c for _, c in cmds), cmds
    env = _env(template, docker_host, docker=False)
    src = template / "world" / "usb"
    for n, (where, cmd) in enumerate(cmds):
        work = tmp_path / str(n)
        shutil.copytree(src, work, ignore=shutil.ignore_patterns("train.bundle"))
        _sh("cat train.tar.part[0-9][0-9][0-9] > train.tar", cwd=work, env=env)  # the whole tar too
        if cmd.startswith(("cat", "tar")):
            _sh("mkdir B", cwd=work, env=env)
        run_cmd = re.sub(r"\bDIR\b", "B", cmd.replace("FILE.tar", "train.tar"))
        proc = _sh(run_cmd, cwd=work, env=env)
        assert proc.returncode == 0, f"{where}: {cmd}: exit {proc.returncode}\n{proc.stderr}"
        assert not (work / "B" / "train.tar.parts.json").exists()
        proc = _sh("bundle-import B --verify-only", cwd=work, env=env)
        assert proc.returncode == 0, f"{where}: {cmd}: the unpacked B does not verify\n{proc.stdout}\n{proc.stderr}"


def _our_program(segment: str) -> Optional[Tuple[str, ...]]:
    """(module, subcommand...) of a `bundle`/`bundle-import`/importer zipapp/gpu-check command line."""
    tokens = segment.split()
    if tokens[:1] == ["python3"]:
        tokens = [t for t in tokens[1:] if t != "-I"]
        if not tokens or not tokens[0].endswith("bundle-import.pyz"):
            return None
        tokens[0] = "bundle-import"
    if not tokens:
        return None
    if tokens[0] == "bundle" and len(tokens) > 1:
        return ("bundle", tokens[1])
    if tokens[0] == "bundle-import":
        subcommands = ("smoke", "copy", "serve", "fleet-report", "sign-receipt")
        return ("importer", tokens[1]) if tokens[1:2] and tokens[1] in subcommands else ("importer",)
    if tokens[0] == "sneakernet-gpu-check":
        return ("importer", "smoke")
    return None


def test_every_option_in_the_docs_exists() -> None:
    """The optional [--flags] the runs above drop: each one a docs command names is in that
    command's --help (a renamed or removed option cannot stay in the docs)."""
    helps: Dict[Tuple[str, ...], str] = {}
    missing = []
    checked = 0
    for c in all_commands():
        for segment in re.split(r"\|\||&&|[|;]", c.key):
            program = _our_program(segment.strip())
            if program is None:
                continue
            if program not in helps:
                proc = run_cli(program[0], *program[1:], "--help", timeout=60)
                assert proc.returncode == 0, f"{program} --help: {proc.stderr}"
                helps[program] = proc.stdout
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", segment):
                checked += 1
                if flag == "--receipt" and program == ("importer", "smoke") and "gpu-check" in segment:
                    continue
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[program]):
                    missing.append(f"{c.doc}:{c.line}: {flag} is not in `{' '.join(program)} --help`")
    assert checked > 100
    assert not missing, "\n".join(missing)


# --- each block as a reader pastes it (issue 26, point 6) -------------------------------------

def _written(cmd: str) -> Optional[str]:
    """What a command writes (``-o X``, ``--archive X``, ``bundle pack SRC X``), or None."""
    m = re.search(r"(?:^|\s)(?:-o|--archive)\s+(\S+)", cmd) or re.search(r"\bbundle pack\s+\S+\s+(\S+)", cmd)
    return m.group(1) if m else None


def test_no_block_writes_the_same_output_twice() -> None:
    """Pasted as written, a second export or pack to the same folder or tar is refused ("exists");
    a block may do it only with --force. Placeholders (DIR, FILE.tar: a synopsis) are templates."""
    clashes = []
    seen: Dict[Tuple[str, int, str], int] = {}
    for c in all_commands():
        out = _written(c.text)
        if out is None or re.match(r"[A-Z]{2,}", out):
            continue
        first = seen.setdefault((c.doc, c.block, out), c.line)
        if first != c.line and "--force" not in c.text:
            clashes.append(f"{c.doc}:{c.line} writes {out} again (first at line {first}), without --force")
    assert not clashes, "\n".join(clashes)


def test_verdict_exit_codes_in_the_docs_are_the_codes() -> None:
    """docs/validation.md said exit 2 for verdict `candidate` where docs/errors.md and the code say 10."""
    from importer.smoke.results import EXIT_CODES

    said = [(p.name, m.group(1), int(m.group(2))) for p in DOCS
            for m in re.finditer(r"verdict\s+`(\w+)`,\s+exit\s+(\d+)", p.read_text(encoding="utf-8"))]
    assert said, "the docs name a verdict's exit code somewhere"
    assert [s for s in said if EXIT_CODES.get(s[1]) != s[2]] == []
