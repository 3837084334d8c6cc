"""Structural rules: the importer is stdlib-only (it runs as a zipapp on offline hosts, Python
3.8+), the format lives in importer/, which never imports the exporter, and inside importer/ the
folders are layers whose imports only point down (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
IMPORTER_FILES = sorted((REPO / "importer").rglob("*.py"))
# Optional accelerators imported lazily by name (importlib), never at module level.
NEWER_APIS = {"removeprefix", "removesuffix", "file_digest", "extraction_filter"}


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_importer_imports_only_the_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    allowed = set(sys.stdlib_module_names) | {"importer", "__future__"}
    bad = [(name, line) for name, line in _imports(tree) if name not in allowed]
    assert not bad, f"{path}: non-stdlib imports {bad}"


#: what an older python3 runs before the importer knows its version (importer/launch.py): these
#: parse on 3.6, so RHEL 8's python3 gets a sentence instead of a SyntaxError traceback
ENTRY_FILES = [REPO / "importer" / name for name in ("__init__.py", "__main__.py", "launch.py")]


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_importer_parses_as_python_3_8(path: Path) -> None:
    src = path.read_text()
    tree = ast.parse(src, filename=str(path), feature_version=(3, 8))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & NEWER_APIS
    assert not used, f"{path}: uses APIs newer than Python 3.8: {used}"
    if path not in ENTRY_FILES and any(isinstance(n, (ast.AnnAssign, ast.FunctionDef)) for n in ast.walk(tree)) \
            and "->" in src:
        assert "from __future__ import annotations" in src, f"{path}: annotations need the __future__ import on 3.8"


@pytest.mark.parametrize("path", ENTRY_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_entry_point_parses_on_python_3_6(path: Path) -> None:
    src = path.read_text()
    tree = ast.parse(src, filename=str(path), type_comments=True, feature_version=(3, 6))
    assert "from __future__ import annotations" not in src, f"{path}: 3.6 has no such __future__ feature"
    assert not any(isinstance(n, ast.AnnAssign) or (isinstance(n, ast.FunctionDef) and (
        n.returns is not None or any(a.annotation is not None for a in n.args.args))) for n in ast.walk(tree)), \
        f"{path}: annotations (types go in comments here)"
    imported = {name for name, _ in _imports(tree)}
    assert imported <= {"os", "subprocess", "sys", "typing", "importer"}, f"{path}: imports {imported}"


def test_importer_never_imports_the_exporter() -> None:
    for path in IMPORTER_FILES:
        names = {name for name, _ in _imports(ast.parse(path.read_text()))}
        assert "bundle" not in names, path


# The floors of importer/, lowest first. A module may import from its own floor or below, never up.
# Top-level modules are named by file; everything else by its folder.
LAYERS: List[Set[str]] = [
    {"__init__", "errors"},
    {"format"},
    {"streams"},
    {"engines"},
    {"input"},
    {"verify"},
    {"sinks", "registry", "serve", "transfer", "receipts"},
    {"pipeline", "inventory"},
    {"smoke"},
    {"cli", "__main__", "launch"},
]
FLOOR = {part: n for n, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    """``importer.verify.bundle`` -> ``verify``; ``importer.errors`` -> ``errors``; ``importer`` -> ``__init__``."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
    return ".".join(parts)


def _importer_targets(path: Path) -> List[Tuple[str, int]]:
    """Every importer module ``path`` imports (at any depth: lazy and TYPE_CHECKING imports count)."""
    targets = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "importer"]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import; write importer.... in full"
            if node.module == "importer":  # from importer import errors / __version__
                targets += [(f"importer.{a.name}", node.lineno) for a in node.names]
            elif node.module and node.module.split(".")[0] == "importer":
                targets.append((node.module, node.lineno))
    return targets


def test_every_importer_module_has_a_floor() -> None:
    unplaced = sorted({_part(_module_name(p)) for p in IMPORTER_FILES} - set(FLOOR))
    assert not unplaced, f"importer parts with no floor in LAYERS: {unplaced}"


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_importer_imports_point_only_down(path: Path) -> None:
    own = FLOOR[_part(_module_name(path))]
    up = []
    for target, line in _importer_targets(path):
        part = _part(target)
        floor = FLOOR.get(part, 0)  # names on importer/__init__ (__version__, SCHEMA_MAJOR): the ground floor
        if floor > own:
            up.append(f"line {line}: {target} (floor {floor} > {own})")
    assert not up, f"{path.relative_to(REPO)} imports upward: {up}"


#: folders on one floor that never import each other: the two halves of registry work (the client
#: that pushes and reads registries; the server of ``bundle-import serve``). cli/serve.py joins them.
APART = [("registry", "serve")]


@pytest.mark.parametrize("pair", APART, ids="-".join)
def test_the_client_and_server_halves_stay_apart(pair: Tuple[str, str]) -> None:
    crossing = []
    for path in IMPORTER_FILES:
        own = _part(_module_name(path))
        if own in pair:
            other = pair[1 - pair.index(own)]
            crossing += [f"{path.relative_to(REPO)}:{line}: {t}"
                         for t, line in _importer_targets(path) if _part(t) == other]
    assert not crossing, f"{pair[0]}/ and {pair[1]}/ import each other: {crossing}"


def test_the_floor_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check above is not vacuous: a format module importing the pipeline is caught."""
    probe = REPO / "importer" / "format" / "digest.py"
    fake = tmp_path / "digest.py"
    fake.write_text("from importer.pipeline.importing import import_bundle\nfrom importer import errors\n")
    targets = _importer_targets(fake)
    assert targets == [("importer.pipeline.importing", 1), ("importer.errors", 2)]
    own = FLOOR[_part(_module_name(probe))]
    assert [t for t, _ in targets if FLOOR[_part(t)] > own] == ["importer.pipeline.importing"]


# The floors of bundle/ (the exporter), lowest first: the command lines on top, then the commands'
# helpers, the export, the writers, the sources, and the small pieces everything uses.
BUNDLE_LAYERS: List[Set[str]] = [
    {"__init__", "embed", "blobstore", "sshtunnel", "imagelist", "yamlbound", "progressui", "k8simages"},
    {"sources"},
    {"writer", "legacy_writer", "exportloop", "archive", "push", "keys", "cudaneeds", "gpufit", "fileartifact",
     "gpudriver", "helmchart", "bootstrap", "artifactsign", "asimage"},
    {"export"},
    {"keycmds", "transfercmds", "tlscert", "pullcheck", "choices"},
    {"cli", "__main__"},
]
BUNDLE_FLOOR = {part: n for n, parts in enumerate(BUNDLE_LAYERS) for part in parts}
BUNDLE_FILES = sorted((REPO / "bundle").rglob("*.py"))


def _targets(path: Path, package: str) -> List[Tuple[str, int]]:
    """Every module of ``package`` that ``path`` imports, at any depth (lazy imports count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                found += [(f"{package}.{a.name}", node.lineno) for a in node.names]
            elif node.module.split(".")[0] == package:
                found.append((node.module, node.lineno))
    return found


def test_every_bundle_module_has_a_floor() -> None:
    unplaced = sorted({_part(_module_name(p)) for p in BUNDLE_FILES} - set(BUNDLE_FLOOR))
    assert not unplaced, f"bundle parts with no floor in BUNDLE_LAYERS: {unplaced}"


@pytest.mark.parametrize("path", BUNDLE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_bundle_imports_point_only_down(path: Path) -> None:
    own = BUNDLE_FLOOR[_part(_module_name(path))]
    up = [f"line {line}: {t}" for t, line in _targets(path, "bundle") if BUNDLE_FLOOR.get(_part(t), 0) > own]
    assert not up, f"{path.relative_to(REPO)} imports upward: {up}"


def _known_module(name: str, modules: Set[str]) -> str:
    """``from importer.format import digest`` names a module; ``from importer.format.digest import
    Digest`` names one too: the longest prefix that is a module of the tree."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


#: what stores blobs and writes bundles: a source module importing one has grown an export loop of its own
STORE_MODULES = ("bundle.blobstore", "bundle.writer", "bundle.legacy_writer", "bundle.exportloop", "bundle.export")
SOURCE_FILES = sorted((REPO / "bundle" / "sources").glob("*.py"))


def store_imports(path: Path) -> List[str]:
    """``line N: module`` for every import in ``path`` of a module that stores blobs or writes a bundle."""
    return [f"line {line}: {target}" for target, line in _targets(path, "bundle")
            if any(target == m or target.startswith(m + ".") for m in STORE_MODULES)]


@pytest.mark.parametrize("path", SOURCE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_sources_resolve_and_read_but_never_store(path: Path) -> None:
    """Issue 41 point 4: a source says what an export carries (resolve) and gives the bytes (blobs,
    stream); the one export loop (bundle/exportloop.py) stores them. A source that imports the blob
    store or a writer copies layers itself again."""
    assert store_imports(path) == [], f"{path.relative_to(REPO)} stores blobs itself: yield records to the " \
                                      "export loop (bundle/exportloop.py) instead"


def test_the_store_guard_sees_a_source_that_stores(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("from bundle.blobstore import BlobStore\nfrom bundle import writer\n"
                     "from bundle.sources.records import Descriptor\n"
                     "def export(store: BlobStore) -> None:\n    import bundle.exportloop\n")
    assert store_imports(rogue) == ["line 1: bundle.blobstore", "line 2: bundle.writer", "line 5: bundle.exportloop"]
    assert len(SOURCE_FILES) >= 10


def import_cycles(files: List[Path]) -> List[List[str]]:
    """The import cycles among ``files`` (strongly connected groups of more than one module, or a
    module that imports itself), with every import counted, lazy ones included."""
    modules = {_module_name(p): p for p in files}
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        edges: Set[str] = set()
        for package in ("importer", "bundle"):
            for target, _ in _targets(path, package):
                known = _known_module(target, set(modules))
                if known and known != name and not name.startswith(known + "."):  # a package's own __init__
                    edges.add(known)
        graph[name] = edges
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(IMPORTER_FILES + BUNDLE_FILES)
    assert not cycles, f"import cycles (lazy imports count): {cycles}"


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path: Path) -> None:
    """Not vacuous: two modules that import each other, one of them inside a function, are a cycle."""
    pkg = tmp_path / "bundle"
    pkg.mkdir()
    (pkg / "one.py").write_text("from bundle.two import f\n")
    (pkg / "two.py").write_text("def f():\n    from bundle import one\n    return one\n")
    global REPO
    saved = REPO
    REPO = tmp_path
    try:
        assert import_cycles([pkg / "one.py", pkg / "two.py"]) == [["bundle.one", "bundle.two"]]
    finally:
        REPO = saved


def test_pyz_holds_only_the_importer(tmp_path: Path) -> None:
    import zipfile

    from bundle.embed import build_pyz

    data = build_pyz()
    assert data == build_pyz()  # reproducible: same sources, same digest
    (tmp_path / "x.pyz").write_bytes(data)
    names = zipfile.ZipFile(tmp_path / "x.pyz").namelist()
    assert "__main__.py" in names
    assert all(n == "__main__.py" or n.startswith("importer/") for n in names)
    assert "importer/cli/main.py" in names


def test_pyz_verifies_on_python_3_8_with_the_zstd_cli(tmp_path: Path) -> None:
    """Python 3.8 without the zstandard module: the importer falls back to the zstd command."""
    from tests.kit.bundlegen import make_bundle
    from tests.kit.helpers import run_pyz
    from tests.kit.trustkit import python38

    b = make_bundle(tmp_path / "b")
    proc = run_pyz(b, "--verify-only", "--json", python=python38(), drop_env=())
    assert proc.returncode == 0, proc.stderr
    assert '"layersChecked": 3' in proc.stdout


def test_pyz_without_any_zstd_decoder_still_verifies(tmp_path: Path) -> None:
    """Python 3.8 alone (no zstandard module, no zstd command on PATH, no compression.zstd): a
    default (zstd) bundle verifies with the pure-Python decoder, which says so once on stderr."""
    import os

    from tests.kit.bundlegen import make_bundle
    from tests.kit.helpers import run_pyz
    from tests.kit.trustkit import python38

    b = make_bundle(tmp_path / "b")
    python = python38()
    only_python = tmp_path / "bin"
    only_python.mkdir()
    (only_python / "python3").symlink_to(python)
    proc = run_pyz(b, "--verify-only", "--json", python="python3", drop_env=("",),  # nothing but these two
                   env={"PATH": str(only_python), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert '"layersChecked": 3' in proc.stdout
    assert proc.stderr.count("pure-Python decoder") == 1, proc.stderr
    assert "error" not in proc.stderr
    assert not os.path.exists(only_python / "zstd")


def _only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def test_architecture_doc_lists_every_module_once() -> None:
    """docs/architecture.md names every module of importer/ and bundle/ exactly once (a package
    __init__.py that holds only its docstring is described by its folder's heading instead)."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `((?:importer|bundle)/[^`]+\.py)` \|", doc, flags=re.M)
    files = sorted((REPO / "importer").rglob("*.py")) + sorted((REPO / "bundle").rglob("*.py"))
    wanted = {p.relative_to(REPO).as_posix() for p in files if not (p.name == "__init__.py" and _only_a_docstring(p))}
    assert sorted(set(rows) - wanted) == [], "docs/architecture.md lists modules that do not exist"
    assert sorted(wanted - set(rows)) == [], "docs/architecture.md leaves out these modules"
    assert sorted(r for r in rows if rows.count(r) > 1) == [], "docs/architecture.md lists these twice"


def _sink_classes() -> list[type]:
    from importer.registry.sink import RegistrySink
    from importer.sinks.containerd import ContainerdSink
    from importer.sinks.docker import DockerSink
    from importer.sinks.oci_layout import OciLayoutSink
    from importer.sinks.podman import PodmanSink

    return [DockerSink, PodmanSink, ContainerdSink, OciLayoutSink, RegistrySink]


def _protocol_methods(protocol: type) -> List[str]:
    """The methods an optional sink protocol adds to the core (its own, not Sink's)."""
    return sorted(name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_"))


def capability_mismatches(cls: type) -> List[str]:
    """Where ``cls.capabilities`` and the methods ``cls`` defines disagree (issue 41 point 2): a
    flag is True exactly where the class implements every method of the flag's protocol."""
    from importer.sinks import CAPABILITY_PROTOCOLS

    found = []
    for flag, protocol in CAPABILITY_PROTOCOLS.items():
        methods = _protocol_methods(protocol)
        held = [m for m in methods if hasattr(cls, m)]
        declared = getattr(cls.capabilities, flag)
        if declared is not (held == methods) or held not in ([], methods):
            found.append(f"{cls.__name__}: {flag}={declared} with {held or 'none'} of {methods}")
    return found


@pytest.mark.parametrize("cls", _sink_classes(), ids=lambda c: c.__name__)
def test_each_sink_declares_exactly_the_capabilities_it_implements(cls: type) -> None:
    """The Sink contract (importer/sinks/__init__.py): one frozen SinkCapabilities value per class,
    each flag True exactly where the sink implements the flag's protocol; the pipeline asks the
    value, so a flag that lies would either hide a capability or hand the pipeline a sink that
    lacks the method (mypy checks the signatures: importer/sinks/choose.py)."""
    import dataclasses

    from importer.sinks import CAPABILITY_PROTOCOLS, SinkBase, SinkCapabilities

    assert issubclass(cls, SinkBase) and cls.kind != SinkBase.kind
    assert type(cls.capabilities) is SinkCapabilities
    flags = [f.name for f in dataclasses.fields(SinkCapabilities)]
    assert sorted(flags) == sorted([*CAPABILITY_PROTOCOLS, "reads_archives"])
    assert capability_mismatches(cls) == []


def test_the_capability_check_sees_a_lying_flag() -> None:
    from importer.sinks import SinkCapabilities
    from importer.sinks.podman import PodmanSink

    class Boasting(PodmanSink):  # says it keeps file artifacts, implements none of it
        capabilities = SinkCapabilities(loads_docker_archive=True, completes_deltas=True, lists_tags=True,
                                        lists_images=True, reexports=True, takes_file_artifacts=True)

    class Hiding(PodmanSink):  # implements a delta completion it does not declare
        capabilities = SinkCapabilities(loads_docker_archive=True, lists_tags=True, lists_images=True,
                                        reexports=True)

    class Half(PodmanSink):  # one of the two file-artifact methods
        def ref_digest(self, ref: str) -> None:
            return None

    assert capability_mismatches(Boasting) == [
        "Boasting: takes_file_artifacts=True with none of ['load_files', 'ref_digest']"]
    assert capability_mismatches(Hiding) == [
        "Hiding: completes_deltas=False with ['prepare_delta'] of ['prepare_delta']"]
    assert capability_mismatches(Half) == [
        "Half: takes_file_artifacts=False with ['ref_digest'] of ['load_files', 'ref_digest']"]


def test_no_any_in_the_sink_contract() -> None:
    """Issue 41 point 2: the Sink core and its optional protocols name real types (DeltaBase,
    FedCommand, FileArtifact, ArchiveScan), never ``Any``."""
    contract = REPO / "importer" / "sinks" / "__init__.py"
    assert any_uses(contract) == [], "importer/sinks/__init__.py uses Any: name the real type or a small Protocol"


def test_the_pipeline_asks_the_sink_contract_not_getattr() -> None:
    """No ``getattr(sink, ...)``/``hasattr(sink, ...)`` probing for capabilities left in the code."""
    probing = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:self\.)?sink\b")
    found = [f"{p.relative_to(REPO)}:{n}" for p in [*IMPORTER_FILES, *(REPO / "bundle").rglob("*.py")]
             for n, line in enumerate(p.read_text().splitlines(), 1) if probing.search(line)]
    assert found == []


def test_no_proxy_objects_stand_in_for_a_sink() -> None:
    """A sink declares what it can do in one place (its flags); no wrapper forwards attributes
    with ``__getattr__`` (a second capability list in disguise)."""
    found = [f"{p.relative_to(REPO)}:{n}" for p in IMPORTER_FILES
             for n, line in enumerate(p.read_text().splitlines(), 1) if "def __getattr__" in line]
    assert found == []


# Issue 41 point 2: the engine clients (Docker's API and CLI, ctr, podman) and the facts engines
# report live in importer/engines/. Nothing under sinks/ talks to an engine itself (a socket, an HTTP
# connection, a command line that starts with the engine's program, a ``...Client`` class, the Engine
# API's request functions: asking an engine is the client's, streaming a load into it the sink's), and no
# module takes a client or an engine fact from importer.sinks (the exporter's sources included).
SINKS = REPO / "importer" / "sinks"
ENGINES = REPO / "importer" / "engines"
ENGINE_PROGRAMS = {"docker", "ctr", "podman"}
_TALKS = {"socket", "http.client"}
_REQUESTS = {"api_call", "api_failed", "image_url"}


def engine_talk(path: Path) -> List[str]:
    """``line: what`` for every place ``path`` talks to an engine itself, as only a client may."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in _TALKS]
        elif isinstance(node, ast.ImportFrom) and node.module in _TALKS:
            found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.ImportFrom) and node.module == "importer.engines.dockerapi":
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in _REQUESTS]
        elif isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in ENGINE_PROGRAMS:
            found.append(f"{node.lineno}: [{node.elts[0].value!r}, ...]")
        elif isinstance(node, ast.ClassDef) and node.name.endswith("Client"):
            found.append(f"{node.lineno}: class {node.name}")
    return sorted(found, key=lambda x: int(x.split(":")[0]))


def _engine_names() -> Set[str]:
    """The modules of importer/engines/ and the top-level names they define."""
    names = {p.stem for p in ENGINES.glob("*.py") if p.name != "__init__.py"}
    for path in ENGINES.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def clients_from_sinks(path: Path, engine_names: Set[str]) -> List[str]:
    """``line: module.name`` for every engine client, engine module or engine fact ``path`` takes from
    importer.sinks."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[:2] == ["importer", "sinks"]:
            tail = node.module.split(".")[2:]
            if tail and tail[0] in engine_names:
                found.append(f"{node.lineno}: {node.module}")
            found += [f"{node.lineno}: {node.module}.{a.name}" for a in node.names if a.name in engine_names]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: {a.name}" for a in node.names
                      if a.name.split(".")[:2] == ["importer", "sinks"] and a.name.split(".")[2:3] and
                      a.name.split(".")[2] in engine_names]
    return found


@pytest.mark.parametrize("path", sorted(SINKS.glob("*.py")), ids=lambda p: p.name)
def test_no_engine_client_under_sinks(path: Path) -> None:
    assert engine_talk(path) == [], f"{path.relative_to(REPO)} talks to an engine itself: " \
                                    "put that in a client under importer/engines/"


def test_engine_clients_are_taken_from_engines() -> None:
    names = _engine_names()
    files = [*IMPORTER_FILES, *BUNDLE_FILES, *sorted((REPO / "tests").rglob("*.py")),
             *sorted((REPO / "scripts").rglob("*.py"))]
    found = [f"{p.relative_to(REPO)}:{use}" for p in files for use in clients_from_sinks(p, names)]
    assert found == [], "engine clients and facts are imported from importer/engines/, not importer.sinks"


def test_the_engine_guards_see_a_client_under_sinks(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("import socket\nfrom http.client import HTTPConnection\n"
                     "class PodmanClient:\n    def argv(self):\n        return ['podman', '--root', self.root]\n"
                     "def f(d):\n    return [*d, 'save']\n"
                     "from importer.engines.dockerapi import ApiLoad, api_call, socket_path\n")
    assert engine_talk(rogue) == ["1: import socket", "2: from http.client", "3: class PodmanClient",
                                  "5: ['podman', ...]", "8: api_call"]
    source = tmp_path / "source.py"
    source.write_text("from importer.sinks.dockerclient import DockerClient\n"
                      "from importer.sinks import EngineImage, Sink\n"
                      "from importer.sinks.ociarchive import copy_blob\nimport importer.sinks.ctrclient\n")
    assert clients_from_sinks(source, _engine_names()) == [
        "1: importer.sinks.dockerclient", "1: importer.sinks.dockerclient.DockerClient",
        "2: importer.sinks.EngineImage", "4: importer.sinks.ctrclient"]
    assert {"DockerClient", "CtrClient", "PodmanClient", "EngineImage", "EngineInfo", "dockerapi"} <= _engine_names()


# Issue 41 point 1, first step: the registry is an ordinary sink (``capabilities.pushes``); no pipeline
# module sets one sink apart with ``isinstance`` or reaches into a sink's insides (its client, its last push).
_INSIDES = {"client", "last_push", "concurrency"}


def sink_special_cases(path: Path) -> List[str]:
    """``line: what`` wherever ``path`` treats one sink class apart or reads a sink's insides."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2 and re.search(r"Sink\b", ast.unparse(node.args[1])):
            found.append(f"{node.lineno}: isinstance(..., {ast.unparse(node.args[1])})")
        elif isinstance(node, ast.Attribute) and node.attr in _INSIDES and isinstance(node.value, ast.Name) \
                and node.value.id == "sink":
            found.append(f"{node.lineno}: sink.{node.attr}")
    return sorted(found, key=lambda x: int(x.split(":")[0]))


@pytest.mark.parametrize("path", sorted((REPO / "importer" / "pipeline").glob("*.py")), ids=lambda p: p.name)
def test_the_pipeline_sets_no_sink_apart(path: Path) -> None:
    assert sink_special_cases(path) == [], f"{path.relative_to(REPO)}: ask the sink's capabilities, narrow with " \
                                           "importer/sinks/__init__.py's functions"


def test_the_sink_apart_guard_sees_it(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f(sink, bundle):\n    assert isinstance(sink, RegistrySink)\n"
                     "    push_all(bundle, sink.client)\n    sink.last_push = 1\n"
                     "    return sink.probe(), bundle.client\n")
    assert sink_special_cases(rogue) == ["2: isinstance(..., RegistrySink)", "3: sink.client", "4: sink.last_push"]


def test_only_docker_reads_a_tar_or_parts_in_place() -> None:
    from importer.sinks import SinkBase

    readers = [c.__name__ for c in _sink_classes() if c.capabilities.reads_archives]
    assert readers == ["DockerSink"] and SinkBase.capabilities.reads_archives is False


def test_a_sink_without_a_capability_refuses_it_by_name() -> None:
    from importer.errors import UsageError
    from importer.registry.sink import RegistrySink
    from importer.sinks import delta_completing, inventorying, reexporting

    sink = RegistrySink("127.0.0.1:5000/team")
    with pytest.raises(UsageError, match=r"--deep with the registry engine: expected an engine that can export"):
        reexporting(sink)
    with pytest.raises(UsageError, match=r"completing a delta bundle with the registry engine"):
        delta_completing(sink)
    assert inventorying(sink) is sink


def test_one_test_kit() -> None:
    """tests/kit/ is the one kit (issue 27): no helper module beside the test files, and no test
    file makes its own pristine bundle fixture (the kit's session fixtures serve them all)."""
    tests = REPO / "tests"
    stray = sorted(p.name for p in tests.glob("*.py") if not p.name.startswith("test_")
                   and p.name not in ("__init__.py", "conftest.py"))
    assert stray == [], f"helper modules outside tests/kit/: {stray}"
    own = sorted(p.name for p in tests.glob("test_*.py")
                 if re.search(r"^def (pristine|pristine_multi)\(", p.read_text(), re.M))
    assert own == [], f"test files defining their own pristine bundle (use tests/kit/fixtures.py): {own}"


def test_no_function_over_80_lines_outside_cli_tables() -> None:
    """Issue 27: small functions; an argparse table (``build_parser``) may run longer."""
    long = []
    for path in IMPORTER_FILES + BUNDLE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "build_parser":
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 80:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


REFERENCE_PARSER = REPO / "importer" / "format" / "reference.py"
# A reference split by hand: at '@' (the digest), at the last ':' (the tag, or a host's port).
_REFERENCE_SPLITS = {("partition", "@"), ("rpartition", "@"), ("split", "@"), ("rsplit", "@"),
                     ("rfind", ":"), ("rpartition", ":"), ("rfind", "@"), ("find", "@")}


# A variable or attribute holding a reference (or its name, or a registry named on its own: a
# mirror, a --registry target) cut at ':' (a transport, a tag) or at the first '/' (the registry
# host), also after .strip()/.lower(): what split_transport, split_host_path and split_registry are for.
_REFERENCE_VARS = {"ref", "reference", "name", "mirror", "registry", "target"}
_CUTS = {"partition", "rpartition", "split", "rsplit"}


def _receiver(node: ast.expr) -> str:
    """The name a method is called on: ``ref``, ``cfg.mirror`` -> ``mirror``, ``name.strip()`` -> ``name``."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("strip", "lstrip", "rstrip", "lower"):
        node = node.func.value
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _cuts_a_reference(node: ast.Call) -> bool:
    func, sep = node.func, node.args[0]
    if not (isinstance(func, ast.Attribute) and _receiver(func.value) in _REFERENCE_VARS
            and func.attr in _CUTS and isinstance(sep, ast.Constant) and sep.value in (":", "/")):
        return False
    return func.attr.endswith("partition") or len(node.args) > 1 or bool(node.keywords)  # not a component list


def reference_splits(path: Path) -> List[str]:
    """``line: .method("sep")`` of every hand-written reference split in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                and isinstance(node.args[0], ast.Constant)
                and ((node.func.attr, node.args[0].value) in _REFERENCE_SPLITS or _cuts_a_reference(node))):
            found.append(f"{node.lineno}: .{node.func.attr}({node.args[0].value!r})")
    return found


@pytest.mark.parametrize("path", IMPORTER_FILES + BUNDLE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_references_are_split_only_by_the_one_parser(path: Path) -> None:
    """Image references (name, tag, digest, host, port) are split in importer/format/reference.py
    alone (split_reference, split_host_path, split_registry, split_host_port, parse_reference); a second
    hand-written parser drifts from it (a tag read where a port is, a digest left unchecked)."""
    if path == REFERENCE_PARSER:
        return
    assert reference_splits(path) == [], f"{path.relative_to(REPO)} splits a reference by hand: " \
                                         "call importer.format.reference instead"


def test_the_reference_guard_sees_a_hand_written_split(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text('def tag_of(ref):\n    name, _, digest = ref.partition("@")\n'
                     '    return name[name.rfind(":") + 1:]\n'
                     'def transport_of(ref):\n    return ref.partition(":")\n'  # bundle/sources/choose.py's
                     'def repository_of(name):\n    return name.partition("/")[2], name.split("/", 1)\n'
                     'def parts(name):\n    return name.split("/")\n'  # components: not a cut
                     'def mirror_host(cfg, target):\n'  # importer/serve/nodeconfig.py's cfg.mirror
                     '    return cfg.mirror.partition("/")[0], target.strip().partition("/")\n')
    assert sorted(reference_splits(rogue)) == ["11: .partition('/')", "11: .partition('/')", "2: .partition('@')",
                                               "3: .rfind(':')", "5: .partition(':')", "7: .partition('/')",
                                               "7: .split('/')"]
    assert reference_splits(REFERENCE_PARSER) != []  # the parser itself is what the guard would see


# The reference grammar as a copy spells it: a tag (its 128-character bound, its two classes), a
# name component (its lowercase start, its separators), a digest, Docker Hub's names and its
# "library/". importer/format/reference.py writes them (the digest: importer/format/digest.py).
DIGEST_MODULE = REPO / "importer" / "format" / "digest.py"
_GRAMMAR_COPIES = (
    ("a tag pattern", re.compile(r"\{0,127\}|\[A-Za-z0-9_\]\[A-Za-z0-9_\.-\]|\[\\w\]\[\\w\.-\]|\\w\[\\w\.-\]")),
    ("a name component pattern", re.compile(r"\[a-z0-9\]\+\(\?:|__\|-\+")),
)
_DIGEST_COPY = re.compile(r"sha256:\[0-9a-f\]\{64\}")
_DOCKER_HUB_NAME = re.compile(r"(?:https?://)?(?:index\.|registry-1\.)?docker\.io(?:/v1/?)?|library/")


def grammar_copies(text: str, *, digest_allowed: bool = False) -> List[str]:
    """``line: what`` of every string in a module's ``text`` that copies the reference grammar:
    a regex of a tag, a name component or a digest, or a Docker Hub name written out."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        found += [f"{node.lineno}: {what}" for what, pattern in _GRAMMAR_COPIES if pattern.search(node.value)]
        if not digest_allowed and _DIGEST_COPY.search(node.value):
            found.append(f"{node.lineno}: a digest pattern")
        if _DOCKER_HUB_NAME.fullmatch(node.value):
            found.append(f"{node.lineno}: Docker Hub's name {node.value!r}")
    return sorted(found)


@pytest.mark.parametrize("path", IMPORTER_FILES + BUNDLE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_reference_grammar_is_written_once(path: Path) -> None:
    """The tag and name patterns and Docker Hub's names are importer/format/reference.py's
    (valid_tag, valid_name_component, valid_path, DOCKER_HUB, DOCKER_HUB_LEGACY, DOCKER_HUB_API,
    is_docker_hub, official_path); a copy drifts (two DOCKER_HUB constants held different hosts)."""
    if path == REFERENCE_PARSER:
        return
    assert grammar_copies(path.read_text(), digest_allowed=path == DIGEST_MODULE) == [], \
        f"{path.relative_to(REPO)} copies the reference grammar: use importer.format.reference"


def test_the_grammar_guard_sees_a_copied_regex() -> None:
    rogue = ('import re\n'
             'TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")\n'
             'TAG2 = re.compile(r"[\\w][\\w.-]{0,127}")\n'
             'PATH = re.compile(r"[a-z0-9]+(?:(?:\\.|_|__|-+)[a-z0-9]+)*")\n'
             'DIGEST = re.compile(r"sha256:[0-9a-f]{64}")\n'
             'HUB = "registry-1.docker.io"\n'
             'def repo(name):\n    return f"library/{name}", "https://index.docker.io/v1/"\n'
             'NOT = ("docker.io/library/app:1", "a tag of [A-Za-z0-9_.-]", "[0-9]+")\n')
    assert grammar_copies(rogue) == ["2: a tag pattern", "3: a tag pattern", "4: a name component pattern",
                                     "5: a digest pattern", "6: Docker Hub's name 'registry-1.docker.io'",
                                     "8: Docker Hub's name 'https://index.docker.io/v1/'",
                                     "8: Docker Hub's name 'library/'"]
    assert grammar_copies(REFERENCE_PARSER.read_text()) != []  # the grammar itself is what the guard would see


PLATFORM_MODULE = REPO / "importer" / "format" / "platform.py"
_PLATFORM_PARTS = {"os", "architecture", "variant"}


def _platform_operand(node: ast.expr) -> bool:
    """``x.normalized()``, ``x.normalized()[:2]``, ``x.architecture``: what a hand-made platform match compares."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "normalized":
        return True
    return isinstance(node, ast.Attribute) and node.attr in _PLATFORM_PARTS


def platform_comparisons(text: str) -> List[str]:
    """``line`` of every platform compared by hand (two normalised platforms, or two platforms'
    architecture, OS or variant) in a module's ``text``: importer/format/platform.py's
    platform_matches is the one rule."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            operands = [node.left, *node.comparators]
            if sum(_platform_operand(o) for o in operands) >= 2 or any(
                    _platform_operand(o) and isinstance(o, (ast.Call, ast.Subscript)) for o in operands):
                found.append(f"{node.lineno}")
    return found


@pytest.mark.parametrize("path", IMPORTER_FILES + BUNDLE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_platforms_are_compared_by_one_rule(path: Path) -> None:
    if path == PLATFORM_MODULE:
        return
    assert platform_comparisons(path.read_text()) == [], \
        f"{path.relative_to(REPO)} compares platforms by hand: use importer.format.platform.platform_matches"


def test_the_platform_guard_sees_a_hand_made_match() -> None:
    rogue = ("def runs(p, want):\n    return p.normalized()[:2] == want.normalized()[:2]\n"
             "def same(p, q):\n    return p.architecture == q.architecture and p.os != 'windows'\n"
             "def ok(p):\n    return p.architecture == 'unknown'\n")
    assert platform_comparisons(rogue) == ["2", "4"]


ORCHESTRATORS = {"check_only", "import_bundle", "import_to_registry", "import_legacy_bundle"}
THE_WALK = REPO / "importer" / "pipeline" / "walk.py"


def orchestrator_uses(path: Path) -> List[str]:
    """``line: name`` of every name of the four import orchestrators ``path`` imports or calls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in ORCHESTRATORS]
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in ORCHESTRATORS:
                found.append(f"{node.lineno}: {name}")
    return found


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_one_import_orchestrator(path: Path) -> None:
    """Issue 27 point 3: verify-only, check-only, import and registry are plans
    (importer/pipeline/plan.py) that importer/pipeline/walk.py's run_import walks; nothing else
    (the command line least of all) picks an orchestrator by an if/elif of its own."""
    if path == THE_WALK:
        assert {u.split(": ")[1] for u in orchestrator_uses(path)} == ORCHESTRATORS  # each is one route
        return
    assert orchestrator_uses(path) == [], f"{path.relative_to(REPO)} calls an import orchestrator: call run_import"


def test_the_command_line_walks_a_plan() -> None:
    main = (REPO / "importer" / "cli" / "main.py").read_text()
    calls = {n.func.id for n in ast.walk(ast.parse(main)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"plan_from_args", "run_import"} <= calls


def test_the_orchestrator_guard_sees_a_direct_call(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("from importer.pipeline.checkonly import check_only\n"
                     "def run(b, s):\n    return pipeline.importing.import_bundle(b, s)\n")
    assert orchestrator_uses(rogue) == ["1: check_only", "3: import_bundle"]


#: the steps every import into an engine shares (issue 41 point 1): run by the one load route
#: (importer/pipeline/load.py) whatever the payload; a route of its own would call them itself
LOAD_STEPS = {"engine_run", "refuse_tag_conflicts", "refuse_mismatches", "apply_tags"}
THE_LOAD_ROUTE = REPO / "importer" / "pipeline" / "load.py"


def load_step_uses(path: Path) -> List[str]:
    """``line: name`` of every call of a load step in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in LOAD_STEPS:
                found.append(f"{node.lineno}: {name}")
    return found


@pytest.mark.parametrize("path", IMPORTER_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_one_load_route(path: Path) -> None:
    """Issue 41 point 1: schema 3 (pipeline/importing.py) and schema 1/2 (pipeline/legacy.py) each
    wrote the load's steps in code of their own; now they are payloads, and load.py runs the steps."""
    if path == THE_LOAD_ROUTE:
        assert {u.split(": ")[1] for u in load_step_uses(path)} == LOAD_STEPS
        return
    assert load_step_uses(path) == [], f"{path.relative_to(REPO)} runs a load step: give load_route a payload"


def test_the_load_route_guard_sees_a_route_of_its_own(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def route(sink, checks):\n    with steps.engine_run(sink):\n        apply_tags(sink, checks)\n")
    assert load_step_uses(rogue) == ["2: engine_run", "3: apply_tags"]


#: the routes that load (issue 41 point 1, its last item the registry): each module hands a payload to
#: load_route and reports no step of its own (ImportResult.ran: load.py and steps.py report them)
LOAD_ROUTE_MODULES = ("importing.py", "legacy.py", "registry.py")


def route_code(path: Path) -> Tuple[bool, List[str]]:
    """(whether ``path`` calls load_route, ``line: step`` of every step it reports itself)."""
    calls_route, own = False, []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            calls_route = calls_route or name == "load_route"
            if name == "ran":
                own.append(f"{node.lineno}: {ast.unparse(node.args[0]) if node.args else ''}")
    return calls_route, own


@pytest.mark.parametrize("name", LOAD_ROUTE_MODULES)
def test_every_load_is_the_one_route(name: str) -> None:
    """schema 3, schemas 1/2 and a registry load through load.py: no route has step code of its own,
    and the registry's plan is the engines' (less --deep, which a registry cannot do)."""
    from importer.pipeline.plan import DEEP, IMPORT, LEGACY_IMPORT, REGISTRY, ROUTE_STEPS

    calls_route, own = route_code(REPO / "importer" / "pipeline" / name)
    assert calls_route and own == [], f"importer/pipeline/{name}: give load_route a payload, report no step"
    assert ROUTE_STEPS[LEGACY_IMPORT] == ROUTE_STEPS[IMPORT]
    assert ROUTE_STEPS[REGISTRY] == tuple(s for s in ROUTE_STEPS[IMPORT] if s != DEEP)


def test_the_route_guard_sees_steps_of_its_own(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def route(res, sink):\n    res.ran('push')\n    sink.push()\n    res.ran('read-back')\n")
    assert route_code(rogue) == (False, ["2: 'push'", "4: 'read-back'"])


#: what verifies bytes (hashes, diff_ids, signatures, the verifiers' own passes): importer/verify/'s
#: business; the pipeline calls the verify room's entry points (verify_or_raise, verify_legacy_or_raise,
#: verify_unstreamed_layers, images_signed, check_signature, run_deep), never these
VERIFYING = {"hashlib", "check_layer", "LayerReader", "HashingReader", "of_bytes", "verify_bundle", "verify_archive",
             "verify_opened", "verify_legacy", "raise_if_problems", "check_bundle", "checked_reader",
             "load_cosign_keys", "check_signature_bytes", "importer_copy_problems"}
PIPELINE = REPO / "importer" / "pipeline"


def verifying_uses(path: Path) -> List[str]:
    """``line: name`` of every verifying name (:data:`VERIFYING`) ``path`` imports, calls or reads."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in VERIFYING]
        elif isinstance(node, ast.Attribute) and node.attr in VERIFYING:
            found.append(f"{node.lineno}: {node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(PIPELINE.glob("*.py")), ids=lambda p: p.name)
def test_verification_lives_in_the_verify_room(path: Path) -> None:
    """Issue 27 point 3: the pipeline says when to verify; importer/verify/ does it (bundle, archive,
    schema 1/2, the layers a load does not stream, image signatures). lock.py hashes an engine's
    address into its lock file's name, which verifies nothing."""
    allowed = ["hashlib"] if path.name == "lock.py" else []
    assert [use.split(": ")[1] for use in verifying_uses(path)] == allowed, \
        f"{path.relative_to(REPO)} verifies bytes itself: call importer/verify/"


def test_the_verification_guard_sees_a_hash_in_the_pipeline(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("import hashlib\nfrom importer.input.layers import check_layer\n"
                     "def f(d, b):\n    return d == Digest.of_bytes(b)\n")
    assert verifying_uses(rogue) == ["1: hashlib", "2: check_layer", "4: of_bytes"]


@pytest.mark.parametrize("path", sorted(PIPELINE.glob("*.py")), ids=lambda p: p.name)
def test_the_routes_read_the_plan_not_the_arguments(path: Path) -> None:
    """Issue 27 point 3: what runs is the plan's (importer/pipeline/plan.py turns the arguments into
    it); no other pipeline module sees the command line's arguments."""
    tree = ast.parse(path.read_text(), str(path))
    imports = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    reads_arguments = "argparse" in imports or "args" in names
    assert reads_arguments is (path.name == "plan.py"), f"{path.name} reads arguments: read the plan"
# Issue 27 point 1: the exporter's sources read JSON into typed records (bundle/sources/records.py);
# ``Any`` (a value nothing checks) is not written anywhere in them, code, comments or docstrings.
EXPORT_SOURCES = sorted((REPO / "bundle" / "sources").glob("*.py"))
_ANY = re.compile(r"\bAny\b")


def any_uses(path: Path) -> List[str]:
    """``line: text`` of every line of ``path`` that names ``Any``."""
    return [f"{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1) if _ANY.search(line)]


@pytest.mark.parametrize("path", EXPORT_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_any_in_the_exporter_sources(path: Path) -> None:
    assert any_uses(path) == [], f"{path.relative_to(REPO)} uses Any: read JSON into bundle/sources/records.py's " \
                                 "records (Descriptor, ImageManifest, ImageIndex) or narrow a JsonObject"


def test_the_any_guard_sees_it(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("from typing import Any, Dict\n"
                     "JsonDoc = Dict[str, Any]\n"
                     "def anything(doc: 'typing.Any', n: int) -> None:  # Anything, AnyStr: other names\n"
                     "    pass\n")
    assert any_uses(rogue) == ["1: from typing import Any, Dict", "2: JsonDoc = Dict[str, Any]",
                               "3: def anything(doc: 'typing.Any', n: int) -> None:  # Anything, AnyStr: other names"]
    assert len(EXPORT_SOURCES) >= 10 and REPO / "bundle" / "sources" / "records.py" in EXPORT_SOURCES
# ============================== issue 27 point 5: the test kit is the one way to run our CLIs and build images
# A test file runs ``python -m importer|bundle`` and a built ``bundle-import.pyz`` through tests/kit/helpers.py
# (run_cli, start_cli, run_pyz, run_zipapp, start_pyz) and builds its images from tests/kit/imagegen.py's
# contexts (layered_context, base_and_update, simple_context, ...): a tenth private runner drifts (env
# left in, PYTHONPATH missing, no timeout) and a new test copies whichever it saw first.
KIT_TEST_FILES = [*sorted((REPO / "tests").glob("test_*.py")), REPO / "tests" / "conftest.py"]
#: test files that spawn our programs themselves, each with why no kit runner fits
SPAWN_ALLOWED = {
    "test_docs_commands.py": "runs the docs' shell commands as written (python3 X/bundle-import.pyz ..., "
                             "bundle ... through shims): the command text is what it tests",
    "test_smoke_unit.py": "imports the smoke suite from inside a built pyz (python -I -c, the pyz on sys.path): "
                          "no CLI is run",
    "test_architecture.py": "the kit guards' own offending samples (and the pyz floor checks run through the kit)",
}
#: test files that write a Dockerfile or run a build themselves, each with why no imagegen context fits
BUILD_ALLOWED = {"test_architecture.py": "the kit guards' own offending samples"}
_OUR_MODULE = re.compile(r"(importer|bundle)(\.|$)")
_INTERPRETER = re.compile(r"sys\.executable|python", re.I)
_SHELL_RUN = re.compile(r"\bpython3?(\.\d+)?\s+(-\w+\s+)*(-m\s+(importer|bundle)\b|\S*\.pyz\b)")
_ARGV_BUILDERS = {"cli_command", "zipapp_command"}  # the kit's own argv, for the kit's own Popen
_DOCKERFILE_NAMES = {"Dockerfile", "Containerfile"}
_SHELL_BUILD = re.compile(r"\b(docker|podman|buildah)\s+(image\s+|buildx\s+)?build\b")
_BUILDERS = re.compile(r"docker|podman|buildah")


def _call_name(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def _argv_spawn(elts: List[ast.expr]) -> List[str]:
    """What an argv literal runs of ours: ``-m importer|bundle`` (or a module it cannot name), a .pyz."""
    found = []
    for i, e in enumerate(elts[:-1]):
        if isinstance(e, ast.Constant) and e.value == "-m":
            nxt = elts[i + 1]
            if not isinstance(nxt, ast.Constant):
                found.append(f"-m {ast.unparse(nxt)}")
            elif isinstance(nxt.value, str) and _OUR_MODULE.match(nxt.value):
                found.append(f"-m {nxt.value}")
    texts = [ast.unparse(e) for e in elts]
    if any("pyz" in t for t in texts) and any(_INTERPRETER.search(t) for t in texts):
        found.append("a .pyz")
    return found


def _strings_that_may_run(tree: ast.AST) -> Dict[int, str]:
    """id(node) -> text of the string constants of ``tree``, but docstrings and other bare strings
    (which run nothing)."""
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return {id(n): n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare}


def spawns_our_clis(path: Path) -> List[str]:
    """``line: what`` for each place ``path`` runs one of our CLIs or a built pyz without the kit."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    strings = _strings_that_may_run(tree)
    for node in ast.walk(tree):
        shell = _SHELL_RUN.search(strings.get(id(node), ""))
        if isinstance(node, (ast.List, ast.Tuple)):
            found += [f"{node.lineno}: runs {what}" for what in _argv_spawn(node.elts)]
        elif isinstance(node, ast.Call) and _call_name(node) in _ARGV_BUILDERS:
            found.append(f"{node.lineno}: spawns the kit's {_call_name(node)}() itself")
        elif shell and isinstance(node, ast.expr):
            found.append(f"{node.lineno}: a shell line runs {shell.group(0)!r}")
    return sorted(set(found), key=lambda f: int(f.split(":")[0]))


def builds_images_itself(path: Path) -> List[str]:
    """``line: what`` for each Dockerfile ``path`` writes and each image build it runs itself."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    strings = _strings_that_may_run(tree)
    for node in ast.walk(tree):
        text = strings.get(id(node))
        if text is not None and isinstance(node, ast.expr):
            if text in _DOCKERFILE_NAMES:
                found.append(f"{node.lineno}: writes a {text}")
            elif re.match(r"\s*FROM\s+\S+\s*(\n|$)", text) or _SHELL_BUILD.search(text):
                found.append(f"{node.lineno}: Dockerfile text or a build command {text[:40]!r}")
        elif isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "build" for a in node.args) \
                and _BUILDERS.search(ast.unparse(node.func) + " ".join(ast.unparse(a) for a in node.args)):
            found.append(f"{node.lineno}: runs a build ({ast.unparse(node.func)})")
        elif isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) > 1:
            texts = [ast.unparse(e) for e in node.elts]
            if "'build'" in texts and _BUILDERS.search(" ".join(texts[:texts.index("'build'")])):
                found.append(f"{node.lineno}: runs a build")
    return sorted(set(found), key=lambda f: int(f.split(":")[0]))


_BUNDLE_MAKERS = {"make_bundle", "make_multiplatform_bundle"}


def fixtures_making_pristine(path: Path) -> List[str]:
    """``line: fixture`` for each pytest fixture of ``path`` that makes the kit's engine-free bundle
    itself (bundlegen.make_bundle, make_multiplatform_bundle): ``pristine``/``pristine_multi`` (read
    only) or ``bundle``/``multi_bundle`` (a copy to change) are that bundle, made once."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and any("fixture" in ast.unparse(d) for d in node.decorator_list) \
                and any(isinstance(c, ast.Call) and _call_name(c) in _BUNDLE_MAKERS for c in ast.walk(node)):
            found.append(f"{node.lineno}: {node.name}")
    return found


@pytest.mark.parametrize("path", KIT_TEST_FILES, ids=lambda p: p.name)
def test_no_fixture_makes_the_pristine_bundle_again(path: Path) -> None:
    assert fixtures_making_pristine(path) == [], \
        f"{path.name}: a fixture makes the kit's bundle again: take pristine (read only) or bundle (a copy)"


#: test files that import another test file, each with why that code is not in the kit
CROSS_IMPORT_ALLOWED = {
    ("test_install.py", "tests.test_docs_commands"): "reads the docs' commands with the parser the docs test "
                                                     "is about (commands_of), not a helper",
    ("test_tamper_engine.py", "tests.test_verify"): "runs test_verify's integrity damage table (CASES) against "
                                                    "an engine: one table, two targets",
    ("test_registry_hostile.py", "tests.test_registry_token_auth"): "signs tokens with the token-auth test's "
                                                                     "issuer (Signer), the realm under test there",
}


def imports_of_test_files(path: Path) -> List[str]:
    """``line: module`` for each test file (``tests.test_*``) ``path`` imports, lazily or not."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.module != "tests" else [f"tests.{a.name}" for a in node.names]
        found += [f"{node.lineno}: {n}" for n in names if n.startswith("tests.test_")]
    return found


@pytest.mark.parametrize("path", KIT_TEST_FILES, ids=lambda p: p.name)
def test_test_files_share_code_only_through_the_kit(path: Path) -> None:
    """A helper or fixture two test files need lives in tests/kit/, not in one of them (the second
    file would import the first's tests' module, and a third would copy it)."""
    found = [f for f in imports_of_test_files(path) if (path.name, f.split(": ")[1]) not in CROSS_IMPORT_ALLOWED]
    assert found == [], f"{path.name} imports another test file: move what it needs into tests/kit/\n" + \
        "\n".join(found)


def test_the_cross_import_allow_list_is_still_needed() -> None:
    for (name, module), _ in CROSS_IMPORT_ALLOWED.items():
        assert any(f.endswith(f": {module}") for f in imports_of_test_files(REPO / "tests" / name)), \
            f"{name} no longer imports {module}: drop it from CROSS_IMPORT_ALLOWED"


@pytest.mark.parametrize("path", KIT_TEST_FILES, ids=lambda p: p.name)
def test_tests_run_our_clis_through_the_kit(path: Path) -> None:
    """No test file spawns ``python -m importer|bundle`` or a ``bundle-import.pyz`` itself: it calls
    tests/kit/helpers.py (run_cli/start_cli from source, run_pyz/run_zipapp/start_pyz for the zipapp;
    ``prefix=``, ``python=``, ``env=``/``drop_env=``, ``flags=`` cover the odd cases)."""
    found = spawns_our_clis(path)
    if path.name in SPAWN_ALLOWED:
        assert found, f"{path.name} is in SPAWN_ALLOWED but spawns nothing of ours itself: drop it from the list"
        return
    assert found == [], f"{path.name} runs our CLIs itself: use tests/kit/helpers.py\n" + "\n".join(found)


@pytest.mark.parametrize("path", KIT_TEST_FILES, ids=lambda p: p.name)
def test_tests_build_images_through_the_kit(path: Path) -> None:
    """No test file writes a Dockerfile or runs ``docker build`` itself: tests/kit/imagegen.py's
    contexts (``layered_context``: FROM, busybox, files, steps; ``base_and_update``: an image and
    its one-layer update; ``simple_context``, ``write_contexts``, ``cuda_context``) built with
    ``engines.build_image``."""
    found = builds_images_itself(path)
    if path.name in BUILD_ALLOWED:
        assert found, f"{path.name} is in BUILD_ALLOWED but builds nothing itself: drop it from the list"
        return
    assert found == [], f"{path.name} builds images itself: use tests/kit/imagegen.py\n" + "\n".join(found)


def test_the_kit_guards_see_a_test_doing_it_itself(tmp_path: Path) -> None:
    """Each guard above fails on a test file that does it by hand (a guard that cannot fail is a
    defect), and passes the kit's own way of doing the same."""
    rogue = tmp_path / "test_rogue.py"
    rogue.write_text(
        "import subprocess, sys\n"
        "def test_a(b, env, module, cmd):\n"
        "    subprocess.run([sys.executable, '-m', 'importer', str(b)], env=env)\n"
        "    subprocess.Popen([sys.executable, '-m', 'bundle.cli', 'copy'])\n"
        "    subprocess.run([sys.executable, '-m', module, '--help'])\n"
        "    subprocess.run(['python3', '-I', str(b / 'bundle-import.pyz'), '--inventory'])\n"
        "    subprocess.run(cli_command('importer', '--version'))\n"
        "    subprocess.run(['bash', '-c', 'python3 -I DIR/bundle-import.pyz DIR --verify'])\n"
        "    (b / 'Dockerfile').write_text('FROM scratch\\nCOPY busybox /bin/busybox\\n')\n"
        "    subprocess.run(['docker', '-H', env, 'build', '-t', 'x:1', str(b)])\n"
        "    engines.docker(env, 'build', '-t', 'x:1', str(b))\n"
        "    subprocess.run('podman build -t x .', shell=True)\n")
    assert sorted({int(f.split(":")[0]) for f in spawns_our_clis(rogue)}) == [3, 4, 5, 6, 7, 8], spawns_our_clis(rogue)
    assert sorted({int(f.split(":")[0]) for f in builds_images_itself(rogue)}) == [9, 10, 11, 12], \
        builds_images_itself(rogue)
    kit_way = tmp_path / "test_kit_way.py"
    kit_way.write_text(
        "from tests.kit.helpers import run_cli, run_pyz, run_zipapp\n"
        "from tests.kit.imagegen import layered_context\n"
        "def test_b(b, tmp_path, host):\n"
        "    \"\"\"Not python3 -m importer B nor docker build . by hand; FROM scratch\"\"\"\n"
        "    run_cli('importer', str(b), '-m', 'x')\n"
        "    run_pyz(b, '--verify-only')\n"
        "    run_zipapp(b / 'bundle-import.pyz', '--inventory')\n"
        "    assert sorted(p.name for p in b.iterdir()) == ['bundle-import.pyz', 'bundle.json']\n"
        "    subprocess.run([sys.executable, '-c', 'print(1)'])\n"
        "    engines.build_image(host, layered_context(tmp_path / 'c', files={'/msg': 'hi'}), 'x:1')\n"
        "    run_cli('bundle', 'export', 'x:1', '--docker-host', host)\n")
    assert spawns_our_clis(kit_way) == [] and builds_images_itself(kit_way) == []
    borrower = tmp_path / "test_borrower.py"
    borrower.write_text("from tests.test_serve import made\nfrom tests import test_verify\n"
                        "import tests.test_cli_json\nfrom tests.kit.servekit import serving\n"
                        "def test_c():\n    from tests.test_fleet_report import on_host\n")
    assert imports_of_test_files(borrower) == ["1: tests.test_serve", "2: tests.test_verify", "3: tests.test_cli_json",
                                               "6: tests.test_fleet_report"]
    assert imports_of_test_files(kit_way) == []
    maker = tmp_path / "test_maker.py"
    maker.write_text("import pytest\nfrom tests.kit.bundlegen import make_bundle\n"
                     "@pytest.fixture(scope='module')\ndef fake_bundle(tmp_path_factory):\n"
                     "    return make_bundle(tmp_path_factory.mktemp('x') / 'b')\n"
                     "def test_d(tmp_path):\n    make_bundle(tmp_path / 'b')\n")
    assert fixtures_making_pristine(maker) == ["4: fake_bundle"]
    assert fixtures_making_pristine(REPO / "tests" / "kit" / "fixtures.py") != []
    assert spawns_our_clis(REPO / "tests" / "kit" / "helpers.py") != []  # the kit is where it happens
    assert builds_images_itself(REPO / "tests" / "kit" / "imagegen.py") != []


# One Bundle (issue 41 point 3): which kind a bundle is (a folder, or a tar / parts read in place) is
# decided by importer/input/opened.py open_bundle and known in input/ alone; every other module reads
# it through the Bundle protocol's members (require_folder, checked_whole, backing_files, either, ...).
INPUT_FLOOR = REPO / "importer" / "input"
_BUNDLE_KINDS = {"folder", "tar", "parts"}
_BUNDLE_TYPES = {"ArchiveReader", "FolderBundle", "ArchiveBundle"}
_A_BUNDLE = re.compile(r"bundle|opened|root|^loc$|location")
_ASKING = {"is_archive", "folder_of"}


def _named(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _constants(node: ast.expr) -> Set[object]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant)}


def folder_or_archive_questions(text: str) -> List[str]:
    """``line: what`` of every place ``text`` asks whether a bundle is a folder or a tar / parts:
    isinstance against ArchiveReader (or the two Bundle classes), or against str on a bundle or its
    root; ``.archive`` compared with None; a ``.kind`` compared with "folder", "tar" or "parts";
    ``is_archive``, ``folder_of``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and _named(node.func) == "isinstance" and len(node.args) == 2:
            what, types = node.args
            names = {_named(t) for t in (types.elts if isinstance(types, ast.Tuple) else [types])}
            if names & _BUNDLE_TYPES or ("str" in names and _A_BUNDLE.search(_named(what).lower())):
                found.append(f"{node.lineno}: isinstance({_named(what)}, {'/'.join(sorted(names))})")
        elif isinstance(node, ast.Compare) and len(node.comparators) == 1:
            sides = [node.left, node.comparators[0]]
            attrs = {s.attr for s in sides if isinstance(s, ast.Attribute)}
            values = set().union(*(_constants(s) for s in sides))
            if "archive" in attrs and any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                found.append(f"{node.lineno}: .archive compared with None")
            if "kind" in attrs and values & _BUNDLE_KINDS:
                found.append(f"{node.lineno}: .kind compared with {sorted(values & _BUNDLE_KINDS)}")
        elif isinstance(node, (ast.Name, ast.Attribute)) and _named(node) in _ASKING:
            found.append(f"{node.lineno}: {_named(node)}")
    return sorted(set(found), key=lambda f: int(f.split(":")[0]))


@pytest.mark.parametrize("path", [p for p in IMPORTER_FILES + BUNDLE_FILES if INPUT_FLOOR not in p.parents],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_folder_or_archive_question_outside_input(path: Path) -> None:
    """Verification, sinks, registry, serve, the pipeline, pack, sign and copy take a Bundle and ask
    its members, never which kind it is: a new kind of bundle (or a change to one) is made in input/
    alone, and no caller keeps a branch that the other kind never runs."""
    assert folder_or_archive_questions(path.read_text()) == [], \
        f"{path.relative_to(REPO)} asks whether a bundle is a folder or a tar/parts: use a Bundle member " \
        "(importer/input/opened.py), or add one there"


def test_the_bundle_guard_sees_a_folder_or_archive_question() -> None:
    rogue = ("from importer.input.archive import ArchiveReader\n"
             "def load(bundle, root, sink, loc, engine):\n"
             "    if bundle.archive is None or bundle.is_archive:\n"
             "        return bundle.path\n"
             "    if isinstance(root, str) or isinstance(root, (ArchiveReader, bytes)):\n"
             "        return folder_of(root, sink.kind)\n"
             "    if loc.kind == 'folder' or bundle.kind in ('tar', 'parts') or 'parts' != bundle.kind:\n"
             "        return None\n"
             "    return isinstance(sink.kind, str) and engine.get('kind') == 'folder' and sink.kind == 'docker'\n")
    assert sorted(folder_or_archive_questions(rogue)) == [
        "3: .archive compared with None", "3: is_archive", "5: isinstance(root, ArchiveReader/bytes)",
        "5: isinstance(root, str)", "6: folder_of", "7: .kind compared with ['folder']",
        "7: .kind compared with ['parts', 'tar']", "7: .kind compared with ['parts']"]
    assert folder_or_archive_questions((INPUT_FLOOR / "opened.py").read_text()) != []  # where the question is answered
