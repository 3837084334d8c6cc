"""What the cluster will pull, before the trip (docs/kubernetes.md):

- ``bundle export --images-from-manifests FILE|-`` (``--why REF``): the images rendered manifests name
  (bundle/k8simages.py) and the driver images of each ``--have`` node (bundle/gpudriver.py) join the
  export, read from their registries (``docker://``), digest-pinned references kept pinned, every
  platform the nodes run (their inventories'; without any, all: indexes stay whole), each named as
  containerd asks a mirror for it (``docker.io/library/NAME:TAG``);
- ``bundle check --manifests FILE --against BUNDLE|REGISTRY [--have INVENTORY...]``: every reference
  resolved the way containerd resolves it on each node (Docker Hub's ``docker.io/library/``, the
  mirror of the node config ``bundle-import serve --print-node-config`` writes: the upstream host
  left out, the mirror's path prefix put in front; a BUNDLE is checked as ``serve`` would serve
  it), for each node's platform; each reference that would fail is listed with why, and the check
  fails (``pull-check-failed``, exit 8)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from bundle.gpudriver import Node, NodeImage, check_exist, node_images, nodes_from, platforms_of, registry_exists
from bundle.k8simages import ManifestImages, ManifestImagesError, check_image, read_manifests, why_lines
from importer.cli.output import emit, failure, render_error, success
from importer.errors import BundleError
from importer.format.platform import Platform, host, of_dict, parse_platforms
from importer.format.refs import normalize, split_domain, split_ref
from importer.registry.access import RegistryAccess, access_from_args, add_access_arguments

#: the pull check's failure reasons (schemas/cli/check.schema.json)
REASONS = ("missing", "platform-missing", "wrong-driver-tag", "not-served")
#: the pod sandbox image every pod starts with (containerd 2.x's default sandbox image)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
PAUSE_WHY = ("the pod sandbox image every pod on the node starts with (containerd's sandbox image, `crictl info` "
             "shows it; --pause-image)")


class PullCheckFailed(BundleError):
    """``bundle check``: a reference the manifests make a node pull would fail there (missing, a
    platform the carried copy lacks, a driver tag for another OS or kernel, a name the mirror does
    not answer); the context lists each one."""

    reference = "pull-check-failed"
    exit_code = 8


# ---------------------------------------------------------------- bundle export


def add_manifest_options(e: argparse.ArgumentParser) -> None:
    e.add_argument("--images-from-manifests", action="append", default=[], metavar="FILE|-",
                   help="the images rendered Kubernetes manifests will pull too (repeatable; - reads stdin: "
                   "helm template ... | bundle export --images-from-manifests - ...): pod specs, the GPU "
                   "Operator's ClusterPolicy/NVIDIADriver (driver images per --have node), NicClusterPolicy, "
                   "helm.sh/images annotations; read from their registries (docs/kubernetes.md)")
    e.add_argument("--why", action="append", default=[], metavar="REF",
                   help="with --images-from-manifests: say where REF comes from (file, document, kind/namespace/"
                   "name, field; the node of a driver image) and export nothing")
    add_pause_option(e)


def add_pause_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pause-image", default=PAUSE_IMAGE, metavar="REF|none",
                   help="with the manifests: the pod sandbox image the nodes' containerd starts every pod with "
                   f"(default {PAUSE_IMAGE}; `crictl info | grep sandboxImage` on a node says; none: leave it out)")


@dataclass
class ManifestPlan:
    found: ManifestImages
    nodes: List[Node]
    drivers: List[NodeImage]
    refs: List[str] = field(default_factory=list)  # as written, each once: manifests' then drivers'
    pause: Optional[str] = None

    def why(self) -> Dict[str, List[str]]:
        out: Dict[str, List[str]] = {self.pause: [PAUSE_WHY]} if self.pause else {}
        for d in self.drivers:
            out.setdefault(d.ref, []).append(d.why())
        return out


def manifest_plan(paths: Sequence[str], have: Sequence[str], *, pause: Optional[str] = PAUSE_IMAGE,
                  stdin: Any = None) -> ManifestPlan:
    found = ManifestImages()
    for path in paths:
        one = read_manifests(path, stdin=stdin)
        for ref, image in one.images.items():
            for o in image.origins:
                found.add(ref, o)
        found.drivers += one.drivers
        found.notes += one.notes
    nodes = nodes_from(have)
    drivers = node_images(found.drivers, nodes)
    pause = None if pause in (None, "", "none") else check_image(str(pause), _pause_error)
    refs = list(dict.fromkeys([*found.images, *(d.ref for d in drivers), *([pause] if pause else [])]))
    return ManifestPlan(found, nodes, drivers, refs, pause)


def _pause_error(expected: str, found: str) -> BundleError:
    return ManifestImagesError(f"reading --pause-image: expected {expected}, found {found}",
                               hint="e.g. --pause-image registry.k8s.io/pause:3.10, or none")


def export_name(ref: str) -> str:
    """The name a carried image gets: the full name containerd asks for (``docker.io/library/x:1``),
    which ``serve`` answers as ``library/x``; a reference pinned by digest alone is tagged
    ``pinned-<12 hex>`` in its repository (the node still pulls it by digest)."""
    name, tag, digest = split_ref(normalize(ref))
    return f"{name}:{tag}" if tag else f"{name}:pinned-{digest.split(':', 1)[1][:12]}"


def add_manifest_images(args: argparse.Namespace, *, exists: Optional[Callable[[str], bool]] = None) -> None:
    """``--images-from-manifests``: the references join ``args.images`` (``docker://``); when they are
    the export's only images, each gets its name (``--tag``) and the nodes' platforms (else all)."""
    paths = getattr(args, "images_from_manifests", [])
    if not paths:
        return
    plan = manifest_plan(paths, args.have, pause=args.pause_image)
    for note in plan.found.notes:
        sys.stderr.write(f"note: {note}\n")
    check_exist(plan.drivers, exists or registry_exists())
    alone = not args.images and not args.images_from and not args.tag
    args.images = [*args.images, *(f"docker://{r}" for r in plan.refs)]
    if alone:
        args.tag = [export_name(r) for r in plan.refs]
        if not args.platform and not args.all_platforms:
            plats = platforms_of(plan.nodes)
            if plats:
                args.platform = list(plats)
            else:
                args.all_platforms = True


def print_why(args: argparse.Namespace) -> int:
    if not args.images_from_manifests:
        raise ManifestImagesError("exporting with --why: expected --images-from-manifests FILE, found none",
                                  hint="bundle export --images-from-manifests rendered.yaml --why REF")
    plan = manifest_plan(args.images_from_manifests, args.have, pause=args.pause_image)
    answers = []
    for ref in args.why:
        lines = why_lines(plan.found, ref, plan.why())
        if not lines:
            raise ManifestImagesError(f"explaining {ref!r}: expected one of the images the manifests pull, found "
                                      f"none of {len(plan.refs)} by that name",
                                      hint="bundle export --images-from-manifests FILE --why REF; the names: "
                                      + ", ".join(plan.refs[:8]) + (" ..." if len(plan.refs) > 8 else ""))
        answers.append({"ref": ref, "from": lines})
    if args.json:
        emit(success({"why": answers, "images": plan.refs}))
    else:
        for a in answers:
            sys.stdout.write("\n".join(a["from"]) + "\n")
    return 0


# ---------------------------------------------------------------- bundle check


@dataclass
class Found:
    """What a registry or a bundle answers for one reference."""

    kind: str  # index or manifest
    platforms: List[Platform]
    name: str = ""  # the bundle's name for it


class BundleTarget:
    """A bundle as ``bundle-import serve`` serves it (importer/serve/serve.py repository_of)."""

    kind = "bundle"

    def __init__(self, path: str) -> None:
        from importer.input.opened import open_bundle
        from importer.serve.serve import repository_of

        manifest = open_bundle(path).manifest()
        self.location = path
        self.repos: Dict[str, Dict[str, Found]] = {}
        self.by_full: Dict[str, str] = {}  # normalized ref -> the repository serve answers it as
        for image in manifest.images:
            plats = [p for p in (of_dict(image.platform), *(of_dict(o.platform) for o in image.others)) if p]
            for ref in image.refs:
                repo, tag, digest = repository_of(ref)
                found = Found("index" if image.index is not None else "manifest", plats, ref)
                entry = self.repos.setdefault(repo, {})
                for key in (tag, digest, str(image.manifest.digest),
                            str(image.index.digest) if image.index is not None else ""):
                    if key:
                        entry[key] = found
                self.by_full[normalize(ref)] = repo

    def lookup(self, repo: str, reference: str, platform: Optional[Platform]) -> Optional[Found]:
        return self.repos.get(repo, {}).get(reference)

    def tags(self, repo: str) -> List[str]:
        return sorted(k for k in self.repos.get(repo, {}) if not k.startswith("sha256:"))

    def served_as(self, full: str) -> Optional[str]:
        return self.by_full.get(full)


class RegistryTargetCheck:
    """A registry (the mirror the node config names): asked what containerd asks it."""

    kind = "registry"

    def __init__(self, text: str, access: Optional[RegistryAccess] = None) -> None:
        from importer.registry.client import RegistryClient, parse_target

        self.target = parse_target(text)
        self.location = text
        self.client = RegistryClient(self.target, access=access)  # logins and CAs as every registry command
        self.client.ping()  # HTTPS, or plain HTTP where allowed (loopback); the API version

    def lookup(self, repo: str, reference: str, platform: Optional[Platform]) -> Optional[Found]:
        from importer.format.digest import Digest
        from importer.format.limits import MAX_CONFIG, MAX_INDEX

        path = self.target.repository(repo)
        got = self.client.get_manifest(path, reference, MAX_INDEX)
        if got is None:
            return None
        doc = _json(got[0])
        entries = doc.get("manifests")
        if isinstance(entries, list):
            plats = []
            for e in entries[:1000]:
                p = of_dict(e.get("platform")) if isinstance(e, dict) else None
                if p is None or p.architecture == "unknown":  # attestation manifests (buildkit)
                    continue
                if platform is not None and p.matches(platform) and \
                        self.client.manifest_digest(path, str(e.get("digest"))) is None:
                    continue  # listed, but the registry does not hold that platform's manifest
                plats.append(p)
            return Found("index", plats)
        config = doc.get("config")
        digest = config.get("digest") if isinstance(config, dict) else None
        plats = []
        if isinstance(digest, str):
            p = of_dict(_json(self.client.get_blob(path, Digest.parse(digest), MAX_CONFIG)))
            plats = [p] if p else []
        return Found("manifest", plats)

    def tags(self, repo: str) -> List[str]:
        path = self.target.repository(repo)
        r = self.client.request("GET", f"/v2/{path}/tags/list?n=1000", ok=(200, 404), repo=path,
                                limit=4 * 1024 * 1024, what=f"listing the tags of {path}")
        doc = _json(r.body) if r.status == 200 else {}
        tags = doc.get("tags") if isinstance(doc, dict) else None
        return sorted(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else []

    def served_as(self, full: str) -> Optional[str]:
        return None


def _json(raw: bytes) -> Dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class Verdict:
    ref: str  # as the manifests write it (or the node's driver image)
    resolved: str  # docker.io/library/...
    asked: str  # what the node asks the mirror: REPO:TAG or REPO@DIGEST
    node: str
    platform: Optional[str]
    ok: bool
    reason: Optional[str] = None
    message: str = ""
    origins: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"ref": self.ref, "resolved": self.resolved, "asked": self.asked, "node": self.node,
                "platform": self.platform, "ok": self.ok, "reason": self.reason, "message": self.message or None,
                "from": self.origins}


def check_one(target: Any, ref: str, node: Node, origins: List[str], driver: Optional[NodeImage]) -> Verdict:
    full = normalize(ref)
    name, tag, digest = split_ref(full)
    repo = split_domain(name)[1]
    reference = digest or tag
    asked = f"{repo}@{digest}" if digest else f"{repo}:{tag}"
    plat = node.platform
    v = Verdict(ref, full, asked, node.name, str(plat) if plat else None, True, origins=origins)
    found = target.lookup(repo, reference, plat)
    if found is None:
        v.ok = False
        served = target.served_as(full)
        others = target.tags(repo) if driver is not None else []
        if served is not None and served != repo:
            v.reason = "not-served"
            v.message = (f"the bundle names it {ref} and a mirror serves that as {served}, but the node asks for "
                         f"{asked}: export it as {split_ref(full)[0]}:{tag or 'TAG'} (bundle export "
                         "--images-from-manifests names it so)")
        elif driver is not None and others:
            v.reason = "wrong-driver-tag"
            v.message = (f"the operator asks for {asked} on node {node.name} ({node.os}, kernel {node.kernel}); "
                         f"{target.kind} holds {repo} only as {', '.join(others[:6])}: export the node's tag "
                         "(bundle export --images-from-manifests --have that node's inventory)")
        else:
            v.reason = "missing"
            v.message = f"{target.kind} {target.location} has no {asked}"
        return v
    if plat is not None and found.platforms and not any(p.matches(plat) for p in found.platforms):
        have = ", ".join(str(p) for p in found.platforms) or "none"
        v.ok = False
        v.reason = "platform-missing"
        copy = "a single-platform copy" if found.kind == "manifest" else "an index"
        v.message = (f"{target.kind} holds {copy} of {asked} ({have}); node {node.name} runs {plat}: export it with "
                     "the nodes' platforms (--platform for each, or --all-platforms)")
    return v


def add_check_command(sub: Any) -> argparse.ArgumentParser:
    c: argparse.ArgumentParser = sub.add_parser(
        "check", help="before the trip: would every image the manifests pull resolve on each node?")
    c.add_argument("--manifests", action="append", required=True, metavar="FILE|-",
                   help="rendered Kubernetes manifests (helm template ... output; - reads stdin), repeatable")
    c.add_argument("--against", required=True, metavar="BUNDLE|REGISTRY",
                   help="a bundle (folder, tar or parts: checked as `bundle-import serve` serves it) or the registry "
                   "the nodes pull from, HOST:PORT[/PREFIX] (the mirror of --print-node-config)")
    c.add_argument("--have", action="append", default=[], metavar="INVENTORY",
                   help="each node's `bundle-import --inventory` (repeatable): its platform, OS and kernel (driver "
                   "tags)")
    c.add_argument("--platform", action="append", default=[], metavar="OS/ARCH[/VARIANT]",
                   help="the nodes' platforms without --have (default: this host's)")
    add_pause_option(c)
    add_access_arguments(c, "--against REGISTRY: ")  # a mirror that wants a login or has a CA of its own
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.set_defaults(handler=cmd_check)
    return c


def _target(text: str, access: Optional[RegistryAccess]) -> Any:
    if os.path.exists(text) or text.startswith(("/", ".", "~")):
        return BundleTarget(text)
    return RegistryTargetCheck(text, access)


def run_check(manifests: Sequence[str], against: str, have: Sequence[str], platforms: Sequence[str],
              pause: Optional[str] = PAUSE_IMAGE, access: Optional[RegistryAccess] = None) -> Dict[str, Any]:
    plan = manifest_plan(manifests, have, pause=pause)
    nodes = plan.nodes or [Node("(any node)", "", None, None, p) for p in parse_platforms(platforms or [str(host())])]
    target = _target(against, access)
    verdicts: List[Verdict] = []
    for ref, image in plan.found.images.items():
        origins = [o.text() for o in image.origins]
        for node in nodes:
            verdicts.append(check_one(target, ref, node, origins, None))
    for d in plan.drivers:
        verdicts.append(check_one(target, d.ref, d.node, [d.why()], d))
    for node in nodes if plan.pause else []:
        verdicts.append(check_one(target, str(plan.pause), node, [PAUSE_WHY], None))
    failed = [v for v in verdicts if not v.ok]
    return {"against": {"kind": target.kind, "location": against}, "nodes": [n.to_dict() for n in nodes],
            "checked": [v.to_dict() for v in verdicts], "failures": len(failed), "notes": plan.found.notes}


def cmd_check(args: argparse.Namespace) -> int:
    report = run_check(args.manifests, args.against, args.have, args.platform, args.pause_image,
                       access=access_from_args(args))
    bad = [v for v in report["checked"] if not v["ok"]]
    if not bad:
        if args.json:
            emit(success(report))
        else:
            refs = {v["resolved"] for v in report["checked"]}
            sys.stdout.write(f"every image resolves: {len(refs)} reference(s) on {len(report['nodes'])} node(s) "
                             f"against {report['against']['kind']} {args.against}\n")
        return 0
    lines = [f"{v['resolved']} on {v['node']} ({v['platform'] or 'any platform'}): {v['reason']}: {v['message']}"
             for v in bad]
    err = PullCheckFailed(f"checking what the nodes will pull against {args.against}: expected every image to "
                          f"resolve, found {len(bad)} that would fail", context="\n".join(lines),
                          hint="export what is listed (bundle export --images-from-manifests FILE --have "
                          "INVENTORY...) and check again; --why REF says where one comes from")
    if args.json:
        emit(failure(err, **report))
        args.json_done = True
    render_error(err)
    return err.exit_code


def check_examples() -> Tuple[str, ...]:
    return ("bundle check --manifests rendered.yaml --against gpu.bundle --have node-a.json --have node-b.json",
            "bundle check --manifests rendered.yaml --against mirror.example:5000 --json")
