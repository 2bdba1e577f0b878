"""LSH vocabulary selection (Hoang et al. 2022) on CPU: the hash and popcount against references (numpy,
Faiss IndexLSH), candidates = brute-force Hamming top-k, exact logits on them, k = N == full, the artifact
(round trip, refusal), the bias warning and the paper's failure, no state between calls, decoding."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.method_index import new_index, save_method_index
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels import create_projection
from fastvocab.kernels.lsh import (
    BIAS_WARN_RATIO,
    LshParams,
    build_lsh_index,
    hash_codes_numpy,
    pack_bits_torch,
    popcount64,
    projection_matrix,
)
from tests.conftest import synthetic_sentences
from tests.layers import fingerprint, random_layer, random_states

N, D = 300, 16


def layer(seed=0, bias_scale=0.0):
    return random_layer(N, D, seed, bias=bias_scale)


def states(rows=6, seed=1):
    return random_states(rows, D, seed)


def reference_candidates(w, h, bits, k, seed=0):
    """Brute force from the definition: sign bits of x R, Hamming distance, the k nearest (ties: lower id)."""
    r = projection_matrix(D, LshParams(bits=bits, seed=seed))
    wb = (w.numpy() @ r) >= 0  # (N, c)
    hb = (h.numpy() @ r) >= 0  # (rows, c)
    dist = (hb[:, None, :] != wb[None, :, :]).sum(-1)  # (rows, N)
    return np.argsort(dist, axis=1, kind="stable")[:, :k], dist


# ---------------------------------------------------------------------------------------------- the hash


def test_popcount_matches_numpy_on_every_bit_pattern():
    rng = np.random.default_rng(0)
    x = rng.integers(-(2**63), 2**63 - 1, size=4000, dtype=np.int64)
    x = np.concatenate([x, np.array([0, -1, 1, -(2**63), 2**63 - 1], dtype=np.int64)])
    got = popcount64(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, np.bitwise_count(x.view(np.uint64)))


@pytest.mark.parametrize("bits", [1, 63, 64, 100, 200])
def test_torch_packing_equals_numpy_packing(bits):
    x = states(9).numpy()
    r = projection_matrix(D, LshParams(bits=bits))
    np.testing.assert_array_equal(
        pack_bits_torch(torch.from_numpy(x @ r) >= 0).numpy(), hash_codes_numpy(x, r)
    )


def test_rotation_is_orthonormal_and_identity_when_bits_equal_d():
    assert np.array_equal(projection_matrix(D, LshParams(bits=D)), np.eye(D, dtype=np.float32))
    narrow = projection_matrix(D, LshParams(bits=8))  # orthonormal columns
    np.testing.assert_allclose(narrow.T @ narrow, np.eye(8), atol=1e-5)
    wide = projection_matrix(D, LshParams(bits=40))  # rows of an orthonormal (40, 40) matrix
    np.testing.assert_allclose(wide @ wide.T, np.eye(D), atol=1e-5)
    assert not np.array_equal(wide, projection_matrix(D, LshParams(bits=40, seed=1)))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("bits", "k"), [(16, 20), (100, 7), (200, 50)])
def test_candidates_are_the_brute_force_hamming_top_k(backend, bits, k):
    w, _ = layer()
    h = states()
    proj = create_projection("lsh", w, None, k=k, bits=bits, backend=backend)
    want, _ = reference_candidates(w, h, bits, k)
    np.testing.assert_array_equal(proj.candidates(h).numpy(), np.sort(want, axis=1))


def test_codes_and_distances_equal_faiss_index_lsh():
    """Faiss IndexLSH with our rotation: the same codes byte for byte and the same k smallest distances."""
    faiss = pytest.importorskip("faiss")
    w, _ = layer()
    h = states()
    bits, k = 100, 20
    index = build_lsh_index(w, LshParams(bits=bits), fingerprint="fp")
    ref = faiss.IndexLSH(D, bits, True, False)
    faiss.copy_array_to_vector(np.ascontiguousarray(index.tensors["projection"].T).ravel(), ref.rrot.A)
    ref.rrot.is_trained = True
    ref.is_trained = True
    ref.add(w.numpy())
    codes = faiss.vector_to_array(ref.codes).reshape(N, -1)
    np.testing.assert_array_equal(codes, index.tensors["codes"][:, : codes.shape[1]])
    dist_faiss, _ = ref.search(h.numpy(), k)
    ids = create_projection("lsh", w, None, k=k, bits=bits).candidates(h).numpy()
    _, dist = reference_candidates(w, h, bits, k)
    np.testing.assert_array_equal(np.sort(np.take_along_axis(dist, ids, 1)), dist_faiss.astype(np.int64))


# ---------------------------------------------------------------------------------------------- the logits


@pytest.mark.parametrize("rows", [2, 40])  # per-row gather+GEMV, and the dense GEMM + gather
def test_logits_are_the_full_logits_on_each_rows_candidates(rows):
    w, b = layer(bias_scale=0.1)
    h = states(rows)
    out = create_projection("lsh", w, b, k=5, bits=64, check_bias=False)(h)
    assert out.ids.shape == (rows, 5) and out.logits.shape == (rows, 5)
    full = torch.nn.functional.linear(h, w, b)
    torch.testing.assert_close(out.logits, full.gather(1, out.ids))
    assert (out.active_columns() == 5).all()


def test_k_equal_n_reproduces_full_softmax_top1_exactly():
    w, b = layer(bias_scale=0.5)
    h = states(50, seed=3)
    full = create_projection("full", w, b)(h)
    out = create_projection("lsh", w, b, k=N, bits=32, check_bias=False)(h)
    assert torch.equal(out.dense(), full.logits)
    assert torch.equal(out.topk(1)[1], full.topk(1)[1])


def test_small_k_finds_most_argmaxes_of_a_bias_free_layer():
    w, _ = layer()
    h = states(200, seed=4)
    out = create_projection("lsh", w, None, k=30, bits=256)(h)
    agree = (out.topk(1)[1] == create_projection("full", w, None)(h).topk(1)[1]).float().mean()
    assert agree > 0.9


def test_always_active_ids_are_added_once_per_row():
    w, _ = layer()
    h = states(4)
    plain = create_projection("lsh", w, None, k=10, bits=64)(h)
    have = int(plain.ids[0, 0])  # row 0 already has this id among its candidates
    out = create_projection("lsh", w, None, k=10, bits=64, always_active=[have, 7])(h)
    assert out.ids.shape == (4, 12)
    assert torch.equal(out.ids[:, :10], plain.ids)
    assert (out.ids[:, 10:] == torch.tensor([7, have]).sort().values).all()
    assert out.logits[0, 10 + int(have > 7)] == -math.inf  # the duplicate is padding
    dense = out.dense()
    assert torch.isfinite(dense[:, [7, have]]).all()
    assert (out.active_columns() <= 12).all() and out.active_columns()[0] == 11 + int(7 in plain.ids[0])


def test_empty_batch():
    w, _ = layer()
    out = create_projection("lsh", w, None, k=4, bits=64)(torch.zeros(0, D))
    assert out.logits.shape == (0, 4) and out.ids.shape == (0, 4)


# ---------------------------------------------------------------------------------------------- no state


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_consecutive_calls_equal_fresh_objects(backend):
    w, b = layer(bias_scale=0.05)
    shared = create_projection("lsh", w, b, k=12, bits=64, backend=backend, always_active=[2])
    seen = []
    for seed, rows in [(10, 3), (11, 1), (12, 7), (10, 3)]:
        h = states(rows, seed)
        got = shared(h)
        fresh = create_projection("lsh", w, b, k=12, bits=64, backend=backend, always_active=[2])(h)
        assert torch.equal(got.ids, fresh.ids) and torch.equal(got.logits, fresh.logits)
        seen.append(frozenset(got.ids.reshape(-1).tolist()))
    assert len(set(seen)) > 1  # the candidate sets did change


# ---------------------------------------------------------------------------------------------- the artifact


def test_index_folder_gives_the_in_memory_projection(tmp_path):
    w, b = layer(bias_scale=0.05)
    fp = fingerprint(w, b)
    save_method_index(build_lsh_index(w, LshParams(bits=100, seed=3), fingerprint=fp), tmp_path / "lsh")
    from_disk = create_projection("lsh", w, b, k=9, index=tmp_path / "lsh", fingerprint=fp)
    in_memory = create_projection("lsh", w, b, k=9, bits=100, seed=3, fingerprint=fp)
    h = states(5)
    assert torch.equal(from_disk(h).ids, in_memory(h).ids)
    assert from_disk.signature() == in_memory.signature()
    assert "bits:100" in from_disk.signature() and "k:9" in from_disk.signature()


def test_index_of_another_model_is_refused(tmp_path):
    w, _ = layer()
    other, _ = layer(seed=5)
    save_method_index(
        build_lsh_index(other, LshParams(bits=64), fingerprint=fingerprint(other, None)), tmp_path / "i"
    )
    with pytest.raises(ArtifactError, match="was built for model"):
        create_projection("lsh", w, None, index=tmp_path / "i")
    in_memory = build_lsh_index(other, LshParams(bits=64), fingerprint=fingerprint(other, None))
    with pytest.raises(ArtifactError, match="was built for model"):
        create_projection("lsh", w, None, index=in_memory)


def test_index_of_another_method_or_shape_is_refused(tmp_path):
    w, _ = layer()
    fp = fingerprint(w, None)
    graphish = new_index(
        "graph", model_fingerprint=fp, direction="*", n_vocab=N, d=D, params={}, tensors={"x": np.zeros(1)}
    )
    save_method_index(graphish, tmp_path / "g")
    with pytest.raises(ArtifactError, match="not a 'lsh' index"):
        create_projection("lsh", w, None, index=tmp_path / "g")
    wrong = build_lsh_index(w, LshParams(bits=64), fingerprint=fp)
    wrong.manifest.n_vocab = N + 1
    with pytest.raises(ArtifactError, match="N=301"):
        create_projection("lsh", w, None, index=wrong)


def test_options_that_contradict_the_index_fail():
    w, _ = layer()
    idx = build_lsh_index(w, LshParams(bits=64), fingerprint=fingerprint(w, None))
    with pytest.raises(ValueError, match="bits=128 differs from the index's bits=64"):
        create_projection("lsh", w, None, index=idx, bits=128)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"k": 0}, "k must be an integer >= 1"),
        ({"bits": 0}, "bits must be an integer >= 1"),
        ({"backend": "cuda"}, "backend must be one of"),
        ({"bits": 32, "rotate": False}, "needs bits == d"),
        ({"kk": 3}, "bad options for method 'lsh'"),
    ],
)
def test_bad_options_fail_loudly(options, match):
    w, _ = layer()
    with pytest.raises(ValueError, match=match):
        create_projection("lsh", w, None, **options)


# ---------------------------------------------------------------------------------------------- the bias


def test_large_output_bias_breaks_lsh_and_warns(caplog):
    """Hoang et al. Table 3: LSH ignores the bias, so a model with a large one loses its argmax."""
    w, _ = layer()
    h = states(200, seed=6)
    spread = float(torch.nn.functional.linear(h, w).std(dim=1).median())
    b = 3.0 * spread * torch.randn(N, generator=torch.Generator().manual_seed(9))
    without = create_projection("lsh", w, None, k=15, bits=256)(h).topk(1)[1]
    assert (without == create_projection("full", w, None)(h).topk(1)[1]).float().mean() > 0.9
    full = create_projection("full", w, b)(h).topk(1)[1]
    with caplog.at_level(logging.WARNING, logger="fastvocab.kernels.lsh"):
        proj = create_projection("lsh", w, b, k=15, bits=256)
        agree = (proj(h).topk(1)[1] == full).float().mean()
        proj(h)  # warns once
    assert agree < 0.5
    assert proj.bias_ratio > BIAS_WARN_RATIO
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "output bias" in caplog.records[0].message


def test_no_warning_without_bias_or_with_a_small_one(caplog):
    w, _ = layer()
    h = states(50)
    with caplog.at_level(logging.WARNING, logger="fastvocab.kernels.lsh"):
        create_projection("lsh", w, None, k=30)(h)
        small = create_projection("lsh", w, 0.01 * torch.randn(N), k=30)
        small(h)
    assert not caplog.records
    assert 0 < small.bias_ratio < BIAS_WARN_RATIO


# ---------------------------------------------------------------------------------------------- decoding


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Seq2SeqAdapter.load(tiny_model_dir)
    torch.set_num_threads(threads)


def decode(adapter, method, texts, beam=1, **options):
    from fastvocab.decoding.search import beam_search, greedy_search
    from fastvocab.tasks.projections import make_projection

    proj = options.pop("projection", None) or make_projection(adapter, method, **options)
    batch = adapter.encode_texts(texts, "en", "it")
    if beam == 1:
        return greedy_search(adapter, proj, batch, "en", "it", max_len=12)
    settings = SearchSettings(beam=beam, max_len=12, early_stopping=False)
    return beam_search(adapter, proj, batch, "en", "it", settings)


@pytest.mark.parametrize("beam", [1, 2])
def test_greedy_and_beam_with_k_covering_the_vocabulary_equal_full(adapter, beam):
    texts = synthetic_sentences("en", 5, seed=3)
    full = decode(adapter, "full", texts, beam)
    assert any(full)
    assert decode(adapter, "lsh", texts, beam, k=adapter.n_vocab, bits=64) == full


def test_consecutive_decoding_batches_equal_fresh_projection(adapter):
    from fastvocab.tasks.projections import make_projection

    shared = make_projection(adapter, "lsh", k=40, bits=64)
    decode(adapter, None, synthetic_sentences("en", 4, seed=11), projection=shared)
    texts = synthetic_sentences("en", 4, seed=12)
    got = decode(adapter, None, texts, projection=shared)
    assert got == decode(adapter, "lsh", texts, k=40, bits=64)
