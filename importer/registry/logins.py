"""Registry logins, found where skopeo, podman and Docker keep them (never printed).

One resolver for every command that talks to a registry (``bundle export docker://``, ``bundle
push``, ``bundle-import --engine registry``, ``--inventory --registry``, a delta into a
registry). The first that names a login wins, as skopeo documents it:

1. ``--username USER --password-stdin``;
2. ``--authfile FILE``, else ``$REGISTRY_AUTH_FILE``: that file only (a file named so must be
   readable: a missing, unreadable or malformed one is a UsageError before anything is sent);
3. else, in order, ``${XDG_RUNTIME_DIR}/containers/auth.json`` (``podman login``, ``skopeo
   login``), ``${XDG_CONFIG_HOME:-~/.config}/containers/auth.json``, then Docker's
   ``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json`` (``docker login``): the first file
   with a login for the registry (one that is missing is skipped; one that cannot be read is
   skipped and named in the hint when the registry then wants a login).

In one file (containers-auth.json(5), Docker's config.json): ``credHelpers[HOST]`` (Docker's
credential-helper protocol: ``docker-credential-NAME get`` with the registry on stdin, bounded
in time and output), else the ``auths`` entry of the most specific key that names the image's
repository (``HOST:PORT/ns/repo`` before ``HOST:PORT/ns`` before ``HOST:PORT``; a key written as
a URL, ``https://HOST/v1/``, names its host; ``docker.io``, ``index.docker.io`` and
``registry-1.docker.io`` are one registry), else ``credsStore`` (a helper for every registry).
An ``auths`` entry is ``{"auth": base64(USER:PASSWORD)}`` or ``{"username", "password"}``.

Every file is read as a hostile one: a regular file only (a FIFO or a device is refused without
being opened for reading: it could block), at most :data:`MAX_AUTH_FILE` bytes, JSON (nesting
bounded by the parser), fields of the wrong type ignored; an entry for the registry that cannot
be decoded is a UsageError naming the file and the key, never the value."""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import re
import select
import signal
import stat
import subprocess
import threading
import time
from typing import Dict, List, Mapping, Optional, Tuple

from importer.errors import ManifestError, UsageError
from importer.format.limits import parse_json
from importer.format.reference import DOCKER_HUB, DOCKER_HUB_HELPER_KEY, is_docker_hub
from importer.registry.auth import Credentials

MAX_AUTH_FILE = 1024 * 1024
HELPER_TIMEOUT = 15.0  # seconds a credential helper may take
MAX_HELPER_OUTPUT = 64 * 1024
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LOGIN_COMMANDS = "podman login, skopeo login or docker login"


def _hub(host: str) -> str:
    return DOCKER_HUB if is_docker_hub(host.lower()) else host


def normalize_key(key: str) -> str:
    """An ``auths`` key as containers-auth.json(5) reads it: a URL (``https://HOST/v1/``, Docker's
    older keys) names its host; Docker Hub's names are one."""
    if key.startswith(("https://", "http://")):
        key = key.split("://", 1)[1].split("/", 1)[0]
    host, sep, path = key.partition("/")
    return _hub(host) + sep + path.rstrip("/")


def candidate_keys(host: str, repo: str = "") -> List[str]:
    """``HOST/a/b/c``, ``HOST/a/b``, ``HOST/a``, ``HOST``: most specific first."""
    host = _hub(host)
    parts = [p for p in repo.split("/") if p]
    return [f"{host}/{'/'.join(parts[:n])}" for n in range(len(parts), 0, -1)] + [host]


def read_auth_file(path: str) -> Dict[str, object]:
    """The JSON object of an auth file, read as a hostile file (module docstring). Raises
    FileNotFoundError for a missing file and UsageError for one that cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UsageError(f"reading the registry login file {path}: expected a readable file, found "
                         f"{e.strerror or e} ({errno.errorcode.get(e.errno or 0, 'error')})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "a device"
            raise UsageError(f"reading the registry login file {path}: expected a regular file, found {kind}")
        if st.st_size > MAX_AUTH_FILE:
            raise UsageError(f"reading the registry login file {path}: expected at most {MAX_AUTH_FILE} bytes, "
                             f"found {st.st_size}")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            raw = f.read(MAX_AUTH_FILE + 1)
    except OSError as e:
        raise UsageError(f"reading the registry login file {path}: expected a readable file, found {e}") from e
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > MAX_AUTH_FILE:
        raise UsageError(f"reading the registry login file {path}: expected at most {MAX_AUTH_FILE} bytes, found more")
    if not raw.strip():
        return {}  # an empty file holds no login (podman writes none until the first login)
    try:
        doc = parse_json(raw, path)
    except ManifestError as e:
        raise UsageError(f"reading the registry login file {path}: expected JSON, found something else",
                         hint="it is written by podman login, skopeo login or docker login; fix or remove it") from e
    if not isinstance(doc, dict):
        raise UsageError(f"reading the registry login file {path}: expected a JSON object, "
                         f"found {type(doc).__name__}")
    return doc


def _entry_credentials(entry: object, path: str, key: str) -> Optional[Credentials]:
    """One ``auths`` entry; None when it holds no login (``{}``: Docker with a credsStore)."""
    if not isinstance(entry, dict):
        return None
    where = f"{path} (auths[{key!r}])"
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            sep, user, password = "", "", ""
        if not sep or not user:
            raise UsageError(f"reading the registry login in {where}: expected \"auth\" to be base64 of "
                             "USER:PASSWORD, found something else",
                             hint=f"log in again ({LOGIN_COMMANDS}), or pass --username USER --password-stdin")
        return Credentials(user, password, source=where)
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and name and isinstance(secret, str):
        return Credentials(name, secret, source=where)
    return None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # the helper's own session: what it started too
    with contextlib.suppress(OSError):
        proc.kill()


def run_helper(name: str, server: str, *, timeout: float = HELPER_TIMEOUT,
               limit: int = MAX_HELPER_OUTPUT) -> Tuple[Optional[Credentials], str]:
    """``docker-credential-NAME get`` with ``server`` on stdin: (credentials, "") or (None, why
    not). Killed past ``timeout`` seconds or ``limit`` bytes of output; its output is never
    quoted (it may hold the secret)."""
    helper = f"docker-credential-{name}"
    if not _HELPER_NAME.fullmatch(name):
        return None, f"{name!r} is not a credential helper name"
    try:
        proc = subprocess.Popen([helper, "get"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        return None, f"`{helper}` cannot be run ({'not on PATH' if isinstance(e, FileNotFoundError) else e})"
    assert proc.stdin is not None and proc.stdout is not None
    out = bytearray()
    why = ""
    try:
        with contextlib.suppress(OSError):
            proc.stdin.write(server.encode("utf-8"))
        with contextlib.suppress(OSError):
            proc.stdin.close()
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"`{helper}` gave no answer within {timeout:g} s (killed)"
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
            if len(out) > limit:
                why = f"`{helper}` printed more than {limit} bytes (killed)"
                break
        if why:
            _kill(proc)
        try:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            rc = proc.wait()
            why = why or f"`{helper}` gave no answer within {timeout:g} s (killed)"
    finally:
        proc.stdout.close()
    if why:
        return None, why
    if rc != 0:
        return None, f"`{helper}` has no login for {server} (exit status {rc})"
    try:
        doc = parse_json(bytes(out), helper)
    except ManifestError:
        return None, f"`{helper}` answered something other than JSON"
    user = doc.get("Username") if isinstance(doc, dict) else None
    secret = doc.get("Secret") if isinstance(doc, dict) else None
    if not isinstance(user, str) or not isinstance(secret, str) or not secret:
        return None, f"`{helper}` answered no Username and Secret"
    if user == "<token>":  # an identity token (OAuth2 refresh token): not a password
        return None, f"`{helper}` holds an identity token, which this tool cannot use"
    return Credentials(user, secret, source=helper), ""


class Logins:
    """Where this run finds registry logins (module docstring); safe to share between threads."""

    def __init__(self, flags: Optional[Credentials] = None, authfile: Optional[str] = None, *,
                 environ: Optional[Mapping[str, str]] = None, helper_timeout: float = HELPER_TIMEOUT) -> None:
        self.flags = flags
        env = dict(os.environ if environ is None else environ)
        self.named: Optional[Tuple[str, str]] = None  # (path, how it was named): that file only
        if authfile:
            self.named = (authfile, "--authfile")
        elif env.get("REGISTRY_AUTH_FILE"):
            self.named = (env["REGISTRY_AUTH_FILE"], "$REGISTRY_AUTH_FILE")
        self.helper_timeout = helper_timeout
        self._env = env
        self._docs: Dict[str, Optional[Dict[str, object]]] = {}
        self._skipped: Dict[str, str] = {}  # a default file that could not be read -> why
        self._helpers: Dict[Tuple[str, str], Tuple[Optional[Credentials], str]] = {}
        self._found: Dict[Tuple[str, str], Optional[Credentials]] = {}
        self._lock = threading.RLock()

    def files(self) -> List[str]:
        """The auth files read, in order."""
        if self.named is not None:
            return [self.named[0]]
        home = os.path.expanduser("~")
        paths = []
        if self._env.get("XDG_RUNTIME_DIR"):
            paths.append(os.path.join(self._env["XDG_RUNTIME_DIR"], "containers", "auth.json"))
        config_home = self._env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        paths.append(os.path.join(config_home, "containers", "auth.json"))
        docker = self._env.get("DOCKER_CONFIG") or os.path.join(home, ".docker")
        paths.append(os.path.join(docker, "config.json"))
        return list(dict.fromkeys(paths))

    def check(self) -> None:
        """A file named by --authfile or $REGISTRY_AUTH_FILE is read now: one that cannot be used
        fails before anything is verified or sent."""
        if self.named is not None:
            self._doc(self.named[0])

    def _doc(self, path: str) -> Optional[Dict[str, object]]:
        with self._lock:
            if path in self._docs:
                return self._docs[path]
            doc: Optional[Dict[str, object]] = None
            try:
                doc = read_auth_file(path)
            except FileNotFoundError as e:
                if self.named is not None:
                    raise UsageError(f"reading the registry login file {path} ({self.named[1]}): expected a file, "
                                     "found nothing there",
                                     hint=f"check the path; {LOGIN_COMMANDS} --authfile FILE writes one") from e
            except UsageError as e:
                if self.named is not None:
                    raise
                self._skipped[path] = e.message
            self._docs[path] = doc
            return doc

    def credentials(self, host: str, repo: str = "") -> Optional[Credentials]:
        """The login for ``repo`` on ``host`` (``HOST[:PORT]``), or None (anonymous)."""
        if self.flags is not None:
            return self.flags
        with self._lock:
            if (host, repo) not in self._found:
                found = None
                for path in self.files():
                    doc = self._doc(path)
                    found = self._from_doc(doc, path, host, repo) if doc else None
                    if found is not None:
                        break
                self._found[(host, repo)] = found
            return self._found[(host, repo)]

    def _from_doc(self, doc: Dict[str, object], path: str, host: str, repo: str) -> Optional[Credentials]:
        helpers = doc.get("credHelpers")
        if isinstance(helpers, dict):
            for key, name in helpers.items():
                if isinstance(key, str) and isinstance(name, str) and normalize_key(key) == _hub(host):
                    found = self._helper(name, host)
                    if found is not None:
                        return found
        auths = doc.get("auths")
        if isinstance(auths, dict):
            by_key: Dict[str, str] = {}
            for key in auths:
                if isinstance(key, str):
                    by_key.setdefault(normalize_key(key), key)
            for want in candidate_keys(host, repo):
                if want in by_key:
                    found = _entry_credentials(auths[by_key[want]], path, by_key[want])
                    if found is not None:
                        return found
        store = doc.get("credsStore")
        if isinstance(store, str) and store:
            return self._helper(store, host)
        return None

    def _helper(self, name: str, host: str) -> Optional[Credentials]:
        server = DOCKER_HUB_HELPER_KEY if _hub(host) == DOCKER_HUB else host
        if (name, server) not in self._helpers:
            self._helpers[(name, server)] = run_helper(name, server, timeout=self.helper_timeout)
        found, why = self._helpers[(name, server)]
        if found is None:
            self._skipped[f"docker-credential-{name}"] = why
        return found

    def hint(self, host: str, repo: str = "", *, refused: bool = False) -> str:
        """What to do when ``host`` wants a login (``refused``: it refused the one sent)."""
        creds = self.credentials(host, repo)
        other = "--authfile FILE or --username USER --password-stdin"
        if creds is not None and refused:
            return (f"check the login from {creds.source} (user {creds.username!r}) and its rights on the "
                    f"repository; another one: {other}")
        read = ", ".join(self.files())
        skipped = "; ".join(f"{why}" for why in self._skipped.values())
        return (f"log in ({LOGIN_COMMANDS} {host}), or pass {other}; no login for {host} in {read}"
                + (f" (not used: {skipped})" if skipped else ""))
