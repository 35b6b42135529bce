"""The one place that tells an object's URL from a local path: :func:`open_source` opens a URL through
the factory registered for its scheme (:func:`register_scheme`; obstore's S3, GCS, Azure and HTTP
stores by default, imported on first use), a path as a :class:`~rank_dataset.files.io.local.LocalFile`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rank_dataset.core.checks import URL_SCHEMES, UrlPath, is_url, with_storage
from rank_dataset.files.io.base import ByteSource, SourceKey
from rank_dataset.files.io.local import LocalFile

__all__ = ["SourceFactory", "is_url", "open_source", "register_scheme"]

#: What opens the object at a URL: ``factory(url, key, checked)``, ``url`` a
#: :class:`~rank_dataset.core.checks.UrlPath` carrying its settings, ``key`` None (the object as it is
#: now) or the key it must have (checked at once unless ``checked`` is False: then its reads fail if
#: it is not).
SourceFactory = Callable[[UrlPath, Any, bool], ByteSource]


def _object_file(url: UrlPath, key: Any, checked: bool) -> ByteSource:
    from rank_dataset.files.io.object import ObjectFile  # on first use: local files import no obstore

    return ObjectFile(url, key, checked=checked)


_factories: dict[str, SourceFactory] = dict.fromkeys(URL_SCHEMES, _object_file)


def register_scheme(scheme: str, factory: SourceFactory) -> None:
    """Read URLs ``scheme://...`` through ``factory`` (see :data:`SourceFactory`) from now on, in this
    process: :class:`~rank_dataset.MetaFile`, the readers and grouping open them through it."""
    name = scheme.lower()
    if not name.isidentifier() or not name.isascii():
        raise ValueError(f"scheme must be a name such as 'hf', got {scheme!r}")
    _factories[name] = factory
    URL_SCHEMES.add(name)


def open_source(
    path_or_url: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    key: SourceKey | None = None,
    checked: bool = True,
) -> ByteSource:
    """The bytes of ``path_or_url``: an object's URL (a registered scheme) through its factory, with
    ``storage_options`` (a :class:`~rank_dataset.core.checks.UrlPath`'s own win), else the local file.

    With ``key``, the source must be the one ``key`` describes (MetaFileChangedError if not; with
    ``checked=False`` its reads or :meth:`~ByteSource.check` tell); without, it is as it is now.

    Raises:
        FileNotFoundError: no such file or object (without ``key``).
        MetaFileChangedError: it is not the one ``key`` describes.
    """
    if is_url(path_or_url):
        url: UrlPath = with_storage(path_or_url, storage_options)
        return _factories[url.split("://", 1)[0].lower()](url, key, checked)
    return LocalFile(Path(path_or_url), key, checked=checked)
