"""Objects pickled apart from their owner and unpickled where first used. No torch.

A spawn or forkserver DataLoader worker unpickles its dataset before its first item, importing the module of
every class the pickle names. What only the rank plans and builds with (the reader of the meta files, its
index, the formats) would cost each worker the modules of an index build, every format and the object-storage
source. Pickled as a :class:`Deferred`, those objects travel as bytes and are unpickled, their modules
imported, only if the worker touches them (an error message naming a sample's file and line, a substitute
for a failed item).

Objects the owner also holds apart (the dataset's shard channel, its failure policy) are named in the deferred
pickle rather than copied: unpickled, the deferred objects refer to the owner's own (one channel per worker).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["Deferred"]

# Values never named in a deferred pickle: equal ones are interchangeable, and a small int or a str is one
# object for many uses (naming it would tie a deferred value to an unrelated attribute of the owner).
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


class _Pickler(ForkingPickler):
    """multiprocessing's pickler (its reducers for sockets, fds, tensors), naming the owner's objects."""

    def __init__(self, file: io.BytesIO, names: dict[int, str]) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._names = names

    def persistent_id(self, obj: Any) -> str | None:
        return None if isinstance(obj, _PLAIN) else self._names.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: Mapping[str, Any]) -> None:
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, str) or pid not in self._shared:
            raise pickle.UnpicklingError(f"a deferred pickle names {pid!r}, which its owner does not hold")
        return self._shared[pid]


class Deferred:
    """``value`` as a pickle, unpickled by :meth:`load`.

    Args:
        value: what to pickle (every object it refers to, but those of ``shared``).
        shared: the owner's other attributes by name: an object of them that ``value`` refers to is pickled as its
            name, and :meth:`load` puts in its place the object of that name given to :meth:`bind`.

    Examples:
        >>> import pickle
        >>> channel, book = ["the channel"], {"reader": "r"}
        >>> book["channel"] = channel
        >>> d = pickle.loads(pickle.dumps(Deferred(book, {"channel": channel})))
        >>> same = ["the worker's channel"]
        >>> d.bind({"channel": same})
        >>> d.load()["channel"] is same
        True
    """

    __slots__ = ("_data", "_shared")

    def __init__(self, value: Any, shared: Mapping[str, Any]) -> None:
        names = {id(v): k for k, v in shared.items() if not isinstance(v, _PLAIN)}
        buf = io.BytesIO()
        _Pickler(buf, names).dump(value)
        self._data = buf.getvalue()
        self._shared: Mapping[str, Any] = shared

    @classmethod
    def _of(cls, data: bytes) -> Deferred:
        deferred = cls.__new__(cls)
        deferred._data, deferred._shared = data, {}
        return deferred

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return Deferred._of, (self._data,)

    def __len__(self) -> int:
        """The size of the pickle in bytes."""
        return len(self._data)

    def bind(self, shared: Mapping[str, Any]) -> None:
        """The owner's objects that the pickle names (once unpickled, in the process that will :meth:`load`)."""
        self._shared = shared

    def load(self) -> Any:
        """The value, unpickled (its classes' modules imported now)."""
        return _Unpickler(io.BytesIO(self._data), self._shared).load()
