"""Clustered sets plus the sentence's shortlist: every step computes the union of its rows' probed sets and
the candidates of its batch's source sentences, on the tiny model; what the combination refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import beam_search, greedy_search
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels.cluster_assign import nearest_clusters
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.shortlist import ShortlistParams, build_shortlist
from tests.conftest import synthetic_sentences
from tests.layers import map_from_sets
from tests.test_shortlist import _covering_index, parallel_text


@pytest.fixture(scope="module")
def adapter(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def index(adapter):
    src, tgt = parallel_text(300)
    return build_shortlist(adapter, "en-it", src, tgt, ShortlistParams(k=3, frequent=4, iterations=3))


@pytest.fixture(scope="module")
def cmap(adapter):
    """Eight clusters around real states' scale, each with a small random set."""
    rng = np.random.default_rng(3)
    n = adapter.n_vocab
    sets = [rng.choice(n, 6, replace=False).tolist() for _ in range(8)]
    return map_from_sets(rng.standard_normal((8, adapter.d_model)), sets, n, adapter.fingerprint)


@pytest.mark.parametrize("probes", [1, 2])
def test_each_step_computes_the_union_of_the_probed_sets_and_the_batch_candidates(
    adapter, index, cmap, probes
):
    proj = make_projection(adapter, "clustered", cluster_map=cmap, shortlist=index, probes=probes)
    plain = make_projection(adapter, "shortlist", index=index)
    lines = synthetic_sentences("en", 5, seed=11)
    batch = adapter.encode_texts(lines, "en", "it")
    cands = plain.batch_candidates(batch["input_ids"], batch["attention_mask"])
    from_shortlist = set(np.concatenate(cands).tolist())
    pm = proj.prepared_map
    records = []
    greedy_search(adapter, proj, batch, "en", "it", max_len=6, step_hook=records.append)
    assert records
    for r in records:
        near = nearest_clusters(r.hidden, pm.centroids_t, pm.sq_norms, probes)
        from_sets = {int(i) for c in near.reshape(-1).tolist() for i in pm.ids[c].tolist()}
        assert set(r.output.ids.tolist()) == from_sets | from_shortlist
        assert from_shortlist - from_sets  # the shortlist adds columns the sets lack
    assert "shortlist" in proj.signature()


def test_without_a_shortlist_the_bound_step_is_the_plain_step(adapter, cmap):
    proj = make_projection(adapter, "clustered", cluster_map=cmap)
    batch = adapter.encode_texts(synthetic_sentences("en", 4, seed=2), "en", "it")
    settings = SearchSettings(beam=2, max_len=6, early_stopping=False)
    bound = beam_search(adapter, proj, batch, "en", "it", settings)
    again = beam_search(adapter, lambda h: proj(h), batch, "en", "it", settings)
    assert bound == again and any(bound)


def test_a_covering_shortlist_decodes_like_full_softmax(adapter, cmap):
    """A shortlist whose candidates are every id makes every step dense: full softmax's outputs."""
    proj = make_projection(adapter, "clustered", cluster_map=cmap, shortlist=_covering_index(adapter))
    full = make_projection(adapter, "full")
    batch = adapter.encode_texts(synthetic_sentences("en", 4, seed=9), "en", "it")
    beam3 = SearchSettings(beam=3, max_len=6, early_stopping=False)
    for search in (lambda *a: greedy_search(*a, max_len=6), lambda *a: beam_search(*a, beam3)):
        got = search(adapter, proj, batch, "en", "it")
        assert got == search(adapter, full, batch, "en", "it")


def test_the_combination_refuses_what_it_cannot_do(adapter, index, cmap):
    with pytest.raises(ValueError, match="needs union selection"):
        make_projection(adapter, "clustered", cluster_map=cmap, shortlist=index, selection="per-row")
    with pytest.raises(ValueError, match="need a shortlist"):
        make_projection(adapter, "clustered", cluster_map=cmap, shortlist_copy=False)
    with pytest.raises(ValueError, match="need a shortlist"):
        make_projection(adapter, "clustered", cluster_map=cmap, shortlist_k=3)
    with pytest.raises(ValueError, match="torch backend"):
        make_projection(adapter, "clustered", cluster_map=cmap, shortlist=index, backend="cupy")
    proj = make_projection(adapter, "clustered", cluster_map=cmap, shortlist=index, probes=1)
    with pytest.raises(ValueError, match="static union holds no shortlist"):
        proj.capturable(4)
    other = build_shortlist(
        adapter, "it-en", *reversed(parallel_text(50)), ShortlistParams(k=2, iterations=1)
    )
    with pytest.raises(ArtifactError, match="it-en"):
        make_projection(adapter, "clustered", cluster_map=cmap, shortlist=other)


def test_auto_mass_with_a_shortlist_is_the_estimate_of_the_columns_left_out(adapter, index, cmap):
    """Beam search with a shortlist estimates the mass of the columns actually left out (moments): the
    normaliser expands the mass outside the row's own set, from which the batch's candidates are taken off."""
    from fastvocab.experiments.bench_methods import point_options
    from fastvocab.kernels.clustered_parts import (
        BEAM_INACTIVE_MASS,
        SHORTLIST_BEAM_INACTIVE_MASS,
        ClusteredOptions,
    )

    assert SHORTLIST_BEAM_INACTIVE_MASS == "moments" != BEAM_INACTIVE_MASS
    hybrid = ClusteredOptions(cmap, shortlist=index).projection_kwargs(beam=4)
    assert hybrid["inactive_mass"] == "moments"
    assert ClusteredOptions(cmap).projection_kwargs(beam=4)["inactive_mass"] == BEAM_INACTIVE_MASS
    assert ClusteredOptions(cmap, shortlist=index).projection_kwargs(beam=1)["inactive_mass"] == "none"
    chosen = ClusteredOptions(cmap, inactive_mass="centroid", shortlist=index)
    assert chosen.projection_kwargs(beam=4)["inactive_mass"] == "centroid"
    # the benchmarks' clustered points resolve auto the same way
    assert point_options("clustered", {}, 4, _Artifact(cmap), "en-it")["inactive_mass"] == BEAM_INACTIVE_MASS

    proj = make_projection(adapter, "clustered", **hybrid)
    batch = adapter.encode_texts(synthetic_sentences("en", 4, seed=5), "en", "it")
    records = []
    settings = SearchSettings(beam=2, max_len=6, early_stopping=False)
    beam_search(adapter, proj, batch, "en", "it", settings, step_hook=records.append)
    full = make_projection(adapter, "full")
    for r in records:  # an estimate of what the step left out, finite where it left columns out
        mass = r.output.log_inactive_mass
        assert mass is not None and torch.isfinite(mass).all()
        z = full(r.hidden).logits.float()
        z[:, r.output.ids] = -torch.inf
        exact = torch.logsumexp(z, dim=1)
        assert (mass - exact).abs().max() < 5.0  # the right columns: same scale as their exact mass


class _Artifact:
    def __init__(self, index) -> None:
        self.index = index


def test_int8_with_a_shortlist_gives_full_int8_logits_on_the_union(adapter, index, cmap):
    """int8: the batch's candidates run as rows packed once for the batch, the sets' other columns gathered;
    every computed column holds the full int8 projection's logit, and the columns are the float path's."""
    proj8 = make_projection(
        adapter, "clustered", cluster_map=cmap, shortlist=index, int8=True, full_when_cheaper=False
    )  # (the tiny vocabulary would otherwise run every step dense)
    proj32 = make_projection(adapter, "clustered", cluster_map=cmap, shortlist=index)
    full8 = make_projection(adapter, "full", int8=True)
    batch = adapter.encode_texts(synthetic_sentences("en", 5, seed=4), "en", "it")
    bound8 = proj8.for_batch(batch["input_ids"], batch["attention_mask"])
    bound32 = proj32.for_batch(batch["input_ids"], batch["attention_mask"])
    # seeded: the int8 centroid scores may take a near-tie's other cluster, as the test's rows must not
    h = torch.randn(7, adapter.d_model, generator=torch.Generator().manual_seed(0)) * 3
    out8, out32 = bound8(h, torch.arange(7)), bound32(h, torch.arange(7))
    assert sorted(out8.ids.tolist()) == sorted(out32.ids.tolist())
    assert len(set(out8.ids.tolist())) == len(out8.ids)  # no column twice
    want = full8(h).logits[:, out8.ids]
    torch.testing.assert_close(out8.logits, want, rtol=1e-5, atol=1e-4)


def test_a_pooled_map_takes_the_table_of_the_direction_it_serves(adapter, index, cmap):
    """A target-scope map (``to-it``) serves every source into its target: an en-it table joins it."""
    import copy

    pooled = copy.deepcopy(cmap)
    pooled.manifest.direction, pooled.manifest.scope = "to-it", "target"
    proj = make_projection(adapter, "clustered", cluster_map=pooled, shortlist=index)
    batch = adapter.encode_texts(synthetic_sentences("en", 3, seed=5), "en", "it")
    assert any(greedy_search(adapter, proj, batch, "en", "it", max_len=6))
    assert "shortlist" in proj.signature()


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n_clusters", [1, 2, 4])
@pytest.mark.parametrize("host", [True, False])
def test_a_few_clusters_run_their_cached_blocks_to_the_union_paths_logits_and_ids(
    adapter, index, cmap, int8, n_clusters, host, monkeypatch
):
    """Rows in a few cached clusters take each cluster's block whole, less the columns already held: the
    same ids, in the same order, and the same logits as the union's mask-and-gather path, whether the
    blocks' columns are picked in numpy (CPU, float32) or in tensor ops (an accelerator, bfloat16)."""
    from fastvocab.kernels import gather
    from fastvocab.kernels.gather import BatchColumns, batch_block_logits, batch_union_logits

    if not host:
        monkeypatch.setattr(gather, "numpy_can", lambda t: False)

    proj = make_projection(adapter, "clustered", cluster_map=cmap, shortlist=index, int8=int8)
    pm, w8 = proj.prepared_map, proj._w8
    cached = (lambda c: pm.blocks[c] is not None) if w8 is None else w8.blocks.cached
    clusters = [c for c in range(pm.r) if cached(c)][:n_clusters]
    assert len(clusters) == n_clusters
    batch = adapter.encode_texts(synthetic_sentences("en", 3, seed=6), "en", "it")
    cands = proj._shortlist.batch_candidates(batch["input_ids"], batch["attention_mask"])
    ids = torch.from_numpy(np.unique(np.concatenate(cands)))
    cols = BatchColumns.of(ids, proj.weight, proj.bias, w8)
    assert set(pm.ids[clusters[0]].tolist()) & set(ids.tolist())  # some columns are held twice
    sets = torch.zeros(adapter.n_vocab, dtype=torch.bool)
    for c in clusters:
        sets[pm.ids[c]] = True
    h = torch.randn(5, adapter.d_model) * 3
    want_logits, want_ids = batch_union_logits(h, cols, sets, proj.weight, proj.bias, w8)
    logits, got_ids = batch_block_logits(h, cols, pm, clusters, proj.weight, proj.bias, w8)
    assert got_ids.tolist() == want_ids.tolist()
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=0 if int8 else 1e-5)
