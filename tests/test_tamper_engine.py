"""The tamper matrix against a real engine: every case is refused with its exact error id, and
`docker images -a` is the same before and after. The bundle is exported from a private dockerd
and signed; the importer is the bundle's own pyz, run with --trust.

Engine matrix (issue 13): every case runs on Docker's classic store and on its containerd store
(fixture ``docker_store``; the images are built and exported in that engine, so the bundle carries
the layers as that store keeps them). The whole matrix is cheap (a refused case never loads), so
nothing is left out; only the schema-99 message test (no engine involved past the refusal) runs on
the classic store alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from bundle.keys import load_signing_key
from importer.verify.signature import encode_signature
from tests.kit.engines import DOCKER_STORES
from tests.kit.helpers import run_pyz
from tests.kit.trustkit import (
    SEC_REFS,
    build_sec_images,
    copy_bundle,
    engine_listing,
    error_id,
    export_bundle,
    keypair,
    python38,
    regenerate_sums,
    remove_images,
    sign,
    staging_tags,
    sums_accept,
    tagged_images_verify,
)
from tests.test_verify import CASES as INTEGRITY_CASES

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("keys")
    return {"publisher": keypair(d, "publisher"), "stranger": keypair(d, "stranger")}


BOTH_STORES = pytest.mark.parametrize("docker_store", sorted(DOCKER_STORES), indirect=True)


@pytest.fixture(scope="module")
def _signed_bundles() -> dict[str, Path]:
    return {}


@pytest.fixture
def signed_bundle(docker_store: str, docker_store_host: str, busybox: str, keys: dict, _signed_bundles: dict,
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two sec images built in this store's engine and exported from it, signed (once per store)."""
    if docker_store not in _signed_bundles:
        build_sec_images(docker_store_host, busybox, tmp_path_factory.mktemp(f"ctx-{docker_store}"))
        out = export_bundle(docker_store_host, tmp_path_factory.mktemp(f"b-{docker_store}") / "sec.bundle",
                            sign_key=keys["publisher"][0])
        assert (out / "bundle.json.sig").is_file() and sums_accept(out)
        _signed_bundles[docker_store] = out
    return _signed_bundles[docker_store]  # type: ignore[no-any-return]


@pytest.fixture
def clean_engine(signed_bundle: Path, docker_store_host: str) -> str:
    """The bundle's images are not in the engine: a wrongful load would show in the listing."""
    remove_images(docker_store_host)
    return docker_store_host


def _import(bundle: Path, docker_host: str, receipt: Path, *args: str,
            pyz: Path | None = None) -> tuple[int, str | None, dict]:
    """Import with ``pyz``: a trusted copy of the importer (the tampered bundle's own may be the
    damaged file itself; docs/security.md says to run a verified importer)."""
    proc = run_pyz(bundle, "--docker-host", docker_host, "--receipt", str(receipt), "--json", *args, pyz=pyz)
    doc = json.loads(receipt.read_text()) if receipt.exists() else {}
    return proc.returncode, error_id(proc.stderr), doc


# ============================================================================ the matrix

SIGNATURE_CASES: dict[str, Callable[[Path, dict], None]] = {}


def sig_case(fn: Callable[[Path, dict], None]) -> Callable[[Path, dict], None]:
    SIGNATURE_CASES[fn.__name__] = fn
    return fn


@sig_case
def edited_bundle_json_and_regenerated_sums(b: Path, keys: dict) -> None:
    doc = json.loads((b / "bundle.json").read_text())
    doc["images"][0]["refs"] = ["sectest/evil:1"]  # retag something else on the far side
    (b / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    regenerate_sums(b)
    assert sums_accept(b)


@sig_case
def signed_by_an_untrusted_key(b: Path, keys: dict) -> None:
    sign(b, keys["stranger"][0])


@sig_case
def signature_stripped(b: Path, keys: dict) -> None:
    (b / "bundle.json.sig").unlink()
    regenerate_sums(b)


@sig_case
def schema_major_99_signed_by_the_publisher(b: Path, keys: dict) -> None:
    text = (b / "bundle.json").read_text()
    (b / "bundle.json").write_text(text.replace('"schemaVersion": "3.0"', '"schemaVersion": "99.0"', 1))
    _sign_raw(b, keys["publisher"][0])


def _sign_raw(b: Path, key: Path) -> None:
    """Sign whatever bundle.json holds (`bundle sign` would refuse to parse schema 99)."""
    private = load_signing_key(str(key))
    raw = (b / "bundle.json").read_bytes()
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (b / "bundle.json.sig").write_bytes(encode_signature(raw, private.sign(raw), public))
    regenerate_sums(b)


EXPECTED_SIGNATURE = {
    "edited_bundle_json_and_regenerated_sums": (7, "bad-signature"),
    "signed_by_an_untrusted_key": (7, "untrusted-key"),
    "signature_stripped": (7, "signature-missing"),
    "schema_major_99_signed_by_the_publisher": (4, "unsupported-schema-version"),
}


@BOTH_STORES
@pytest.mark.parametrize("name", sorted(INTEGRITY_CASES))
def test_integrity_tamper_changes_nothing_in_the_engine(name: str, signed_bundle: Path, clean_engine: str,
                                                        keys: dict, tmp_path: Path) -> None:
    b = copy_bundle(signed_bundle, tmp_path / "b")
    problem = INTEGRITY_CASES[name](b)
    before = engine_listing(clean_engine)
    rc, ident, receipt = _import(b, clean_engine, tmp_path / "r.json", "--trust", str(keys["publisher"][1]),
                                 pyz=signed_bundle / "bundle-import.pyz")
    if name == "flipped_bundle_json":  # under --trust the signature catches it first
        assert (rc, ident) == (7, "bad-signature")
    else:
        assert (rc, ident) == (3, "verification-failed")
        assert problem in {(p["id"], p["path"]) for p in receipt["verification"]["problems"]}
    assert receipt["result"] == "fail" and receipt["error"]["id"] == ident
    assert engine_listing(clean_engine) == before


@BOTH_STORES
@pytest.mark.parametrize("name", sorted(INTEGRITY_CASES))
def test_integrity_tamper_without_trust_is_still_caught(name: str, signed_bundle: Path, clean_engine: str,
                                                         tmp_path: Path) -> None:
    b = copy_bundle(signed_bundle, tmp_path / "b")
    problem = INTEGRITY_CASES[name](b)
    before = engine_listing(clean_engine)
    rc, ident, receipt = _import(b, clean_engine, tmp_path / "r.json", pyz=signed_bundle / "bundle-import.pyz")
    assert (rc, ident) == (3, "verification-failed")
    assert problem in {(p["id"], p["path"]) for p in receipt["verification"]["problems"]}
    assert engine_listing(clean_engine) == before


@BOTH_STORES
@pytest.mark.parametrize("name", sorted(SIGNATURE_CASES))
def test_signature_tamper_changes_nothing_in_the_engine(name: str, signed_bundle: Path, clean_engine: str,
                                                        keys: dict, tmp_path: Path) -> None:
    b = copy_bundle(signed_bundle, tmp_path / "b")
    SIGNATURE_CASES[name](b, keys)
    before = engine_listing(clean_engine)
    rc, ident, receipt = _import(b, clean_engine, tmp_path / "r.json", "--trust", str(keys["publisher"][1]))
    assert (rc, ident) == EXPECTED_SIGNATURE[name]
    assert receipt["result"] == "fail" and receipt["engine"] is None  # refused before the engine was asked
    assert engine_listing(clean_engine) == before


def test_schema_99_message_names_the_importer_to_use(signed_bundle: Path, clean_engine: str, keys: dict,
                                                     tmp_path: Path) -> None:
    b = copy_bundle(signed_bundle, tmp_path / "b")
    schema_major_99_signed_by_the_publisher(b, keys)
    proc = run_pyz(b, "--docker-host", clean_engine, "--no-receipt", "--trust", str(keys["publisher"][1]))
    assert proc.returncode == 4
    assert "99.0" in proc.stderr and "bundle-import.pyz" in proc.stderr


# ============================================================================ and the good path


@BOTH_STORES
def test_signed_import_records_the_fingerprint_and_is_idempotent(signed_bundle: Path, clean_engine: str,
                                                                 keys: dict, tmp_path: Path) -> None:
    fp = json.loads((signed_bundle / "bundle.json.sig").read_text())["keyFingerprint"]
    args = ("--trust", str(keys["publisher"][1]), "--require-signature")
    rc, ident, receipt = _import(signed_bundle, clean_engine, tmp_path / "r1.json", *args)
    assert rc == 0, ident
    assert receipt["result"] == "pass"
    assert receipt["signature"]["status"] == "verified" and receipt["signature"]["keyFingerprint"] == fp
    assert receipt["verification"]["signature"]["keyFingerprint"] == fp
    assert receipt["preflight"]["ok"] is True
    assert {c["name"] for c in receipt["preflight"]["checks"]} >= {"signature", "schema", "engine", "space"}
    assert sorted(tagged_images_verify(clean_engine, signed_bundle)) == sorted(SEC_REFS)
    assert not staging_tags(clean_engine)
    before = engine_listing(clean_engine)
    rc, _, receipt = _import(signed_bundle, clean_engine, tmp_path / "r2.json", *args)
    assert rc == 0 and [i["status"] for i in receipt["images"]] == ["already-present", "already-present"]
    assert engine_listing(clean_engine) == before


@BOTH_STORES
def test_pyz_on_python_3_8_imports_with_the_openssl_verifier(signed_bundle: Path, clean_engine: str, keys: dict,
                                                             tmp_path: Path) -> None:
    proc = run_pyz(signed_bundle, "--docker-host", clean_engine, "--no-receipt", "--json",
                        "--trust", str(keys["publisher"][1]), python=python38())
    assert proc.returncode == 0, proc.stderr
    assert "checked with openssl" in proc.stderr
    assert json.loads(proc.stdout)["signature"]["backend"] == "openssl"
    assert sorted(tagged_images_verify(clean_engine, signed_bundle)) == sorted(SEC_REFS)
