"""How a command reaches a registry: its logins (importer/registry/logins.py), its CA certificates
(importer/registry/certs.py), ``--insecure`` and ``--allow-realm-credentials``; the options that
name them, the same on every command that talks to a registry (``bundle export docker://``,
``bundle push``, ``bundle-import --engine registry`` and ``--inventory --registry``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Optional

from importer.errors import UsageError
from importer.registry.auth import Credentials
from importer.registry.certs import CertDirs
from importer.registry.logins import Logins

REALM_HELP = ("a registry login also goes to its token service (the WWW-Authenticate realm) when that is on "
              "another host or port, over HTTPS only (default: not sent there; docs/security.md)")


@dataclass
class RegistryAccess:
    """One command's way into its registries."""

    logins: Logins = field(default_factory=Logins)
    certs: CertDirs = field(default_factory=CertDirs)
    insecure: bool = False  # --insecure: no certificate checks (HTTPS, else plain HTTP)
    realm_credentials: bool = False  # --allow-realm-credentials

    def named(self) -> bool:
        """Any option that only a registry reads was given."""
        return (self.insecure or self.realm_credentials or self.logins.flags is not None
                or (self.logins.named is not None and self.logins.named[1] == "--authfile")
                or self.certs.cert_dir is not None)


def add_access_arguments(p: argparse.ArgumentParser, scope: str = "") -> None:
    """``--insecure --username --password-stdin --authfile --cert-dir --allow-realm-credentials``
    (``scope``: the help's prefix, e.g. "docker:// sources: ")."""
    p.add_argument("--insecure", action="store_true",
                   help=scope + "HTTPS without certificate checks, else plain HTTP (the default for a registry on "
                   "127.0.0.0/8 or localhost with no CA of its own)")
    p.add_argument("--username", metavar="USER",
                   help=scope + "registry user, with --password-stdin (default: the login files, --authfile)")
    p.add_argument("--password-stdin", action="store_true", help=scope + "read the registry password from stdin")
    p.add_argument("--authfile", metavar="FILE",
                   help=scope + "read logins from FILE only (podman/skopeo auth.json or Docker config.json; default: "
                   "$REGISTRY_AUTH_FILE, else $XDG_RUNTIME_DIR/containers/auth.json, "
                   "~/.config/containers/auth.json, ~/.docker/config.json and their credential helpers)")
    p.add_argument("--cert-dir", metavar="DIR",
                   help=scope + "trust the CA certificates DIR/*.crt and present the client certificates "
                   "DIR/NAME.cert + NAME.key (default: certs.d/HOST:PORT/ in ~/.config/containers, /etc/containers "
                   "and /etc/docker)")
    p.add_argument("--allow-realm-credentials", action="store_true", help=scope + REALM_HELP)


def credentials_from_args(args: argparse.Namespace) -> Optional[Credentials]:
    """``--username`` + ``--password-stdin`` (one line); None: the login files or anonymous."""
    if not getattr(args, "username", None):
        if getattr(args, "password_stdin", False):
            raise UsageError("reading credentials: expected --username with --password-stdin, found none")
        return None
    if not getattr(args, "password_stdin", False):
        raise UsageError("reading credentials: expected --password-stdin with --username, found none",
                         hint="pipe the password: echo \"$PASSWORD\" | ... --username USER --password-stdin")
    if getattr(args, "passphrase_stdin", False):
        raise UsageError("reading stdin: expected one of --password-stdin and --passphrase-stdin, found both",
                         hint="put the registry login in a file instead: --authfile FILE")
    password = sys.stdin.readline().rstrip("\r\n")
    return Credentials(args.username, password, source="--username/--password-stdin")


def access_from_args(args: argparse.Namespace) -> RegistryAccess:
    """The options of :func:`add_access_arguments`, checked now (a login file or CA folder that
    cannot be used fails before anything is verified or sent)."""
    access = RegistryAccess(Logins(credentials_from_args(args), getattr(args, "authfile", None)),
                            CertDirs(getattr(args, "cert_dir", None)), insecure=bool(getattr(args, "insecure", False)),
                            realm_credentials=bool(getattr(args, "allow_realm_credentials", False)))
    if getattr(args, "authfile", None):  # $REGISTRY_AUTH_FILE: when a registry first wants a login
        access.logins.check()
    access.certs.check()
    return access
