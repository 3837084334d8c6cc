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
:data:`MAX_CA_FILE` bytes, PEM certificates; one that is not is a UsageError naming it.

Client certificates (a registry that wants mutual TLS), in the same folders, by the same rule as
containers-certs.d(5): ``NAME.cert`` is a client certificate and ``NAME.key`` its private key
(Docker's ``client.cert``/``client.key``); one without the other is a UsageError naming it, as
skopeo refuses it. They are presented with or without ``--insecure``."""

from __future__ import annotations

import glob
import os
import ssl
import stat
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from importer.errors import UsageError

MAX_CA_FILE = 1024 * 1024
SYSTEM_CERTS_DIRS = ("/etc/containers/certs.d", "/etc/docker/certs.d")


def _read_pem(path: str, what: str = "the CA certificate", marker: str = "CERTIFICATE-----") -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UsageError(f"reading {what} {path}: expected a readable file, found {e.strerror or e}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"reading {what} {path}: expected a regular file, found "
                             f"{'a FIFO' if stat.S_ISFIFO(st.st_mode) else 'a special file'}")
        raw = f.read(MAX_CA_FILE + 1)
    if len(raw) > MAX_CA_FILE:
        raise UsageError(f"reading {what} {path}: expected at most {MAX_CA_FILE} bytes, found more")
    text = raw.decode("ascii", "replace")
    if "-----BEGIN " not in text or marker not in text:
        raise UsageError(f"reading {what} {path}: expected PEM ({marker.rstrip('-')}), found none",
                         hint="a certificate or key file of certs.d is PEM: -----BEGIN ...")
    return text


def _load_client_pair(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    """``cert`` and ``key`` (checked as hostile files first: regular, bounded, PEM) as this context's
    client certificate."""
    _read_pem(cert, "the client certificate")
    _read_pem(key, "the client key", "PRIVATE KEY-----")
    try:
        ctx.load_cert_chain(cert, key, password=lambda: b"")  # never a prompt for an encrypted key
    except (ssl.SSLError, ValueError, OSError) as e:
        raise UsageError(f"reading the client certificate {cert} and key {key}: expected a PEM certificate and "
                         f"its unencrypted private key, found {getattr(e, 'reason', None) or e}",
                         hint="containers-certs.d(5): NAME.cert with NAME.key, the key unencrypted") from e


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
        """``--cert-dir``: a folder, its ``*.crt`` readable PEM and its client pairs usable, before
        anything is verified or sent."""
        if self.cert_dir is None:
            return
        if not os.path.isdir(self.cert_dir):
            raise UsageError(f"reading --cert-dir {self.cert_dir}: expected a folder of *.crt files, found "
                             f"{'a file' if os.path.exists(self.cert_dir) else 'nothing there'}")
        for path in self.ca_files(""):
            self._read(path)
        for cert, key in self.client_pairs(""):
            _load_client_pair(ssl.create_default_context(), cert, key)

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

    def client_pairs(self, host: str) -> List[Tuple[str, str]]:
        """``(NAME.cert, NAME.key)`` of :meth:`folders`; a ``.cert`` without its ``.key`` or a ``.key``
        without its ``.cert`` is a UsageError (containers-certs.d(5))."""
        pairs: List[Tuple[str, str]] = []
        for folder in self.folders(host):
            certs = sorted(glob.glob(os.path.join(glob.escape(folder), "*.cert")))
            keys = set(glob.glob(os.path.join(glob.escape(folder), "*.key")))
            for cert in certs:
                key = cert[:-len(".cert")] + ".key"
                if key not in keys:
                    raise UsageError(f"reading the client certificate {cert}: expected its key {key} beside it, "
                                     "found none", hint="put the private key there, or remove the certificate")
                keys.discard(key)
                pairs.append((cert, key))
            for key in sorted(keys):
                raise UsageError(f"reading the client key {key}: expected its certificate "
                                 f"{key[:-len('.key')]}.cert beside it, found none",
                                 hint="put the client certificate there, or remove the key")
        return pairs

    def _read(self, path: str) -> str:
        with self._lock:
            if path not in self._pem:
                self._pem[path] = _read_pem(path)
            return self._pem[path]

    def context(self, host: str, *, verify: bool) -> ssl.SSLContext:
        """The TLS context for ``host``: the system's CAs and ``host``'s own; ``verify`` False:
        no checks (an insecure registry)."""
        ctx = ssl.create_default_context()
        for cert, key in self.client_pairs(host):  # mutual TLS, checked or not
            _load_client_pair(ctx, cert, key)
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

    def client_hint(self, host: str) -> str:
        """What to do when ``host`` wants a client certificate (mutual TLS)."""
        pairs = self.client_pairs(host)
        where = f"--cert-dir {self.cert_dir}" if self.cert_dir is not None else \
            (" or ".join(self.folders(host)) or "a certs.d folder")
        if pairs:
            return (f"the client certificate presented ({pairs[0][0]}) is not one the registry accepts; put one "
                    f"its CA signed in {where} as client.cert with its key client.key")
        return f"put the client certificate and its key (PEM) in {where} as client.cert and client.key"

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
