"""The integer labels of many lines at once, read from the bytes as the ``"label"`` parser reads them. No torch.

:func:`rank_dataset.parsers.parse_label` takes the text after a line's last run of whitespace and
passes it to ``int``. Here that is done for a whole batch of lines with a fixed number of numpy
passes, eight bytes per line at a time: the common line (``<path> <digits>``, optionally a sign
before the digits and whitespace after them) is decoded in place; any other line is handed back to
be parsed in Python by the parser itself, so the two never disagree.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["PAD", "tail_labels"]

#: Bytes before the first line of a batch that :func:`tail_labels` may read (it reads 8-byte words).
PAD = 8
_WORD = 8
_MAX_DIGITS = 18  # every 18-digit number fits an int64

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


def _word_digits(
    words: npt.NDArray[np.uint8], last: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The number formed by the decimal digits that end at byte ``last`` of each line (at most 8) and
    how many there are. ``words[i]`` are the 8 bytes ending at byte ``i + 7``."""
    digits = words[last - (_WORD - 1)]  # fancy indexing: np.take of a strided view is far slower
    digits -= ord("0")  # uint8: every byte but '0'..'9' wraps to >= 10
    other = (digits >= 10).view(np.uint64).reshape(-1)
    # The highest byte that is not a digit ends the run; frexp's exponent is its highest set bit + 1
    # (exact: a float64 holds the leading bits of any uint64); 0 for no such byte, so count is 8.
    top = np.frexp(other.astype(np.float64))[1].astype(np.int64)
    count = _WORD - 1 - (top - 1) // 8
    value = digits.view(np.uint64).reshape(-1)
    # Keep the digits of the run (the high bytes); a zero byte is a leading zero of the number.
    value &= np.left_shift(np.uint64(0xFFFF_FFFF_FFFF_FFFF), (8 * (_WORD - count)).astype(np.uint64))
    # Byte 0 is the first digit: combine neighbours into 2-, 4- and 8-digit numbers in place.
    value = (value * np.uint64(10) + (value >> np.uint64(8))) & np.uint64(0x00FF_00FF_00FF_00FF)
    value = (value * np.uint64(100) + (value >> np.uint64(16))) & np.uint64(0x0000_FFFF_0000_FFFF)
    value = (value * np.uint64(10000) + (value >> np.uint64(32))) & np.uint64(0xFFFF_FFFF)
    return value, count


def tail_labels(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The label of each line ``buf[starts[i]:ends[i]]`` (non-empty lines without their line ending).

    ``buf`` must hold :data:`PAD` bytes before the first line. Returns ``(labels, decoded)``: where
    ``decoded`` is False, the line is not of the common form and ``labels`` holds nothing useful;
    parse it with :func:`rank_dataset.parsers.parse_label` (which also says why a line has no label).

    Examples:
        >>> text = b" " * PAD + b"a/b.jpg 12\\nc d -3 \\nnone\\n"
        >>> buf = np.frombuffer(text, np.uint8)
        >>> labels, decoded = tail_labels(buf, np.array([8, 19, 27]), np.array([18, 26, 31]))
        >>> labels[decoded].tolist(), decoded.tolist()
        ([12, -3], [True, True, False])
    """
    words = np.lib.stride_tricks.sliding_window_view(buf, _WORD)
    last = ends - 1
    # Whitespace after the label (rare): step back over it.
    rows = np.flatnonzero(_SPACE[buf[last]])
    while rows.size:
        last[rows] -= 1
        rows = rows[(last[rows] >= starts[rows]) & _SPACE[buf[np.maximum(last[rows], 0)]]]
    value, count = _word_digits(words, last)
    longer = np.flatnonzero(count == _WORD)
    while longer.size and int(count[longer].min()) < _MAX_DIGITS:
        more, more_count = _word_digits(words, np.maximum(last[longer] - count[longer], _WORD - 1))
        value[longer] += more * np.uint64(10) ** count[longer].astype(np.uint64)
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
