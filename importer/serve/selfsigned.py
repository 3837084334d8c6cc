"""``bundle-import serve --tls-self-signed DIR``: a CA and a server certificate for the names the
nodes dial, made with the host's ``openssl`` command (the standard library cannot write X.509).

DIR keeps ``ca.crt``/``ca.key`` across runs (nodes that trust the CA keep trusting it); the server
certificate (``server.crt``/``server.key``, ECDSA P-256, 825 days, subjectAltName = the names) is
made again each run for the names given. Keys are written 0600; every file is written to a temporary
name first and renamed, so a failed run leaves the previous files as they were.

Whoever can write DIR (or ``ca.crt`` in it) can put a CA of theirs before the nodes, and whoever
can read ``ca.key`` can sign certificates they trust: a DIR that another user owns or that
group/others may write, and a ``ca.key`` (or ``ca.crt``) that another user owns, that is not a
regular file, or that group/others may write (the key: read either), are refused before anything
is made or served (:class:`ServeTLSUnsafe`)."""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from typing import List, Sequence

from importer.serve.servetls import ServeTLSError

CA_DAYS = 3650
SERVER_DAYS = 825
OPENSSL_TIMEOUT = 60
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\*\.[A-Za-z0-9.-]{1,250}")
NO_OPENSSL_HINT = ("install openssl (Debian/Ubuntu: apt-get install openssl; RHEL: dnf install openssl), or make "
                   "the pair elsewhere and pass --tls-cert DIR/server.crt --tls-key DIR/server.key: `bundle tls-cert "
                   "DIR --name HOST` on the exporting host, or the openssl commands in docs/fleet.md")


class ServeTLSUnsafe(ServeTLSError):
    """``--tls-self-signed DIR``: DIR, or the CA in it, is open to other users (owned by another
    user, writable by group/others, a key readable by them, a link): refused, nothing was made or
    served. The message says which file and the chmod/chown that fixes it."""

    reference = "serve-tls-unsafe"


@dataclass(frozen=True)
class SelfSigned:
    ca: str
    cert: str
    key: str
    names: List[str]


def san_of(names: Sequence[str]) -> str:
    """``DNS:a,IP:127.0.0.1`` for the names; ServeTLSError for a name that is neither."""
    parts = []
    for name in names:
        try:
            parts.append(f"IP:{ipaddress.ip_address(name.strip('[]'))}")
            continue
        except ValueError:
            pass
        if not _NAME_RE.fullmatch(name):
            raise ServeTLSError(f"reading --tls-name {name!r}: expected a host name or an IP address, found neither",
                                hint="give the name or address the nodes dial, e.g. --tls-name gpu-gw "
                                     "--tls-name 10.0.0.5")
        parts.append(f"DNS:{name}")
    return ",".join(parts)


def _openssl() -> str:
    path = shutil.which("openssl")
    if path is None:
        raise ServeTLSError("making a self-signed certificate (--tls-self-signed): expected an openssl command on "
                            "PATH (the standard library cannot write certificates), found none", hint=NO_OPENSSL_HINT)
    return path


def _run(argv: List[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=OPENSSL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeTLSError(f"{what}: expected openssl to finish, found {e}", hint=NO_OPENSSL_HINT) from e
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ServeTLSError(f"{what}: expected openssl to exit 0, found exit {proc.returncode}: {last[:300]}",
                            hint="openssl 1.1.1 or newer is needed (-addext); " + NO_OPENSSL_HINT)


def _make_ca(openssl: str, tmp: str) -> None:
    _run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", os.path.join(tmp, "ca.key"), "-out", os.path.join(tmp, "ca.crt"), "-days", str(CA_DAYS),
          "-subj", "/CN=sneakernet serve CA", "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], "making the CA of --tls-self-signed")


def _make_server(openssl: str, tmp: str, ca_dir: str, names: Sequence[str]) -> None:
    ext = os.path.join(tmp, "server.ext")
    with open(ext, "w", encoding="utf-8") as f:
        f.write(f"subjectAltName={san_of(names)}\nbasicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    csr = os.path.join(tmp, "server.csr")
    _run([openssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", os.path.join(tmp, "server.key"), "-out", csr, "-subj", f"/CN={names[0][:64]}"],
         "making the server key of --tls-self-signed")
    _run([openssl, "x509", "-req", "-in", csr, "-CA", os.path.join(ca_dir, "ca.crt"),
          "-CAkey", os.path.join(ca_dir, "ca.key"), "-set_serial", str(secrets.randbits(63)),
          "-days", str(SERVER_DAYS), "-extfile", ext, "-out", os.path.join(tmp, "server.crt")],
         "signing the server certificate of --tls-self-signed")


def _refuse(using: str, path: str, found: str, fix: str) -> ServeTLSUnsafe:
    return ServeTLSUnsafe(f"using {using} {path}: expected it private to this user (uid {os.geteuid()}), "
                          f"found {found}", hint=f"{fix}, or pick a folder of your own (it keeps the CA the nodes "
                          "trust; docs/security.md)")


def _unreadable(using: str, path: str, expected: str, err: OSError, hint: str) -> ServeTLSError:
    """The folder or CA file ``path`` could not even be looked at (``stat`` failed)."""
    return ServeTLSError(f"reading {using} {path}: expected {expected}, found {err.strerror or err}", hint=hint)


def check_private(folder: str, using: str = "--tls-self-signed") -> None:
    """ServeTLSUnsafe when ``folder`` or its CA files are open to other users (module docstring);
    nothing when ``folder`` does not exist yet (it is made by this user). ``using`` names the folder's
    option in the messages (``--tls-self-signed``, ``bundle tls-cert``)."""
    me = os.geteuid()
    try:
        st = os.stat(folder)  # a link to a folder: the folder it names is judged
    except FileNotFoundError:
        return
    except OSError as e:
        raise _unreadable(using, folder, "a folder this user can read", e,
                          "pick another folder (it keeps the CA for later runs)") from e
    if not stat.S_ISDIR(st.st_mode):
        raise ServeTLSError(f"reading {using} {folder}: expected a folder, found another kind of file",
                            hint="pick a folder (it keeps the CA for later runs)")
    if st.st_uid != me:
        raise _refuse(using, folder, f"a folder owned by uid {st.st_uid}", f"chown {me} {folder}")
    if st.st_mode & 0o022:
        raise _refuse(using, folder, f"a folder group or others may write (mode {stat.S_IMODE(st.st_mode):04o})",
                      f"chmod go-w {folder}")
    for name, open_bits, what in (("ca.key", 0o077, "read or write"), ("ca.crt", 0o022, "write")):
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise _unreadable(using, path, "a readable file", e, "fix its permissions or remove it") from e
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(using, path, "a link or another kind of file, not a regular file",
                          f"replace it with the file itself (or remove {path} and {os.path.join(folder, 'ca.crt')} "
                          "to make a new CA)")
        if st.st_uid != me:
            raise _refuse(using, path, f"a file owned by uid {st.st_uid}", f"chown {me} {path}")
        if st.st_mode & open_bits:
            fix = f"chmod 644 {path}" if name == "ca.crt" else (
                f"chmod 600 {path} (others could read it: to be safe, remove ca.key and ca.crt for a new CA and "
                "give the nodes the new ca.crt)" if st.st_mode & 0o044 else f"chmod 600 {path}")
            raise _refuse(using, path, f"a file group or others may {what} (mode {stat.S_IMODE(st.st_mode):04o})", fix)


def make_self_signed(folder: str, names: Sequence[str]) -> SelfSigned:
    """The CA of ``folder`` (made when absent) and a new server certificate for ``names``."""
    san_of(names)  # a bad name: refused before anything is written
    folder = os.path.abspath(folder)  # the start lines tell nodes where to copy ca.crt from
    check_private(folder)  # before openssl is looked for: the folder is wrong wherever it is made
    openssl = _openssl()
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tls-", dir=folder)
    except OSError as e:
        raise ServeTLSError(f"writing --tls-self-signed {folder}: expected a folder this user can write, found "
                            f"{e.strerror or e}", hint="pick another folder (it keeps the CA for later runs)") from e
    old_umask = os.umask(0o077)
    try:
        have_ca = all(os.path.isfile(os.path.join(folder, n)) for n in ("ca.crt", "ca.key"))
        if not have_ca:
            _make_ca(openssl, tmp)
        _make_server(openssl, tmp, folder if have_ca else tmp, names)
        for name in ("ca.crt", "server.crt"):
            if os.path.exists(os.path.join(tmp, name)):
                os.chmod(os.path.join(tmp, name), 0o644)  # certificates are public; keys stay 0600
        for name in ([] if have_ca else ["ca.key", "ca.crt"]) + ["server.key", "server.crt"]:
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
    finally:
        os.umask(old_umask)
        shutil.rmtree(tmp, ignore_errors=True)
    return SelfSigned(ca=os.path.join(folder, "ca.crt"), cert=os.path.join(folder, "server.crt"),
                      key=os.path.join(folder, "server.key"), names=list(names))
