"""``bundle-import serve --htpasswd FILE``: Basic auth checked with the standard library only.

One ``USER:HASH`` per line (blank lines and ``#`` comments skipped). Lines end at ``\n`` only
(never at ``\r``, ``\v``, ``\f``, ``\x1c``-``\x1e``, ``\x85``, U+2028 or U+2029, as
:meth:`str.splitlines` would have them: a comment cannot hide a credential line behind such a
character); one ``\r`` before the ``\n`` is dropped (a file written with CRLF line ends), spaces
and tabs around a line are ignored, and any other control or line-separator character in a
``USER:HASH`` line refuses the file at start, naming the line. The stdlib has no bcrypt,
so two salted formats are read, and every other hash is refused at start with the line that
holds it (never guessed, never compared as plain text):

- ``$pbkdf2-sha256$ROUNDS$SALT$CHECKSUM`` (passlib's ``pbkdf2_sha256``: salt and checksum in
  base64 with ``.`` for ``+`` and no padding); docs/fleet.md shows a one-line way to make one;
- ``{SSHA}BASE64(SHA1(PASSWORD + SALT) + SALT)`` (OpenLDAP's ``slappasswd``; weaker: one round).

Passwords are compared with :func:`hmac.compare_digest`. A checked ``Authorization`` value is
remembered as a keyed hash (a per-process random key), right or wrong, so one pull's many
requests (or one client retrying a wrong password) cost one PBKDF2, and neither the password
nor the header is kept or logged.

Every check that hashes does the same work, whoever the user is: the PBKDF2 rounds of the costliest
``$pbkdf2-sha256$`` line of the file (a user with fewer rounds, an ``{SSHA}`` user and an unknown
user make them up on a random salt) and one SHA-1 when the file has an ``{SSHA}`` line, so the
time to refuse tells nothing about which users exist or which kind of hash they have. A client
address has a budget of refused logins (importer/serve/servelimits.py ``LoginFailures``);
past it, a login that would need a hash is answered at once, without one (429), so a flood of
wrong passwords costs no more hashing than the budget allows."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
import unicodedata
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from importer.errors import UsageError
from importer.serve.servelimits import LoginFailures

MAX_FILE = 1024 * 1024
MAX_ROUNDS = 10_000_000
MAX_REMEMBERED = 1024
REALM = "sneakernet-serve"
_KNOWN = "$pbkdf2-sha256$ROUNDS$SALT$HASH or {SSHA}BASE64"
MAKE_HINT = ("write each line as USER:$pbkdf2-sha256$... (docs/fleet.md, \"Serve over TLS\", shows a python3 "
             "one-liner; passlib's pbkdf2_sha256.hash() writes the same) or USER:{SSHA}... (slappasswd)")


class Login(NamedTuple):
    """The answer to one ``Authorization`` header: ``ok``; ``retry_after`` > 0: refused unchecked,
    the client address is past its budget of refused logins (seconds until it may try again)."""

    ok: bool
    retry_after: float = 0.0


def _lines(text: str) -> List[Tuple[int, str]]:
    """(number, line) of an htpasswd file: split on ``\n`` only, one ``\r`` before it dropped."""
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        out.append((number, line[:-1] if line.endswith("\r") else line))
    return out


def _odd_character(line: str) -> Optional[str]:
    """The first control, format or line-separator character of a credential line (tab aside)."""
    for ch in line:
        if ch != "\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return ch
    return None


class HtpasswdError(UsageError):
    """``--htpasswd FILE`` cannot be used: unreadable, not ``USER:HASH`` lines, or a hash type the
    standard library cannot check (bcrypt, apr1, crypt, unsalted {SHA}, plain text)."""

    reference = "serve-htpasswd"


def _ab64(text: str) -> bytes:
    """passlib's adapted base64 ('.' for '+', no padding); ValueError when it is not."""
    padded = text.replace(".", "+")
    padded += "=" * (-len(padded) % 4)
    return base64.b64decode(padded.encode("ascii"), validate=True)


def _kind(hashed: str) -> str:
    if hashed.startswith("$pbkdf2-sha256$"):
        return "pbkdf2-sha256"
    if hashed.startswith("{SSHA}"):
        return "ssha"
    if re.match(r"\$2[abxy]?\$", hashed):
        return "bcrypt"
    if hashed.startswith("$apr1$"):
        return "apr1 (MD5)"
    if hashed.startswith("{SHA}"):
        return "unsalted {SHA}"
    if hashed.startswith("$"):
        return f"{hashed.split('$')[1][:20]!r} crypt"
    return "crypt or plain text"


def _parse_hash(hashed: str) -> Tuple[str, bytes, bytes, int]:
    """(kind, salt, digest, rounds); ValueError naming what is wrong."""
    kind = _kind(hashed)
    if kind == "pbkdf2-sha256":
        parts = hashed.split("$")
        if len(parts) != 5 or not parts[2].isdigit():
            raise ValueError("a $pbkdf2-sha256$ hash has the form $pbkdf2-sha256$ROUNDS$SALT$HASH")
        rounds = int(parts[2])
        if not 1000 <= rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds {rounds} outside 1000..{MAX_ROUNDS}")
        try:
            salt, digest = _ab64(parts[3]), _ab64(parts[4])
        except (ValueError, binascii.Error):
            raise ValueError("its salt or hash is not base64") from None
        if len(digest) != 32 or not salt:
            raise ValueError(f"expected a 32-byte hash and a salt, found {len(digest)} bytes and {len(salt)}")
        return kind, salt, digest, rounds
    if kind == "ssha":
        try:
            raw = base64.b64decode(hashed[6:].encode("ascii"), validate=True)
        except (ValueError, binascii.Error):
            raise ValueError("{SSHA} is not followed by base64") from None
        if len(raw) <= 20:
            raise ValueError("an {SSHA} value holds a 20-byte SHA-1 and a salt")
        return kind, raw[20:], raw[:20], 1
    raise ValueError(f"a {kind} hash, which the standard library cannot check")


class Htpasswd:
    """The users of one htpasswd file, read and checked once at start."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.users: Dict[str, Tuple[str, bytes, bytes, int]] = {}
        self._key = os.urandom(32)
        self._good: Set[bytes] = set()
        self._bad: Set[bytes] = set()  # a client retrying one wrong header costs one PBKDF2, not one per request
        self._lock = threading.Lock()
        self.failures = LoginFailures()
        text = self._read(path)
        for number, line in _lines(text):
            line = line.strip(" \t")
            if not line or line.startswith("#"):
                continue
            where = f"reading --htpasswd {path}, line {number}"
            odd = _odd_character(line)
            if odd is not None:
                raise HtpasswdError(f"{where}: expected USER:HASH, found the character {odd!r} in it (lines end at "
                                    "\\n only; a \\r is allowed just before it)", hint=MAKE_HINT)
            user, sep, hashed = line.partition(":")
            if not sep or not user or not hashed:
                raise HtpasswdError(f"{where}: expected USER:HASH, found no ':' or an empty side",
                                    hint=MAKE_HINT)
            try:
                self.users[user] = _parse_hash(hashed)
            except ValueError as e:
                raise HtpasswdError(f"{where} (user {user!r}): expected {_KNOWN}, found {e}", hint=MAKE_HINT) from None
        if not self.users:
            raise HtpasswdError(f"reading --htpasswd {path}: expected at least one USER:HASH line, found none",
                                hint=MAKE_HINT)
        # the work every check does (module docstring): the most PBKDF2 rounds of the file, one SHA-1 if any {SSHA}
        self._rounds = max((e[3] for e in self.users.values() if e[0] == "pbkdf2-sha256"), default=0)
        self._ssha = any(e[0] == "ssha" for e in self.users.values())
        self._pad_salt = os.urandom(16)
        self._unknown = ("unknown", os.urandom(8), os.urandom(32), 0)

    @staticmethod
    def _read(path: str) -> str:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE + 1)
        except OSError as e:
            raise HtpasswdError(f"reading --htpasswd {path}: expected a readable file, found {e.strerror or e}",
                                hint="give the path of an htpasswd file (USER:HASH lines)") from e
        if len(data) > MAX_FILE:
            raise HtpasswdError(f"reading --htpasswd {path}: expected at most {MAX_FILE} bytes, found more",
                                hint="an htpasswd file holds one short line per user")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise HtpasswdError(f"reading --htpasswd {path}: expected UTF-8 text, found other bytes",
                                hint=MAKE_HINT) from None

    def check(self, authorization: Optional[str], client: str = "") -> Login:
        """Does the ``Authorization`` header carry a known user and its password? ``client``: the
        client's address (servelimits.client_key), whose budget of refused logins a hash needs."""
        if not authorization or len(authorization) > 4096:
            return Login(False)
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return Login(False)
        token = hmac.new(self._key, value.strip().encode("utf-8", "replace"), hashlib.sha256).digest()
        with self._lock:
            if token in self._good or token in self._bad:
                return Login(token in self._good)
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return Login(False)
        if not sep:
            return Login(False)
        wait = self.failures.reserve(client)
        if wait > 0:
            return Login(False, wait)
        ok = self._verify(user, password)
        if ok:
            self.failures.refund(client)
        with self._lock:
            seen = self._good if ok else self._bad
            if len(seen) >= MAX_REMEMBERED:
                seen.clear()
            seen.add(token)
        return Login(ok)

    def _verify(self, user: str, password: str) -> bool:
        """The same hash work for every user, known or not, whatever its kind of hash (module docstring)."""
        entry = self.users.get(user)
        kind, salt, digest, rounds = entry if entry is not None else self._unknown
        pw = password.encode("utf-8")
        found = b""
        if self._rounds:
            if kind == "pbkdf2-sha256":
                found = hashlib.pbkdf2_hmac("sha256", pw, salt, rounds)
            pad = self._rounds - (rounds if kind == "pbkdf2-sha256" else 0)
            if pad > 0:
                hashlib.pbkdf2_hmac("sha256", pw, self._pad_salt, pad)
        if self._ssha:
            # {SSHA} is SHA-1 by definition (docs say weaker)
            sha = hashlib.sha1(pw + (salt if kind == "ssha" else self._unknown[1])).digest()  # noqa: S324
            if kind == "ssha":
                found = sha
        return hmac.compare_digest(found, digest) and entry is not None


def pbkdf2_line(user: str, password: str, rounds: int = 600_000, salt: Optional[bytes] = None) -> str:
    """``USER:$pbkdf2-sha256$...`` for ``password`` (tests; docs/fleet.md shows the same as a one-liner)."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, rounds)

    def ab64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii").rstrip("=").replace("+", ".")

    return f"{user}:$pbkdf2-sha256${rounds}${ab64(salt)}${ab64(digest)}"
