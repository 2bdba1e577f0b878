"""``unique_ids``: ``np.unique``'s answer for integer arrays, by one sort."""

from __future__ import annotations

import numpy as np
import pytest

from fastvocab.kernels.id_sets import unique_ids


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64, np.uint16])
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (500,), (40, 30)])
def test_unique_ids_equal_numpys(dtype, shape):
    rng = np.random.default_rng(sum(shape))
    values = rng.integers(0, 50, size=shape).astype(dtype)  # many repeats
    kept = values.copy()
    got = unique_ids(values)
    want = np.unique(values)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(values, kept)  # the caller's array is not sorted in place
    if values.size > 50:
        assert len(got) < values.size  # repeats (50 values at most) were dropped


def test_unique_ids_of_sorted_runs_with_extras():
    """The shape of a CSR's keys: sorted runs per row, then the always-active ids of every row appended."""
    rows, n_vocab = 30, 1000
    rng = np.random.default_rng(0)
    runs = [r * n_vocab + np.sort(rng.choice(n_vocab, 40, replace=False)) for r in range(rows)]
    extra = (np.arange(rows)[:, None] * n_vocab + np.array([0, 1, 2])[None, :]).reshape(-1)
    keys = np.concatenate([*runs, extra]).astype(np.int64)
    assert np.array_equal(unique_ids(keys), np.unique(keys))
