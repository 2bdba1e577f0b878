"""The HF adapter: exact output projection (h W^T + b == the model's logits), cache handling, tokenization."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import reference_logits, synthetic_sentences

from fastvocab.artifacts_schema.fingerprint import projection_fingerprint
from fastvocab.decoding import Seq2SeqAdapter, beam_search, greedy_search
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels import create_projection

# MarianTokenizer recommends sacremoses for punctuation normalisation; not needed for these tests.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(scope="module")
def m2m(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir)


@pytest.fixture(scope="module")
def marian_dir(tiny_model_dir, tmp_path_factory):
    """A random Marian en->it model with a non-zero ``final_logits_bias``, its tokenizer over the tiny spm."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out = tmp_path_factory.mktemp("marian") / "model"
    out.mkdir()
    spm_file = tiny_model_dir / "sentencepiece.bpe.model"
    sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    vocab = {"</s>": 0, "<unk>": 1, "<pad>": 2}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab))
    for name in ("source.spm", "target.spm"):
        shutil.copy(spm_file, out / name)
    tok = MarianTokenizer(
        source_spm=str(out / "source.spm"),
        target_spm=str(out / "target.spm"),
        vocab=str(out / "vocab.json"),
        source_lang="en",
        target_lang="it",
    )
    config = MarianConfig(
        vocab_size=len(tok),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 2.0)
    model.generation_config.bad_words_ids = [[tok.pad_token_id]]  # as in the opus-mt checkpoints
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def marian(marian_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(marian_dir)


def _stepwise_vs_forward(adapter: Seq2SeqAdapter, src: str, tgt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(projected, reference) logits (rows, T, N) for a decoder input of prefix + random tokens."""
    texts = synthetic_sentences(src, 5, seed=1)
    batch = adapter.encode_texts(texts, src, tgt)
    rows = len(texts)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.tensor(adapter.start_tokens(tgt)).expand(rows, -1)
    body = torch.randint(4, adapter.n_vocab, (rows, 6), generator=gen)
    dec_in = torch.cat([prefix, body], dim=1)  # (rows, T)
    state = adapter.encode(batch)
    projected = []
    for t in range(dec_in.shape[1]):
        h, state = adapter.decoder_step(dec_in[:, t], state)  # (rows, d)
        logits = h @ adapter.output_weight.T
        if adapter.output_bias is not None:
            logits = logits + adapter.output_bias
        projected.append(logits)
    return torch.stack(projected, dim=1), reference_logits(adapter, batch, dec_in)


def test_m2m100_projection_is_exact_and_tied(m2m):
    assert m2m.output_bias is None  # M2M100's LM head has no bias
    # tied: W is the shared embedding matrix itself, not a copy
    assert m2m.output_weight.data_ptr() == m2m.model.get_input_embeddings().weight.data_ptr()
    assert m2m.output_weight.shape == (m2m.n_vocab, m2m.d_model) == (m2m.model.config.vocab_size, 32)
    ours, ref = _stepwise_vs_forward(m2m, "en", "it")
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_marian_projection_includes_final_logits_bias(marian):
    bias = marian.model.final_logits_bias.reshape(-1)
    assert marian.output_bias is not None and float(bias.abs().min()) > 0
    torch.testing.assert_close(marian.output_bias, bias)
    ours, ref = _stepwise_vs_forward(marian, "en", "it")
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # without the bias the logits are measurably different: the test above can fail
    no_bias = ours - marian.output_bias
    assert (no_bias - ref).abs().max() > 0.5


def test_fingerprint_covers_weight_and_bias(m2m, marian):
    w = m2m.output_weight.numpy()
    assert m2m.fingerprint == projection_fingerprint(w, None)
    wm, bm = marian.output_weight.numpy(), marian.output_bias.numpy()
    assert marian.fingerprint == projection_fingerprint(wm, bm)
    assert marian.fingerprint != projection_fingerprint(wm, None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fingerprint_does_not_depend_on_the_load_dtype(tiny_model_dir, m2m, dtype):
    """The tiny checkpoint is float32: loaded in a narrower dtype its W rounds (so a hash of the loaded values
    differs), but the fingerprint stays the float32 one, so maps built from a float32 load still apply."""
    low = Seq2SeqAdapter.load(tiny_model_dir, dtype=dtype, engine="hf")
    assert low.output_weight.dtype == dtype
    rounded = projection_fingerprint(low.output_weight.float().numpy(), None)
    assert rounded != m2m.fingerprint  # the case the float32 read is for
    assert low.fingerprint == m2m.fingerprint


def test_load_errors(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        Seq2SeqAdapter.load(missing)
    missing.mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        Seq2SeqAdapter.load(missing)


def test_languages_and_tags(m2m):
    assert {"en", "it", "fr", "de"} <= set(m2m.languages)
    it_id = m2m.tokenizer.convert_tokens_to_ids("__it__")
    assert m2m.lang_id("it") == it_id
    assert m2m.start_tokens("it") == [m2m.model.config.decoder_start_token_id, it_id]
    active = m2m.always_active_ids()
    assert m2m.eos_id in active and it_id in active and len(active) == len(m2m.languages) + 1
    m2m.check_language("fr")
    with pytest.raises(ValueError, match=r"unknown language 'xx' for model .*; valid: .*\ben\b"):
        m2m.check_language("xx")
    with pytest.raises(ValueError, match="unknown language"):
        m2m.encode_texts(["a"], "zz-bad")


def test_encode_texts_and_decode(m2m):
    texts = ["il pacchetto per rete", "il", "un sistema di file per la rete client server"]
    batch = m2m.encode_texts(texts, "it")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == mask.shape and ids.shape[0] == 3
    lengths = mask.sum(1).tolist()
    assert len(set(lengths)) == 3
    for row, n in zip(ids.tolist(), lengths, strict=True):
        assert row[0] == m2m.lang_id("it") and row[n - 1] == m2m.eos_id
        assert all(t == m2m.pad_id for t in row[n:])  # right padding
    # decode drops the language tag and EOS; the text survives the round trip
    texts_back = m2m.decode_ids([row[:n] for row, n in zip(ids.tolist(), lengths, strict=True)])
    assert texts_back == texts


def test_reorder_selects_rows(m2m):
    texts = synthetic_sentences("en", 4, seed=2)
    batch = m2m.encode_texts(texts, "en")
    prefix = m2m.start_tokens("it")
    toks = [torch.full((4,), t) for t in prefix] + [torch.tensor([10, 11, 12, 13])]

    def run(state, steps):
        h = None
        for t in steps:
            h, state = m2m.decoder_step(t, state)
        return h, state

    _, state = run(m2m.encode(batch), toks[:-1])
    index = torch.tensor([2, 0, 0])
    state = m2m.reorder(state, index)
    h_sel, _ = m2m.decoder_step(toks[-1][index], state)
    h_ref, _ = run(m2m.encode(batch), toks)
    torch.testing.assert_close(h_sel, h_ref[index], rtol=1e-5, atol=1e-5)


def test_marian_search_equals_generate(marian):
    """Marian: decoder start = pad, pad banned (bad_words_ids), EOS forced at the length limit."""
    assert marian.languages == ["en", "it"]
    assert marian.start_tokens("it") == [marian.pad_id]
    assert marian.suppressed_ids() == [marian.pad_id]
    assert marian.forced_eos_id == marian.eos_id
    proj = create_projection("full", marian.output_weight, marian.output_bias)
    batch = marian.encode_texts(synthetic_sentences("en", 6, seed=4), "en")
    for max_len in (4, 9):
        gen_kw = dict(do_sample=False, max_new_tokens=max_len)
        ref = marian.model.generate(**batch, num_beams=1, **gen_kw).tolist()
        ref = [[t for t in r[1:] if t not in (marian.eos_id, marian.pad_id)] for r in ref]
        ours = greedy_search(marian, proj, batch, "en", "it", max_len=max_len)
        assert ours == ref
        assert all(len(s) == max_len - 1 for s in ours)  # forced EOS took the last position
        ref_b = marian.model.generate(**batch, num_beams=3, early_stopping=False, **gen_kw).tolist()
        ref_b = [[t for t in r[1:] if t not in (marian.eos_id, marian.pad_id)] for r in ref_b]
        settings = SearchSettings(beam=3, max_len=max_len, early_stopping=False)
        assert beam_search(marian, proj, batch, "en", "it", settings) == ref_b


def test_engine_resolution(m2m, marian, marian_dir):
    assert m2m.engine == "static"  # M2M100 architecture: the lean step
    assert (
        marian.engine == "static"
    )  # Marian too (post-norm, its own positions: tests/test_engine_families.py)
    assert Seq2SeqAdapter.load(marian_dir, engine="hf").engine == "hf"


def test_recorded_training_languages_restrict_the_m2m100_codes(tiny_model_dir, tmp_path):
    # The tokenizer knows all 100 M2M100 codes; a model that records the languages it was trained on
    # (as train-demo does) refuses the others instead of translating them into garbage.
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["fastvocab_languages"] = ["en", "it"]
    (folder / "config.json").write_text(json.dumps(cfg))
    adapter = Seq2SeqAdapter.load(folder)
    assert adapter.languages == ["en", "it"]
    adapter.check_language("it")
    with pytest.raises(ValueError, match=r"unknown language 'fr' .*valid: en, it"):
        adapter.check_language("fr")
    assert sorted(adapter.always_active_ids()) == sorted(
        [adapter.eos_id, adapter.lang_id("en"), adapter.lang_id("it")]
    )
