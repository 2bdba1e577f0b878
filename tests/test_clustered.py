"""Clustered projection (Amer et al. Sec. 2.3) on CPU: the paper's example, exactness on the active columns,
full-coverage maps == full decoding, refused maps, per-row vs union, always-active ids, no state between
calls, the inactive-mass estimate. The CuPy kernels are checked against these torch paths in tests/gpu/.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.cluster_map import (
    save_cluster_map,
)
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.kernels import create_projection
from fastvocab.kernels.base import ProjectionOutput
from fastvocab.kernels.cluster_assign import merged_csr
from fastvocab.kernels.clustered import ClusteredProjection
from fastvocab.kernels.clustered_parts import SELECTIONS
from tests.conftest import synthetic_sentences
from tests.layers import (
    decode,
    fingerprint,
    make,
    map_from_sets,
    map_from_states,
    map_set,
    paper_case,
    projection_sets,
    random_layer,
    random_map,
    rows_near,
)

# --------------------------------------------------------------------------------------------------- helpers


def own_set(proj: ClusteredProjection, c: int) -> set[int]:
    return set(projection_sets(proj)[c].tolist())


# --------------------------------------------------------------------------------------- the paper's example


def test_paper_example_union_columns_and_logits():
    w, b, cmap, h = paper_case()
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection="union")
    assert proj.assign(h).tolist() == [0, 1, 2]
    out = proj(h)
    assert out.ids.tolist() == [1, 2, 3, 4, 6, 8, 9]  # the paper's reduced column set
    mask = torch.zeros(10, dtype=torch.bool)
    mask[out.ids] = True
    assert mask.int().tolist() == [0, 1, 1, 1, 1, 0, 1, 0, 1, 1]  # the paper's boolean list
    full = torch.nn.functional.linear(h, w, b)
    torch.testing.assert_close(out.logits, full[:, out.ids], rtol=0, atol=1e-6)
    dense = out.dense()
    assert torch.isinf(dense[:, [0, 5, 7]]).all() and (dense[:, [0, 5, 7]] < 0).all()


def test_paper_example_per_row_sets():
    w, b, cmap, h = paper_case()
    out = create_projection("clustered", w, b, cluster_map=cmap, selection="per-row")(h)
    assert out.ids.shape == (3, 3) and out.logits.shape == (3, 3)
    dense = out.dense()
    got = [set(torch.isfinite(dense[i]).nonzero().squeeze(1).tolist()) for i in range(3)]
    assert got == [{2, 4, 6}, {2, 8, 9}, {1, 3}]
    assert out.active_columns().tolist() == [3, 3, 2]
    assert torch.isinf(out.logits[2, 2]) and out.ids[2, 2].item() in (1, 3)  # padding repeats a valid id
    full = torch.nn.functional.linear(h, w, b)
    fin = torch.isfinite(dense)
    torch.testing.assert_close(dense[fin], full[fin], rtol=0, atol=1e-6)


def test_merged_csr_adds_always_active_once():
    indptr = np.array([0, 3, 6, 8], dtype=np.int64)
    indices = np.array([2, 4, 6, 2, 8, 9, 1, 3], dtype=np.int32)
    ptr, ids = merged_csr(indptr, indices, 10, np.array([2, 5], dtype=np.int64))
    sets = [ids[ptr[c] : ptr[c + 1]].tolist() for c in range(3)]
    assert sets == [[2, 4, 5, 6], [2, 5, 8, 9], [1, 2, 3, 5]]


# ------------------------------------------------------------------------------------------------- exactness


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=5e-2)}


@pytest.mark.parametrize("mode", SELECTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_mb", [0.0, None])
def test_logits_equal_full_on_active_columns_and_neg_inf_elsewhere(mode, dtype, cache_mb):
    w, b = random_layer(dtype=dtype)
    cmap = random_map(w, b)
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, cache_mb=cache_mb)
    clusters = [0, 0, 3, 7, 3, 11, 5]
    h = rows_near(cmap, clusters, dtype=dtype)
    assert proj.assign(h).tolist() == clusters
    out = proj(h)
    dense = out.dense()  # (rows, N)
    full = torch.nn.functional.linear(h, w, b)
    computed = torch.isfinite(dense)
    for i, c in enumerate(clusters):
        expect = own_set(proj, c) if mode == "per-row" else set().union(*(own_set(proj, k) for k in clusters))
        assert set(computed[i].nonzero().squeeze(1).tolist()) == expect
    assert (dense[~computed] == -math.inf).all()
    torch.testing.assert_close(dense[computed].float(), full[computed].float(), **TOL[dtype])


@pytest.mark.parametrize("bias", [True, False])
def test_no_bias_model(bias):
    w, b = random_layer(bias=bias)
    cmap = random_map(w, b)
    h = rows_near(cmap, [1, 2])
    out = create_projection("clustered", w, b, cluster_map=cmap)(h)
    full = torch.nn.functional.linear(h, w, b)
    torch.testing.assert_close(out.logits, full[:, out.ids])


@pytest.mark.parametrize("mode", SELECTIONS)
def test_per_row_equals_union_on_each_rows_own_columns(mode):
    w, b = random_layer(seed=3)
    cmap = random_map(w, b, seed=3)
    clusters = [4, 4, 9, 1, 0, 9]
    h = rows_near(cmap, clusters, seed=3)
    union = create_projection("clustered", w, b, cluster_map=cmap, selection="union")(h).dense()
    per_row = create_projection("clustered", w, b, cluster_map=cmap, selection="per-row")(h).dense()
    own = torch.isfinite(per_row)
    assert (torch.isfinite(union) | ~own).all()  # a row's own set lies within the union
    torch.testing.assert_close(per_row[own], union[own], rtol=1e-5, atol=1e-5)
    assert own.sum() < torch.isfinite(union).sum()  # and per-row computes less


def test_rows_in_one_cluster_share_ids_in_both_modes():
    w, b = random_layer()
    cmap = random_map(w, b)
    h = rows_near(cmap, [5, 5, 5])
    for mode in SELECTIONS:
        out = create_projection("clustered", w, b, cluster_map=cmap, selection=mode)(h)
        assert out.ids.dim() == 1 and out.logits.shape == (3, out.ids.numel())


def test_cached_and_gathered_paths_agree():
    w, b = random_layer()
    cmap = random_map(w, b)
    h = rows_near(cmap, [2, 2, 6, 8])
    for mode in SELECTIONS:
        cached = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, cache_mb=64)
        plain = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, cache_mb=0)
        assert cached._map.cached_bytes > 0 and plain._map.cached_bytes == 0
        a, c = cached(h), plain(h)
        torch.testing.assert_close(a.dense(), c.dense(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 3])
def test_blockwise_cpu_gather_equals_one_gather(switch, bias, rows):
    from fastvocab.kernels import gather

    w, b = random_layer(bias=bias)
    cols = torch.tensor(sorted(np.random.default_rng(0).choice(300, 77, replace=False).tolist()))
    h = torch.randn(rows, 16)
    one = gather.gathered_logits(h, w, b, cols)
    switch(GATHER_CHUNK_BYTES=10 * 16 * 4)  # blocks of 10 rows, last one 7
    blocks = gather.gathered_logits(h, w, b, cols)
    assert blocks.shape == (rows, 77) and blocks.is_contiguous()
    torch.testing.assert_close(blocks, one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(blocks, torch.nn.functional.linear(h, w, b)[:, cols], rtol=1e-5, atol=1e-5)


def test_cache_cap_keeps_most_populated_clusters():
    w, b = random_layer(d=16)
    rng = np.random.default_rng(0)
    sets = [rng.choice(300, 20, replace=False).tolist() for _ in range(4)]
    counts = [[1] * 20, [9] * 20, [5] * 20, [2] * 20]  # populations 20, 180, 100, 40
    cmap = map_from_sets(rng.standard_normal((4, 16)), sets, 300, fingerprint(w, b), counts)
    two_blocks = 2 * 20 * 16 * 4 / 2**20  # MB
    proj = create_projection("clustered", w, b, cluster_map=cmap, cache_mb=two_blocks)
    assert [blk is not None for blk in proj._map.blocks] == [False, True, True, False]


# ------------------------------------------------------------------------------------ maps refused / options


def test_mismatched_fingerprint_is_refused(tmp_path):
    w, b = random_layer()
    other_w, _ = random_layer(seed=9)
    cmap = random_map(other_w, b)  # built for another model
    with pytest.raises(ArtifactError, match=r"was built for model .* but the loaded model is"):
        create_projection("clustered", w, b, cluster_map=cmap)
    save_cluster_map(cmap, tmp_path / "en-it")
    with pytest.raises(ArtifactError, match="was built for model"):
        create_projection("clustered", w, b, cluster_map=tmp_path / "en-it")


def test_map_folder_loads_and_missing_folder_is_an_artifact_error(tmp_path):
    w, b = random_layer()
    cmap = random_map(w, b)
    save_cluster_map(cmap, tmp_path / "en-it")
    h = rows_near(cmap, [3])
    a = create_projection("clustered", w, b, cluster_map=tmp_path / "en-it")(h)
    c = create_projection("clustered", w, b, cluster_map=cmap)(h)
    assert torch.equal(a.ids, c.ids) and torch.equal(a.logits, c.logits)
    with pytest.raises(ArtifactError, match="no cluster map"):
        create_projection("clustered", w, b, cluster_map=tmp_path / "nowhere")


@pytest.mark.parametrize(
    "options,match",
    [
        ({"selection": "rows"}, "selection must be one of union, per-row"),
        ({"inactive_mass": "guess"}, "inactive_mass must be one of none, centroid, moments"),
        ({"backend": "tpu"}, "backend must be one of auto, torch, cupy"),
        ({"backend": "cupy"}, "needs a CUDA device"),
        ({"min_count": 0}, "min_count must be an integer >= 1"),
        ({"cache_mb": -1}, "cache_mb must be >= 0"),
        ({"probes": 0}, "probes must be an integer >= 1"),
        ({"probes": 2, "selection": "per-row"}, "probes > 1 needs union selection"),
        ({"centroids": 3}, "bad options for method 'clustered'"),
    ],
)
def test_bad_options_fail_loudly(options, match):
    w, b = random_layer()
    with pytest.raises(ValueError, match=match):
        create_projection("clustered", w, b, cluster_map=random_map(w, b), **options)


def test_signature_names_selection_and_map():
    w, b = random_layer()
    proj = create_projection("clustered", w, b, cluster_map=random_map(w, b), selection="per-row")
    sig = proj.signature()
    assert (
        sig.startswith("method:clustered|")
        and "selection:per-row" in sig
        and "map:en-it/direction/r12/K3" in sig
    )
    assert proj.backend == "torch"


def test_min_count_prunes_rare_ids_but_keeps_always_active():
    w, b = random_layer()
    sets = [[1, 5, 9, 20], [2, 6]]
    counts = [[3, 1, 2, 1], [1, 4]]
    cmap = map_from_sets(np.eye(2, 16) * 5, sets, 300, fingerprint(w, b), counts)
    proj = create_projection("clustered", w, b, cluster_map=cmap, min_count=2, always_active=[20, 2])
    assert [s.tolist() for s in projection_sets(proj)] == [[1, 2, 9, 20], [2, 6, 20]]


def test_empty_cluster_is_never_chosen():
    w, b = random_layer()
    cmap = random_map(w, b, r=3, extra_empty=1)  # cluster 3: empty set
    h = rows_near(cmap, [3, 3])  # right on the empty cluster's centroid
    proj = create_projection("clustered", w, b, cluster_map=cmap)
    assert 3 not in proj.assign(h).tolist()
    assert proj(h).ids.numel() > 0


def test_core_imports_and_runs_without_cupy():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'cupy' or name.startswith('cupy.'):\n"
        "            raise ImportError('cupy blocked for this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch\n"
        "from fastvocab.kernels import create_projection, available_projections\n"
        "from fastvocab.kernels.clustered import ClusteredProjection\n"
        "assert 'clustered' in available_projections()\n"
        "assert 'cupy' not in sys.modules\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


# --------------------------------------------------------------------------------------------- always active


@pytest.mark.parametrize("mode", SELECTIONS)
def test_always_active_ids_are_computed_for_every_row_and_can_win(mode):
    w, b = random_layer()
    cmap = random_map(w, b)
    clusters = [0, 4, 9]
    h = rows_near(cmap, clusters)
    eos, tags = 2, [250, 251]
    for c in clusters:
        assert eos not in map_set(cmap, c).tolist()
    w2 = w.clone()
    w2[eos] = 50.0 * h[1] / h[1].norm()  # EOS dominates row 1
    fp2 = fingerprint(w2, b)
    cmap2 = map_from_sets(cmap.centroids, [map_set(cmap, c).tolist() for c in range(12)], 300, fp2)
    proj = create_projection(
        "clustered", w2, b, cluster_map=cmap2, selection=mode, always_active=[eos, *tags]
    )
    out = proj(h)
    dense = out.dense()
    assert torch.isfinite(dense[:, [eos, *tags]]).all()
    _, top = out.topk(1)
    assert top[1, 0].item() == eos


# ---------------------------------------------------------------------------------------------------- probes


def test_probes_add_the_sets_of_each_rows_nearest_clusters_to_the_union():
    w, b = random_layer()
    cmap = random_map(w, b)
    h = rows_near(cmap, [0, 4, 9], noise=1.0, seed=3)
    one = create_projection("clustered", w, b, cluster_map=cmap)
    plain = one(h)
    dist = torch.cdist(h, torch.from_numpy(cmap.centroids))  # (rows, r)
    for probes in (1, 2, 3):
        proj = create_projection("clustered", w, b, cluster_map=cmap, probes=probes)
        near = dist.topk(probes, dim=1, largest=False).indices
        want = sorted(set().union(*(own_set(proj, c) for c in near.reshape(-1).tolist())))
        out = proj(h)
        assert out.ids.tolist() == want
        full = torch.nn.functional.linear(h, w, b)
        torch.testing.assert_close(out.logits, full[:, out.ids], rtol=0, atol=1e-5)
        assert proj.assign(h).tolist() == near[:, 0].tolist()
        assert ("probes:" in proj.signature()) == (probes > 1)
    assert out.ids.numel() > plain.ids.numel()
    with pytest.raises(ValueError, match="probes > 1 with the eager step"):
        proj.capturable(3)


def test_probes_default_to_the_maps_own_and_per_row_reads_one_cluster():
    w, b = random_layer()
    cmap = random_map(w, b)
    h = rows_near(cmap, [0, 4, 9], noise=1.0, seed=3)
    cmap.manifest.probes = 3  # as maps.probes: 3 records it

    def build(**options):
        return create_projection("clustered", w, b, cluster_map=cmap, **options)

    assert build().probes == 3 and build(probes=1).probes == 1 and build(selection="per-row").probes == 1
    assert build()(h).ids.tolist() == build(probes=3)(h).ids.tolist()
    assert build()(h).ids.numel() > build(probes=1)(h).ids.numel()


def test_probes_take_the_other_clusters_columns_off_the_nearests_normaliser_estimate():
    """One row, so its union is its nearest cluster's set plus the second cluster's: the estimate of the mass
    left out is the nearest cluster's, less the exact mass of the second cluster's columns it computed."""
    from fastvocab.tasks.maps import attach_normaliser

    w, b = random_layer(300, 16, seed=8)
    cmap = random_map(w, b, r=5, size=20, seed=8)
    attach_normaliser(cmap, w, b, [], rank=4)
    h = rows_near(cmap, [2], noise=0.5, seed=1)

    def project(probes):
        proj = create_projection(
            "clustered", w, b, cluster_map=cmap, inactive_mass="normaliser", probes=probes
        )
        return proj, proj(h)

    proj, one = project(1)
    _, two = project(2)
    extra = sorted(set(two.ids.tolist()) - set(one.ids.tolist()))
    assert extra and set(one.ids.tolist()) == own_set(proj, int(proj.assign(h)[0]))
    full = torch.nn.functional.linear(h, w, b)[0].double()
    want = torch.log(torch.exp(one.log_inactive_mass.double()) - torch.exp(full[extra]).sum())
    torch.testing.assert_close(two.log_inactive_mass.double(), want, rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------------ no state between calls


@pytest.mark.parametrize("mode", SELECTIONS)
@pytest.mark.parametrize("cache_mb", [0.0, None])
def test_consecutive_batches_equal_fresh_objects(mode, cache_mb):
    w, b = random_layer()
    cmap = random_map(w, b)
    batches = [rows_near(cmap, cl, seed=i) for i, cl in enumerate([[0, 1], [5, 5, 6], [11], [2, 3, 4, 7]])]
    shared = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, cache_mb=cache_mb)
    for h in batches:
        got = shared(h)
        fresh = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, cache_mb=cache_mb)(h)
        assert torch.equal(got.ids, fresh.ids)
        assert torch.equal(got.logits, fresh.logits)


# --------------------------------------------------------------------------------------------- inactive mass


def lm_like_case(seed):
    """Logits of a few nats' spread, each cluster's set = the top 30 ids of its centroid's logits."""
    w, b = random_layer(seed=seed)
    w = 0.2 * w
    rng = np.random.default_rng(seed)
    centroids = 3.0 * rng.standard_normal((12, 16))
    z = torch.nn.functional.linear(torch.from_numpy(centroids).float(), w, b)
    sets = [torch.topk(z[c], 30).indices.tolist() for c in range(12)]
    cmap = map_from_sets(centroids, sets, 300, fingerprint(w, b))
    return w, b, cmap, rows_near(cmap, [0, 3, 3, 8], noise=0.5, seed=seed)


@pytest.mark.parametrize("estimator", ["centroid", "moments", "normaliser"])
@pytest.mark.parametrize("mode", SELECTIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_inactive_mass_is_finite_and_takes_probability(estimator, mode, seed):
    w, b, cmap, h = lm_like_case(seed)
    out = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, inactive_mass=estimator)(h)
    assert out.log_inactive_mass is not None and out.log_inactive_mass.shape == (4,)
    assert torch.isfinite(out.log_inactive_mass).all()
    total = out.log_probs().exp().sum(dim=1)
    assert (total < 1.0).all() and (total > 0.0).all()
    # the estimate is of the right order: within one nat of the true inactive log-mass
    full = torch.nn.functional.linear(h, w, b)
    dense = out.dense()
    true = torch.logsumexp(full.masked_fill(torch.isfinite(dense), -math.inf), dim=1)
    assert ((out.log_inactive_mass - true).abs() < 1.0).all()


@pytest.mark.parametrize("mode", SELECTIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_moments_estimator_tracks_the_true_inactive_mass(mode, seed):
    """The row's inactive mean and variance are exact; only the tail shape comes from the centroid."""
    w, b, cmap, h = lm_like_case(seed)
    full = torch.nn.functional.linear(h, w, b)
    errors = {}
    for est in ("centroid", "moments", "normaliser"):
        out = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, inactive_mass=est)(h)
        true = torch.logsumexp(full.masked_fill(torch.isfinite(out.dense()), -math.inf), dim=1)
        errors[est] = (out.log_inactive_mass - true).abs().mean().item()
    assert errors["moments"] < 0.15 and errors["moments"] < errors["centroid"]
    assert errors["normaliser"] < errors["moments"]


@pytest.mark.parametrize("rows", [1, 4, 33])
@pytest.mark.parametrize("bias", [True, False])
def test_moments_without_padding_equals_the_padded_reading(rows, bias):
    """A union's rows computed every column: ``padded=False`` skips the -inf scan (on CPU one compiled call,
    its sums in float64) and gives the same mass to float32 rounding, at any row count and with or without
    a bias; a union of every column leaves no mass."""
    from fastvocab.kernels.inactive_mass import inactive_log_mass, mass_tables

    w, b, cmap, h = lm_like_case(0)
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection="union", inactive_mass="moments")
    noise = torch.randn(36, h.shape[1], generator=torch.Generator().manual_seed(1))
    h = (h.repeat(9, 1) + 0.1 * noise)[:rows]
    out = proj(h)
    assert out.ids is not None and out.ids.dim() == 1 and torch.isfinite(out.logits).all()
    clusters = torch.arange(rows) % len(cmap.indptr[1:])
    tables = mass_tables(proj.prepared_map, w, b if bias else None)
    assert tables.has_bias == bias
    args = ("moments", h, out.logits, clusters, w.shape[0], tables)
    got, want = inactive_log_mass(*args, padded=False), inactive_log_mass(*args)
    assert got.dtype == want.dtype == torch.float32 and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-5)
    every = torch.nn.functional.linear(h, w, b)  # all N columns computed: nothing is inactive
    assert torch.equal(inactive_log_mass("moments", h, every, clusters, w.shape[0], tables, padded=False),
                       torch.full((rows,), -math.inf))  # fmt: skip


def test_moments_without_a_bias_skips_its_terms_and_agrees_with_a_zero_bias():
    """A model without bias: the step adds no bias terms (``has_bias``), and reads the same mass as the
    same weights with a zero bias, whose terms it adds; per-cluster statistics are read by one index."""
    from fastvocab.kernels.inactive_mass import inactive_log_mass, mass_tables

    w, b, cmap, h = lm_like_case(0)
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection="union", inactive_mass="moments")
    out = proj(h)
    pm = proj.prepared_map
    none, zero = mass_tables(pm, w, None), mass_tables(pm, w, torch.zeros_like(b))
    assert not none.has_bias and zero.has_bias
    assert torch.equal(none.per_cluster[:, 0], none.excess) and (none.per_cluster[:, 1] >= 1e-6).all()
    clusters = torch.arange(h.shape[0]) % pm.r
    got = [
        inactive_log_mass("moments", h, out.logits, clusters, w.shape[0], t, padded=False)
        for t in (none, zero)
    ]
    assert torch.isfinite(got[0]).all()
    torch.testing.assert_close(got[0], got[1], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("estimator", ["centroid", "moments", "normaliser"])
def test_inactive_mass_vanishes_with_full_coverage(estimator):
    w, b = random_layer()
    cmap = map_from_sets(np.eye(2, 16) * 3, [list(range(300))] * 2, 300, fingerprint(w, b))
    h = rows_near(cmap, [0, 1])
    out = create_projection("clustered", w, b, cluster_map=cmap, inactive_mass=estimator)(h)
    assert (out.log_inactive_mass == -math.inf).all()
    torch.testing.assert_close(out.log_probs(), torch.log_softmax(torch.nn.functional.linear(h, w, b), -1))


@pytest.mark.parametrize("mode", SELECTIONS)
def test_oracle_mass_is_the_exact_mass_of_the_columns_not_computed(mode):
    """The fidelity diagnostic ``oracle``: the computed columns' log-probs are exactly full softmax's."""
    w, b, cmap, h = lm_like_case(3)
    out = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, inactive_mass="oracle")(h)
    full = torch.nn.functional.linear(h, w, b)
    true = torch.logsumexp(full.masked_fill(torch.isfinite(out.dense()), -math.inf), dim=1)
    torch.testing.assert_close(out.log_inactive_mass, true)
    computed = torch.isfinite(out.dense())
    assert (computed.sum(dim=1) < w.shape[0]).all()  # something was left out: the mass matters
    want = torch.log_softmax(full, dim=1)[computed]
    got = ProjectionOutput(out.log_probs(), out.ids, out.n_vocab).dense()[computed]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", SELECTIONS)
def test_mass_radius_gives_only_far_rows_the_exact_mass(mode):
    w, b, cmap, h = lm_like_case(4)
    h = h.clone()
    h[1] = torch.from_numpy(cmap.centroids[3]) + 0.01  # near its centroid
    h[2] = torch.from_numpy(cmap.centroids[3]) + 3.0  # far from it
    full = torch.log_softmax(torch.nn.functional.linear(h, w, b), dim=1)

    opts = {"cluster_map": cmap, "selection": mode, "inactive_mass": "normaliser"}

    def run(radius):
        proj = create_projection("clustered", w, b, **opts, mass_radius=radius)
        return proj(h), proj

    plain = create_projection("clustered", w, b, **opts)(h)
    out, proj = run(1.0)
    far = proj.counters["far"]
    assert 0 < far < 4 and proj.options()["mass_radius"] == 1.0
    assert out.ids is not None  # the step stays sparse: same columns, same logits
    torch.testing.assert_close(out.logits, plain.logits, rtol=0, atol=0)
    computed = torch.isfinite(out.dense())
    lp = ProjectionOutput(out.log_probs(), out.ids, out.n_vocab).dense()
    # the far row: full softmax's log-probs on the columns it computed (the exact mass of the others)
    torch.testing.assert_close(lp[2][computed[2]], full[2][computed[2]], rtol=0, atol=1e-5)
    assert not torch.allclose(plain.log_inactive_mass[2], out.log_inactive_mass[2])  # the estimate was off
    near = ProjectionOutput(plain.log_probs(), plain.ids, plain.n_vocab).dense()
    torch.testing.assert_close(lp[1], near[1])  # the near row: as without a radius
    out, proj = run(1e-6)  # every row is far: full softmax's log-probs on every computed column
    lp = ProjectionOutput(out.log_probs(), out.ids, out.n_vocab).dense()
    torch.testing.assert_close(lp[computed], full[computed], rtol=0, atol=1e-5)
    assert proj.counters["far"] == 4
    out, proj = run(1e6)  # no row is far
    assert proj.counters["far"] == 0 and out.ids is not None
    with pytest.raises(ValueError, match="mass_radius"):
        create_projection("clustered", w, b, cluster_map=cmap, mass_radius=1.0)  # no estimate to correct


def normaliser_truth(proj, h: torch.Tensor) -> torch.Tensor:
    """logsumexp of the full logits over the columns each row's own cluster leaves out, (rows,) float64."""
    full = torch.nn.functional.linear(h, proj.weight, proj.bias).double()
    for row, c in enumerate(proj.assign(h).tolist()):
        full[row, projection_sets(proj)[c]] = -math.inf
    return torch.logsumexp(full, dim=1)


@pytest.mark.parametrize("mode", SELECTIONS)
def test_normaliser_is_exact_at_the_centroid(mode):
    """At h = C_c the expansion is the stored logsumexp itself: the estimate equals the true inactive mass,
    in a union batch too (where the other rows' columns are taken off it)."""
    w, b = random_layer(300, 16, seed=4)
    cmap = random_map(w, b, r=6, size=20, seed=4)
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, inactive_mass="normaliser")
    h = torch.from_numpy(cmap.centroids[[0, 2, 2, 5]])
    out = proj(h)
    true = torch.logsumexp(
        torch.nn.functional.linear(h, w, b).double().masked_fill(torch.isfinite(out.dense()), -math.inf), 1
    )
    torch.testing.assert_close(out.log_inactive_mass.double(), true, rtol=0, atol=1e-4)
    # float32 sums: the order of a reduction varies with the thread count earlier tests leave behind
    want = normaliser_truth(proj, h[[0, 1, 3]])
    torch.testing.assert_close(proj._mass.lse[[0, 2, 5]].double(), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("rank", [0, 4, 16])
def test_normaliser_reduces_the_mass_error_of_no_estimate_on_random_states(rank):
    """Random states around and away from their centroid: the second-order expansion's log-normaliser error
    is far below that of leaving the inactive columns out (``none``): 0.012-0.027 nats against 1.1."""
    errors = {}
    for seed in range(3):
        w, b = random_layer(300, 16, seed=seed)
        cmap = random_map(w, b, r=12, size=30, seed=seed)  # random sets: most of the mass is left out
        h = rows_near(cmap, list(range(12)) * 4, noise=0.2, seed=seed)
        full = torch.nn.functional.linear(h, w, b)
        cmap.manifest.normaliser = {"rank": rank}  # no stored tables: computed at load, at this rank
        proj = create_projection("clustered", w, b, cluster_map=cmap, inactive_mass="normaliser")
        out = proj(h)
        want = torch.logsumexp(full, dim=1)
        got = torch.logaddexp(torch.logsumexp(out.logits, dim=1), out.log_inactive_mass)
        none = torch.logsumexp(out.logits, dim=1)
        errors.setdefault("normaliser", []).append((got - want).abs().mean().item())
        errors.setdefault("none", []).append((none - want).abs().mean().item())
    assert np.mean(errors["normaliser"]) < 0.1 * np.mean(errors["none"]), errors


def test_stored_normaliser_is_used_only_for_the_sets_it_was_built_for():
    from fastvocab.tasks.maps import attach_normaliser

    w, b = random_layer(300, 16, seed=8)
    cmap = random_map(w, b, r=5, size=20, seed=8)
    cmap.counts[::3] = 5  # min_count=2 prunes the other ids
    attach_normaliser(cmap, w, b, [0, 7], rank=4)
    h = rows_near(cmap, [0, 1, 2, 3, 4], noise=0.3)

    def build(**options):
        return create_projection("clustered", w, b, cluster_map=cmap, inactive_mass="normaliser", **options)

    stored = build(always_active=[0, 7])
    assert stored.normaliser_source == "map"
    recomputed = build(
        always_active=[0, 7], min_count=2
    )  # pruned sets: the stored one does not describe them
    other_ids = build(always_active=[1])
    assert recomputed.normaliser_source == other_ids.normaliser_source == "computed at load"
    for proj in (stored, recomputed, other_ids):
        c = torch.arange(5)
        at_c = torch.from_numpy(cmap.centroids)
        torch.testing.assert_close(
            proj._mass.lse.double(), normaliser_truth(proj, at_c)[c], rtol=0, atol=1e-4
        )
        assert torch.isfinite(proj(h).log_inactive_mass).all()


def test_no_estimate_by_default():
    w, b = random_layer()
    out = create_projection("clustered", w, b, cluster_map=random_map(w, b))(rows_near(random_map(w, b), [1]))
    assert out.log_inactive_mass is None


# ------------------------------------------------------------------------------------- decoding (tiny model)


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small GEMMs: one thread is faster and keeps numerics fixed; restored below
    yield Seq2SeqAdapter.load(tiny_model_dir)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sampled_map(adapter):
    """A map from the tiny model's own states (greedy, full projection, top-3), like the pipeline's."""
    from fastvocab.decoding.search import greedy_search

    states, topk = [], []

    def hook(rec):
        states.append(rec.hidden.float().numpy())
        topk.append(torch.topk(rec.output.logits, 3, dim=-1).indices.numpy())

    full = make(adapter, "full")
    texts = synthetic_sentences("en", 24, seed=7)
    batch = adapter.encode_texts(texts, "en", "it")
    greedy_search(adapter, full, batch, "en", "it", max_len=12, step_hook=hook)
    s, t = np.concatenate(states), np.concatenate(topk)
    cmap = map_from_states(s, t, r=8, n_vocab=adapter.n_vocab, fp=adapter.fingerprint)
    assert cmap.active_fractions().max() < 0.5  # a real candidate-set map, not a full one
    return cmap


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("mode", SELECTIONS)
def test_full_coverage_map_decodes_exactly_like_full(adapter, beam, mode):
    n = adapter.n_vocab
    rng = np.random.default_rng(0)
    cmap = map_from_sets(
        rng.standard_normal((3, adapter.d_model)), [list(range(n))] * 3, n, adapter.fingerprint
    )
    texts = synthetic_sentences("en", 5, seed=3)
    full = decode(adapter, make(adapter, "full"), texts, beam)
    mass = "centroid" if beam > 1 else "none"
    clustered = decode(
        adapter, make(adapter, "clustered", cluster_map=cmap, selection=mode, inactive_mass=mass), texts, beam
    )
    assert clustered == full
    assert any(len(s) > 0 for s in full)


@pytest.mark.parametrize("mode", SELECTIONS)
def test_consecutive_decoding_batches_equal_fresh_projection(adapter, sampled_map, mode):
    texts_a = synthetic_sentences("en", 4, seed=11)
    texts_b = synthetic_sentences("en", 4, seed=12)
    shared = make(adapter, "clustered", cluster_map=sampled_map, selection=mode)
    seen: list[set[int]] = []
    shared_ids = shared._project

    def spy(h):
        out = shared_ids(h)
        seen.append(set(out.ids.reshape(-1).tolist()))
        return out

    shared._project = spy
    decode(adapter, shared, texts_a, beam=2)
    assert len({frozenset(s) for s in seen}) > 1  # the candidate sets did change between steps
    got = decode(adapter, shared, texts_b, beam=2)
    fresh = decode(
        adapter, make(adapter, "clustered", cluster_map=sampled_map, selection=mode), texts_b, beam=2
    )
    assert got == fresh


def test_sampled_map_decoding_matches_full_on_its_own_sentences(adapter, sampled_map):
    """States seen at map-building time: greedy decoding with the clustered layer reproduces full softmax
    (each state's own top-3 is in its cluster's set, so its argmax is computed)."""
    texts = synthetic_sentences("en", 24, seed=7)[:6]
    full = decode(adapter, make(adapter, "full"), texts)
    for mode in SELECTIONS:
        assert (
            decode(adapter, make(adapter, "clustered", cluster_map=sampled_map, selection=mode), texts)
            == full
        )


# ----------------------------------------------------------------------------------------- benchmark plumbing


def run_script(name: str, argv: list[str]) -> None:
    """Run a benchmark script as users do, in its own process: the scripts set process-wide torch state
    (thread count) that must not leak into the rest of the suite."""
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    done = subprocess.run([sys.executable, str(path), *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_bench_projection_runs_and_records(tmp_path):
    import json

    out = tmp_path / "p.json"
    args = ["--sizes", "3000:64", "--rows", "1,4", "--fractions", "0.1", "--set-ratios", "0.5", "--r", "16"]
    run_script(
        "bench_projection", [*args, "--repeats", "2", "--inner", "2", "--threads", "1", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    assert data["meta"]["commit"] and data["meta"]["torch"] == torch.__version__
    methods = {(r["rows"], r["method"]) for r in data["results"]}
    assert methods == {(k, m) for k in (1, 4) for m in ("full", "union", "per-row")}
    for r in data["results"]:
        assert r["time_us"] > 0 and r["ratio_vs_full"] > 0 and r["bytes_read"] > 0
        if r["method"] != "full":
            assert 0 < r["per_row_fraction"] <= r["union_fraction"] <= 0.1 + 1e-9
    assert data["crossover"][0]["rows"] == [1, 4]
