"""Signatures, attestations and SBOMs across the gap (issue 29): a loopback docker-registry holds
images pushed with the importer's own client, cosign-format signatures made here with
``cryptography`` (and, where installed, by the real cosign), and an SBOM attached as an OCI 1.1
referrer with its ``sha256-<hex>`` fallback index (docker-registry 2.8 has no Referrers API).
`bundle export docker://...` carries them byte for byte (bundle schema 3.5 ``artifacts``);
`--require-signed KEY.pub` refuses, at export and offline at import, an unsigned image or one
whose signature does not verify, with its typed error and nothing left behind."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from importer.format.manifest import check_structure
from importer.format.platform import host
from tests.kit import engines, supplykit
from tests.kit.clijson import export_json as export
from tests.kit.clijson import validate
from tests.kit.engines import Registry
from tests.kit.helpers import forget, image_ids, run_cli, run_pyz, run_zipapp
from tests.kit.servekit import serving
from tests.kit.transferkit import FlakyProxy
from tests.kit.trustkit import error_id, python38, regenerate_sums

pytestmark = pytest.mark.engine

SBOM = b'{"spdxVersion":"SPDX-2.3","name":"app","packages":[]}'


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("keys")
    signer, pub = supplykit.ecdsa_key(root, "publisher")
    other, other_pub = supplykit.ecdsa_key(root, "other")
    ed, ed_pub = supplykit.ed25519_key(root, "ed")
    return {"signer": signer, "pub": pub, "other": other, "other_pub": other_pub, "ed": ed, "ed_pub": ed_pub}


@pytest.fixture(scope="module")
def registry(keys: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """sn/app:1 signed (ECDSA) with an SBOM referrer; sn/edsigned:1 signed (Ed25519); sn/unsigned:1;
    sn/tampered:1 whose signature was made over another payload; sn/stolen:1 carrying a valid
    signature of sn/app:1's digest (a signature copied onto another image)."""
    with engines.private_registry(f"supply-{os.getpid()}") as reg:
        addr = reg.addr
        out: dict[str, Any] = {"reg": reg, "addr": addr}
        app = supplykit.push_image(addr, "sn/app", "1", "signed app\n")
        out["app"] = app
        out["app_sig"] = supplykit.cosign_sign(addr, "sn/app", app["digest"], keys["signer"])
        out["sbom"] = supplykit.attach_sbom(addr, "sn/app", app, SBOM)
        ed = supplykit.push_image(addr, "sn/edsigned", "1", "ed25519\n")
        supplykit.cosign_sign(addr, "sn/edsigned", ed["digest"], keys["ed"])
        supplykit.push_image(addr, "sn/unsigned", "1", "nobody signed me\n")
        tampered = supplykit.push_image(addr, "sn/tampered", "1", "tampered\n")
        supplykit.cosign_sign(addr, "sn/tampered", tampered["digest"], keys["signer"],
                              signed=supplykit.payload(tampered["digest"], f"{addr}/sn/other"))
        stolen = supplykit.push_image(addr, "sn/stolen", "1", "stolen\n")
        supplykit.cosign_sign(addr, "sn/stolen", stolen["digest"], keys["signer"],
                              signature=supplykit.sign_bytes(keys["signer"], supplykit.payload(
                                  app["digest"], f"{addr}/sn/app")),
                              reference=f"{addr}/sn/app")
        _hostile(addr, out)
        yield out


def _hostile(addr: str, out: dict[str, Any]) -> None:
    """What a broken or hostile registry can hold (docker-registry 2.8 stores manifests whose
    descriptors give the wrong size): sn/badsize:1 whose .sig names its payload with a size it does
    not have, sn/huge:1 whose .sig claims a 1 TiB payload, sn/notindex:1 whose sha256-<hex> tag is
    an image manifest rather than a referrers index."""
    for repo, size in (("sn/badsize", 99), ("sn/huge", 1 << 40)):
        image = supplykit.push_image(addr, repo, "1", f"{repo}\n")
        with supplykit.client(addr) as c:
            cfg = supplykit.push_blob(c, repo, b"{}", supplykit.OCI_CONFIG)
            layer = {**supplykit.push_blob(c, repo, b"payload", supplykit.SIMPLE_SIGNING), "size": size}
            supplykit.push_manifest(c, repo, {"schemaVersion": 2, "mediaType": supplykit.OCI_MANIFEST,
                                              "config": cfg, "layers": [layer]},
                                    "sha256-" + image["digest"][7:] + ".sig")
    image = supplykit.push_image(addr, "sn/notindex", "1", "not an index\n")
    out["notindex"] = image
    supplykit.push_image(addr, "sn/notindex", "sha256-" + image["digest"][7:], "a tag that looks like one\n")


def _raw(ref: str) -> bytes:
    """The manifest bytes skopeo (an independent reader) reads at ``ref`` (docker:// or oci:)."""
    tls = [] if ref.startswith("oci:") else ["--tls-verify=false"]
    return subprocess.run([engines.require("skopeo"), "inspect", "--raw", *tls, ref],
                          capture_output=True, check=True, timeout=120).stdout




def bundle_json(bundle: Path) -> Any:
    return json.loads((bundle / "bundle.json").read_text())


def test_export_carries_the_signature_and_the_sbom_byte_for_byte(registry: dict[str, Any], tmp_path: Path) -> None:
    addr = registry["addr"]
    out = tmp_path / "b"
    proc, doc = export(f"docker://{addr}/sn/app:1", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert doc["images"][0]["artifacts"] == 3
    bj = bundle_json(out)
    assert bj["schemaVersion"] == "3.5"
    model, issues = check_structure(bj)
    assert model is not None, issues
    arts = {a["kind"]: a for a in bj["images"][0]["artifacts"]}
    assert set(arts) == {"signature", "referrers-index", "referrer"}
    hexd = registry["app"]["digest"].split(":")[1]
    assert arts["signature"]["tag"] == f"sha256-{hexd}.sig"
    assert arts["signature"]["manifest"]["digest"] == registry["app_sig"]["digest"]
    assert arts["referrers-index"]["tag"] == f"sha256-{hexd}"
    assert arts["referrer"]["manifest"]["digest"] == registry["sbom"]["digest"]
    assert arts["referrer"]["artifactType"] == supplykit.SPDX
    assert {a["subject"] for a in arts.values()} == {registry["app"]["digest"]}
    # byte for byte: the registry's bytes (read by skopeo, an independent reader) are the bundle's blobs
    for ref, art in ((f"docker://{addr}/sn/app:sha256-{hexd}.sig", arts["signature"]),
                     (f"docker://{addr}/sn/app@{registry['sbom']['digest']}", arts["referrer"])):
        raw = subprocess.run([engines.require("skopeo"), "inspect", "--raw", "--tls-verify=false", ref],
                             capture_output=True, check=True, timeout=120).stdout
        assert (out / "blobs/sha256" / art["manifest"]["digest"].split(":")[1]).read_bytes() == raw
    sbom_blob = next(b for b in arts["referrer"]["blobs"] if b["mediaType"] == supplykit.SPDX)
    assert (out / "blobs/sha256" / sbom_blob["digest"].split(":")[1]).read_bytes() == SBOM
    listed = {f["path"] for f in bj["files"]}
    assert all(f"blobs/sha256/{b['digest'].split(':')[1]}" in listed
               for a in arts.values() for b in [a["manifest"], *a["blobs"]])
    inspected = run_cli("bundle", "inspect", str(out), "--json")
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    validate("inspect", info)
    assert sorted(a["kind"] for a in info["images"][0]["artifacts"]) == ["referrer", "referrers-index", "signature"]
    text = run_cli("bundle", "inspect", str(out))
    assert f"sha256-{hexd}.sig" in text.stdout and supplykit.SPDX in text.stdout, text.stdout


def test_verification_covers_the_artifacts(registry: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert export(f"docker://{registry['addr']}/sn/app:1", "-o", str(out))[0].returncode == 0
    assert run_pyz(out, "--verify-only").returncode == 0
    sbom = next(a for a in bundle_json(out)["images"][0]["artifacts"] if a["kind"] == "referrer")
    blob = out / "blobs/sha256" / next(b for b in sbom["blobs"] if b["mediaType"] == supplykit.SPDX)["digest"][7:]
    blob.write_bytes(SBOM.replace(b"app", b"evil"))
    proc = run_pyz(out, "--verify-only")
    assert proc.returncode != 0 and error_id(proc.stderr) == "verification-failed", proc.stderr


def test_no_referrers_leaves_them_out(registry: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "b"
    proc, doc = export(f"docker://{registry['addr']}/sn/app:1", "-o", str(out), "--no-referrers")
    assert proc.returncode == 0, proc.stderr
    bj = bundle_json(out)
    assert bj["schemaVersion"] == "3.0" and "artifacts" not in bj["images"][0]
    assert doc["images"][0]["artifacts"] == 0


@pytest.mark.parametrize("repo, key", [("sn/app", "pub"), ("sn/edsigned", "ed_pub")])
def test_require_signed_export_accepts_a_signed_image(registry: dict[str, Any], keys: dict[str, Any],
                                                      tmp_path: Path, repo: str, key: str) -> None:
    out = tmp_path / "b"
    proc, doc = export(f"docker://{registry['addr']}/{repo}:1", "-o", str(out), "--require-signed",
                       str(keys["other_pub"]), "--require-signed", str(keys[key]))
    assert proc.returncode == 0, proc.stderr
    [signed] = doc["imageSignatures"]
    assert signed["keyPath"] == str(keys[key]) and signed["identity"] == f"{registry['addr']}/{repo}"
    assert signed["algorithm"] == ("ed25519" if key == "ed_pub" else "ecdsa-p256")


@pytest.mark.parametrize("repo, key, error", [("sn/unsigned", "pub", "image-unsigned"),
                                              ("sn/tampered", "pub", "image-signature-invalid"),
                                              ("sn/stolen", "pub", "image-signature-invalid"),
                                              ("sn/app", "other_pub", "image-signature-invalid")])
def test_require_signed_export_refuses(registry: dict[str, Any], keys: dict[str, Any], tmp_path: Path,
                                       repo: str, key: str, error: str) -> None:
    out = tmp_path / "b"
    proc, doc = export(f"docker://{registry['addr']}/{repo}:1", "-o", str(out), "--require-signed", str(keys[key]))
    assert proc.returncode == 7, proc.stderr
    assert doc["error"]["id"] == error, doc
    assert repo.split("/")[1] in doc["error"]["message"]
    assert not out.exists() and not list(tmp_path.glob("b.partial-*"))  # nothing left behind


@pytest.mark.parametrize("repo, found", [("sn/badsize", "found 7 bytes"), ("sn/huge", "at most 536870912 bytes")])
def test_export_refuses_an_artifact_with_other_bytes(registry: dict[str, Any], tmp_path: Path, repo: str,
                                                     found: str) -> None:
    """A descriptor that does not match the blob (or claims more than the bound) fails the export
    with its typed error, before any byte of a huge blob is read, and leaves nothing behind."""
    out = tmp_path / "b"
    proc, doc = export(f"docker://{registry['addr']}/{repo}:1", "-o", str(out))
    assert proc.returncode == 5 and doc["error"]["id"] == "source", proc.stderr
    assert found in doc["error"]["message"] and ".sig" in doc["error"]["message"]
    assert not out.exists() and not list(tmp_path.glob("b.partial-*"))
    assert export(f"docker://{registry['addr']}/{repo}:1", "-o", str(out), "--no-referrers")[0].returncode == 0


def test_a_fallback_tag_that_is_no_index_is_not_a_referrer(registry: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "b"
    proc, doc = export(f"docker://{registry['addr']}/sn/notindex:1", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert doc["images"][0]["artifacts"] == 0 and bundle_json(out)["schemaVersion"] == "3.0"


def test_require_signed_export_refuses_a_bad_key_file(registry: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    proc, doc = export(f"docker://{registry['addr']}/sn/app:1", "-o", str(tmp_path / "b"), "--require-signed",
                       str(bad))
    assert proc.returncode == 2 and doc["error"]["id"] == "invalid-key", proc.stderr
    assert not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def bundles(registry: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Bundles exported without a policy: the signed app, and the unsigned image."""
    root = tmp_path_factory.mktemp("supply-bundles")
    out = {}
    for name in ("app", "unsigned", "tampered"):
        proc, _ = export(f"docker://{registry['addr']}/sn/{name}:1", "-o", str(root / name))
        assert proc.returncode == 0, proc.stderr
        out[name] = root / name
    return out


def test_import_require_signed_into_an_oci_layout(bundles: dict[str, Path], keys: dict[str, Any],
                                                  registry: dict[str, Any], tmp_path: Path) -> None:
    layout, receipt = tmp_path / "layout", tmp_path / "receipt.json"
    proc = run_pyz(bundles["app"], "--engine", "oci", "--oci-dir", str(layout), "--require-signed",
                        str(keys["pub"]), "--receipt", str(receipt), "--json")
    assert proc.returncode == 0, proc.stderr
    validate("import", json.loads(proc.stdout))
    [signed] = json.loads(receipt.read_text())["imageSignatures"]
    assert signed["image"] == f"{registry['addr']}/sn/app:1"
    assert signed["digest"] == registry["app"]["digest"] and signed["keyPath"] == str(keys["pub"])
    index = json.loads((layout / "index.json").read_text())
    assert registry["app"]["digest"] in {m["digest"] for m in index["manifests"]}
    # the OCI layout target writes the artifacts too: the signature under its cosign tag (skopeo reads
    # it back byte for byte), the SBOM referrer unnamed with its artifactType, its blobs
    hexd = registry["app"]["digest"][7:]
    assert hashlib_hex(_raw(f"oci:{layout}:sha256-{hexd}.sig")) == registry["app_sig"]["digest"][7:]
    sbom = next(m for m in index["manifests"] if m["digest"] == registry["sbom"]["digest"])
    assert sbom["artifactType"] == supplykit.SPDX and "annotations" not in sbom
    assert (layout / "blobs/sha256" / hashlib_hex(SBOM)).read_bytes() == SBOM
    again = run_pyz(bundles["app"], "--engine", "oci", "--oci-dir", str(layout), "--no-receipt")
    assert again.returncode == 0, again.stderr
    assert json.loads((layout / "index.json").read_text()) == index  # a second import adds nothing


@pytest.mark.parametrize("name, error", [("unsigned", "image-unsigned"), ("tampered", "image-signature-invalid")])
def test_import_require_signed_refuses_before_any_change(bundles: dict[str, Path], keys: dict[str, Any],
                                                         tmp_path: Path, name: str, error: str) -> None:
    layout = tmp_path / "layout"
    proc = run_pyz(bundles[name], "--engine", "oci", "--oci-dir", str(layout), "--require-signed",
                        str(keys["pub"]), "--no-receipt")
    assert proc.returncode == 7 and error_id(proc.stderr) == error, proc.stderr
    assert not layout.exists()
    verify = run_pyz(bundles[name], "--verify-only", "--require-signed", str(keys["pub"]))
    assert verify.returncode == 7 and error_id(verify.stderr) == error, verify.stderr


def test_import_require_signed_refuses_a_swapped_signature_payload(bundles: dict[str, Path], keys: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    """A payload blob replaced in the bundle is caught by its digest before it is believed."""
    bundle = tmp_path / "app"
    subprocess.run(["cp", "-a", str(bundles["app"]), str(bundle)], check=True)
    sig = next(a for a in bundle_json(bundle)["images"][0]["artifacts"] if a["kind"] == "signature")
    layer = json.loads((bundle / "blobs/sha256" / sig["manifest"]["digest"][7:]).read_text())["layers"][0]
    (bundle / "blobs/sha256" / layer["digest"][7:]).write_bytes(b'{"critical":{}}')
    proc = run_pyz(bundle, "--verify-only", "--require-signed", str(keys["pub"]))
    assert proc.returncode != 0 and error_id(proc.stderr) == "digest-mismatch", proc.stderr


def test_import_require_signed_with_openssl_on_python38(bundles: dict[str, Path], keys: dict[str, Any]) -> None:
    """The oldest host the importer supports, without the cryptography module: `openssl dgst`."""
    python = python38()
    ok = run_pyz(bundles["app"], "--verify-only", "--require-signed", str(keys["pub"]), python=python)
    assert ok.returncode == 0, ok.stderr
    assert "cosign signature by" in ok.stderr
    bad = run_pyz(bundles["tampered"], "--verify-only", "--require-signed", str(keys["pub"]), python=python)
    assert bad.returncode == 7 and error_id(bad.stderr) == "image-signature-invalid", bad.stderr


@pytest.fixture(scope="module")
def cosign_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path, str]]:
    """An image signed in the registry by the real cosign (a key pair it generated)."""
    cosign = supplykit.cosign()
    root = tmp_path_factory.mktemp("cosign")
    env = {**os.environ, "COSIGN_PASSWORD": "test-passphrase", "HOME": str(root), "COSIGN_YES": "true"}
    subprocess.run([cosign, "generate-key-pair"], cwd=root, env=env, check=True, capture_output=True, timeout=120)
    with engines.private_registry(f"cosign-{os.getpid()}") as reg:
        image = supplykit.push_image(reg.addr, "sn/real", "1", "signed by cosign\n")
        signed = subprocess.run([cosign, "sign", "--key", str(root / "cosign.key"), "--tlog-upload=false",
                                 "--allow-insecure-registry", "--yes", f"{reg.addr}/sn/real@{image['digest']}"],
                                cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert signed.returncode == 0, signed.stderr
        yield reg, root / "cosign.pub", image["digest"]


def test_real_cosign_signature_is_carried_and_verified(cosign_registry: tuple[Registry, Path, str],
                                                       tmp_path: Path) -> None:
    reg, pub, digest = cosign_registry
    out = tmp_path / "b"
    proc, doc = export(f"docker://{reg.addr}/sn/real:1", "-o", str(out), "--require-signed", str(pub))
    assert proc.returncode == 0, proc.stderr
    assert doc["imageSignatures"][0]["digest"] == digest
    verify = run_pyz(out, "--verify-only", "--require-signed", str(pub))
    assert verify.returncode == 0, verify.stderr


@pytest.fixture(scope="module")
def mirror() -> Iterator[Registry]:
    """The offline side's registry (another docker-registry on 127.0.0.1, no Referrers API)."""
    with engines.private_registry(f"supply-mirror-{os.getpid()}") as reg:
        yield reg




def test_push_hands_the_artifacts_on(bundles: dict[str, Path], registry: dict[str, Any], keys: dict[str, Any],
                                     mirror: Registry) -> None:
    """`bundle push` puts the signature under its cosign tag and the SBOM referrer with its fallback
    index into the mirror, byte for byte; the real cosign verifies the image there with the key."""
    pushed = run_cli("bundle", "push", str(bundles["app"]), f"{mirror.addr}/site", "--json")
    assert pushed.returncode == 0, pushed.stderr
    doc = json.loads(pushed.stdout)
    validate("push", doc)
    assert sorted(a["kind"] for a in doc["artifacts"]) == ["referrer", "referrers-index", "signature"]
    hexd = registry["app"]["digest"][7:]
    repo = f"docker://{mirror.addr}/site/sn/app"  # the source registry's host is dropped (map_ref)
    for ref, art in ((f"{repo}:sha256-{hexd}.sig", registry["app_sig"]), (f"{repo}@{registry['sbom']['digest']}",
                                                                          registry["sbom"])):
        assert hashlib_hex(_raw(ref)) == art["digest"][7:]
    index = json.loads(_raw(f"{repo}:sha256-{hexd}"))
    assert [m["digest"] for m in index["manifests"]] == [registry["sbom"]["digest"]]
    cosign = supplykit.cosign()
    verified = subprocess.run([cosign, "verify", "--key", str(keys["pub"]), "--insecure-ignore-tlog=true",
                               "--allow-insecure-registry", f"{mirror.addr}/site/sn/app@{registry['app']['digest']}"],
                              capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "HOME": str(keys["pub"].parent)})
    assert verified.returncode == 0, verified.stderr
    assert registry["app"]["digest"] in verified.stdout


def test_a_signature_the_registry_lost_is_a_mismatch_and_no_tag_is_written(
        bundles: dict[str, Path], registry: dict[str, Any], mirror: Registry) -> None:
    """Each carried artifact is read back by digest before the image tags: a signature the
    registry does not give back (404 on its digest) fails `bundle push` and the registry import
    (exit 8, naming REPO@DIGEST), and neither writes the image's tag."""
    sig = registry["app_sig"]["digest"]
    for namespace, argv in (("lostsig", ("bundle", "push", str(bundles["app"]))),
                            ("lostsig-import", ("importer", str(bundles["app"]), "--engine", "registry", "--no-receipt",
                                                "-q", "--registry"))):
        with FlakyProxy(mirror.port, fail_first=10, fail_match=f"GET /v2/{namespace}/sn/app/manifests/{sig}".encode(),
                        fail_status=404) as proxy:
            proc = run_cli(*argv, f"127.0.0.1:{proxy.port}/{namespace}")
            assert proxy.failed == 1, proxy.lines
        assert proc.returncode == 8 and error_id(proc.stderr) == "post-load-mismatch", proc.stderr
        assert f"{namespace}/sn/app@{sig} (signature sha256-" in proc.stderr
        assert "the registry does not have it" in proc.stderr
        status, body, _ = _get(mirror.addr, f"/v2/{namespace}/sn/app/tags/list")
        assert status == 200 and "1" not in json.loads(body)["tags"], body  # only the artifacts' derived tags


def test_import_into_a_registry_hands_the_artifacts_on(bundles: dict[str, Path], registry: dict[str, Any],
                                                       keys: dict[str, Any], mirror: Registry, tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    proc = run_pyz(bundles["app"], "--engine", "registry", "--registry", f"{mirror.addr}/imported",
                        "--require-signed", str(keys["pub"]), "--receipt", str(receipt))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(receipt.read_text())
    assert {a["repository"] for a in doc["push"]["artifacts"]} == {"imported/sn/app"}
    hexd = registry["app"]["digest"][7:]
    assert hashlib_hex(_raw(f"docker://{mirror.addr}/imported/sn/app:sha256-{hexd}.sig")) == \
        registry["app_sig"]["digest"][7:]


def hashlib_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _get(addr: str, path: str) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection(addr, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def test_serve_answers_tags_manifests_and_referrers(bundles: dict[str, Path], registry: dict[str, Any],
                                                    keys: dict[str, Any]) -> None:
    """`bundle-import serve` lists the cosign tags, serves every artifact byte for byte, answers
    the Referrers API (with the artifactType filter), refuses a bad digest; the real cosign
    verifies the image against the served bundle."""
    bundle = bundles["app"]
    hexd = registry["app"]["digest"][7:]
    with serving(bundle / "bundle-import.pyz", bundle) as served:
        status, body, _ = _get(served.addr, "/v2/sn/app/tags/list")
        assert status == 200 and {"1", f"sha256-{hexd}.sig", f"sha256-{hexd}"} <= set(json.loads(body)["tags"])
        for ref, digest in ((f"sha256-{hexd}.sig", registry["app_sig"]["digest"]),
                            (registry["sbom"]["digest"], registry["sbom"]["digest"])):
            status, body, headers = _get(served.addr, f"/v2/sn/app/manifests/{ref}")
            assert status == 200 and hashlib_hex(body) == digest[7:], (ref, status)
            assert headers["content-type"] == supplykit.OCI_MANIFEST
        status, body, headers = _get(served.addr, f"/v2/sn/app/referrers/{registry['app']['digest']}")
        assert status == 200 and headers["content-type"] == supplykit.OCI_INDEX
        assert [(m["digest"], m["artifactType"]) for m in json.loads(body)["manifests"]] == \
            [(registry["sbom"]["digest"], supplykit.SPDX)]
        status, body, headers = _get(served.addr, f"/v2/sn/app/referrers/{registry['app']['digest']}"
                                     "?artifactType=application/vnd.example")
        assert status == 200 and json.loads(body)["manifests"] == [] and "oci-filters-applied" in headers
        assert _get(served.addr, "/v2/sn/app/referrers/sha256:nothex")[0] == 400
        assert _get(served.addr, f"/v2/sn/nothere/referrers/{registry['app']['digest']}")[0] == 404
        cosign = supplykit.cosign()
        verified = subprocess.run([cosign, "verify", "--key", str(keys["pub"]), "--insecure-ignore-tlog=true",
                                   "--allow-insecure-registry", f"{served.addr}/sn/app@{registry['app']['digest']}"],
                                  capture_output=True, text=True, timeout=300, check=False,
                                  env={**os.environ, "HOME": str(keys["pub"].parent)})
        assert verified.returncode == 0, verified.stderr


def test_export_from_a_registry_with_the_referrers_api(bundles: dict[str, Path], registry: dict[str, Any],
                                                       keys: dict[str, Any], tmp_path: Path) -> None:
    """`serve` has the Referrers API (docker-registry 2.8 has not): an export from it finds the SBOM
    through the API (the registry's own index is not carried then) and the signature by its tag,
    and carries both byte for byte again. The signature names the repository it was made for, not
    this registry's: --require-signed refuses the image under its new name (the identity check)."""
    bundle = bundles["app"]
    with serving(bundle / "bundle-import.pyz", bundle) as served:
        out = tmp_path / "again"
        proc, _ = export(f"docker://{served.addr}/sn/app:1", "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        moved, doc = export(f"docker://{served.addr}/sn/app:1", "-o", str(tmp_path / "moved"), "--require-signed",
                            str(keys["pub"]))
        assert moved.returncode == 7 and doc["error"]["id"] == "image-signature-invalid", moved.stderr
        assert f"names the repository '{registry['addr']}/sn/app'" in doc["error"]["context"]
    arts = bundle_json(out)["images"][0]["artifacts"]
    assert sorted(a["kind"] for a in arts) == ["referrer", "signature"]
    referrer = next(a for a in arts if a["kind"] == "referrer")
    assert referrer["manifest"]["digest"] == registry["sbom"]["digest"] and "tag" not in referrer
    signature = next(a for a in arts if a["kind"] == "signature")
    assert signature["manifest"]["digest"] == registry["app_sig"]["digest"]


def test_export_from_an_oci_layout_carries_what_is_attached(bundles: dict[str, Path], registry: dict[str, Any],
                                                            keys: dict[str, Any], tmp_path: Path) -> None:
    """Round trip: the bundle imported into an OCI layout (signature under its cosign tag, the SBOM
    referrer unnamed) and exported again from `oci:DIR:REF` carries both (the referrer found by
    its subject), verified by --require-signed; a damaged signature blob in the layout fails the
    export (source), --no-referrers leaves them out."""
    layout = tmp_path / "layout"
    proc = run_pyz(bundles["app"], "--engine", "oci", "--oci-dir", str(layout), "--no-receipt")
    assert proc.returncode == 0, proc.stderr
    ref = f"oci:{layout}:{registry['addr']}/sn/app:1"
    out = tmp_path / "again"
    exported, doc = export(ref, "-o", str(out), "--require-signed", str(keys["pub"]))
    assert exported.returncode == 0, exported.stderr
    arts = {a["kind"]: a for a in bundle_json(out)["images"][0]["artifacts"]}
    assert set(arts) == {"signature", "referrer"}
    assert arts["signature"]["manifest"]["digest"] == registry["app_sig"]["digest"]
    assert arts["referrer"]["manifest"]["digest"] == registry["sbom"]["digest"]
    assert arts["referrer"]["artifactType"] == supplykit.SPDX
    assert doc["imageSignatures"][0]["digest"] == registry["app"]["digest"]
    plain, _ = export(ref, "-o", str(tmp_path / "plain"), "--no-referrers")
    assert plain.returncode == 0 and "artifacts" not in bundle_json(tmp_path / "plain")["images"][0]
    sig_blob = layout / "blobs/sha256" / registry["app_sig"]["digest"][7:]
    sig_blob.chmod(0o644)
    sig_blob.write_bytes(sig_blob.read_bytes() + b" ")
    damaged, doc = export(ref, "-o", str(tmp_path / "damaged"))
    assert damaged.returncode == 5 and doc["error"]["id"] == "source", damaged.stderr
    assert not (tmp_path / "damaged").exists()


def test_require_signed_reads_a_tar_and_its_parts(bundles: dict[str, Path], keys: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """The check reads the signature blobs through the one bundle view: from a tar and from parts."""
    for name, extra in (("app.tar", []), ("split.tar", ["--split", "64K"])):
        packed = run_cli("bundle", "pack", str(bundles["app"]), str(tmp_path / name), *extra, "-q")
        assert packed.returncode == 0, packed.stderr
        target = tmp_path / (name + (".parts.json" if extra else ""))
        ok = run_pyz(target, "--verify-only", "--require-signed", str(keys["pub"]),
                          pyz=tmp_path / "bundle-import.pyz")
        assert ok.returncode == 0 and "cosign signature by" in ok.stderr, ok.stderr
        bad = run_pyz(target, "--verify-only", "--require-signed", str(keys["other_pub"]),
                           pyz=tmp_path / "bundle-import.pyz")
        assert bad.returncode == 7 and error_id(bad.stderr) == "image-signature-invalid", bad.stderr


@pytest.mark.parametrize("status", [405, 400])
def test_a_registry_that_refuses_the_referrers_endpoint_falls_back_to_the_tag(registry: dict[str, Any],
                                                                              tmp_path: Path, status: int) -> None:
    """A proxy in front of the registry answers the Referrers API with 405 or 400 (as registries
    without it and some proxies do): the export uses the sha256-<hex> fallback tag instead."""
    with FlakyProxy(registry["reg"].port, fail_first=10, fail_match=b"GET /v2/sn/app/referrers/",
                    fail_status=status) as proxy:
        out = tmp_path / "b"
        proc, _ = export(f"docker://127.0.0.1:{proxy.port}/sn/app:1", "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert proxy.failed >= 1
    kinds = sorted(a["kind"] for a in bundle_json(out)["images"][0]["artifacts"])
    assert kinds == ["referrer", "referrers-index", "signature"]


def test_a_signed_index_covers_the_platform_carried(registry: dict[str, Any], keys: dict[str, Any],
                                                   mirror: Registry, tmp_path: Path) -> None:
    """cosign signs the index a multi-platform tag names; exporting one platform carries that index
    (kind index) so the signature is checked offline against the carried manifest; the index is
    not handed on (it names a platform the bundle lacks); with --all-platforms the index is the
    image's own."""
    addr = registry["addr"]
    mine = host().architecture
    built = supplykit.push_multi(addr, "sn/multi", "1", [mine, "s390x" if mine != "s390x" else "arm64"])
    supplykit.cosign_sign(addr, "sn/multi", built["index"]["digest"], keys["signer"])
    out = tmp_path / "one"
    proc, doc = export(f"docker://{addr}/sn/multi:1", "-o", str(out), "--require-signed", str(keys["pub"]))
    assert proc.returncode == 0, proc.stderr
    assert doc["imageSignatures"][0]["digest"] == built["index"]["digest"]
    [image] = bundle_json(out)["images"]
    assert image["manifest"]["digest"] == built["platforms"][mine]["digest"] and "index" not in image
    arts = {a["kind"]: a for a in image["artifacts"]}
    assert set(arts) == {"signature", "index"} and arts["index"]["manifest"]["digest"] == built["index"]["digest"]
    ok = run_pyz(out, "--verify-only", "--require-signed", str(keys["pub"]))
    assert ok.returncode == 0, ok.stderr
    pushed = run_cli("bundle", "push", str(out), f"{mirror.addr}/multi", "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert [a["kind"] for a in json.loads(pushed.stdout)["artifacts"]] == ["signature"]
    every = tmp_path / "all"
    proc, _ = export(f"docker://{addr}/sn/multi:1", "-o", str(every), "--all-platforms", "--require-signed",
                     str(keys["pub"]))
    assert proc.returncode == 0, proc.stderr
    assert [a["kind"] for a in bundle_json(every)["images"][0]["artifacts"]] == ["signature"]


# ============================================= issue 38: what the policy admits, and what records may name


@pytest.fixture(scope="module")
def half_signed(registry: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """sn/half:1, a two-platform index whose index is unsigned and only this host's platform
    manifest carries a signature (what `cosign sign REG/REPO@PLATFORM-DIGEST` leaves)."""
    addr = registry["addr"]
    mine = host().architecture
    other = "s390x" if mine != "s390x" else "arm64"
    built = supplykit.push_multi(addr, "sn/half", "1", [mine, other])
    supplykit.cosign_sign(addr, "sn/half", built["platforms"][mine]["digest"], keys["signer"])
    return {"built": built, "mine": mine, "other": other}


def test_require_signed_export_refuses_an_unsigned_sibling_platform(registry: dict[str, Any], keys: dict[str, Any],
                                                                   half_signed: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    """The signed platform alone is admitted; with --all-platforms the unsigned sibling (and the
    unsigned index) refuse the export, nothing left behind. Before: one verified signature
    admitted the whole image."""
    ref = f"docker://{registry['addr']}/sn/half:1"
    one, doc = export(ref, "-o", str(tmp_path / "one"), "--require-signed", str(keys["pub"]))
    assert one.returncode == 0, one.stderr
    [signed] = doc["imageSignatures"]
    mine = half_signed["built"]["platforms"][half_signed["mine"]]["digest"]
    assert signed["digest"] == mine and signed["manifests"] == [{"digest": mine, "signedAs": mine}]
    every, doc = export(ref, "-o", str(tmp_path / "every"), "--all-platforms", "--require-signed", str(keys["pub"]))
    assert every.returncode == 7 and doc["error"]["id"] == "image-signature-invalid", every.stderr
    assert f"linux/{half_signed['other']}" in doc["error"]["context"], doc["error"]
    assert not (tmp_path / "every").exists() and not list(tmp_path.glob("every.partial-*"))


@pytest.fixture(scope="module")
def half_bundle(registry: dict[str, Any], half_signed: dict[str, Any],
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sn/half:1 with every platform, exported without a policy."""
    out = tmp_path_factory.mktemp("half") / "b"
    proc, _ = export(f"docker://{registry['addr']}/sn/half:1", "-o", str(out), "--all-platforms")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("target", ["oci", "registry", "docker"])
def test_require_signed_import_refuses_an_unsigned_sibling_platform(half_bundle: Path, keys: dict[str, Any],
                                                                   mirror: Registry, target: str,
                                                                   request: pytest.FixtureRequest,
                                                                   tmp_path: Path) -> None:
    """Every target (Docker 20.10, an OCI layout, a registry) refuses the bundle before anything is
    written: the signature of one platform does not vouch for the other, nor for the index."""
    layout = tmp_path / "layout"
    docker_host = request.getfixturevalue("docker_host") if target == "docker" else None
    args = {"oci": ["--engine", "oci", "--oci-dir", str(layout)],
            "registry": ["--engine", "registry", "--registry", f"{mirror.addr}/half"], "docker": []}[target]
    before = image_ids(docker_host) if docker_host else set()
    proc = run_pyz(half_bundle, *args, "--require-signed", str(keys["pub"]), "--no-receipt", docker_host=docker_host)
    assert proc.returncode == 7 and error_id(proc.stderr) == "image-signature-invalid", proc.stderr
    assert not layout.exists()
    if target == "registry":
        with supplykit.client(mirror.addr) as c:
            assert c.manifest_digest("half/sn/half", "1") is None
    if docker_host:
        assert image_ids(docker_host) == before
    passing = run_pyz(half_bundle, *args, "--no-receipt", docker_host=docker_host)  # the same run, no policy
    assert passing.returncode == 0, passing.stderr
    if docker_host:
        forget(docker_host, *bundle_json(half_bundle)["images"][0]["refs"])


def _forged(src: Path, dst: Path, change: Any) -> Path:
    """A copy of ``src`` whose bundle.json ``change`` edited, SHA256SUMS made again (what an
    attacker with the bundle can do; nothing signed covers bundle.json's records)."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    doc = bundle_json(dst)
    change(doc)
    (dst / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(dst)
    return dst


def _signature_record(doc: dict[str, Any]) -> dict[str, Any]:
    return next(a for a in doc["images"][0]["artifacts"] if a["kind"] == "signature")


@pytest.mark.parametrize("forge", ["image-tag", "other-subject-tag", "kind-attestation"])
def test_a_forged_artifact_record_never_moves_an_image_tag(bundles: dict[str, Path], registry: dict[str, Any],
                                                          mirror: Registry, forge: str, tmp_path: Path) -> None:
    """A record that would be handed on under the image's own tag (or any name not derived from
    its subject) is refused before anything is written: the mirror's tag stays where it was, by
    push, by --engine registry (--force) and into an OCI layout."""
    def change(doc: dict[str, Any]) -> None:
        sig = _signature_record(doc)
        if forge == "image-tag":
            sig["tag"] = "1"
        elif forge == "other-subject-tag":
            sig["tag"] = "sha256-" + "0" * 64 + ".sig"
        else:
            sig["kind"] = "attestation"  # keeps the .sig tag: not the name an attestation is handed on under

    bundle = _forged(bundles["app"], tmp_path / "forged", change)
    namespace = f"{mirror.addr}/forged-{forge}"
    first = run_cli("bundle", "push", str(bundles["app"]), namespace, "--json")
    assert first.returncode == 0, first.stderr
    with supplykit.client(mirror.addr) as c:
        tag_before = c.manifest_digest(f"forged-{forge}/sn/app", "1")
    assert tag_before == registry["app"]["digest"]
    pushed = run_cli("bundle", "push", str(bundle), namespace, "--json")
    assert pushed.returncode == 4 and json.loads(pushed.stdout)["error"]["id"] == "invalid-manifest", pushed.stderr
    imported = run_pyz(bundle, "--engine", "registry", "--registry", namespace, "--force", "--no-receipt")
    assert imported.returncode == 4 and error_id(imported.stderr) == "invalid-manifest", imported.stderr
    assert "artifacts[" in imported.stderr
    layout = tmp_path / "layout"
    into_oci = run_pyz(bundle, "--engine", "oci", "--oci-dir", str(layout), "--no-receipt")
    assert into_oci.returncode == 4 and not layout.exists(), into_oci.stderr
    with supplykit.client(mirror.addr) as c:
        assert c.manifest_digest(f"forged-{forge}/sn/app", "1") == tag_before


def test_the_records_repository_field_is_not_evidence(bundles: dict[str, Path], keys: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """The image renamed in bundle.json (refs and index.json) and the signature record's
    ``repository`` edited to match: the signature still names the repository it was made for, and
    --require-signed refuses the image under its new name."""
    def change(doc: dict[str, Any]) -> None:
        doc["images"][0]["refs"] = ["registry.example/evil/app:1"]
        _signature_record(doc)["repository"] = "registry.example/evil/app"

    bundle = _forged(bundles["app"], tmp_path / "renamed", change)
    proc = run_pyz(bundle, "--verify-only", "--require-signed", str(keys["pub"]))
    assert proc.returncode == 7 and error_id(proc.stderr) == "image-signature-invalid", proc.stderr
    assert "names the repository" in proc.stderr


def test_push_says_what_recompression_does_to_signatures(bundles: dict[str, Path], keys: dict[str, Any],
                                                        registry: dict[str, Any], mirror: Registry) -> None:
    """Recompressed, a signed image gets manifests no signature names: `bundle push` says so before
    it pushes; under --require-signed it refuses (nothing sent) unless explicitly allowed; the
    signatures are checked as at import (another key: refused before anything is sent)."""
    namespace = f"{mirror.addr}/recompressed"
    with supplykit.client(mirror.addr) as c:
        def there() -> str | None:
            return c.manifest_digest("recompressed/sn/app", "1")

        refused = run_cli("bundle", "push", str(bundles["app"]), namespace, "--compression", "zstd",
                          "--require-signed", str(keys["pub"]), "--json")
        assert refused.returncode == 7, refused.stderr
        error = json.loads(refused.stdout)["error"]
        assert error["id"] == "policy-rejected" and "no signature names" in error["message"], error
        assert "--allow-recompressed-signed" in error["hint"] and there() is None
        other = run_cli("bundle", "push", str(bundles["app"]), namespace, "--require-signed", str(keys["other_pub"]))
        assert other.returncode == 7 and error_id(other.stderr) == "image-signature-invalid", other.stderr
        assert there() is None
        allowed = run_cli("bundle", "push", str(bundles["app"]), namespace, "--compression", "zstd",
                          "--require-signed", str(keys["pub"]), "--allow-recompressed-signed", "--json")
        assert allowed.returncode == 0, allowed.stderr
        assert "no signature names" in allowed.stderr
        doc = json.loads(allowed.stdout)
        validate("push", doc)
        assert doc["imageSignatures"][0]["digest"] == registry["app"]["digest"]
        assert there() == doc["renamedManifests"][registry["app"]["digest"]] != registry["app"]["digest"]
        kept = run_cli("bundle", "push", str(bundles["app"]), f"{mirror.addr}/kept", "--require-signed",
                       str(keys["pub"]))
        assert kept.returncode == 0 and "no signature names" not in kept.stderr, kept.stderr


def test_import_into_a_registry_says_what_recompression_does_to_signatures(
        bundles: dict[str, Path], registry: dict[str, Any], keys: dict[str, Any], mirror: Registry,
        tmp_path: Path) -> None:
    """The offline side's `--engine registry --compression` as `bundle push`: said before anything
    is sent, refused under --require-signed (nothing sent) unless --allow-recompressed-signed, and
    the receipt names the manifests pushed instead."""
    namespace = f"{mirror.addr}/offline-recompressed"
    with supplykit.client(mirror.addr) as c:
        def there() -> str | None:
            return c.manifest_digest("offline-recompressed/sn/app", "1")

        refused = run_pyz(bundles["app"], "--engine", "registry", "--registry", namespace, "--compression", "zstd",
                          "--require-signed", str(keys["pub"]), "--no-receipt", "--json")
        assert refused.returncode == 7, refused.stderr
        error = json.loads(refused.stdout)["error"]
        assert error["id"] == "policy-rejected" and "no signature names" in error["message"], error
        assert "--allow-recompressed-signed" in error["hint"] and "bundle push" not in error["hint"]
        assert there() is None
        receipt = tmp_path / "r.json"
        allowed = run_pyz(bundles["app"], "--engine", "registry", "--registry", namespace, "--compression", "zstd",
                          "--require-signed", str(keys["pub"]), "--allow-recompressed-signed", "--receipt",
                          str(receipt))
        assert allowed.returncode == 0, allowed.stderr
        assert "no signature names" in allowed.stderr
        doc = json.loads(receipt.read_text())
        assert doc["imageSignatures"][0]["digest"] == registry["app"]["digest"]
        assert doc["push"]["compression"] == "zstd"
        assert there() == doc["push"]["renamedManifests"][registry["app"]["digest"]] != registry["app"]["digest"]
        said = run_pyz(bundles["app"], "--engine", "registry", "--registry", f"{namespace}-unchecked",
                       "--compression", "zstd", "--no-receipt")  # no --require-signed: said, not refused
        assert said.returncode == 0 and "no signature names" in said.stderr, said.stderr


def test_serve_says_what_recompression_does_to_signatures(registry: dict[str, Any], keys: dict[str, Any],
                                                         tmp_path: Path) -> None:
    """`serve --compression gzip` of a signed image with zstd layers serves manifests no signature
    names: said at start; under --require-signed refused (nothing served) unless allowed; the
    signatures are checked as at import before anything is verified or served."""
    addr = registry["addr"]
    image = supplykit.push_image(addr, "sn/zsigned", "1", "zstd and signed\n", zstd=True)
    supplykit.cosign_sign(addr, "sn/zsigned", image["digest"], keys["signer"])
    bundle = tmp_path / "z"
    assert export(f"docker://{addr}/sn/zsigned:1", "-o", str(bundle))[0].returncode == 0
    pyz = bundle / "bundle-import.pyz"
    refused = run_zipapp(pyz, "serve", str(bundle), "--listen", "127.0.0.1:0", "--compression", "gzip",
                         "--require-signed", str(keys["pub"]), "--json", timeout=120)
    assert refused.returncode == 7, refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert error["id"] == "policy-rejected" and "no signature names" in error["message"], error
    other = run_zipapp(pyz, "serve", str(bundle), "--listen", "127.0.0.1:0", "--require-signed",
                       str(keys["other_pub"]), timeout=120)
    assert other.returncode == 7 and error_id(other.stderr) == "image-signature-invalid", other.stderr
    with serving(pyz, bundle, "--compression", "gzip", "--require-signed", str(keys["pub"]),
                 "--allow-recompressed-signed") as served:
        status, body, _ = _get(served.addr, "/v2/sn/zsigned/manifests/1")
        assert status == 200 and hashlib_hex(body) != image["digest"][7:]  # the rewritten manifest
        assert "no signature names" in served.stderr()
        assert served.start["imageSignatures"][0]["digest"] == image["digest"]


def test_the_image_tags_are_written_after_every_artifact(bundles: dict[str, Path], registry: dict[str, Any],
                                                        mirror: Registry) -> None:
    """The push writes manifests by digest, then the artifacts (their derived tags), reads every
    image and artifact back by digest, and only then writes the image tags: the order of the
    registry's manifest PUTs and GETs."""
    from importer.format.manifest import load_bundle_manifest
    from importer.registry.client import RegistryClient, parse_target
    from importer.registry.push import push_bundle

    calls: list[str] = []

    class Recording(RegistryClient):
        def put_manifest(self, repo: str, reference: str, raw: bytes, media_type: str) -> Any:
            calls.append(reference)
            return super().put_manifest(repo, reference, raw, media_type)

        def get_manifest(self, repo: str, reference: str, limit: int) -> Any:
            calls.append("GET " + reference)
            return super().get_manifest(repo, reference, limit)

    root = str(bundles["app"])
    manifest = load_bundle_manifest((bundles["app"] / "bundle.json").read_bytes())
    handed_on: list[dict[str, Any]] = []
    with Recording(parse_target(f"{mirror.addr}/ordered")) as client:
        client.ping()
        report = push_bundle(root, manifest, client, handed_on=handed_on)
    assert report.ok and len(handed_on) == 3
    hexd = registry["app"]["digest"][7:]
    puts = [c for c in calls if not c.startswith("GET ")]
    assert puts == [registry["app"]["digest"], f"sha256-{hexd}.sig", registry["sbom"]["digest"], f"sha256-{hexd}",
                    "1"], calls
    got = calls[calls.index(f"sha256-{hexd}") + 1:calls.index("1")]  # between the last artifact and the tag
    assert got[0] == "GET " + registry["app"]["digest"] and sorted(got[1:]) == sorted(
        "GET " + h["digest"] for h in handed_on), calls  # the image and every artifact read back by digest


# ------------------------------------------- the bundle's own index.json names its artifacts (issue 42)

def _layout_of(bundle: Path) -> list[dict[str, Any]]:
    return json.loads((bundle / "index.json").read_text())["manifests"]


def test_the_bundles_own_layout_names_the_artifacts(bundles: dict[str, Path], registry: dict[str, Any]) -> None:
    """``oci:BUNDLE:sha256-<hex>.sig`` reads the signature (as ``cosign save`` names it), the SBOM
    referrer is listed unnamed with its artifactType; read by skopeo, an independent reader."""
    bundle = bundles["app"]
    arts = {a["kind"]: a for a in bundle_json(bundle)["images"][0]["artifacts"]}
    hexd = registry["app"]["digest"].split(":")[1]
    entries = {e["digest"]: e for e in _layout_of(bundle)}
    sig, sbom = arts["signature"], arts["referrer"]
    assert entries[sig["manifest"]["digest"]] == {**sig["manifest"], "annotations": {
        "org.opencontainers.image.ref.name": f"sha256-{hexd}.sig"}}
    assert entries[sbom["manifest"]["digest"]] == {**sbom["manifest"], "artifactType": supplykit.SPDX}
    assert arts["referrers-index"]["manifest"]["digest"] not in entries  # the registry fallback, not a layout's
    raw = subprocess.run([engines.require("skopeo"), "inspect", "--raw", f"oci:{bundle}:sha256-{hexd}.sig"],
                         capture_output=True, check=True, timeout=120).stdout
    assert raw == (bundle / "blobs/sha256" / sig["manifest"]["digest"][7:]).read_bytes()


def test_oras_reads_the_artifacts_from_the_bundles_own_layout(bundles: dict[str, Path], registry: dict[str, Any],
                                                              tmp_path: Path) -> None:
    from tests.kit.fileskit import run_oras

    bundle = bundles["app"]
    hexd = registry["app"]["digest"].split(":")[1]
    sig = run_oras("manifest", "fetch", "--oci-layout", f"{bundle}:sha256-{hexd}.sig", home=tmp_path).stdout
    assert json.loads(sig)["layers"][0]["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    found = run_oras("discover", "--format", "json", "--oci-layout", f"{bundle}@{registry['app']['digest']}",
                     home=tmp_path).stdout
    assert registry["sbom"]["digest"] in found and supplykit.SPDX in found, found


def _edited_layout(src: Path, dst: Path, change: Any) -> Path:
    """A copy of ``src`` whose index.json ``change`` edited, re-pinned in bundle.json and SHA256SUMS
    (what someone with the bundle can do)."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    manifests = _layout_of(dst)
    change(manifests)
    data = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests}).encode()
    (dst / "index.json").write_bytes(data)
    doc = bundle_json(dst)
    entry = next(f for f in doc["files"] if f["path"] == "index.json")
    entry.update(digest="sha256:" + hashlib.sha256(data).hexdigest(), size=len(data))
    (dst / "bundle.json").write_text(json.dumps(doc, indent=2))
    regenerate_sums(dst)
    return dst


def _named_sig(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in manifests if e.get("annotations", {}).get(
        "org.opencontainers.image.ref.name", "").endswith(".sig"))


def _other_digest(manifests: list[dict[str, Any]]) -> None:
    _named_sig(manifests)["digest"] = next(e["digest"] for e in manifests if e.get("artifactType"))


@pytest.mark.parametrize("change", [
    lambda m: _named_sig(m).update(size=_named_sig(m)["size"] + 1),
    _other_digest,  # the signature's name on the SBOM's manifest
    lambda m: _named_sig(m).update(artifactType="application/x-other"),
    lambda m: next(e for e in m if e.get("artifactType")).update(
        annotations={"org.opencontainers.image.ref.name": "sn/app:1"}),  # a referrer under an image's name
], ids=["size", "digest", "artifact-type", "named-referrer"])
def test_a_wrong_artifact_entry_is_refused(bundles: dict[str, Path], tmp_path: Path, change: Any) -> None:
    bundle = _edited_layout(bundles["app"], tmp_path / "b", change)
    proc = run_pyz(bundle, "--verify-only")
    assert proc.returncode != 0 and error_id(proc.stderr) == "verification-failed", proc.stderr
    assert "invalid-layout" in proc.stderr, proc.stderr


def test_a_bundle_whose_layout_lists_no_artifacts_still_verifies(bundles: dict[str, Path], tmp_path: Path) -> None:
    """3.5 bundles written before the artifacts were named in index.json."""
    arts = {a["manifest"]["digest"] for a in bundle_json(bundles["app"])["images"][0]["artifacts"]}

    def drop(manifests: list[dict[str, Any]]) -> None:
        manifests[:] = [e for e in manifests if e["digest"] not in arts]

    bundle = _edited_layout(bundles["app"], tmp_path / "b", drop)
    proc = run_pyz(bundle, "--verify-only")
    assert proc.returncode == 0, proc.stderr
