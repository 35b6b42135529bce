from __future__ import annotations

import pytest

from rank_dataset.plan.config import ReloadConfig


def test_defaults_and_original_keys() -> None:
    assert ReloadConfig.coerce(None) == ReloadConfig(mini_epoch=1, seed=0, mini_epoch_idx=0, epoch=0, group=1)
    cfg = ReloadConfig.coerce({"mini_epoch": 1, "seed": 3, "mini_epoch_idx": 0, "group": 1})
    assert cfg.seed == 3
    assert ReloadConfig.coerce(cfg) is cfg
    assert cfg.epoch_size is None and ReloadConfig.coerce({"epoch_size": 10}).epoch_size == 10
    assert cfg.aug_repeats == 1 and ReloadConfig.coerce({"aug_repeats": 3}).aug_repeats == 3


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            {"mini_epochs": 2},
            ValueError,
            r"unknown reload_cfg key 'mini_epochs' \(did you mean 'mini_epoch'\?\); valid keys are mini_epoch, seed",
        ),
        ({"shuffle": True}, ValueError, r"unknown reload_cfg key 'shuffle'; valid keys are mini_epoch, seed"),
        ({"mini_epoch": 0}, ValueError, r"reload_cfg\['mini_epoch'\] must be >= 1, got 0"),
        ({"mini_epoch": 2, "mini_epoch_idx": 2}, ValueError, r"mini_epoch_idx'\] must be in \[0, mini_epoch=2\)"),
        ({"epoch": -1}, ValueError, r"reload_cfg\['epoch'\] must be >= 0"),
        ({"group": 0}, ValueError, r"reload_cfg\['group'\] must be >= 1"),
        ({"epoch_size": 0}, ValueError, r"reload_cfg\['epoch_size'\] must be >= 1, got 0"),
        ({"epoch_size": 2.5}, TypeError, r"reload_cfg\['epoch_size'\] must be an int"),
        ({"aug_repeats": 0}, ValueError, r"reload_cfg\['aug_repeats'\] must be >= 1, got 0"),
        ({"aug_repeats": -3}, ValueError, r"reload_cfg\['aug_repeats'\] must be >= 1, got -3"),
        ({"aug_repeats": 2.0}, TypeError, r"reload_cfg\['aug_repeats'\] must be an int, got 2.0"),
        ({"aug_repeats": True}, TypeError, r"reload_cfg\['aug_repeats'\] must be an int"),
        ({"seed": "1"}, TypeError, r"reload_cfg\['seed'\] must be an int, got '1'"),
        ([("seed", 1)], TypeError, "reload_cfg must be a dict"),
    ],
)
def test_bad_values_are_named(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ReloadConfig.coerce(value)  # type: ignore[arg-type]
