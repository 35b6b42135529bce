from __future__ import annotations

import numpy as np
import pytest

from rank_dataset.plan.permutation import permute

SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 64, 100, 255, 256, 257, 1000, 4097, 65535, 65537, 100_003]


@pytest.mark.parametrize("n", SIZES)
def test_is_a_permutation(n: int) -> None:
    for seed, epoch in [(0, 0), (1, 0), (0, 1), (12345, 7)]:
        p = permute(n, seed, epoch, np.arange(n))
        assert p.dtype == np.int64
        assert np.array_equal(np.sort(p), np.arange(n))


def test_slices_agree_with_the_whole() -> None:
    n = 50_000
    whole = permute(n, 3, 4, np.arange(n))
    rng = np.random.default_rng(0)
    pos = rng.integers(0, n, 1000)
    assert np.array_equal(permute(n, 3, 4, pos), whole[pos])
    assert np.array_equal(permute(n, 3, 4, np.arange(10, 20)), whole[10:20])
    assert np.array_equal(permute(n, 3, 4, pos.reshape(10, 100)), whole[pos].reshape(10, 100))


def test_fixed_by_seed_and_epoch_alone() -> None:
    n = 10_000
    a = permute(n, 1, 2, np.arange(n))
    assert np.array_equal(a, permute(n, 1, 2, np.arange(n)))
    assert not np.array_equal(a, permute(n, 1, 3, np.arange(n)))
    assert not np.array_equal(a, permute(n, 2, 2, np.arange(n)))


def test_large_n_without_materialising() -> None:
    n = 10**12  # an n-sized array would need 8 TB
    pos = np.arange(0, n, n // 1000)
    out = permute(n, 0, 0, pos)
    assert out.min() >= 0 and out.max() < n
    assert len(np.unique(out)) == len(out)


def test_looks_uniform() -> None:
    n = 1_000_000
    x = np.arange(n)
    p = permute(n, 0, 0, x)
    # No correlation between position and value, nor between neighbours.
    assert abs(np.corrcoef(x, p)[0, 1]) < 0.01
    assert abs(np.corrcoef(p[:-1], p[1:])[0, 1]) < 0.01
    # No block structure: the joint histogram of (position block, value block) is flat (chi-square).
    b = 50
    counts = np.histogram2d(x // (n // b), p // (n // b), bins=b)[0]
    expected = n / b / b
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = (b - 1) ** 2
    assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof)
    # Displacements look like a uniform shuffle's: mean |p - x| is n/3 for a uniform permutation.
    assert abs(np.abs(p - x).mean() / (n / 3) - 1) < 0.01


def test_epochs_are_independent() -> None:
    n = 100_000
    a, b = permute(n, 0, 0, np.arange(n)), permute(n, 0, 1, np.arange(n))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02
    assert np.mean(a == b) < 0.001


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"n must be in \[1"):
        permute(0, 0, 0, [0])
    with pytest.raises(TypeError, match="n must be an int"):
        permute(2.5, 0, 0, [0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"position 5 is outside \[0, 5\)"):
        permute(5, 0, 0, [0, 5])
    with pytest.raises(ValueError, match=r"position -1 is outside"):
        permute(5, 0, 0, [-1])
    with pytest.raises(TypeError, match="positions must be integers"):
        permute(5, 0, 0, [0.5])


@pytest.mark.parametrize("n", [1, 2, 5, 17, 100])
def test_permute_stream_is_the_concatenated_passes(n: int) -> None:
    from rank_dataset.plan.permutation import permute_stream

    stream = np.concatenate([permute(n, 4, j, np.arange(n)) for j in range(20)])
    rng = np.random.default_rng(n)
    for start in [0, 1, n - 1, n, 3 * n + 2]:
        for count in [0, 1, n, 5 * n, 12 * n]:  # one pass, a few (masks), many (sorted)
            offsets = rng.permutation(count)
            assert np.array_equal(permute_stream(n, 4, start, offsets), stream[start + offsets])
            # a caller's bound on the offsets gives the same samples
            assert np.array_equal(permute_stream(n, 4, start, offsets, stop=count), stream[start + offsets])
    assert permute_stream(n, 4, 2, np.arange(6).reshape(2, 3)).shape == (2, 3)
    with pytest.raises(ValueError, match="stream offsets must be >= 0"):
        permute_stream(n, 4, 0, [-1])


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 2**40 + 7, 2**53 + 1, 2**55, 2**62])
def test_permute_keyed_is_permute_elementwise(n: int) -> None:
    from rank_dataset.plan.permutation import grid_each, permute_keyed, round_keys_each

    rng = np.random.default_rng(n % 1000)
    pos = rng.integers(0, n, 64) if n > 1 else np.zeros(64, np.int64)
    seeds = rng.integers(0, 2**63, 64).astype(np.uint64)
    epochs = rng.integers(0, 50, 64)
    sizes = np.full(64, n, np.int64)
    got = permute_keyed(sizes, *grid_each(sizes), round_keys_each(seeds, epochs), pos)
    assert got.tolist() == [int(permute(n, int(s), int(e), int(p))) for s, e, p in zip(seeds, epochs, pos)]
