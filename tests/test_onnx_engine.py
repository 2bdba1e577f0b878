"""``engine="onnx"`` (``fastvocab.decoding.onnx_step``, ``onnx_encoder``): the static engine's encoder
states, ``h`` and search outputs, its row selection, the exports cached on disk and reused, int8."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import decoder_steps, synthetic_sentences

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from fastvocab import switches
from fastvocab.decoding import Seq2SeqAdapter, beam_search, greedy_search
from fastvocab.decoding.onnx_encoder import OnnxEncoder
from fastvocab.decoding.onnx_step import OnnxDecoder
from fastvocab.decoding.settings import ENGINES, SearchSettings
from fastvocab.kernels import create_projection
from fastvocab.tasks.decode_pool import DecodePool

DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"
DEMO_MAPS = Path(__file__).resolve().parent.parent / "models" / "demo-maps"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine-cache")


@pytest.fixture(scope="module")
def static(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir, cache_len=4)


@pytest.fixture(scope="module")
def onnx(tiny_model_dir, cache_dir) -> Seq2SeqAdapter:
    with switches.override(CACHE_DIR=cache_dir):
        adapter = Seq2SeqAdapter.load(tiny_model_dir, cache_len=4, engine="onnx")
    assert adapter.engine == "onnx" and isinstance(adapter.static_decoder, OnnxDecoder)
    return adapter


def test_step_h_equals_the_static_engine(static, onnx):
    """Padded sources, a pad token among the targets and more steps than cache_len (the cache grows)."""
    batch = static.encode_texts(synthetic_sentences("en", 6, seed=3), "en")
    prefix = torch.tensor(static.start_tokens("it")).expand(6, -1)
    body = torch.randint(4, static.n_vocab, (6, 9), generator=torch.Generator().manual_seed(0))
    body[1, 3] = body[4, 0] = static.pad_id
    tokens = torch.cat([prefix, body], dim=1)
    torch.testing.assert_close(decoder_steps(onnx, batch, tokens), decoder_steps(static, batch, tokens))


def test_encoder_states_equal_the_packed_encoder(static, onnx):
    """One sentence, and sentences of several lengths (padding, and more than one of the packed encoder's
    length groups): the same states, zero at padding."""
    from fastvocab.decoding.packed_encoder import length_groups

    assert isinstance(onnx._encoder, OnnxEncoder)
    long = " ".join(synthetic_sentences("en", 6, seed=7))
    for texts in (synthetic_sentences("en", 1, seed=5), [long, *synthetic_sentences("en", 5, seed=5)]):
        batch = static.encode_texts(texts, "en")
        assert len(texts) == 1 or len(length_groups(batch["attention_mask"])) > 1
        ours, ref = onnx.encode(batch).hidden, static.encode(batch).hidden
        assert ours.shape == ref.shape and ref.abs().sum() > 0
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_reorder_with_and_without_groups(static, onnx):
    batch = static.encode_texts(synthetic_sentences("de", 3, seed=4), "de")
    k, results = 2, []
    for adapter, group in ((static, k), (onnx, k), (onnx, None)):
        state = adapter.encode(batch)
        for t in adapter.start_tokens("fr"):
            _, state = adapter.decoder_step(torch.full((3,), t), state)
        state = adapter.reorder(state, torch.arange(3).repeat_interleave(k), group=group)
        _, state = adapter.decoder_step(torch.tensor([5, 6, 7, 8, 9, 10]), state)
        state = adapter.reorder(state, torch.tensor([1, 0, 4, 4]), group=group)  # sentence 1 dropped
        h, _ = adapter.decoder_step(torch.tensor([11, 12, 13, 14]), state)
        results.append(h)
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[2], results[0], rtol=1e-5, atol=1e-5)


def test_beam_reorders_follow_rows_in_place(static, onnx):
    """A beam step's reorder leaves each row's cache where it was and copies only a parent's extra
    children's past: swaps, a parent with three children, the cache growing past cache_len, then a sentence
    dropped. ``h`` equals the static engine's, which moves every row, at every step."""
    batch = static.encode_texts(synthetic_sentences("en", 2, seed=8), "en")
    k = 4
    parents = [
        [1, 0, 3, 2, 4, 5, 6, 7],  # swaps within each sentence: nothing copied
        [0, 0, 0, 1, 7, 6, 5, 4],  # row 0 has three children, row 1 one; sentence 2 reversed
        [2, 1, 0, 3, 4, 4, 5, 5],
        [0, 1, 2, 3, 5, 5, 5, 5],
    ]
    states, seen = {}, []
    with torch.inference_mode():  # as the search runs: the caches are updated in place
        for name, adapter in (("static", static), ("onnx", onnx)):
            state = adapter.encode(batch)
            for t in adapter.start_tokens("it"):
                _, state = adapter.decoder_step(torch.full((2,), t), state)
            state = adapter.reorder(state, torch.arange(2).repeat_interleave(k), group=k)
            hs = []
            for step, rows in enumerate(parents):
                h, state = adapter.decoder_step(torch.arange(5 + step, 13 + step), state)
                hs.append(h)
                before = state.cache.self_kv.data_ptr() if name == "onnx" else None
                state = adapter.reorder(state, torch.tensor(rows), group=k)
                if name == "onnx":
                    seen.append(state.cache.at is not None)
                    assert state.cache.self_kv.data_ptr() == before  # followed in place, not gathered
            state = adapter.reorder(state, torch.tensor([2, 3, 0, 1]), group=k)  # sentence 1 dropped
            h, _ = adapter.decoder_step(torch.tensor([20, 21, 22, 23]), state)
            states[name] = [*hs, h]
    assert any(seen)
    for ours, ref in zip(states["onnx"], states["static"], strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("src", "tgt"), [("en", "it"), ("fr", "de")])
def test_greedy_and_beam_equal_the_static_engine(static, onnx, src, tgt):
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = static.encode_texts(synthetic_sentences(src, 7, seed=6), src)
    assert greedy_search(onnx, full, batch, src, tgt, max_len=10) == greedy_search(
        static, full, batch, src, tgt, max_len=10
    )
    for beam in (2, 4):
        search = SearchSettings(beam=beam, max_len=10, early_stopping=False)
        ours = beam_search(onnx, full, batch, src, tgt, search)
        assert ours == beam_search(static, full, batch, src, tgt, search)


def test_export_is_cached_and_reused(tiny_model_dir, tmp_path, switch):
    switch(CACHE_DIR=tmp_path)
    first = Seq2SeqAdapter.load(tiny_model_dir, engine="onnx")
    dec = first.static_decoder
    assert dec.export_seconds > 0 and dec.path.is_file() and dec.path.is_relative_to(tmp_path)
    stamp = dec.path.stat().st_mtime_ns
    first.quantize_int8()
    assert dec.path.name == "body-int8.onnx" and dec.path.is_file()
    second = Seq2SeqAdapter.load(tiny_model_dir, engine="onnx")
    assert second.static_decoder.export_seconds == 0  # found, not exported again
    assert second.static_decoder.path.stat().st_mtime_ns == stamp
    second.quantize_int8()
    assert second.static_decoder.export_seconds == 0
    assert first._encoder.path.name == "encoder-int8.onnx" and first._encoder.path.is_file()
    assert second._encoder.int8 and second._encoder.export_seconds == 0


def test_int8_decoder_only_keeps_the_float32_encoder(tiny_model_dir, static, cache_dir, switch):
    switch(CACHE_DIR=cache_dir)
    adapter = Seq2SeqAdapter.load(tiny_model_dir, engine="onnx")
    adapter.quantize_int8(encoder=False)
    assert adapter.static_decoder.int8 and not adapter._encoder.int8
    batch = static.encode_texts(synthetic_sentences("en", 3, seed=8), "en")
    torch.testing.assert_close(
        adapter.encode(batch).hidden, static.encode(batch).hidden, rtol=1e-5, atol=1e-5
    )


def test_unwritable_cache_still_decodes(tiny_model_dir, static):
    """The suite's FASTVOCAB_CACHE_DIR cannot exist (conftest): the export goes to a temporary folder."""
    adapter = Seq2SeqAdapter.load(tiny_model_dir, engine="onnx")
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = static.encode_texts(synthetic_sentences("en", 3, seed=1), "en")
    assert greedy_search(adapter, full, batch, "en", "it", max_len=6) == greedy_search(
        static, full, batch, "en", "it", max_len=6
    )


def test_int8_stays_close_and_runs_the_search(tiny_model_dir, static, cache_dir, switch):
    switch(CACHE_DIR=cache_dir)
    adapter = Seq2SeqAdapter.load(tiny_model_dir, engine="onnx")
    adapter.quantize_int8()
    batch = static.encode_texts(synthetic_sentences("en", 4, seed=2), "en")
    prefix = torch.tensor(static.start_tokens("it")).expand(4, -1)
    tokens = torch.cat([prefix, torch.randint(4, static.n_vocab, (4, 5))], dim=1)
    states, ref_states = adapter.encode(batch).hidden, static.encode(batch).hidden
    assert adapter._encoder.int8 and not torch.equal(states, ref_states)
    assert (states - ref_states).norm() / ref_states.norm() < 0.05
    ours, ref = decoder_steps(adapter, batch, tokens), decoder_steps(static, batch, tokens)
    assert (ours - ref).norm() / ref.norm() < 0.05
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the first step's masked past once read freed memory: outputs varied
    try:
        adapter.static_decoder.session.reopen()
        assert all(torch.equal(decoder_steps(adapter, batch, tokens), ours) for _ in range(3))
    finally:
        torch.set_num_threads(threads)
    full = create_projection("full", static.output_weight, static.output_bias, int8=True)
    search = SearchSettings(beam=2, max_len=6, early_stopping=False)
    out = beam_search(adapter, full, batch, "en", "it", search)
    assert len(out) == 4


def test_graphs_need_the_static_engine(onnx):
    with pytest.raises(AttributeError, match="fixed-shape step"):
        onnx.static_decoder.step_fixed  # noqa: B018


@pytest.mark.skipif(not (DEMO_MAPS / "en-it").exists(), reason="models/demo-maps is not built")
@pytest.mark.parametrize("beam", [1, 4])
def test_demo_clustered_shortlist_and_exact_equal_the_static_engine(beam, tmp_path, switch):
    """The shipped map with its shortlist, and the exact path, give the static engine's outputs."""
    from fastvocab.experiments.bench_methods import shortlist_folder
    from fastvocab.tasks.projections import clustered_options, make_projection

    switch(CACHE_DIR=tmp_path)
    sources = ["GNU C library: shared libraries", "fast, lightweight web server", "transitional package"]
    outputs = []
    for engine in ("static", "onnx"):
        adapter = Seq2SeqAdapter.load(DEMO_MODEL, engine=engine)
        batch = adapter.encode_texts(sources, "en")
        shortlist = shortlist_folder(DEMO_MAPS, "en-it")
        for exact in (False, True):
            opts = clustered_options("union", "auto", exact, beam, None, True)
            proj = make_projection(
                adapter, "clustered", cluster_map=DEMO_MAPS / "en-it", shortlist=shortlist, **opts
            )
            if beam == 1:
                outputs.append(greedy_search(adapter, proj, batch, "en", "it", max_len=32))
            else:
                search = SearchSettings(beam=beam, max_len=32, early_stopping=False)
                outputs.append(beam_search(adapter, proj, batch, "en", "it", search))
    assert outputs[:2] == outputs[2:]


@pytest.mark.parametrize("parallel", ["processes", "threads"])
def test_workers_decode_after_the_parent_did(onnx, static, parallel):
    """A session opened in the parent before ``translate`` starts its workers: forked workers run the one
    they inherited (never freeing it there: its destructor would hang), worker threads run it at once, each
    through its own IO binding; batches of different row counts, so that a binding shared between threads
    would bind one batch's outputs to another's shapes."""
    from fastvocab.kernels import create_projection as make
    from fastvocab.tasks.translate import translate

    full = make("full", static.output_weight, static.output_bias)
    lines = synthetic_sentences("en", 9, seed=9)
    batch = onnx.encode_texts(lines[:2], "en")
    greedy_search(onnx, full, batch, "en", "it", max_len=4)  # the parent's session exists now
    search = SearchSettings(beam=1, batch_size=2, max_len=6)
    theirs = translate(static, full, lines, "en", "it", search, workers=1, progress=False)
    for _ in range(2):
        with DecodePool(onnx, full, 2, parallel) as pool:
            ours = translate(onnx, full, lines, "en", "it", search, progress=False, pool=pool)
        assert ours.hypotheses == theirs.hypotheses


def test_forked_workers_inherit_sessions_the_parent_opened(tiny_model_dir, static, cache_dir, switch):
    """At two lines a batch only the forked workers decode: the parent opens the sessions before it forks,
    so that they inherit them (the outputs are those of the static engine)."""
    from fastvocab.tasks.translate import translate

    switch(CACHE_DIR=cache_dir)
    adapter = Seq2SeqAdapter.load(tiny_model_dir, engine="onnx")
    sessions = (adapter._encoder.session, adapter.static_decoder.session)
    assert all(s._held is None for s in sessions)
    full = create_projection("full", static.output_weight, static.output_bias)
    lines = synthetic_sentences("en", 6, seed=4)
    search = SearchSettings(beam=1, batch_size=2, max_len=6)
    with DecodePool(adapter, full, 2, "processes") as pool:
        ours = translate(adapter, full, lines, "en", "it", search, progress=False, pool=pool)
    assert all(s._held is not None for s in sessions)
    theirs = translate(static, full, lines, "en", "it", search, workers=1, progress=False)
    assert ours.hypotheses == theirs.hypotheses


def _translated(model: Path, folder: Path, name: str, *flags: str) -> list[str]:
    """``fastvocab translate`` of 5 synthetic English lines into Italian with ``flags``: the output lines."""
    from fastvocab.pipeline.cli import main

    src, out = folder / "in.txt", folder / f"{name}.txt"
    src.write_text("\n".join(synthetic_sentences("en", 5, seed=3)) + "\n", encoding="utf-8")
    argv = ["translate", "--model", str(model), "--src-lang", "en", "--tgt-lang", "it", "--max-len", "6"]
    assert main([*argv, "--no-progress", "-i", str(src), "-o", str(out), *flags]) == 0
    return out.read_text(encoding="utf-8").splitlines()


def test_translate_engine_flag_gives_the_static_outputs(spread_model_dir, cache_dir, tmp_path, switch):
    """``fastvocab translate --engine onnx`` end to end (the bulk job carries the engine to the loaded
    model): the static engine's lines, and the summary names the engine."""
    switch(CACHE_DIR=cache_dir)
    outs = {e: _translated(spread_model_dir, tmp_path, e, "--engine", e) for e in ("static", "onnx")}
    assert len(outs["static"]) == 5 and any(outs["static"])
    assert outs["onnx"] == outs["static"]


def test_auto_runs_onnx_on_cpu_in_float32_where_the_export_can_be_kept(
    tiny_model_dir, cache_dir, tmp_path, monkeypatch, switch
):
    """``engine="auto"``: ONNX Runtime on CPU in float32 (and for int8, quantised from it); the static
    engine in another dtype, without ONNX Runtime, or where the cache folder cannot keep the export."""
    import fastvocab.kernels.ort_session as ort_session

    switch(CACHE_DIR=cache_dir)
    assert Seq2SeqAdapter.load(tiny_model_dir, cache_len=4).engine == "onnx"
    lite = Seq2SeqAdapter.load(tiny_model_dir, cache_len=4, lite=True)
    assert lite.lite and lite.engine == "onnx"
    assert Seq2SeqAdapter.load(tiny_model_dir, cache_len=4, dtype=torch.bfloat16).engine == "static"
    with monkeypatch.context() as mp:
        mp.setattr(ort_session, "onnx_unavailable", lambda what="": f"{what} needs onnxruntime")
        assert Seq2SeqAdapter.load(tiny_model_dir, cache_len=4).engine == "static"
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    switch(CACHE_DIR=tmp_path / "a-file" / "cache")
    assert Seq2SeqAdapter.load(tiny_model_dir, cache_len=4).engine == "static"


def test_a_named_engine_is_part_of_a_parts_plan():
    """A part another engine wrote is translated again (int8 arithmetic differs between engines); parts
    written under the default engine keep their plan, so earlier runs stay resumable."""
    from fastvocab.artifacts_schema.fingerprint import ModelRef
    from fastvocab.kernels.full import FullOptions
    from fastvocab.tasks.bulk import BulkRange
    from fastvocab.tasks.translate_job import TranslateJob

    model = ModelRef(path="m", fingerprint="sha256:x", d=4, n_vocab=8)
    part = BulkRange(index=0, kind="text", path="in.txt", start=0, stop=3, first_row=0, digest="d")
    plans = {
        e: TranslateJob(model, "en", "it", FullOptions(), "parts", signature="sig", engine=e).range_plan(part)
        for e in ENGINES
    }
    assert "engine" not in plans["auto"]
    assert plans["onnx"]["engine"] == "onnx" and plans["onnx"] != plans["static"] != plans["auto"]


def test_graphs_on_loads_the_static_engine_under_auto(
    spread_model_dir, tiny_model_dir, cache_dir, tmp_path, monkeypatch, capsys, switch
):
    """``--graphs on`` runs the static engine's fixed-shape step, which ONNX Runtime's engine has not: under
    ``--engine auto`` a translate and a dump then load the static engine, with the same lines. A dump on more
    than one thread decodes one batch at a time on them: the static engine too."""
    from fastvocab.tasks.context import RunContext, describe_model
    from fastvocab.tasks.dump import DumpDecoder, DumpSettings

    switch(CACHE_DIR=cache_dir)
    outs = {}
    for graphs in ("off", "on"):
        outs[graphs] = _translated(spread_model_dir, tmp_path, graphs, "--graphs", graphs)
        engine = "static" if graphs == "on" else "onnx"
        assert f", engine {engine}, " in capsys.readouterr().err
    assert any(outs["off"]) and outs["on"] == outs["off"]
    model = describe_model(tiny_model_dir)
    for graphs, threads, engine in (("on", 1, "static"), ("off", 1, "onnx"), ("off", 2, "static")):
        settings = DumpSettings(k=4, max_len=5, batch_size=4, graphs=graphs)
        ctx = RunContext(model, torch_threads=threads)
        assert DumpDecoder(ctx, settings).adapter.engine == engine
    assert DumpDecoder(RunContext(model, torch_threads=2, engine="onnx"), settings).adapter.engine == "onnx"
