"""``bundle export --chart CHART.tgz`` (repeatable): a Helm chart carried as Helm's OCI artifact, so
``helm pull oci://HOST:PORT/charts/NAME --version V`` works against ``bundle-import serve`` and a
registry the bundle was pushed to (docs/kubernetes.md, "Charts").

What ``helm push`` writes (helm's ``pkg/registry/client.go`` ``Push``, ``chart.go``,
``pkg/pusher/ocipusher.go``): an OCI image manifest whose config is the chart's metadata
(``chart.Metadata`` of ``pkg/chart/v2/metadata.go``) as Go's ``encoding/json`` writes it, media type
``application/vnd.cncf.helm.config.v1+json``; one layer, the .tgz byte for byte,
``application/vnd.cncf.helm.chart.content.v1.tar+gzip``; the manifest's annotations from the
metadata (``generateOCIAnnotations``: description, title, version, url, created (the .tgz's
modification time), source, authors, then the chart's own annotations); tagged with the chart's
version, ``+`` written ``_``, under ``<repository>/<name>``. The artifact is one record of the file
artifacts of schema 3.6 (importer/format/fileartifacts.py): its type the config's media type (what
OCI 1.1 says a manifest without ``artifactType`` has; written here so the importer's layout check
holds), its one file ``<name>-<version>.tgz`` (title and mode annotated on the layer, as every file
artifact's; helm reads neither), so ``bundle-import --files-to DIR`` writes the .tgz too.

The .tgz is hostile input until read: a regular file of at most :data:`MAX_TGZ`, gzip, a tar read
as a stream and never extracted, member names checked as helm's loader
(``pkg/chart/loader/archive``) checks them (no absolute path, nothing outside the chart's folder,
no ``..``), at most :data:`MAX_FILE` a file and :data:`MAX_DECOMPRESSED` in all (helm's own
bounds), links and devices ignored; ``Chart.yaml`` (and ``requirements.yaml``, which helm's loader
reads onto the same metadata) composed by the bounded YAML reader (bundle/yamlbound.py) and
converted as helm's ``sigs.k8s.io/yaml`` + ``encoding/json`` would (a float ``1.10`` becomes
``"1.1"`` where a string is wanted, keys matched case-insensitively), then validated as
``Metadata.Validate`` does. Anything else: one ``helm-chart`` error naming the file."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import hashlib
import json
import os
import posixpath
import re
import stat
import struct
import tarfile
import zlib
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from bundle.blobstore import BlobStore
from bundle.fileartifact import FileSet, carry_files
from bundle.yamlbound import YamlTooBig, compose_bounded
from importer.errors import UsageError
from importer.format.digest import BlobRef
from importer.format.fileartifacts import MODE_ANNOTATION, TITLE_ANNOTATION, CarriedFile, FileArtifact, mode_text
from importer.format.manifest import valid_ref
from importer.format.mediatypes import OCI_MANIFEST
from importer.format.reference import valid_name_component, valid_tag

CHART_CONFIG = "application/vnd.cncf.helm.config.v1+json"
CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
#: helm's ProvLayerMediaType: the chart's provenance file (``helm package --sign``), a second layer
PROV_LAYER = "application/vnd.cncf.helm.chart.provenance.v1.prov"
MAX_PROV = 1024 * 1024  # a provenance file: the chart's metadata, one checksum, a PGP signature
DEFAULT_REPOSITORY = "charts"
MAX_TGZ = 100 * 1024 * 1024  # the .tgz itself (helm reads it whole into memory)
MAX_DECOMPRESSED = 100 * 1024 * 1024  # helm's MaxDecompressedChartSize
MAX_FILE = 5 * 1024 * 1024  # helm's MaxDecompressedFileSize
MAX_MEMBERS = 100_000
YAML_DEPTH, YAML_NODES = 64, 200_000
_NUM = r"(?:0|[1-9]\d*)"
_PRE = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
#: Masterminds/semver v3 ``NewVersion`` (``Metadata.Validate``): loose, a ``v`` prefix, minor and patch optional
_SEMVER_RE = re.compile(rf"v?{_NUM}(?:\.{_NUM})?(?:\.{_NUM})?(?:-{_PRE}(?:\.{_PRE})*)?"
                        r"(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?")
_ALIAS_RE = re.compile(r"[a-zA-Z0-9_-]+")
_GO_SPACE = set("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {chr(c) for c in range(0x2000, 0x200B)}
_DRIVE_RE = re.compile(r"[a-zA-Z]:/")


class ChartError(UsageError):
    """``bundle export --chart CHART.tgz``: the file is not a Helm chart package helm would load
    (not gzip, not a tar, no Chart.yaml, a member outside the chart's folder, past helm's size
    bounds, metadata helm refuses), or its name or version cannot be an OCI reference."""

    reference = "helm-chart"


@dataclass(frozen=True)
class ChartPackage:
    """One ``--chart`` file, read: the metadata helm's config holds (JSON bytes as helm writes them),
    the manifest's annotations, the ref it is carried under."""

    path: str
    name: str
    version: str
    ref: str
    config: bytes
    annotations: Dict[str, str]
    size: int
    #: ``CHART.tgz.prov`` beside it (``helm package --sign``), checked to name this package's sha256
    prov: Optional[str] = None

    @property
    def title(self) -> str:
        return f"{self.name}-{self.version}.tgz"


# --- Go's encoding/json and sigs.k8s.io/yaml, as far as chart.Metadata needs them -------------------

def go_json(value: Any) -> bytes:
    """``json.Marshal`` of plain values: compact, UTF-8, ``<>&`` and U+2028/U+2029 escaped as Go does,
    map keys sorted (a dict whose order matters, a struct's, is given in order and kept)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text.encode("utf-8")


def _float32_g(x: float) -> str:
    """``strconv.FormatFloat(x, 'g', -1, 32)`` (what sigs.k8s.io/yaml makes of a float where a string
    is wanted): the shortest decimal that reads back as the same float32, in %e form when its
    exponent is below -4 or at least 6 (Go's shortest %g)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "+Inf" if x > 0 else "-Inf"
    try:
        f32 = struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return "+Inf" if x > 0 else "-Inf"
    if f32 == 0:
        return "0"
    for prec in range(1, 10):
        digits = f"{f32:.{prec - 1}e}"
        if struct.unpack("f", struct.pack("f", float(digits)))[0] == f32:
            break
    mantissa, exp_text = digits.split("e")
    exp = int(exp_text)
    sign = "-" if mantissa.startswith("-") else ""
    nd = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    if exp < -4 or exp >= 6:
        body = nd[0] + ("." + nd[1:] if len(nd) > 1 else "")
        return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{nd}"
    whole = nd[:exp + 1].ljust(exp + 1, "0")
    frac = nd[exp + 1:]
    return f"{sign}{whole}{'.' + frac if frac else ''}"


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL_TAG, _NULL_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"


def _scalar(node: Any) -> Any:
    """A YAML scalar as go-yaml decodes it into ``interface{}``: int, float, bool, null or string."""
    tag = node.tag
    if tag in (_INT_TAG, _FLOAT_TAG, _BOOL_TAG, _NULL_TAG):
        try:
            return _construct(node)
        except (ValueError, OverflowError):
            return node.value
    return node.value


def _construct(node: Any) -> Any:
    import yaml

    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


class _Bad(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


def _where(node: Any) -> int:
    return int(node.start_mark.line) + 1


def _string(node: Any, field: str) -> str:
    """A string field: a scalar as sigs.k8s.io/yaml hands it to a Go string (numbers and bools as
    text, null as ""); anything else is helm's unmarshal error."""
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        found = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
        raise _Bad(_where(node), f"{field}: expected a string, found a {found}")
    value = _scalar(node)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float32_g(value)
    return str(value)


def _strings(node: Any, field: str) -> Optional[List[str]]:
    import yaml

    if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
        return None
    if not isinstance(node, yaml.SequenceNode):
        raise _Bad(_where(node), f"{field}: expected a list of strings")
    return [_string(item, f"{field}[{i}]") for i, item in enumerate(node.value)]


def _bool(node: Any, field: str) -> bool:
    import yaml

    if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
        return False
    value = _scalar(node) if isinstance(node, yaml.ScalarNode) else None
    if not isinstance(value, bool):
        raise _Bad(_where(node), f"{field}: expected true or false")
    return value


def _any(node: Any) -> Any:
    """``import-values`` (``[]any``): a YAML value as JSON, map keys as text."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        return dict(sorted((_string(k, "key") if isinstance(k, yaml.ScalarNode) else str(_where(k)), _any(v))
                           for k, v in node.value))  # Go's map[string]any: keys sorted
    if isinstance(node, yaml.SequenceNode):
        return [_any(v) for v in node.value]
    value = _scalar(node)
    return value if not isinstance(value, float) or (value == value and abs(value) != float("inf")) else str(value)


def _string_map(node: Any, field: str) -> Optional[Dict[str, str]]:
    import yaml

    if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
        return None
    if not isinstance(node, yaml.MappingNode):
        raise _Bad(_where(node), f"{field}: expected a mapping of strings")
    return {_string(k, f"{field} key"): _string(v, f"{field}.{k.value}") for k, v in node.value}


def _fields(node: Any, where: str, known: Sequence[str]) -> Dict[str, Any]:
    """A mapping's values by the Go field they unmarshal into (exact name first, else
    case-insensitive, as encoding/json matches); unknown keys ignored; the last of two wins."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise _Bad(_where(node), f"{where}: expected a mapping")
    lower = {k.lower(): k for k in known}
    out: Dict[str, Any] = {}
    for key, value in node.value:
        name = _string(key, f"{where} key") if isinstance(key, yaml.ScalarNode) else ""
        field = name if name in known else lower.get(name.lower())
        if field is not None:
            out[field] = value
    return out


_MAINTAINER = ("name", "email", "url")
_DEPENDENCY = ("name", "version", "repository", "condition", "tags", "enabled", "import-values", "alias")
_METADATA = ("name", "home", "sources", "version", "description", "keywords", "maintainers", "icon", "apiVersion",
             "condition", "tags", "appVersion", "deprecated", "annotations", "kubeVersion", "dependencies", "type")
_LISTS = {"sources", "keywords"}


def _items(node: Any, field: str) -> Optional[List[Any]]:
    """A list of objects; a null entry kept as None (Validate refuses it)."""
    import yaml

    if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
        return None
    if not isinstance(node, yaml.SequenceNode):
        raise _Bad(_where(node), f"{field}: expected a list")
    return [None if isinstance(n, yaml.ScalarNode) and n.tag == _NULL_TAG else n for n in node.value]


def _maintainer(node: Any, at: str) -> Dict[str, str]:
    got = _fields(node, at, _MAINTAINER)
    return {k: _string(got[k], f"{at}.{k}") for k in _MAINTAINER if k in got}


def _dependency(node: Any, at: str) -> Dict[str, Any]:
    got = _fields(node, at, _DEPENDENCY)
    dep: Dict[str, Any] = {}
    for key in _DEPENDENCY:
        if key not in got:
            continue
        if key == "tags":
            dep[key] = _strings(got[key], f"{at}.tags")
        elif key == "enabled":
            dep[key] = _bool(got[key], f"{at}.enabled")
        elif key == "import-values":
            items = _items(got[key], f"{at}.import-values")
            dep[key] = None if items is None else [None if n is None else _any(n) for n in items]
        else:
            dep[key] = _string(got[key], f"{at}.{key}")
    return dep


def unmarshal_metadata(meta: Dict[str, Any], doc: Any) -> None:
    """``yaml.Unmarshal(data, &metadata)`` of one document onto ``meta`` (fields it names replaced)."""
    got = _fields(doc, "Chart.yaml", _METADATA)
    for key, node in got.items():
        if key in _LISTS:
            meta[key] = _strings(node, key)
        elif key == "deprecated":
            meta[key] = _bool(node, key)
        elif key == "annotations":
            meta[key] = _string_map(node, key)
        elif key == "maintainers":
            items = _items(node, key)
            meta[key] = None if items is None else \
                [None if n is None else _maintainer(n, f"maintainers[{i}]") for i, n in enumerate(items)]
        elif key == "dependencies":
            items = _items(node, key)
            meta[key] = None if items is None else \
                [None if n is None else _dependency(n, f"dependencies[{i}]") for i, n in enumerate(items)]
        else:
            meta[key] = _string(node, key)


def _sanitize(text: str) -> str:
    """helm's ``sanitizeString``: every space character a plain space, what is not printable dropped."""
    return "".join(" " if c in _GO_SPACE else c for c in text if c in _GO_SPACE or c.isprintable())


def validate_metadata(meta: Dict[str, Any]) -> Dict[str, Any]:
    """``Metadata.Validate`` (strings sanitized, required fields, semver, type, maintainers,
    dependencies), then the config as ``json.Marshal(meta)`` orders and omits its fields. Raises
    ValueError with helm's reason."""
    for key in ("name", "description", "home", "icon", "condition", "tags", "appVersion", "kubeVersion"):
        if meta.get(key):
            meta[key] = _sanitize(meta[key])
    for key in _LISTS:
        if meta.get(key):
            meta[key] = [_sanitize(s) for s in meta[key]]
    if not meta.get("apiVersion"):
        raise ValueError("chart.metadata.apiVersion is required")
    name = meta.get("name") or ""
    if not name:
        raise ValueError("chart.metadata.name is required")
    if name in (".", "..") or name != posixpath.basename(name):
        raise ValueError(f"chart.metadata.name {name!r} is invalid")
    version = meta.get("version") or ""
    if not version:
        raise ValueError("chart.metadata.version is required")
    if not _SEMVER_RE.fullmatch(version):
        raise ValueError(f"chart.metadata.version {version!r} is invalid (not semantic versioning)")
    if meta.get("type", "") not in ("", "application", "library"):
        raise ValueError("chart.metadata.type must be application or library")
    for m in meta.get("maintainers") or []:
        if m is None:
            raise ValueError("maintainers must not contain empty or null nodes")
        for k in list(m):
            m[k] = _sanitize(m[k])
    seen = set()
    for d in meta.get("dependencies") or []:
        if d is None:
            raise ValueError("dependencies must not contain empty or null nodes")
        for k in ("name", "version", "repository", "condition"):
            if d.get(k):
                d[k] = _sanitize(d[k])
        if d.get("tags"):
            d["tags"] = [_sanitize(t) for t in d["tags"]]
        if d.get("alias") and not _ALIAS_RE.fullmatch(d["alias"]):
            raise ValueError(f"dependency {d.get('name', '')!r} has disallowed characters in the alias")
        key = d.get("alias") or d.get("name", "")
        if key in seen:
            raise ValueError(f"more than one dependency with name or alias {key!r}")
        seen.add(key)
    return _marshal(meta)


def _marshal(meta: Dict[str, Any]) -> Dict[str, Any]:
    """The struct's fields in order, ``omitempty`` ones left out when empty (a dependency's name and
    repository always written)."""
    out: Dict[str, Any] = {}
    for key in _METADATA:
        value = meta.get(key)
        if key == "maintainers" and value:
            value = [{k: m[k] for k in _MAINTAINER if m.get(k)} for m in value]
        elif key == "dependencies" and value:
            value = [{k: d.get(k, "") for k in _DEPENDENCY
                      if k in ("name", "repository") or d.get(k)} for d in value]
        elif key == "annotations" and value:
            value = dict(sorted(value.items()))
        if value:
            out[key] = value
    return out


def oci_annotations(config: Dict[str, Any], created: str) -> Dict[str, str]:
    """``generateOCIAnnotations``: the manifest's annotations helm writes (the chart's own after
    helm's, but never its title or version)."""
    notes: Dict[str, str] = {}

    def add(key: str, value: str) -> None:
        if value.strip():
            notes[key] = value

    add("org.opencontainers.image.description", config.get("description", ""))
    add("org.opencontainers.image.title", config["name"])
    add("org.opencontainers.image.version", config["version"])
    add("org.opencontainers.image.url", config.get("home", ""))
    add("org.opencontainers.image.created", created)
    if config.get("sources"):
        add("org.opencontainers.image.source", config["sources"][0])
    authors = []
    for m in config.get("maintainers") or []:
        text = m.get("name", "") + (f" ({m['email']})" if m.get("email") else "")
        authors.append(text)
    if authors:
        add("org.opencontainers.image.authors", ", ".join(authors))
    for key, value in (config.get("annotations") or {}).items():
        if key not in ("org.opencontainers.image.version", "org.opencontainers.image.title"):
            notes[key] = value
    return dict(sorted(notes.items()))


# --- the .tgz ---------------------------------------------------------------------------------------

class _Bounded:
    """The decompressed stream, refused past ``limit`` bytes (a gzip bomb stops here)."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw, self.left = raw, limit

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.raw.read(n if n >= 0 else self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise _Bad(0, f"expected at most {MAX_DECOMPRESSED // (1024 * 1024)} MiB decompressed (helm's bound), "
                       "found more")
        return data


def _member_name(name: str) -> Optional[str]:
    """The name helm's loader gives a member (its first folder cut off), or None for the chart's
    folder itself; _Bad for what helm refuses."""
    sep = "\\" if "\\" in name else "/"
    parts = name.split(sep)
    rest = "/".join(parts[1:])
    if rest.startswith("/"):
        raise _Bad(0, f"member {name[:200]!r}: expected a path inside the chart's folder, found an absolute one")
    cleaned = posixpath.normpath(rest) if rest else "."
    if cleaned == ".":
        raise _Bad(0, f"member {name[:200]!r}: expected content inside the chart's folder, found some outside it")
    if cleaned.startswith(".."):
        raise _Bad(0, f"member {name[:200]!r}: expected no '..', found a path out of the chart's folder")
    if _DRIVE_RE.match(cleaned):
        raise _Bad(0, f"member {name[:200]!r}: expected no drive letter")
    if parts[0] == "Chart.yaml":
        raise _Bad(0, "expected Chart.yaml in the chart's folder (NAME/Chart.yaml), found it at the top")
    return cleaned


def _metadata_files(fileobj: IO[bytes]) -> List[Tuple[str, bytes]]:
    """(name, bytes) of every top-level Chart.yaml and requirements.yaml, in archive order; every
    member's name and size checked as helm's loader checks them."""
    found: List[Tuple[str, bytes]] = []
    total = members = 0
    with gzip.GzipFile(fileobj=fileobj, mode="rb") as gz, \
            tarfile.open(fileobj=_Bounded(gz, MAX_DECOMPRESSED + 1024 * 1024), mode="r|") as tar:  # type: ignore
        for member in tar:
            members += 1
            if members > MAX_MEMBERS:
                raise _Bad(0, f"expected at most {MAX_MEMBERS} members, found more")
            if member.isdir() or not member.isreg():  # links, devices, FIFOs: ignored, never followed
                continue
            name = _member_name(member.name)
            if member.size > MAX_FILE:
                raise _Bad(0, f"member {member.name[:200]!r}: expected at most {MAX_FILE // (1024 * 1024)} MiB "
                           f"(helm's bound for one file), found {member.size} bytes")
            total += member.size
            if total > MAX_DECOMPRESSED:
                raise _Bad(0, f"expected at most {MAX_DECOMPRESSED // (1024 * 1024)} MiB of files (helm's bound), "
                           "found more")
            if name in ("Chart.yaml", "requirements.yaml"):
                src = tar.extractfile(member)
                data = src.read(member.size) if src is not None else b""
                found.append((name, data[3:] if data.startswith(b"\xef\xbb\xbf") else data))
    if members == 0:
        raise _Bad(0, "expected the files of a chart, found an empty archive")
    return found


def _yaml_doc(name: str, data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Bad(0, f"{name}: expected UTF-8, found byte {data[e.start]:#04x} at offset {e.start}") from None
    import yaml

    try:
        docs = compose_bounded(text, depth=YAML_DEPTH, nodes=YAML_NODES)
    except YamlTooBig as e:
        raise _Bad(e.line, f"{name}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise _Bad(mark.line + 1 if mark is not None else 0,
                   f"{name}: expected YAML, found an error: {getattr(e, 'problem', None) or e}") from None
    if not docs:
        return None
    return docs[0]


def read_chart(path: str, repository: str = DEFAULT_REPOSITORY) -> ChartPackage:
    """The chart package at ``path`` read and checked (ChartError for anything helm would not load,
    nothing written), named ``<repository>/<name>:<version>``."""
    what = f"exporting --chart {path}"
    try:
        st = os.stat(path)
    except OSError as e:
        raise ChartError(f"{what}: expected a chart package (.tgz), found {e.strerror or 'nothing'}",
                         hint="helm package DIR writes NAME-VERSION.tgz; nothing was written") from None
    if not stat.S_ISREG(st.st_mode):
        raise ChartError(f"{what}: expected a chart package (.tgz), found something that is not a regular file",
                         hint="give the .tgz helm package or helm pull wrote; nothing was written")
    if st.st_size > MAX_TGZ:
        raise ChartError(f"{what}: expected at most {MAX_TGZ // (1024 * 1024)} MiB, found {st.st_size} bytes",
                         hint="nothing was written")
    meta: Dict[str, Any] = {}
    try:
        with open(path, "rb") as f:
            if f.read(3) != b"\x1f\x8b\x08":
                raise _Bad(0, "expected a gzipped tar (helm package writes one), found other bytes")
            f.seek(0)
            files = _metadata_files(f)
        charts = [d for n, d in files if n == "Chart.yaml"]
        if not charts:
            raise _Bad(0, "expected NAME/Chart.yaml in the archive, found none: not a Helm chart")
        for name, data in files:  # helm's loader: each Chart.yaml, then requirements.yaml, onto one metadata
            if name == "Chart.yaml":
                _apply(meta, name, data)
                meta["apiVersion"] = meta.get("apiVersion") or "v1"
        for name, data in files:
            if name == "requirements.yaml":
                _apply(meta, name, data)
        config = validate_metadata(meta)
    except _Bad as e:
        at = f" (line {e.line})" if e.line else ""
        raise ChartError(f"{what}: {e}{at}", hint="check the file with `helm show chart FILE`; nothing was written") \
            from None
    except ValueError as e:
        raise ChartError(f"{what}: Chart.yaml: {e}", hint="helm would refuse this chart too; fix Chart.yaml and "
                         "`helm package` again; nothing was written") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        raise ChartError(f"{what}: expected a gzipped tar (a chart package), found a damaged one: {e}"[:400],
                         hint="download or package the chart again; nothing was written") from None
    chart = _package(path, st, config, repository)
    prov = path + ".prov"
    if os.path.lexists(prov):
        _check_prov(prov, path, chart.title)
        chart = dataclasses.replace(chart, prov=prov)
    return chart


_PROV_SUM = re.compile(r"^[ \t]+['\"]?([^'\":\n]+?)['\"]?:[ \t]+['\"]?sha256:([0-9a-f]{64})['\"]?[ \t]*$", re.M)


def _check_prov(prov: str, path: str, title: str) -> None:
    """``CHART.tgz.prov`` (what helm push carries beside the chart, helm's pkg/pusher/ocipusher.go): a
    regular file of at most :data:`MAX_PROV`, a PGP clear-signed message (pkg/provenance/sign.go
    ``messageBlock``: the metadata, ``...``, then ``files:`` with ``NAME-VERSION.tgz: sha256:HEX``)
    whose ``files:`` names this package under the name helm pull gives it, with this package's
    sha256: else ``helm pull --verify`` refuses it on the far side, so it is refused here. The PGP
    signature is not checked (no keyring here; helm checks it): the file is carried, not trusted."""
    what = f"exporting --chart {path} with its provenance file {prov}"
    try:
        fd = os.open(prov, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ChartError(f"{what}: expected a regular file, found {e.strerror or e}",
                         hint="helm package --sign writes CHART.tgz.prov; remove or replace it; nothing was written"
                         ) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ChartError(f"{what}: expected a regular file, found another kind of file",
                             hint="remove it or put the file itself there; nothing was written")
        raw = f.read(MAX_PROV + 1)
    if len(raw) > MAX_PROV:
        raise ChartError(f"{what}: expected at most {MAX_PROV // 1024} KiB, found more", hint="nothing was written")
    text = raw.decode("utf-8", "replace")
    if not text.startswith("-----BEGIN PGP SIGNED MESSAGE-----") or "-----BEGIN PGP SIGNATURE-----" not in text:
        raise ChartError(f"{what}: expected a PGP clear-signed provenance file, found other text",
                         hint="helm package --sign writes one; remove the file to carry the chart without it; "
                         "nothing was written")
    signed = text.split("-----BEGIN PGP SIGNATURE-----", 1)[0]
    files = signed.split("\n...\n", 1)[1] if "\n...\n" in signed else ""
    sums = dict(_PROV_SUM.findall(files.split("files:", 1)[1] if "files:" in files else ""))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if sums.get(title) != digest.hexdigest():
        found = ", ".join(f"{k}: sha256:{v[:12]}..." for k, v in sums.items()) or "no checksum"
        raise ChartError(f"{what}: expected its files: to name {title} with this package's sha256 "
                         f"({digest.hexdigest()[:12]}...), found {found}"[:400],
                         hint="helm pull --verify would refuse the pair: sign this package again (helm package "
                         "--sign) or remove the .prov; nothing was written")


def _apply(meta: Dict[str, Any], name: str, data: bytes) -> None:
    doc = _yaml_doc(name, data)
    if doc is not None:
        try:
            unmarshal_metadata(meta, doc)
        except _Bad as e:
            raise _Bad(e.line, f"{name}: {e}") from None


def _package(path: str, st: os.stat_result, config: Dict[str, Any], repository: str) -> ChartPackage:
    name, version = config["name"], config["version"]
    tag = version.replace("+", "_")  # helm's newReference: OCI tags have no '+'
    ref = f"{repository}/{name}:{tag}"
    if not valid_tag(tag) or not valid_name_component(name) or not valid_ref(ref):
        raise ChartError(f"exporting --chart {path}: expected a chart name and version that make an OCI reference, "
                         f"found {ref!r}", hint="OCI repository names are lowercase letters, digits and separators; "
                         "helm push refuses this chart too; nothing was written")
    created = datetime.datetime.fromtimestamp(int(st.st_mtime), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ChartPackage(path, name, version, ref, go_json(config), oci_annotations(config, created), st.st_size)


def check_repository(value: str) -> str:
    """``--chart-repository PREFIX``: a repository path the charts go under (``charts``)."""
    value = value.strip("/")
    if not value or not valid_ref(f"{value}/x:1"):
        raise UsageError(f"exporting with --chart-repository {value!r}: expected a repository path such as charts "
                         "or team/charts", hint="lowercase letters, digits, '.', '_', '-' and '/'")
    return value


def add_chart_options(e: argparse.ArgumentParser) -> None:
    e.add_argument("--chart", action="append", default=[], metavar="CHART.tgz",
                   help="carry this Helm chart package as Helm's OCI artifact (what helm push writes), named "
                   "REPOSITORY/NAME:VERSION, so `helm pull oci://HOST:PORT/charts/NAME --version V` works against "
                   "serve or a registry the bundle is pushed to (repeatable; docs/kubernetes.md)")
    e.add_argument("--chart-repository", default=DEFAULT_REPOSITORY, metavar="PATH",
                   help=f"the repository path the charts go under (default {DEFAULT_REPOSITORY}: charts/NAME)")


def read_charts(paths: Sequence[str], repository: str, *, schema: int = 3) -> Tuple[ChartPackage, ...]:
    """Every ``--chart``, read before anything is exported; two of one name and version refused."""
    if not paths:
        return ()
    if schema < 3:
        raise UsageError(f"exporting charts with --schema {schema}: charts are carried by schema 3 bundles (3.6)",
                         hint="drop --schema or use --schema 3")
    repository = check_repository(repository)
    charts = [read_chart(p, repository) for p in paths]
    seen: Dict[str, str] = {}
    for c in charts:
        if c.ref in seen:
            raise ChartError(f"exporting --chart {c.path}: expected each chart once, found {c.ref} again "
                             f"(also {seen[c.ref]})", hint="give each chart version once; nothing was written")
        seen[c.ref] = c.path
    return tuple(charts)


def write_chart(store: BlobStore, chart: ChartPackage, on_bytes: Optional[Callable[[int], None]] = None
                ) -> FileArtifact:
    """The chart's layer (the .tgz as it is), its config and manifest into ``store``."""
    with open(chart.path, "rb") as src:
        written = store.write_raw(src, on_bytes=on_bytes)
    layer = BlobRef(CHART_LAYER, written.digest, written.size)
    cfg = store.write_bytes(chart.config)
    config = BlobRef(CHART_CONFIG, cfg.digest, cfg.size)
    carried = [CarriedFile(chart.title, layer, 0o644)]
    if chart.prov is not None:  # helm push: the provenance file is the second layer
        with open(chart.prov, "rb") as src:
            prov = store.write_raw(src, on_bytes=on_bytes)
        carried.append(CarriedFile(chart.title + ".prov", BlobRef(PROV_LAYER, prov.digest, prov.size), 0o644))
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": CHART_CONFIG, "config": config.to_dict(),
           "layers": [{**c.blob.to_dict(),
                       "annotations": {TITLE_ANNOTATION: c.title, MODE_ANNOTATION: mode_text(0o644)}} for c in carried],
           "annotations": chart.annotations}
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    manifest = store.write_bytes(raw)
    return FileArtifact(chart.ref, CHART_CONFIG, BlobRef(OCI_MANIFEST, manifest.digest, manifest.size), config,
                        tuple(carried))


def carry_artifacts(store: BlobStore, files: Optional[FileSet], charts: Sequence[ChartPackage],
                    on_bytes: Optional[Callable[[int], None]] = None) -> Tuple[FileArtifact, ...]:
    """The export's file artifacts: ``--files``/``--file``'s, then one per ``--chart``."""
    return (*carry_files(store, files, on_bytes), *(write_chart(store, c, on_bytes) for c in charts))
