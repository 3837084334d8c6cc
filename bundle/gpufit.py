"""``bundle export --have INVENTORY``: will each image run on the offline host (docs/gpu-fit.md).

Before any byte is written, the images' configs (where the source reads them cheaply,
``ExportSource.image_env``: Docker) are judged on the inventory's driver with the most
favourable layers imaginable: an image unfit even then is refused at once.
After the one pass over the layers (which shows the compat libraries and torch's CUDA), every
image is judged for real, before the bundle is written; an unfit one is refused unless
``--allow-unfit`` and the half-made bundle is removed. The decision is
importer/format/cudafit.py's, the one ``bundle-import`` and the smoke suite make."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from bundle.blobstore import BlobStore
from bundle.cudaneeds import image_needs
from bundle.sources import SourceImage
from bundle.sources.protocol import ExportSource
from importer.format import cudafit
from importer.format.cudafit import Fit, Target
from importer.pipeline.gpufit import fits_json, have_target, judge, refuse_unfit

#: the most favourable layers: compat libraries newer than any driver the table knows
_BEST_CASE_LIBS = ("9999.0",)
_HINT = ("upgrade the offline host's driver to the one named, export an image built for an older CUDA, or pass "
         "--allow-unfit to carry it anyway (docs/gpu-fit.md)")


class FitCheck:
    """The offline host an export is for, and what was decided for each image."""

    def __init__(self, target: Target, source: str, allow_unfit: bool) -> None:
        self.target, self.source, self.allow_unfit = target, source, allow_unfit
        self.fits: List[Tuple[str, Fit]] = []

    def where(self) -> str:
        return f"the host of {self.source} (driver {self.target.driver}, CUDA {self.target.cuda})"

    def to_dict(self) -> Dict[str, Any]:
        return {**fits_json(self.fits, self.target, self.source), "allowUnfit": self.allow_unfit}

    def lines(self) -> List[str]:
        return [cudafit.line(name, fit) for name, fit in self.fits]


def precheck(source: ExportSource, names: Sequence[str], have: Sequence[str], allow_unfit: bool) -> Optional[FitCheck]:
    """The target of the first ``--have`` inventory, and the images refused by their config alone."""
    found = have_target(have) if have else None
    if found is None:
        return None
    check = FitCheck(found[0], found[1], allow_unfit)
    if not allow_unfit:
        envs = [(ref, source.image_env(ref)) for ref in names]
        best = [(ref, cudafit.needs_from_env(env, compat_libs=_BEST_CASE_LIBS)) for ref, env in envs if env is not None]
        refuse_unfit(judge(best, check.target), doing="exporting", where=check.where(), hint=_HINT,
                     when=" by its config alone, before any layer was read")
    return check


def postcheck(check: Optional[FitCheck], store: BlobStore, images: Sequence[SourceImage]) -> None:
    """Judge every image with what its layers showed; refuse unless --allow-unfit."""
    if check is None:
        return
    named = [(image.refs[0] if image.refs else "(untagged)", image_needs(store, image)) for image in images]
    check.fits = judge(named, check.target)
    if not check.allow_unfit:
        refuse_unfit(check.fits, doing="exporting", where=check.where(), hint=_HINT)


def cuda_lines(images: Sequence[Dict[str, Any]]) -> List[str]:
    """``bundle inspect``: one line per image that records CUDA needs (schema 3.4)."""
    out = []
    for image in images:
        needs = cudafit.needs_from_dict(image.get("cuda"))
        if needs is None:
            continue
        wanted, source = needs.wanted()
        name = ", ".join(image.get("refs") or []) or "(untagged)"
        parts = [f"CUDA {cudafit.fmt(wanted)} ({source})" if wanted else "no CUDA version"]
        if needs.compat_libs:
            parts.append(f"compat libraries {', '.join(needs.compat_libs)}")
        if needs.torch_cuda:
            parts.append(f"torch built for CUDA {needs.torch_cuda}")
        if needs.disable_require:
            parts.append("NVIDIA_DISABLE_REQUIRE set")
        elif needs.require:
            parts.append(f"requires {', '.join(sorted(needs.require))}")
        out.append(f"cuda: {name}: " + "; ".join(parts))
    return out
