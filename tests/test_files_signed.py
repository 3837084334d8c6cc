"""``--require-signed`` and file artifacts (issue 42 point 3, issue 38 class 1): what the policy
admits must be signed, files as images. A file artifact without a cosign signature by one of the
keys is refused before anything is written below --files-to, into an OCI layout, sent to a
registry, served or exported; a signed image never vouches for the files beside it. Schema 3.7:
``bundle export --sign-artifacts-key KEY`` signs them as ``cosign sign --key`` would, and the
policy admits exactly what its rule allows (a signature for another repository, another digest,
by another key, or a record whose tag is not derived from its subject: refused)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest

from bundle.artifactsign import load_artifact_key, signature_of
from bundle.blobstore import BlobStore
from bundle.cli import artifact_keys_from_args
from importer.errors import UsageError
from importer.format.digest import BlobRef, Digest
from importer.format.fileartifacts import FileArtifact
from importer.format.manifest import load_bundle_manifest
from tests.kit import engines, supplykit
from tests.kit.fileskit import MODEL_REF, edit_bundle_json, export_files, model_dir, tree
from tests.kit.fuzzkit import repin_file
from tests.kit.helpers import run_cli, run_pyz, run_zipapp
from tests.kit.layoutgen import REF, write_layout
from tests.kit.servekit import request, serving
from tests.kit.trustkit import error_id


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A key pair; an OCI layout whose multi/app:1 index is signed by it (identity multi/app); a
    model folder; bundles exported without a policy: the files alone, the signed image with them."""
    root = tmp_path_factory.mktemp("files-signed")
    signer, pub = supplykit.ecdsa_key(root)
    facts = write_layout(root / "layout")
    supplykit.layout_signature(root / "layout", facts["index"], REF.split(":")[0], signer)
    src = model_dir(root / "model", mib=1)
    only = export_files(root / "only", "--files", str(src))
    both = export_files(root / "both", f"oci:{root / 'layout'}:{REF}", "--files", str(src))
    key = root / "artifacts.key"  # what a publisher makes with openssl (PKCS#8 PEM, P-256)
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
                   check=True, capture_output=True)
    apub = root / "artifacts.pub"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(apub)], check=True, capture_output=True)
    signed = export_files(root / "signed", f"oci:{root / 'layout'}:{REF}", "--files", str(src),
                          "--sign-artifacts-key", str(key))
    return {"root": root, "signer": signer, "pub": pub, "src": src, "only": only, "both": both,
            "source": f"oci:{root / 'layout'}:{REF}", "key": key, "apub": apub, "signed": signed}


RECEIPT_SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "receipt" / "import-v1.schema.json"


def _refused(proc: Any, what: str = "image-unsigned") -> None:
    assert proc.returncode == 7 and error_id(proc.stderr) == what, proc.stderr
    assert f"file artifact {MODEL_REF}" in proc.stderr and "Traceback" not in proc.stderr


def test_the_signed_image_alone_is_admitted(made: dict[str, Any], tmp_path: Path) -> None:
    """The fixture's image signature verifies: what the refusals below refuse is the files."""
    proc = run_cli("bundle", "export", made["source"], "-o", str(tmp_path / "b"), "-q", "--json",
                   "--require-signed", str(made["pub"]))
    assert proc.returncode == 0, proc.stderr
    assert [s["image"] for s in json.loads(proc.stdout)["imageSignatures"]] == [REF]


@pytest.mark.parametrize("with_image", [False, True])
def test_export_refuses_unsigned_files(made: dict[str, Any], tmp_path: Path, with_image: bool) -> None:
    out = tmp_path / "b"
    source = [made["source"]] if with_image else []
    proc = run_cli("bundle", "export", *source, "--files", str(made["src"]), "--artifact-ref", MODEL_REF,
                   "-o", str(out), "-q", "--require-signed", str(made["pub"]))
    _refused(proc)
    assert not out.exists() and not list(tmp_path.glob("b.partial-*"))


@pytest.mark.parametrize("which", ["only", "both"])
def test_files_to_writes_nothing_unsigned(made: dict[str, Any], tmp_path: Path, which: str) -> None:
    dest = tmp_path / "dest"
    extra = ["--files-only"] if which == "both" else []
    proc = run_pyz(made[which], "--files-to", str(dest), *extra, "--no-receipt", "-q",
                   "--require-signed", str(made["pub"]))
    _refused(proc)
    assert not dest.exists()


def test_an_oci_layout_gets_nothing_unsigned(made: dict[str, Any], tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    proc = run_pyz(made["only"], "--engine", "oci", "--oci-dir", str(layout), "--no-receipt", "-q",
                   "--require-signed", str(made["pub"]))
    _refused(proc)
    assert not layout.exists()


def test_push_sends_nothing_unsigned(made: dict[str, Any]) -> None:
    """Refused before the registry is asked anything (127.0.0.1:9 answers nobody)."""
    for which in ("only", "both"):
        proc = run_cli("bundle", "push", str(made[which]), "127.0.0.1:9/team", "-q", "--require-signed",
                       str(made["pub"]), timeout=120)
        _refused(proc)


def test_serve_serves_nothing_unsigned(made: dict[str, Any]) -> None:
    bundle = made["both"]
    proc = run_zipapp(bundle / "bundle-import.pyz", "serve", str(bundle), "--listen", "127.0.0.1:0",
                      "--require-signed", str(made["pub"]), timeout=60)  # the old code served on
    _refused(proc)


# ------------------------------------------------------------------ 3.7: file artifacts signed


def test_signed_files_are_admitted(made: dict[str, Any], tmp_path: Path) -> None:
    """Exported with --sign-artifacts-key (schema 3.7): the image by its own key, the files by the
    artifacts' key; --require-signed with both admits the bundle and writes the files; the receipt
    names the verified file artifact; index.json names the signature under its cosign tag."""
    bundle = made["signed"]
    doc = json.loads((bundle / "bundle.json").read_text())
    assert doc["schemaVersion"] == "3.7"
    [sig] = doc["artifacts"][0]["signatures"]
    manifest = doc["artifacts"][0]["manifest"]["digest"]
    assert sig["kind"] == "signature" and sig["subject"] == manifest and sig["tag"] == f"sha256-{manifest[7:]}.sig"
    index = json.loads((bundle / "index.json").read_text())
    named = {m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"] for m in index["manifests"]
             if "annotations" in m}
    assert named[sig["tag"]] == sig["manifest"]["digest"]
    dest, receipt = tmp_path / "dest", tmp_path / "r.json"
    proc = run_pyz(bundle, "--files-to", str(dest), "--files-only", "--receipt", str(receipt), "-q",
                   "--require-signed", str(made["pub"]), "--require-signed", str(made["apub"]))
    assert proc.returncode == 0, proc.stderr
    assert tree(dest) == tree(made["src"])
    doc = json.loads(receipt.read_text())
    schema = jsonschema.Draft202012Validator(json.loads(RECEIPT_SCHEMA.read_text()))
    assert not [e.message for e in schema.iter_errors(doc)]
    rows = doc["imageSignatures"]
    [files] = [r for r in rows if r.get("kind") == "file-artifact"]
    assert list(schema.iter_errors({**doc, "imageSignatures": [{**files, "kind": "an-image"}]}))
    assert files["image"] == MODEL_REF and files["digest"] == manifest and files["identity"] == "models/llama"
    assert files["keyPath"] == str(made["apub"])
    only_image_key = run_pyz(bundle, "--files-to", str(tmp_path / "d2"), "--files-only", "--no-receipt", "-q",
                             "--require-signed", str(made["pub"]))
    assert only_image_key.returncode == 7 and error_id(only_image_key.stderr) == "image-signature-invalid"
    assert MODEL_REF in only_image_key.stderr and not (tmp_path / "d2").exists()


def test_export_signs_and_checks_in_one_run(made: dict[str, Any], tmp_path: Path) -> None:
    """Ed25519 (openssl's PKCS#8) too; --require-signed at export admits what it signed."""
    key = tmp_path / "ed.key"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    pub = tmp_path / "ed.pub"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    proc = run_cli("bundle", "export", "--files", str(made["src"]), "--artifact-ref", MODEL_REF, "-o",
                   str(tmp_path / "b"), "-q", "--json", "--sign-artifacts-key", str(key), "--require-signed", str(pub))
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)["imageSignatures"]
    assert row["kind"] == "file-artifact" and row["algorithm"] == "ed25519"


@pytest.mark.parametrize("content, found", [(b"not a key", "no PEM private key"),
                                            (b"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\nx\n", "cosign's"),
                                            (None, "readable file")])
def test_a_bad_artifact_key_fails_before_the_export(made: dict[str, Any], tmp_path: Path, content: bytes | None,
                                                    found: str) -> None:
    key = tmp_path / "k.key"
    if content is not None:
        key.write_bytes(content)
    proc = run_cli("bundle", "export", "--files", str(made["src"]), "--artifact-ref", MODEL_REF, "-o",
                   str(tmp_path / "b"), "-q", "--sign-artifacts-key", str(key))
    assert proc.returncode == 2 and error_id(proc.stderr) == "invalid-key" and found in proc.stderr, proc.stderr
    assert not (tmp_path / "b").exists() and "Traceback" not in proc.stderr
    images_only = run_cli("bundle", "export", made["source"], "-o", str(tmp_path / "c"), "-q",
                          "--sign-artifacts-key", str(made["key"]))
    assert images_only.returncode == 2 and "expected files to sign" in images_only.stderr


def test_files_packaged_as_an_image_are_not_signed_silently(made: dict[str, Any]) -> None:
    """--as-image makes the files an image: --sign-artifacts-key with it is refused, never ignored."""
    with pytest.raises(UsageError, match="packaged as an image"):
        artifact_keys_from_args(argparse.Namespace(sign_artifacts_key=[str(made["key"])], as_image=True), True)
    assert len(artifact_keys_from_args(argparse.Namespace(sign_artifacts_key=[str(made["key"])], as_image=False),
                                       True)) == 1


def _forge(made: dict[str, Any], dst: Path, change: Callable[[FileArtifact, BlobStore], FileArtifact]) -> Path:
    """A copy of the signed bundle whose file artifact's signatures ``change`` made (new blobs
    written into the copy, listed in files, SHA256SUMS made again): what a hostile publisher does."""
    subprocess.run(["cp", "-a", str(made["signed"]), str(dst)], check=True)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    art = load_bundle_manifest((dst / "bundle.json").read_bytes()).file_artifacts[0]
    store = BlobStore(str(dst), fsync=False)
    forged = change(art, store)

    def edit(doc: dict[str, Any]) -> None:
        doc["artifacts"][0]["signatures"] = [s.to_dict() for s in forged.signatures]
        listed = {f["path"] for f in doc["files"]}
        for s in forged.signatures:
            for b in s.every_blob():
                if b.digest.blob_path not in listed:
                    doc["files"].append({"path": b.digest.blob_path, "digest": str(b.digest), "size": b.size})
    edit_bundle_json(dst, edit)
    return dst


def _resigned(made: dict[str, Any], *, ref: str = MODEL_REF, digest: Digest | None = None,
              signing: Any = None) -> Callable[[FileArtifact, BlobStore], FileArtifact]:
    """A signature made as the exporter makes one, but for ``ref``'s repository, or over ``digest``,
    or by another key; recorded as a signature of the artifact's own manifest."""
    def change(art: FileArtifact, store: BlobStore) -> FileArtifact:
        signed = BlobRef(art.manifest.media_type, digest or art.manifest.digest, art.manifest.size)
        other = dataclasses.replace(art, ref=ref, manifest=signed)
        key = signing or load_artifact_key(str(made["key"]))
        rec = dataclasses.replace(signature_of(store, other, key), subject=art.manifest.digest,
                                  tag=f"sha256-{art.manifest.digest.hex}.sig")
        return dataclasses.replace(art, signatures=(rec,))
    return change


@pytest.mark.parametrize("case, error", [
    ("another-repository", "image-signature-invalid"),
    ("another-digest", "image-signature-invalid"),
    ("another-key", "image-signature-invalid"),
    ("tag-not-derived", "invalid-manifest"),
    ("subject-not-the-manifest", "invalid-manifest"),
    ("no-signature", "image-unsigned"),
])
def test_the_policy_admits_only_what_its_rule_allows(made: dict[str, Any], tmp_path: Path, case: str,
                                                     error: str) -> None:
    """The oracle for file artifacts: each forgery is refused before anything is written, and the
    same bundle with the true signature is admitted (test_signed_files_are_admitted)."""
    other = Digest.of_bytes(b"another manifest")
    changes: dict[str, Callable[[FileArtifact, BlobStore], FileArtifact]] = {
        "another-repository": _resigned(made, ref="models/other:3.1"),
        "another-digest": _resigned(made, digest=other),
        "another-key": _resigned(made, signing=supplykit.ecdsa_key(tmp_path / "k")[0]),  # a key nobody trusts
        "tag-not-derived": lambda a, s: dataclasses.replace(
            a, signatures=tuple(dataclasses.replace(r, tag="3.1") for r in a.signatures)),
        "subject-not-the-manifest": lambda a, s: dataclasses.replace(
            a, signatures=tuple(dataclasses.replace(r, subject=other, tag=f"sha256-{other.hex}.sig")
                                for r in a.signatures)),
        "no-signature": lambda a, s: a,
    }
    bundle = _forge(made, tmp_path / "forged", changes[case])
    if case == "no-signature":
        edit_bundle_json(bundle, lambda doc: doc["artifacts"][0].pop("signatures"))
    dest = tmp_path / "dest"
    proc = run_pyz(bundle, "--files-to", str(dest), "--files-only", "--no-receipt", "-q",
                   "--require-signed", str(made["pub"]), "--require-signed", str(made["apub"]))
    assert proc.returncode == (4 if error == "invalid-manifest" else 7), proc.stderr
    assert error_id(proc.stderr) == error and "Traceback" not in proc.stderr, proc.stderr
    assert not dest.exists()


@pytest.mark.engine
def test_push_hands_the_signature_on_and_cosign_verifies_it(made: dict[str, Any], tmp_path: Path) -> None:
    """`bundle push --require-signed` of signed files: the signature goes under its cosign tag before
    the artifact's tag, is read back, and the real cosign verifies the pushed files by the key."""
    supplykit.cosign()  # missing: fails under CI=true before a registry starts
    with engines.private_registry(f"files-signed-{os.getpid()}") as reg:
        proc = run_cli("bundle", "push", str(made["signed"]), f"{reg.addr}/site", "-q", "--json",
                       "--require-signed", str(made["pub"]), "--require-signed", str(made["apub"]))
        assert proc.returncode == 0, proc.stderr
        [files] = json.loads(proc.stdout)["fileArtifacts"]
        assert files["readBack"]["ok"], files
        pushed = f"{reg.addr}/site/models/llama@{files['manifestDigest']}"
        verified = _cosign_verify(made["apub"], pushed, tmp_path)
        assert verified.returncode == 0, verified.stderr
        assert files["manifestDigest"] in verified.stdout
        assert _cosign_verify(made["pub"], pushed, tmp_path).returncode != 0  # the image's key did not sign the files
        # --engine registry hands it on the same way (importer/registry/push_files.py, one path for both)
        imported = run_pyz(made["signed"], "--engine", "registry", "--registry", f"{reg.addr}/imp", "--no-receipt",
                           "-q", "--require-signed", str(made["pub"]), "--require-signed", str(made["apub"]))
        assert imported.returncode == 0, imported.stderr
        verified = _cosign_verify(made["apub"], f"{reg.addr}/imp/models/llama@{files['manifestDigest']}", tmp_path)
        assert verified.returncode == 0, verified.stderr


def _cosign_verify(pub: Path, ref: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The real ``cosign verify --key PUB REF`` against a loopback registry (no transparency log)."""
    return subprocess.run([supplykit.cosign(), "verify", "--key", str(pub), "--insecure-ignore-tlog=true",
                           "--allow-insecure-registry", ref], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "HOME": str(home)})


def _manifest_digest(made: dict[str, Any]) -> tuple[str, str]:
    doc = json.loads((made["signed"] / "bundle.json").read_text())["artifacts"][0]
    return doc["manifest"]["digest"], doc["signatures"][0]["manifest"]["digest"]


@pytest.mark.engine
def test_serve_hands_the_signature_on(made: dict[str, Any], tmp_path: Path) -> None:
    """`serve --require-signed`: the files' signature under its cosign tag; the real cosign verifies."""
    manifest, sig = _manifest_digest(made)
    bundle = made["signed"]
    with serving(bundle / "bundle-import.pyz", bundle, "--require-signed", str(made["pub"]), "--require-signed",
                 str(made["apub"])) as served:
        status, _, body = request(served.addr, "GET", f"/v2/models/llama/manifests/sha256-{manifest[7:]}.sig")
        assert status == 200 and str(Digest.of_bytes(body)) == sig
        status, _, body = request(served.addr, "GET", "/v2/models/llama/tags/list")
        assert f"sha256-{manifest[7:]}.sig" in json.loads(body)["tags"]
        verified = _cosign_verify(made["apub"], f"{served.addr}/models/llama@{manifest}", tmp_path)
        assert verified.returncode == 0, verified.stderr


def test_an_oci_layout_names_the_signature(made: dict[str, Any], tmp_path: Path) -> None:
    """`--engine oci --require-signed`: the files and their signature, named as `cosign save` names it."""
    manifest, sig = _manifest_digest(made)
    layout = tmp_path / "layout"
    proc = run_pyz(made["signed"], "--engine", "oci", "--oci-dir", str(layout), "--no-receipt", "-q",
                   "--require-signed", str(made["pub"]), "--require-signed", str(made["apub"]))
    assert proc.returncode == 0, proc.stderr
    named = {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m["digest"]
             for m in json.loads((layout / "index.json").read_text())["manifests"]}
    assert named[MODEL_REF] == manifest and named[f"sha256-{manifest[7:]}.sig"] == sig
    assert (layout / "blobs/sha256" / sig[7:]).is_file()


@pytest.mark.parametrize("change", ["tag-on-the-files", "tag-on-another-blob", "described-wrong"])
def test_the_bundles_index_json_names_the_signature_truly(made: dict[str, Any], tmp_path: Path, change: str) -> None:
    """index.json (re-pinned) whose cosign tag of the files' signature names another manifest, or
    whose signature entry lies about its size: the verification refuses it (invalid-layout)."""
    bundle = tmp_path / "b"
    subprocess.run(["cp", "-a", str(made["signed"]), str(bundle)], check=True)
    for p in bundle.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    sig = _manifest_digest(made)[1]
    art = json.loads((bundle / "bundle.json").read_text())["artifacts"][0]
    index = json.loads((bundle / "index.json").read_text())
    [entry] = [e for e in index["manifests"] if e["digest"] == sig]
    if change == "tag-on-the-files":  # the files' manifest under the signature's tag (and under its ref)
        entry.update(art["manifest"])
    elif change == "tag-on-another-blob":
        entry["digest"] = art["config"]["digest"]
    else:
        entry["size"] += 1
    (bundle / "index.json").write_text(json.dumps(index))
    repin_file(bundle, "index.json")
    proc = run_pyz(bundle, "--verify-only", "-q")
    assert proc.returncode != 0 and "index.json" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "invalid-layout" in proc.stderr or error_id(proc.stderr) == "invalid-layout", proc.stderr
