"""CuPy kernels of the clustered projection against their torch twins (``kernels/cluster_assign.py``,
``kernels/gather.py``).

Skipped with a reason without a CUDA GPU or without CuPy. On a GPU machine:

    .venv/bin/python -m pytest -q tests/gpu/test_cupy_kernels.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: checks the CuPy kernels of the clustered projection",
)
if torch.cuda.is_available():
    pytest.importorskip(
        "cupy", reason="needs CuPy on the GPU machine (the gpu extra: cupy-cuda13x for a cu13x torch)"
    )

from fastvocab.kernels import create_projection  # noqa: E402
from fastvocab.kernels.cluster_assign import assign_clusters, union_columns  # noqa: E402
from fastvocab.kernels.gather import gathered_logits, group_rows  # noqa: E402
from tests.gpu.common import DEV, HALF, TOL, csr, layer, make_map, random_sets, rows_near_centroids  # noqa: E402


@pytest.fixture(scope="module")
def cu():
    from fastvocab.kernels import cupy_ops

    return cupy_ops


def needs_mma():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the gather kernel needs compute capability 8.0+ (mma.sync m16n8k16)")


# ----------------------------------------------------------------------------------------------------- bridge


def test_dlpack_bridge_is_zero_copy(cu):
    t = torch.arange(10, device=DEV, dtype=torch.float32)
    a = cu.to_cupy(t)
    a[0] = 42.0
    assert t[0].item() == 42.0
    back = torch.from_dlpack(a)  # and back: the same memory
    assert back.data_ptr() == t.data_ptr() and back.device == t.device


# ----------------------------------------------------------------------------------------------------- assign


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,r", [(1, 7), (40, 2000), (300, 257)])
def test_assign_matches_torch(cu, dtype, rows, r):
    g = torch.Generator().manual_seed(rows + r)
    c = torch.randn(r, 64, generator=g)
    c[r // 2] = c[1]  # a tie: the lowest index must win, as in torch.argmin
    sq = (c * c).sum(1)
    sq[0] = math.inf  # an empty cluster: never chosen
    h = (c[torch.randint(0, r, (rows,), generator=g)] + 0.1 * torch.randn(rows, 64, generator=g)).to(DEV)
    ct = c.T.contiguous().to(DEV, dtype)
    sq = sq.to(DEV)
    dots = h.to(dtype) @ ct  # (rows, r): the GEMM both paths share
    got = cu.assign(dots, sq)
    want = (sq - 2.0 * dots.float()).argmin(dim=1)
    assert torch.equal(got, want)
    if dtype != torch.float32:  # fp32 centroids take addmm in the torch path: another GEMM, same argmin here
        assert assign_clusters(h, ct, sq).equal(want)


# ------------------------------------------------------------------------------------------- mask, compaction


def test_mark_and_compact_paper_example(cu):
    indptr, indices = csr([[2, 4, 6], [2, 8, 9], [1, 3]])
    clusters = torch.tensor([0, 1, 2], device=DEV)
    mask = cu.mark_active(clusters, indptr, indices, 10, max_set=3)
    assert mask.tolist() == [0, 1, 1, 1, 1, 0, 1, 0, 1, 1]
    cols32, cols64 = cu.compact(mask)
    assert cols64.tolist() == [1, 2, 3, 4, 6, 8, 9] and cols32.tolist() == cols64.tolist()
    assert cols32.dtype == torch.int32 and cols64.dtype == torch.int64


@pytest.mark.parametrize("rows", [1, 2, 40, 200])
def test_mark_and_compact_match_union_columns(cu, rows):
    n_vocab, r = 50_000, 64
    sets = random_sets(n_vocab, r, [1, 500, 3000, 9000])
    indptr, indices = csr(sets)
    clusters = torch.randint(0, r, (rows,), generator=torch.Generator().manual_seed(rows)).to(DEV)
    mask = cu.mark_active(clusters, indptr, indices, n_vocab, max_set=max(len(s) for s in sets))
    _, cols = cu.compact(mask)
    ids = [indices[indptr[c] : indptr[c + 1]].long() for c in range(r)]
    assert torch.equal(cols, union_columns(clusters.tolist(), ids, n_vocab))


def test_group_rows_matches_python_grouping(cu):
    clusters_list = [5, 1, 5, 5, 0, 1] + [7] * 37 + [2]
    clusters = torch.tensor(clusters_list, device=DEV)
    order, grp_cluster, grp_rows = cu.group_rows(clusters, 16)
    expect_order = [row for rows in group_rows(clusters_list).values() for row in rows]
    assert order.tolist() == expect_order
    assert grp_cluster.tolist() == [clusters_list[i] for i in expect_order]
    leaders = {i: n for i, n in enumerate(grp_rows.tolist()) if n}
    # groups: cluster 0 (1 row), 1 (2), 2 (1), 5 (3), 7 (37 rows -> 16 + 16 + 5)
    assert sorted(leaders.values()) == sorted([1, 2, 1, 3, 16, 16, 5])
    assert sum(leaders.values()) == len(clusters_list)


# ------------------------------------------------------------------------------------------------ gather-GEMM


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 40, 128, 200])
@pytest.mark.parametrize("bias", [True, False])
def test_gather_gemm_union_matches_torch(cu, dtype, rows, bias):
    needs_mma()
    w, b = layer(dtype=dtype, bias=bias)
    cols = torch.from_numpy(np.sort(np.random.default_rng(rows).choice(3000, 333, replace=False))).to(DEV)
    h = torch.randn(rows, w.shape[1], device=DEV).to(dtype)
    got = cu.gather_gemm_union(h, w, b, cols.to(torch.int32))
    assert got.dtype == dtype and got.shape == (rows, 333)
    torch.testing.assert_close(got, gathered_logits(h, w, b, cols), **TOL[dtype])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("clusters", [[3], [1, 1, 4, 0, 2, 3, 3], [2] * 20 + [5, 0] * 10])
def test_gather_gemm_per_row_matches_torch(cu, dtype, clusters):
    needs_mma()
    w, b = layer(dtype=dtype)
    sets = random_sets(3000, 6, [1, 15, 16, 17, 200, 700], seed=len(clusters))
    indptr, indices = csr(sets)
    width = max(len(s) for s in sets)
    h = torch.randn(len(clusters), w.shape[1], device=DEV).to(dtype)
    cl = torch.tensor(clusters, device=DEV)
    logits, ids = cu.gather_gemm_per_row(h, w, b, cl, indptr, indices, width)
    assert logits.shape == ids.shape == (len(clusters), width)
    for i, c in enumerate(clusters):
        s = indices[indptr[c] : indptr[c + 1]].long()
        n = s.numel()
        assert torch.equal(ids[i, :n], s) and (ids[i, n:] == s[0]).all()
        assert torch.isneginf(logits[i, n:]).all()
        torch.testing.assert_close(logits[i, :n], gathered_logits(h[i : i + 1], w, b, s)[0], **TOL[dtype])


def test_gather_gemm_rejects_what_it_cannot_do(cu):
    w, b = layer(d=100)  # d % 32 != 0
    with pytest.raises(ValueError, match="d % 32 == 0"):
        cu.gather_gemm_union(
            torch.zeros(1, 100, device=DEV, dtype=w.dtype), w, b, torch.zeros(1, dtype=torch.int32)
        )
    w, b = layer()
    with pytest.raises(ValueError, match="cols must be"):
        cu.gather_gemm_union(torch.zeros(1, 128, device=DEV, dtype=w.dtype), w, b, torch.zeros(1, device=DEV))


# --------------------------------------------------------------------------------------------- the projection


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["union", "per-row"])
@pytest.mark.parametrize("mass", ["none", "centroid", "moments"])
def test_cupy_backend_equals_torch_backend(dtype, mode, mass):
    needs_mma()
    w, b = layer(dtype=dtype, seed=1)
    cmap = make_map(w, b, random_sets(3000, 40, [50, 300, 900], seed=1), seed=1)
    kw = dict(cluster_map=cmap, selection=mode, inactive_mass=mass, always_active=[2, 2999])
    fast = create_projection("clustered", w, b, backend="cupy", **kw)
    ref = create_projection("clustered", w, b, backend="torch", **kw)
    assert fast.backend == "cupy" and ref.backend == "torch"
    rng = np.random.default_rng(1)
    for rows in (1, 3, 40):
        which = rng.integers(0, 40, rows)
        h = torch.from_numpy(
            cmap.centroids[which] + 0.05 * rng.standard_normal((rows, 128)).astype(np.float32)
        )
        h = h.to(DEV, dtype)
        assert torch.equal(fast.assign(h), ref.assign(h))
        a, c = fast(h), ref(h)
        da, dc = a.dense(), c.dense()
        assert torch.equal(torch.isfinite(da), torch.isfinite(dc))  # the same columns, whatever the padding
        fin = torch.isfinite(dc)
        torch.testing.assert_close(da[fin], dc[fin], **TOL[dtype])
        if mode == "union":
            assert torch.equal(a.ids, c.ids)
        if mass != "none":
            torch.testing.assert_close(a.log_inactive_mass, c.log_inactive_mass, rtol=1e-2, atol=5e-2)


def test_backend_choice_from_device_and_dtype():
    needs_mma()
    w16, b16 = layer(dtype=torch.float16)
    cmap = make_map(w16, b16, random_sets(3000, 4, [100]))
    assert create_projection("clustered", w16, b16, cluster_map=cmap).backend == "cupy"
    w32, b32 = w16.float(), b16.float()
    cmap32 = make_map(w32, b32, random_sets(3000, 4, [100]))  # same values: fp16 -> fp32 is exact
    assert create_projection("clustered", w32, b32, cluster_map=cmap32).backend == "torch"
    with pytest.raises(ValueError, match="fp16/bf16"):
        create_projection("clustered", w32, b32, cluster_map=cmap32, backend="cupy")


@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_cupy_consecutive_batches_equal_fresh_objects(mode):
    needs_mma()
    w, b = layer(seed=2)
    cmap = make_map(w, b, random_sets(3000, 30, [40, 400], seed=2), seed=2)
    shared = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="cupy")
    rng = np.random.default_rng(2)
    for rows in (5, 1, 17, 2):
        which = rng.integers(0, 30, rows)
        h = torch.from_numpy(
            cmap.centroids[which] + 0.05 * rng.standard_normal((rows, 128)).astype(np.float32)
        )
        h = h.to(DEV, torch.float16)
        got = shared(h)
        fresh = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="cupy")(h)
        assert torch.equal(got.ids, fresh.ids) and torch.equal(got.logits, fresh.logits)


def test_cupy_backend_takes_strided_and_offset_hidden_states():
    needs_mma()
    w, b = layer(seed=3)
    cmap = make_map(w, b, random_sets(3000, 10, [100, 300], seed=3), seed=3)
    rng = np.random.default_rng(3)
    h = torch.from_numpy(cmap.centroids[rng.integers(0, 10, 6)]).to(DEV, torch.float16)  # (6, 128)
    wide = torch.cat([h, h], dim=1)[:, :128]  # non-contiguous, like the decoder's last-position slice
    buf = torch.zeros(6 * 128 + 1, device=DEV, dtype=h.dtype)
    buf[1:] = h.reshape(-1)
    offset = buf[1:].view(6, 128)  # contiguous but 2 bytes off a 16-byte boundary
    for mode in ("union", "per-row"):
        fast = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="cupy")
        want = fast(h).dense()
        for variant in (wide, offset):
            torch.testing.assert_close(fast(variant).dense(), want, rtol=0, atol=0)


# ------------------------------------------------------------------------------- the CuPy path end to end


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_cupy_path_assign_equals_torch_assign(dtype, mode):
    # The projection's public assign() is the torch one; the CuPy step assigns with cupy_ops.assign.
    needs_mma()
    w, b = layer(dtype=dtype, seed=4)
    cmap = make_map(w, b, random_sets(3000, 300, [20, 200], seed=4), seed=4)
    fast = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="cupy")
    for rows in (1, 40, 200):
        h = rows_near_centroids(cmap, rows, rows, dtype)
        _, _, clusters = fast._project_cupy(h)
        assert torch.equal(clusters, assign_clusters(h, fast._map.centroids_t, fast._map.sq_norms))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_cupy_outputs_equal_full_logits_on_their_columns(dtype, mode):
    needs_mma()
    w, b = layer(dtype=dtype, seed=5)
    sets = random_sets(3000, 30, [10, 100, 700], seed=5)
    cmap = make_map(w, b, sets, seed=5)
    fast = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="cupy")
    for rows in (1, 9, 40):
        h = rows_near_centroids(cmap, rows, 50 + rows, dtype)
        out = fast(h)
        dense = out.dense()  # (rows, N), -inf where nothing was computed
        clusters = fast.assign(h).tolist()
        for i, c in enumerate(clusters):  # the columns: the row's own set, or the batch's union
            want = set(sets[c]) if mode == "per-row" else set().union(*(set(sets[k]) for k in clusters))
            assert set(torch.isfinite(dense[i]).nonzero()[:, 0].tolist()) == want
        full = torch.nn.functional.linear(h.float(), w.float(), b.float())  # fp32 reference
        fin = torch.isfinite(dense)
        torch.testing.assert_close(dense[fin].float(), full[fin], **TOL[dtype])


def _torch_twin(w, b, cmap, mode):
    return create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="torch")


def _same_as_torch_or_raises(proj, ref, h, match):
    """The unsupported input either gives the torch path's numbers or a clear ValueError, never others."""
    try:
        got = proj(h)
    except ValueError as exc:
        assert match in str(exc), f"unclear error: {exc}"
        return "raised"
    want = ref(h)
    da, dw = got.dense(), want.dense()
    assert torch.equal(torch.isfinite(da), torch.isfinite(dw))
    fin = torch.isfinite(dw)
    torch.testing.assert_close(da[fin].float(), dw[fin].float(), rtol=2e-3, atol=2e-3)
    return "computed"


@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_bias_dtype_differing_from_weight(mode):
    needs_mma()
    w, b = layer(seed=6)
    cmap = make_map(w, b, random_sets(3000, 10, [100], seed=6), seed=6)
    b32 = b.float()  # the same values in float32: the same fingerprint
    proj = create_projection("clustered", w, b32, cluster_map=cmap, selection=mode)
    ref = _torch_twin(w, b32, cmap, mode)
    _same_as_torch_or_raises(proj, ref, rows_near_centroids(cmap, 5, 6, torch.float16), "bias")


@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_weight_not_16_byte_aligned(mode):
    needs_mma()
    w, b = layer(seed=7)
    buf = torch.empty(w.numel() + 1, dtype=w.dtype, device=DEV)
    w_off = buf[1:].view_as(w)  # contiguous, 2 bytes off a 16-byte boundary
    w_off.copy_(w)
    assert w_off.data_ptr() % 16
    cmap = make_map(w, b, random_sets(3000, 10, [100], seed=7), seed=7)
    proj = create_projection("clustered", w_off, b, cluster_map=cmap, selection=mode)
    ref = _torch_twin(w, b, cmap, mode)
    _same_as_torch_or_raises(proj, ref, rows_near_centroids(cmap, 5, 7, torch.float16), "aligned")


def test_d_not_multiple_of_32_takes_the_torch_path():
    w, b = layer(d=100, seed=8)
    cmap = make_map(w, b, random_sets(3000, 10, [100], seed=8), seed=8)
    auto = create_projection("clustered", w, b, cluster_map=cmap)
    assert auto.backend == "torch"
    with pytest.raises(ValueError, match="d % 32"):
        create_projection("clustered", w, b, cluster_map=cmap, backend="cupy")
    h = rows_near_centroids(cmap, 4, 8, torch.float16)
    torch.testing.assert_close(auto(h).dense(), _torch_twin(w, b, cmap, "union")(h).dense())


@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_more_than_65535_rows(mode):
    # CUDA grids hold at most 65,535 blocks in y: fv_mark_active puts the rows there (union), per-row mode
    # hands batches over 1,024 rows to torch. Either the right numbers or a clear error.
    needs_mma()
    w, b = layer(seed=9)
    cmap = make_map(w, b, random_sets(3000, 8, [30, 60], seed=9), seed=9)
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, backend="cupy")
    ref = _torch_twin(w, b, cmap, mode)
    h = rows_near_centroids(cmap, 70_000, 9, torch.float16)
    _same_as_torch_or_raises(proj, ref, h, "rows")


@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_sets_narrower_than_the_beams_candidates(mode):
    # beam 4 asks every row for its 2k = 8 best: sets of 1-3 ids (always-active ids included) have fewer.
    needs_mma()
    w, b = layer(seed=10)
    cmap = make_map(w, b, random_sets(3000, 12, [1, 2], seed=10), seed=10)
    kw = dict(cluster_map=cmap, selection=mode, always_active=[2])
    fast = create_projection("clustered", w, b, backend="cupy", **kw)
    ref = create_projection("clustered", w, b, backend="torch", **kw)
    for rows in (1, 8):
        h = rows_near_centroids(cmap, rows, 10 + rows, torch.float16)
        va, ia = fast(h).topk(8)
        vr, ir = ref(h).topk(8)
        assert va.shape == vr.shape
        assert torch.equal(torch.isfinite(va), torch.isfinite(vr))  # padding never gets a finite score
        fin = torch.isfinite(vr)
        assert torch.equal(ia[fin], ir[fin])
        torch.testing.assert_close(va[fin], vr[fin], rtol=2e-3, atol=2e-3)
