"""Beam search's compiled host step (``decoding/host_beam_step.py``) against the torch and numpy it stands
for: the candidates' order, the log-probs and ids of each row's best continuations, whole searches.

The advance itself is checked against the tensor step, step by step, in
``test_search.py::test_host_step_equals_the_tensor_step``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastvocab import switches
from fastvocab.decoding import beam_candidates, beam_kernels, search
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import beam_search, row_candidates
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels.base import ProjectionOutput
from fastvocab.tasks.projections import clustered_options, make_projection
from tests.conftest import synthetic_sentences
from tests.layers import random_map


def _torch_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(x, k, dim=-1)


def test_best_first_is_a_stable_descending_argsort():
    """Largest first, the lower index first among equal values, NaN last: ``np.argsort(-x, "stable")``."""
    best_first = beam_kernels.compiled_step()._best_first
    rng = np.random.default_rng(0)
    for trial in range(200):
        x = rng.integers(-3, 4, size=int(rng.integers(1, 24))).astype(np.float32)  # many ties
        if trial % 3 == 0:
            x[rng.integers(0, x.shape[0], size=2)] = rng.choice([np.nan, -np.inf, np.inf], size=2)
        for m in {1, min(4, x.shape[0]), x.shape[0]}:
            out = np.full(m, -1, dtype=np.int64)
            best_first(x, m, out)
            np.testing.assert_array_equal(out, np.argsort(-x, kind="stable")[:m], err_msg=str((x, m)))


@pytest.mark.parametrize("ids", ["full", "shared"])
@pytest.mark.parametrize("mass", [False, True])
@pytest.mark.parametrize("banned", [False, True])
@pytest.mark.parametrize("first", [False, True])
def test_compiled_candidates_equal_torchs(ids, mass, banned, first):
    """Each row's 2k best log-probs and ids: the compiled call against torch's log-softmax (with the left-out
    mass where there is one), banned ids at -inf and ``torch.topk``. The compiled call sums its own exp (a
    group of 64 columns in float32, the groups in float64), so the log-probs agree to float32 rounding; the
    ids are the same. 80 columns: a whole group and a tail."""
    gen = torch.Generator().manual_seed(1)
    rows, n_vocab, k = 6, 80, 3
    c = n_vocab if ids == "full" else 30
    col_ids = None if ids == "full" else torch.randperm(n_vocab, generator=gen)[:c]
    logits = torch.randn(rows, c, generator=gen) * 3
    left_out = torch.randn(rows, generator=gen) + 2 if mass else None
    out = ProjectionOutput(logits, col_ids, n_vocab, log_inactive_mass=left_out)
    # The best few columns' ids banned: the answer must skip them.
    top_ids = out.to_vocab_ids(torch.topk(logits, 2, dim=-1).indices)
    ban = torch.unique(top_ids[:, 0]) if banned else None
    assert beam_candidates._host_can(out)
    got_vals, got_toks = row_candidates(out, ban, k, first)
    want_vals, want_toks = row_candidates(out, ban, k, first, topk=_torch_topk)
    assert got_vals.shape == want_vals.shape == (rows * (k if first else 1), 2 * k)
    assert torch.equal(got_toks, want_toks)
    torch.testing.assert_close(got_vals, want_vals, rtol=0, atol=1e-5)
    assert bool((got_vals < 0).all())
    if banned:
        assert not bool(torch.isin(got_toks, ban).any())


@pytest.mark.parametrize("mass", [False, True])
def test_a_row_of_minus_infinity_normalises_as_torch_does(mass):
    """A row whose every column is -inf: NaN log-probs without a left-out mass (torch's log-softmax), -inf
    with one (the mass is the whole normaliser)."""
    logits = torch.full((2, 5), -math.inf)
    logits[1] = torch.arange(5.0)
    left_out = torch.tensor([0.5, 0.5]) if mass else None
    out = ProjectionOutput(logits, None, 5, log_inactive_mass=left_out)
    got, _ = row_candidates(out, None, 1)
    want, _ = row_candidates(out, None, 1, topk=_torch_topk)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6, equal_nan=True)
    assert bool(got[0].isnan().all()) != mass


@pytest.mark.parametrize("ids", ["full", "shared"])
@pytest.mark.parametrize("mass", [False, True])
def test_wide_rows_with_ties_rank_as_a_stable_sort(ids, mass):
    """Rows of thousands of columns (whole groups of the scan and a tail), integer logits so that many tie
    across groups, a few banned ids: the compiled candidates are the columns of a stable descending sort of
    the log-probs (ties: the lower column first) without the banned ones, and their log-probs are torch's
    log-softmax to float32 rounding."""
    gen = torch.Generator().manual_seed(3)
    rows, c, n_vocab, k = 5, 64 * 40 + 37, 5000, 4
    col_ids = None if ids == "full" else torch.randperm(n_vocab, generator=gen)[:c]
    logits = torch.randint(-40, 12, (rows, c), generator=gen).float()
    logits[:, -1] = 11.0  # a tie at the maximum in the tail
    left_out = torch.randn(rows, generator=gen) + 9 if mass else None
    out = ProjectionOutput(logits, col_ids, n_vocab, log_inactive_mass=left_out)
    ban = out.to_vocab_ids(torch.topk(logits, 3, dim=-1).indices)[:2].flatten().unique()
    got_vals, got_toks = row_candidates(out, ban, k)
    want_vals, _ = row_candidates(out, ban, k, topk=_torch_topk)
    torch.testing.assert_close(got_vals, want_vals, rtol=0, atol=1e-5)
    vocab = torch.arange(c) if col_ids is None else col_ids
    for r in range(rows):
        keep = ~torch.isin(vocab, ban)
        order = np.argsort(-logits[r][keep].numpy(), kind="stable")[: 2 * k]
        assert torch.equal(got_toks[r], vocab[keep][order]), r


def test_the_exp_is_within_float32_rounding():
    """The vectorised exp the normaliser sums, against float64's: within 2e-7 near 0, where a row's sum
    gets its size, and within float32's rounding of ``t / ln 2`` further out (|t| x 6e-8)."""
    exp = beam_kernels.compiled_step()._exp
    t = np.linspace(-87.0, 0.0, 100_001).astype(np.float32)
    got = np.array([exp(v) for v in t[::97]], dtype=np.float64)
    want = np.exp(t[::97].astype(np.float64))
    assert bool((np.abs(got / want - 1) < 2e-7 + 6e-8 * np.abs(t[::97])).all())
    assert np.abs(got / want - 1)[t[::97] > -1].max() < 2e-7


def test_other_outputs_take_torchs_path(switch):
    """Per-row ids (a per-row selection) take torch's log-softmax and top-k; so does every output where the
    compiled candidates are switched off."""
    out = ProjectionOutput(torch.randn(4, 50), None, 50)
    assert beam_candidates._host_can(out)
    per_row = ProjectionOutput(torch.randn(2, 5), torch.randint(0, 50, (2, 5)), 50)
    assert not beam_candidates._host_can(per_row)
    switch(COMPILED_CANDIDATES=False)
    assert not beam_candidates._host_can(out)


@pytest.fixture(scope="module")
def adapter(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("rule", [False, True, "never"])
def test_beam_search_with_the_compiled_step_equals_the_tensor_step(adapter, monkeypatch, rule):
    """Whole beam searches on CPU: the compiled candidates and advance, against torch's candidates and the
    tensor step (the one an accelerator runs), with the full projection and with a clustered one that
    estimates the left-out mass; the same hypotheses."""
    texts = synthetic_sentences("en", 6, seed=4)
    batch = adapter.encode_texts(texts, "en")
    settings = SearchSettings(beam=3, max_len=12, early_stopping=rule, length_penalty=1.2)
    full = make_projection(adapter, "full")
    cmap = random_map(adapter.output_weight, adapter.output_bias, size=60)
    clustered = make_projection(
        adapter, "clustered", cluster_map=cmap, **clustered_options("union", "auto", False, 3)
    )
    for proj in (full, clustered):
        got = beam_search(adapter, proj, batch, "en", "it", settings)
        with monkeypatch.context() as patch, switches.override(COMPILED_CANDIDATES=False):
            patch.setattr(search.BeamState, "_advance_host", _tensor_advance)
            want = beam_search(adapter, proj, batch, "en", "it", settings)
        assert got == want and any(got), (proj, rule)


def _tensor_advance(self, row_vals, row_toks, final):
    """BeamState's tensor step run where the host step would (``host`` only picks between the two; the
    tensor step merges and checks every step, so its pool counts as taken)."""
    self.host, self.pooled = False, True
    try:
        return self.advance(row_vals, row_toks, final)
    finally:
        self.host = True


def test_warm_compiles_what_beam_search_calls(adapter):
    """``warm`` (run into the deploy image) compiles the functions for the very types beam search passes
    them (with a clustered projection's ``moments`` estimate): a search after it compiles nothing more."""
    from fastvocab.kernels.host_moments import moments_union

    kernels = beam_kernels.compiled_step()
    compiled = (kernels.advance, kernels.row_candidates, moments_union)
    kernels.warm()
    before = [list(f.signatures) for f in compiled]
    batch = adapter.encode_texts(synthetic_sentences("en", 3, seed=5), "en")
    cmap = random_map(adapter.output_weight, adapter.output_bias, size=60)
    proj = make_projection(
        adapter, "clustered", cluster_map=cmap, **clustered_options("union", "auto", False, 2)
    )
    assert any(beam_search(adapter, proj, batch, "en", "it", SearchSettings(beam=2, max_len=8)))
    assert [list(f.signatures) for f in compiled] == before
    assert all(before), "a function warm does not compile"


def test_a_function_numba_cannot_cache_is_compiled_without_the_cache():
    """Where numba has no folder to cache a function in (here: one without a source file), ``njit``
    compiles it in the process instead of failing the import."""
    from fastvocab.kernels.jit import njit

    scope: dict = {}
    exec("def plus_one(x):\n    return x + 1\n", scope)
    compiled = njit()(scope["plus_one"])
    assert compiled(np.int64(41)) == 42 and compiled.signatures


_PREPARE_TWICE = """
from fastvocab.decoding.search import prepare_compiled_step
prepare_compiled_step()
prepare_compiled_step()  # once per process: the second call says and does nothing
"""


@pytest.mark.slow  # ~25 s on 2 shared cores: a real compile, and two processes importing torch
def test_a_cold_numba_cache_is_said_once_and_a_warm_one_not_at_all(tmp_path):
    """Compiled for real (~10 s) into an empty cache folder: the first process prints the one line naming
    where the code is kept; the next process, on the cache the first left, prints nothing."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}  # numba looks there before beside the module

    def stderr() -> list[str]:
        run = [sys.executable, "-c", _PREPARE_TWICE]
        done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300, check=True)
        return done.stderr.splitlines()

    (line,) = stderr()
    start = "compiling the beam search's CPU kernels (once per machine, ~10 s; cached in "
    assert line.startswith(f"{start}{tmp_path}{os.sep}") and line.endswith(")"), line
    assert any(tmp_path.rglob("*.nbi")) and stderr() == []


@pytest.mark.parametrize("state", ["cold", "warm", "uncached"])
def test_translate_prepares_the_compiled_step_before_its_first_beam(adapter, monkeypatch, capsys, state):
    """``translate`` at beam > 1 on CPU loads the compiled step before decoding (so a decode pool's forks
    inherit it), with the line a cold or missing cache calls for (numba's cache read as ``state`` here;
    nothing compiled); greedy search needs no compiled step."""
    from fastvocab.decoding import host_beam_step
    from fastvocab.tasks.translate import translate

    warmed: list[bool] = []
    monkeypatch.setattr(beam_kernels, "_PREPARED", False)
    monkeypatch.setattr(host_beam_step, "cache_state", lambda: (state, "/cache/decoding_x"))
    monkeypatch.setattr(host_beam_step, "warm", lambda: warmed.append(True))
    lines = synthetic_sentences("en", 2, seed=3)
    proj = make_projection(adapter)
    translate(adapter, proj, lines, "en", "it", SearchSettings(max_len=4), progress=False, workers=1)
    assert warmed == [] and capsys.readouterr().err == ""
    beam = SearchSettings(beam=2, max_len=4)
    for _ in range(2):
        translate(adapter, proj, lines, "en", "it", beam, progress=False, workers=1)
    err = capsys.readouterr().err.splitlines()
    assert warmed == [True]
    if state == "cold":
        assert err == ["compiling the beam search's CPU kernels (once per machine, ~10 s; cached in "
                       "/cache/decoding_x)"]  # fmt: skip
    elif state == "uncached":
        assert len(err) == 1 and "every process compiles them: set NUMBA_CACHE_DIR" in err[0]
    else:
        assert err == []
