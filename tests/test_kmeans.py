"""Faiss k-means per direction: determinism (byte-identical), deterministic sampling, result folder."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from fastvocab.artifacts_schema.digest import footer_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import ShardMeta, shard_table
from fastvocab.artifacts_schema.kmeans_result import load_kmeans, save_kmeans
from fastvocab.tasks.kmeans import sample_states, train_kmeans


def blobs(n=6000, d=16, centers=20, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, d)) * 5
    return (c[rng.integers(0, centers, n)] + rng.standard_normal((n, d))).astype(np.float32)


@pytest.mark.parametrize("threads", [1, 2])
def test_same_seed_same_data_byte_identical(threads):
    x = blobs()
    c1, i1 = train_kmeans(x, 20, niter=10, seed=7, max_points_per_centroid=100, threads=threads)
    c2, i2 = train_kmeans(x.copy(), 20, niter=10, seed=7, max_points_per_centroid=100, threads=threads)
    assert c1.shape == (20, 16) and c1.dtype == np.float32
    assert c1.tobytes() == c2.tobytes()
    assert i1.objective == i2.objective and 1 <= len(i1.objective) <= 10  # Faiss may stop once converged
    assert i1.n_train == 2000 and i1.n_available == 6000  # Faiss' own (seeded) subsample: r * max_points
    # not vacuous: another seed starts elsewhere and ends elsewhere
    c3, _ = train_kmeans(x, 20, niter=10, seed=8, max_points_per_centroid=100, threads=threads)
    assert c3.tobytes() != c1.tobytes()


def test_objective_decreases_and_centroids_fit_the_blobs():
    x = blobs()
    _, info = train_kmeans(x, 20, niter=15, seed=1, max_points_per_centroid=1000, threads=1)
    assert info.objective[-1] < info.objective[0]
    # far below one centroid's objective (total scatter; the blobs are far apart)
    assert info.final_objective < 0.25 * ((x - x.mean(0)) ** 2).sum()


def test_too_few_states_is_a_clear_error():
    with pytest.raises(ValueError, match="at least r=50"):
        train_kmeans(blobs(n=10), 50)


def write_shards(tmp_path, sizes, d=8):
    files, all_h = [], []
    meta = ShardMeta("fp", d, 2, "en-it")
    for i, n in enumerate(sizes):
        h = np.random.default_rng(i).standard_normal((n, d)).astype(np.float16)
        path = tmp_path / f"part-{i:05d}.parquet"
        pq.write_table(shard_table(meta, np.arange(n), np.zeros(n), h, np.zeros((n, 2), np.int32)), path)
        files.append(path)
        all_h.append(h.astype(np.float32))
    return files, np.concatenate(all_h)


def test_sample_states_is_seeded_and_streams_the_right_rows(tmp_path):
    files, everything = write_shards(tmp_path, [70, 5, 130])
    x, total = sample_states(files, None, seed=0, batch_size=32)
    assert total == 205
    np.testing.assert_array_equal(x, everything)
    s1, _ = sample_states(files, 50, seed=3, batch_size=32)
    s2, _ = sample_states(files, 50, seed=3, batch_size=64)  # batching does not change the sample
    s3, _ = sample_states(files, 50, seed=4, batch_size=32)
    assert s1.shape == (50, 8)
    np.testing.assert_array_equal(s1, s2)
    assert not np.array_equal(s1, s3)
    picks = np.sort(np.random.default_rng(3).choice(205, 50, replace=False))
    np.testing.assert_array_equal(s1, everything[picks])


def test_result_folder_roundtrip_and_corruption(tmp_path):
    files, _ = write_shards(tmp_path, [40])
    digest = footer_digest(files)
    assert digest == footer_digest(list(reversed(files)))
    c, info = train_kmeans(blobs(n=400, d=8), 4, niter=5, seed=0, threads=1)
    info.inputs_digest = digest
    out = save_kmeans(c, info, tmp_path / "kmeans" / "en-it")
    c2, info2 = load_kmeans(out)
    assert c2.tobytes() == c.tobytes() and info2 == info
    (out / "centroids.safetensors").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match=r"corrupt k-means centroids in .*en-it"):
        load_kmeans(out)
    with pytest.raises(ArtifactError, match="no k-means result"):
        load_kmeans(tmp_path / "nothing")
