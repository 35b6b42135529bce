"""Checks of meta lines against the bytes they were copied from, and of their text: where a sample
may start and end, that it is not blank, and that it is UTF-8; and a file's bytes cut into pieces of
whole lines (:func:`line_pieces`), as grouping and the collective reader read them.

Public: the collective reader checks its rows with the same functions the file reader does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, IntegerArray, UInt8Array
from rank_dataset.core.native import BLANK, BOM, CR, NEWLINE

__all__ = ["bounds_ok", "check_from", "check_utf8", "line_pieces", "rows_ok", "window_ok"]


def check_from(s: Int64Array) -> Int64Array:
    """Where the bytes needed to check samples starting at ``s`` begin: the byte before each (the
    whole byte order mark for a sample that may follow one)."""
    return np.where(s == len(BOM), 0, np.maximum(s - 1, 0))


def bounds_ok(
    buf: UInt8Array,
    shift: int | Int64Array,
    s: Int64Array,
    e: Int64Array,
    size: int,
) -> bool:
    """Whether every span ``[s, e)`` is bounded as a sample is: it starts the file (after a byte
    order mark, if the file has one) or follows a newline, and its end is a line ending (``\\n`` not
    after ``\\r``, ``\\r\\n``, ``\\r`` at the end of the file) or the end of the file.

    ``buf[x - shift]`` is byte ``x`` of the file for ``x`` in ``[s - 1, e + 2)`` (``[0, e + 2)`` for a
    row that may follow a byte order mark), and ``buf`` has at least 2 bytes more after ``e``.
    """
    # The common case first, in a few passes: after a newline, before a newline not after a CR.
    rs, re_ = s - shift, e - shift  # where the rows are in buf
    ok = (buf[rs - 1] == NEWLINE) & (buf[re_] == NEWLINE) & (buf[re_ - 1] != CR) & (s != 0)
    if bool(ok.all()):
        return True
    rows = np.flatnonzero(~ok)  # the first sample, the last, CRLF endings, and wrong spans
    s, e, rs, re_ = s[rows], e[rows], rs[rows], re_[rows]
    # A row that may follow the byte order mark was read from the file's first byte on.
    head = np.flatnonzero(s <= len(BOM))
    zero = int(rs[head[0]] - s[head[0]]) if head.size else 0  # where byte 0 of the file is in buf
    bom = bool(head.size) and size >= len(BOM) and buf[zero : zero + len(BOM)].tobytes() == BOM
    after_newline = buf[np.maximum(rs - 1, 0)] == NEWLINE
    start_ok = np.where(s == 0, not bom, after_newline | ((s == len(BOM)) & bom))
    last, c1, c2 = buf[re_ - 1], buf[re_], buf[re_ + 1]
    at_eof = e >= size
    plain_end = (at_eof | (c1 == NEWLINE)) & (last != CR)
    cr_end = ~at_eof & (c1 == CR) & ((e + 1 >= size) | (c2 == NEWLINE))
    return bool((start_ok & (plain_end | cr_end)).all())


def window_ok(
    buf: UInt8Array,
    shift: int | Int64Array,
    s: Int64Array,
    e: Int64Array,
    size: int,
) -> tuple[bool, bool]:
    """Whether the spans ``[s, e)`` read into ``buf`` (as :func:`bounds_ok` takes them) are samples of
    their file, and whether newlines inside them were looked for.

    Native: one pass of :func:`rank_dataset.core.native.check_lines` (bounds, blank rows and newlines
    inside rows). Numpy: :func:`bounds_ok` and :func:`rows_ok`, which leave newlines inside rows to one
    search of the copied shard (a newline search of each window costs numpy more than that).
    """
    if not native.FUSED:
        return bounds_ok(buf, shift, s, e, size) and rows_ok(buf, s - shift, e - shift), False
    rs = s - shift
    # The byte order mark matters to a row at byte 0 or 3 only, which was read from byte 0 on.
    head = np.flatnonzero((s == 0) | (s == len(BOM)))
    zero = int(rs[head[0]] - s[head[0]]) if head.size else 0  # where byte 0 of the file is in buf
    bom = bool(head.size) and size >= len(BOM) and buf[zero : zero + len(BOM)].tobytes() == BOM
    try:
        return native.check_lines(buf, rs, s, e - s, size, bom) < 0, True
    except ValueError:  # a span outside the window or the file (a corrupt index): not a sample
        return False, True


def rows_ok(buf: UInt8Array, s: Int64Array, e: Int64Array) -> bool:
    """Whether each row ``buf[s:e]`` holds something other than whitespace (newlines inside rows are
    looked for once the whole shard is copied)."""
    # Only a row that starts with whitespace can be blank: check those in full (they are rare).
    maybe_blank = np.flatnonzero(BLANK[buf[s]])
    return all(_line_ok(buf[x:y]) for x, y in zip(s[maybe_blank].tolist(), e[maybe_blank].tolist()))


def _line_ok(line: UInt8Array) -> bool:
    """Whether ``line`` holds no newline and something other than whitespace."""
    return not bool((line == NEWLINE).any()) and not bool(BLANK[line].all())


def check_utf8(
    where: Callable[[int], str],
    data: UInt8Array,
    bounds: IntegerArray,
) -> None:
    """Raise ValueError naming file and line (``where(row)``) of a row that is not valid UTF-8.

    ``data`` holds the rows back to back, row ``i`` at ``bounds[i]:bounds[i + 1]``.
    """

    def fail(row: int) -> None:
        try:
            data[bounds[row] : bounds[row + 1]].tobytes().decode("utf-8")
            reason = "invalid byte sequence"  # pragma: no cover - callers pass an invalid row
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"{where(row)}: line is not valid UTF-8 ({reason})")

    bad = native.utf8_first_invalid(data, bounds)  # one pass (C, or numpy's decoder over runs of rows)
    if bad >= 0:
        fail(bad)


def line_pieces(
    read_into: Callable[[UInt8Array, int, int], None], lo: int, hi: int, step: int, *, reuse: bool = True
) -> Iterator[tuple[UInt8Array, int]]:
    """``(buf, offset)``: bytes ``[lo, hi)`` of a file, read ``step`` bytes at a time by ``read_into(out,
    offset, hi)`` (which fills ``out``; reads go on in order), in pieces that each end just past a
    newline, the last at ``hi``. ``lo`` starts a line. With ``reuse``, every piece is a view of one
    buffer, read into again for the next piece (valid until the next is asked for); without, each piece
    is an array of its own."""
    # One buffer for every read: fresh memory is paid for page by page (zeroed by the kernel), and
    # a new buffer a read would cost that for the whole range; it grows only for a line longer than a read.
    space: UInt8Array = np.empty(min(step, max(hi - lo, 0)), np.uint8)
    kept, pos = 0, lo  # bytes of an unfinished line at the start of space
    while pos < hi:
        n = min(step, hi - pos)
        if kept + n > space.size:
            grown = np.empty(kept + n, np.uint8)
            grown[:kept] = space[:kept]
            space = grown
        buf = space[: kept + n]
        read_into(buf[kept:], pos, hi)
        start, pos = pos - kept, pos + n
        if pos >= hi:
            yield buf, start
            return
        cut = _last_newline(buf)
        if cut < 0:  # a line longer than a read: read on
            kept = buf.size
            continue
        yield buf[: cut + 1], start
        kept = buf.size - cut - 1
        if not reuse:
            space = np.empty(kept + min(step, hi - pos), np.uint8)
        space[:kept] = buf[cut + 1 :]  # (numpy copies overlapping ranges as if through a temporary)


def _last_newline(buf: UInt8Array) -> int:
    for tail in (1 << 16, buf.size):
        hits = np.flatnonzero(buf[-tail:] == NEWLINE)
        if hits.size:
            return int(buf.size - min(tail, buf.size) + hits[-1])
    return -1
