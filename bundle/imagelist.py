"""``bundle export --images-from FILE``: the image lists air-gap users already keep, read as they are.

- **A plain list**: one reference per line, any source prefix ``bundle export`` takes
  (``docker://``, ``oci:``, ``containerd:``, ``docker-daemon:`` or a bare Docker reference); ``#``
  starts a comment (a whole line, or after a space); blank lines are skipped. hauler's
  ``--image-txt`` files are such lists.
- **hauler manifests** (YAML, several documents): ``kind: Images`` (``content.hauler.cattle.io``
  ``v1`` or ``v1alpha1``), ``spec.images[].name`` and an optional ``platform``. Other hauler kinds
  (``Charts``, ``Files``) carry no images: skipped, each with a note on stderr.
- **zarf.yaml** (``kind: ZarfPackageConfig``): the ``images`` of every component.

hauler and zarf name registry images, so their bare references are read from the registry
(``docker://``). They are third-party files, so they are data, not a door: an entry that names a
local source (``oci:``, ``containerd:``, ``docker-daemon:``, an archive, a path) is refused
(ImageListLocalSource) unless the user passes ``--images-from-allow-local``. A plain list is the
user's own command line written down: it takes any source prefix, as the command line does.
A file is YAML when it ends in ``.yaml``/``.yml`` or its first line that is not a comment is a
``key: value`` line. YAML is read bounded before anything else: at most MAX_YAML_BYTES, nesting
at most MAX_YAML_DEPTH levels, at most MAX_YAML_NODES nodes counting every alias as the nodes it
stands for (a "billion laughs" file is refused, never expanded), no alias cycle.
A bad entry is one UsageError naming the file and line, what was expected and what was found."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from importer.errors import UsageError
from importer.format.reference import split_transport

HAULER_API = re.compile(r"content\.hauler\.cattle\.io/v1(alpha1)?")
_YAML_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*:(\s|$)")
_BAD_CHARS = re.compile(r"[\s\"'`$;|&<>]")
MAX_LIST_BYTES = 16 * 1024 * 1024  # a plain list
MAX_YAML_BYTES = 1024 * 1024  # a hauler manifest or zarf.yaml (thousands of images fit)
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 20_000  # each alias counted as the nodes it stands for (a hauler image: ~5)
_YAML_HINT = "a hauler manifest or a zarf.yaml is small and flat; is this the right file?"


class ImageListError(UsageError):
    """``--images-from FILE``: the file cannot be read, or an entry is not an image reference."""

    reference = "image-list"


class ImageListLocalSource(ImageListError):
    """A hauler or zarf list names a local source (``oci:``, ``containerd:``, a path...): such a
    third-party list may name registry images only, unless ``--images-from-allow-local``."""

    reference = "image-list-local-source"


@dataclass(frozen=True)
class ListedImage:
    ref: str  # as bundle export takes it (a transport prefix where the list format implies one)
    where: str  # FILE:LINE
    platform: Optional[str] = None  # hauler's per-image platform


def read_image_lists(paths: Sequence[str], *, note: Any = None, allow_local: bool = False) -> List[ListedImage]:
    """Every image of every list, in order, each reference once (the first mention kept)."""
    seen: set[str] = set()
    out: List[ListedImage] = []
    for path in paths:
        for image in read_image_list(path, note=note, allow_local=allow_local):
            if image.ref not in seen:
                seen.add(image.ref)
                out.append(image)
    return out


def read_image_list(path: str, *, note: Any = None, allow_local: bool = False) -> List[ListedImage]:
    """``allow_local``: a hauler or zarf entry may name a local source (--images-from-allow-local)."""
    text = _read(path)
    is_yaml = _is_yaml(path, text)
    images = _read_yaml(path, text, note or _stderr, allow_local) if is_yaml else _read_plain(path, text)
    if not images:
        raise ImageListError(f"reading the image list {path}: expected at least one image reference, found none",
                             hint="one reference per line (# comments), a hauler `kind: Images` manifest or a "
                             "zarf.yaml with component images")
    return images


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LIST_BYTES + 1)
    except OSError as e:
        raise ImageListError(f"reading the image list {path}: expected a readable file, found {e.strerror or e}",
                             hint="check the path given to --images-from") from e
    if len(raw) > MAX_LIST_BYTES:
        raise ImageListError(f"reading the image list {path}: expected at most 16 MiB, found more")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ImageListError(f"reading the image list {path}: expected UTF-8 text, found a byte that is not "
                             f"(offset {e.start})", hint="is this the right file?") from e


def _is_yaml(path: str, text: str) -> bool:
    if path.endswith((".yaml", ".yml")):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped == "---" or _YAML_KEY.match(stripped) is not None
    return False


def check_ref(ref: str, where: str) -> str:
    """A reference as a list gives it: one word, no shell characters."""
    if not ref or _BAD_CHARS.search(ref):
        raise ImageListError(f"reading {where}: expected one image reference, found {ref!r}",
                             hint="one reference per line, e.g. registry.example:5000/team/app:1 or oci:DIR:app:1")
    return ref


def _read_plain(path: str, text: str) -> List[ListedImage]:
    images = []
    for n, line in enumerate(text.splitlines(), 1):
        body = line.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not body or body.startswith("#"):
            continue
        images.append(ListedImage(check_ref(body, f"{path}:{n}"), f"{path}:{n}"))
    return images


# ---------------------------------------------------------------- YAML (hauler, zarf)


def _read_yaml(path: str, text: str, note: Any, allow_local: bool) -> List[ListedImage]:
    import yaml

    from bundle.yamlbound import YamlTooBig, compose_bounded

    size = len(text.encode("utf-8"))
    if size > MAX_YAML_BYTES:
        raise ImageListError(f"reading the image list {path}: expected a YAML file of at most {MAX_YAML_BYTES} "
                             f"bytes, found {size}", hint=_YAML_HINT)
    try:
        documents = compose_bounded(text, depth=MAX_YAML_DEPTH, nodes=MAX_YAML_NODES)
    except YamlTooBig as e:
        raise ImageListError(f"reading the image list {path}:{e.line}: expected {e.expected}, found {e.found}",
                             hint=_YAML_HINT) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ImageListError(f"reading the image list {path}{line}: expected YAML, found "
                             f"{getattr(e, 'problem', None) or e}",
                             hint="a hauler manifest or a zarf.yaml; a plain list has one reference per line") from e
    images: List[ListedImage] = []
    for doc in documents:
        where = f"{path}:{doc.start_mark.line + 1}"
        if not isinstance(doc, yaml.MappingNode):
            raise ImageListError(f"reading {where}: expected a YAML mapping (a hauler or zarf document), "
                                 f"found {_kind(doc)}")
        kind = _scalar(_get(doc, "kind"))
        if kind == "ZarfPackageConfig" or (kind is None and _get(doc, "components") is not None):
            images += _zarf(path, doc, allow_local)
        elif kind == "Images" and HAULER_API.fullmatch(_scalar(_get(doc, "apiVersion")) or ""):
            images += _hauler(path, doc, allow_local)
        elif HAULER_API.fullmatch(_scalar(_get(doc, "apiVersion")) or ""):
            note(f"note: {where}: hauler kind {kind!r} carries no images; skipped")
        else:
            raise ImageListError(f"reading {where}: expected a hauler `kind: Images` manifest or a zarf.yaml "
                                 f"(`kind: ZarfPackageConfig`), found kind {kind!r}",
                                 hint="a plain list has one reference per line (# comments)")
    return images


def _get(node: Any, key: str) -> Any:
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return None
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _scalar(node: Any) -> Optional[str]:
    import yaml

    return str(node.value) if isinstance(node, yaml.ScalarNode) and node.value != "" else None


def _kind(node: Any) -> str:
    return {"MappingNode": "a mapping", "SequenceNode": "a list", "ScalarNode": "a single value"}.get(
        type(node).__name__, type(node).__name__)


def _items(node: Any, path: str, what: str) -> Iterator[Any]:
    import yaml

    if node is None:
        return
    if not isinstance(node, yaml.SequenceNode):
        raise ImageListError(f"reading {path}:{node.start_mark.line + 1}: expected {what} to be a list, "
                             f"found {_kind(node)}")
    yield from node.value


def _registry(ref: str, where: str, allow_local: bool) -> str:
    """hauler and zarf name registry images: a bare reference is read from the registry; one that
    names a local source (a transport other than docker://, a path) only with ``allow_local``."""
    transport = split_transport(ref)[0]
    local = transport not in ("", "docker") or ref.startswith(("/", ".", "~"))
    if local and not allow_local:
        what = f"the {transport}: source" if transport else "a path"
        raise ImageListLocalSource(
            f"reading {where}: expected a registry image (a hauler or zarf list names registry images), "
            f"found {what} ({ref!r})",
            hint="a list from elsewhere may not read this host's engines or files; if you wrote or checked it, "
                 "pass --images-from-allow-local (or put the entry in a plain list of your own)")
    return ref if transport or local else f"docker://{ref}"


def _hauler(path: str, doc: Any, allow_local: bool) -> List[ListedImage]:
    import yaml

    images = []
    for item in _items(_get(_get(doc, "spec"), "images"), path, "spec.images"):
        where = f"{path}:{item.start_mark.line + 1}"
        if isinstance(item, yaml.ScalarNode):  # a bare string entry
            name, platform = _scalar(item), None
        else:
            name, platform = _scalar(_get(item, "name")), _scalar(_get(item, "platform"))
        if name is None:
            raise ImageListError(f"reading {where}: expected an image with a `name`, found {_kind(item)} without one",
                                 hint="hauler: spec.images: [{name: REF, platform: OS/ARCH}]")
        images.append(ListedImage(_registry(check_ref(name, where), where, allow_local), where, platform))
    return images


def _zarf(path: str, doc: Any, allow_local: bool) -> List[ListedImage]:
    images = []
    for component in _items(_get(doc, "components"), path, "components"):
        for item in _items(_get(component, "images"), path, "a component's images"):
            where = f"{path}:{item.start_mark.line + 1}"
            name = _scalar(item)
            if name is None:
                raise ImageListError(f"reading {where}: expected an image reference, found {_kind(item)}",
                                     hint="zarf: components[].images is a list of references")
            images.append(ListedImage(_registry(check_ref(name, where), where, allow_local), where))
    return images


def platform_of(images: Sequence[ListedImage], asked: Sequence[str]) -> Tuple[str, ...]:
    """The ``--platform`` the lists imply: the one their entries name (hauler), which must agree
    with each other and with ``--platform`` when given."""
    named = {(i.platform, i.where) for i in images if i.platform}
    wanted = {p for p, _ in named}
    if not wanted:
        return tuple(asked)
    if len(wanted) > 1 or (asked and set(asked) != wanted):
        where = ", ".join(f"{w} ({p})" for p, w in sorted(named, key=lambda x: x[1]))
        given = f"--platform {','.join(asked)} and " if asked else ""
        raise ImageListError(f"reading the platforms of the listed images: expected one platform, found "
                             f"{given}{where}", hint="export one bundle per platform (one list per platform)")
    return tuple(wanted)
