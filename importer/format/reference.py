"""The one parser of image references typed by a user (``IMAGE``, ``--tag``, ``docker://...``):
``[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`` as Docker's distribution/reference reads it. A bad one
is an :class:`~importer.errors.InvalidReference` naming the part that is wrong (the host, a path
component, the tag, the digest), not "something else". Spelling rules for engines:
importer/format/refs.py. ``bundle export``'s transport prefixes (skopeo's ``TRANSPORT:REFERENCE``)
are split here too (:func:`split_transport`).

The grammar lives here alone (tests/test_architecture.py refuses a copy of it elsewhere): a name
component (:data:`NAME_COMPONENT`, :func:`valid_name_component`), a repository path
(:func:`valid_path`), a tag (:data:`TAG`, :func:`valid_tag`; a digest is
:func:`importer.format.digest.is_digest`) and Docker Hub's names, one constant per meaning
(:data:`DOCKER_HUB`, :data:`DOCKER_HUB_LEGACY`, :data:`DOCKER_HUB_API`, :func:`is_docker_hub`,
:func:`official_path`)."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple, Optional, Tuple

from importer.errors import InvalidReference
from importer.format.digest import is_digest

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: isdigit() also takes superscripts, int() other scripts' digits

MAX_REFERENCE = 255  # Docker's NameTotalLengthMax
_COMPONENT_RE = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: one repository path component (distribution/reference's path-component: lowercase, single separators)
NAME_COMPONENT = re.compile(_COMPONENT_RE)
#: a repository path: components joined by '/'
REPOSITORY_PATH = re.compile(rf"{_COMPONENT_RE}(?:/{_COMPONENT_RE})*")
#: a tag: letters, digits, '_', '.', '-', at most 128, not starting with '.' or '-'
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")

#: Docker Hub, one constant per meaning
DOCKER_HUB = "docker.io"  # its name in a reference: Docker's default domain, what a name without a host means
DOCKER_HUB_LEGACY = "index.docker.io"  # its older name, which Docker's normalisation reads as DOCKER_HUB
DOCKER_HUB_API = "registry-1.docker.io"  # the host its registry API (/v2/) answers at
DOCKER_HUB_NAMES = (DOCKER_HUB, DOCKER_HUB_LEGACY, DOCKER_HUB_API)
DOCKER_HUB_HELPER_KEY = f"https://{DOCKER_HUB_LEGACY}/v1/"  # the server Docker hands a credential helper for it
OFFICIAL_PREFIX = "library/"  # Docker Hub's namespace of a one-component name (``app`` is ``library/app``)
#: skopeo's transports, those ``bundle export`` reads and those it refuses by name
TRANSPORTS = ("docker-daemon", "containerd", "oci", "docker", "oci-archive", "docker-archive", "podman", "dir")
#: a transport word and its ':', unless a registry port follows (``docker:5000/app`` is a host)
_TRANSPORT = re.compile(r"([a-z]+(?:-[a-z]+)*):(?![0-9]+/)")
_HINT = ("write it as [HOST[:PORT]/]PATH[:TAG] or [HOST[:PORT]/]PATH@sha256:<64 hex>, "
         "e.g. registry.example:5000/team/app:1")


def valid_name_component(text: str) -> bool:
    """One repository path component (``team``, ``my-app``, ``a__b``)."""
    return NAME_COMPONENT.fullmatch(text) is not None


def valid_path(text: str) -> bool:
    """A repository path of valid components (``team/app``); no host, no tag."""
    return REPOSITORY_PATH.fullmatch(text) is not None


def valid_tag(text: str) -> bool:
    return TAG.fullmatch(text) is not None


def is_docker_hub(host: str) -> bool:
    """``host`` is one of Docker Hub's names (as written: callers that fold case lower it first)."""
    return host in DOCKER_HUB_NAMES


def official_path(path: str) -> str:
    """Docker Hub's path of a repository: ``app`` -> ``library/app``; ``team/app`` stays."""
    return path if "/" in path else OFFICIAL_PREFIX + path


class Reference(NamedTuple):
    host: str  # "" when none was written (Docker Hub)
    path: str
    tag: str
    digest: str


def canonical_repository(name: str) -> str:
    """One spelling of a repository (no tag or digest) for comparing names: every Docker Hub
    spelling (none, ``docker.io``, ``index.docker.io``, ``registry-1.docker.io``; ``app`` or
    ``library/app``) is ``docker.io/library/app`` as Docker normalises it (cosign writes
    ``index.docker.io/library/app`` into a signature's identity); another registry's name stays
    as written."""
    host, path = split_host_path(name)
    if not host or is_docker_hub(host):
        return f"{DOCKER_HUB}/{official_path(path)}"
    return name


def split_transport(text: str) -> Tuple[str, str]:
    """(transport, the rest) of skopeo's ``TRANSPORT:REFERENCE`` (``docker://reg/app:1`` ->
    ("docker", "//reg/app:1"), ``oci:DIR:REF``, ``containerd:app:1``); ("", text) for a bare
    reference: no transport of :data:`TRANSPORTS` before the first ':', or a registry port after
    it (``docker:5000/team/app:1`` names the registry ``docker:5000``)."""
    m = _TRANSPORT.match(text)
    if m is None or m.group(1) not in TRANSPORTS:
        return "", text
    return m.group(1), text[m.end():]


def engine_host(first: str) -> bool:
    """Docker's rule for a first component that names a registry (uppercase counts): the
    ``is_host`` of :func:`split_host_path` for names an engine stores."""
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def has_host(first: str) -> bool:
    """The first component names a registry (``reg.example``, ``h:5000``, ``localhost``, ``[::1]``)."""
    return "." in first or ":" in first or first == "localhost" or first.startswith("[")


def split_reference(text: str) -> Tuple[str, str, str]:
    """(name, tag, digest) of ``text`` split as written, nothing checked; tag and digest may be "".
    The only place a reference is split at '@' and ':' (tests/test_architecture.py)."""
    name, _, digest = text.partition("@")
    tag = ""
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1:]
    return name, tag, digest


def split_host_path(name: str, is_host: Callable[[str], bool] = has_host) -> Tuple[str, str]:
    """(host, path) of a name without tag or digest; host "" when the first component is not one
    (``is_host`` decides: engines and registries differ on uppercase and ``[::1]``)."""
    first, sep, rest = name.partition("/")
    return (first, rest) if sep and is_host(first) else ("", name)


def split_registry(text: str) -> Tuple[str, str]:
    """(host, path) of a registry named on its own, ``HOST[:PORT][/PATH]`` (``--registry``, a
    serve mirror): the first component is the host whatever it looks like (``mirror:5000/hub`` ->
    ("mirror:5000", "hub"), ``mirror`` -> ("mirror", "")); nothing checked."""
    host, _, path = text.partition("/")
    return host, path


def split_host_port(host: str) -> Tuple[str, Optional[int]]:
    """``127.0.0.1:5000`` -> ("127.0.0.1", 5000); ``[::1]:5000`` -> ("::1", 5000)."""
    if host.startswith("["):
        addr, _, rest = host[1:].partition("]")
        return addr, int(rest[1:]) if rest.startswith(":") and _DIGITS.fullmatch(rest[1:]) else None
    name, sep, port = host.rpartition(":")
    if sep and _DIGITS.fullmatch(port) and ":" not in name:
        return name, int(port)
    return host, None


def parse_reference(text: str, *, what: str = "reading the image reference") -> Reference:
    """``text`` split and checked; InvalidReference says which part is wrong and how."""
    def bad(part: str, found: str) -> InvalidReference:
        return InvalidReference(f"{what} {text!r}: expected {part}, found {found}", hint=_HINT)

    if not text:
        raise bad("an image reference", "an empty one")
    if len(text) > MAX_REFERENCE:
        raise bad(f"at most {MAX_REFERENCE} characters", f"{len(text)}")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise bad("no spaces", "a space or control character")
    name, tag, digest = split_reference(text)
    if "@" in text and not is_digest(digest):
        raise bad("'sha256:' and 64 lowercase hex digits after '@'", repr(digest))
    if name != text.partition("@")[0] and not valid_tag(tag):
        raise bad("a tag of letters, digits, '_', '.', '-' (at most 128, not starting with '.' or '-')", repr(tag))
    host, path = split_host_path(name)
    if host and not _HOST.fullmatch(host):
        raise bad("a registry host as HOST or HOST:PORT", repr(host))
    if not path:
        raise bad("a repository name", "none")
    for component in path.split("/"):
        if not valid_name_component(component):
            found = (f"{component!r} (uppercase: repository names are lowercase)" if component.lower() != component
                     else repr(component) if component else "an empty one ('//' or a trailing '/')")
            raise bad("repository path components of lowercase letters, digits and single '.', '_' or '-'", found)
    return Reference(host, path, tag, digest)
