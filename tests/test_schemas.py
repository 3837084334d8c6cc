"""The JSON Schemas in schemas/ against the stdlib checks, the golden documents, the OCI schemas
and what the writer and the importer really produce. Needs no engine.

Golden file-name prefixes (tests/golden/README.md): valid/* must pass everything; invalid/*
must fail the schema and check_structure; ``version-*`` fail the schema and the loader
(check_structure does not look at the version value); ``xref-*``/``stdlib-*`` pass the schema
and fail check_structure (rules JSON Schema cannot express)."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from importer import SCHEMA_MAJOR
from importer.errors import InvalidDigest, ManifestError, VerificationFailed
from importer.format.digest import Digest
from importer.format.manifest import (
    _REF_RE,
    BUNDLE_MEDIA_TYPE,
    MAX_REF,
    BundleManifest,
    check_structure,
    load_bundle_manifest,
    safe_relpath,
    valid_ref,
)
from importer.format.mediatypes import (
    LAYER_TYPES,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER_GZIP,
    OCI_LAYER_ZSTD,
    OCI_MANIFEST,
    REF_NAME_ANNOTATION,
)
from importer.sinks import SinkBase
from tests.kit.oci_schemas import OCISchemasMissing, oci_errors, schema_dir, validate_oci

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "schemas"
GOLDEN = REPO / "tests" / "golden" / "manifests"
BUNDLE_SCHEMA_ID = "https://sneakernet.dev/schemas/bundle/v3.schema.json"


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


BUNDLE_SCHEMA = _json(SCHEMAS / "bundle" / "v3.schema.json")
RECEIPT_SCHEMA = _json(SCHEMAS / "receipt" / "import-v1.schema.json")
BUNDLE_VALIDATOR = jsonschema.Draft202012Validator(BUNDLE_SCHEMA)
RECEIPT_VALIDATOR = jsonschema.Draft202012Validator(RECEIPT_SCHEMA)
_REGISTRY: Registry[Any] = Registry().with_resource(
    BUNDLE_SCHEMA_ID, Resource.from_contents(BUNDLE_SCHEMA, default_specification=DRAFT202012))


def _def_validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator for one $defs entry of the bundle schema (its own $refs still resolve)."""
    return jsonschema.Draft202012Validator({"$ref": f"{BUNDLE_SCHEMA_ID}#/$defs/{name}"}, registry=_REGISTRY)


DIGEST_V, PATH_V, REF_V = (_def_validator(n) for n in ("digest", "relativePath", "ref"))
VERSION_V = jsonschema.Draft202012Validator(
    {"$ref": f"{BUNDLE_SCHEMA_ID}#/properties/schemaVersion"}, registry=_REGISTRY)


def _golden(kind: str) -> List[Path]:
    return sorted((GOLDEN / kind).glob("*.json"))


def _ids(paths: Sequence[Path]) -> List[str]:
    return [p.stem for p in paths]


def schema_ok(doc: Any) -> bool:
    return BUNDLE_VALIDATOR.is_valid(doc)


def check_ok(doc: Any) -> bool:
    model, issues = check_structure(doc)
    assert (model is None) == bool(issues), "check_structure: a model iff no issues"
    return model is not None


def load_ok(raw: bytes) -> bool:
    try:
        load_bundle_manifest(raw)
    except ManifestError:
        return False
    return True


# ================================================================= the schemas themselves

@pytest.mark.parametrize("schema", [BUNDLE_SCHEMA, RECEIPT_SCHEMA], ids=["bundle-v3", "receipt-import-v1"])
def test_schemas_are_valid_draft_2020_12(schema: Dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].startswith("https://sneakernet.dev/schemas/")
    jsonschema.Draft202012Validator.check_schema(schema)


def test_bundle_schema_constants_match_the_code() -> None:
    props, defs = BUNDLE_SCHEMA["properties"], BUNDLE_SCHEMA["$defs"]
    assert props["mediaType"]["const"] == BUNDLE_MEDIA_TYPE
    assert props["schemaVersion"]["pattern"].startswith(f"^{SCHEMA_MAJOR}\\.")
    assert BUNDLE_SCHEMA["$id"].endswith(f"/bundle/v{SCHEMA_MAJOR}.schema.json")
    assert tuple(defs["layer"]["properties"]["mediaType"]["enum"]) == LAYER_TYPES
    assert defs["ref"]["pattern"] == f"^(?:{_REF_RE.pattern})$"
    assert defs["ref"]["maxLength"] == MAX_REF
    assert "additionalProperties" not in BUNDLE_SCHEMA  # readers ignore unknown fields


# ================================================================= golden documents

def test_golden_files_are_up_to_date() -> None:
    script = REPO / "tests" / "golden" / "make_golden_manifests.py"
    spec = importlib.util.spec_from_file_location("make_golden_manifests", script)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    wanted: Dict[str, bytes] = gen.build()
    on_disk = {str(p.relative_to(GOLDEN)): p.read_bytes() for p in GOLDEN.glob("*/*.json")}
    assert sorted(on_disk) == sorted(wanted), "run python3 tests/golden/make_golden_manifests.py"
    stale = [rel for rel, data in wanted.items() if on_disk[rel] != data]
    assert not stale, f"out of date (run python3 tests/golden/make_golden_manifests.py): {stale}"


def test_golden_inventory() -> None:
    valid, invalid = set(_ids(_golden("valid"))), set(_ids(_golden("invalid")))
    assert len(valid) >= 3 and len(invalid) >= 10
    assert {"single-image", "two-images-sharing-a-layer", "untagged-gzip-layers", "unknown-extra-fields",
            "delta-external-layer"} <= valid
    assert {
        "digest-uppercase-hex", "digest-wrong-length", "digest-sha512", "size-negative", "size-boolean",
        "files-path-traversal", "files-path-absolute", "layer-mediatype-unknown", "images-missing",
        "images-empty", "xref-blob-not-listed", "xref-duplicate-file-path", "mediatype-wrong",
        "schema-version-not-a-string",
    } <= invalid


@pytest.mark.parametrize("path", _golden("valid"), ids=_ids(_golden("valid")))
def test_valid_golden(path: Path) -> None:
    raw = path.read_bytes()
    doc = json.loads(raw)
    errors = [e.message for e in BUNDLE_VALIDATOR.iter_errors(doc)]
    assert not errors
    model, issues = check_structure(doc)
    assert model is not None and not issues
    loaded = load_bundle_manifest(raw)
    assert loaded == model
    # what the model writes back is valid and reads back to the same model
    again = loaded.to_dict()
    assert schema_ok(again)
    assert load_bundle_manifest(json.dumps(again).encode()) == loaded
    top_extra = set(doc) - {"schemaVersion", "mediaType", "created", "tool", "source", "importer", "images", "files",
                            "artifacts"}
    assert set(loaded.extra) == top_extra
    if path.stem in ("single-image", "two-images-sharing-a-layer", "untagged-gzip-layers"):
        assert again == doc  # the writer's own shape, byte for byte after parsing


def _invalid(prefixes: Tuple[str, ...], *, exclude: Tuple[str, ...] = ()) -> List[Path]:
    return [p for p in _golden("invalid")
            if p.stem.startswith(prefixes) and not p.stem.startswith(exclude)]


PLAIN = [p for p in _golden("invalid") if not p.stem.startswith(("version-", "xref-", "stdlib-"))]
VERSION = _invalid(("version-",))
STDLIB_ONLY = _invalid(("xref-", "stdlib-"))


@pytest.mark.parametrize("path", PLAIN, ids=_ids(PLAIN))
def test_invalid_golden_both_reject(path: Path) -> None:
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert not schema_ok(doc), "the JSON Schema accepts it"
    assert not check_ok(doc), "check_structure accepts it"
    assert not load_ok(raw)


@pytest.mark.parametrize("path", VERSION, ids=_ids(VERSION))
def test_invalid_golden_version(path: Path) -> None:
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert not schema_ok(doc)
    assert check_ok(doc), "check_structure checks the version's type only; the loader its value"
    with pytest.raises(ManifestError):
        load_bundle_manifest(raw)


@pytest.mark.parametrize("path", STDLIB_ONLY, ids=_ids(STDLIB_ONLY))
def test_invalid_golden_stdlib_only(path: Path) -> None:
    raw = path.read_bytes()
    doc = json.loads(raw)
    assert schema_ok(doc), "JSON Schema cannot express this rule, so it should accept"
    assert not check_ok(doc)
    assert not load_ok(raw)


# ============================================ single rules: the schema's $defs vs the stdlib

_PATH_ALPHABET = st.sampled_from(["a", "b", ".", "..", "/", "\\", "\x00", "\n", "\r", " ", "é", "ab"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PATH_ALPHABET, max_size=12).map("".join))
@example("a\n")
@example("...")
@example("a/.b/..c")
@example("./")
@example("d" * 4097)
def test_relative_path_rule_matches_safe_relpath(path: str) -> None:
    assert PATH_V.is_valid(path) == safe_relpath(path)


_REF_ALPHABET = st.sampled_from(["a", "Z", "0", "-", "--", "---", ".", "_", "__", ":", "@", "+", "/", " ", "\n", "é"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_REF_ALPHABET, max_size=12).map("".join))
@example("a" * 1025)
@example("a" * 1024)
@example("a:1\n")
@example("registry.example:5000/team/app@sha256:" + "0" * 64)
def test_ref_rule_matches_valid_ref(ref: str) -> None:
    assert REF_V.is_valid(ref) == valid_ref(ref)


def _is_digest_stdlib(value: Any) -> bool:
    try:
        Digest.parse(value)
    except InvalidDigest:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(alphabet="0123456789abcdefABCDEF", min_size=62, max_size=66).map(lambda h: "sha256:" + h),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).flatmap(
        lambda h: st.sampled_from(
            ["sha256:" + h, "sha256:" + h + "\n", "SHA256:" + h, "sha512:" + h, " sha256:" + h, h])),
    st.text(max_size=80),
))
def test_digest_rule_matches_digest_parse(value: str) -> None:
    assert DIGEST_V.is_valid(value) == _is_digest_stdlib(value)


def _version_loader_ok(version: str) -> bool:
    doc = json.loads((GOLDEN / "valid" / "single-image.json").read_bytes())
    doc["schemaVersion"] = version
    return load_ok(json.dumps(doc).encode())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["3", "0", "1", "9", ".", "\uff13", "\u0663", "\n", " ", "-", "x"]),
                max_size=8).map("".join))
@example("3.0")
@example("3.9999")
@example("3.10000")
@example("3.01")
@example("03.0")
@example("\uff13.\uff10")
def test_version_rule_matches_the_loader(version: str) -> None:
    assert VERSION_V.is_valid(version) == _version_loader_ok(version)


# ================================================================= hypothesis: digests

@given(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_digest_parse_round_trips(hexdigest: str) -> None:
    text = "sha256:" + hexdigest
    d = Digest.parse(text)
    assert str(d) == text
    assert d.hex == hexdigest and d.algorithm == "sha256"
    assert d.blob_path == f"blobs/sha256/{hexdigest}"
    assert Digest.parse(str(d)) == d


_SHA256_FULL = re.compile(r"sha256:[0-9a-f]{64}")


@given(st.one_of(
    st.text(),
    st.text(alphabet="0123456789abcdefABCDEF:sha256\n ", max_size=80),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).flatmap(
        lambda h: st.sampled_from(["sha256:" + h.upper(), "sha256:" + h + "\n", "sha256:" + h[:-1], "sha384:" + h])),
))
def test_digest_parse_refuses_everything_else(text: str) -> None:
    assume(_SHA256_FULL.fullmatch(text) is None)
    with pytest.raises(InvalidDigest):
        Digest.parse(text)


@given(st.one_of(st.none(), st.integers(), st.floats(), st.binary(), st.lists(st.text(max_size=3))))
def test_digest_parse_refuses_non_strings(value: Any) -> None:
    with pytest.raises(InvalidDigest):
        Digest.parse(value)


# ================================================================= hypothesis: the loader

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
JSON = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=20)

_KEYS = ["schemaVersion", "mediaType", "created", "tool", "source", "importer", "images", "files",
         "refs", "platform", "manifest", "config", "layers", "digest", "size", "diffId",
         "uncompressedSize", "path", "name", "version", "external"]
_INTERESTING = st.sampled_from([
    "3.0", "3.1", "4.0", "2.0", "3", BUNDLE_MEDIA_TYPE, "sha256:" + "0" * 64, "sha256:" + "A" * 64,
    "blobs/sha256/" + "0" * 64, "../x", "/abs", "", OCI_LAYER_ZSTD, "a:1", -1, 0, 1, 1.0, True, [], {},
]).map(copy.deepcopy)  # _mutate edits what it draws: never hand out the same [] or {} twice
SHAPED = st.recursive(
    st.one_of(_SCALARS, _INTERESTING),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(_KEYS), inner, max_size=6)),
    max_leaves=30,
)


def _loads_or_manifest_error(raw: bytes) -> Optional[BundleManifest]:
    try:
        return load_bundle_manifest(raw)
    except ManifestError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    JSON.map(lambda d: json.dumps(d).encode()),
    SHAPED.map(lambda d: json.dumps(d).encode()),
    st.dictionaries(st.sampled_from(_KEYS), SHAPED, max_size=8).map(
        lambda d: json.dumps({"schemaVersion": "3.0", **d}).encode()),
    st.binary(max_size=200),
))
def test_loader_raises_only_manifest_errors_on_random_documents(raw: bytes) -> None:
    _loads_or_manifest_error(raw)  # anything but ManifestError fails the test


def test_loader_on_deeply_nested_json() -> None:
    with pytest.raises(ManifestError):
        load_bundle_manifest(b'{"schemaVersion": "3.0", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def _paths(value: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Every location inside a JSON value (dict keys and list indices), parents first."""
    out: List[Tuple[Any, ...]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(doc)
        if not paths:
            break
        where = data.draw(st.sampled_from(paths), label="where")
        parent: Any = doc
        for key in where[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "interesting", "delete", "add-key"]), label="action")
        if action == "delete":
            if isinstance(parent, dict):
                del parent[where[-1]]
            else:
                parent.pop(where[-1])
        elif action == "add-key" and isinstance(parent[where[-1]], dict):
            parent[where[-1]][data.draw(st.sampled_from([*_KEYS, "x-extra"]))] = data.draw(SHAPED)
        elif action == "interesting":
            parent[where[-1]] = data.draw(_INTERESTING)
        else:
            parent[where[-1]] = data.draw(JSON)
    return doc


# Issues that only check_structure can find: cross-references, uniqueness, 1.0 as a size.
_XREF_ISSUE = re.compile(r"is not listed in files|differs from files entry \(|differs from its files entry"
                         r"|expected each path once|to hold the blob of its name"
                         r"|an external layer described uncompressed|expected each title once"
                         r"|also the folder of another title|expected each ref once"
                         r"|expected schemaVersion 3.8 or later for a file left out|expected a held file not listed")
_FLOAT_SIZE_ISSUE = re.compile(r"expected a non-negative integer, found ([0-9.e+]+)$")


def _stdlib_only(issue: str) -> bool:
    if _XREF_ISSUE.search(issue):
        return True
    m = _FLOAT_SIZE_ISSUE.search(issue)  # JSON Schema counts 1469.0 and 1e+16 as integers
    return m is not None and float(m.group(1)).is_integer()

GOLDEN_VALID = [json.loads(p.read_bytes()) for p in _golden("valid")]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(GOLDEN_VALID), st.data())
def test_mutated_documents_schema_and_stdlib_agree(base: Dict[str, Any], data: st.DataObject) -> None:
    doc = _mutate(base, data)
    raw = json.dumps(doc).encode()
    loaded = _loads_or_manifest_error(raw)  # loads or raises ManifestError, nothing else
    by_schema = schema_ok(doc)
    if loaded is not None:
        assert by_schema, "the importer accepts what the schema refuses"
    elif by_schema:
        _, issues = check_structure(doc)
        assert issues and all(_stdlib_only(i) for i in issues), issues


@pytest.mark.parametrize("major", [1, 2, 3])
def test_golden_bundles_validate_against_their_schema(major: int) -> None:
    """The bundles on the shelf (tests/golden/bundles/, never regenerated) match their schemas."""
    schema = _json(SCHEMAS / "bundle" / f"v{major}.schema.json")
    jsonschema.Draft202012Validator.check_schema(schema)
    folder = REPO / "tests" / "golden" / "bundles" / f"v{major}"
    doc = _json(folder / "bundle.json")
    assert doc["schemaVersion"].startswith(f"{major}.")
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    if major == 3:
        assert load_ok((folder / "bundle.json").read_bytes())
        validate_oci("layout", _json(folder / "oci-layout"))
        validate_oci("index", _json(folder / "index.json"))
        for image in doc["images"]:
            validate_oci("manifest", _json(folder / Digest.parse(image["manifest"]["digest"]).blob_path))
            validate_oci("config", _json(folder / Digest.parse(image["config"]["digest"]).blob_path))


# ================================================================= OCI schemas (offline)

def test_oci_schema_folder_is_present() -> None:
    folder = schema_dir()
    assert (folder / "image-index-schema.json").is_file()


def test_missing_oci_schema_folder_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SNEAKERNET_OCI_SCHEMAS", str(tmp_path))
    with pytest.raises(OCISchemasMissing, match=r"install-deps\.sh"):
        validate_oci("layout", {"imageLayoutVersion": "1.0.0"})


def _d(label: str) -> str:
    return str(Digest.of_bytes(label.encode()))


def _writer_style_docs() -> Dict[str, Any]:
    """oci-layout, index.json, an image manifest and a Docker config as bundle/writer.py
    writes them (built by hand here, so this test does not depend on the writer's code)."""
    diff_ids = [_d("tar 1"), _d("tar 2")]
    config = {
        "architecture": "amd64", "os": "linux", "created": "2024-05-01T12:00:00.123456789Z",
        "config": {"Env": None, "Cmd": ["/bin/sh"], "Entrypoint": None, "Labels": None,
                   "ExposedPorts": {"80/tcp": {}}, "WorkingDir": ""},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "2024-05-01T12:00:00Z", "created_by": "COPY x /", "empty_layer": False}],
        "container_config": {"Hostname": ""}, "docker_version": "26.1.5",
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": _d("config"), "size": 1469},
        "layers": [
            {"mediaType": OCI_LAYER_ZSTD, "digest": _d("blob 1"), "size": 2811093},
            {"mediaType": OCI_LAYER_GZIP, "digest": _d("blob 2"), "size": 120},
        ],
    }
    entry = {"mediaType": OCI_MANIFEST, "digest": _d("manifest"), "size": 585}
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {**entry, "platform": {"os": "linux", "architecture": "amd64"},
             "annotations": {REF_NAME_ANNOTATION: "registry.example/team/app:1.0"}},
            {**entry, "platform": {"os": "linux", "architecture": "amd64"},
             "annotations": {REF_NAME_ANNOTATION: "app:latest"}},
            {"mediaType": OCI_MANIFEST, "digest": _d("untagged manifest"), "size": 400},
        ],
    }
    return {"layout": {"imageLayoutVersion": "1.0.0"}, "index": index, "manifest": manifest, "config": config}


@pytest.mark.parametrize("kind", ["layout", "index", "manifest", "config"])
def test_writer_style_documents_are_valid_oci(kind: str) -> None:
    validate_oci(kind, _writer_style_docs()[kind])


@pytest.mark.parametrize(("kind", "breaks"), [
    ("layout", lambda d: d.update(imageLayoutVersion="2.0.0")),
    ("index", lambda d: d.pop("manifests")),
    ("index", lambda d: d["manifests"][0]["annotations"].update({REF_NAME_ANNOTATION: 1})),
    ("index", lambda d: d["manifests"][0]["platform"].pop("os")),
    ("index", lambda d: d.update(schemaVersion=1)),
    ("manifest", lambda d: d["layers"][0].update(size="120")),
    ("manifest", lambda d: d["config"].update(digest="not a digest")),
    ("manifest", lambda d: d["layers"][1].update(mediaType="no slash")),
    ("config", lambda d: d["rootfs"].update(diff_ids="sha256:x")),
    ("config", lambda d: d["config"].update(ExposedPorts={"80/tcp": 5})),
])
def test_oci_validation_is_not_vacuous(kind: str, breaks: Any) -> None:
    doc = _writer_style_docs()[kind]
    breaks(doc)
    assert oci_errors(kind, doc)
    with pytest.raises(jsonschema.ValidationError):
        validate_oci(kind, doc)


def test_config_nulls_count_as_absent_but_not_in_index() -> None:
    docs = _writer_style_docs()
    assert not oci_errors("config", docs["config"])  # "Env": null as Docker writes it
    docs["index"]["manifests"] = None  # moby#47210
    assert oci_errors("index", docs["index"])


def test_writer_oci_manifest_function_output_is_valid() -> None:
    from bundle.blobstore import WrittenBlob
    from bundle.sources import SourceImage
    from bundle.writer import oci_manifest
    from importer.format.manifest import LayerRecord

    layers = tuple(LayerRecord(t, Digest.of_bytes(t.encode()), 10, Digest.of_bytes(b"t" + t.encode()), 20)
                   for t in LAYER_TYPES)
    image = SourceImage(("app:1",), b"{}", layers, {"os": "linux", "architecture": "amd64"})
    raw = oci_manifest(WrittenBlob(Digest.of_bytes(b"{}"), 2), image)
    validate_oci("manifest", json.loads(raw))


# ============================== a real bundle: writer -> verify -> import (fake engine) -> receipt

def _tar(files: Dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def written_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real schema-3 bundle from bundle/writer.py (two images sharing a gzip layer, one
    untagged). Engine locks of the imports below go to tmp_path, not the host's lock folder."""
    from bundle.blobstore import BlobStore
    from bundle.sources import SourceImage
    from bundle.writer import write_bundle

    monkeypatch.setenv("SNEAKERNET_LOCK_DIR", str(tmp_path / "locks"))
    root = tmp_path / "bundle"
    root.mkdir()
    store = BlobStore(str(root), fsync=False)
    base = store.write_layer(io.BytesIO(_tar({"etc/base": b"base\n"})), compression="gzip")
    top = store.write_layer(io.BytesIO(_tar({"app/run": b"#!/bin/sh\n"})), compression="zstd")
    images = []
    for refs, layers in ((("sneakernet-test/base:1",), (base,)), ((), (base, top))):
        config = {"architecture": "amd64", "os": "linux", "config": {"Env": None},
                  "rootfs": {"type": "layers", "diff_ids": [str(x.diff_id) for x in layers]}}
        images.append(SourceImage(refs, json.dumps(config).encode(), layers, {"os": "linux", "architecture": "amd64"}))
    write_bundle(str(root), store, images, {"kind": "test"}, created="2024-05-01T12:00:00Z")
    return root


def test_written_bundle_validates_everywhere(written_bundle: Path) -> None:
    from importer.verify.bundle import verify_bundle

    raw = (written_bundle / "bundle.json").read_bytes()
    doc = json.loads(raw)
    assert not [e.message for e in BUNDLE_VALIDATOR.iter_errors(doc)]
    assert check_ok(doc) and load_ok(raw)
    validate_oci("layout", _json(written_bundle / "oci-layout"))
    validate_oci("index", _json(written_bundle / "index.json"))
    for image in doc["images"]:
        validate_oci("manifest", _json(written_bundle / Digest.parse(image["manifest"]["digest"]).blob_path))
        validate_oci("config", _json(written_bundle / Digest.parse(image["config"]["digest"]).blob_path))
    report = verify_bundle(str(written_bundle))
    assert report.ok, report.problems


class FakeSink(SinkBase):
    """An engine with a classic image store, in memory; its "data root" is a temp folder."""

    kind = "docker"

    def __init__(self, data_root: str) -> None:
        from importer.engines import EngineImage

        self._image = EngineImage
        self.data_root = data_root
        self.names: Dict[str, Any] = {}

    def probe(self) -> Any:
        from importer.engines import EngineInfo

        return EngineInfo("docker", "26.1.5", "overlay2", "classic", "unix:///run/sneakernet-test-fake.sock",
                          data_root=self.data_root, extra={"containerdSnapshotter": False})

    def lookup(self, name: str) -> Any:
        return self.names.get(name)

    def load(self, root: str, images: Sequence[Any], on_bytes: Any) -> None:
        for image in images:
            found = self._image(str(image.config.digest), [str(x.diff_id) for x in image.layers], list(image.refs))
            self.names[found.image_id] = found
            for ref in image.refs:
                self.names[ref] = found

    def tag(self, image_id: str, ref: str) -> None:
        self.names[ref] = self.names[image_id]

    def remove(self, name: str) -> None:
        self.names.pop(name, None)


def _cli_receipt(bundle: Path, error: Optional[Exception], result: Any) -> Dict[str, Any]:
    from importer.cli.main import _receipt
    from importer.pipeline.plan import IMPORT, ImportPlan

    return _receipt(argparse.Namespace(), ImportPlan(mode=IMPORT, bundle=str(bundle)), result, error)  # type: ignore[arg-type]


def _run_import(bundle: Path) -> Tuple[Any, Optional[Exception]]:
    from importer.pipeline.plan import IMPORT, ImportPlan
    from importer.pipeline.walk import result_for, run_import

    plan = ImportPlan(mode=IMPORT, bundle=str(bundle), quiet=True)
    result = result_for(plan)
    try:
        run_import(plan, FakeSink(str(bundle.parent)), result)  # type: ignore[arg-type]
    except ManifestError as e:
        return result, e
    except VerificationFailed as e:
        return result, e
    return result, None


def _receipt_errors(receipt: Dict[str, Any]) -> List[str]:
    json.loads(json.dumps(receipt))  # plain JSON
    return [f"{e.json_path}: {e.message}" for e in RECEIPT_VALIDATOR.iter_errors(receipt)]


def test_receipt_of_a_passing_import(written_bundle: Path) -> None:
    result, error = _run_import(written_bundle)
    assert error is None
    receipt = _cli_receipt(written_bundle, None, result)
    assert receipt["result"] == "pass"
    assert [c["result"] for c in receipt["images"]] == ["match", "match"]
    assert receipt["verification"]["ok"] is True and "filesChecked" in receipt["verification"]
    assert not _receipt_errors(receipt)


def test_receipt_of_a_failed_verification(written_bundle: Path) -> None:
    (written_bundle / "stray.txt").write_text("not listed\n")
    result, error = _run_import(written_bundle)
    assert isinstance(error, VerificationFailed)
    receipt = _cli_receipt(written_bundle, error, result)
    assert receipt["result"] == "fail" and receipt["error"]["id"] == "verification-failed"
    assert receipt["verification"]["ok"] is False
    assert {p["id"] for p in receipt["verification"]["problems"]} >= {"unlisted-file"}
    assert not _receipt_errors(receipt)


def test_receipt_of_an_unreadable_manifest(written_bundle: Path) -> None:
    (written_bundle / "bundle.json").write_text('{"schemaVersion": "9.0"}')
    result, error = _run_import(written_bundle)
    assert isinstance(error, ManifestError)
    receipt = _cli_receipt(written_bundle, error, result)
    assert receipt["verification"] is None and receipt["engine"] is None and receipt["images"] == []
    assert receipt["error"]["id"] == "unsupported-schema-version" and receipt["error"]["exitCode"] == 4
    assert not _receipt_errors(receipt)


def test_receipt_of_a_post_load_mismatch_and_missing_image() -> None:
    from importer.engines import EngineImage, EngineInfo
    from importer.pipeline.postload import check_image
    from importer.receipts.receipt import build_import_receipt

    model = load_bundle_manifest((GOLDEN / "valid" / "two-images-sharing-a-layer.json").read_bytes())
    first, second = model.images
    wrong = EngineImage(_d("other"), [str(x.diff_id) for x in second.layers][:1], [])
    checks = [check_image(second, wrong, "containerd"), check_image(first, None, "containerd")]
    assert [c.result for c in checks] == ["mismatch", "missing"]
    receipt = build_import_receipt(
        bundle_path="/media/usb/bundle", bundle_digest=_d("bundle.json"), schema_version=model.schema_version,
        engine=EngineInfo("docker", "29.0.0", "overlayfs", "containerd", "unix:///var/run/docker.sock").to_dict(),
        verification=None, images=[c.to_dict() for c in checks],
        timings={"verifySeconds": 1.23456, "loadSeconds": 2.0},
        result="fail", error={"id": "post-load-mismatch", "exitCode": 8, "message": "m", "context": "c", "hint": None},
    )
    assert not _receipt_errors(receipt)


@pytest.mark.parametrize("breaks", [
    lambda r: r.update(result="ok"),
    lambda r: r.update(error={"id": "x", "exitCode": 3, "message": "m", "context": None, "hint": None}),
    lambda r: r.update(kind="export"),
    lambda r: r["bundle"].update(digest="sha256:XYZ"),
    lambda r: r["timings"].update(loadSeconds="slow"),
    lambda r: r.update(verification={"ok": False, "problems": []}),
    lambda r: r["images"][0].update(result="ok"),
    lambda r: r.pop("host"),
    lambda r: r.update(staging={"refs": "sneakernet-staging/x:0"}),
    lambda r: r.update(signature={"status": "verified", "keyFingerprint": "ed25519:abc"}),
])
def test_receipt_schema_is_not_vacuous(written_bundle: Path, breaks: Any) -> None:
    result, _ = _run_import(written_bundle)
    receipt = _cli_receipt(written_bundle, None, result)
    assert not _receipt_errors(receipt)
    breaks(receipt)
    assert _receipt_errors(receipt)
