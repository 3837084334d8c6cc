"""Each image's CUDA needs for bundle.json's ``cuda`` (schema 3.4; docs/gpu-fit.md): its
config's ``Env`` (``CUDA_VERSION``, ``NVIDIA_REQUIRE_*``, ``NVIDIA_DISABLE_REQUIRE``) and what
its layers showed in the export's one pass over them (``BlobStore.layer_cuda``: compat libraries,
torch's CUDA). A layer the offline host already holds and this export did not read shows nothing."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from bundle.blobstore import BlobStore
from bundle.sources import SourceImage
from importer.format.cudafit import ImageNeeds, needs_from_env


def config_env(raw_config: bytes) -> List[Any]:
    try:
        doc = json.loads(raw_config)
    except ValueError:
        return []
    config = doc.get("config") if isinstance(doc, dict) else None
    env = config.get("Env") if isinstance(config, dict) else None
    return env if isinstance(env, list) else []


def image_needs(store: BlobStore, image: SourceImage) -> ImageNeeds:
    libs: List[str] = []
    torch: Optional[str] = None
    for layer in image.layers:
        seen = store.layer_cuda.get(str(layer.diff_id))
        if seen is not None:
            libs += [x for x in seen[0] if x not in libs]
            torch = seen[1] or torch  # the top-most layer that shows it wins
    return needs_from_env(config_env(image.raw_config), compat_libs=libs, torch_cuda=torch)


def cuda_record(store: BlobStore, image: SourceImage) -> Optional[Dict[str, Any]]:
    """bundle.json's ``cuda`` object; None for an image with no CUDA needs."""
    needs = image_needs(store, image)
    return None if needs.empty and not needs.disable_require else needs.to_dict()
