"""Coverage of full softmax's greedy path predicts which clustered greedy outputs differ, without decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.hidden_states import validate_direction
from fastvocab.decoding.search import decode
from fastvocab.decoding.settings import SearchSettings
from fastvocab.experiments import coverage
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpDecoder, DumpSettings, plan_shards, run_dump_shard
from fastvocab.tasks.kmeans import sample_states
from fastvocab.tasks.maps import ActiveSetCounter, MapParams, make_cluster_map
from fastvocab.tasks.projections import make_projection
from tests.conftest import synthetic_sentences

K, MAX_LEN, R = 2, 12, 24
SEARCH = SearchSettings(max_len=MAX_LEN)


def differing_sentences(
    mask: torch.Tensor, near: torch.Tensor, path: coverage.GreedyPath, probes: int
) -> set[int]:
    """The sentences with a miss on their path: those whose greedy output the sets change (per-row
    selection; union: at most these)."""
    return set(path.sentence[coverage.step_misses(mask, near, path, probes)].tolist())


@pytest.fixture(scope="module")
def dumped(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("coverage")
    decoder = DumpDecoder(
        RunContext(describe_model(tiny_model_dir), torch_threads=1), DumpSettings(K, MAX_LEN)
    )
    texts = synthetic_sentences("en", 40, seed=31)
    for spec in plan_shards("en-it", list(range(40)), texts, shard_sentences=20):
        run_dump_shard(decoder, spec, root)
    files = validate_direction(root, "en-it")
    labels = coverage.load_labels(files, K)
    # centroids: states picked from the dump (no k-means needed for the claim under test)
    rng = np.random.default_rng(0)
    sample, _ = sample_states(files, None, 0)
    centroids = sample[rng.choice(len(sample), R, replace=False)]
    return decoder, files, labels, centroids


@pytest.mark.parametrize(("k", "sentences"), [(1, 2), (2, 40)])
def test_misses_on_the_greedy_path_are_the_per_row_outputs_that_differ(dumped, k, sentences):
    decoder, _, labels, centroids = dumped
    adapter = decoder.adapter
    test = synthetic_sentences("en", 12, seed=32)
    # one sentence a batch, here and below: the decoder then sees the very states the path recorded (a
    # batch's rounding can move a state across a near-tie of two centroids)
    path = coverage.greedy_path(decoder, test, "en", "it", batch=1)
    near = coverage.nearest(path, centroids, 1)
    clusters = coverage.assign_stored(labels, centroids)
    aa = adapter.always_active_ids()
    ((_, mask),) = coverage.set_masks(
        clusters, labels.topk[:, :k], labels.sentence, R, adapter.n_vocab, [sentences], aa
    )
    predicted = differing_sentences(mask, near, path, probes=1)

    cmap = _pipeline_map(decoder, labels, clusters, centroids, k, sentences)
    # the map's sets are the harness's (the same states, clusters and ids)
    dense = torch.zeros((R, adapter.n_vocab), dtype=torch.bool)
    for c in range(R):
        dense[c, torch.from_numpy(cmap.indices[cmap.indptr[c] : cmap.indptr[c + 1]].astype(np.int64))] = True
    dense[:, aa] = True
    assert torch.equal(dense, mask)

    # token ids, not texts: two token sequences can read as the same text
    full = [decode(adapter, make_projection(adapter), adapter.encode_texts([t], "en", "it"), "en", "it",
                   SEARCH)[0] for t in test]  # fmt: skip
    proj = make_projection(adapter, "clustered", cluster_map=cmap)
    clustered = [decode(adapter, proj, adapter.encode_texts([t], "en", "it"), "en", "it", SEARCH)[0]
                 for t in test]  # fmt: skip
    assert {i for i, (a, b) in enumerate(zip(clustered, full, strict=True)) if a != b} == predicted
    if sentences == 2:  # sets from two sentences miss: the claim is tested on real differences
        assert 2 <= len(predicted) < len(test)
    # in a batch, a union's other rows only add columns: never more differences than predicted
    batch = adapter.encode_texts(test, "en", "it")
    union = decode(adapter, proj, batch, "en", "it", SEARCH)
    assert {i for i, (a, b) in enumerate(zip(union, full, strict=True)) if a != b} <= predicted


def _pipeline_map(decoder, labels, clusters, centroids, k: int, sentences: int):
    """The map the pipeline would build from the same states (those of the first ``sentences``)."""
    counter = ActiveSetCounter(R, decoder.adapter.n_vocab)
    first = labels.sentence < sentences
    counter.add(clusters[first], labels.topk[first, :k])
    return make_cluster_map(
        centroids,
        counter,
        MapParams(k=k),
        model_fingerprint=decoder.fingerprint,
        name="en-it",
        niter=1,
        seed=0,
    )


def test_with_a_shortlist_the_misses_are_the_outputs_of_both_together_that_differ(dumped):
    from fastvocab.artifacts_schema.method_index import new_index

    decoder, _, labels, centroids = dumped
    adapter = decoder.adapter
    n = adapter.n_vocab
    test = synthetic_sentences("en", 12, seed=32)
    path = coverage.greedy_path(decoder, test, "en", "it", batch=1)
    near = coverage.nearest(path, centroids, 1)
    clusters = coverage.assign_stored(labels, centroids)
    aa = adapter.always_active_ids()
    ((_, mask),) = coverage.set_masks(clusters, labels.topk[:, :1], labels.sentence, R, n, [2], aa)
    alone = differing_sentences(mask, near, path, probes=1)
    # a table whose frequent list holds the tokens the first sentence with a miss misses (the tiny model's
    # random outputs follow no word alignment): that sentence stops missing, some others do not
    misses = coverage.step_misses(mask, near, path, 1)
    caught = sorted(alone)[:1]
    frequent = torch.unique(path.best[misses & (path.sentence == caught[0])]).numpy()
    index = new_index(
        "shortlist",
        model_fingerprint=adapter.fingerprint,
        direction="en-it",
        n_vocab=n,
        d=adapter.d_model,
        params={"k": 1, "frequent": len(frequent)},
        tensors={
            "indptr": np.zeros(n + 1, np.int64),
            "indices": np.zeros(0, np.int32),
            "probs": np.zeros(0, np.float32),
            "frequent": frequent.astype(np.int32),
            "always_active": np.array(aa, np.int32),
        },
    )
    shortlist = make_projection(adapter, "shortlist", index=index, copy=False)
    extra = torch.zeros((len(test), n), dtype=torch.bool)
    for i, t in enumerate(test):
        enc = adapter.encode_texts([t], "en", "it")
        extra[i, torch.from_numpy(shortlist.candidates(enc["input_ids"][0].tolist()))] = True
    predicted = set(path.sentence[coverage.step_misses(mask, near, path, 1, extra)].tolist())
    assert predicted <= alone - set(caught) and predicted  # caught ones stop missing; others still miss

    cmap = _pipeline_map(decoder, labels, clusters, centroids, 1, 2)
    proj = make_projection(
        adapter, "clustered", cluster_map=cmap, shortlist=index, shortlist_copy=False, probes=1
    )
    full = make_projection(adapter)
    differ = set()
    for i, t in enumerate(test):
        enc = adapter.encode_texts([t], "en", "it")
        if decode(adapter, proj, enc, "en", "it", SEARCH) != decode(adapter, full, enc, "en", "it", SEARCH):
            differ.add(i)
    assert differ == predicted
    both = coverage.path_coverage(mask, near, path, 1, batch=4, extra=extra)
    sets = coverage.path_coverage(mask, near, path, 1, batch=4)
    assert both["sentence_differ"] == len(predicted) / len(test)
    assert both["row_cols"] > sets["row_cols"] and both["union_batch"] >= both["row_cols"]


def test_the_curve_grows_sets_with_the_text_and_never_loses_a_hit(dumped):
    decoder, _, labels, centroids = dumped
    test = synthetic_sentences("en", 8, seed=33)
    path = coverage.greedy_path(decoder, test, "en", "it")
    grid = coverage.CoverageGrid(rs=[R], ks=[1, 2], probes=[1, 2])
    rows = coverage.coverage_curve(
        labels, path, decoder.n_vocab, grid, sizes=[10, 20, 40], centroids={R: centroids}
    )
    assert len(rows) == 2 * 2 * 3
    for k in (1, 2):
        for p in (1, 2):
            pts = sorted((r["sentences"], r) for r in rows if (r["K"], r["probes"]) == (k, p))
            differ = [r["sentence_differ"] for _, r in pts]
            cols = [r["row_cols"] for _, r in pts]
            assert differ == sorted(differ, reverse=True) and cols == sorted(cols)
    # more probes, more K: never fewer columns, never more misses
    at = {(r["K"], r["probes"], r["sentences"]): r for r in rows}
    assert at[2, 2, 40]["sentence_differ"] <= at[1, 1, 40]["sentence_differ"]
    assert at[2, 2, 40]["row_cols"] >= at[1, 1, 40]["row_cols"]
    assert all(r["union_batch"] >= r["row_cols"] for r in rows)


def test_the_rate_per_doubling_extrapolates_the_text_a_budget_needs():
    rows = [
        {"r": 1, "K": 1, "probes": 1, "sentences": n, "sentence_differ": d}
        for n, d in [(1000, 0.4), (2000, 0.2), (4000, 0.1)]
    ]
    assert coverage.misses_per_doubling(rows, 1, 1, 1) == pytest.approx(0.5)
    assert coverage.sentences_for(rows, 1, 1, 1, 0.05) == 8000
    assert coverage.sentences_for(rows, 1, 1, 1, 0.2) == 4000
    flat = [dict(x, sentence_differ=0.3) for x in rows]
    assert coverage.sentences_for(flat, 1, 1, 1, 0.05) is None
