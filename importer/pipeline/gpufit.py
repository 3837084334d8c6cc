"""GPU fit where the pipeline needs it (docs/gpu-fit.md): the target an inventory describes
(its ``gpu`` object, inventory 1.3), and each image of a bundle judged against a target by
importer/format/cudafit.py, the one decision export, import and the smoke suite share."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from importer.errors import GpuUnfit
from importer.format import cudafit
from importer.format.cudafit import Fit, Target
from importer.format.limits import MAX_ENGINE_JSON, parse_json, read_file_limited
from importer.inventory.engine import load_inventory


def inventory_target(doc: Dict[str, Any]) -> Target:
    """The target an inventory describes; not known for an inventory older than 1.3."""
    return cudafit.target_from_gpu_doc(doc.get("gpu"))


def have_target(paths: Sequence[str]) -> Optional[Tuple[Target, str]]:
    """The first inventory among ``--have`` paths, as a target (bundle.json files describe no host)."""
    for path in paths:
        raw = read_file_limited(path, MAX_ENGINE_JSON, path)
        doc = parse_json(raw, path)
        if isinstance(doc, dict) and doc.get("kind") == "inventory":
            return inventory_target(load_inventory(raw, what=path)), path
    return None


def judge(images: Sequence[Tuple[str, Optional[cudafit.ImageNeeds]]], target: Target) -> List[Tuple[str, Fit]]:
    """(name, fit) per image; an image with no recorded needs is judged as declaring none."""
    return [(name, cudafit.decide(needs or cudafit.ImageNeeds(), target)) for name, needs in images]


def refuse_unfit(fits: Sequence[Tuple[str, Fit]], *, doing: str, where: str, hint: str, when: str = "") -> None:
    bad = [(n, f) for n, f in fits if f.refused]
    if bad:
        name, fit = bad[0]
        more = f" (and {len(bad) - 1} more unfit image(s))" if len(bad) > 1 else ""
        raise GpuUnfit(f"{doing} {name}: expected it to run on {where}, found it unfit{when}: {fit.reason}{more}",
                       hint=hint)


def fits_json(fits: Sequence[Tuple[str, Fit]], target: Target, source: str) -> Dict[str, Any]:
    return {"target": source, "driverVersion": target.driver, "cudaDriverVersion": target.cuda,
            "known": target.known, "images": [{"image": n, **f.to_dict()} for n, f in fits]}


#: engines that run the images they hold (an OCI layout or a registry runs nothing)
RUNNING_ENGINES = ("docker", "containerd", "podman")


def host_fit(images: Sequence[Any], engine_kind: str, *, require: bool,
             on_notice: Optional[Callable[[str], None]] = None) -> Optional[Dict[str, Any]]:
    """``bundle-import``, before loading: each image (ImageRecord) judged on this host's driver
    and GPUs. A warning line per image that will not run; ``require`` (``--require-fit``) makes
    an unfit image, or a CUDA image on a host with no NVIDIA driver, an error (nothing loaded).
    None when no image records CUDA needs (schema 3.3) or the engine runs nothing."""
    if engine_kind not in RUNNING_ENGINES or not any(getattr(i, "cuda", None) for i in images):
        return None
    from importer.inventory.gpuhost import probe  # runs nvidia-smi: only for bundles with CUDA images

    target = cudafit.target_from_gpu_doc(probe())
    fits = judge([(i.name, cudafit.needs_from_dict(i.cuda)) for i in images], target)
    for name, fit in fits:
        if fit.status in (cudafit.UNFIT, cudafit.NO_GPU) and on_notice is not None:
            on_notice(f"warning: {cudafit.line(name, fit)}")
    if require:
        where = f"this host (driver {target.driver}, CUDA {target.cuda})"
        hint = "upgrade this host's driver to the one named, or import without --require-fit (docs/gpu-fit.md)"
        refuse_unfit([(n, f) for n, f in fits if f.status != cudafit.NO_GPU], doing="importing", where=where,
                     hint=hint)
        no_gpu = [n for n, f in fits if f.status == cudafit.NO_GPU]
        if no_gpu:
            raise GpuUnfit(f"importing {no_gpu[0]}: expected an NVIDIA driver for its CUDA, found none on this "
                           "host (--require-fit)", hint=hint)
    return fits_json(fits, target, "this host")
