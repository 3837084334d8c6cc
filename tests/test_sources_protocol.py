"""The exporter's sources share one contract (issue 27 point 1, bundle/sources/protocol.py): every
source class satisfies ``ExportSource`` and declares what it can do (sizes known ahead, schemas 1
and 2, the platform picked by its engine, attached artifacts, the image env read ahead); the
exporter asks those members, never the source's class (no ``isinstance(..., XSource)``, no
``hasattr(source, ...)``); what an export asks of each image is a ``Selection`` passed to every
call, so one source reads the same image for two selections without a cursor between them."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path
from typing import Any, List

import pytest

from bundle.asimage import FilesImageSource
from bundle.blobstore import BlobStore
from bundle.export import _selection
from bundle.exportloop import Carry, carry_images
from bundle.fileartifact import FileSet
from bundle.sources.containerd import ContainerdSource
from bundle.sources.docker_daemon import DockerDaemonSource
from bundle.sources.oci_layout import OciLayoutSource
from bundle.sources.protocol import CheckedRefs, ExportSource, Selection, SourceBase
from bundle.sources.records import Descriptor, ImageIndex, ImageManifest, parse_image
from bundle.sources.registry import RegistrySource
from importer.errors import SourceError, UsageError
from importer.format.digest import Digest
from importer.format.mediatypes import OCI_INDEX, REF_NAME_ANNOTATION
from importer.format.platform import Platform, host
from tests.kit.helpers import REPO
from tests.kit.layoutgen import REF, write_layout

#: every source bundle export reads from, built without touching an engine or a network
SOURCES = {
    "docker-daemon": lambda: DockerDaemonSource("unix:///nonexistent.sock"),
    "containerd": lambda: ContainerdSource("/nonexistent.sock", "default"),
    "oci": lambda: OciLayoutSource("/nonexistent-layout"),
    "registry": lambda: RegistrySource(["127.0.0.1:5000/team/app:1"]),
    "files": lambda: FilesImageSource(FileSet("models/x:1", ())),  # --as-image (bundle/asimage.py)
}
#: (flag, the kinds that declare it True)
FLAGS = {"knows_sizes_ahead": {"containerd", "oci", "registry", "files"},
         "writes_legacy_schemas": {"docker-daemon"},
         "picks_platform_in_engine": {"docker-daemon"},
         "carries_attached": {"oci", "registry"}}
#: what a source's state must not hold: the export's options are a Selection, passed along
OPTION_STATE = {"platform", "platform_given", "choice", "attached", "notes"}


def _protocol_members() -> List[str]:
    methods = [n for n, v in vars(ExportSource).items() if callable(v) and not n.startswith("_")]
    return sorted({*ExportSource.__annotations__, *methods})


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_every_source_satisfies_the_one_protocol(kind: str) -> None:
    source = SOURCES[kind]()
    assert isinstance(source, SourceBase) and isinstance(source, ExportSource)
    assert source.kind == kind
    missing = [m for m in _protocol_members() if not hasattr(source, m)]
    assert missing == [], f"{type(source).__name__} lacks {missing}"
    assert OPTION_STATE.isdisjoint(vars(source)), f"{kind} keeps export options as state: use the Selection"


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_each_source_declares_exactly_its_capabilities(kind: str) -> None:
    """A flag is True exactly for the sources the exporter relies on for it; the methods behind
    ``writes_legacy_schemas`` and the early env read are overridden exactly where declared."""
    cls = type(SOURCES[kind]())
    for flag, kinds in FLAGS.items():
        assert getattr(cls, flag) is (kind in kinds), f"{cls.__name__}.{flag}"
    own_save = cls.legacy_save_argv is not SourceBase.legacy_save_argv
    assert own_save is cls.writes_legacy_schemas
    assert (cls.image_env is not SourceBase.image_env) is (kind == "docker-daemon")


def test_a_source_without_legacy_schemas_refuses_them_by_name() -> None:
    with pytest.raises(UsageError, match=r"exporting from registry into a schema 1 or 2 bundle"):
        SOURCES["registry"]().legacy_save_argv(["app:1"])
    assert SOURCES["oci"]().image_env("app:1") is None


def test_the_public_source_methods_name_their_types() -> None:
    """No ``Any`` in what a source takes or returns (JSON is read into bundle/sources/records.py's records)."""
    loose = []
    for cls in [ExportSource, SourceBase, *(type(make()) for make in SOURCES.values())]:
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            for arg, note in fn.__annotations__.items():
                if re.search(r"\bAny\b", str(note)):
                    loose.append(f"{cls.__name__}.{name}: {arg}: {note}")
    assert loose == []


# --- the exporter asks the declared members


def _class_probes(path: Path) -> List[str]:
    """``isinstance(x, SomethingSource)`` and ``hasattr``/``getattr`` on a ``source`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        first, second = node.args[0], node.args[1]
        if node.func.id == "isinstance" and "Source" in ast.unparse(second):
            found.append(f"{node.lineno}: isinstance(..., {ast.unparse(second)})")
        if node.func.id in ("hasattr", "getattr") and "source" in ast.unparse(first):
            found.append(f"{node.lineno}: {node.func.id}({ast.unparse(first)}, ...)")
    return found


EXPORTER = sorted(p for p in (REPO / "bundle").glob("*.py"))


@pytest.mark.parametrize("path", EXPORTER, ids=lambda p: str(p.relative_to(REPO)))
def test_the_exporter_asks_the_source_contract_not_its_class(path: Path) -> None:
    assert _class_probes(path) == [], f"{path.relative_to(REPO)} branches on a source's class: ask its flags"


def test_the_class_probe_guard_sees_the_old_code(tmp_path: Path) -> None:
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f(source, d):\n    if isinstance(source, DockerDaemonSource):\n        return 0\n"
                     "    if hasattr(source, 'attached'):\n        source.attached = True\n"
                     "    return tuple(getattr(source, 'notes', ()))\n")
    assert _class_probes(rogue) == ["2: isinstance(..., DockerDaemonSource)", "4: hasattr(source, ...)",
                                    "6: getattr(source, ...)"]


def _other_platform() -> Platform:
    return Platform("linux", "arm64") if host().architecture != "arm64" else Platform("linux", "amd64")


def test_the_selection_follows_the_declared_members() -> None:
    docker, oci = SOURCES["docker-daemon"](), SOURCES["oci"]()
    other = str(_other_platform())
    assert _selection(oci, 3, (), [other], False, True) == Selection(_other_platform(), True, None, True)
    assert _selection(docker, 3, (), [], False, True) == Selection(host(), attached=False)  # nothing attached
    with pytest.raises(UsageError, match=r"exporting from docker-daemon with --platform .*expected this host's"):
        _selection(docker, 3, (), [other], False, True)
    with pytest.raises(UsageError, match=r"exporting from docker-daemon with several platforms"):
        _selection(docker, 3, (), [], True, True)
    with pytest.raises(UsageError, match=r"exporting from oci with --schema 2: .*need a Docker source"):
        _selection(oci, 2, (), [], False, True)
    assert _selection(docker, 2, (), [], False, True).choice is None


def test_one_source_reads_two_selections_without_a_cursor(tmp_path: Path) -> None:
    """The same OCI layout source, asked for arm64 then for the host's platform then for arm64
    again: each call carries what its Selection names, whatever was asked before."""
    facts: Any = write_layout(tmp_path / "layout")
    source = OciLayoutSource(str(tmp_path / "layout"))
    arm, amd = Selection(Platform("linux", "arm64"), platform_given=True), Selection(Platform("linux", "amd64"))
    sizes = {arch: (tmp_path / "layout" / "blobs" / "sha256" / facts["arch"][arch]["layer"][7:]).stat().st_size
             for arch in ("arm64", "amd64")}
    assert source.check_refs([REF], arm) == CheckedRefs(sizes["arm64"])
    checked = source.check_refs([REF], amd)
    assert checked.size == sizes["amd64"] and len(checked.notes) == 1 and "--all-platforms" in checked.notes[0]
    assert source.check_refs([REF], arm) == CheckedRefs(sizes["arm64"])
    store = BlobStore(str(tmp_path / "bundle"), fsync=False)
    got = [carry_images(source, [REF], s, Carry(store, "zstd"))[0] for s in (arm, amd, arm)]
    assert [im.platform["architecture"] for im in got] == ["arm64", "amd64", "arm64"]
    assert [str(im.layers[0].digest) for im in got] == [facts["arch"][a]["layer"] for a in ("arm64", "amd64", "arm64")]


# --- typed records (bundle/sources/records.py): JSON read once, a wrong shape named


def test_a_descriptor_is_read_once_with_its_fields_typed() -> None:
    digest = "sha256:" + "ab" * 32
    desc = Descriptor.parse({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
                             "size": 12, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"},
                             "annotations": {REF_NAME_ANNOTATION: "app:1", "n": 5}, "urls": ["https://x", 3],
                             "artifactType": "application/x"}, "reading x")
    assert desc == Descriptor("application/vnd.oci.image.manifest.v1+json", Digest.parse(digest), 12,
                              Platform("linux", "arm64", "v8"), {REF_NAME_ANNOTATION: "app:1"}, "application/x",
                              ("https://x",))
    assert desc.ref_name == "app:1" and Descriptor.parse({"digest": digest}, "x").size is None


ZERO = "sha256:" + "0" * 64


@pytest.mark.parametrize("value, field", [
    ({"digest": 7, "size": 1}, "`digest`"), ({"digest": "sha256:abc"}, "`digest`"),
    ({"digest": ZERO, "size": "12"}, "`size`"), ({"digest": ZERO, "size": True}, "`size`"),
    ({"digest": ZERO, "size": -1}, "`size`"), ({"digest": ZERO, "mediaType": 5}, "`mediaType`"),
    ([1], "a JSON object, found a list"), ("x", "a JSON object, found a string"),
])
def test_a_descriptor_of_the_wrong_shape_names_the_field(value: object, field: str) -> None:
    with pytest.raises(SourceError, match=r"^reading x: expected .*" + re.escape(field)):
        Descriptor.parse(value, "reading x")
    assert Descriptor.of(value) is None


def test_a_manifest_or_index_of_the_wrong_shape_is_a_source_error() -> None:
    ok = {"digest": "sha256:" + "0" * 64, "size": 1}
    assert isinstance(parse_image(b'{"manifests": []}', "", "m"), ImageIndex)
    assert isinstance(parse_image(json.dumps({"config": ok, "layers": [ok]}).encode(), "", "m"), ImageManifest)
    for doc, media_type, said in [({"config": ok, "layers": 5}, "", "a config and layers"),
                                  ({"config": ok, "layers": [ok, 7]}, "", "m: layer 2: expected a JSON object"),
                                  ({"manifests": "x"}, OCI_INDEX, "`manifests` to be a list"),
                                  ({"manifests": [ok, {"digest": 7}]}, "", "m: manifest 1: expected 'sha256:'"),
                                  ({"mediaType": 5, "config": ok, "layers": []}, "", "m: expected a string"),
                                  ({"mediaType": [], "manifests": []}, "", "m: expected a string"),
                                  ([ok], "", "expected a JSON object, found a list")]:
        with pytest.raises(SourceError, match=re.escape(said)):
            parse_image(json.dumps(doc).encode(), media_type, "m")


def test_a_damaged_entry_of_a_layouts_index_is_named(tmp_path: Path) -> None:
    """index.json's entries are read as descriptors once: a damaged one is named, not skipped."""
    write_layout(tmp_path / "layout")
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    index["manifests"].append({"mediaType": OCI_INDEX, "digest": "sha256:" + "0" * 64, "size": "12"})
    (tmp_path / "layout" / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"index\.json: manifest 1: expected a byte count .* as `size`, found '12'"):
        OciLayoutSource(str(tmp_path / "layout")).check_refs([REF], Selection())
