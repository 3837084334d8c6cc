"""A zstd decoder in pure Python (stdlib only, Python 3.8+): the last fallback of
:mod:`importer.streams.compression`, so a bundle imports on a host with nothing but python3.

It decodes Zstandard frames as RFC 8878 describes them: raw, RLE and compressed blocks, raw,
RLE, Huffman and treeless literals (one or four streams), FSE-coded sequences (predefined, RLE,
FSE and repeat modes), repeat offsets, concatenated and skippable frames. Not supported:
dictionaries (a frame that names one is refused) and windows above 128 MiB (2^27, the zstd
command's own default limit; our exporter writes 8 MiB at most).

Streaming with bounded memory: the decoder keeps the frame's window of history (at most twice
the window plus one block) and hands out one block at a time; it never holds a whole layer.
The frame's optional XXH64 content checksum is read but not verified: every layer's sha256
(its diff_id) is checked on the decompressed bytes anyway (importer/input/layers.py).

Speed: a few MB/s (docs/benchmarks.md); the hot loops read bits from a string of '0'/'1'
characters (``bin()`` of the backward bitstream), which CPython slices and parses in C.

Damaged input raises :class:`ZstdFormatError` (a ValueError), never hangs: every step consumes
input or produces bounded output.
"""

from __future__ import annotations

from typing import Any, Dict, Generator, Iterator, List, Optional, Tuple

MAGIC = 0xFD2FB528
MAX_WINDOW = 1 << 27
BLOCK_MAX = 128 * 1024


class ZstdFormatError(ValueError):
    """The input is not a zstd stream this decoder can read."""


# --- code tables (RFC 8878 3.1.1.3.2.1.1) --------------------------------------------------

LL_BASE = [*range(16), 16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096,
           8192, 16384, 32768, 65536]
LL_BITS = [0] * 16 + [1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
ML_BASE = [*range(3, 35), 35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051,
           4099, 8195, 16387, 32771, 65539]
ML_BITS = [0] * 32 + [1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]

LL_DEFAULT = [4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1,
              1, 1, 1, 1, -1, -1, -1, -1]
ML_DEFAULT = [1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
              1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1]
OF_DEFAULT = [1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1,
              -1, -1]

# A sequence table state: (value base, extra bits, extra bits mask, state bits, state mask,
# next state base, extra + state bits).
SeqTable = List[Tuple[int, int, int, int, int, int, int]]


def _fail(msg: str) -> ZstdFormatError:
    return ZstdFormatError(msg)


def _backward_bits(data: bytes) -> str:
    """The bits of a backward bitstream in reading order, as a '0'/'1' string (the final byte's
    highest set bit is the start marker and is dropped)."""
    if not data or data[-1] == 0:
        raise _fail("bitstream without its end marker")
    return bin(int.from_bytes(data, "little"))[3:]


# --- FSE ------------------------------------------------------------------------------------

def read_ncount(data: bytes, pos: int, max_symbol: int, max_log: int) -> Tuple[List[int], int, int]:
    """Read an FSE table description at ``data[pos:]``: (normalized counts, accuracy log,
    position after it)."""
    chunk = data[pos:pos + 512]
    if not chunk:
        raise _fail("FSE table description missing")
    bits = int.from_bytes(chunk, "little")
    nbits_total = len(chunk) * 8
    log = (bits & 15) + 5
    if log > max_log:
        raise _fail(f"FSE accuracy log {log} above {max_log}")
    bp = 4
    remaining = (1 << log) + 1
    threshold = 1 << log
    nb = log + 1
    counts: List[int] = []
    prev0 = False
    while remaining > 1 and len(counts) <= max_symbol:
        if prev0:
            while True:
                rep = (bits >> bp) & 3
                bp += 2
                counts.extend([0] * rep)
                if rep != 3:
                    break
                if bp > nbits_total:
                    raise _fail("FSE table description truncated")
            if len(counts) > max_symbol:
                raise _fail("FSE table description names too many symbols")
        mx = (2 * threshold - 1) - remaining
        low = (bits >> bp) & (threshold - 1)
        if low < mx:
            count = low
            bp += nb - 1
        else:
            count = (bits >> bp) & (2 * threshold - 1)
            if count >= threshold:
                count -= mx
            bp += nb
        count -= 1
        remaining -= -count if count < 0 else count
        counts.append(count)
        prev0 = count == 0
        while remaining < threshold:
            nb -= 1
            threshold >>= 1
        if bp > nbits_total:
            raise _fail("FSE table description truncated")
    if remaining != 1 or len(counts) > max_symbol + 1:
        raise _fail("FSE table description is inconsistent")
    return counts, log, pos + (bp + 7) // 8


def build_fse(counts: List[int], log: int) -> List[Tuple[int, int, int]]:
    """Decoding table: per state (symbol, bits to read, next state base)."""
    size = 1 << log
    symbols = [0] * size
    high = size - 1
    nxt = [0] * len(counts)
    for s, c in enumerate(counts):
        if c == -1:
            symbols[high] = s
            high -= 1
            nxt[s] = 1
        else:
            nxt[s] = c
    step = (size >> 1) + (size >> 3) + 3
    mask = size - 1
    pos = 0
    for s, c in enumerate(counts):
        for _ in range(c if c > 0 else 0):
            symbols[pos] = s
            pos = (pos + step) & mask
            while pos > high:
                pos = (pos + step) & mask
    if pos != 0:
        raise _fail("FSE table does not fill its states")
    table = []
    for u in range(size):
        s = symbols[u]
        n = nxt[s]
        nxt[s] = n + 1
        nb = log - (n.bit_length() - 1)
        table.append((s, nb, (n << nb) - size))
    return table


def _seq_table(fse: List[Tuple[int, int, int]], base: List[int], extra: List[int]) -> SeqTable:
    out: SeqTable = []
    for s, nb, nx in fse:
        if s >= len(base):
            raise _fail("sequence code out of range")
        e = extra[s]
        out.append((base[s], e, (1 << e) - 1, nb, (1 << nb) - 1, nx, e + nb))
    return out


OF_BASE = [1 << i for i in range(32)]
OF_BITS = list(range(32))


def _predefined() -> Tuple[SeqTable, SeqTable, SeqTable]:
    return (_seq_table(build_fse(LL_DEFAULT, 6), LL_BASE, LL_BITS),
            _seq_table(build_fse(OF_DEFAULT, 5), OF_BASE, OF_BITS),
            _seq_table(build_fse(ML_DEFAULT, 6), ML_BASE, ML_BITS))


_PREDEFINED: Optional[Tuple[SeqTable, SeqTable, SeqTable]] = None


# --- Huffman --------------------------------------------------------------------------------

def _fse_weights(data: bytes) -> List[int]:
    """Huffman weights compressed with FSE (two interleaved states)."""
    counts, log, pos = read_ncount(data, 0, 255, 6)
    table = build_fse(counts, log)
    s = _backward_bits(data[pos:])
    total = len(s)
    s += "0" * 16
    p = 2 * log
    if p > total:
        raise _fail("Huffman weights stream too short")
    st1 = int(s[0:log], 2)
    st2 = int(s[log:p], 2)
    out: List[int] = []
    while True:
        sym, nb, nx = table[st1]
        out.append(sym)
        st1 = nx + (int(s[p:p + nb], 2) if nb else 0)
        p += nb
        if p > total:
            out.append(table[st2][0])
            break
        sym, nb, nx = table[st2]
        out.append(sym)
        st2 = nx + (int(s[p:p + nb], 2) if nb else 0)
        p += nb
        if p > total:
            out.append(table[st1][0])
            break
        if len(out) > 255:
            raise _fail("too many Huffman weights")
    return out


class Huffman:
    """A literals decoding table: bit-string window -> (decoded bytes, bits used)."""

    def __init__(self, weights: List[int]) -> None:
        if len(weights) > 255:
            raise _fail("too many Huffman weights")
        total = 0
        for w in weights:
            if w > 11:
                raise _fail("Huffman weight above 11")
            if w:
                total += 1 << (w - 1)
        if total == 0:
            raise _fail("Huffman weights all zero")
        max_bits = total.bit_length()
        rest = (1 << max_bits) - total
        if rest & (rest - 1):
            raise _fail("Huffman weights do not complete a tree")
        weights = [*weights, rest.bit_length()]
        if max_bits > 11:
            raise _fail("Huffman code longer than 11 bits")
        # Single-symbol table indexed by the next max_bits bits (RFC 8878 4.2.1.3).
        rank_count = [0] * (max_bits + 2)
        for w in weights:
            rank_count[w] += 1
        rank_start = [0] * (max_bits + 2)
        nxt = 0
        for w in range(1, max_bits + 1):
            rank_start[w] = nxt
            nxt += rank_count[w] << (w - 1)
        size = 1 << max_bits
        sym_of = [0] * size
        len_of = [0] * size
        for sym, w in enumerate(weights):
            if w:
                n = (1 << w) >> 1
                st = rank_start[w]
                nbits = max_bits + 1 - w
                for i in range(st, st + n):
                    sym_of[i] = sym
                    len_of[i] = nbits
                rank_start[w] = st + n
        # Multi-symbol table: every whole code that fits in the window, decoded at once.
        self.width = width = max_bits
        mask = size - 1
        table: Dict[str, Tuple[bytes, int]] = {}
        fmt = f"0{width}b"
        for v in range(size):
            used = len_of[v]
            syms = [sym_of[v]]
            while True:
                w2 = (v << used) & mask
                nb = len_of[w2]
                if used + nb > width:
                    break
                syms.append(sym_of[w2])
                used += nb
            table[format(v, fmt)] = (bytes(syms), used)
        self.table = table

    def decode_stream(self, data: bytes, count: int) -> bytes:
        s = _backward_bits(data)
        total = len(s)
        width = self.width
        s += "0" * width
        table = self.table
        parts: List[bytes] = []
        append = parts.append
        p = 0
        while p < total:
            chunk, nb = table[s[p:p + width]]
            append(chunk)
            p += nb
        out = b"".join(parts)
        if len(out) < count:
            raise _fail("Huffman stream shorter than its literals")
        return out[:count]


def read_huffman(data: bytes, pos: int) -> Tuple[Huffman, int]:
    if pos >= len(data):
        raise _fail("Huffman tree description missing")
    hb = data[pos]
    pos += 1
    if hb < 128:
        if pos + hb > len(data):
            raise _fail("Huffman tree description truncated")
        weights = _fse_weights(data[pos:pos + hb])
        pos += hb
    else:
        n = hb - 127
        nbytes = (n + 1) // 2
        raw = data[pos:pos + nbytes]
        if len(raw) < nbytes:
            raise _fail("Huffman tree description truncated")
        weights = []
        for b in raw:
            weights.append(b >> 4)
            weights.append(b & 15)
        weights = weights[:n]
        pos += nbytes
    return Huffman(weights), pos


# --- frames and blocks ----------------------------------------------------------------------

class _Input:
    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def read(self, n: int) -> bytes:
        parts = []
        left = n
        while left > 0:
            data = self._raw.read(left)
            if not data:
                break
            parts.append(bytes(data))
            left -= len(data)
        return b"".join(parts)

    def need(self, n: int, what: str) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise _fail(f"zstd stream truncated in {what}")
        return data


class _FrameState:
    def __init__(self) -> None:
        self.huffman: Optional[Huffman] = None
        self.tables: List[Optional[SeqTable]] = [None, None, None]  # LL, OF, ML
        self.reps = [1, 4, 8]


def iter_decompress(raw: Any) -> Generator[bytes, None, None]:
    """Yield the decompressed bytes of every frame read from ``raw`` (a file-like object)."""
    inp = _Input(raw)
    while True:
        head = inp.read(4)
        if not head:
            return
        if len(head) < 4:
            raise _fail("zstd stream truncated in a frame's magic number")
        magic = int.from_bytes(head, "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:
            size = int.from_bytes(inp.need(4, "a skippable frame"), "little")
            while size > 0:
                got = len(inp.read(min(size, BLOCK_MAX)))
                if not got:
                    raise _fail("zstd stream truncated in a skippable frame")
                size -= got
            continue
        if magic != MAGIC:
            raise _fail(f"not a zstd frame (magic {head.hex()})")
        yield from _frame(inp)


def _frame(inp: _Input) -> Iterator[bytes]:
    fhd = inp.need(1, "a frame header")[0]
    fcs_flag = fhd >> 6
    single = (fhd >> 5) & 1
    if fhd & 8:
        raise _fail("frame header reserved bit set")
    checksum = (fhd >> 2) & 1
    did_size = (0, 1, 2, 4)[fhd & 3]
    window = 0
    if not single:
        wd = inp.need(1, "a frame header")[0]
        wlog = 10 + (wd >> 3)
        window = (1 << wlog) + ((1 << wlog) >> 3) * (wd & 7)
    if did_size and int.from_bytes(inp.need(did_size, "a frame header"), "little"):
        raise _fail("frame needs a dictionary")
    fcs_size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    fcs: Optional[int] = None
    if fcs_size:
        fcs = int.from_bytes(inp.need(fcs_size, "a frame header"), "little")
        if fcs_size == 2:
            fcs += 256
    if single:
        window = fcs or 0
    if window > MAX_WINDOW:
        raise _fail(f"frame window {window} bytes above the {MAX_WINDOW} this decoder supports")
    block_max = min(max(window, 1), BLOCK_MAX)
    state = _FrameState()
    hist = bytearray()
    keep = max(window, 1)
    produced = 0
    while True:
        bh = int.from_bytes(inp.need(3, "a block header"), "little")
        last = bh & 1
        btype = (bh >> 1) & 3
        bsize = bh >> 3
        start = len(hist)
        if btype == 0:
            if bsize > block_max:
                raise _fail("raw block larger than the block maximum")
            hist += inp.need(bsize, "a raw block")
        elif btype == 1:
            if bsize > block_max:
                raise _fail("RLE block larger than the block maximum")
            hist += inp.need(1, "an RLE block") * bsize
        elif btype == 2:
            if bsize > block_max:
                raise _fail("compressed block larger than the block maximum")
            try:
                _block(inp.need(bsize, "a compressed block"), state, hist, block_max)
            except (IndexError, KeyError) as e:
                raise _fail(f"damaged compressed block ({e!r})") from e
        else:
            raise _fail("reserved block type")
        n = len(hist) - start
        produced += n
        if fcs is not None and produced > fcs:
            raise _fail("frame longer than its recorded content size")
        if n:
            yield bytes(hist[start:])
        if len(hist) > 2 * keep + BLOCK_MAX:
            del hist[:len(hist) - keep]
        if last:
            break
    if fcs is not None and produced != fcs:
        raise _fail("frame shorter than its recorded content size")
    if checksum:
        inp.need(4, "a frame checksum")


def _literals(data: bytes, state: _FrameState, block_max: int) -> Tuple[bytes, int]:
    b0 = data[0]
    ltype = b0 & 3
    fmt = (b0 >> 2) & 3
    if ltype < 2:
        if fmt in (0, 2):
            size, pos = b0 >> 3, 1
        elif fmt == 1:
            size, pos = (b0 >> 4) + (data[1] << 4), 2
        else:
            size, pos = (b0 >> 4) + (data[1] << 4) + (data[2] << 12), 3
        if size > block_max:
            raise _fail("literals larger than the block maximum")
        if ltype == 0:
            lits = data[pos:pos + size]
            if len(lits) != size:
                raise _fail("raw literals truncated")
            return lits, pos + size
        if pos >= len(data):
            raise _fail("RLE literals truncated")
        return data[pos:pos + 1] * size, pos + 1
    if fmt < 2:
        h = int.from_bytes(data[0:3], "little")
        regen, csize, pos = (h >> 4) & 0x3FF, (h >> 14) & 0x3FF, 3
    elif fmt == 2:
        h = int.from_bytes(data[0:4], "little")
        regen, csize, pos = (h >> 4) & 0x3FFF, (h >> 18) & 0x3FFF, 4
    else:
        h = int.from_bytes(data[0:5], "little")
        regen, csize, pos = (h >> 4) & 0x3FFFF, (h >> 22) & 0x3FFFF, 5
    if regen > block_max:
        raise _fail("literals larger than the block maximum")
    end = pos + csize
    if end > len(data):
        raise _fail("compressed literals truncated")
    if ltype == 2:
        state.huffman, pos = read_huffman(data[:end], pos)
    huf = state.huffman
    if huf is None:
        raise _fail("treeless literals without a previous Huffman table")
    if fmt == 0:
        return huf.decode_stream(data[pos:end], regen), end
    if end - pos < 6:
        raise _fail("literals jump table truncated")
    s1 = data[pos] | data[pos + 1] << 8
    s2 = data[pos + 2] | data[pos + 3] << 8
    s3 = data[pos + 4] | data[pos + 5] << 8
    p1 = pos + 6
    p2, p3, p4 = p1 + s1, p1 + s1 + s2, p1 + s1 + s2 + s3
    if p4 > end:
        raise _fail("literals jump table points past the literals")
    each = (regen + 3) // 4
    last = regen - 3 * each
    if last < 0:
        raise _fail("literals too short for four streams")
    return b"".join((huf.decode_stream(data[p1:p2], each), huf.decode_stream(data[p2:p3], each),
                     huf.decode_stream(data[p3:p4], each), huf.decode_stream(data[p4:end], last))), end


def _table(data: bytes, pos: int, mode: int, kind: int, state: _FrameState) -> Tuple[SeqTable, int]:
    global _PREDEFINED
    base, extra, max_sym, max_log = (
        (LL_BASE, LL_BITS, 35, 9), (OF_BASE, OF_BITS, 31, 8), (ML_BASE, ML_BITS, 52, 9))[kind]
    if mode == 0:
        if _PREDEFINED is None:
            _PREDEFINED = _predefined()
        return _PREDEFINED[kind], pos
    if mode == 1:
        if pos >= len(data):
            raise _fail("RLE sequence code missing")
        sym = data[pos]
        if sym > max_sym:
            raise _fail("RLE sequence code out of range")
        e = extra[sym]
        return [(base[sym], e, (1 << e) - 1, 0, 0, 0, e)], pos + 1
    if mode == 2:
        counts, log, pos = read_ncount(data, pos, max_sym, max_log)
        return _seq_table(build_fse(counts, log), base, extra), pos
    prev = state.tables[kind]
    if prev is None:
        raise _fail("repeat sequence table without a previous one")
    return prev, pos


def _sequence_count(data: bytes, pos: int) -> Tuple[int, int]:
    """The sequences section header's count (RFC 8878 3.1.1.3.2.1); returns (count, position after it)."""
    if pos >= len(data):
        raise _fail("sequences section missing")
    b0 = data[pos]
    if b0 < 128:
        return b0, pos + 1
    if b0 < 255:
        if pos + 1 >= len(data):
            raise _fail("sequences header truncated")
        return ((b0 - 128) << 8) + data[pos + 1], pos + 2
    if pos + 2 >= len(data):
        raise _fail("sequences header truncated")
    return data[pos + 1] + (data[pos + 2] << 8) + 0x7F00, pos + 3


def _sequence_tables(data: bytes, pos: int, state: _FrameState) -> Tuple[SeqTable, SeqTable, SeqTable, int]:
    """The literal-length, offset and match-length decoding tables named by the compression
    modes byte (kept in ``state`` for a later "repeat"); returns them and the position after."""
    if pos >= len(data):
        raise _fail("sequences header truncated")
    modes = data[pos]
    pos += 1
    if modes & 3:
        raise _fail("sequences header reserved bits set")
    llt, pos = _table(data, pos, modes >> 6, 0, state)
    oft, pos = _table(data, pos, (modes >> 4) & 3, 1, state)
    mlt, pos = _table(data, pos, (modes >> 2) & 3, 2, state)
    state.tables = [llt, oft, mlt]
    return llt, oft, mlt, pos


def _initial_states(s: str, llt: SeqTable, oft: SeqTable, mlt: SeqTable) -> Tuple[int, int, int, int]:
    """The three decoders' initial states from the start of the (reversed) bitstream ``s``, and
    the bit position after them."""
    ll_log = (len(llt) - 1).bit_length()
    of_log = (len(oft) - 1).bit_length()
    ml_log = (len(mlt) - 1).bit_length()
    p = ll_log + of_log + ml_log
    if p > len(s):
        raise _fail("sequences bitstream too short")
    lls = int(s[0:ll_log], 2) if ll_log else 0
    ofs = int(s[ll_log:ll_log + of_log], 2) if of_log else 0
    mls = int(s[ll_log + of_log:p], 2) if ml_log else 0
    return lls, ofs, mls, p


def _block(data: bytes, state: _FrameState, hist: bytearray, block_max: int) -> None:
    if not data:
        raise _fail("empty compressed block")
    lits, pos = _literals(data, state, block_max)
    nseq, pos = _sequence_count(data, pos)
    if nseq == 0:
        hist += lits
        return
    llt, oft, mlt, pos = _sequence_tables(data, pos, state)
    s = _backward_bits(data[pos:])
    total = len(s)
    lls, ofs, mls, p = _initial_states(s, llt, oft, mlt)
    rep1, rep2, rep3 = state.reps
    limit = len(hist) + block_max
    lp = 0
    nlits = len(lits)
    s += "0" * 32  # the last sequence reads no state bits: let it read zeros past the end
    q = oe = me = le = 0
    for _ in range(nseq):
        q = p
        ob, oe, _, osb, osm, onx, ot = oft[ofs]
        mb, me, mm, msb, msm, mnx, mt = mlt[mls]
        lb, le, lm, lsb, lsm, lnx, lt = llt[lls]
        n = ot + mt + lt
        v = int(s[p:p + n] or "0", 2)
        p += n
        ofs = onx + (v & osm)
        v >>= osb
        mls = mnx + (v & msm)
        v >>= msb
        lls = lnx + (v & lsm)
        v >>= lsb
        ll = lb + (v & lm)
        v >>= le
        ml = mb + (v & mm)
        off = ob + (v >> me)
        if off > 3:
            rep3 = rep2
            rep2 = rep1
            rep1 = off = off - 3
        else:
            if ll == 0:
                off += 1
            if off == 1:
                off = rep1
            elif off == 2:
                off = rep2
                rep2 = rep1
                rep1 = off
            else:
                off = rep3 if off == 3 else rep1 - 1
                rep3 = rep2
                rep2 = rep1
                rep1 = off
        if ll:
            if lp + ll > nlits:
                raise _fail("sequence copies more literals than the block has")
            hist += lits[lp:lp + ll]
            lp += ll
        st = len(hist) - off
        if off <= 0 or st < 0:
            raise _fail("match offset points before the start of the window")
        if ml <= off:
            hist += hist[st:st + ml]
        else:
            hist += (hist[st:] * (ml // off + 1))[:ml]
        if len(hist) > limit:
            raise _fail("block decodes to more than the block maximum")
    if q + oe + me + le != total:
        raise _fail("sequences bitstream not consumed exactly")
    state.reps = [rep1, rep2, rep3]
    if lp < nlits:
        hist += lits[lp:]


class PureZstdReader:
    """A file-like reader of the decompressed bytes of ``raw``."""

    def __init__(self, raw: Any) -> None:
        self._blocks = iter_decompress(raw)
        self._buf = b""
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join([self._buf[self._pos:], *self._blocks])
        parts = []
        left = n
        while left > 0:
            if self._pos >= len(self._buf):
                nxt = next(self._blocks, None)
                if nxt is None:
                    break
                self._buf, self._pos = nxt, 0
            take = self._buf[self._pos:self._pos + left]
            self._pos += len(take)
            left -= len(take)
            parts.append(take)
        return b"".join(parts)

    def close(self) -> None:
        self._blocks.close()


def decompress(data: bytes) -> bytes:
    """Decompress a whole zstd stream held in memory (tests and small blobs)."""
    import io

    return b"".join(iter_decompress(io.BytesIO(data)))
