"""The Docker sink: ``docker load`` fed a docker-archive built on the fly, then ``docker
image inspect`` to read back what the engine holds. Works with any storage driver and with the
containerd image store (where the image ID is the manifest digest)."""

from __future__ import annotations

import json
import os
import re
from typing import Any, List, Optional, Sequence

from importer.dockerarchive import write_docker_archive
from importer.engines import StdinCommand, run
from importer.errors import BundleError, CommandFailed, EngineUnavailable
from importer.manifest import ImageRecord
from importer.sinks import EngineImage, EngineInfo, ProgressFn

_HINT = "start the Docker engine, or point the importer at it with --docker-host unix:///path/docker.sock"


class DockerSink:
    kind = "docker"

    def __init__(self, host: Optional[str] = None) -> None:
        self.host = host or os.environ.get("DOCKER_HOST") or None

    def argv(self, *args: str) -> List[str]:
        base = ["docker"]
        if self.host:
            base += ["-H", self.host]
        return base + list(args)

    # === probe
    def probe(self) -> EngineInfo:
        try:
            res = run(self.argv("info", "--format", "{{json .}}"), what="asking Docker for its version",
                      timeout=60, hint=_HINT)
        except CommandFailed as e:
            raise EngineUnavailable(
                f"connecting to Docker at {self.host or 'the default socket'}: expected a running engine, "
                f"found none ({e.stderr_tail.strip().splitlines()[-1] if e.stderr_tail.strip() else 'no answer'})",
                hint=_HINT,
            ) from e
        info = json.loads(res.stdout.decode("utf-8", "replace") or "{}")
        if not isinstance(info, dict) or not info.get("ServerVersion"):
            raise EngineUnavailable(f"connecting to Docker at {self.host or 'the default socket'}: no server answered",
                                    hint=_HINT)
        return EngineInfo(
            kind="docker",
            version=str(info.get("ServerVersion")),
            storage_driver=str(info.get("Driver", "")),
            image_store=image_store_of(info),
            address=self.host or "unix:///var/run/docker.sock",
            data_root=info.get("DockerRootDir"),
        )

    # === read back
    def lookup(self, name: str) -> Optional[EngineImage]:
        res = run(self.argv("image", "inspect", "--format", "{{json .}}", name),
                  what=f"inspecting {name} in Docker", check=False, timeout=120)
        if res.returncode != 0:
            if "No such image" in res.stderr or "No such object" in res.stderr:
                return None
            raise CommandFailed(self.argv("image", "inspect", name), res.returncode, res.stderr,
                                what=f"inspecting {name} in Docker")
        return engine_image_from_inspect(json.loads(res.stdout.decode("utf-8", "replace")))

    # === load
    def load(self, root: str, images: Sequence[ImageRecord], on_bytes: Optional[ProgressFn]) -> None:
        cmd = StdinCommand(self.argv("load", "-q"), what="loading the bundle into Docker", hint=_HINT)
        try:
            write_docker_archive(cmd.stdin, root, images, with_tags=True, on_bytes=on_bytes)
        except BrokenPipeError:
            cmd.finish()  # raises CommandFailed with docker's own words
            raise
        except BaseException:
            cmd.abort()
            raise
        cmd.finish()

    def tag(self, image_id: str, ref: str) -> None:
        run(self.argv("tag", image_id, ref), what=f"tagging {image_id[:19]} as {ref}", timeout=120)

    def remove(self, image_id: str) -> None:
        run(self.argv("image", "rm", "--no-prune", image_id), what=f"removing {image_id[:19]}", timeout=300)


def image_store_of(info: Any) -> str:
    """'containerd' when Docker keeps images in containerd (image ID = manifest digest)."""
    status = info.get("DriverStatus") or []
    for pair in status:
        if isinstance(pair, list) and len(pair) == 2 and pair[0] == "driver-type" and "containerd" in str(pair[1]):
            return "containerd"
    return "classic"


def engine_image_from_inspect(doc: Any) -> EngineImage:
    if isinstance(doc, list):
        doc = doc[0] if doc else {}
    if not isinstance(doc, dict) or not isinstance(doc.get("Id"), str):
        raise BundleError("reading `docker image inspect` output: expected an object with Id, found something else")
    rootfs = doc.get("RootFS") or {}
    layers = rootfs.get("Layers") or []
    return EngineImage(
        image_id=doc["Id"],
        diff_ids=[str(x) for x in layers],
        tags=[str(t) for t in (doc.get("RepoTags") or [])],
    )


_LOADED_RE = re.compile(r"Loaded image(?: ID)?: (\S+)")


def loaded_names(output: str) -> List[str]:
    """Image IDs or names from `docker load` output."""
    return _LOADED_RE.findall(output)
