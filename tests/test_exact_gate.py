"""The exact mode's choice between the certificate step and the full one: measured per call, and never an
output changed by it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import beam_search, greedy_search
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels.exact_gate import PROBE_EVERY, WARMUP_CALLS, ExactGate
from fastvocab.tasks.projections import make_projection
from tests.conftest import synthetic_sentences
from tests.layers import map_from_sets


def test_gate_picks_the_full_step_where_the_certificate_does_not_pay():
    gate = ExactGate(n_vocab=1000, search_columns=50)
    steps = [gate.full_step() for _ in range(WARMUP_CALLS)]
    assert not any(steps)  # it measures before it decides
    gate.record(rows=100, certified=10, columns=100 * 200)  # c 0.10 against u (200 + 50) / 1000 = 0.25
    calls = range(WARMUP_CALLS + 1, WARMUP_CALLS + 1 + 8 * PROBE_EVERY)
    probes = [call for call in calls if not gate.full_step()]  # every call full but these
    first = WARMUP_CALLS + PROBE_EVERY
    assert probes == [first, first + PROBE_EVERY, first + 3 * PROBE_EVERY, first + 7 * PROBE_EVERY]
    gate.record(rows=400, certified=400, columns=400 * 200)  # now c 0.82 > u
    assert gate.pays() and not gate.full_step()


@pytest.fixture(scope="module")
def adapter(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("beam", [1, 2])
def test_exact_steps_go_full_when_few_rows_are_certified_and_the_outputs_stay_full_softmaxs(adapter, beam):
    rng = np.random.default_rng(7)
    n = adapter.n_vocab
    sets = [rng.choice(n, 4, replace=False).tolist() for _ in range(6)]  # tiny sets: a loose bound
    cmap = map_from_sets(rng.standard_normal((6, adapter.d_model)), sets, n, adapter.fingerprint)
    full = make_projection(adapter, "full")
    batch = adapter.encode_texts(synthetic_sentences("en", 6, seed=4), "en", "it")
    settings = SearchSettings(beam=beam, max_len=24, early_stopping=False)

    def search(*args):
        return greedy_search(*args, max_len=24) if beam == 1 else beam_search(*args, settings)

    want = search(adapter, full, batch, "en", "it")
    exact_k = 1 if beam == 1 else 2 * beam
    gated = make_projection(adapter, "clustered", cluster_map=cmap, exact_k=exact_k)
    assert search(adapter, gated, batch, "en", "it") == want
    calls = gated._gate.calls
    assert calls > WARMUP_CALLS + 1 and 0 < gated.counters["full"] < gated.counters["rows"]
    assert gated.stats()["full_fraction"] > 0.5  # most steps skipped the certificate
    ungated = make_projection(
        adapter, "clustered", cluster_map=cmap, exact_k=exact_k, full_when_cheaper=False
    )
    assert search(adapter, ungated, batch, "en", "it") == want
    assert ungated.counters["full"] == 0 and ungated.certified_fraction < 0.5
    gated.full_when_cheaper = False  # switched off later, as for the int8 rule: the certificate every step
    gated.reset_counters()
    assert search(adapter, gated, batch, "en", "it") == want
    assert gated.counters["full"] == 0 and gated.counters["rows"] > 0
