"""The TLS, auth and node-config options of ``bundle-import serve`` (importer/cli/serve.py): their
parsing, the server's TLS context and users, the start lines that say where each node puts the CA
and what to pull, and ``--print-node-config`` (importer/serve/nodeconfig.py)."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from importer.errors import UsageError
from importer.format.text import printable
from importer.input.opened import OpenedBundle
from importer.serve.htpasswd import Htpasswd
from importer.serve.nodeconfig import CONTAINERD_DIR, DOCKER_DIR, PODMAN_DIR, node_config
from importer.serve.selfsigned import make_self_signed
from importer.serve.serve import parse_listen
from importer.serve.servetls import ServeTLSError, server_context, tls_names_default


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS and auth (docs/fleet.md, \"Serve over TLS\")")
    g.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (chain), PEM; with --tls-key")
    g.add_argument("--tls-key", metavar="PEM", help="the unencrypted PEM private key of --tls-cert")
    g.add_argument("--tls-self-signed", metavar="DIR",
                   help="serve HTTPS with a certificate made by the host's openssl: DIR keeps a CA (ca.crt, made "
                        "once) and a server certificate for the --tls-name names; the start lines say where each "
                        "node puts ca.crt")
    g.add_argument("--tls-name", action="append", default=[], metavar="NAME",
                   help="a host name or IP the nodes dial (repeatable; default: the listen address or this "
                        "host's name, localhost, 127.0.0.1, ::1)")
    g.add_argument("--htpasswd", metavar="FILE",
                   help="require Basic auth: USER:$pbkdf2-sha256$... or USER:{SSHA}... lines (bcrypt is refused: "
                        "the standard library cannot check it)")
    n = p.add_argument_group("node configuration")
    n.add_argument("--print-node-config", action="store_true",
                   help="print the containerd hosts.toml, Docker daemon.json/certs.d and podman registries.conf "
                        "that make nodes pull the bundle's images under their original names from this server "
                        "(or --node-registry), then exit without serving")
    n.add_argument("--node-registry", metavar="HOST:PORT[/PREFIX]",
                   help="the registry the nodes pull from (default: this server's address); https unless it "
                        "starts with http://")
    n.add_argument("--node-ca", metavar="FILE", help="the CA certificate the nodes trust for --node-registry")


@dataclass
class Security:
    tls: Optional[ssl.SSLContext]
    ca: Optional[str]
    names: List[str]
    htpasswd: Optional[Htpasswd]


def _host_for_nodes(listen: str, names: List[str]) -> str:
    """The host part nodes dial: the listen address, else (a wildcard) the first --tls-name or this host's name."""
    host = parse_listen(listen)[0]
    if host not in ("0.0.0.0", "::"):  # noqa: S104 (a wildcard, compared)
        return f"[{host}]" if ":" in host else host
    for name in names:
        if name not in ("localhost", "127.0.0.1", "::1"):
            return f"[{name}]" if ":" in name else name
    return socket.gethostname() or "localhost"


def security(args: argparse.Namespace) -> Security:
    """Checks the options go together, then loads (or makes) the certificate and the users."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ServeTLSError("reading --tls-cert/--tls-key: expected both (a certificate and its key), found one",
                            hint="pass both, or --tls-self-signed DIR to make a pair")
    if args.tls_self_signed and args.tls_cert:
        raise ServeTLSError("reading --tls-self-signed with --tls-cert: expected one way to get a certificate, "
                            "found both", hint="drop one of them")
    if args.tls_name and not args.tls_self_signed:
        raise ServeTLSError("reading --tls-name: expected it with --tls-self-signed DIR (the names go into the "
                            "certificate it makes), found no --tls-self-signed", hint="add --tls-self-signed DIR")
    users = Htpasswd(args.htpasswd) if args.htpasswd else None
    if args.tls_self_signed:
        host = parse_listen(args.listen)[0]
        names = list(dict.fromkeys(args.tls_name)) or list(tls_names_default(host, socket.gethostname()))
        made = make_self_signed(args.tls_self_signed, names)
        return Security(server_context(made.cert, made.key), made.ca, names, users)
    if args.tls_cert:
        return Security(server_context(args.tls_cert, args.tls_key), None, [], users)
    return Security(None, None, [], users)


def ca_places(hostport: str) -> Dict[str, str]:
    """Where each engine on a node looks for the CA of the registry ``hostport``."""
    return {"docker": f"{DOCKER_DIR}/{hostport}/ca.crt",
            "containerd": f"{CONTAINERD_DIR}/{hostport}/hosts.toml",
            "podman": f"{PODMAN_DIR}/{hostport}/ca.crt"}


def start_info(sec: Security, address: str, listen: str, first_repo: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The --json start line's TLS/auth part and the pull command to paste on a node."""
    port = address.rsplit(":", 1)[1]
    node_addr = f"{_host_for_nodes(listen, sec.names)}:{port}"
    tag = (first_repo["tags"] or ["latest"])[0] if first_repo else "TAG"
    info: Dict[str, Any] = {
        "pull": f"docker pull {node_addr}/{first_repo['name'] if first_repo else 'REPO'}:{tag}",
        "nodeAddress": node_addr, "auth": "basic" if sec.htpasswd else None, "tls": None}
    if sec.tls is not None:
        info["tls"] = {"ca": sec.ca, "names": sec.names, "nodeCA": ca_places(node_addr) if sec.ca else None}
    return info


def start_lines(info: Dict[str, Any]) -> List[str]:
    lines = [f"  pull on a node: {info['pull']}"]
    tls = info["tls"]
    if tls and tls["ca"]:
        places = tls["nodeCA"]
        lines += [f"  each node trusts {tls['ca']} (certificate names: {', '.join(tls['names'])}):",
                  f"    Docker: copy it to {places['docker']}",
                  f"    containerd: {places['containerd']} with  ca = \"{places['containerd'][:-10]}ca.crt\"  "
                  "(and the CA there); ctr: --hosts-dir",
                  f"    podman: copy it to {places['podman']} (or --cert-dir)",
                  "  (--print-node-config prints every file)"]
    if info["auth"]:
        lines.append("  Basic auth: nodes log in first (docker login / podman login / ctr --user)")
    return lines


def print_node_config(bundle: OpenedBundle, args: argparse.Namespace, sec: Security) -> int:
    manifest = bundle.manifest()
    refs = [ref for image in manifest.images for ref in image.refs]
    if args.node_registry:
        scheme, sep, mirror = str(args.node_registry).partition("://")
        if not sep:
            scheme, mirror = "https", scheme
        if scheme not in ("http", "https") or not mirror or mirror.startswith("/"):
            raise UsageError(f"reading --node-registry {args.node_registry!r}: expected [http://|https://]HOST:PORT"
                             f"[/PREFIX], found {args.node_registry!r}",
                             hint="--node-registry registry.internal:5000/team (https unless http:// is given)")
        ca = args.node_ca or sec.ca
    else:
        port = parse_listen(args.listen)[1]
        if port == 0:
            raise UsageError("printing the node configuration: expected a fixed --listen port (the nodes dial it), "
                             "found port 0", hint="pass --listen ADDR:PORT with the port the server will use")
        mirror = f"{_host_for_nodes(args.listen, sec.names)}:{port}"
        scheme, ca = ("https" if sec.tls is not None else "http"), sec.ca
    cfg = node_config(refs, mirror, scheme, ca)
    if args.json:
        sys.stdout.write(json.dumps(cfg.to_dict()) + "\n")
    else:
        sys.stdout.write("\n".join(printable(line) for line in cfg.lines()) + "\n")
    sys.stdout.flush()
    return 0
