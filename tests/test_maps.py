"""Cluster assignment (Eq. 2) and active-set construction (Amer et al. Sec. 2.2)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from fastvocab.artifacts_schema.cluster_map import load_cluster_map, save_cluster_map
from fastvocab.artifacts_schema.hidden_states import ShardMeta, direction_dir, shard_table
from fastvocab.kernels import create_projection
from fastvocab.tasks.maps import (
    ActiveSetCounter,
    MapParams,
    assign,
    count_shards,
    group_directions,
    make_cluster_map,
    map_name,
)
from tests.layers import build_active_sets


def reference_sets(cluster_ids, topk_ids, r, min_count=1):
    """Dict-of-dicts oracle: cluster -> {token: count}."""
    out = [dict() for _ in range(r)]
    for c, row in zip(cluster_ids, topk_ids, strict=True):
        for t in row:
            out[int(c)][int(t)] = out[int(c)].get(int(t), 0) + 1
    return [{t: n for t, n in sorted(d.items()) if n >= min_count} for d in out]


def random_case(seed, n=500, r=7, k=3, n_vocab=40):
    rng = np.random.default_rng(seed)
    cluster_ids = rng.integers(0, r, n)
    # distinct ids per row, like a real top-K
    topk = np.stack([rng.choice(n_vocab, k, replace=False) for _ in range(n)]).astype(np.int32)
    return cluster_ids, topk


def test_paper_example_k3():
    # Two members of one cluster predict {2,4,6} and {2,8,9} -> active set {2,4,6,8,9} (Sec. 2.2).
    indptr, indices, counts = build_active_sets(np.array([0, 0]), np.array([[2, 4, 6], [2, 8, 9]]), r=1)
    assert indptr.tolist() == [0, 5]
    assert indices.tolist() == [2, 4, 6, 8, 9]
    assert counts.tolist() == [2, 1, 1, 1, 1]
    assert indptr.dtype == np.int64 and indices.dtype == np.int32 and counts.dtype == np.int32


def test_paper_example_in_two_clusters_keeps_them_apart():
    indptr, indices, _ = build_active_sets(np.array([1, 0]), np.array([[2, 4, 6], [2, 8, 9]]), r=3)
    assert indptr.tolist() == [0, 3, 6, 6]  # cluster 2 has no members: empty set
    assert indices[0:3].tolist() == [2, 8, 9] and indices[3:6].tolist() == [2, 4, 6]


@pytest.mark.parametrize("seed,min_count", [(0, 1), (1, 1), (2, 3)])
def test_csr_matches_reference_and_invariants(seed, min_count):
    cluster_ids, topk = random_case(seed)
    r = 7
    indptr, indices, counts = build_active_sets(cluster_ids, topk, r, n_vocab=40, min_count=min_count)
    assert indptr[0] == 0 and indptr[-1] == len(indices) == len(counts)
    assert np.all(np.diff(indptr) >= 0)
    ref = reference_sets(cluster_ids, topk, r, min_count)
    for c in range(r):
        ids = indices[indptr[c] : indptr[c + 1]]
        assert np.all(np.diff(ids) > 0), "ids sorted and unique within a cluster"
        assert dict(zip(ids.tolist(), counts[indptr[c] : indptr[c + 1]].tolist(), strict=True)) == ref[c]
    if min_count == 1:
        assert counts.sum() == topk.size


def test_streaming_counts_equal_batch_counts():
    cluster_ids, topk = random_case(3, n=1000)
    whole = ActiveSetCounter(7, 40)
    whole.add(cluster_ids, topk)
    # two "workers", each adding uneven batches, merged on the "driver"
    cuts = [0, 13, 14, 400, 401, 777, 1000]
    parts = [ActiveSetCounter(7, 40), ActiveSetCounter(7, 40)]
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        parts[i % 2].add(cluster_ids[lo:hi], topk[lo:hi])
    merged = ActiveSetCounter(7, 40)
    for p in parts:
        merged.merge(ActiveSetCounter.from_arrays(p.to_arrays()))  # as if returned by a Ray worker
    assert merged.states == whole.states == 1000
    for a, b in zip(merged.to_csr(), whole.to_csr(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_counter_rejects_out_of_range_ids():
    c = ActiveSetCounter(2, 10)
    with pytest.raises(ValueError, match="token ids"):
        c.add(np.array([0]), np.array([[10]]))
    with pytest.raises(ValueError, match="cluster ids"):
        c.add(np.array([2]), np.array([[1]]))
    with pytest.raises(ValueError, match="cannot merge"):
        c.merge(ActiveSetCounter(3, 10))


def test_assign_is_nearest_centroid_in_chunks():
    rng = np.random.default_rng(0)
    states = rng.standard_normal((1000, 16)).astype(np.float16)
    centroids = rng.standard_normal((50, 16)).astype(np.float32)
    dist = ((states.astype(np.float32)[:, None, :] - centroids[None]) ** 2).sum(-1)
    expected = dist.argmin(1)
    got = assign(states, centroids, chunk=128)
    # Eq. 2 drops ||h||^2, so float rounding may flip exact near-ties only
    agree = got == expected
    assert agree.mean() > 0.99
    assert np.allclose(dist[~agree, got[~agree]], dist[~agree, expected[~agree]], rtol=1e-4)
    np.testing.assert_array_equal(got, assign(states, centroids, chunk=10_000))
    with pytest.raises(ValueError, match="states must be"):
        assign(states[:, :8], centroids)


def test_a_map_assigns_near_ties_as_its_decoder_does():
    """States on near-ties between two centroids (a hair either side of the bisecting plane): the maps
    stage puts each in the cluster the clustered projection reads for it at decode time."""
    import torch

    from tests.layers import fingerprint, map_from_sets, random_layer

    rng = np.random.default_rng(3)
    d, r = 32, 6
    centroids = (4.0 * rng.standard_normal((r, d))).astype(np.float32)
    mid = (centroids[0] + centroids[1]) / 2
    normal = (centroids[1] - centroids[0]) / np.linalg.norm(centroids[1] - centroids[0])
    eps = np.linspace(-1e-5, 1e-5, 401, dtype=np.float32)[:, None]
    drift = 0.5 * rng.standard_normal((401, d)).astype(np.float32)
    drift -= (drift @ normal)[:, None] * normal  # along the plane: both distances change alike
    states = mid + drift + eps * normal
    w, b = random_layer(n_vocab=40, d=d)
    cmap = map_from_sets(centroids, [[i] for i in range(r)], 40, fingerprint(w, b))
    proj = create_projection("clustered", w, b, cluster_map=cmap)
    built = assign(states, centroids, chunk=64)
    decoded = proj.assign(torch.from_numpy(states)).numpy()
    assert set(built.tolist()) == {0, 1}  # the states do sit on the tie
    np.testing.assert_array_equal(built, decoded)


def test_group_directions_and_names():
    assert group_directions(["en-it", "it-en"], "direction") == {"en-it": ["en-it"], "it-en": ["it-en"]}
    assert group_directions(["fr-it", "en-it", "it-en"], "target") == {
        "to-en": ["it-en"],
        "to-it": ["en-it", "fr-it"],
    }
    assert map_name("target", ["fr-it", "en-it"]) == "to-it"
    assert map_name("direction", ["en-it"]) == "en-it"
    with pytest.raises(ValueError, match="one target"):
        map_name("target", ["en-it", "it-en"])
    with pytest.raises(ValueError, match="look like"):
        group_directions(["enit"], "direction")


def write_shard(root, direction, seed, n, d=8, k=3, n_vocab=40):
    rng = np.random.default_rng(seed)
    meta = ShardMeta("fp-test", d, k, direction)
    hidden = rng.standard_normal((n, d)).astype(np.float16)
    topk = np.stack([rng.choice(n_vocab, k, replace=False) for _ in range(n)]).astype(np.int32)
    path = direction_dir(root, direction) / "part-00000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(shard_table(meta, np.arange(n), np.zeros(n), hidden, topk), path)
    return path, hidden, topk


def test_target_scope_pools_directions_into_one_map(tmp_path):
    f1, h1, t1 = write_shard(tmp_path, "en-it", 0, 300)
    f2, h2, t2 = write_shard(tmp_path, "fr-it", 1, 200)
    centroids = np.random.default_rng(5).standard_normal((6, 8)).astype(np.float32)
    pooled = ActiveSetCounter(6, 40)
    for f in (f1, f2):  # stream each direction's shards into one counter
        count_shards([f], centroids, k=2, n_vocab=40, counter=pooled, batch_size=64)
    h, t = np.concatenate([h1, h2]), np.concatenate([t1, t2])
    expected = build_active_sets(assign(h, centroids), t[:, :2], 6, n_vocab=40)
    for a, b in zip(pooled.to_csr(), expected, strict=True):
        np.testing.assert_array_equal(a, b)
    only_en = count_shards([f1], centroids, k=2, n_vocab=40)
    assert pooled.states == 500 and only_en.states == 300
    assert len(pooled.keys) > len(only_en.keys)  # the pooled map is at least as wide, here wider

    cmap = make_cluster_map(
        centroids,
        pooled,
        MapParams(scope="target", k=2),
        model_fingerprint="fp-test",
        name=map_name("target", ["en-it", "fr-it"]),
        niter=20,
        seed=1,
        extra={"directions": ["en-it", "fr-it"]},
    )
    assert cmap.manifest.direction == "to-it" and cmap.manifest.states_used == 500
    frac = np.diff(cmap.indptr) / 40
    assert cmap.manifest.active_fraction["max"] == pytest.approx(frac.max())
    assert cmap.manifest.active_fraction["mean"] == pytest.approx(frac.mean())
    out = save_cluster_map(cmap, tmp_path / "maps" / "to-it")
    back = load_cluster_map(out, expect_fingerprint="fp-test")
    np.testing.assert_array_equal(back.indices, cmap.indices)
    np.testing.assert_allclose(back.centroid_sq_norms, (centroids**2).sum(1), rtol=1e-5)


def test_a_target_scope_manifest_of_the_earlier_spelling_still_reads(tmp_path):
    """Earlier maps' manifests named a target-scope map ``*-it`` (folder ``to-it``): read as ``to-it``."""
    from fastvocab.artifacts_schema.cluster_map import load_manifest
    from fastvocab.pipeline.checks import check_map_direction

    f, _, _ = write_shard(tmp_path, "en-it", 0, 50)
    centroids = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    counter = count_shards([f], centroids, k=2, n_vocab=40)
    target = MapParams(scope="target", k=2)
    cmap = make_cluster_map(
        centroids, counter, target, model_fingerprint="fp-test", name="to-it", niter=1, seed=1
    )
    cmap.manifest.direction = "*-it"  # as an earlier writer left it on disk
    out = save_cluster_map(cmap, tmp_path / "maps" / "to-it")
    assert json.loads((out / "manifest.json").read_text())["direction"] == "*-it"
    assert load_manifest(out).direction == "to-it"
    assert load_cluster_map(out).manifest.direction == "to-it"
    assert check_map_direction(out, "fr", "it").direction == "to-it"


def test_count_shards_rejects_k_above_recorded(tmp_path):
    f, _, _ = write_shard(tmp_path, "en-it", 0, 10)
    with pytest.raises(ValueError, match="exceeds the K=3"):
        count_shards([f], np.zeros((2, 8), np.float32), k=5, n_vocab=40)


def test_stored_normaliser_is_the_logsumexp_of_the_inactive_logits_at_the_centroid(tmp_path):
    """attach_normaliser (the maps stage) stores per cluster, for the columns outside its set and the
    always-active ids: the logsumexp of their logits at the centroid and its gradient there (the
    softmax-weighted mean of their rows of W); both survive a save and load."""
    import math

    import torch

    from fastvocab.tasks.maps import attach_normaliser
    from tests.layers import map_set

    rng = np.random.default_rng(3)
    n_vocab, d, r = 60, 8, 4
    w = torch.from_numpy(rng.standard_normal((n_vocab, d)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(n_vocab).astype(np.float32))
    centroids = rng.standard_normal((r, d)).astype(np.float32)
    counter = ActiveSetCounter(r, n_vocab)
    counter.add(np.arange(r).repeat(3), rng.integers(0, n_vocab, (3 * r, 4)))
    cmap = make_cluster_map(
        centroids, counter, MapParams(k=4), model_fingerprint="fp", name="en-it", niter=1, seed=0
    )
    attach_normaliser(cmap, w, b, always_active=[0, 5], rank=3)
    save_cluster_map(cmap, tmp_path / "m")
    back = load_cluster_map(tmp_path / "m")
    assert back.manifest.normaliser == {"rank": 3, "always_active": [0, 5]}
    z = (torch.from_numpy(centroids).double() @ w.double().T + b.double()).numpy()  # (r, N)
    for c in range(r):
        inactive = np.ones(n_vocab, bool)
        inactive[map_set(cmap, c)] = False
        inactive[[0, 5]] = False
        zi = z[c, inactive]
        lse = zi.max() + math.log(np.exp(zi - zi.max()).sum())
        p = np.exp(zi - lse)
        assert back.normaliser.lse[c] == pytest.approx(lse, abs=1e-4)
        np.testing.assert_allclose(back.normaliser.grad[c], p @ w.double().numpy()[inactive], atol=1e-5)
    assert back.normaliser.basis.shape == (d, 3) and back.normaliser.curv.shape == (r, 3, 3)


def test_a_map_records_the_probes_it_is_decoded_with():
    counter = ActiveSetCounter(2, 20)
    counter.add(np.array([0, 1]), np.array([[7, 3], [5, 9]]))
    kw = dict(model_fingerprint="fp", name="en-it", niter=1, seed=0)
    assert make_cluster_map(np.zeros((2, 2), np.float32), counter, MapParams(k=2), **kw).manifest.probes == 1
    three = MapParams(k=2, probes=3)
    assert make_cluster_map(np.zeros((2, 2), np.float32), counter, three, **kw).manifest.probes == 3
    with pytest.raises(ValueError, match="probes must be >= 1"):
        MapParams(probes=0)
