"""Plain text meta files: the file's bytes are its lines.

Text is what a file is when no other format recognises it, so the registry asks it last.
"""

from __future__ import annotations

from rank_dataset.files.formats.base import Format, Recognised

__all__ = ["TEXT", "TextFormat"]


class TextFormat(Format):
    """A meta file read as it is: scanned in place, read with positional reads."""

    value = "text"
    code = 0

    def recognise(self, found: Recognised) -> bool:
        return True


TEXT = TextFormat()
