"""The clustered projection's ``int8`` option (CPU): the full int8 projection's logits on the active columns,
the float32 path's columns, both int8 union kernels, cached packed blocks, the certificate against full
int8, what it refuses, and ``--dtype int8 --method clustered`` through the translate CLI and the bulk worker.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastvocab.kernels import create_projection, int8, int8_union, popular
from fastvocab.kernels.clustered import ClusteredProjection
from fastvocab.switches import override as switches_override
from tests.layers import random_layer, random_map, rows_near

N, D = 400, 64


def layer_and_map(bias: float = 1.0, size: int = 60, r: int = 12):
    w, b = random_layer(n_vocab=N, d=D, seed=3, bias=bias)
    w = w * D**-0.5  # logits of order 1, as a trained layer's
    return w, b, random_map(w, b, r=r, size=size, seed=1)


def clustered(w, b, cmap, **options) -> ClusteredProjection:
    # the tests of the union kernels keep the map at every row count (skipping it has tests of its own)
    options.setdefault("full_when_cheaper", False)
    proj = create_projection("clustered", w, b, cluster_map=cmap, **options)
    assert isinstance(proj, ClusteredProjection)
    return proj


def batch(cmap, rows: int, seed: int = 0) -> torch.Tensor:
    """Rows near random clusters' centroids (several clusters: a union of several sets)."""
    clusters = torch.randint(0, cmap.manifest.r, (rows,), generator=torch.Generator().manual_seed(seed))
    return rows_near(cmap, clusters.tolist(), noise=0.3, seed=seed)


@pytest.fixture(params=["gather", "dense"])
def union_kernel(request, monkeypatch):
    """Force one of the two int8 union kernels (the cost model picks between them by size)."""
    n = len(int8_union.INT8_COST_ROWS)
    cheap, dear = (0.0,) * n, (1e9,) * n
    gather = request.param == "gather"
    monkeypatch.setattr(int8_union, "INT8_GATHER_US", cheap if gather else dear)
    monkeypatch.setattr(int8_union, "INT8_DENSE_US", dear if gather else cheap)
    return request.param


@pytest.mark.parametrize("selection", ["union", "per-row"])
@pytest.mark.parametrize("bias", [1.0, 0.0])
@pytest.mark.parametrize("rows", [1, 7])
def test_int8_logits_are_full_int8_on_the_active_columns(union_kernel, selection, bias, rows):
    """Union: the full int8 projection's logits of the batch. Per-row: of each cluster's group of rows (the
    int8 layer quantises its input per tensor, so a row's int8 logits depend on the rows beside it)."""
    w, b, cmap = layer_and_map(bias=bias)
    h = batch(cmap, rows)
    full8 = create_projection("full", w, b, int8=True)
    proj = clustered(w, b, cmap, selection=selection, int8=True, cache_mb=0)
    out = proj(h)
    want = full8(h).logits
    if selection == "per-row":
        clusters = proj.assign(h)
        for c in clusters.unique():
            want[clusters == c] = full8(h[clusters == c]).logits
    want = torch.gather(want, 1, out.ids.expand(rows, -1) if out.ids.dim() == 1 else out.ids)
    computed = torch.isfinite(out.logits)
    assert computed.any(dim=1).all()
    torch.testing.assert_close(out.logits[computed], want[computed], rtol=1e-5, atol=1e-5)


def test_int8_logits_are_float32_ones_within_the_quantisation_error():
    """Close to float32 (a few percent of the logits' range), not equal: the int8 rows are what ran."""
    w, b, cmap = layer_and_map()
    h = batch(cmap, 9)
    out8 = clustered(w, b, cmap, int8=True)(h)
    out32 = clustered(w, b, cmap)(h)
    err = (out8.logits - out32.logits).abs().max()
    scale = out32.logits.abs().max()
    assert 0 < err < 0.05 * scale
    # the bound the certificate uses holds row by row
    slack = int8_union.int8_logit_error(h, clustered(w, b, cmap, int8=True)._w8)
    assert ((out8.logits - out32.logits).abs().amax(dim=1) <= slack).all()


@pytest.mark.parametrize("selection", ["union", "per-row"])
def test_int8_computes_the_float32_projections_columns(selection):
    w, b, cmap = layer_and_map()
    for seed, rows in ((0, 1), (1, 5), (2, 16)):
        h = batch(cmap, rows, seed=seed)
        out8 = clustered(w, b, cmap, selection=selection, int8=True)(h)
        out32 = clustered(w, b, cmap, selection=selection)(h)
        assert torch.equal(out8.ids, out32.ids)
        assert torch.equal(torch.isfinite(out8.logits), torch.isfinite(out32.logits))


def test_cached_cluster_is_a_packed_int8_block_with_the_same_logits():
    w, b, cmap = layer_and_map()
    cached = clustered(w, b, cmap, int8=True, cache_mb=1.0)
    plain = clustered(w, b, cmap, int8=True, cache_mb=0)
    blocks = cached._w8.blocks
    hit = [c for c in range(cmap.manifest.r) if blocks.cached(c)]
    assert hit and not any(plain._w8.blocks.cached(c) for c in range(cmap.manifest.r))
    assert cached.prepared_map.cached_bytes == 0  # no float32 blocks beside the int8 ones
    assert blocks.packed_count() == 0  # packed at their first use, not at load
    h = rows_near(cmap, [hit[0]] * 3, noise=0.01)
    a, z = cached(h), plain(h)
    assert blocks.packed_count() == 1  # one step in one cluster: that cluster's block alone
    assert torch.equal(a.ids, z.ids)
    torch.testing.assert_close(a.logits, z.logits, rtol=1e-5, atol=1e-5)


def test_options_and_signature_say_int8():
    w, b, cmap = layer_and_map()
    proj = clustered(w, b, cmap, int8=True)
    assert proj.options()["dtype"] == "int8" and "|dtype:int8|" in proj.signature()
    assert "dtype" not in clustered(w, b, cmap).options()


def test_int8_refuses_cuda_the_cupy_backend_and_a_static_union():
    w, b, cmap = layer_and_map()
    with pytest.raises(ValueError, match="torch backend"):
        clustered(w, b, cmap, int8=True, backend="cupy")
    with pytest.raises(ValueError, match="CPU only"):
        fp = cmap.manifest.model_fingerprint
        ClusteredProjection(w.to("meta"), b.to("meta"), cluster_map=cmap, int8=True, fingerprint=fp)
    with pytest.raises(ValueError, match="no int8 path"):
        clustered(w, b, cmap, int8=True).capturable(4)


@pytest.mark.parametrize(("exact_k", "exact_tol"), [(1, 1e-5), (4, 0.5)])
def test_certificate_gives_full_int8_top_k(exact_k, exact_tol):
    """With ``exact_k`` every row's top-k is the full int8 projection's (certified or not)."""
    w, b, cmap = layer_and_map(size=300)
    h = torch.cat([rows_near(cmap, list(range(12)), noise=0.02), batch(cmap, 12, seed=5)])
    proj = clustered(w, b, cmap, int8=True, exact_k=exact_k, exact_tol=exact_tol, inactive_mass="moments")
    out = proj(h)
    full8 = create_projection("full", w, b, int8=True)(h).logits
    got = torch.topk(out.dense(), exact_k, dim=1)
    want = torch.topk(full8, exact_k, dim=1)
    assert torch.equal(got.indices, want.indices)
    assert proj.certified_fraction > 0  # the int8 margin leaves rows near a centroid certified


@pytest.mark.parametrize("estimator", ["centroid", "moments", "normaliser", "oracle"])
def test_inactive_mass_estimates_run_on_int8_logits(estimator):
    w, b, cmap = layer_and_map()
    h = batch(cmap, 6)
    out = clustered(w, b, cmap, int8=True, inactive_mass=estimator)(h)
    assert out.log_inactive_mass is not None and torch.isfinite(out.log_inactive_mass).all()
    if estimator == "oracle":  # the exact mass of the columns left out, of the int8 logits
        full8 = create_projection("full", w, b, int8=True)(h).logits
        left = full8.masked_fill(torch.isfinite(out.dense()), float("-inf"))
        torch.testing.assert_close(out.log_inactive_mass, torch.logsumexp(left, dim=1))


def test_mass_radius_far_rows_get_the_exact_mass_of_the_int8_logits():
    w, b, cmap = layer_and_map()
    h = batch(cmap, 5)
    proj = clustered(w, b, cmap, int8=True, inactive_mass="moments", mass_radius=1e-6)
    out = proj(h)  # every row is far
    assert out.ids is not None and proj.counters["far"] == 5
    full8 = create_projection("full", w, b, int8=True)(h).logits
    left = full8.masked_fill(torch.isfinite(out.dense()), float("-inf"))
    torch.testing.assert_close(out.log_inactive_mass, torch.logsumexp(left, dim=1))


def test_cost_model_prefers_the_gather_for_small_unions_only():
    n = 128_112
    assert not int8_union.int8_dense_cheaper(12_811, 1, n)  # 10% of N, one row
    assert int8_union.int8_dense_cheaper(87_000, 32, n)  # 68% of N, 32 rows
    # 8 rows: the gather pays below ~10% of N only (measured), not at 20%
    assert not int8_union.int8_dense_cheaper(6_400, 8, n)
    assert int8_union.int8_dense_cheaper(25_622, 8, n)
    # beyond the rows measured, 32 rows' costs decide: 20% gathered, 45% dense
    assert not int8_union.int8_dense_cheaper(25_622, 128, n)
    assert int8_union.int8_dense_cheaper(57_650, 128, n)


def test_union_step_skips_the_map_where_its_expected_union_costs_more_than_full():
    """Sets of 15% of N: one row's set is cheaper gathered, 32 rows' union is not: that step computes every
    column without assigning clusters, the full int8 projection's logits, and counts its rows."""
    w, b, cmap = layer_and_map()
    proj = clustered(w, b, cmap, int8=True, full_when_cheaper=True)
    full8 = create_projection("full", w, b, int8=True)
    one = proj(batch(cmap, 1))
    assert one.ids is not None and proj.counters["full"] == 0
    h = batch(cmap, 32)
    out = proj(h)
    assert out.ids is None
    torch.testing.assert_close(out.logits, full8(h).logits)
    assert proj.counters["full"] == 32 and proj.stats()["full_fraction"] == 32 / 33
    proj.full_when_cheaper = False  # switched off: the union again
    assert proj(h).ids is not None and proj.counters["full"] == 32
    assert proj.options()["full_when_cheaper"] is False
    # a row that probes 3 clusters brings 3 sets: one row's union then already costs more than full
    probed = clustered(w, b, cmap, int8=True, full_when_cheaper=True, probes=3)
    assert probed(batch(cmap, 1)).ids is None and probed.counters["full"] == 1


def test_expected_union_matches_drawn_unions():
    """The expectation the skip decides on: independent rows drawn by population, checked by drawing."""
    w, b, cmap = layer_and_map()
    pm = clustered(w, b, cmap, int8=True).prepared_map
    hit = popular.hit_probability(pm, N)
    p = pm.population / pm.population.sum()
    rng = np.random.default_rng(0)
    for rows in (1, 4, 16):
        drawn = [
            torch.unique(torch.cat([pm.ids[c] for c in rng.choice(pm.r, size=rows, p=p)])).numel()
            for _ in range(400)
        ]
        assert abs(popular.expected_union(hit, rows) - np.mean(drawn)) < 0.03 * np.mean(drawn)
    assert popular.expected_union(hit, 1) == pytest.approx(float(np.dot(p, pm.sizes)))


def test_hit_probability_sums_the_populations_of_the_sets_holding_each_id():
    """Against a dense (clusters x ids) count, on a map of more clusters than one chunk of the sum."""
    w, b = random_layer(n_vocab=N, d=D, seed=3, bias=1.0)
    cmap = random_map(w, b, r=600, size=30, seed=2)
    pm = clustered(w, b, cmap, int8=True).prepared_map
    member = np.zeros((pm.r, N))
    for c in range(pm.r):
        member[c, pm.ids[c].numpy()] = 1.0
    want = np.minimum((pm.population / pm.population.sum()) @ member, 1.0)
    np.testing.assert_allclose(popular.hit_probability(pm, N), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("rows", [3, 6])
def test_union_over_popular_blocks_runs_dense_and_gathered_blocks_with_full_int8_logits(
    monkeypatch, rows, switch
):
    """Blocks of 32 ids in popularity order; a block runs dense when the union holds over half of it (costs
    set so): both kinds run in one step, and every column is the full int8 projection's logit."""
    switch(INT8_BLOCK_COLUMNS=32)
    for prefix, table_rows in (("INT8", int8_union.INT8_COST_ROWS), ("ORT", int8_union.ORT_COST_ROWS)):
        # both tables: which one a step reads depends on this machine's int8 GEMM probe
        monkeypatch.setattr(int8_union, f"{prefix}_GATHER_US", (1.0,) * len(table_rows))
        monkeypatch.setattr(int8_union, f"{prefix}_DENSE_US", (0.5,) * len(table_rows))
    w, b, cmap = layer_and_map()
    proj = clustered(w, b, cmap, int8=True, cache_mb=0)
    pb = proj._w8.popular
    assert pb is not None and len(pb.packed) == -(-N // 32)
    hit = popular.hit_probability(proj.prepared_map, N)
    assert np.all(np.diff(hit[np.argsort(pb.rank.numpy())]) <= 0)  # the order is by hit probability
    calls = {"dense": 0, "gather": 0}
    packed, gather = int8_union.int8.linear_packed, int8_union.int8_gather_gemm

    def spy_packed(*a):
        calls["dense"] += 1
        return packed(*a)

    def spy_gather(*a):
        calls["gather"] += 1
        return gather(*a)

    monkeypatch.setattr(int8_union.int8, "linear_packed", spy_packed)
    monkeypatch.setattr(int8_union, "int8_gather_gemm", spy_gather)
    h = batch(cmap, rows, seed=rows)
    out = proj(h)
    assert calls["dense"] >= 1 and calls["gather"] == 1
    want = create_projection("full", w, b, int8=True)(h).logits.index_select(1, out.ids)
    torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)


def test_map_skip_with_popular_blocks_needs_every_block_dense():
    """One block is the rule over all N; with blocks, a step skips only when every block's expected share
    of the union would run dense, and the expected shares add up to the expected union."""
    w, b, cmap = layer_and_map()
    hit = popular.hit_probability(clustered(w, b, cmap, int8=True).prepared_map, N)
    for rows in (1, 8, 32):
        per_block = popular.expected_block_unions(hit, rows, 32)
        assert per_block.sum() == pytest.approx(popular.expected_union(hit, rows))
        assert np.all(np.diff(per_block[:-1]) <= 1e-9)  # popular blocks first
        assert int8_union.int8_map_skipped(hit, rows, rows, N, N) == int8_union.int8_map_skipped(
            hit, rows, rows, N, None
        )
        blocks = [
            int8_union.int8_dense_cheaper(int(e / popular.DENSE_UNION_MARGIN), rows, min(32, N - 32 * j))
            for j, e in enumerate(per_block)
        ]
        assert int8_union.int8_map_skipped(hit, rows, rows, N, 32) == all(blocks)


def test_cost_tables_cover_the_same_rows():
    rows = int8_union.INT8_COST_ROWS
    assert list(rows) == sorted(rows) and rows[0] == 1
    assert len(int8_union.INT8_GATHER_US) == len(int8_union.INT8_DENSE_US) == len(rows)


# ------------------------------------------------------------------------- the CLI and the bulk worker


def save_full_map(adapter, root, clusters: int = 2):
    """A map folder ``<root>/en-it`` whose every set holds every id: clustered computes what full does."""
    import numpy as np

    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from tests.layers import map_from_sets

    centroids = np.random.default_rng(0).standard_normal((clusters, adapter.d_model))
    sets = [list(range(adapter.n_vocab))] * clusters
    cmap = map_from_sets(centroids, sets, adapter.n_vocab, adapter.fingerprint)
    return save_cluster_map(cmap, root / "en-it")


def test_translate_cli_int8_clustered(spread_model_dir, tmp_path, capsys):
    from fastvocab.decoding import Seq2SeqAdapter
    from fastvocab.pipeline.cli import main
    from tests.conftest import synthetic_sentences

    adapter = Seq2SeqAdapter.load(spread_model_dir)
    inp, out, full_out = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "full.txt"
    inp.write_text("\n".join(synthetic_sentences("en", 4, seed=3)) + "\n", encoding="utf-8")
    maps = tmp_path / "maps"
    save_full_map(adapter, maps)
    base = ["translate", "--model", str(spread_model_dir), "--src-lang", "en", "--tgt-lang", "it"]
    base += ["-i", str(inp), "--max-len", "6", "--dtype", "int8", "--no-progress"]
    assert main([*base, "-o", str(full_out)]) == 0
    capsys.readouterr()
    rc = main([*base, "-o", str(out), "--method", "clustered", "--clusters", str(maps)])
    err = capsys.readouterr().err
    assert rc == 0, err
    # every id in every set: the int8 clustered projection computes the full int8 projection's logits
    assert out.read_text(encoding="utf-8") == full_out.read_text(encoding="utf-8")
    # ... and with sets of all N, no row count is cheaper through the map: every step skips it
    assert "100.0% of rows computed every column" in err, err


def test_bulk_worker_hands_int8_to_the_clustered_projection(spread_model_dir, tmp_path):
    from fastvocab.decoding import Seq2SeqAdapter
    from fastvocab.kernels.clustered_parts import ClusteredOptions
    from fastvocab.tasks.translate_job import TranslateJob, job_projection

    adapter = Seq2SeqAdapter.load(spread_model_dir)
    path = save_full_map(adapter, tmp_path / "maps")
    for dtype in ("int8", "float32"):
        job = TranslateJob(
            model=None,  # type: ignore[arg-type]  # job_projection reads the options, search and dtype
            src_lang="en",
            tgt_lang="it",
            options=ClusteredOptions(path),
            out=str(tmp_path / "parts"),
            dtype=dtype,
        )
        assert job_projection(adapter, job).options().get("dtype") == ("int8" if dtype == "int8" else None)


@pytest.mark.parametrize("bias", [1.0, 0.0])
def test_int8_gather_in_blocks_equals_one_block(switch, bias):
    """A union larger than the gather's buffer runs block by block; a small one in one go: the same logits,
    the full int8 layer's."""
    w, b, cmap = layer_and_map(bias=bias)
    w8 = clustered(w, b, cmap, int8=True)._w8
    assert w8 is not None
    h = batch(cmap, 5)
    cols = torch.arange(0, N, 3)
    whole = int8_union.int8_gather_gemm(h, w8, cols)
    switch(INT8_GATHER_CHUNK_BYTES=D * 16)  # 16 int8 rows a block
    blocks = int8_union.int8_gather_gemm(h, w8, cols)
    assert torch.equal(blocks, whole)
    full8 = create_projection("full", w, b, int8=True)(h).logits[:, cols]
    torch.testing.assert_close(whole, full8, rtol=1e-5, atol=1e-4)


def test_int8_gather_is_the_layers_integer_sums_scaled():
    """The gather multiplies the input's integers (quantised as the layer quantises them) by the int8 rows
    with exact integer sums, then scales them as the layer does: bit for bit that, at one row, a beam's four
    and more than 32, with columns in any order."""
    g = torch.Generator().manual_seed(0)
    d, n = 1024, 300
    q = torch.randint(-127, 128, (n, d), dtype=torch.int8, generator=g)
    scale = torch.rand(n, generator=g) / 100 + 1e-3
    bias = torch.randn(n, generator=g)
    w8 = int8_union.Int8Weights(None, q, scale, bias, [], 0, 0.0, 0.0)
    cols = torch.randperm(n, generator=g)[:97]
    for rows in (1, 4, 33):
        h = torch.randn(rows, d, generator=g) * 3
        ints, h_scale = int8.quantize_input(h)
        sums = ints.to(torch.int64) @ q[cols].to(torch.int64).t()  # exact
        want = (sums.float() * (h_scale * scale[cols])).add_(bias[cols])
        assert torch.equal(int8_union.int8_gather_gemm(h, w8, cols), want)


def test_int8_assignment_picks_the_nearest_centroid_up_to_rounding():
    """The int8 centroid scores choose the float32 nearest cluster for rows near a centroid, and elsewhere a
    cluster whose distance is within the scores' rounding of the nearest; probes come nearest first."""
    w, b, cmap = layer_and_map(r=40)
    proj = clustered(w, b, cmap, int8=True)
    exact = clustered(w, b, cmap)
    near = batch(cmap, 64)
    assert torch.equal(proj.assign(near), exact.assign(near))
    far = torch.randn(256, D, generator=torch.Generator().manual_seed(4))  # no centroid nearby: near-ties
    got = proj.assign(far)
    c = torch.from_numpy(cmap.centroids).float()
    dist = torch.cdist(far, c) ** 2  # (rows, r)
    best = dist.min(dim=1).values
    chosen = dist.gather(1, got[:, None])[:, 0]
    assert (chosen <= best * 1.02 + 1e-3).all()
    assert (got == exact.assign(far)).float().mean() > 0.9
    probed = clustered(w, b, cmap, int8=True, probes=3)
    out = probed(near)  # runs the probes' int8 path end to end
    assert out.logits.shape[0] == near.shape[0]


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_gather_s_multiplies_sum_the_same_integers(rows, switch):
    """The float32 sums and the compiled loop equal torch._int_mm's int32 sums exactly (the float32 ones at
    widths up to EXACT_FLOAT32_DIM), whole and across buffer blocks (a small chunk forces several), so the
    choice between them changes only the time."""
    g = torch.Generator().manual_seed(rows)
    d = int8_union.EXACT_FLOAT32_DIM
    q = torch.full((300, d), 127, dtype=torch.int8)  # the largest products: the sums' worst case
    q[::2] = torch.randint(-127, 128, (150, d), dtype=torch.int8, generator=g)
    ints = torch.randint(-127, 128, (rows, d), generator=g).float()
    ints[0] = 127.0
    cols = torch.randperm(300, generator=g)[:257]
    want = ints.double() @ q.index_select(0, cols).double().t()
    x8 = ints.to(torch.int8)
    for got in (
        int8_union._int_mm_sums(x8, q, cols),
        int8_union._float32_sums(ints, q, cols),
        int8_union._compiled_sums(x8, q, cols),
    ):
        assert torch.equal(got.double(), want)
    assert float(want.abs().max()) == d * 127 * 127  # the bound the exactness needs is reached
    switch(INT8_GATHER_CHUNK_BYTES=64 * d)  # blocks of 64 rows for torch._int_mm
    assert torch.equal(int8_union._int_mm_sums(x8, q, cols).double(), want)


def test_the_gather_s_multiply_is_measured_and_can_be_named():
    """``auto`` times them and names one, per regime (the compiled loop only for few rows); past the exact
    width the float32 sums are not among them; the switch forces each; and a gather's logits are the same
    whichever multiplies."""
    int8_union.gather_multiply.cache_clear()
    try:
        assert int8_union.gather_multiply(64, True) in int8_union.MULTIPLIES
        assert int8_union.gather_multiply(64, False) in ("int_mm", "float32")
        assert int8_union.gather_multiply(int8_union.EXACT_FLOAT32_DIM + 1, False) == "int_mm"
        w, b, cmap = layer_and_map()
        proj = clustered(w, b, cmap, int8=True, cache_mb=0)
        cols = torch.arange(0, N, 3)
        for rows in (2, 9):
            h = batch(cmap, rows, seed=4)
            outs = {}
            for name in int8_union.MULTIPLIES:
                int8_union.gather_multiply.cache_clear()
                with switches_override(INT8_GATHER=name):
                    assert int8_union.gather_multiply(D, rows <= int8_union.FEW_ROWS) == name
                    outs[name] = int8_union.int8_gather_gemm(h, proj._w8, cols)
            assert all(torch.equal(outs["int_mm"], out) for out in outs.values())
    finally:
        int8_union.gather_multiply.cache_clear()
