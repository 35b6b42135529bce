from __future__ import annotations

import pytest

from rank_dataset.training.sampler import RandomSampler


@pytest.mark.parametrize("n", [0, 1, 2, 10, 100_001])
def test_each_epoch_a_permutation(n: int) -> None:
    s = RandomSampler(range(n), seed=4)
    orders = []
    for epoch in range(3):
        s.set_epoch(epoch)
        order = list(s)
        assert sorted(order) == list(range(n))
        assert len(s) == n
        assert order == list(s) == s.order().tolist()  # the same for the same (seed, epoch)
        orders.append(order)
    if n > 10:
        assert orders[0] != orders[1] != orders[2]
        assert orders[0] != list(range(n))


def test_seed_changes_order_and_validation() -> None:
    assert list(RandomSampler(range(50), seed=1)) != list(RandomSampler(range(50), seed=2))
    with pytest.raises(TypeError, match="data_source must have a length"):
        RandomSampler(iter([1]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        RandomSampler(range(3)).set_epoch(-1)
