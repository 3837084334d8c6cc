"""``--require-signed`` and file artifacts (issue 42 point 3, issue 38 class 1): what the policy
admits must be signed, files as images. A file artifact without a cosign signature by one of the
keys is refused before anything is written below --files-to, into an OCI layout, sent to a
registry, served or exported; a signed image never vouches for the files beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.kit import supplykit
from tests.kit.fileskit import MODEL_REF, export_files, model_dir
from tests.kit.helpers import run_cli, run_pyz, run_zipapp
from tests.kit.layoutgen import REF, write_layout
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
    return {"root": root, "signer": signer, "pub": pub, "src": src, "only": only, "both": both,
            "source": f"oci:{root / 'layout'}:{REF}"}


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
