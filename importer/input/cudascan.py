"""What a layer shows of an image's CUDA needs, seen in the one streaming pass the export makes
over its uncompressed bytes (docs/gpu-fit.md): the forward-compatibility libraries
(``usr/local/cuda*/compat/libcuda.so.<driver version>``) and torch's CUDA build
(``torch/version.py``: ``cuda = '12.4'``).

:class:`CudaScan` is fed the tar stream chunk by chunk (:meth:`CudaScan.feed`) and only reads
headers; of member data it keeps only a small ``torch/version.py`` (and PAX / GNU long-name
records, bounded). It never raises on bad input: a stream it cannot follow ends the scan, since
the layer's bytes are checked elsewhere (its diff_id)."""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

BLOCK = 512
MAX_KEPT = 64 * 1024  # torch/version.py and long-name records larger than this are skipped
MAX_SEEN = 64  # compat libraries remembered per layer

_COMPAT = re.compile(r"(?:^|/)usr/local/cuda[^/]*/compat/libcuda\.so\.(\d{1,9}(?:\.\d{1,9}){1,3})$")
_TORCH = re.compile(r"(?:^|/)(?:site|dist)-packages/torch/version\.py$")
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*['\"](\d{1,4}\.\d{1,4})['\"]", re.M)
_PAX_PATH = re.compile(rb"(?:^|\n)\d+ path=([^\n]*)\n")


def _octal(field: bytes) -> Optional[int]:
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if field[:1] == b"\x80":  # GNU base-256
        return int.from_bytes(field[1:], "big")
    try:
        return int(text, 8)
    except ValueError:
        return None


class CudaScan:
    """Follows one layer's tar stream; :meth:`result` after the last :meth:`feed`."""

    def __init__(self) -> None:
        self.compat: List[str] = []
        self.torch_cuda: Optional[str] = None
        self._head = b""  # a header block being gathered
        self._skip = 0  # member data (and padding) still to pass
        self._keep: Optional[bytearray] = None  # member data being kept
        self._keep_left = 0
        self._kind = b""  # what is being kept: b"x" PAX, b"L" GNU long name, b"t" torch
        self._next_name: Optional[str] = None
        self._dead = False

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._dead:
            if self._keep is not None:
                n = min(len(view), self._keep_left)
                self._keep += view[:n]
                self._keep_left -= n
                view = view[n:]
                if self._keep_left == 0:
                    self._kept()
            elif self._skip:
                n = min(len(view), self._skip)
                self._skip -= n
                view = view[n:]
            else:
                n = min(len(view), BLOCK - len(self._head))
                self._head += bytes(view[:n])
                view = view[n:]
                if len(self._head) == BLOCK:
                    head, self._head = self._head, b""
                    self._header(head)

    def _header(self, head: bytes) -> None:
        if head == b"\0" * BLOCK:
            return  # end-of-archive blocks
        size = _octal(head[124:136])
        stored = _octal(head[148:156])
        if size is None or stored != sum(head[:148]) + 8 * 32 + sum(head[156:]):
            self._dead = True  # not a tar header where one should be: stop following
            return
        kind = head[156:157]
        name = self._next_name
        self._next_name = None
        if name is None:
            prefix = head[345:500].split(b"\0", 1)[0] if head[257:262] == b"ustar" else b""
            base = head[:100].split(b"\0", 1)[0]
            name = (prefix + b"/" + base if prefix else base).decode("utf-8", "replace")
        padded = -(-size // BLOCK) * BLOCK
        if kind in (b"x", b"L") and size <= MAX_KEPT:
            self._start_keep(kind, size, padded)
            return
        if kind in (b"0", b"\0", b"1", b"2"):
            m = _COMPAT.search(name)
            if m and len(self.compat) < MAX_SEEN and m.group(1) not in self.compat:
                self.compat.append(m.group(1))
            if kind in (b"0", b"\0") and _TORCH.search(name) and 0 < size <= MAX_KEPT:
                self._start_keep(b"t", size, padded)
                return
        self._skip = padded

    def _start_keep(self, kind: bytes, size: int, padded: int) -> None:
        self._kind = kind
        self._keep = bytearray()
        self._keep_left = size
        self._skip = padded - size
        if size == 0:
            self._kept()

    def _kept(self) -> None:
        data, self._keep = bytes(self._keep or b""), None
        if self._kind == b"L":
            self._next_name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
        elif self._kind == b"x":
            m = _PAX_PATH.search(b"\n" + data)
            if m:
                self._next_name = m.group(1).decode("utf-8", "replace")
        else:
            found = _TORCH_CUDA.search(data.decode("utf-8", "replace"))
            if found:
                self.torch_cuda = found.group(1)

    def result(self) -> Tuple[Tuple[str, ...], Optional[str]]:
        """(compat library versions, torch's CUDA) this layer shows."""
        return tuple(self.compat), self.torch_cuda
