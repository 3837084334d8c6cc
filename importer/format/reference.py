"""The one parser of image references typed by a user (``IMAGE``, ``--tag``, ``docker://...``):
``[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`` as Docker's distribution/reference reads it. A bad one
is an :class:`~importer.errors.InvalidReference` naming the part that is wrong (the host, a path
component, the tag, the digest), not "something else". Spelling rules for engines:
importer/format/refs.py."""

from __future__ import annotations

import re
from typing import NamedTuple

from importer.errors import InvalidReference

MAX_REFERENCE = 255  # Docker's NameTotalLengthMax
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HINT = ("write it as [HOST[:PORT]/]PATH[:TAG] or [HOST[:PORT]/]PATH@sha256:<64 hex>, "
         "e.g. registry.example:5000/team/app:1")


class Reference(NamedTuple):
    host: str  # "" when none was written (Docker Hub)
    path: str
    tag: str
    digest: str


def has_host(first: str) -> bool:
    """The first component names a registry (``reg.example``, ``h:5000``, ``localhost``, ``[::1]``)."""
    return "." in first or ":" in first or first == "localhost" or first.startswith("[")


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
    name, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise bad("'sha256:' and 64 lowercase hex digits after '@'", repr(digest))
    tag = ""
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise bad("a tag of letters, digits, '_', '.', '-' (at most 128, not starting with '.' or '-')",
                      repr(tag))
    first, sep, rest = name.partition("/")
    host, path = (first, rest) if sep and has_host(first) else ("", name)
    if host and not _HOST.fullmatch(host):
        raise bad("a registry host as HOST or HOST:PORT", repr(host))
    if not path:
        raise bad("a repository name", "none")
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            found = (f"{component!r} (uppercase: repository names are lowercase)" if component.lower() != component
                     else repr(component) if component else "an empty one ('//' or a trailing '/')")
            raise bad("repository path components of lowercase letters, digits and single '.', '_' or '-'", found)
    return Reference(host, path, tag, digest)
