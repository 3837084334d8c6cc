"""The one tag-conflict rule: a tag the bundle gives is moved only when it is free or already
names the bundle's image (else ``TagConflict``, exit 7, unless ``--force``). Used by the schema-3
import, the schema 1/2 import and deltas, on every store.

"Already names the bundle's image", in the order of what the store can prove:

1. the image ID the store's identity rule predicts (classic: the config digest; OCI layout and an
   OCI archive on containerd: the manifest digest) -- when there is one, it decides alone;
2. on Docker's containerd store, an image loaded as a docker-archive (a delta made against a
   Docker inventory, or a schema 1/2 bundle's image): the manifest such a load makes, else the
   config digest where the engine reports it, else the diff_ids (what that store's ``docker image
   inspect`` shows);
3. a docker-archive load elsewhere (schema 1/2 into podman or bare containerd): the config digest the
   engine reports (podman's image ID is the config digest)."""

from __future__ import annotations

from importer.engines import EngineImage
from importer.errors import PolicyRejected
from importer.format.identity import CONTAINERD, docker_archive_manifest_digest, expected_image_id
from importer.format.manifest import ImageRecord
from importer.sinks import Sink


class TagConflict(PolicyRejected):
    reference = "tag-conflict"


def names_the_image(found: EngineImage, image: ImageRecord, image_store: str) -> bool:
    """Whether the image the engine reports under a tag is the bundle's ``image`` (a tag naming the
    bundle's own index names it: a registry's tag of a multi-platform image, 3.2)."""
    if image.index is not None and found.image_id == str(image.index.digest):
        return True
    predicted = expected_image_id(image_store, image)
    if predicted is not None:
        return found.image_id == predicted
    config = str(image.config.digest)
    if image_store == CONTAINERD:
        if found.image_id == docker_archive_manifest_digest(image):
            return True
        if found.config_digest is not None:
            return found.config_digest == config
        return list(found.diff_ids) == [str(x.diff_id) for x in image.layers]
    return (found.config_digest or found.image_id) == config


def refuse_tag_conflicts(sink: Sink, image: ImageRecord, image_store: str, force: bool) -> None:
    """Before anything is loaded: each ref of ``image`` is free or on the bundle's image."""
    if force:
        return
    for ref in image.refs:
        current = sink.lookup(ref)
        if current is None or names_the_image(current, image, image_store):
            continue
        raise TagConflict(
            f"tagging {ref}: expected it free or on the bundle's image (config {image.config.digest.short}), "
            f"found it on another image ({current.image_id[:19]})",
            hint=f"nothing was loaded; re-run with --force to move the tag, or remove it first ({ref})",
        )
