"""MetaFile: the samples of one or more meta files, read through their line-offset index and their
bytes (:mod:`~rank_dataset.files.read.file`). :meth:`MetaFile.read` copies a set of
samples into a :class:`~rank_dataset.core.shard.Shard` and checks each against the bytes it copied: a
sample starts the file or follows a newline, ends at a line ending or the end of the file, and holds
no newline. So a rewritten file is a :class:`MetaFileChangedError`, never a torn sample, and an
index that disagrees with an unchanged file is rebuilt. A Parquet file's samples are its rows
(:mod:`rank_dataset.files.formats.parquet`), checked as a text file's lines are.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import Int64Array
from rank_dataset.core.checks import UrlPath, check_index, meta_path, with_storage
from rank_dataset.core.residency import return_freed_memory
from rank_dataset.core.shard import Shard
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.index.fingerprints import fingerprints
from rank_dataset.files.index.load import load_index
from rank_dataset.files.read._gather import (
    THREADED_ROWS,
    IndexMismatch,
    SampleNumbers,
    bucket_order,
    check_utf8,
    gather,
    line_position,
    read_one,
)
from rank_dataset.files.read.file import IndexedFile, bytes_of
from rank_dataset.plan.bounds import Bounds

if TYPE_CHECKING:  # the scanner is the index build's: a cached index is read without it
    from rank_dataset.files.index.scan import PathLike

__all__ = ["MetaFile", "MetaFileChangedError", "bucket_order"]

_TRIES = 3  # reads of a file whose index disagrees with it, rebuilding the index in between
_T = TypeVar("_T")


def _path_of(name: str | UrlPath) -> Path:
    """A path as pickled made a path again: an object's URL is pickled as the UrlPath it is."""
    return cast(Path, name) if isinstance(name, UrlPath) else Path(name)


class MetaFile:
    """The samples of one meta file, or of several taken as one in the order given.

    Args:
        path_or_paths: a path, or a sequence of paths. A gzip, zstd or Parquet file (told by its first
            bytes) is read in place: a compressed file's samples are its decompressed lines, a
            Parquet file's its rows (see ``columns``).
        columns: the columns of a Parquet file whose values, joined by a tab, make a row's line, in
            that order; None for all. Only for Parquet files (the same for each).
        storage_options: for meta files in object storage (``s3://``, ``gs://``, ``az://``,
            ``https://``): obstore's settings (e.g. ``endpoint``, ``access_key_id``,
            ``secret_access_key``, ``region``), over the environment's; never shown in a message.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: the files hold no sample; ``columns`` for a file that is not Parquet, or names a
            column the file lacks (the message lists its columns), or a nested or binary one.
        ImportError: a Parquet file without pyarrow (``pip install 'rank-dataset[parquet]'``).

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("img_0.JPEG 3\\nimg_1.JPEG 5\\n")
        >>> mf = MetaFile(p)
        >>> len(mf), mf[1]
        (2, 'img_1.JPEG 5')
    """

    def __init__(
        self,
        path_or_paths: PathLike | Sequence[PathLike],
        *,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        columns = _check_columns(columns)
        if isinstance(path_or_paths, (str, os.PathLike)):
            raw: list[PathLike] = [path_or_paths]
        elif isinstance(path_or_paths, Sequence) and all(isinstance(p, (str, os.PathLike)) for p in path_or_paths):
            raw = list(path_or_paths)
        else:
            raise TypeError(f"path_or_paths must be a path or a sequence of paths, got {path_or_paths!r}")
        if not raw:
            raise ValueError("path_or_paths is empty: give at least one meta file")
        self._open([meta_path(with_storage(p, storage_options)) for p in raw], [columns] * len(raw))

    @classmethod
    def from_files(
        cls,
        paths: Sequence[PathLike],
        columns: Sequence[Sequence[str] | None],
        storage_options: Mapping[str, Any] | None = None,
    ) -> MetaFile:
        """The files ``paths`` as one MetaFile, each Parquet file with its own ``columns`` (None: all of
        them; None for every other file), as the distinct files of a mix's Sources are.

        Raises:
            As the constructor.
        """
        if len(paths) != len(columns):
            raise ValueError(f"give one columns entry a file: {len(paths)} paths, {len(columns)} entries")
        if not paths:
            raise ValueError("paths is empty: give at least one meta file")
        mf = object.__new__(cls)
        mf._open([meta_path(with_storage(p, storage_options)) for p in paths], [_check_columns(c) for c in columns])
        return mf

    def _open(self, paths: Sequence[Path], columns: Sequence[tuple[str, ...] | None]) -> None:
        files = [
            IndexedFile(path, load_index(path, columns=cols), bytes_of(path)) for path, cols in zip(paths, columns)
        ]
        # The fingerprints of the files as indexed (together, and each alone), computed now: taken
        # later, from a file changed meanwhile, they would fail, and in the ranks' agreement check
        # one rank failing alone would leave the others waiting in the collective.
        self._set(files, *_fingerprints(files))
        if self._layout.total == 0:
            names = ", ".join(str(f.path) for f in files)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")

    def _set(self, files: Sequence[IndexedFile], fingerprint: str | None, file_fingerprints: tuple[str, ...]) -> None:
        self._files = tuple(files)
        self._layout = Bounds([f.index.count for f in files])
        self._fingerprint, self._file_fingerprints = fingerprint, file_fingerprints

    @property
    def paths(self) -> tuple[Path, ...]:
        """The resolved paths of the files, in order."""
        return tuple(f.path for f in self._files)

    def __len__(self) -> int:
        return self._layout.total

    def __repr__(self) -> str:
        return f"MetaFile({[str(p) for p in self.paths]!r}, samples={len(self)})"

    def __getstate__(self) -> dict[str, object]:
        # What lengths, error messages and later reads need, and no open file: a spawn worker that
        # receives a dataset whose shard is in shared memory never touches the meta files (they may
        # even be gone), and one that does read checks them against these keys first.
        # An object's UrlPath is kept as it is: its storage settings go with it, never a client.
        files = [(f.path if isinstance(f.path, UrlPath) else str(f.path), f.index) for f in self._files]
        return {"files": files, "fingerprint": self._fingerprint, "file_fingerprints": self._file_fingerprints}

    def __setstate__(self, state: dict[str, Any]) -> None:
        paths = [_path_of(path) for path, _ in state["files"]]
        files = [IndexedFile(p, index, bytes_of(p)) for p, (_, index) in zip(paths, state["files"])]
        self._set(files, state["fingerprint"], state["file_fingerprints"])

    @property
    def columns(self) -> tuple[tuple[str, ...] | None, ...]:
        """Each file's chosen columns if it is a Parquet file (all of them where none were chosen), else None."""
        return tuple(None if f.index.parquet is None else f.index.parquet.columns for f in self._files)

    @property
    def fingerprint(self) -> str:
        """A short hash of the files' sample counts, sizes, and first and last 64 KiB, as indexed.

        Equal for the same files on any machine (paths and mtimes do not enter it), and computed
        without reading the whole files: what a resume state is checked against.
        """
        if self._fingerprint is None:  # a view from select
            self._fingerprint = _fingerprint(self._files)
        return self._fingerprint

    @property
    def file_fingerprints(self) -> tuple[str, ...]:
        """The fingerprint of each file alone (``MetaFile(path).fingerprint`` of each path), as indexed."""
        return self._file_fingerprints

    def select(self, files: Sequence[int]) -> MetaFile:
        """The files numbered ``files`` (in that order, repeats allowed) as one MetaFile, sharing this
        one's indexes: no file is opened or indexed again (its fingerprint is taken if asked for).

        Examples:
            >>> import tempfile, os
            >>> d = tempfile.mkdtemp()
            >>> paths = [os.path.join(d, n) for n in ("a.txt", "b.txt")]
            >>> for p, text in zip(paths, ["a0\\na1\\n", "b0\\n"]):
            ...     _ = open(p, "w").write(text)
            >>> mf = MetaFile(paths).select([1, 0])
            >>> len(mf), mf[0], mf[1]
            (3, 'b0', 'a0')
        """
        numbers = [check_index(f, len(self._files), label="file number", of="the files") for f in files]
        if not numbers:
            raise ValueError("select at least one file")
        view = object.__new__(MetaFile)
        view._set([self._files[f] for f in numbers], None, tuple(self._file_fingerprints[f] for f in numbers))
        return view

    @property
    def file_bounds(self) -> Int64Array:
        """Sample numbers at which each file starts, and the total at the end."""
        return self._layout.starts

    def locate(self, index: int) -> tuple[int, int]:
        """``(file number, sample number within that file)`` of global sample ``index``."""
        n = len(self)
        index = check_index(index, n, label="sample index", of=f"{n} samples")
        return self._layout.locate(index)

    def where(self, index: int) -> str:
        """``path:line`` of global sample ``index``, for error messages.

        The line is found from the index's mark before it, by counting the newlines of less than
        4 MiB. If the file cannot be read (it changed or is gone), the sample's number within its
        file is given instead.
        """
        file, local = self.locate(index)
        path = self._files[file].path
        if self._files[file].index.format.rows:
            return f"{path}, row {local}"
        try:
            offset, line, start = self._retrying(lambda: line_position(self._files[file], file, local))
            f = self._files[file]
            return f"{path}:{line + f.bytes.count_newlines(f.index, offset, start) + 1}"
        except (OSError, MetaFileChangedError, CorruptMetaFileError):
            return f"{path}, sample {local} of the file"

    def raw(self, index: int) -> bytes:
        """The bytes of sample ``index`` without its line ending.

        Raises:
            MetaFileChangedError: the file changed since it was indexed.
        """
        file, local = self.locate(index)
        return self._retrying(lambda: read_one(self._files[file], file, local))

    def __getitem__(self, index: int) -> str:
        raw = self.raw(index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.where(index)}: line is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None

    def read(self, indices: npt.ArrayLike, *, ids: bool = True, shared: bool = True) -> Shard:
        """Read the samples ``indices`` (in that order) into a new Shard, in shareable memory.

        Reads the index entries and the lines of these samples only, in file order, a window of
        the file at a time into one reusable buffer, and checks every sample against the bytes.
        With ``ids=False`` the shard does not keep the sample numbers (a dataset recomputes them
        from its plan). With ``shared=False`` it lives in this process's private memory (huge pages
        where the system allows them), for a caller that never hands it to another process (the
        meta server, which frames and sends it): half the cost of faulting in a shareable segment's
        pages; pickling such a shard copies it into a segment first.

        Raises:
            IndexError: an index outside ``[0, len(self))``.
            MetaFileChangedError: a file changed since it was indexed (or while it was read).
            ValueError: a line is not valid UTF-8 (the message names its file and line).
        """
        return self._read(SampleNumbers(self._in_range(np.asarray(indices, np.int64))), ids=ids, shared=shared)

    def _read_made(self, make: Callable[[], Int64Array], *, ids: bool) -> Shard:
        """``read(make(), ids=ids)``, for samples that ``make`` gives again whenever called (a plan's):
        the build lets go of them once its passes are planned, so that its peak (the shard filling)
        holds none of them, and makes them again if it needs them (a retry, an error message)."""
        return self._read(SampleNumbers(self._in_range(make()), make), ids=ids)

    def _in_range(self, indices: Int64Array) -> Int64Array:
        n, low, high = len(self), int(indices.min(initial=0)), int(indices.max(initial=0))
        if low < 0 or high >= n:
            raise IndexError(f"sample index {low if low < 0 else high} is out of range for {n} samples")
        return indices

    def _read(self, samples: SampleNumbers, *, ids: bool, shared: bool = True) -> Shard:
        writer = self._retrying(lambda: gather(self._files, self._layout, samples, ids=ids, shared=shared))
        if not all(file.index.ascii for file in self._files):
            check_utf8(lambda row: self.where(int(samples.get()[row])), writer.data, writer.bounds)
        if samples.size >= THREADED_ROWS:  # a small read leaves no large temporaries behind
            return_freed_memory()
        return writer.finish()

    def _retrying(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``, loading the index of a file again (rebuilding it, if it disagrees with the
        file's bytes) and retrying, a few times at most."""
        for tries in itertools.count(1):
            try:
                return attempt()
            except IndexMismatch as exc:
                if tries == _TRIES:
                    what = "its lines still disagree with its index after the index was rebuilt"
                    raise MetaFileChangedError(self._files[exc.file].path, what) from None
                self._reindex(exc.file, distrust=exc.corrupt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _reindex(self, file: int, *, distrust: bool) -> None:
        old = self._files[file]
        layout = old.index.parquet
        columns = None if layout is None else layout.columns
        index = load_index(old.path, distrust=old.index if distrust else None, columns=columns)
        what = old.index.key.change(index.key)
        if what is None and index.count != old.index.count:
            what = f"it holds {index.count:,} samples now, not {old.index.count:,}"
        if what is not None:
            raise MetaFileChangedError(old.path, what)
        files = list(self._files)
        files[file] = replace(old, index=index)
        self._set(files, self._fingerprint, self._file_fingerprints)


def _check_columns(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns`` as a tuple of column names (None stays None); see :func:`column_names`."""
    if columns is None:
        return None
    from rank_dataset.plan.sources import column_names  # on first use: what a mix is planned with

    return column_names(columns)


def _fingerprints(files: Sequence[IndexedFile]) -> tuple[str, tuple[str, ...]]:
    """The fingerprint of ``files`` taken as one, and of each alone, from one read of each file's ends."""
    return fingerprints(
        (f.path, f.index.key, f.index.count, None if f.index.parquet is None else f.index.parquet.columns)
        for f in files
    )


def _fingerprint(files: Sequence[IndexedFile]) -> str:
    return _fingerprints(files)[0]
