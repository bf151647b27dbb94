"""CRC32C arithmetic the reader needs beyond a checksum of bytes: the CRC of a run of zero
bytes appended (a sparse file's hole, in time logarithmic in its length), two CRCs combined
(a chunk read in pieces, each piece's CRC32C computed by the thread that received it), and
the bookkeeping of a chunk read so."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ckptio.checkpoint.snapshot import crc32c

if TYPE_CHECKING:
    from ckptio import manifest as mf

__all__ = ["PiecedChunk", "crc32c_combine", "crc32c_zeros"]

_CRC32C_POLY = 0x82F63B78
"""CRC-32C (Castagnoli), reflected."""
_ZERO_BYTES = bytes(1 << 16)
_ZEROS_OPERATORS: list[list[int]] = []
"""``[k]``: what ``2**k`` zero bytes do to a CRC-32C register, a 32x32 matrix over GF(2) (one
int per column), made as they are first needed."""
_ZEROS_LOCK = threading.Lock()


def _gf2_times(matrix: list[int], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, column) for column in matrix]


def crc32c_zeros(crc: int, n: int) -> int:
    """The CRC32C of ``n`` zero bytes following bytes whose CRC32C is ``crc``: what a hole of
    a sparse file adds, in time logarithmic in ``n`` (a 4 TiB hole in microseconds, where
    reading it would take an hour). Written here because no maintained CRC32C library for
    Python offers zero extension or ``crc32c_combine``: zlib's method (the register's
    update by one zero bit is linear; ``2**k`` zero bytes are its matrix squared), with the
    matrices kept."""
    if n <= len(_ZERO_BYTES):
        return crc32c(_ZERO_BYTES[:n], crc) if n else crc
    register = crc ^ 0xFFFFFFFF
    k = 0
    while n:
        if n & 1:
            with _ZEROS_LOCK:
                if not _ZEROS_OPERATORS:  # one zero bit, then squared three times: a byte
                    one = [_CRC32C_POLY] + [1 << (i - 1) for i in range(1, 32)]
                    _ZEROS_OPERATORS.append(_gf2_square(_gf2_square(_gf2_square(one))))
                while len(_ZEROS_OPERATORS) <= k:
                    _ZEROS_OPERATORS.append(_gf2_square(_ZEROS_OPERATORS[-1]))
                operator = _ZEROS_OPERATORS[k]
            register = _gf2_times(operator, register)
        n >>= 1
        k += 1
    return register ^ 0xFFFFFFFF


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """The CRC32C of bytes A followed by bytes B from the CRC32C of each and B's length: the
    CRC register's update is affine in its starting value, so continuing from ``crc_a``
    instead of 0 over B adds what continuing over ``len_b`` zeros adds (:func:`crc32c_zeros`,
    microseconds)."""
    if not len_b:
        return crc_a
    return crc32c_zeros(crc_a, len_b) ^ crc32c_zeros(0, len_b) ^ crc_b


class PiecedChunk:
    """A chunk read in pieces (:meth:`ckptio.checkpoint.read.CheckpointReader._piece_bytes`): what each piece read and
    its CRC32C, until the last piece is in."""

    def __init__(self, chunk: mf.Chunk, out: memoryview, piece: int) -> None:
        self.chunk = chunk
        self.out = out
        self.spans = [(s, min(piece, chunk.length - s)) for s in range(0, chunk.length, piece)]
        self._got: list[tuple[int, int] | None] = [None] * len(self.spans)
        self._left = len(self.spans)
        self._lock = threading.Lock()

    def piece_done(self, i: int, got: int, crc: int) -> tuple[int, int] | None:
        """Record piece ``i`` (``got`` bytes, their CRC32C); once every piece is in, the
        arguments of ``_check_chunk``: the bytes read in order up to the first short piece
        (the object ends there) and the CRC32C of those bytes."""
        with self._lock:
            self._got[i] = (got, crc)
            self._left -= 1
            if self._left:
                return None
        total = whole_crc = 0
        for (_, want), piece in zip(self.spans, self._got, strict=True):
            assert piece is not None
            n, c = piece
            whole_crc, total = crc32c_combine(whole_crc, c, n), total + n
            if n < want:
                break  # the object ends in this piece: later pieces read nothing
        return total, whole_crc
