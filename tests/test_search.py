"""Greedy and beam search against ``model.generate``, and with candidate-set projections (subset ids).

Random-weight models repeat one token until the length limit, which would leave EOS handling untested. The
``eos_model_dir`` fixture therefore unties the LM head of a random M2M100 and fits its EOS row (least squares)
so that EOS wins after a different number of steps for each sentence: hidden states do not depend on the
head, so the fit only moves the point where each sentence stops.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TINY_ARCH, generate_ids, synthetic_sentences

from fastvocab.decoding import Seq2SeqAdapter, StepRecord, beam_search, greedy_search
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels import create_projection
from fastvocab.kernels.base import Projection, ProjectionOutput

MAX_LEN = 16
# the fitted EOS logit minus the best other logit grows by this much per step, crossing 0 at the wanted stop
EOS_SLOPE = 8.0
DIRECTIONS = [("en", "it"), ("it", "fr"), ("de", "en")]


def _fit_eos_model(tok, tiny_model_dir, seed: int):
    """A random M2M100 with larger weights and an EOS row fitted so sentences stop at chosen steps."""
    from transformers import M2M100ForConditionalGeneration

    from fastvocab.training.demo_model import model_config

    config = model_config(TINY_ARCH, tok, max_positions=128)
    config.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "lm_head" not in name:  # larger weights: outputs depend on the source
                p.normal_(0, 3.0 / p.shape[1] ** 0.5, generator=gen)
        model.lm_head.weight.copy_(model.model.shared.weight)
    adapter = Seq2SeqAdapter(model, tok, tiny_model_dir, "cpu", torch.float32)
    full = create_projection("full", adapter.output_weight, None)
    rng = torch.Generator().manual_seed(seed + 1)
    states, targets = [], []
    for src, tgt in DIRECTIONS:
        batch = adapter.encode_texts(synthetic_sentences(src, 12, seed=5), src)
        stop = torch.randint(1, MAX_LEN, (12,), generator=rng).float()  # wanted length per sentence
        records: list[StepRecord] = []
        greedy_search(adapter, full, batch, src, tgt, max_len=MAX_LEN, step_hook=records.append)
        for r in records:
            logits = r.output.logits.clone()
            logits[:, adapter.eos_id] = -math.inf
            states.append(r.hidden.clone())
            targets.append(logits.max(dim=1).values + EOS_SLOPE * (r.step - stop[r.row_ids] + 0.5))
    h = torch.cat(states)
    design = torch.cat([h, torch.ones(len(h), 1)], dim=1)
    w = torch.linalg.lstsq(design, torch.cat(targets)[:, None]).solution[:, 0]
    with torch.no_grad():
        model.lm_head.weight[adapter.eos_id] = w[:-1]
    # The fit is approximate and not bit-reproducible (BLAS results vary in the last bits from run to run):
    # report whether every direction really stops at varied lengths. A steep EOS_SLOPE keeps the fit far from
    # that threshold: 12 of 12 seeds passed at 8 against 6-7 of 12 at 0.5, which made the fixture flaky.
    varied = True
    for src, tgt in DIRECTIONS:
        lengths = [
            len(x)
            for x in greedy_search(
                adapter, full, adapter.encode_texts(_sources(src), src), src, tgt, max_len=MAX_LEN
            )
        ]
        varied &= len(set(lengths)) >= 3 and min(lengths) < MAX_LEN
    return model, varied


def build_eos_model(tiny_model_dir: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    for seed in range(1, 9):
        model, varied = _fit_eos_model(tok, tiny_model_dir, seed)
        if varied:
            break
    else:
        raise RuntimeError("no seed gave an EOS-fitted model whose sentences stop at varied lengths")
    model.save_pretrained(out)
    tok.save_pretrained(out)


@pytest.fixture(scope="module")
def eos_model_dir(tiny_model_dir, tmp_path_factory):
    """Built in a fresh interpreter: in the suite's process, state left by earlier test modules (not yet
    identified) changed the fit so that no sentence ever stopped; alone it is deterministic."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("eos_model") / "model"
    # One thread: BLAS/OpenMP libraries adapt their thread use to the machine's load, which changes float
    # reduction order; the least-squares fit above is close enough to its threshold that the suite's load
    # (Ray processes of earlier modules winding down) made it fail for every seed.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, str(tiny_model_dir), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def adapter(eos_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(eos_model_dir)


@pytest.fixture(scope="module")
def full(adapter) -> Projection:
    return create_projection("full", adapter.output_weight, adapter.output_bias)


def _sources(src: str, n: int = 12) -> list[str]:
    return synthetic_sentences(src, n, seed=5)


@pytest.mark.parametrize(("src", "tgt"), DIRECTIONS)
def test_greedy_equals_generate(adapter, full, src, tgt):
    batch = adapter.encode_texts(_sources(src), src)
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 3  # varied input lengths (padding in play)
    ours = greedy_search(adapter, full, batch, src, tgt, max_len=MAX_LEN)
    ref = generate_ids(adapter, batch, tgt, MAX_LEN, num_beams=1)
    assert ours == ref
    lengths = [len(s) for s in ours]
    assert len(set(lengths)) >= 3 and min(lengths) < MAX_LEN  # EOS at different steps: row dropping used


@pytest.mark.parametrize(("beam", "lp"), [(2, 1.0), (4, 1.0), (4, 0.6), (3, 2.0)])
def test_beam_equals_generate(adapter, full, beam, lp):
    for src, tgt in DIRECTIONS[:2]:
        batch = adapter.encode_texts(_sources(src), src)
        settings = SearchSettings(beam=beam, max_len=MAX_LEN, length_penalty=lp, early_stopping=False)
        ours = beam_search(adapter, full, batch, src, tgt, settings)
        ref = generate_ids(
            adapter, batch, tgt, MAX_LEN, num_beams=beam, length_penalty=lp, early_stopping=False
        )
        assert ours == ref, (src, tgt)


def test_beam_early_stopping_equals_generate(adapter, full):
    for src, tgt in DIRECTIONS[1:]:
        batch = adapter.encode_texts(_sources(src), src)
        settings = SearchSettings(beam=4, max_len=MAX_LEN, length_penalty=1.0, early_stopping=True)
        ours = beam_search(adapter, full, batch, src, tgt, settings)
        assert ours == generate_ids(adapter, batch, tgt, MAX_LEN, num_beams=4, early_stopping=True)


@pytest.mark.parametrize("rule", [True, "never"])
def test_decode_reads_early_stopping_from_generation_config(adapter, full, rule):
    """decode() stops beams by the model's generation config, as generate() does (NLLB/M2M100 set True)."""
    from fastvocab.decoding.search import decode

    gc = adapter.model.generation_config
    saved = gc.early_stopping
    settings = SearchSettings(beam=3, max_len=MAX_LEN, length_penalty=1.5)
    batches = [(adapter.encode_texts(_sources(src), src), src, tgt) for src, tgt in DIRECTIONS[:2]]
    default = [decode(adapter, full, batch, src, tgt, settings) for batch, src, tgt in batches]
    # An explicit rule overrides the config's (translate --early-stopping).
    ruled = replace(settings, early_stopping=rule)
    explicit = [decode(adapter, full, b, s, t, ruled) for b, s, t in batches]
    gc.early_stopping = rule
    try:
        assert adapter.early_stopping == rule
        ours = [decode(adapter, full, batch, src, tgt, settings) for batch, src, tgt in batches]
        assert ours != default  # the rule changes some outputs here, so following it is what is tested
        assert explicit == ours
        for out, (batch, _, tgt) in zip(ours, batches, strict=True):
            assert out == generate_ids(
                adapter, batch, tgt, MAX_LEN, num_beams=3, length_penalty=1.5, early_stopping=rule
            )
    finally:
        gc.early_stopping = saved
    with pytest.raises(ValueError, match="early_stopping must be"):
        settings = SearchSettings(beam=4, early_stopping="sometimes")
        beam_search(adapter, full, adapter.encode_texts(["a"], "en"), "en", "it", settings)


@pytest.mark.parametrize("max_len", [3, MAX_LEN])
def test_one_sentence_greedy_equals_generate(adapter, full, max_len):
    """A batch of one sentence takes greedy search's one-row loop: the tokens generate() gives, the length
    limit's cut included, and the projection called as often as the batched loop calls it."""
    calls = []

    def counted(h):
        calls.append(h.shape[0])
        return full(h)

    lengths = []
    for line in _sources("en", 6):
        batch = adapter.encode_texts([line], "en")
        ours = greedy_search(adapter, counted, batch, "en", "it", max_len=max_len)
        assert ours == generate_ids(adapter, batch, "it", max_len, num_beams=1)
        one_row = len(calls)
        hooked = dict(max_len=max_len, step_hook=lambda r: None)  # a step hook takes the batched loop
        batched = greedy_search(adapter, counted, batch, "en", "it", **hooked)
        assert batched == ours and len(calls) - one_row == one_row
        calls.clear()
        lengths.append(len(ours[0]))
    # both ends in play: the limit (max_len 3 cuts these sentences), EOS (before MAX_LEN)
    assert max(lengths) == 3 if max_len == 3 else min(lengths) < max_len


def test_beam_one_equals_greedy(adapter, full):
    batch = adapter.encode_texts(_sources("en"), "en")
    greedy = greedy_search(adapter, full, batch, "en", "it", max_len=MAX_LEN)
    settings = SearchSettings(beam=1, max_len=MAX_LEN, early_stopping=False)
    assert beam_search(adapter, full, batch, "en", "it", settings) == greedy


def test_finished_rows_are_dropped(adapter, full):
    batch = adapter.encode_texts(_sources("it"), "it")
    records: list[StepRecord] = []
    seqs = greedy_search(adapter, full, batch, "it", "fr", max_len=MAX_LEN, step_hook=records.append)
    rows = [r.row_ids.tolist() for r in records]
    assert [r.step for r in records] == list(range(len(records)))
    # Step t holds exactly the sentences that have not ended before t.
    for t, row_ids in enumerate(rows):
        assert row_ids == [i for i, s in enumerate(seqs) if len(s) >= t]
    assert len(rows[-1]) < len(rows[0])
    for r in records:
        assert r.hidden.shape == (len(r.row_ids), adapter.d_model)


def test_static_and_hf_engines_agree(adapter, full):
    """The static decoder step (default for M2M100) and the Hugging Face one give the same search output."""
    assert adapter.engine == "static"
    hf = Seq2SeqAdapter(adapter.model, adapter.tokenizer, adapter.path, "cpu", adapter.dtype, engine="hf")
    for src, tgt in DIRECTIONS:
        batch = adapter.encode_texts(_sources(src), src)
        greedy = greedy_search(adapter, full, batch, src, tgt, max_len=MAX_LEN)
        assert greedy == greedy_search(hf, full, batch, src, tgt, max_len=MAX_LEN)
        for beam in (2, 4):
            settings = SearchSettings(beam=beam, max_len=MAX_LEN, early_stopping=False)
            ours = beam_search(adapter, full, batch, src, tgt, settings)
            assert ours == beam_search(hf, full, batch, src, tgt, settings)


def test_max_len_and_empty_batch(adapter, full):
    batch = adapter.encode_texts(_sources("en"), "en")
    for max_len in (1, 3):
        assert all(
            len(s) <= max_len for s in greedy_search(adapter, full, batch, "en", "it", max_len=max_len)
        )
        settings = SearchSettings(beam=4, max_len=max_len, early_stopping=False)
        assert all(len(s) <= max_len for s in beam_search(adapter, full, batch, "en", "it", settings))
    empty = adapter.encode_texts([], "en")
    assert greedy_search(adapter, full, empty, "en", "it") == []
    settings = SearchSettings(beam=4, early_stopping=False)
    assert beam_search(adapter, full, empty, "en", "it", settings) == []
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        greedy_search(adapter, full, batch, "en", "xx")


# --------------------------------------------------------------------------- candidate-set projections


class _SubsetProjection(Projection):
    """Computes only some columns, chosen from ``h`` alone (so the reference can recompute them).

    kind="shared": the upper half of the vocabulary plus the always-active ids, ids (C,).
    kind="per_row": even ids for rows with h[:, 0] > 0, odd ids otherwise (+ always active), ids (rows, C),
    in a shuffled column order so positions never equal vocabulary ids.
    kind="topm": each row's own top-M columns with the exact mass of the rest in ``log_inactive_mass``.
    """

    def __init__(self, weight, bias, *, always_active=(), kind="shared", m=8):
        super().__init__(weight, bias, always_active=always_active)
        self.kind, self.m = kind, m
        self.calls = 0

    def allowed(self, h: torch.Tensor) -> torch.Tensor:
        """(rows, N) bool: the columns this projection computes for each row."""
        n = self.n_vocab
        ids = torch.arange(n)
        if self.kind == "shared":
            mask = (ids >= n // 2).expand(h.shape[0], -1).clone()
        else:
            even = (ids % 2 == 0)[None, :]
            mask = torch.where(h[:, :1] > 0, even, ~even)
        mask[:, self.always_active] = True
        return mask

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        self.calls += 1
        full = torch.nn.functional.linear(h, self.weight, self.bias)  # (rows, N)
        if self.kind == "topm":
            top = torch.topk(full, self.m, dim=1).indices  # (rows, M)
            ids = torch.cat([top, self.always_active.expand(h.shape[0], -1)], dim=1)
            logits = full.gather(1, ids)
            dup = torch.zeros_like(ids, dtype=torch.bool)  # an always-active id may already be in the top-M
            dup[:, self.m :] = (ids[:, self.m :, None] == top[:, None, :]).any(-1)
            logits = logits.masked_fill(dup, -math.inf)
            rest = full.scatter(1, ids, -math.inf)
            return ProjectionOutput(logits, ids, self.n_vocab, log_inactive_mass=torch.logsumexp(rest, dim=1))
        mask = self.allowed(h)
        if self.kind == "shared":
            ids = mask[0].nonzero()[:, 0]  # (C,)
            return ProjectionOutput(full[:, ids], ids, self.n_vocab)
        gen = torch.Generator().manual_seed(self.calls)
        rows = [r.nonzero()[:, 0] for r in mask]
        rows = [r[torch.randperm(len(r), generator=gen)] for r in rows]  # column order != id order
        width = max(len(r) for r in rows)
        ids = torch.stack([torch.cat([r, r[:1].expand(width - len(r))]) for r in rows])  # (rows, C)
        logits = full.gather(1, ids)
        pad = torch.arange(width)[None, :] >= torch.tensor([len(r) for r in rows])[:, None]
        logits = logits.masked_fill(pad, -math.inf)  # padding repeats a valid id and carries -inf
        return ProjectionOutput(logits, ids, self.n_vocab)


class _MaskedDense(Projection):
    """The reference for ``_SubsetProjection``: dense logits with the disallowed columns at -inf."""

    def __init__(self, weight, bias, *, always_active=(), subset: _SubsetProjection):
        super().__init__(weight, bias, always_active=always_active)
        self.subset = subset

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        full = torch.nn.functional.linear(h, self.weight, self.bias)
        return ProjectionOutput(full.masked_fill(~self.subset.allowed(h), -math.inf), None, self.n_vocab)


@pytest.mark.parametrize("kind", ["shared", "per_row"])
def test_subset_ids_are_mapped_back(adapter, kind):
    w, b, always = adapter.output_weight, adapter.output_bias, adapter.always_active_ids()
    subset = _SubsetProjection(w, b, always_active=always, kind=kind)
    ref = _MaskedDense(w, b, always_active=always, subset=subset)
    for src, tgt in DIRECTIONS[:2]:
        batch = adapter.encode_texts(_sources(src), src)
        got = greedy_search(adapter, subset, batch, src, tgt, max_len=MAX_LEN)
        assert got == greedy_search(adapter, ref, batch, src, tgt, max_len=MAX_LEN)
        assert any(got)
        if kind == "shared":  # every emitted id is one the projection computed
            assert all(t >= adapter.n_vocab // 2 or t in always for s in got for t in s)
        for beam in (2, 4):
            settings = SearchSettings(beam=beam, max_len=MAX_LEN, early_stopping=False)
            got_beam = beam_search(adapter, subset, batch, src, tgt, settings)
            assert got_beam == beam_search(adapter, ref, batch, src, tgt, settings)


def test_topm_with_inactive_mass_reproduces_full_beam(adapter, full):
    """Per-row top-M ids + the exact inactive mass give full-softmax scores: beam output must not change."""
    topm = _SubsetProjection(
        adapter.output_weight, adapter.output_bias, always_active=adapter.always_active_ids(), kind="topm"
    )
    for src, tgt in DIRECTIONS:
        batch = adapter.encode_texts(_sources(src), src)
        for beam in (2, 4):  # M=8 >= 2*beam: every candidate the full search looks at is computed
            settings = SearchSettings(beam=beam, max_len=MAX_LEN, early_stopping=False)
            expect = beam_search(adapter, full, batch, src, tgt, settings)
            assert beam_search(adapter, topm, batch, src, tgt, settings) == expect


def test_consecutive_calls_with_different_candidate_sets(adapter):
    """The CTranslate2 use_vmap bug (DESIGN.md): a batch's candidate set must not leak into later ones."""
    w, b, always = adapter.output_weight, adapter.output_bias, adapter.always_active_ids()
    runs = [("shared", "en", "it"), ("per_row", "it", "fr"), ("shared", "de", "en"), ("per_row", "en", "it")]
    shared_proj = {
        kind: _SubsetProjection(w, b, always_active=always, kind=kind) for kind in ("shared", "per_row")
    }
    beam4 = SearchSettings(beam=4, max_len=MAX_LEN, early_stopping=False)
    searches = (lambda *a: greedy_search(*a, max_len=MAX_LEN), lambda *a: beam_search(*a, beam4))
    for search in searches:
        sequential = []
        for kind, src, tgt in runs:  # one projection object per kind, reused across batches
            batch = adapter.encode_texts(_sources(src), src)
            sequential.append(search(adapter, shared_proj[kind], batch, src, tgt))
        fresh = []
        for kind, src, tgt in runs:
            fresh_adapter = Seq2SeqAdapter(
                adapter.model, adapter.tokenizer, adapter.path, "cpu", adapter.dtype
            )
            proj = _SubsetProjection(w, b, always_active=always, kind=kind)
            batch = fresh_adapter.encode_texts(_sources(src), src)
            fresh.append(search(fresh_adapter, proj, batch, src, tgt))
        assert sequential == fresh
        assert sequential[0] != sequential[1]  # the runs really differ


DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"
DEMO_SOURCES = {
    "en": [
        "GNU C library: shared libraries",
        "transitional package",
        "command-line tool to convert images between many formats, with support for scripting",
        "documentation for the Python 3 standard library",
        "",
        "fast, lightweight web server",
    ],
    "it": [
        "libreria C GNU: librerie condivise",
        "pacchetto di transizione",
        "documentazione per la libreria standard di Python 3",
        "server web veloce e leggero",
    ],
}


@pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="models/demo is not built yet")
@pytest.mark.parametrize(("src", "tgt"), [("en", "it"), ("it", "en")])
def test_demo_model_greedy_equals_generate(src, tgt):
    demo = Seq2SeqAdapter.load(DEMO_MODEL)
    if src not in demo.languages or tgt not in demo.languages:
        pytest.skip(f"the demo model has no {src}-{tgt}")
    proj = create_projection("full", demo.output_weight, demo.output_bias)
    texts = [t for t in DEMO_SOURCES[src] if t]
    batch = demo.encode_texts(texts, src)
    ours = greedy_search(demo, proj, batch, src, tgt, max_len=48)
    assert ours == generate_ids(demo, batch, tgt, 48, num_beams=1)
    assert all(ours) and any(len(s) < 48 for s in ours)  # a trained model stops by itself


if __name__ == "__main__":  # used by the eos_model_dir fixture
    import sys

    torch.set_num_threads(1)
    build_eos_model(Path(sys.argv[1]), Path(sys.argv[2]))


@pytest.mark.parametrize("rule", [False, True, "never"])
def test_host_step_equals_the_tensor_step(rule):
    """On CPU the beam state steps in numpy, merges into its pool only at steps with an EOS candidate, and
    checks the stopping rule only once its pool took one (``pooled``): the same tokens, rows, pool and done
    sentences as the tensor step, which merges and checks every step (the fixed-shape path), step by step,
    up to the length limit."""
    from fastvocab.decoding.search import BeamState

    n, k, eos, steps = 3, 4, 2, 9
    gen = torch.Generator().manual_seed(7)
    states = [
        BeamState(n, k, steps + 1, 2, 1.0, rule, eos, torch.device("cpu"), host=host)
        for host in (True, False)
    ]
    pooled_at = None
    for step in range(steps + 1):
        n = states[0].n
        vals = torch.randn(n * k, 2 * k, generator=gen).sort(dim=1, descending=True).values - 2.0
        toks = torch.randint(3, 500, (n * k, 2 * k), generator=gen)
        if step in (3, 5, 6):  # EOS among some rows' best continuations, from the fourth step on
            toks[(step % n) * k, 0] = eos  # the best continuation of a sentence's best beam
            toks[(step + 1) % n * k + 1, 2] = eos  # and a third one of another sentence's second beam
        if step in (3, 4):  # every beam of sentence 0 ends: its pool fills, and it is done (then more EOS)
            toks[:k, :2] = eos
        final = step == steps
        outs = [s.advance(vals, toks, final=final) for s in states]
        host, tensor = states
        # At the length limit every candidate finishes: the live beams are placeholders at -1e9, whose order
        # among equal scores neither step promises, and are never fed.
        live = [] if final else ["run_scores", "run_seqs"]
        assert final or all(torch.equal(a, b) for a, b in zip(outs[0], outs[1], strict=True)), step
        for name in [*live, "fin_any", "done", "step"]:
            assert torch.equal(getattr(host, name), getattr(tensor, name)), (step, name)
        real = host.fin_any  # the pool's slots that hold a finished hypothesis (the others are placeholders)
        assert torch.equal(host.fin_scores[real], tensor.fin_scores[real]), step
        assert torch.equal(host.fin_seqs[real], tensor.fin_seqs[real]), step
        if host.pooled and pooled_at is None:
            pooled_at = step
        if step == 7:  # beam_search drops sentences: the host step goes on from the kept ones
            for s in states:
                s.keep(torch.tensor([2, 0]))
    assert pooled_at == 3 and bool(states[0].fin_any.any()) and bool(states[0].done.all())


@pytest.mark.parametrize("ids", ["full", "shared", "per_row"])
@pytest.mark.parametrize("mass", [False, True])
@pytest.mark.parametrize("log_probs", [False, True])
def test_search_scores_spent_in_place_equal_the_copies(ids, mass, log_probs):
    """A search that reads an output last gets the same scores, bit for bit, computed in the logits' own
    memory when they are the output's (``scratch``); otherwise the logits are left as they were."""
    gen = torch.Generator().manual_seed(0)
    rows, n_vocab = 5, 60
    c = n_vocab if ids == "full" else 24
    logits = torch.randn(rows, c, generator=gen) * 4
    col_ids = {
        "full": None,
        "shared": torch.randperm(n_vocab, generator=gen)[:c],
        "per_row": torch.stack([torch.randperm(n_vocab, generator=gen)[:c] for _ in range(rows)]),
    }[ids]
    left_out = torch.randn(rows, generator=gen) if mass else None
    banned = torch.arange(0, n_vocab, 3)

    def output(scratch: bool) -> ProjectionOutput:
        return ProjectionOutput(logits.clone(), col_ids, n_vocab, log_inactive_mass=left_out, scratch=scratch)

    want = output(False)
    kept = want.logits.clone()
    expected = want.search_scores(banned, log_probs=log_probs, spend=True)
    assert torch.equal(want.logits, kept)  # not scratch: never written
    assert torch.isinf(expected).sum() > 0 and torch.isfinite(expected).sum() > 0
    for spend in (True, False):
        out = output(True)
        got = out.search_scores(banned, log_probs=log_probs, spend=spend)
        assert torch.equal(got, expected), spend
        assert (got.data_ptr() == out.logits.data_ptr()) == spend
        if not spend:
            assert torch.equal(out.logits, logits)
    read = output(True)
    first = read.log_probs().clone()
    assert torch.equal(read.search_scores(banned, log_probs=log_probs, spend=True), expected)
    assert torch.equal(read.log_probs(), first)  # read before: the kept log-probs stay as they were


@pytest.mark.parametrize("beam", [1, 3])
def test_searches_leave_the_outputs_a_step_hook_sees(adapter, full, beam):
    """With a step hook the searches spend no output: what the hook kept reads as the projection gave it."""
    batch = adapter.encode_texts(_sources("en")[:4], "en")
    records: list[StepRecord] = []
    kept: list[torch.Tensor] = []

    def hook(record: StepRecord) -> None:
        records.append(record)
        kept.append(record.output.logits.clone())

    settings = SearchSettings(beam=beam, max_len=MAX_LEN, early_stopping=False)
    search = greedy_search if beam == 1 else beam_search
    if beam == 1:
        search(adapter, full, batch, "en", "it", max_len=MAX_LEN, step_hook=hook)
    else:
        search(adapter, full, batch, "en", "it", settings, step_hook=hook)
    assert records and all(r.output.scratch for r in records)
    for record, logits in zip(records, kept, strict=True):
        assert torch.equal(record.output.logits, logits)
