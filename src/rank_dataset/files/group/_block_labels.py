"""The samples of a block of whole lines and their integer labels, as the ``"label"`` parser reads them.

:func:`rank_dataset.core.parsers.parse_label` takes the text after a line's last run of whitespace and
passes it to ``int``. :func:`block_labels` does that for every sample of a block of a file's bytes
(the scanner's samples: blank lines are not samples, a ``\\r`` before the ``\\n`` is not text, a
byte order mark opens no line) with a fixed number of numpy passes: the common line, ``<path>
<digits>\\n`` with a sign or not, is decoded from the one 8-byte word before its newline; the rest
go through :func:`tail_labels` (whitespace after the label, up to 18 digits); what neither decodes
is handed back to be parsed in Python by the parser itself, so that the two never disagree.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, UInt8Array, UInt64Array
from rank_dataset.files.index.scan import BLANK, BOM, CR

__all__ = ["PAD", "BlockLabels", "block_labels", "tail_labels"]

#: Bytes before the first line of a batch that :func:`tail_labels` may read (it reads 8-byte words).
PAD = 8
_WORD = 8
_MAX_DIGITS = 18  # every 18-digit number fits an int64
_LEADING = 16  # leading blanks stepped over in numpy; a line with more is judged in Python

# The ASCII characters that ``str.split()`` treats as whitespace (it also splits at \x1c-\x1f).
_SPACE = np.zeros(256, bool)
_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True
# Bytes a line may start with for its first character to be surely not whitespace: ASCII other than
# whitespace, and UTF-8 lead bytes of characters none of which is whitespace (the Unicode spaces
# start with 0xC2, 0xE1, 0xE2 or 0xE3; continuation bytes cannot start a character).
_SURELY_TEXT = ~_SPACE
_SURELY_TEXT[0x80:0xC2] = False
_SURELY_TEXT[[0xC2, 0xE1, 0xE2, 0xE3]] = False
_PLUS, _MINUS = ord("+"), ord("-")
_BYTES = np.uint64(0x0101_0101_0101_0101)
_U8, _U16, _U32, _U56 = np.uint64(8), np.uint64(16), np.uint64(32), np.uint64(56)


class BlockLabels(NamedTuple):
    """The labels of the samples of a block of lines (see :func:`block_labels`)."""

    labels: Int64Array
    #: The samples (numbered within the block) whose label is left to the parser, and their spans.
    todo: Int64Array
    starts: Int64Array
    ends: Int64Array


def block_labels(buf: UInt8Array, end: int, *, file_start: bool) -> BlockLabels:
    """The label of every sample among the lines ``buf[PAD:end]``.

    ``buf`` must be contiguous, ``buf[PAD - 1]`` and ``buf[end - 1]`` newlines (the one before the
    first line, the last line's own), so ``buf[PAD:end]`` is whole lines; ``file_start``: the block
    starts the file (where a byte order mark is not text). A sample is a line holding a byte other
    than ASCII whitespace; its text excludes the ``\\n`` and a ``\\r`` before it. The samples in
    ``todo`` are not of the common form: parse ``buf[starts[i]:ends[i]]`` with
    :func:`rank_dataset.core.parsers.parse_label` (which also says why a line has no label).
    """
    words = _words(buf)
    newline_at = native.find_newlines(buf[PAD - 1 : end])
    newline_at += PAD - 1
    starts = newline_at[:-1] + 1
    ends = newline_at[1:]
    # Most lines are "<path> <digits>\n": decoded from the word before the newline, and not blank.
    labels, ok = _common_labels(buf, words, starts, ends)
    bom = file_start and buf[PAD : PAD + len(BOM)].tobytes() == BOM
    ok[0] &= not bom
    rows = np.flatnonzero(~ok)
    if not rows.size:
        return BlockLabels(labels, *([np.empty(0, np.int64)] * 3))
    # The others, in full: without a "\r" before the newline or a leading byte order mark; blank or not.
    starts, ends = starts[rows], ends[rows]
    ends -= buf[ends - 1] == CR  # an empty line's previous byte is a newline, never a CR
    if bom and rows[0] == 0:
        starts[0] += len(BOM)
    blank = _blank(buf, starts, ends)
    left = np.flatnonzero(~blank)
    labels[rows[left]], ok = _common_labels(buf, words, starts[left], ends[left])
    left = left[~ok]
    labels[rows[left]], ok = tail_labels(buf, starts[left], ends[left])
    left = left[~ok]
    todo = rows[left]
    if blank.any():  # blank lines are not samples: number the samples without them
        gone = rows[blank]
        labels = np.delete(labels, gone)
        todo = todo - np.searchsorted(gone, todo)
    return BlockLabels(labels, todo, starts[left], ends[left])


def _words(buf: UInt8Array) -> UInt64Array:
    """``words[i]``: bytes ``i .. i + 7`` of ``buf`` as one little-endian word, so that gathering a word
    a line is one load a line."""
    words: UInt64Array = np.ndarray((max(buf.size - (_WORD - 1), 0),), "<u8", buffer=buf, strides=(1,))
    return words


def _common_labels(
    buf: UInt8Array,
    words: UInt64Array,
    starts: Int64Array,
    ends: Int64Array,
) -> tuple[Int64Array, npt.NDArray[np.bool_]]:
    """The label of each line ``buf[starts[i]:ends[i]]`` that ends in 1-7 digits, a sign or not, after
    whitespace after text (``ok``); nothing useful elsewhere. Few passes: one word a line."""
    value, before = _word_digits(words, ends - 1)
    labels = value.view(np.int64)
    sep_at = ends - (_WORD + 1)
    sep_at += before.view(np.int64)
    sep = buf[sep_at]
    minus = sep == _MINUS
    signed = np.flatnonzero(minus | (sep == _PLUS))
    if signed.size:  # the separator is the byte before the sign
        sep_at[signed] -= 1
        sep[signed] = buf[sep_at[signed]]
        np.negative(labels, out=labels, where=minus)
    ok = (before > 0) & (before < _WORD)  # 1-7 digits: 8 may go on; 0 is no label
    ok &= _SPACE[sep]
    ok &= sep_at > starts
    ok &= _SURELY_TEXT[buf[starts]]
    return labels, ok


def _blank(buf: UInt8Array, starts: Int64Array, ends: Int64Array) -> npt.NDArray[np.bool_]:
    """Whether each line ``buf[starts[i]:ends[i]]`` holds only ASCII whitespace."""
    blank = np.zeros(starts.size, bool)
    rows = np.arange(starts.size)
    at = starts.copy()
    for _ in range(_LEADING):
        inside = at < ends[rows]
        blank[rows[~inside]] = True
        rows, at = rows[inside], at[inside]
        more = BLANK[buf[at]]
        rows, at = rows[more], at[more] + 1
        if not rows.size:
            return blank
    for row in rows.tolist():  # long runs of leading whitespace: rare
        blank[row] = not buf[starts[row] : ends[row]].tobytes().strip(b" \t\r\x0b\x0c")
    return blank


def _word_digits(words: UInt64Array, last: Int64Array) -> tuple[UInt64Array, UInt64Array]:
    """The number formed by the decimal digits that end at byte ``last`` of each line (at most 8), and
    how many of the 8 bytes up to ``last`` come before those digits (8: no digit). ``words[i]`` are the
    8 bytes starting at byte ``i``, one little-endian word."""
    value = words[last - (_WORD - 1)]  # one 8-byte load a line
    digits = value.view(np.uint8)
    digits -= ord("0")  # uint8: every byte but '0'..'9' wraps to >= 10
    other = (digits >= 10).view(np.uint64)  # 0x01 in each byte that is not a digit
    # Spread each such byte's flag to every lower byte: the bytes left unflagged are the run of digits
    # that ends the word (the high bytes), and the flags' sum (gathered in the top byte) is the rest.
    other |= other >> _U8
    other |= other >> _U16
    other |= other >> _U32
    before = (other * _BYTES) >> _U56
    # Keep the digits of the run; a zero byte is a leading zero of the number.
    value &= ~(other * np.uint64(0xFF))
    # Byte 0 is the first digit: combine neighbours into 2-, 4- and 8-digit numbers in place.
    value = (value * np.uint64(10) + (value >> _U8)) & np.uint64(0x00FF_00FF_00FF_00FF)
    value = (value * np.uint64(100) + (value >> _U16)) & np.uint64(0x0000_FFFF_0000_FFFF)
    value = (value * np.uint64(10000) + (value >> _U32)) & np.uint64(0xFFFF_FFFF)
    return value, before


def tail_labels(buf: UInt8Array, starts: Int64Array, ends: Int64Array) -> tuple[Int64Array, npt.NDArray[np.bool_]]:
    """The label of each line ``buf[starts[i]:ends[i]]`` (non-empty lines without their line ending).

    ``buf`` must be contiguous and hold :data:`PAD` bytes before the first line. Returns ``(labels,
    decoded)``: where ``decoded`` is False, the line is not of the common form and ``labels`` holds
    nothing useful; parse it with :func:`rank_dataset.core.parsers.parse_label` (which also says why a line
    has no label).

    Examples:
        >>> text = b" " * PAD + b"a/b.jpg 12\\nc d -3 \\nnone\\n"
        >>> buf = np.frombuffer(text, np.uint8)
        >>> labels, decoded = tail_labels(buf, np.array([8, 19, 27]), np.array([18, 26, 31]))
        >>> labels[decoded].tolist(), decoded.tolist()
        ([12, -3], [True, True, False])
    """
    words = _words(buf)
    last = ends - 1
    # Whitespace after the label (rare): step back over it.
    rows = np.flatnonzero(_SPACE[buf[last]])
    while rows.size:
        last[rows] -= 1
        rows = rows[(last[rows] >= starts[rows]) & _SPACE[buf[np.maximum(last[rows], 0)]]]
    value, before = _word_digits(words, last)
    count = _WORD - before.astype(np.int64)
    longer = np.flatnonzero(count == _WORD)
    while longer.size and int(count[longer].min()) < _MAX_DIGITS:
        more, more_before = _word_digits(words, np.maximum(last[longer] - count[longer], _WORD - 1))
        value[longer] += more * np.uint64(10) ** count[longer].astype(np.uint64)
        more_count = _WORD - more_before.astype(np.int64)
        count[longer] += more_count
        longer = longer[more_count == _WORD]
    sep_at = last - count
    sep = buf[np.maximum(sep_at, 0)]
    minus = sep == _MINUS
    signed = minus | (sep == _PLUS)
    if signed.any():  # the separator is the byte before the sign
        sep_at -= signed
        sep = np.where(signed, buf[np.maximum(sep_at, 0)], sep)
    decoded = (count >= 1) & (count <= _MAX_DIGITS) & (sep_at > starts) & _SPACE[sep] & _SURELY_TEXT[buf[starts]]
    labels = value.astype(np.int64)
    np.negative(labels, out=labels, where=minus)
    return labels, decoded
