"""Lexical shortlist: IBM-1 alignment, the table, the projection bound per batch, refused artifacts, the
CTranslate2 vocabulary map.

Decoding equivalence runs on the tiny random-weight model (tests/conftest.py); a planted word-for-word
mapping checks what the aligner learns.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.method_index import new_index, save_method_index
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import beam_search, greedy_search
from fastvocab.kernels.shortlist import ShortlistBatch, ShortlistProjection
from fastvocab.tasks.alignment import ibm1
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.shortlist import (
    ShortlistParams,
    _sentencepiece_ids,
    build_shortlist,
    export_vmap,
    shortlist_tensors,
    vocabulary_tokens,
)
from fastvocab.tasks.translate import SearchSettings, translate
from tests.conftest import WORDS, synthetic_sentences

# -------------------------------------------------------------------------------------------------- helpers


def planted_corpus(n: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    """Parallel id sentences where source word s always translates to target ``perm[s]`` (order shuffled)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(vocab)
    src, tgt = [], []
    for _ in range(n):
        s = rng.integers(0, vocab, rng.integers(2, 9))
        t = perm[s]
        rng.shuffle(t)
        src.append(s.tolist())
        tgt.append(t.tolist())
    return src, tgt, perm


@pytest.fixture(scope="module")
def adapter(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir, device="cpu", dtype=torch.float32)


def parallel_text(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """English sentences and their word-for-word Italian (conftest's word lists are aligned by position)."""
    en, it = WORDS["en"].split(), WORDS["it"].split()
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        idx = rng.choices(range(len(en)), k=rng.randint(3, 10))
        src.append(" ".join(en[i] for i in idx))
        tgt.append(" ".join(it[i] for i in idx))
    return src, tgt


@pytest.fixture(scope="module")
def index(adapter):
    src, tgt = parallel_text(400)
    return build_shortlist(adapter, "en-it", src, tgt, ShortlistParams(k=4, frequent=5, iterations=5))


def sources(adapter, n: int, seed: int) -> dict:
    return adapter.encode_texts(synthetic_sentences("en", n, seed=seed), "en")


# -------------------------------------------------------------------------------------------------- alignment


def test_ibm1_recovers_a_planted_word_mapping():
    src, tgt, perm = planted_corpus(600, vocab=30)
    table = ibm1(src, tgt, n_src=30, n_tgt=30, iterations=5)
    best = {s: table.top_k(s, 1)[0] for s in range(30)}
    assert all(best[s][0] == perm[s] for s in range(30))
    assert min(p for _, p in best.values()) > 0.5
    assert table.log_likelihood == sorted(table.log_likelihood)  # EM never lowers the likelihood
    # Rows are sorted by probability and sum to at most 1 (the NULL word takes the rest).
    for s in range(30):
        probs = [p for _, p in table.top_k(s, 100)]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-5


def test_ibm1_refuses_ids_out_of_range_and_ragged_input():
    with pytest.raises(ValueError, match="source ids must lie in"):
        ibm1([[0, 5]], [[1]], n_src=5, n_tgt=5)
    with pytest.raises(ValueError, match="1 source sentences but 2 target"):
        ibm1([[0]], [[1], [2]], n_src=5, n_tgt=5)


# -------------------------------------------------------------------------------------------------- the table


def test_table_holds_top_k_frequent_and_always_active():
    src, tgt, perm = planted_corpus(600, vocab=30)
    tensors, stats = shortlist_tensors(src, tgt, 40, [35, 2], ShortlistParams(k=2, frequent=3))
    indptr, indices = tensors["indptr"], tensors["indices"]
    assert indptr.shape == (41,) and np.diff(indptr).max() <= 2
    assert all(indices[indptr[s]] == perm[s] for s in range(30))  # the planted target ranks first
    assert np.diff(indptr)[30:].sum() == 0  # ids never seen in the source have no row
    counts = np.bincount(np.concatenate(tgt), minlength=40)
    assert sorted(counts[tensors["frequent"]], reverse=True) == sorted(counts, reverse=True)[:3]
    assert tensors["always_active"].tolist() == [2, 35]
    assert stats["entries"] == len(indices)


def test_fast_tokenization_equals_the_adapters(adapter):
    texts = parallel_text(50)[0] + ["a </s> package __it__"]
    assert _sentencepiece_ids(adapter, texts, "en") == adapter.tokenize(texts, "en")


def test_builder_learns_the_tokenized_word_pairs(adapter, index):
    m = index.manifest
    assert (m.method, m.direction, m.n_vocab, m.model_fingerprint) == (
        "shortlist",
        "en-it",
        adapter.n_vocab,
        adapter.fingerprint,
    )
    assert m.params["k"] == 4 and m.extra["pairs_used"] == 400 and m.extra["aligner"] == "ibm1"
    proj = make_projection(adapter, "shortlist", index=index)
    tok = adapter.tokenizer
    hits = 0
    for en, it in zip(WORDS["en"].split(), WORDS["it"].split(), strict=True):
        s = adapter.tokenize([en], "en")[0]
        t = set(adapter.tokenize([it], "it")[0]) - set(adapter.always_active_ids())
        row = proj._indices[proj._indptr[s[1]] : proj._indptr[s[1] + 1]]  # s[0] is the language tag
        hits += bool(t & set(row.tolist()))
        assert set(adapter.always_active_ids()) <= set(proj.candidates(s).tolist())
    assert hits >= len(WORDS["en"].split()) - 2, tok.convert_ids_to_tokens(list(proj._fixed))


def test_candidates_are_rows_plus_frequent_plus_always_active_plus_copies(adapter, index):
    s = adapter.tokenize(["package library"], "en")[0]
    t = index.tensors
    unk = adapter.tokenizer.unk_token_id
    assert unk in t["always_active"].tolist()  # the model emits it for what its vocabulary lacks
    rows = [t["indices"][t["indptr"][i] : t["indptr"][i + 1]][:2] for i in s]
    want = set(np.concatenate(rows).tolist()) | set(t["frequent"][:3].tolist())
    want |= set(adapter.always_active_ids()) | {unk}
    plain = make_projection(adapter, "shortlist", index=index, k=2, frequent=3, copy=False)
    assert set(plain.candidates(s).tolist()) == want
    proj = make_projection(adapter, "shortlist", index=index, k=2, frequent=3)  # copy by default
    assert set(proj.candidates(s).tolist()) == want | set(s)
    assert not set(s) <= want  # the copies add ids the rows do not hold
    assert proj.signature().startswith("method:shortlist|copy:True|direction:en-it|frequent:3|index:sha256:")


# -------------------------------------------------------------------------------------------------- decoding


def _pinned(proj: ShortlistProjection, sets: list[list[int]]):
    """A projection whose per-sentence candidates are given sets (the search binds it like a shortlist)."""

    class Pinned:
        def for_batch(self, input_ids, attention_mask=None):
            assert input_ids.shape[0] == len(sets)
            return ShortlistBatch(proj, [np.unique(np.asarray(s, dtype=np.int64)) for s in sets])

    return Pinned()


def test_each_row_gets_its_own_sentence_set_as_rows_leave(adapter):
    """Every sentence gets a set of its own (two tokens, plus the always-active ones); decoded in one batch,
    where finished rows leave and the others move up, each sentence must produce what it produces alone."""
    n, max_len = 12, 12
    lines = synthetic_sentences("en", n, seed=3)
    batch = adapter.encode_texts(lines, "en")
    always = adapter.always_active_ids()
    free = [i for i in range(4, adapter.n_vocab) if i not in always]
    sets = [[free[2 * i], free[2 * i + 1], *always] for i in range(n)]
    w = adapter.output_weight

    def pinned(bias, rows):
        proj = ShortlistProjection(w, bias, index=_covering_index(adapter), fingerprint=adapter.fingerprint)
        return _pinned(proj, [sets[i] for i in rows])

    # An output bias on EOS alone that stops about half the sentences, each at its own step (random weights
    # alone repeat a token to the length limit). Below the stopping step the bias changes no argmax.
    records = []
    greedy_search(
        adapter, pinned(None, range(n)), batch, "en", "it", max_len=max_len, step_hook=records.append
    )
    gap = torch.full((n,), math.inf)
    for r in records:
        logits = r.output.dense()  # (rows, N), -inf outside each row's set
        eos = logits[:, adapter.eos_id].clone()
        logits[:, adapter.eos_id] = -math.inf
        gap[r.row_ids] = torch.minimum(gap[r.row_ids], logits.max(dim=1).values - eos)
    bias = torch.zeros(adapter.n_vocab)
    bias[adapter.eos_id] = float(gap.quantile(0.5))

    got = greedy_search(adapter, pinned(bias, range(n)), batch, "en", "it", max_len=max_len)
    ended = [len(g) < max_len for g in got]
    assert any(ended[i] and not ended[j] for i in range(n) for j in range(i + 1, n)), got
    for i, g in enumerate(got):
        assert set(g) <= set(sets[i])
        alone = greedy_search(
            adapter, pinned(bias, [i]), adapter.encode_texts([lines[i]], "en"), "en", "it", max_len=max_len
        )
        assert g == alone[0]


def _covering_index(adapter):
    n = adapter.n_vocab
    return new_index(
        "shortlist",
        model_fingerprint=adapter.fingerprint,
        direction="en-it",
        n_vocab=n,
        d=adapter.d_model,
        params={"k": 1, "frequent": n},
        tensors={
            "indptr": np.zeros(n + 1, np.int64),
            "indices": np.zeros(0, np.int32),
            "probs": np.zeros(0, np.float32),
            "frequent": np.arange(n, dtype=np.int32),
            "always_active": np.array(adapter.always_active_ids(), np.int32),
        },
    )


@pytest.mark.parametrize("scope", ["sentence", "batch"])
@pytest.mark.parametrize("beam", [1, 3])
def test_a_table_covering_every_token_decodes_like_full_softmax(adapter, scope, beam):
    lines = synthetic_sentences("en", 10, seed=5)
    full = make_projection(adapter, "full")
    proj = make_projection(adapter, "shortlist", index=_covering_index(adapter), scope=scope)
    search = SearchSettings(beam=beam, batch_size=4, max_len=10)
    assert (
        translate(adapter, proj, lines, "en", "it", search, progress=False).hypotheses
        == translate(adapter, full, lines, "en", "it", search, progress=False).hypotheses
    )


@pytest.mark.parametrize("scope", ["sentence", "batch"])
def test_logits_on_candidates_equal_full_logits_and_others_are_masked(adapter, index, scope):
    proj = make_projection(adapter, "shortlist", index=index, k=2, frequent=2, scope=scope)
    batch = sources(adapter, 3, seed=7)
    bound = proj.for_batch(batch["input_ids"], batch["attention_mask"])
    h = torch.randn(5, adapter.d_model)
    row_ids = torch.tensor([2, 0, 0, 1, 2])
    out = bound(h, row_ids)
    ref = h @ adapter.output_weight.T  # (rows, N)
    dense = out.dense()
    for r, sent in enumerate(row_ids.tolist()):
        own = bound.sets[sent] if scope == "sentence" else out.ids.numpy()
        torch.testing.assert_close(dense[r, own], ref[r, own])
        others = np.setdiff1d(np.arange(adapter.n_vocab), own)
        assert torch.isneginf(dense[r, others]).all()
    assert bound.columns == len(np.unique(np.concatenate(bound.sets))) < adapter.n_vocab


def test_consecutive_batches_with_different_sets_equal_fresh_projections(adapter, index):
    proj = make_projection(adapter, "shortlist", index=index, k=1, frequent=2)
    a, b = sources(adapter, 4, seed=11), sources(adapter, 6, seed=12)
    sets_a = proj.for_batch(a["input_ids"], a["attention_mask"]).sets
    sets_b = proj.for_batch(b["input_ids"], b["attention_mask"]).sets
    assert {tuple(s) for s in sets_a} != {tuple(s) for s in sets_b}
    beam2 = SearchSettings(beam=2, max_len=10, early_stopping=False)
    for search in (lambda *a: greedy_search(*a, max_len=10), lambda *a: beam_search(*a, beam2)):
        shared = [search(adapter, proj, x, "en", "it") for x in (a, b, a)]
        fresh = [
            search(
                adapter, make_projection(adapter, "shortlist", index=index, k=1, frequent=2), x, "en", "it"
            )
            for x in (a, b, a)
        ]
        assert shared == fresh and shared[0] == shared[2]


def test_calling_without_a_batch_is_an_error(adapter, index):
    proj = make_projection(adapter, "shortlist", index=index)
    with pytest.raises(ValueError, match="depends on the source sentence"):
        proj(torch.zeros(1, adapter.d_model))


# -------------------------------------------------------------------------------------------------- artifacts


def test_an_index_for_another_direction_or_model_is_refused(adapter, index, tmp_path):
    save_method_index(index, tmp_path / "en-it")
    assert make_projection(adapter, "shortlist", index=tmp_path / "en-it", direction="en-it").k is None
    with pytest.raises(ArtifactError, match="built for en-it, not for it-en"):
        make_projection(adapter, "shortlist", index=tmp_path / "en-it", direction="it-en")
    other = torch.randn_like(adapter.output_weight)
    for idx in (tmp_path / "en-it", index):
        with pytest.raises(ArtifactError, match="was built for model"):
            ShortlistProjection(other, None, index=idx)
    with pytest.raises(ValueError, match="k=9 but the table was built with k=4"):
        make_projection(adapter, "shortlist", index=index, k=9)
    with pytest.raises(ValueError, match="scope must be one of sentence, batch"):
        make_projection(adapter, "shortlist", index=index, scope="row")


# -------------------------------------------------------------------------------------------------- vmap


def test_vmap_lists_always_allowed_tokens_first_then_one_row_per_source_token(adapter, index, tmp_path):
    tokens = vocabulary_tokens(adapter)
    path = export_vmap(index, tokens, tmp_path / "vmap.txt", k=2, frequent=3)
    lines = path.read_text(encoding="utf-8").splitlines()
    key, _, always = lines[0].partition("\t")
    assert key == "" and set(always.split()) >= {tokens[adapter.eos_id]}
    t = index.tensors
    rows = {
        tokens[s]: [tokens[i] for i in t["indices"][t["indptr"][s] : t["indptr"][s + 1]][:2]]
        for s in np.flatnonzero(np.diff(t["indptr"]))
    }
    got = {line.split("\t")[0]: line.split("\t")[1].split(" ") for line in lines[1:]}
    assert got == rows


def test_ctranslate2_translates_with_the_exported_vmap(adapter, index, tiny_model_dir, tmp_path):
    import ctranslate2  # requirements.txt pins it: the peer engine
    from ctranslate2.converters import TransformersConverter

    vmap = export_vmap(index, vocabulary_tokens(adapter), tmp_path / "vmap.txt", k=2, frequent=3)
    out = TransformersConverter(str(tiny_model_dir)).convert(str(tmp_path / "ct2"), vmap=str(vmap))
    translator = ctranslate2.Translator(out, device="cpu")
    tok = adapter.tokenizer
    src = [tok.convert_ids_to_tokens(ids) for ids in adapter.tokenize(["package library", "the tool"], "en")]
    prefix = [[tok.convert_ids_to_tokens(adapter.lang_id("it"))]] * len(src)
    res = translator.translate_batch(
        src, target_prefix=prefix, use_vmap=True, beam_size=1, max_decoding_length=8
    )
    allowed = set(vmap.read_text(encoding="utf-8").replace("\t", " ").split())
    for r in res:
        assert set(r.hypotheses[0][1:]) <= allowed  # the forced tag aside, only mapped tokens


def test_min_prob_drops_the_entries_below_it_and_keeps_the_rest_in_order(adapter, index):
    t = index.tensors
    cut = float(np.median(t["probs"]))
    proj = make_projection(adapter, "shortlist", index=index, min_prob=cut, copy=False)
    full = make_projection(adapter, "shortlist", index=index, copy=False)
    kept = 0
    for s in np.flatnonzero(np.diff(t["indptr"])):
        lo, hi = t["indptr"][s], t["indptr"][s + 1]
        want = t["indices"][lo:hi][t["probs"][lo:hi] >= cut].tolist()
        assert proj._indices[proj._indptr[s] : proj._indptr[s + 1]].tolist() == want
        kept += len(want)
    assert 0 < kept < len(t["indices"]) and len(full._indices) == len(t["indices"])
    assert "min_prob" in proj.options() and "min_prob" not in full.options()
    with pytest.raises(ValueError, match="min_prob must be in"):
        make_projection(adapter, "shortlist", index=index, min_prob=1.0)
