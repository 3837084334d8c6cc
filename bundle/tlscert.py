"""``bundle tls-cert DIR --name HOST``: the CA and server certificate ``bundle-import serve`` needs
for TLS, made with the ``cryptography`` module for offline hosts without an ``openssl`` command
(``serve --tls-self-signed`` makes the same files with openssl there). The layout is serve's:
``DIR/ca.crt``, ``DIR/ca.key`` (made once, kept), ``DIR/server.crt``, ``DIR/server.key`` (new each
run, ECDSA P-256, subjectAltName = the names); keys 0600, every file written under a temporary name
and renamed. On the serving host: ``bundle-import serve BUNDLE --tls-cert DIR/server.crt --tls-key
DIR/server.key``."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
import sys
from typing import Any, List, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from importer.cli.output import emit, success
from importer.serve.selfsigned import CA_DAYS, SERVER_DAYS, check_private, san_of
from importer.serve.servetls import ServeTLSError


def add_tls_command(sub: Any) -> None:
    t = sub.add_parser("tls-cert", help="make a CA and a server certificate for `bundle-import serve` "
                       "(--tls-cert/--tls-key) on a host with the cryptography module")
    t.add_argument("folder", metavar="DIR", help="where ca.crt/ca.key (kept when present) and server.crt/server.key go")
    t.add_argument("--name", action="append", required=True, metavar="NAME",
                   help="a host name or IP address the nodes dial (repeatable)")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.set_defaults(handler=cmd_tls_cert)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load_or_make_ca(folder: str) -> Tuple[ec.EllipticCurvePrivateKey, x509.Certificate, bool]:
    crt, key = os.path.join(folder, "ca.crt"), os.path.join(folder, "ca.key")
    if os.path.isfile(crt) and os.path.isfile(key):
        try:
            with open(key, "rb") as f:
                ca_key = serialization.load_pem_private_key(f.read(), None)
            with open(crt, "rb") as f:
                ca_cert = x509.load_pem_x509_certificate(f.read())
        except (ValueError, TypeError, OSError) as e:
            raise ServeTLSError(f"reading the CA in {folder}: expected the unencrypted PEM ca.key and ca.crt a "
                                f"previous run wrote, found {e}", hint="move them away to make a new CA") from e
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ServeTLSError(f"reading {key}: expected an EC key, found {type(ca_key).__name__}",
                                hint="move ca.key/ca.crt away to make a new CA")
        return ca_key, ca_cert, True
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sneakernet serve CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
               .serial_number(secrets.randbits(63)).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                              critical=True)
               .sign(ca_key, hashes.SHA256()))
    return ca_key, ca_cert, False


def _server(names: List[str], ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
            ) -> Tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    alt: List[x509.GeneralName] = []
    for item in san_of(names).split(","):
        kind, _, value = item.partition(":")
        alt.append(x509.IPAddress(ipaddress.ip_address(value)) if kind == "IP" else x509.DNSName(value))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(secrets.randbits(63))
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def cmd_tls_cert(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.name))
    san_of(names)  # a bad name: refused before anything is written
    folder = os.path.abspath(args.folder)
    check_private(folder, "bundle tls-cert")  # it keeps the CA key the nodes trust, as --tls-self-signed's
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as e:
        raise ServeTLSError(f"writing {folder}: expected a folder this user can write, found {e.strerror or e}",
                            hint="pick another DIR") from e
    ca_key, ca_cert, reused = _load_or_make_ca(folder)
    key, cert = _server(names, ca_key, ca_cert)
    pem = serialization.Encoding.PEM
    if not reused:
        _write(os.path.join(folder, "ca.key"), _pem_key(ca_key), 0o600)
        _write(os.path.join(folder, "ca.crt"), ca_cert.public_bytes(pem), 0o644)
    _write(os.path.join(folder, "server.key"), _pem_key(key), 0o600)
    _write(os.path.join(folder, "server.crt"), cert.public_bytes(pem), 0o644)
    doc = {"ca": os.path.join(folder, "ca.crt"), "cert": os.path.join(folder, "server.crt"),
           "key": os.path.join(folder, "server.key"), "names": names, "caReused": reused}
    if args.json:
        emit(success(doc))
    else:
        sys.stdout.write(f"wrote {doc['cert']} and {doc['key']} for {', '.join(names)}, signed by "
                         f"{'the kept' if reused else 'a new'} CA {doc['ca']}\n"
                         f"serve with: bundle-import serve BUNDLE --tls-cert {doc['cert']} --tls-key {doc['key']}\n")
    return 0
