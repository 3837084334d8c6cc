"""``bundle export --images-from-manifests FILE|-``: every image a set of rendered Kubernetes manifests
will make the cluster pull (``helm template ... | bundle export --images-from-manifests - ...``).

Read from each YAML document (docs/kubernetes.md):

- the pod spec of every workload kind (Pod, Deployment, DaemonSet, StatefulSet, ReplicaSet,
  ReplicationController, Job, CronJob, PodTemplate; a ``kind: List``'s items): ``containers``,
  ``initContainers``, ``ephemeralContainers`` (``image``) and image volumes
  (``volumes[].image.reference``);
- the GPU Operator's ``ClusterPolicy`` and ``NVIDIADriver`` (each operand's ``repository`` + ``image``
  + ``version``, ``version`` a tag or a digest ``sha256:...``, as the operator's
  ``internal/image/image.go ImagePath`` joins them; operands the operator does not deploy left out,
  ``isStateEnabled``); their driver images depend on each node's OS and kernel, so they are
  :class:`DriverSpec` records that bundle/gpudriver.py resolves per node;
- the Network Operator's ``NicClusterPolicy`` (every ``image``/``repository``/``version`` block);
- the ``helm.sh/images`` and ``artifacthub.io/images`` annotations (a YAML list of ``{name, image}``
  in a string) of any document, a chart's Chart.yaml included.

Every image keeps where it came from (:class:`Origin`: file, line, document index, helm's
``# Source:`` template, kind/namespace/name, field path) for ``--why``. Digest-pinned references
stay pinned (``name:tag@sha256:...`` is pulled by digest).

The file is data: read bounded (bundle/yamlbound.py: size, depth, nodes with every alias expanded,
no alias cycle), composed, never constructed; a tag other than YAML's own (``!!python/object``), a
duplicate key, a non-string where Kubernetes wants a string, non-UTF-8 bytes: one
``manifest-images`` error naming FILE:LINE."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from importer.errors import BundleError, UsageError
from importer.format.reference import parse_reference

MAX_BYTES = 32 * 1024 * 1024  # a rendered chart with its CRDs is a few MiB
MAX_DEPTH = 100  # CRD schemas nest deeply (properties -> x -> properties ...)
MAX_NODES = 2_000_000  # every alias counted as the nodes it stands for
MAX_ANNOTATION_BYTES = 256 * 1024
_STD_TAG = "tag:yaml.org,2002:"
_STD_TAGS = {_STD_TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge",
                                    "binary", "omap", "set", "pairs", "value")}
_SOURCE = re.compile(r"^#\s*Source:\s*(\S.{0,300})$")
_SHELLISH = re.compile(r"[\s\"'`$;|&<>{}]")

#: kind -> the path of its pod spec
POD_SPEC_PATHS: Dict[str, Tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "PodTemplate": ("template", "spec"),
}
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
IMAGE_ANNOTATIONS = ("helm.sh/images", "artifacthub.io/images")

#: ClusterPolicy operands that are plain images: (spec field, enabled when unset, needs sandboxWorkloads),
#: api/nvidia/v1/clusterpolicy_types.go IsEnabled() defaults, controllers/state_manager.go isStateEnabled
CLUSTER_POLICY_OPERANDS: Tuple[Tuple[str, Optional[bool], bool], ...] = (
    ("validator", None, False),  # state-operator-validation: always
    ("operator.initContainer", None, False),  # CUDA_BASE_IMAGE, the validation workloads' base
    ("toolkit", True, False),
    ("devicePlugin", True, False),
    ("dcgm", True, False),
    ("dcgmExporter", True, False),
    ("gfd", True, False),
    ("migManager", True, False),
    ("nodeStatusExporter", False, False),
    ("sandboxDevicePlugin", False, True),
    ("kataManager", False, True),
    ("vfioManager", False, True),
    ("vfioManager.driverManager", False, True),  # enabled with vfioManager
    ("vgpuDeviceManager", False, True),
    ("vgpuManager.driverManager", False, True),  # enabled with vgpuManager
    ("ccManager", False, True),
)
#: ClusterPolicy operands whose tag the operator makes per node (controllers/object_controls.go resolveDriverTag)
CLUSTER_POLICY_DRIVERS: Tuple[Tuple[str, bool, bool], ...] = (
    ("driver", True, False),
    ("gds", False, False),
    ("gdrcopy", False, False),
    ("vgpuManager", False, True),
)


class ManifestImagesError(UsageError):
    """``--images-from-manifests FILE`` (or ``bundle check --manifests``): the file cannot be read,
    is not YAML within bounds, or a field that names an image is not one."""

    reference = "manifest-images"


@dataclass(frozen=True)
class Origin:
    """Where one image reference was found."""

    file: str
    line: int
    document: int  # 1-based, among the file's non-empty documents
    kind: str
    namespace: str
    name: str
    field: str  # the field path: spec.template.spec.initContainers[0].image
    source: str = ""  # helm's "# Source: chart/templates/x.yaml" line above the document

    @property
    def obj(self) -> str:
        return "/".join(p for p in (self.kind or "?", self.namespace, self.name) if p)

    def text(self) -> str:
        src = f", {self.source}" if self.source else ""
        return f"{self.file}:{self.line}: document {self.document} {self.obj}{src}: {self.field}"

    def to_dict(self) -> Dict[str, Any]:
        return {"file": self.file, "line": self.line, "document": self.document, "kind": self.kind,
                "namespace": self.namespace or None, "name": self.name or None, "field": self.field,
                "source": self.source or None}


@dataclass
class FoundImage:
    ref: str  # as written
    origins: List[Origin] = field(default_factory=list)


@dataclass(frozen=True)
class DriverSpec:
    """A driver-like operand whose tag the GPU Operator completes per node (bundle/gpudriver.py)."""

    component: str  # driver, gds, gdrcopy, vgpuManager
    crd: str  # ClusterPolicy or NVIDIADriver
    repository: str
    image: str
    version: str
    precompiled: bool
    origin: Origin


@dataclass
class ManifestImages:
    images: Dict[str, FoundImage] = field(default_factory=dict)  # ref -> where, in order of first mention
    drivers: List[DriverSpec] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def add(self, ref: str, origin: Origin) -> None:
        self.images.setdefault(ref, FoundImage(ref)).origins.append(origin)


# ---------------------------------------------------------------- reading


def read_text(path: str, stdin: Any = None) -> str:
    """FILE, or stdin for ``-``: at most MAX_BYTES of UTF-8."""
    try:
        if path == "-":
            raw = (stdin or sys.stdin.buffer).read(MAX_BYTES + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ManifestImagesError(f"reading the manifests {path}: expected a readable file, found {e.strerror or e}",
                                  hint="render them first: helm template NAME CHART -f values.yaml > rendered.yaml") \
            from e
    if len(raw) > MAX_BYTES:
        raise ManifestImagesError(f"reading the manifests {path}: expected at most {MAX_BYTES} bytes of YAML, "
                                  "found more", hint="split the rendered charts into several files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestImagesError(f"reading the manifests {path}: expected UTF-8 YAML, found a byte that is not "
                                  f"(offset {e.start})", hint="is this the rendered output of helm template?") from e


def read_manifests(path: str, *, stdin: Any = None) -> ManifestImages:
    """Every image the manifests in ``path`` (``-``: stdin) name, with its origins."""
    name = "<stdin>" if path == "-" else path
    return scan_text(read_text(path, stdin), name)


def scan_text(text: str, name: str) -> ManifestImages:
    import yaml

    from bundle.yamlbound import YamlTooBig, compose_bounded

    try:
        documents = compose_bounded(text, depth=MAX_DEPTH, nodes=MAX_NODES)
    except YamlTooBig as e:
        raise ManifestImagesError(f"reading the manifests {name}:{e.line}: expected {e.expected}, found {e.found}",
                                  hint="rendered Kubernetes manifests; is this the right file?") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ManifestImagesError(f"reading the manifests {name}{line}: expected YAML, found "
                                  f"{getattr(e, 'problem', None) or e}",
                                  hint="the output of helm template (or kubectl kustomize), documents split by ---") \
            from e
    except RecursionError as e:  # pragma: no cover - the depth bound comes first
        raise ManifestImagesError(f"reading the manifests {name}: expected YAML nested at most {MAX_DEPTH} levels, "
                                  "found deeper") from e
    lines = text.splitlines()
    found = ManifestImages()
    for n, doc in enumerate(documents, 1):
        _check_nodes(doc, name)
        scan = _Doc(found, name, n, _helm_source(lines, doc.start_mark.line))
        scan.document(doc)
    return found


def _helm_source(lines: List[str], start: int) -> str:
    """The ``# Source: ...`` comment helm template writes above a document, if any."""
    for i in range(start - 1, max(-1, start - 20), -1):
        text = lines[i].strip() if i < len(lines) else ""
        if text == "---":
            break
        m = _SOURCE.match(text)
        if m:
            return m.group(1).strip()
    return ""


def _check_nodes(root: Any, name: str) -> None:
    """Every node of a document once: only YAML's own tags, no duplicate mapping key."""
    import yaml

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag not in _STD_TAGS:
            raise ManifestImagesError(f"reading the manifests {name}:{node.start_mark.line + 1}: expected plain YAML, "
                                      f"found the tag {str(node.tag)[:80]!r}",
                                      hint="Kubernetes manifests carry no language tags; do not use this file")
        if isinstance(node, yaml.MappingNode):
            keys: Dict[str, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != _STD_TAG + "merge":
                    if k.value in keys:
                        raise ManifestImagesError(
                            f"reading the manifests {name}:{k.start_mark.line + 1}: expected each key once in a "
                            f"mapping, found {k.value[:80]!r} again (first on line {keys[k.value]})",
                            hint="kubectl refuses a duplicate key too; fix the template")
                    keys[k.value] = k.start_mark.line + 1
                stack += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


# ---------------------------------------------------------------- one document


class _Doc:
    def __init__(self, found: ManifestImages, file: str, index: int, source: str) -> None:
        self.found, self.file, self.index, self.source = found, file, index, source
        self.kind = self.namespace = self.name = ""

    def origin(self, node: Any, path: str) -> Origin:
        return Origin(self.file, node.start_mark.line + 1, self.index, self.kind, self.namespace, self.name, path,
                      self.source)

    def fail(self, node: Any, expected: str, found: str, hint: Optional[str] = None) -> BundleError:
        where = f"{self.file}:{node.start_mark.line + 1} (document {self.index}"
        where += f" {self.kind}/{self.name})" if self.kind else ")"
        return ManifestImagesError(f"reading the manifests {where}: expected {expected}, found {found}", hint=hint)

    # --- node access
    def get(self, node: Any, key: str) -> Any:
        import yaml

        if not isinstance(node, yaml.MappingNode):
            return None
        merged = None
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value == key and k.tag != _STD_TAG + "merge":
                    return v
                if k.tag == _STD_TAG + "merge":
                    merged = v
        for m in (merged.value if isinstance(merged, yaml.SequenceNode) else [merged]) if merged is not None else []:
            hit = self.get(m, key)
            if hit is not None:
                return hit
        return None

    def path(self, node: Any, keys: Tuple[str, ...]) -> Any:
        for k in keys:
            node = self.get(node, k)
            if node is None:
                return None
        return node

    def string(self, node: Any, path: str, *, empty_ok: bool = False) -> Optional[str]:
        """A string field (None when absent or null); a number, list or mapping is refused."""
        import yaml

        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _STD_TAG + "null"):
            return None
        if not isinstance(node, yaml.ScalarNode) or node.tag != _STD_TAG + "str":
            what = {"MappingNode": "a mapping", "SequenceNode": "a list"}.get(type(node).__name__) or \
                f"a {str(node.tag).rsplit(':', 1)[-1]} ({str(node.value)[:40]!r})"
            raise self.fail(node, f"{path} to be a string", what, hint="quote it in the template: version: \"1.10\"")
        if not node.value and not empty_ok:
            return None
        return str(node.value)

    def flag(self, node: Any, path: str) -> Optional[bool]:
        import yaml

        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _STD_TAG + "null"):
            return None
        if not isinstance(node, yaml.ScalarNode) or node.tag != _STD_TAG + "bool":
            raise self.fail(node, f"{path} to be true or false", repr(str(getattr(node, "value", ""))[:40]))
        return str(node.value).lower() in ("true", "yes", "on", "y")

    def items(self, node: Any, path: str) -> Iterator[Tuple[int, Any]]:
        import yaml

        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _STD_TAG + "null"):
            return
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{path} to be a list", "something else")
        yield from enumerate(node.value)

    def image(self, node: Any, path: str) -> None:
        ref = self.string(node, path)
        if ref is None:
            return
        self.found.add(check_image(ref, lambda e, f: self.fail(node, e, f)), self.origin(node, path))

    # --- kinds
    def document(self, doc: Any) -> None:
        import yaml

        if not isinstance(doc, yaml.MappingNode):
            raise self.fail(doc, "a Kubernetes object (a mapping with kind)", "a list or a single value")
        self.kind = self.string(self.get(doc, "kind"), "kind") or ""
        meta = self.get(doc, "metadata")
        self.name = self.string(self.get(meta, "name"), "metadata.name") or ""
        self.namespace = self.string(self.get(meta, "namespace"), "metadata.namespace") or ""
        self.annotations(self.get(meta, "annotations"), "metadata.annotations")
        if self.kind == "" and self.get(doc, "apiVersion") is not None and self.get(doc, "name") is not None:
            self.annotations(self.get(doc, "annotations"), "annotations")  # a Chart.yaml
        if self.kind == "List":
            for _, item in self.items(self.get(doc, "items"), "items"):
                sub = _Doc(self.found, self.file, self.index, self.source)
                sub.document(item)
            return
        spec_path = POD_SPEC_PATHS.get(self.kind)
        if spec_path is not None:
            self.pod_spec(self.path(doc, spec_path), ".".join(spec_path))
        elif self.kind == "ClusterPolicy":
            self.cluster_policy(self.get(doc, "spec"))
        elif self.kind == "NVIDIADriver":
            self.nvidia_driver(self.get(doc, "spec"))
        elif self.kind == "NicClusterPolicy":
            self.image_blocks(self.get(doc, "spec"), "spec", 0)

    def pod_spec(self, spec: Any, path: str) -> None:
        if spec is None:
            return
        for key in CONTAINER_LISTS:
            for i, c in self.items(self.get(spec, key), f"{path}.{key}"):
                self.image(self.get(c, "image"), f"{path}.{key}[{i}].image")
        for i, v in self.items(self.get(spec, "volumes"), f"{path}.volumes"):
            image = self.get(v, "image")
            if image is not None:
                self.image(self.get(image, "reference"), f"{path}.volumes[{i}].image.reference")

    def annotations(self, node: Any, path: str) -> None:
        for key in IMAGE_ANNOTATIONS:
            value = self.get(node, key)
            text = self.string(value, f"{path}.{key}")
            if text is not None:
                self.annotation_list(value, text, f"{path}[{key}]")

    def annotation_list(self, node: Any, text: str, path: str) -> None:
        import yaml

        from bundle.yamlbound import YamlTooBig, compose_bounded

        if len(text) > MAX_ANNOTATION_BYTES:
            raise self.fail(node, f"{path} of at most {MAX_ANNOTATION_BYTES} bytes", "more")
        try:
            docs = compose_bounded(text, depth=8, nodes=20_000)
        except (YamlTooBig, yaml.YAMLError) as e:
            raise self.fail(node, f"{path} to hold a YAML list of images", str(e)[:200]) from e
        for doc in docs:
            _check_nodes(doc, self.file)
            for i, item in self.items(doc, path):
                if isinstance(item, yaml.ScalarNode):
                    ref = self.string(item, f"{path}[{i}]")
                else:
                    ref = self.string(self.get(item, "image"), f"{path}[{i}].image")
                if ref is not None:
                    self.found.add(check_image(ref, lambda e, f: self.fail(node, e, f)),
                                   self.origin(node, f"{path}[{i}]" + ("" if isinstance(item, yaml.ScalarNode)
                                                                       else ".image")))

    # --- the GPU Operator
    def operand(self, spec: Any, path: str) -> Tuple[str, str, str]:
        block = self.path(spec, tuple(path.split(".")))
        return (self.string(self.get(block, "repository"), f"spec.{path}.repository") or "",
                self.string(self.get(block, "image"), f"spec.{path}.image") or "",
                self.string(self.get(block, "version"), f"spec.{path}.version") or "")

    def enabled(self, spec: Any, path: str, default: Optional[bool]) -> bool:
        if default is None:
            return True
        said = self.flag(self.path(spec, (*path.split("."), "enabled")), f"spec.{path}.enabled")
        return default if said is None else said

    def cluster_policy(self, spec: Any) -> None:
        if spec is None:
            return
        sandbox = bool(self.flag(self.path(spec, ("sandboxWorkloads", "enabled")), "spec.sandboxWorkloads.enabled"))
        for path, default, needs_sandbox in CLUSTER_POLICY_OPERANDS:
            owner = path.split(".")[0] if path.endswith("driverManager") else path
            if self.path(spec, tuple(path.split("."))) is None:
                continue
            if not self.enabled(spec, owner, default) or (needs_sandbox and not sandbox):
                continue
            self.plain_operand(spec, path)
        driver_on = self.enabled(spec, "driver", True)
        by_crd = bool(self.flag(self.path(spec, ("driver", "useNvidiaDriverCRD")), "spec.driver.useNvidiaDriverCRD"))
        if driver_on and not by_crd and self.get(spec, "driver") is not None:
            self.plain_operand(spec, "driver.manager")
        precompiled = bool(self.flag(self.path(spec, ("driver", "usePrecompiled")), "spec.driver.usePrecompiled"))
        for path, default, needs_sandbox in CLUSTER_POLICY_DRIVERS:
            if self.get(spec, path) is None or not self.enabled(spec, path, default):
                continue
            if needs_sandbox and not sandbox:
                continue
            if path in ("driver", "gds", "gdrcopy") and (not driver_on or by_crd):
                continue  # gds and gdrcopy are containers of the driver's DaemonSet
            repo, image, version = self.operand(spec, path)
            self.found.drivers.append(DriverSpec(path, "ClusterPolicy", repo, image, version,
                                                 precompiled and path == "driver",
                                                 self.origin(self.get(spec, path), f"spec.{path}")))
        if by_crd and driver_on:
            self.found.notes.append(f"{self.origin(spec, 'spec.driver').text()}: useNvidiaDriverCRD: the driver images "
                                    "come from the NVIDIADriver objects")

    def plain_operand(self, spec: Any, path: str) -> None:
        block = self.path(spec, tuple(path.split(".")))
        if block is None:
            return
        repo, image, version = self.operand(spec, path)
        ref = operand_image(repo, image, version)
        if ref is None:
            self.found.notes.append(f"{self.origin(block, 'spec.' + path).text()}: no repository, image or version: "
                                    "the operator takes it from its own environment (OLM); not carried")
            return
        self.found.add(check_image(ref, lambda e, f: self.fail(block, e, f)),
                       self.origin(block, f"spec.{path}.{{repository,image,version}}"))

    def nvidia_driver(self, spec: Any) -> None:
        if spec is None:
            return
        precompiled = bool(self.flag(self.get(spec, "usePrecompiled"), "spec.usePrecompiled"))
        repo, image, version = (self.string(self.get(spec, k), f"spec.{k}") or "" for k in
                                ("repository", "image", "version"))
        self.found.drivers.append(DriverSpec("driver", "NVIDIADriver", repo, image, version, precompiled,
                                             self.origin(spec, "spec")))
        if self.get(spec, "manager") is not None:
            self.plain_operand(spec, "manager")
        for path in ("gds", "gdrcopy"):
            if self.get(spec, path) is not None and self.enabled(spec, path, False):
                r, i, v = self.operand(spec, path)
                self.found.drivers.append(DriverSpec(path, "NVIDIADriver", r, i, v, False,
                                                     self.origin(self.get(spec, path), f"spec.{path}")))

    def image_blocks(self, node: Any, path: str, depth: int) -> None:
        """The Network Operator's NicClusterPolicy: every mapping with ``image`` and ``repository``."""
        import yaml

        if depth > 8 or not isinstance(node, yaml.MappingNode):
            return
        if self.get(node, "image") is not None and self.get(node, "repository") is not None:
            repo = self.string(self.get(node, "repository"), f"{path}.repository") or ""
            image = self.string(self.get(node, "image"), f"{path}.image") or ""
            version = self.string(self.get(node, "version"), f"{path}.version") or ""
            ref = operand_image(repo, image, version)
            if ref is not None:
                self.found.add(check_image(ref, lambda e, f: self.fail(node, e, f)),
                               self.origin(node, f"{path}.{{repository,image,version}}"))
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.MappingNode):
                self.image_blocks(v, f"{path}.{k.value}", depth + 1)


def operand_image(repository: str, image: str, version: str) -> Optional[str]:
    """The GPU Operator's ``internal/image/image.go ImagePath`` (and api/nvidia/v1
    ``imagePath``): ``repository/image:version``, ``repository/image@version`` when the version is
    a digest, ``image`` alone when repository and version are empty; None when all are empty (the
    operator then reads an environment variable of its own pod)."""
    if not repository and not version:
        return image or None
    if version.startswith("sha256:"):
        return f"{repository}/{image}@{version}"
    return f"{repository}/{image}:{version}"


def check_image(ref: str, fail: Any) -> str:
    """``ref`` when it is one image reference (``[HOST/]PATH[:TAG][@DIGEST]``)."""
    if _SHELLISH.search(ref):
        raise fail("one image reference", f"{ref[:120]!r} (an unrendered template or several words?)")
    try:
        parse_reference(ref)
    except BundleError as e:
        raise fail("an image reference", f"{ref[:120]!r}: {e.message}") from e
    return ref


def why_lines(found: ManifestImages, ref: str, extra: Optional[Dict[str, List[str]]] = None) -> List[str]:
    """``--why REF``: each place REF comes from (and, for a driver image, the node it is for)."""
    from importer.format.refs import normalize

    want = normalize(ref)
    out: List[str] = []
    for image in found.images.values():
        if normalize(image.ref) == want:
            out += [f"{image.ref}: {o.text()}" for o in image.origins]
    for key, lines in (extra or {}).items():
        if normalize(key) == want:
            out += [f"{key}: {line}" for line in lines]
    return out
