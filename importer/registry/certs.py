"""A registry's CA certificates, found where skopeo, podman and Docker look (containers-certs.d(5)).

One resolver for every command that talks to a registry. ``--cert-dir DIR``: the ``*.crt`` files
of DIR (the certificates of every registry the command talks to, as skopeo's ``--cert-dir``).
Without it, per registry (``HOST[:PORT]`` as it is named): ``*.crt`` of
``${XDG_CONFIG_HOME:-~/.config}/containers/certs.d/HOST:PORT/``,
``/etc/containers/certs.d/HOST:PORT/`` and ``/etc/docker/certs.d/HOST:PORT/`` (Docker's
``ca.crt`` is one of them). They are trusted in addition to the system's CAs (``SSL_CERT_FILE``
still names another bundle).

A registry with a CA of its own is checked against it, on loopback too (a loopback registry is
otherwise "insecure" by default, as Docker treats it); ``--insecure`` still turns the checks off.
Each file is read as a hostile one: a regular file (a FIFO is not opened for reading), at most
:data:`MAX_CA_FILE` bytes, PEM certificates; one that is not is a UsageError naming it."""

from __future__ import annotations

import glob
import os
import ssl
import stat
import threading
from typing import Dict, List, Mapping, Optional, Sequence

from importer.errors import UsageError

MAX_CA_FILE = 1024 * 1024
SYSTEM_CERTS_DIRS = ("/etc/containers/certs.d", "/etc/docker/certs.d")


def _read_pem(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UsageError(f"reading the CA certificate {path}: expected a readable file, found {e.strerror or e}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"reading the CA certificate {path}: expected a regular file, found "
                             f"{'a FIFO' if stat.S_ISFIFO(st.st_mode) else 'a special file'}")
        raw = f.read(MAX_CA_FILE + 1)
    if len(raw) > MAX_CA_FILE:
        raise UsageError(f"reading the CA certificate {path}: expected at most {MAX_CA_FILE} bytes, found more")
    text = raw.decode("ascii", "replace")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UsageError(f"reading the CA certificate {path}: expected PEM certificates, found none",
                         hint="a CA file is PEM: -----BEGIN CERTIFICATE----- ...")
    return text


class CertDirs:
    """Where this run finds registries' CA certificates (module docstring); thread-safe."""

    def __init__(self, cert_dir: Optional[str] = None, *, environ: Optional[Mapping[str, str]] = None,
                 system: Sequence[str] = SYSTEM_CERTS_DIRS) -> None:
        self.cert_dir = cert_dir
        env = os.environ if environ is None else environ
        config_home = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        self.roots = [os.path.join(config_home, "containers", "certs.d"), *system]
        self._pem: Dict[str, str] = {}
        self._lock = threading.Lock()

    def check(self) -> None:
        """``--cert-dir``: a folder, its ``*.crt`` readable PEM, before anything is verified or sent."""
        if self.cert_dir is None:
            return
        if not os.path.isdir(self.cert_dir):
            raise UsageError(f"reading --cert-dir {self.cert_dir}: expected a folder of *.crt files, found "
                             f"{'a file' if os.path.exists(self.cert_dir) else 'nothing there'}")
        for path in self.ca_files(""):
            self._read(path)

    def folders(self, host: str) -> List[str]:
        """The folders looked in for ``host``'s CA files."""
        if self.cert_dir is not None:
            return [self.cert_dir]
        if not host or host in (".", "..") or "/" in host or "\\" in host:
            return []
        return [os.path.join(root, host) for root in self.roots]

    def ca_files(self, host: str) -> List[str]:
        """``*.crt`` of :meth:`folders`, each folder's in name order."""
        found: List[str] = []
        for folder in self.folders(host):
            found += sorted(glob.glob(os.path.join(glob.escape(folder), "*.crt")))
        return found

    def _read(self, path: str) -> str:
        with self._lock:
            if path not in self._pem:
                self._pem[path] = _read_pem(path)
            return self._pem[path]

    def context(self, host: str, *, verify: bool) -> ssl.SSLContext:
        """The TLS context for ``host``: the system's CAs and ``host``'s own; ``verify`` False:
        no checks (an insecure registry)."""
        ctx = ssl.create_default_context()
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        for path in self.ca_files(host):
            try:
                ctx.load_verify_locations(cadata=self._read(path))
            except (ssl.SSLError, ValueError) as e:
                raise UsageError(f"reading the CA certificate {path}: expected PEM certificates, found damaged "
                                 f"ones ({e})") from e
        return ctx

    def hint(self, host: str) -> str:
        """What to do when ``host``'s certificate is not trusted."""
        used = self.ca_files(host)
        if self.cert_dir is not None:
            where = f"--cert-dir {self.cert_dir}"
        else:
            where = " or ".join(self.folders(host)) or "a certs.d folder"
        if used:
            return (f"the CA certificates read ({', '.join(used)}) do not sign the registry's certificate, or it "
                    f"names another host; put the registry's CA in {where} as ca.crt")
        return (f"put the registry's CA certificate (PEM) in {where} as ca.crt"
                + ("" if self.cert_dir is not None else ", or pass --cert-dir DIR holding it"))
