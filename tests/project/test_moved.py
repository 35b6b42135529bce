"""The names and modules that moved into sub-packages still work for one release, each with a
DeprecationWarning that names its new place."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import rank_dataset
from rank_dataset._moved import MOVED_MODULES, MOVED_NAMES


@pytest.mark.parametrize("name", sorted(MOVED_NAMES))
def test_a_moved_top_level_name_warns_and_is_the_same_object(name: str) -> None:
    module, attr = MOVED_NAMES[name]
    with pytest.warns(DeprecationWarning, match=rf"rank_dataset\.{name} moved to {module}\.{attr}"):
        old = getattr(rank_dataset, name)
    assert old is getattr(importlib.import_module(module), attr)
    assert name not in rank_dataset.__all__


@pytest.mark.slow  # a fresh interpreter per old module path
def test_every_old_module_path_imports_with_a_warning() -> None:
    # In a fresh interpreter, where none has been imported yet: the warning comes at the first import.
    code = (
        "import importlib, json, warnings\n"
        "from rank_dataset._moved import MOVED_MODULES\n"
        "said = {}\n"
        "for old in MOVED_MODULES:\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        importlib.import_module(old)\n"
        "    said[old] = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        "print(json.dumps(said))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    said = json.loads(out.stdout)
    assert sorted(said) == sorted(MOVED_MODULES)
    for old, messages in said.items():
        new = " and ".join(MOVED_MODULES[old])
        assert messages == [f"{old} moved to {new} and will be removed in rank-dataset 0.3"]


def test_names_of_an_old_module_resolve_to_the_new_objects() -> None:
    with pytest.warns(DeprecationWarning):
        metafile = importlib.import_module("rank_dataset.metafile")
        mix = importlib.import_module("rank_dataset.mix")
    assert metafile.MetaFile is rank_dataset.MetaFile
    assert mix.Source is rank_dataset.Source
    assert "MetaFile" in dir(metafile)
    with pytest.raises(AttributeError, match=r"rank_dataset\.metafile.*no_such_name"):
        metafile.no_such_name  # noqa: B018


def test_the_public_api_fits_on_a_screen() -> None:
    assert rank_dataset.__all__ == sorted(rank_dataset.__all__)
    assert len(rank_dataset.__all__) <= 27  # 23, two errors users catch (#42), StepSampler (#45), monitor (#46)
    for name in rank_dataset.__all__:
        assert getattr(rank_dataset, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        rank_dataset.nothing_here  # noqa: B018


def test_every_error_users_catch_is_in_errors_and_public() -> None:
    import rank_dataset.errors as errors
    from rank_dataset.shards.collective import CollectiveError  # where it was first defined: still importable

    assert CollectiveError is errors.CollectiveError is rank_dataset.CollectiveError
    assert rank_dataset.CorruptMetaFileError is errors.CorruptMetaFileError
    assert set(errors.__all__) <= set(rank_dataset.__all__)
    assert all(issubclass(getattr(errors, name), (Exception, Warning)) for name in errors.__all__)
