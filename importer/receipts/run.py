"""The receipt of one ``bundle-import`` run (an import into an engine or a registry, a check-only
run, files written with ``--files-to``), built from what the walk filled in, also when a step
raised: its typed error, the verification's problems. The command line only calls
:func:`run_receipt` and writes or prints the document (importer/cli/main.py).

The run's result is :class:`importer.pipeline.importing.ImportResult`, a floor above this one:
:class:`RunResult` names what the receipt reads of it."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence

from importer.engines import EngineInfo
from importer.errors import BundleError, VerificationFailed
from importer.receipts.receipt import build_import_receipt
from importer.verify.bundle import VerifyReport
from importer.verify.signature import SignatureCheck


class _Document(Protocol):
    def to_dict(self) -> Dict[str, Any]: ...


class RunResult(Protocol):
    """What a receipt reads of a run's result (ImportResult and its check-only kind)."""

    @property
    def bundle_digest(self) -> str: ...
    @property
    def report(self) -> VerifyReport: ...
    @property
    def engine(self) -> Optional[EngineInfo]: ...
    @property
    def checks(self) -> Sequence[_Document]: ...
    @property
    def timings(self) -> Dict[str, float]: ...
    @property
    def leftovers(self) -> List[str]: ...
    @property
    def signature(self) -> Optional[SignatureCheck]: ...
    @property
    def preflight(self) -> Optional[_Document]: ...
    @property
    def staging_refs(self) -> List[str]: ...
    @property
    def stale_removed(self) -> List[str]: ...
    @property
    def lock_file(self) -> Optional[str]: ...
    @property
    def gpu_fit(self) -> Optional[Dict[str, Any]]: ...
    @property
    def registry_push(self) -> Optional[Dict[str, Any]]: ...
    @property
    def image_signatures(self) -> Optional[List[Dict[str, Any]]]: ...
    @property
    def files(self) -> Optional[Dict[str, Any]]: ...
    @property
    def ok(self) -> bool: ...


def run_receipt(bundle_path: str, res: RunResult, error: Optional[BundleError], *,
                selected_by: Optional[str] = None, sections: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The receipt of a run over ``bundle_path`` (absolute), also of a failed one (``error``).
    ``selected_by``: why the engine was chosen (the engine's ``selectedBy``); ``sections``: what
    the run's kind adds (a check-only run's ``kind`` and ``checkOnly``)."""
    manifest = res.report.manifest
    verification = res.report.to_dict() if manifest is not None else None
    if isinstance(error, VerificationFailed):
        verification = {"ok": False, "problems": [_problem(p) for p in error.problems]}
    return build_import_receipt(
        bundle_path=bundle_path,
        bundle_digest=res.bundle_digest or None,
        schema_version=manifest.schema_version if manifest else None,
        engine=_engine_dict(res, selected_by),
        verification=verification,
        images=[c.to_dict() for c in res.checks],
        timings=res.timings,
        result="pass" if error is None and res.ok else "fail",
        error=error.to_dict() if error is not None else None,
        extra={**_security_sections(res),  # a registry import: what the push did (blobs, delta mounts)
               **({"push": res.registry_push} if res.registry_push else {}),
               **({"imageSignatures": res.image_signatures} if res.image_signatures is not None else {}),
               **({"files": res.files} if res.files is not None else {}),
               **(sections or {})},
    )


def _problem(p: object) -> Any:
    """A verification finding as JSON (a :class:`~importer.format.problems.Problem`), or its text."""
    to_dict = getattr(p, "to_dict", None)
    return to_dict() if callable(to_dict) else str(p)


def _engine_dict(res: RunResult, selected_by: Optional[str]) -> Optional[Dict[str, Any]]:
    """EngineInfo.to_dict() plus why the engine was chosen (``selectedBy``)."""
    if res.engine is None:
        return None
    doc = res.engine.to_dict()
    if selected_by:
        doc["selectedBy"] = selected_by
    return doc


def _security_sections(res: RunResult) -> Dict[str, Any]:
    """Receipt sections of docs/security.md: signature, preflight, staging tags and leftovers."""
    return {
        "signature": res.signature.to_dict() if res.signature is not None else None,
        "preflight": res.preflight.to_dict() if res.preflight is not None else None,
        "gpuFit": res.gpu_fit,
        "staging": {
            "refs": list(res.staging_refs),
            "staleRemoved": list(res.stale_removed),
            "leftovers": list(res.leftovers),
            "lockFile": res.lock_file,
        },
    }
