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


def test_the_order_is_drawn_a_chunk_at_a_time() -> None:
    # The training process holds a thousand positions of the order at a time, not the whole shard's
    # (4 bytes a sample before: 4 MB here, for the whole pass; issue 44).
    import itertools
    import tracemalloc

    n = 1_000_000
    sampler = RandomSampler(range(n), seed=1)
    expected = int(sampler.order()[:300_000].sum())  # (also loads what the first permutation loads, once)
    tracemalloc.start()
    try:
        total = sum(itertools.islice(iter(sampler), 300_000))  # drawn, not kept
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == expected
    assert peak < n // 10  # under a tenth of a byte a sample (about 50 KB: a chunk of the order and its ints)
