"""Public key files given on the command line (``--trust``, ``--require-signed``): read without
blocking or following a FIFO, a device or a folder, within a size bound, and their points checked
to lie on the curve before a verifier sees them. A key that is no key is an InvalidKey at once,
never a hang, never ``internal`` (a verifier handed a point off the curve raises ValueError).

The point checks are the curves' own equations, in plain Python (no third-party module on the
offline side): P-256 (SEC 1 section 2.3.4: an uncompressed point ``04 || X || Y`` with X, Y < p
and ``Y^2 = X^3 - 3X + b mod p``) and Ed25519 (RFC 8032 section 5.1.3: y < p and the
decompression finds an x, with x = 0 and the sign bit set refused)."""

from __future__ import annotations

import errno
import os
import stat

from importer.errors import UsageError

# P-256 (FIPS 186-4 D.1.2.3)
_P256_P = 2**256 - 2**224 + 2**192 + 2**96 - 1
_P256_B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
# Ed25519 (RFC 8032 section 5.1)
_ED_P = 2**255 - 19
_ED_D = (-121665 * pow(121666, _ED_P - 2, _ED_P)) % _ED_P


class InvalidKey(UsageError):
    """A key file given on the command line cannot be used."""

    reference = "invalid-key"


def read_key_file(path: str, limit: int, what: str, hint: str) -> bytes:
    """The bytes of the key file ``path`` (links followed: the user named it), refusing at once
    what is not a regular file (a FIFO is opened non-blocking and never read) or is larger than
    ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        found = "a folder" if e.errno == errno.EISDIR else (e.strerror or str(e))
        raise InvalidKey(f"reading {what} {path}: expected a readable file, found {found}", hint=hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
            raise InvalidKey(f"reading {what} {path}: expected a regular file, found {kind}", hint=hint)
        if st.st_size > limit:
            raise InvalidKey(f"reading {what} {path}: expected at most {limit} bytes, found {st.st_size}",
                             hint=hint)
        chunks = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise InvalidKey(f"reading {what} {path}: expected a readable file, found {e.strerror or e}",
                         hint=hint) from None
    finally:
        os.close(fd)
    if total > limit:
        raise InvalidKey(f"reading {what} {path}: expected at most {limit} bytes, found more", hint=hint)
    return b"".join(chunks)


def p256_point_ok(point: bytes) -> bool:
    """An uncompressed P-256 point (65 bytes, 0x04 first) on the curve."""
    if len(point) != 65 or point[0] != 4:
        return False
    x, y = int.from_bytes(point[1:33], "big"), int.from_bytes(point[33:], "big")
    if x >= _P256_P or y >= _P256_P:
        return False
    return (y * y - (x * x * x - 3 * x + _P256_B)) % _P256_P == 0


def ed25519_point_ok(raw: bytes) -> bool:
    """A 32-byte Ed25519 public key that decodes to a point (RFC 8032 5.1.3)."""
    if len(raw) != 32:
        return False
    n = int.from_bytes(raw, "little")
    sign, y = n >> 255, n & ((1 << 255) - 1)
    if y >= _ED_P:
        return False
    u, v = (y * y - 1) % _ED_P, (_ED_D * y * y + 1) % _ED_P
    x = (u * pow(v, 3, _ED_P) * pow(u * pow(v, 7, _ED_P), (_ED_P - 5) // 8, _ED_P)) % _ED_P
    vx2 = (v * x * x) % _ED_P
    if vx2 != u:
        if vx2 != (-u) % _ED_P:
            return False
        x = (x * pow(2, (_ED_P - 1) // 4, _ED_P)) % _ED_P
    return not (x == 0 and sign == 1)
