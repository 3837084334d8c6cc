"""Validate documents against the OCI image-spec JSON Schemas, offline.

The schemas (draft-04, the official ones of opencontainers/image-spec) come from Debian's
``golang-github-opencontainers-image-spec-dev``, which ``docker/scripts/install-deps.sh`` installs
(``/usr/share/gocode/src/github.com/opencontainers/image-spec/schema/``).
``$SNEAKERNET_OCI_SCHEMAS`` overrides the folder. They refer to each other by relative ``$ref``
(``defs-descriptor.json#/...``) resolved against their ``id``
(``https://opencontainers.org/schema/...``); every such URI is served from the local folder by
file name, and anything else is refused: nothing is fetched from the network.

``format`` keywords are not asserted (that would depend on optional packages).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Dict, List
from urllib.parse import urlsplit

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import DRAFT4

DEBIAN_PACKAGE = "golang-github-opencontainers-image-spec-dev"
DEFAULT_DIR = Path("/usr/share/gocode/src/github.com/opencontainers/image-spec/schema")

KINDS: Dict[str, str] = {
    "index": "image-index-schema.json",
    "manifest": "image-manifest-schema.json",
    "config": "config-schema.json",
    "layout": "image-layout-schema.json",
    "descriptor": "content-descriptor.json",
}


class OCISchemasMissing(FileNotFoundError):
    pass


def schema_dir() -> Path:
    """The folder holding the OCI schemas; raises OCISchemasMissing with what to do if absent."""
    folder = Path(os.environ.get("SNEAKERNET_OCI_SCHEMAS") or DEFAULT_DIR)
    missing = [name for name in KINDS.values() if not (folder / name).is_file()]
    if missing:
        raise OCISchemasMissing(
            f"OCI image-spec JSON Schemas not found: expected {', '.join(missing)} in {folder}. "
            f"Install them with `bash docker/scripts/install-deps.sh` (Debian's {DEBIAN_PACKAGE}), "
            "or point $SNEAKERNET_OCI_SCHEMAS at a folder holding them."
        )
    return folder


def _load(folder: Path, name: str) -> Resource[Any]:
    with open(folder / name, encoding="utf-8") as f:
        return Resource.from_contents(json.load(f), default_specification=DRAFT4)


@functools.lru_cache(maxsize=None)
def _registry(folder: Path) -> Registry[Any]:
    local = {p.name for p in folder.glob("*.json")}

    def retrieve(uri: str) -> Resource[Any]:
        name = urlsplit(uri).path.rsplit("/", 1)[-1]
        if name not in local:
            raise NoSuchResource(ref=uri)  # never fetch from the network
        return _load(folder, name)

    registry: Registry[Any] = Registry(retrieve=retrieve)
    for name in sorted(local):
        resource = _load(folder, name)
        registry = registry.with_resource(folder.joinpath(name).as_uri(), resource)
        if resource.id():
            registry = registry.with_resource(resource.id(), resource)
    return registry.crawl()


@functools.lru_cache(maxsize=None)
def _validator(kind: str, folder: Path) -> Any:
    if kind not in KINDS:
        raise ValueError(f"expected one of {', '.join(KINDS)}, found {kind!r}")
    with open(folder / KINDS[kind], encoding="utf-8") as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft4Validator)
    cls.check_schema(schema)
    return cls(schema, registry=_registry(folder))


def _without_nulls(value: Any) -> Any:
    """Drop object members whose value is null, recursively (Go's JSON reader, which the
    image-spec types, Docker and containerd use, treats them as absent)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _prepare(kind: str, doc: Any) -> Any:
    # Docker writes empty slices of the container config as null ("Env": null); the schema's
    # array types reject that, Go treats it as absent. Never for index/manifest: a null there
    # is a real bug (moby#47210 wrote "manifests": null).
    return _without_nulls(doc) if kind == "config" else doc


def oci_errors(kind: str, doc: Any) -> List[str]:
    """Every schema violation of ``doc`` as the OCI ``kind`` ('index', 'manifest', 'config',
    'layout', 'descriptor'), as 'path: message' lines; empty when valid."""
    validator = _validator(kind, schema_dir())
    errors = sorted(validator.iter_errors(_prepare(kind, doc)), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message}" for e in errors]


def validate_oci(kind: str, doc: Any) -> None:
    """Raise jsonschema.ValidationError unless ``doc`` is a valid OCI ``kind`` document."""
    validator = _validator(kind, schema_dir())
    error = jsonschema.exceptions.best_match(validator.iter_errors(_prepare(kind, doc)))
    if error is not None:
        raise error
