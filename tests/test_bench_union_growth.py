"""benchmarks/bench_union_growth.py: the real sets it builds at a chosen fraction are the sets the pipeline's
map builder makes from the same top-K ids, and its batch unions count what a batch's rows would compute."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fastvocab.tasks.maps import build_active_sets

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def ug():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_union_growth

        yield bench_union_growth
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_first_ranks_give_the_map_builders_sets_at_every_k(ug):
    rng = np.random.default_rng(0)
    n, r, kmax = 50, 4, 6
    top = np.stack([rng.permutation(n)[:kmax] for _ in range(40)]).astype(np.int32)
    clusters = rng.integers(0, r, size=len(top))
    ranks = ug.first_ranks(clusters, top, r, n)
    for k in range(1, kmax + 1):
        indptr, indices, _ = build_active_sets(clusters, top[:, :k], r, n)
        active = ranks < k
        np.testing.assert_array_equal(np.diff(indptr), active.sum(1))
        np.testing.assert_array_equal(indices, np.nonzero(active)[1])


def test_sets_at_fraction_picks_the_smallest_k_that_reaches_it(ug):
    rng = np.random.default_rng(1)
    n, r = 100, 5
    top = np.stack([rng.permutation(n)[:30] for _ in range(60)]).astype(np.int32)
    ranks = ug.first_ranks(rng.integers(0, r, size=len(top)), top, r, n)
    k, indptr, indices = ug.sets_at_fraction(ranks, 0.4)
    mean = np.diff(indptr).mean() / n
    assert mean >= 0.4
    assert (ranks < k - 1).sum() / r / n < 0.4  # one K fewer falls short
    assert len(indices) == indptr[-1] and (indices < n).all()
    with pytest.raises(SystemExit, match="raise --kmax"):
        ug.sets_at_fraction(ranks, 0.99)


def test_batch_union_counts_each_batch_step_by_its_rows(ug):
    n = 10
    indptr = np.array([0, 2, 4, 6])  # cluster 0: {0, 1}, 1: {1, 2}, 2: {7, 8}
    indices = np.array([0, 1, 1, 2, 7, 8])
    # batch 2: sentences 0 and 1 share a batch, sentence 2 is alone
    sent = np.array([0, 1, 0, 2])
    step = np.array([0, 0, 1, 0])
    clusters = np.array([0, 1, 2, 2])
    got = ug.batch_union(clusters, sent, step, 2, indptr, indices, n)
    # (batch 0, step 0): clusters {0, 1} -> 3 ids, 2 rows; (0, 1): {2} -> 2 ids; (1, 0): {2} -> 2 ids
    assert got["union_fraction"] == pytest.approx((0.3 * 2 + 0.2 + 0.2) / 4)
    assert got["distinct_clusters"] == pytest.approx((2 * 2 + 1 + 1) / 4)
