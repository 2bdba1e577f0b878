"""The static decoder-step engine (``fastvocab.decoding.static_decoder``, ``packed_encoder``): the same ``h``
as the Hugging Face decoder, the same search output as ``generate``, row selection, cache growth, refusals
and int8."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import decoder_steps, generate_ids, reference_logits, synthetic_sentences

from fastvocab.decoding import Seq2SeqAdapter, beam_search, greedy_search
from fastvocab.decoding.packed_encoder import PackedEncoder
from fastvocab.decoding.settings import SearchSettings
from fastvocab.decoding.static_decoder import StaticDecoder, StaticState
from fastvocab.kernels import create_projection
from fastvocab.kernels.rowwise import argmax_rows, argmin_rows, topk_rows
from tests.layers import assert_embedding_equals_the_tensor_one

DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"
DEMO_SOURCES = [
    "GNU C library: shared libraries",
    "transitional package",
    "command-line tool to convert images between many formats, with support for scripting",
    "documentation for the Python 3 standard library",
    "fast, lightweight web server",
    "Python bindings for the library",
]


@pytest.fixture(scope="module")
def static(tiny_model_dir) -> Seq2SeqAdapter:
    adapter = Seq2SeqAdapter.load(tiny_model_dir, cache_len=4)  # small: the capacity must grow in the tests
    assert adapter.engine == "static"
    return adapter


@pytest.fixture(scope="module")
def hf(static) -> Seq2SeqAdapter:
    adapter = Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, engine="hf")
    assert adapter.engine == "hf"
    return adapter


@pytest.fixture(scope="module")
def demo() -> Seq2SeqAdapter:
    if not (DEMO_MODEL / "config.json").exists():
        pytest.skip("models/demo is not built yet")
    return Seq2SeqAdapter.load(DEMO_MODEL)


def test_step_h_equals_the_hf_decoder(static, hf):
    """Padded sources, a pad token among the targets (position padding_idx) and more steps than cache_len."""
    batch = static.encode_texts(synthetic_sentences("en", 6, seed=3), "en")
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 2  # padding in play
    gen = torch.Generator().manual_seed(0)
    prefix = torch.tensor(static.start_tokens("it")).expand(6, -1)
    body = torch.randint(4, static.n_vocab, (6, 9), generator=gen)
    body[1, 3] = body[4, 0] = static.pad_id  # HF gives a pad token the zero position row
    tokens = torch.cat([prefix, body], dim=1)  # (rows, 11) > cache_len=4: the cache doubles twice
    ours, ref = decoder_steps(static, batch, tokens), decoder_steps(hf, batch, tokens)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # the fixed-shape step (what a CUDA graph captures), pad positions included
    torch.testing.assert_close(decoder_steps(static, batch, tokens, fixed=True), ours, rtol=1e-5, atol=1e-5)
    # and the model's own forward pass, on rows without a pad token (a full forward pass numbers positions by
    # a cumulative sum that skips pads; the cached step, like generate, counts them): h W^T are its logits
    logits = ours @ static.output_weight.T
    rows = [0, 2, 3, 5]
    ref_logits = reference_logits(static, batch, tokens)[rows]
    torch.testing.assert_close(logits[rows], ref_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lengths", ["spread", "equal", "groups"])
def test_packed_encoder_equals_the_hf_encoder(static, lengths):
    """The padding-free encoder (M2M100: pad-aware positions), with padding and without any, a source longer
    than the position table (both extend it), and lengths spread enough to make several length groups, in
    no order."""
    assert isinstance(static._encoder, PackedEncoder)
    gen = torch.Generator().manual_seed(11)
    n_pos = static.config.max_position_embeddings
    sizes = {"spread": [3, 9, 1, 6, n_pos + 5], "equal": [7, 7, 7], "groups": [7, 50, 2, 34, 20, 33, 12]}[
        lengths
    ]
    seqs = [[*torch.randint(4, static.n_vocab, (n,), generator=gen).tolist(), static.eos_id] for n in sizes]
    batch = static.pad(seqs)
    mask = batch["attention_mask"].bool()
    ours = static.encode(batch).hidden
    with torch.inference_mode():
        ref = static.model.get_encoder()(**batch).last_hidden_state
    torch.testing.assert_close(ours[mask], ref[mask], rtol=1e-5, atol=1e-5)
    assert not ours[~mask].any()


def test_length_groups_cover_every_token_once_in_groups_of_like_length():
    """One long sentence among short ones gets a grid of its own; every real token has one place, in its
    sentence's order; sentences of at most SHORT_GROUP_TOKENS stay together however their lengths spread."""
    from fastvocab.decoding.packed_encoder import SHORT_GROUP_TOKENS, length_groups

    lengths = [12, 90, 3, 40, 30, 29, 60]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    groups = length_groups(mask)
    sizes = [g.key_mask.shape[-1] for g in groups]
    assert sizes == [90, 60, 40, 12]  # 90 alone; 60 alone (40 < 0.7 x 60); 40, 30, 29; 12 and 3 (<= 32)
    assert sizes[-1] <= SHORT_GROUP_TOKENS
    tokens = torch.cat([g.tokens for g in groups])
    assert sorted(tokens.tolist()) == list(range(sum(lengths)))
    for g in groups:
        s = g.key_mask.shape[-1]
        rows = g.key_mask[:, 0, 0, :].sum(1).tolist()
        assert sum(rows) == g.where.numel() == g.tokens.numel()
        assert bool(g.key_mask.reshape(-1)[g.where].all())  # each token lands on a real position
        assert int(g.where.max()) < len(rows) * s
    # a batch that never splits keeps its own grid: no copies by token
    (one,) = length_groups(mask[[0, 2]])
    assert one.tokens is None and one.key_mask.shape[-1] == max(lengths)


@pytest.mark.parametrize("n", [7, 2000, 32108])
@pytest.mark.parametrize("rows", [1, 4, 33])
@pytest.mark.parametrize("case", ["random", "ties", "max in the tail", "all -inf", "nan", "two nan"])
def test_argmax_rows_equals_argmax(n, rows, case):
    """The searches' argmax (numpy's on CPU): the same (first) index as torch.argmax, ties and NaN
    included; its argmin counterpart (the nearest centroid) the same as torch.argmin; a strided view too."""
    gen = torch.Generator().manual_seed(n + rows)
    x = torch.randn(rows, n, generator=gen)
    if case == "ties":
        x = torch.randint(0, 3, (rows, n), generator=gen).float()  # every row has many tied maxima
    elif case == "max in the tail":
        x[:, -3:] = 50.0
    elif case == "all -inf":
        x[:] = -torch.inf
    elif case == "nan":
        x[0, min(11, n - 1)] = torch.nan
    elif case == "two nan":
        x[-1, [n - 1, n // 2]] = torch.nan
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1, keepdim=True))
    assert torch.equal(argmin_rows(x), x.argmin(dim=-1))
    assert torch.equal(argmax_rows(x.double()[:, ::2]), x.double()[:, ::2].argmax(dim=-1, keepdim=True))


@pytest.mark.parametrize("n", [8192, 8200, 32108])
@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("case", ["random", "best in the tail", "best in one block", "-inf", "nan"])
@pytest.mark.parametrize("k", [2, 8])
def test_topk_rows_equals_topk(n, rows, case, k):
    """Beam search's blocked top-k: torch.topk's values and (without ties) its columns."""
    gen = torch.Generator().manual_seed(n + rows + k)
    x = torch.randn(rows, n, generator=gen)
    if case == "best in the tail":
        x[:, -3:] = 50.0 + torch.arange(3.0)
    elif case == "best in one block":  # all k winners share one block: the other blocks hold none of them
        x[:, 300 : 300 + k] = 40.0 + torch.arange(float(k))
    elif case == "-inf":  # suppressed columns, as the search's banned ids are
        x[:, ::2] = -torch.inf
    elif case == "nan":
        x[0, 11] = torch.nan
    values, cols = topk_rows(x, k)
    want_values, want_cols = torch.topk(x, k, dim=-1)
    torch.testing.assert_close(values, want_values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(cols, want_cols)


def test_reorder_with_and_without_groups(static, hf):
    batch = static.encode_texts(synthetic_sentences("de", 3, seed=4), "de")
    prefix = static.start_tokens("fr")
    k = 2
    results = []
    for adapter, group in ((static, k), (static, None), (hf, k)):
        state = adapter.encode(batch)
        for t in prefix:
            _, state = adapter.decoder_step(torch.full((3,), t), state)
        state = adapter.reorder(state, torch.arange(3).repeat_interleave(k), group=group)  # beam expansion
        _, state = adapter.decoder_step(torch.tensor([5, 6, 7, 8, 9, 10]), state)
        # beams swapped within sentences 0 and 2, sentence 1 dropped
        state = adapter.reorder(state, torch.tensor([1, 0, 4, 4]), group=group)
        if adapter is static and group is not None:
            assert state.cache.group == k and state.cache.cross_kv.shape[2] == 2  # K/V per sentence
        h, _ = adapter.decoder_step(torch.tensor([11, 12, 13, 14]), state)
        results.append(h)
    torch.testing.assert_close(results[0], results[2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1], results[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("src", "tgt"), [("en", "it"), ("fr", "de")])
def test_tiny_greedy_and_beam_equal_generate(static, src, tgt):
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = static.encode_texts(synthetic_sentences(src, 7, seed=6), src)
    assert greedy_search(static, full, batch, src, tgt, max_len=10) == generate_ids(static, batch, tgt, 10)
    for beam in (2, 4):
        settings = SearchSettings(beam=beam, max_len=10, early_stopping=False)
        ours = beam_search(static, full, batch, src, tgt, settings)
        assert ours == generate_ids(static, batch, tgt, 10, num_beams=beam, early_stopping=False)


@pytest.mark.parametrize(("src", "tgt"), [("en", "it"), ("en", "de")])
def test_demo_greedy_and_beam_equal_generate(demo, src, tgt):
    full = create_projection("full", demo.output_weight, demo.output_bias)
    batch = demo.encode_texts(DEMO_SOURCES, src)
    greedy = greedy_search(demo, full, batch, src, tgt, max_len=48)
    assert greedy == generate_ids(demo, batch, tgt, 48, num_beams=1)
    assert any(len(s) < 48 for s in greedy)  # sentences end by themselves: finished rows leave the batch
    settings = SearchSettings(beam=4, max_len=48, early_stopping=False)
    ours = beam_search(demo, full, batch, src, tgt, settings)
    assert ours == generate_ids(demo, batch, tgt, 48, num_beams=4, early_stopping=False)


@pytest.mark.parametrize("every", [3, 5])
def test_accelerator_sync_schedule_does_not_change_outputs(demo, switch, every):
    """Reading the stop decision back every few steps (an accelerator's schedule, run here on CPU): rows and
    sentences that finish in between stay in the batch, frozen, and the outputs stay generate's."""
    full = create_projection("full", demo.output_weight, demo.output_bias)
    src, tgt = "en", "it"
    batch = demo.encode_texts(DEMO_SOURCES, src)
    switch(CPU_SYNC_EVERY=every)
    assert greedy_search(demo, full, batch, src, tgt, max_len=48) == generate_ids(
        demo, batch, tgt, 48, num_beams=1
    )
    for beam, rule in ((4, False), (3, True)):
        settings = SearchSettings(beam=beam, max_len=48, early_stopping=rule)
        ours = beam_search(demo, full, batch, src, tgt, settings)
        assert ours == generate_ids(demo, batch, tgt, 48, num_beams=beam, early_stopping=rule)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_greedy_compaction_schedule_does_not_change_outputs(demo, switch, fraction):
    full = create_projection("full", demo.output_weight, demo.output_bias)
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    expect = greedy_search(demo, full, batch, "en", "it", max_len=48)
    switch(COMPACT_FRACTION=fraction)
    assert greedy_search(demo, full, batch, "en", "it", max_len=48) == expect


def test_engine_choice_and_refusals(static, tmp_path):
    with pytest.raises(ValueError, match="engine must be one of"):
        Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, engine="fast")
    with pytest.raises(ValueError, match="cache_len must be >= 1"):
        Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, cache_len=0)


def test_unsupported_family_is_refused_by_static():
    """Marian and MBart run on the static engine (tests/test_engine_families.py); BART does not."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=50,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
    )
    model = BartForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match=r"'bart' models use engine='hf'"):
        StaticDecoder(model)


def test_cache_that_does_not_fit_names_the_sizes(static):
    engine = static._static
    enc = static.encode(static.encode_texts(["il pacchetto"], "it"))
    what = r"self-attention cache \(2, 2, 1, 2, \d+, 16\) = .* MiB.*--max-len"
    with pytest.raises(MemoryError, match=what):
        engine.start(enc.hidden, enc.mask, capacity=2**44)


def test_state_reports_its_size(static):
    enc = static.encode(static.encode_texts(["il pacchetto per rete"], "it"))
    state = static._static.start(enc.hidden, enc.mask, capacity=8)
    assert isinstance(state, StaticState) and state.rows == 1 and state.capacity == 8
    s = enc.hidden.shape[1]
    assert state.cache_bytes() == 4 * (2 * 2 * 32 * 8 + 2 * 2 * 32 * s + s)


def test_int8_decoder_stays_close_and_runs_the_search(demo):
    q = Seq2SeqAdapter.load(DEMO_MODEL)
    q.quantize_int8()
    assert q.quantized and q.engine == "static"
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    tokens = torch.tensor([*demo.start_tokens("it"), 100, 200, 300]).expand(len(DEMO_SOURCES), -1)
    h32, h8 = decoder_steps(demo, batch, tokens), decoder_steps(q, batch, tokens)
    # int8 weights: close, not equal (relative error of the final states a few percent)
    rel = (h8 - h32).norm() / h32.norm()
    assert 0 < float(rel) < 0.1
    full = create_projection("full", demo.output_weight, demo.output_bias)
    proj8 = create_projection("full", demo.output_weight, demo.output_bias, int8=True)
    assert proj8.options() == {"dtype": "int8"} and "dtype:int8" in proj8.signature()
    logits32 = full(h32[:, -1]).logits
    logits8 = proj8(h32[:, -1]).logits
    assert float((logits8 - logits32).abs().max()) < 0.05 * float(logits32.abs().max())
    out = greedy_search(q, proj8, batch, "en", "it", max_len=48)
    assert len(out) == len(DEMO_SOURCES) and all(out)


def test_translate_cli_threads_and_int8(demo, tmp_path, capsys):
    """``fastvocab translate --threads N --dtype int8``: runs, sets the threads, refuses int8 off CPU."""
    from fastvocab.pipeline.cli import main

    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("\n".join(DEMO_SOURCES[:3]) + "\n", encoding="utf-8")
    base = ["translate", "--model", str(DEMO_MODEL), "--src-lang", "en", "--tgt-lang", "it", "-i", str(inp)]
    before = torch.get_num_threads()
    try:
        assert main([*base, "-o", str(out), "--threads", "1", "--dtype", "int8", "--no-progress"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and all(lines)
    assert main([*base, "-o", str(out), "--dtype", "int8", "--device", "cuda"]) != 0
    assert "--dtype int8 runs on CPU only" in capsys.readouterr().err
    assert main([*base, "-o", str(out), "--threads", "0"]) != 0
    assert "--threads must be >= 1" in capsys.readouterr().err


def test_search_sizes_the_cache_once(static, monkeypatch):
    """The search tells the engine prefix + max_len - 1 positions: the cache never has to grow."""

    def no_growth(self, state):
        raise AssertionError("the cache grew during a search")

    monkeypatch.setattr(StaticDecoder, "_grow", no_growth)
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = static.encode_texts(synthetic_sentences("en", 3, seed=8), "en")
    assert static._static.capacity == 4  # cache_len=4 < the 11 positions below
    assert len(greedy_search(static, full, batch, "en", "it", max_len=10)) == 3
    settings = SearchSettings(beam=2, max_len=10, early_stopping=False)
    assert len(beam_search(static, full, batch, "en", "it", settings)) == 3


# ------------------------------------------------------------------------ the captured stepper (CUDA graphs)


def captured(adapter, capture: bool = False):
    """The fixed-shape stepper a CUDA graph captures; run eagerly here."""
    from fastvocab.decoding.steppers import CapturedStepper

    return CapturedStepper(adapter, capture=capture)


@pytest.mark.parametrize("max_len", [48, 5])
def test_graphed_greedy_equals_greedy(demo, switch, max_len):
    """The step a CUDA graph captures (run eagerly here, with the accelerator's sync schedule). At the short
    limit only the sources whose translation runs past it are decoded, so every row stops at the limit."""
    full = create_projection("full", demo.output_weight, demo.output_bias)
    sources = DEMO_SOURCES
    if max_len < 48:
        whole = greedy_search(demo, full, demo.encode_texts(sources, "en"), "en", "it", max_len=48)
        sources = [src for src, ids in zip(sources, whole, strict=True) if len(ids) > max_len]
        assert len(sources) >= 2
    batch = demo.encode_texts(sources, "en")
    want = greedy_search(demo, full, batch, "en", "it", max_len=max_len)
    assert want == generate_ids(demo, batch, "it", max_len, num_beams=1)
    lengths = {len(s) for s in want}
    assert len(lengths) > 1 if max_len == 48 else lengths == {max_len}  # rows end apart / at the limit
    switch(CPU_SYNC_EVERY=3)
    got = greedy_search(demo, full, batch, "en", "it", max_len=max_len, stepper=captured(demo))
    assert got == want


def map_from_decoding(demo, full, beam: int, max_len: int):
    """A cluster map (24 clusters, the members' top-8 tokens) over the states of a full-softmax decode of
    DEMO_SOURCES (greedy for ``beam`` 1), as the pipeline builds its maps."""
    from tests.layers import map_from_states

    records = []
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    if beam == 1:
        greedy_search(demo, full, batch, "en", "it", max_len=max_len, step_hook=records.append)
    else:
        settings = SearchSettings(beam=beam, max_len=max_len, early_stopping=False)
        beam_search(demo, full, batch, "en", "it", settings, step_hook=records.append)
    h = torch.cat([r.hidden for r in records]).numpy()  # (states, d)
    top = torch.cat([r.output.logits.topk(8, dim=1).indices for r in records]).numpy()  # (states, 8)
    return map_from_states(h, top, 24, demo.n_vocab, full.fingerprint)


def test_graphed_greedy_static_union_equals_union_mode(demo):
    """A static-capacity union in the graphed step gives the eager union mode's outputs (a map built from
    the model's own greedy states and their top-8 tokens, as the pipeline's maps are)."""
    from fastvocab.kernels.clustered_static import StaticUnion

    full = create_projection("full", demo.output_weight, demo.output_bias)
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    cmap = map_from_decoding(demo, full, beam=1, max_len=48)
    union = create_projection(
        "clustered", demo.output_weight, demo.output_bias, cluster_map=cmap, selection="union",
        always_active=demo.always_active_ids(),
    )  # fmt: skip
    want = greedy_search(demo, union, batch, "en", "it", max_len=48)
    su = StaticUnion(union, rows=batch["input_ids"].shape[0])
    assert su.capacity < demo.n_vocab  # the graphed step computes a subset, not every column
    assert greedy_search(demo, su, batch, "en", "it", max_len=48, stepper=captured(demo)) == want
    # union-mode clustered itself: its capturable step is such a union (Projection.capturable)
    assert greedy_search(demo, union, batch, "en", "it", max_len=48, stepper=captured(demo)) == want
    # a capacity the unions outgrow: flagged on the device, the batch redone eagerly with full logits there
    small = StaticUnion(union, capacity=8, grow=False)
    got = greedy_search(demo, small, batch, "en", "it", max_len=48, stepper=captured(demo))
    assert small.fallbacks > 0
    eager = StaticUnion(union, capacity=8, grow=False)
    assert got == greedy_search(demo, eager.project, batch, "en", "it", max_len=48)


def test_graphed_greedy_refuses_what_it_cannot_capture(demo, static):
    batch = demo.encode_texts(DEMO_SOURCES[:2], "en")
    lsh = object()
    with pytest.raises(ValueError, match="no capturable output"):
        greedy_search(demo, lsh, batch, "en", "it", max_len=4, stepper=captured(demo))
    full = create_projection("full", demo.output_weight, demo.output_bias)
    with pytest.raises(ValueError, match="needs the eager stepper"):  # a hook reads rows every step
        greedy_search(demo, full, batch, "en", "it", max_len=4, step_hook=print, stepper=captured(demo))
    hf = Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, engine="hf")
    full = create_projection("full", hf.output_weight, hf.output_bias)
    with pytest.raises(ValueError, match="needs the static engine"):
        greedy_search(hf, full, hf.encode_texts(["a b"], "en"), "en", "it", max_len=4, stepper=captured(hf))


def test_graphed_step_dispatches_no_host_read(demo, monkeypatch):
    """What a CUDA graph captures must not read a value back to the host (capture would fail on the GPU):
    checked here on CPU at the dispatcher, on the greedy search's whole captured step (token choice and
    fixed-shape decoder step) for both capturable projections, recorded where the graph would be captured."""
    from fastvocab.decoding import steppers
    from fastvocab.kernels.clustered_static import StaticUnion
    from tests.layers import map_from_sets
    from tests.test_clustered_static import SYNC_OPS, RecordOps

    full = create_projection("full", demo.output_weight, demo.output_bias)
    rng = torch.Generator().manual_seed(0)
    cent = torch.randn(4, demo.output_weight.shape[1], generator=rng)
    sets = [torch.randint(0, demo.n_vocab, (30,), generator=rng).tolist() for _ in range(4)]
    union = create_projection(
        "clustered", demo.output_weight, demo.output_bias,
        cluster_map=map_from_sets(cent.numpy(), sets, demo.n_vocab, full.fingerprint),
    )  # fmt: skip
    recorded = []

    def recording_capture(fn, warmups=1):
        with RecordOps() as rec:
            fn()
        recorded.append(rec.names)
        return fn

    monkeypatch.setattr(steppers, "capture_graph", recording_capture)
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    for proj in (full, StaticUnion(union, rows=len(DEMO_SOURCES))):
        greedy_search(demo, proj, batch, "en", "it", max_len=6, stepper=captured(demo, capture=True))
    assert len(recorded) == 2
    for names in recorded:
        assert {"index_copy_", "softmax", "_softmax"} & set(names), names  # it saw the step
        assert {"argmax"} & set(names), names  # ... and the choice
        assert not set(names) & set(SYNC_OPS), set(names) & set(SYNC_OPS)


@pytest.mark.parametrize(
    ("max_len", "rule"), [(48, False), (48, True), (48, "never"), (5, False), (1, False)]
)
def test_graphed_beam_equals_beam(demo, switch, max_len, rule):
    """The beam step two CUDA graphs capture (run eagerly here, with the accelerator's sync schedule)."""
    full = create_projection("full", demo.output_weight, demo.output_bias)
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    settings = SearchSettings(beam=3, max_len=max_len, length_penalty=1.3, early_stopping=rule)
    want = beam_search(demo, full, batch, "en", "it", settings)
    if max_len == 48:
        assert len({len(s) for s in want}) > 1  # sentences end at different steps
    switch(CPU_SYNC_EVERY=3)
    assert beam_search(demo, full, batch, "en", "it", settings, stepper=captured(demo)) == want


@pytest.mark.parametrize("mass", ["none", "normaliser"])
def test_graphed_beam_static_union_equals_union_mode(demo, switch, mass):
    """A static-capacity union in the graphed beam step gives union mode's outputs, with the projection's
    inactive-mass estimate too (beam search's default). Union mode's columns are the batch's union, so done
    sentences must stay in the eager batch too (no host read before the end)."""
    from fastvocab.kernels.clustered_static import StaticUnion

    full = create_projection("full", demo.output_weight, demo.output_bias)
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    cmap = map_from_decoding(demo, full, beam=2, max_len=40)
    union = create_projection(
        "clustered", demo.output_weight, demo.output_bias, cluster_map=cmap, selection="union",
        always_active=demo.always_active_ids(), inactive_mass=mass,
    )  # fmt: skip
    switch(CPU_SYNC_EVERY=1000)
    settings = SearchSettings(beam=2, max_len=40, early_stopping=False)
    want = beam_search(demo, union, batch, "en", "it", settings)
    su = StaticUnion(union, rows=2 * batch["input_ids"].shape[0])
    assert su.capacity < demo.n_vocab
    assert beam_search(demo, su, batch, "en", "it", settings, stepper=captured(demo)) == want
    # a capacity the unions outgrow: flagged on the device, the batch redone eagerly with full logits there
    small = StaticUnion(union, capacity=8, grow=False)
    got = beam_search(demo, small, batch, "en", "it", settings, stepper=captured(demo))
    assert small.fallbacks > 0
    eager = StaticUnion(union, capacity=8, grow=False)
    assert got == beam_search(demo, eager.project, batch, "en", "it", settings)


def test_graphed_beam_refuses_what_it_cannot_capture(demo, static):
    batch = demo.encode_texts(DEMO_SOURCES[:2], "en")
    with pytest.raises(ValueError, match="no capturable output"):
        settings = SearchSettings(beam=4, max_len=4, early_stopping=False)
        beam_search(demo, object(), batch, "en", "it", settings, stepper=captured(demo))
    hf = Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, engine="hf")
    full = create_projection("full", hf.output_weight, hf.output_bias)
    with pytest.raises(ValueError, match="needs the static engine"):
        settings = SearchSettings(beam=4, max_len=4, early_stopping=False)
        beam_search(hf, full, hf.encode_texts(["a b"], "en"), "en", "it", settings, stepper=captured(hf))


def test_graphed_beam_step_dispatches_no_host_read(demo):
    """The beam step's choice (scores, candidates, finished pool, stopping rule, rows to continue) reads
    nothing back to the host, checked at the dispatcher on CPU as for the greedy step; its per-row top-k is
    torch.topk, as on an accelerator (the CPU's blocked top-k reads a NaN check)."""
    from fastvocab.decoding.search import BeamState, row_candidates
    from fastvocab.kernels.clustered_static import StaticUnion
    from tests.layers import random_map
    from tests.test_clustered_static import SYNC_OPS, RecordOps

    full = create_projection("full", demo.output_weight, demo.output_bias)
    union = create_projection(
        "clustered", demo.output_weight, demo.output_bias, selection="union",
        cluster_map=random_map(demo.output_weight, demo.output_bias, size=40),
    )  # fmt: skip
    n, k = 3, 2
    h = torch.randn(n * k, demo.output_weight.shape[1])
    banned = torch.tensor([demo.pad_id])
    for proj in (full, StaticUnion(union, rows=n * k)):
        output = proj.capturable(n * k)
        for rule in (False, True, "never"):
            beams = BeamState(n, k, 6, 2, 1.2, rule, demo.eos_id, torch.device("cpu"))
            with RecordOps() as rec:
                cands = row_candidates(output(h), banned, k, topk=lambda x, kk: torch.topk(x, kk, dim=-1))
                tokens, rows = beams.advance(*cands)
            assert {"topk", "log_softmax", "_log_softmax"} & set(rec.names), rec.names  # it saw the step
            assert not set(rec.names) & set(SYNC_OPS), (rule, set(rec.names) & set(SYNC_OPS))
            assert tokens.shape == rows.shape == (n, k) and int(beams.step) == 1


def test_graphed_searches_undo_their_capture_warm_ups(demo, monkeypatch, switch):
    """With capture on, a graph's warm-up runs real steps that the searches must undo: here a stand-in
    capture runs the warm-up and then replays the step eagerly, so what the warm-up changed shows."""
    from fastvocab.decoding import steppers

    calls = []

    def fake_capture(fn, warmups=1):
        for _ in range(warmups):
            fn()
        calls.append(fn)
        return fn

    monkeypatch.setattr(steppers, "capture_graph", fake_capture)
    switch(CPU_SYNC_EVERY=3)
    full = create_projection("full", demo.output_weight, demo.output_bias)
    batch = demo.encode_texts(DEMO_SOURCES, "en")
    greedy = greedy_search(demo, full, batch, "en", "it", max_len=30, stepper=captured(demo, capture=True))
    assert len(calls) == 1 and greedy == greedy_search(demo, full, batch, "en", "it", max_len=30)
    settings = SearchSettings(beam=3, max_len=30, early_stopping=False)
    beams = beam_search(demo, full, batch, "en", "it", settings, stepper=captured(demo, capture=True))
    assert len(calls) == 3 and beams == beam_search(demo, full, batch, "en", "it", settings)


@pytest.mark.parametrize("beam", [1, 2])
def test_translate_with_graphs_equals_the_eager_search(demo, switch, beam):
    """``translate(graphs="on")`` (the captured stepper; on CPU its steps run eagerly) gives the eager
    search's lines: the full projection as it is, union-mode clustered (with beam search's default
    inactive-mass estimate) as a static-capacity union. A union is the batch's, and the graphed searches
    keep finished rows in it, so the eager side keeps them too (no host read before the end)."""
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import translate

    full = make_projection(demo, "full")
    cmap = map_from_decoding(demo, full, beam=2, max_len=40)
    union = make_projection(
        demo, "clustered", cluster_map=cmap, **clustered_options("union", "auto", False, beam)
    )
    switch(CPU_SYNC_EVERY=1000)
    settings, kw = SearchSettings(beam=beam, batch_size=3, max_len=40), dict(progress=False, workers=1)
    on = replace(settings, graphs="on")
    for proj in (full, union):
        want = translate(demo, proj, DEMO_SOURCES, "en", "it", settings, **kw)
        assert any(want.hypotheses)
        assert translate(demo, proj, DEMO_SOURCES, "en", "it", on, **kw).hypotheses == want.hypotheses
    per_row = make_projection(demo, "clustered", cluster_map=cmap, selection="per-row")
    with pytest.raises(ValueError, match="no capturable output"):
        translate(demo, per_row, DEMO_SOURCES[:2], "en", "it", on, **kw)


def test_graphs_auto_captures_on_cuda_only_where_the_step_can_be_captured(demo, static, hf):
    """``auto``: eager on CPU; on CUDA (the device stood in for: only the choice is under test) the captured
    stepper for the static engine with a full or union-mode projection, eager for the HF engine, per-row
    selection and int8 clustered (which a static union cannot hold); ``on``/``off`` as they say."""
    from types import SimpleNamespace

    from fastvocab.decoding.steppers import use_graphs
    from fastvocab.tasks.projections import make_projection

    full = make_projection(demo, "full")
    cmap = map_from_decoding(demo, full, beam=1, max_len=20)
    union = make_projection(demo, "clustered", cluster_map=cmap)
    per_row = make_projection(demo, "clustered", cluster_map=cmap, selection="per-row")
    union_int8 = make_projection(demo, "clustered", cluster_map=cmap, int8=True)

    def on_cuda(adapter):
        return SimpleNamespace(device=torch.device("cuda"), static_decoder=adapter.static_decoder)

    assert not use_graphs("auto", demo, full)  # CPU
    assert use_graphs("auto", on_cuda(demo), full)
    assert use_graphs("auto", on_cuda(demo), union)
    assert not use_graphs("auto", on_cuda(demo), per_row)
    assert not use_graphs("auto", on_cuda(demo), union_int8)
    assert not use_graphs("auto", on_cuda(hf), make_projection(hf, "full"))
    assert use_graphs("on", demo, per_row) and not use_graphs("off", on_cuda(demo), full)
    with pytest.raises(ValueError, match="graphs must be one of"):
        use_graphs("always", demo, full)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_translate_with_graphs_in_half_precision(demo, switch, dtype):
    """The GPU decodes in float16: the comparison above in float16 and bfloat16 on CPU (the engine's, the
    fixed-shape step's and the static union's half-precision paths), with the map built from the float32
    load, as the pipeline builds maps (so the half-precision adapter must carry the float32 fingerprint)."""
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import translate

    cmap = map_from_decoding(demo, make_projection(demo, "full"), beam=2, max_len=40)
    half = Seq2SeqAdapter.load(DEMO_MODEL, dtype=dtype)
    assert half.engine == "static" and half.fingerprint == demo.fingerprint
    switch(CPU_SYNC_EVERY=1000)
    for beam in (1, 2):
        opts = clustered_options("union", "auto", False, beam)
        settings, kw = SearchSettings(beam=beam, batch_size=3, max_len=40), dict(progress=False, workers=1)
        for proj in (
            make_projection(half, "full"),
            make_projection(half, "clustered", cluster_map=cmap, **opts),
        ):
            want = translate(half, proj, DEMO_SOURCES, "en", "it", settings, **kw)
            assert any(want.hypotheses)
            got = translate(half, proj, DEMO_SOURCES, "en", "it", replace(settings, graphs="on"), **kw)
            assert got.hypotheses == want.hypotheses


def test_embedding_on_the_host_equals_the_tensor_one(static):
    """M2M100's step input in numpy on CPU (a pad token keeps the pad position): the tensor code's rows."""
    assert_embedding_equals_the_tensor_one(static._static)


def test_a_step_outside_a_search_runs_in_inference_mode(static):
    """A decoder step called on its own enters inference mode (the searches' own steps are already in it,
    where it is not entered again): no autograd record of its tensors either way."""
    batch = static.encode_texts(["a b c"], "en")
    state = static.encode(batch)
    assert not torch.is_inference_mode_enabled()
    h, _ = static.decoder_step(torch.tensor([static.decoder_start_id]), state)
    assert h.is_inference() and not h.requires_grad
    with torch.inference_mode():
        h2, _ = static.decoder_step(torch.tensor([static.decoder_start_id]), static.encode(batch))
    assert torch.equal(h, h2)
