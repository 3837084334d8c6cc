"""Signatures: keygen, signing, and both verification backends (the `cryptography` module and
the OpenSSL 3 CLI) accepting good and refusing bad signatures, each with its exact error id.
Engine-free; the bundles come from tests/kit/bundlegen.py."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from bundle.keys import generate_keypair, load_signing_key
from importer.errors import BundleError
from importer.verify.signature import (
    BadSignature,
    InvalidKey,
    encode_signature,
    parse_public_key_pem,
    parse_signature,
)
from tests.kit.bundlegen import make_bundle
from tests.kit.helpers import REPO, run_cli, run_pyz
from tests.kit.trustkit import (
    copy_bundle,
    error_id,
    keypair,
    python38,
    regenerate_sums,
    sign,
    sums_accept,
)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("keys")
    return {"publisher": keypair(d, "publisher"), "other": keypair(d, "other"), "next": keypair(d, "next")}


@pytest.fixture(scope="module")
def signed_pristine(pristine: Path, tmp_path_factory: pytest.TempPathFactory, keys: dict) -> Path:
    b = copy_bundle(pristine, tmp_path_factory.mktemp("s") / "signed.bundle")
    sign(b, keys["publisher"][0])
    return b


@pytest.fixture
def signed(signed_pristine: Path, tmp_path: Path) -> Path:
    return copy_bundle(signed_pristine, tmp_path / "signed.bundle")


def _bundle_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("bundle", *args, input=stdin, timeout=300)


# ============================================================================ keygen


def test_keygen_writes_a_0600_key_and_a_pem_public_key(tmp_path: Path) -> None:
    os.umask(0o022)
    proc = _bundle_cli("keygen", "-o", str(tmp_path / "k"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    key, pub = tmp_path / "k.key", tmp_path / "k.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(pub.stat().st_mode) == 0o644
    assert doc["encrypted"] is False
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    assert isinstance(private, Ed25519PrivateKey)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert doc["fingerprint"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    # the public key is what openssl reads too
    text = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(pub), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "ED25519 Public-Key" in text


def test_keygen_never_overwrites_and_never_follows_a_link(tmp_path: Path) -> None:
    (tmp_path / "k.key").write_text("precious")
    proc = _bundle_cli("keygen", "-o", str(tmp_path / "k"))
    assert proc.returncode == 2 and error_id(proc.stderr) == "invalid-key"
    assert (tmp_path / "k.key").read_text() == "precious" and not (tmp_path / "k.pub").exists()
    (tmp_path / "l.key").symlink_to(tmp_path / "elsewhere")  # dangling: O_EXCL must refuse it
    assert _bundle_cli("keygen", "-o", str(tmp_path / "l")).returncode == 2
    assert not (tmp_path / "elsewhere").exists()


def test_encrypted_key_needs_its_passphrase(tmp_path: Path) -> None:
    proc = _bundle_cli("keygen", "-o", str(tmp_path / "k"), "--passphrase-stdin", stdin="correct horse\n")
    assert proc.returncode == 0, proc.stderr
    assert b"ENCRYPTED PRIVATE KEY" in (tmp_path / "k.key").read_bytes()
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600
    with pytest.raises(InvalidKey, match="expected a passphrase"):
        load_signing_key(str(tmp_path / "k.key"))
    with pytest.raises(InvalidKey, match="wrong passphrase"):
        load_signing_key(str(tmp_path / "k.key"), b"wrong")
    assert isinstance(load_signing_key(str(tmp_path / "k.key"), b"correct horse"), Ed25519PrivateKey)
    b = make_bundle(tmp_path / "b")
    proc = _bundle_cli("sign", str(b), "--sign-key", str(tmp_path / "k.key"), "--passphrase-stdin", stdin="wrong\n")
    assert proc.returncode == 2 and error_id(proc.stderr) == "invalid-key"
    assert not (b / "bundle.json.sig").exists()
    proc = _bundle_cli("sign", str(b), "--sign-key", str(tmp_path / "k.key"), "--passphrase-stdin",
                       stdin="correct horse\n")
    assert proc.returncode == 0, proc.stderr
    ok = run_pyz(b, "--verify-only", "--trust", str(tmp_path / "k.pub"))
    assert ok.returncode == 0, ok.stderr


def test_keygen_refuses_an_empty_passphrase(tmp_path: Path) -> None:
    proc = _bundle_cli("keygen", "-o", str(tmp_path / "k"), "--passphrase-stdin", stdin="\n")
    assert proc.returncode == 2 and not (tmp_path / "k.key").exists()


# ============================================================================ signing


def test_signed_bundle_lists_the_signature_in_sha256sums(signed: Path, keys: dict) -> None:
    assert sums_accept(signed)
    listed = {line.split("  ", 1)[1] for line in (signed / "SHA256SUMS").read_text().splitlines()}
    assert "bundle.json.sig" in listed
    doc = json.loads((signed / "bundle.json.sig").read_text())
    assert doc["mediaType"] == "application/vnd.sneakernet.signature.v1+json"
    assert doc["signedDigest"] == "sha256:" + hashlib.sha256((signed / "bundle.json").read_bytes()).hexdigest()


def test_signature_file_matches_its_schema(signed: Path) -> None:
    import jsonschema

    schema = json.loads((REPO / "schemas" / "signature" / "v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads((signed / "bundle.json.sig").read_text()))


def test_sign_refuses_a_bundle_that_does_not_verify(tmp_path: Path, keys: dict) -> None:
    b = make_bundle(tmp_path / "b")
    (b / "index.json").write_text("{}")
    proc = _bundle_cli("sign", str(b), "--sign-key", str(keys["publisher"][0]))
    assert proc.returncode == 3 and not (b / "bundle.json.sig").exists()


# ============================================================================ both backends

BACKENDS = ["cryptography", "openssl", "openssl-on-python3.8"]


def _verify(bundle: Path, backend: str, *args: str) -> subprocess.CompletedProcess[str]:
    if backend == "openssl-on-python3.8":  # a real host without the cryptography module
        return run_pyz(bundle, "--verify-only", *args, python=python38())
    return run_pyz(bundle, "--verify-only", *args, env={"SNEAKERNET_SIGNATURE_BACKEND": backend})


@pytest.mark.parametrize("backend", BACKENDS)
def test_good_signature_verifies_and_prints_the_fingerprint(signed: Path, keys: dict, backend: str) -> None:
    key, pub = keys["publisher"]
    fp = sign(signed, key)  # same bytes, same signature (Ed25519 is deterministic)
    proc = _verify(signed, backend, "--trust", str(pub), "--json")
    assert proc.returncode == 0, proc.stderr
    assert f"signature: verified (ed25519 key {fp}" in proc.stderr
    assert f"checked with {backend.split('-')[0]}" in proc.stderr
    sig = json.loads(proc.stdout)["verification"]["signature"]
    assert sig["status"] == "verified" and sig["keyFingerprint"] == fp and sig["trustedKeyFile"] == str(pub)


def _edit_and_regenerate(b: Path) -> None:
    doc = json.loads((b / "bundle.json").read_text())
    doc["source"]["note"] = "edited on the way"
    (b / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    regenerate_sums(b)


def _forge_with_right_digest(b: Path) -> None:
    """A signature document that names the trusted key and the right digest but whose 64
    signature bytes are wrong: only the cryptographic check can catch it."""
    doc = json.loads((b / "bundle.json.sig").read_text())
    raw = bytearray(base64.b64decode(doc["signature"]))
    raw[10] ^= 0x01
    doc["signature"] = base64.b64encode(bytes(raw)).decode()
    (b / "bundle.json.sig").write_text(json.dumps(doc, indent=2) + "\n")
    regenerate_sums(b)


def _swap_signature_from_another_bundle(b: Path, other: Path) -> None:
    (b / "bundle.json.sig").write_bytes((other / "bundle.json.sig").read_bytes())
    regenerate_sums(b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_edited_bundle_json_with_regenerated_sums_fails_only_the_signature(signed: Path, keys: dict,
                                                                          backend: str) -> None:
    _edit_and_regenerate(signed)
    assert sums_accept(signed)  # checksums alone cannot catch it (zarf#4445)
    assert run_pyz(signed, "--verify-only").returncode == 0  # nor can verification without --trust
    proc = _verify(signed, backend, "--trust", str(keys["publisher"][1]))
    assert proc.returncode == 7 and error_id(proc.stderr) == "bad-signature", proc.stderr
    assert "changed after signing" in proc.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_forged_signature_bytes_are_refused_by_the_backend(signed: Path, keys: dict, backend: str) -> None:
    _forge_with_right_digest(signed)
    proc = _verify(signed, backend, "--trust", str(keys["publisher"][1]))
    assert proc.returncode == 7 and error_id(proc.stderr) == "bad-signature", proc.stderr
    assert "does not verify" in proc.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_signature_of_another_bundle_is_refused(signed: Path, keys: dict, tmp_path: Path, backend: str) -> None:
    other = make_bundle(tmp_path / "other", compression="gzip")
    sign(other, keys["publisher"][0])
    _swap_signature_from_another_bundle(signed, other)
    proc = _verify(signed, backend, "--trust", str(keys["publisher"][1]))
    assert proc.returncode == 7 and error_id(proc.stderr) == "bad-signature", proc.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_signature_by_an_untrusted_key_is_refused(signed: Path, keys: dict, backend: str) -> None:
    sign(signed, keys["other"][0])
    proc = _verify(signed, backend, "--trust", str(keys["publisher"][1]))
    assert proc.returncode == 7 and error_id(proc.stderr) == "untrusted-key", proc.stderr
    assert json.loads((signed / "bundle.json.sig").read_text())["keyFingerprint"] in proc.stderr


def test_unsigned_bundle_is_refused_when_a_signature_is_required(tmp_path: Path, keys: dict) -> None:
    b = make_bundle(tmp_path / "b")
    for args in (["--require-signature"], ["--trust", str(keys["publisher"][1])]):
        proc = run_pyz(b, "--verify-only", *args)
        assert proc.returncode == 7 and error_id(proc.stderr) == "signature-missing", proc.stderr
    proc = run_pyz(b, "--verify-only")
    assert proc.returncode == 0 and "signature: none" in proc.stderr


def test_stripped_signature_is_refused_under_trust(signed: Path, keys: dict) -> None:
    (signed / "bundle.json.sig").unlink()
    regenerate_sums(signed)
    proc = run_pyz(signed, "--verify-only", "--trust", str(keys["publisher"][1]))
    assert proc.returncode == 7 and error_id(proc.stderr) == "signature-missing"


def test_signed_bundle_without_trust_is_reported_not_checked(signed: Path, keys: dict) -> None:
    proc = run_pyz(signed, "--verify-only", "--json")
    assert proc.returncode == 0
    assert "NOT checked" in proc.stderr
    assert json.loads(proc.stdout)["verification"]["signature"]["status"] == "not-checked"
    proc = run_pyz(signed, "--verify-only", "--require-signature")  # signed, but nothing to check it with
    assert proc.returncode == 7 and error_id(proc.stderr) == "untrusted-key"


@pytest.mark.parametrize("damage", ["not-json", "wrong-algorithm", "short-signature", "symlink", "huge"])
def test_malformed_signature_file_is_refused(signed: Path, keys: dict, tmp_path: Path, damage: str) -> None:
    sig = signed / "bundle.json.sig"
    doc = json.loads(sig.read_text())
    if damage == "not-json":
        sig.write_text("not json")
    elif damage == "wrong-algorithm":
        sig.write_text(json.dumps({**doc, "algorithm": "rsa"}))
    elif damage == "short-signature":
        sig.write_text(json.dumps({**doc, "signature": base64.b64encode(b"x" * 32).decode()}))
    elif damage == "symlink":
        (tmp_path / "real.sig").write_bytes(sig.read_bytes())
        sig.unlink()
        sig.symlink_to(tmp_path / "real.sig")
    else:
        sig.write_bytes(b" " * (1024 * 1024))
    proc = run_pyz(signed, "--verify-only", "--trust", str(keys["publisher"][1]))
    expected = "limit-exceeded" if damage == "huge" else "bad-signature"
    assert error_id(proc.stderr) == expected, proc.stderr
    assert proc.returncode == (3 if damage == "huge" else 7)


def test_bad_trust_argument_is_a_usage_error(signed: Path, tmp_path: Path, keys: dict) -> None:
    (tmp_path / "not-a-key.pub").write_text("hello")
    proc = run_pyz(signed, "--verify-only", "--trust", str(tmp_path / "not-a-key.pub"))
    assert proc.returncode == 2 and error_id(proc.stderr) == "invalid-key"
    proc = run_pyz(signed, "--verify-only", "--trust", str(keys["publisher"][0]))  # the private key
    assert proc.returncode == 2 and error_id(proc.stderr) == "invalid-key"


def test_no_verifier_at_all_is_refused_clearly(signed: Path, keys: dict, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = run_pyz(signed, "--verify-only", "--trust", str(keys["publisher"][1]), python=python38(),
                        env={"PATH": str(empty)})
    assert proc.returncode == 2 and error_id(proc.stderr) == "no-signature-verifier", proc.stderr
    assert "pip install cryptography" in proc.stderr and "apt-get install openssl" in proc.stderr


def test_key_rotation_with_a_trust_folder(tmp_path: Path, keys: dict) -> None:
    """docs/security.md: trust a folder; add the new key, re-sign, later remove the old key."""
    trust = tmp_path / "trusted.d"
    trust.mkdir()
    (trust / "publisher.pub").write_bytes(keys["publisher"][1].read_bytes())
    (trust / "next.pub").write_bytes(keys["next"][1].read_bytes())
    old = make_bundle(tmp_path / "old")
    sign(old, keys["publisher"][0])
    new = make_bundle(tmp_path / "new")
    sign(new, keys["next"][0])
    for b in (old, new):
        assert run_pyz(b, "--verify-only", "--trust", str(trust)).returncode == 0
    (trust / "publisher.pub").unlink()  # the old key is retired
    proc = run_pyz(old, "--verify-only", "--trust", str(trust))
    assert proc.returncode == 7 and error_id(proc.stderr) == "untrusted-key"
    assert run_pyz(new, "--verify-only", "--trust", str(trust)).returncode == 0


def test_manual_verification_as_documented(signed: Path, keys: dict, tmp_path: Path) -> None:
    """docs/security.md, "Verifying by hand": sed + base64 + openssl, no Python."""
    script = f"""
set -e
cd {signed}
sed -n 's/^  "signature": "\\(.*\\)"$/\\1/p' bundle.json.sig | base64 -d > {tmp_path}/sig.bin
openssl pkeyutl -verify -pubin -inkey {keys['publisher'][1]} -rawin -in bundle.json -sigfile {tmp_path}/sig.bin
sha256sum -c --strict --quiet SHA256SUMS
grep -q "$(sha256sum bundle-import.pyz | cut -d' ' -f1)" bundle.json
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Signature Verified Successfully" in proc.stdout
    _edit_and_regenerate(signed)
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode != 0


# ============================================================================ property tests


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=600), st.text(max_size=300).map(str.encode),
                 st.dictionaries(st.sampled_from(["mediaType", "algorithm", "keyFingerprint", "signedFile",
                                                  "signedDigest", "signature"]),
                                 st.one_of(st.text(max_size=90), st.integers(), st.none()))
                 .map(lambda d: json.dumps(d).encode())))
def test_signature_parser_raises_only_bad_signature(raw: bytes) -> None:
    with contextlib.suppress(BadSignature):
        parse_signature(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.binary(min_size=64, max_size=64), st.binary(max_size=200))
def test_signature_documents_round_trip(raw_key: bytes, signature: bytes, bundle_json: bytes) -> None:
    doc = parse_signature(encode_signature(bundle_json, signature, raw_key))
    assert doc.signature == signature
    assert doc.signed_digest == "sha256:" + hashlib.sha256(bundle_json).hexdigest()
    assert doc.key_fingerprint == "sha256:" + hashlib.sha256(raw_key).hexdigest()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_public_key_parser_raises_only_invalid_key(data: bytes) -> None:
    with contextlib.suppress(InvalidKey):
        assert len(parse_public_key_pem(b"-----BEGIN PUBLIC KEY-----\n" + data, "x")) == 32


def test_public_key_parser_agrees_with_cryptography(tmp_path: Path) -> None:
    pair = generate_keypair(str(tmp_path / "k"))
    private = load_signing_key(pair.private_path)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert parse_public_key_pem(Path(pair.public_path).read_bytes(), "k.pub") == raw
    other = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len(parse_public_key_pem(other, "other")) == 32
    with pytest.raises(BundleError):
        parse_public_key_pem(Path(pair.private_path).read_bytes(), "k.key")
