"""The static decoder engine on the Marian and MBart families at the token-id level.

Tiny random models built from configs (nothing downloaded) with a stub tokenizer: the adapter only needs the
tokenizer for language tags, and these tests feed token ids. Each family checks what sets it apart:

- Marian: post-norm layers, a sinusoidal table without offset, ``scale_embedding``, ``final_logits_bias`` as
  the output bias, no embedding layer norm, no final layer norm, decoder start = pad (banned from the output);
- MBart: learned positions with offset 2, ``layernorm_embedding``, a final layer norm, language tags forced
  after the decoder start, EOS forced at the length limit.

For both: ``h`` equal to the Hugging Face decoder's, greedy and beam search token-identical to ``generate``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import decoder_steps, reference_logits

from fastvocab.decoding import Seq2SeqAdapter, beam_search, greedy_search
from fastvocab.decoding.model_families import unsupported_reason
from fastvocab.decoding.packed_encoder import PackedEncoder
from fastvocab.decoding.settings import SearchSettings
from fastvocab.decoding.static_decoder import StaticDecoder
from fastvocab.kernels import create_projection
from tests.layers import assert_embedding_equals_the_tensor_one

VOCAB = 96
LANGS = {"en_XX": VOCAB - 2, "it_IT": VOCAB - 1}  # MBart-50 style tags: the last ids of the vocabulary


class StubTokenizer:
    """What the adapter reads from a tokenizer besides text: special tokens (MBart tags), the vocabulary
    (Marian ``>>xx<<`` tags, none here) and the pair's languages (none recorded)."""

    def __init__(self, tags: dict[str, int]) -> None:
        self.tags = dict(tags)
        self.additional_special_tokens = list(tags)

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.tags[token]

    def get_vocab(self) -> dict[str, int]:
        return dict(self.tags)


def _common(**kw) -> dict:
    return dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=40,
        scale_embedding=True,
        init_std=0.3,  # decisive logits: a near-tie would test float rounding, not the engine
        **kw,
    )


def _marian() -> Seq2SeqAdapter:
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(**_common(pad_token_id=1, eos_token_id=0, decoder_start_token_id=1))
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
    model.generation_config.bad_words_ids = [[1]]  # the opus-mt checkpoints ban the pad (= decoder start)
    return Seq2SeqAdapter(model, StubTokenizer({}), "tiny-marian", "cpu", torch.float32, cache_len=3)


def _mbart() -> Seq2SeqAdapter:
    from transformers import MBartConfig, MBartForConditionalGeneration

    config = MBartConfig(**_common(pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2))
    torch.manual_seed(1)
    model = MBartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
    return Seq2SeqAdapter(model, StubTokenizer(LANGS), "tiny-mbart", "cpu", torch.float32, cache_len=3)


FAMILIES = {"marian": _marian, "mbart": _mbart}
SRC = {"marian": "en", "mbart": "en_XX"}
TGT = {"marian": "it", "mbart": "it_IT"}  # Marian pair models record no languages: any code passes


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def static(family) -> Seq2SeqAdapter:
    adapter = FAMILIES[family]()
    assert adapter.engine == "static" and adapter.family == family
    return adapter


@pytest.fixture(scope="module")
def hf(static) -> Seq2SeqAdapter:
    adapter = Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, engine="hf")
    assert adapter.engine == "hf"
    return adapter


def _batch(adapter: Seq2SeqAdapter, rows: int, seed: int) -> dict:
    """Random source ids (no specials, no tags) + EOS, right-padded to different lengths."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(rows):
        n = 3 + (i * 5) % 9
        body = torch.randint(3, VOCAB - len(LANGS), (n,), generator=gen).tolist()
        seqs.append([*body, adapter.eos_id])
    return adapter.pad(seqs)


def _generate(adapter: Seq2SeqAdapter, batch: dict, tgt: str, max_len: int, beam: int) -> list[list[int]]:
    """``model.generate`` with the adapter's forced prefix; prefix, EOS and pads removed."""
    prefix = adapter.start_tokens(tgt)
    kw = {"forced_bos_token_id": prefix[1]} if len(prefix) > 1 else {}
    out = adapter.model.generate(
        **batch,
        do_sample=False,
        num_beams=beam,
        early_stopping=False,
        length_penalty=1.0,
        max_new_tokens=max_len + len(prefix) - 1,
        **kw,
    )
    rows = []
    for row in out.tolist():
        row = row[len(prefix) :]
        row = row[: row.index(adapter.eos_id)] if adapter.eos_id in row else row
        rows.append([t for t in row if t != adapter.pad_id])
    return rows


def test_families_are_recognised(static):
    assert unsupported_reason(static.model) is None
    engine = static._static
    if static.family == "marian":
        assert not engine.family.pre_norm and engine.pos_offset == 0
        assert engine.ln_embed is None and engine.final_ln is None
        assert engine.embed_scale == pytest.approx(32**0.5)  # Marian scales in the decoder, not the embedding
        assert static.start_tokens("it") == [static.pad_id]
    else:
        assert engine.family.pre_norm and engine.pos_offset == 2
        assert engine.ln_embed is not None and engine.final_ln is not None
        assert static.start_tokens("it_IT") == [2, LANGS["it_IT"]]
    assert static.output_bias is not None  # final_logits_bias


def test_step_h_equals_the_hf_decoder(static, hf, family):
    """Padded sources, a pad among the targets and more steps than cache_len=3 (the cache doubles)."""
    batch = _batch(static, 5, seed=2)
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 2
    gen = torch.Generator().manual_seed(3)
    prefix = torch.tensor(static.start_tokens(TGT[family])).expand(5, -1)
    body = torch.randint(3, VOCAB, (5, 9), generator=gen)
    body[1, 2] = static.pad_id
    tokens = torch.cat([prefix, body], dim=1)
    ours, ref = decoder_steps(static, batch, tokens), decoder_steps(hf, batch, tokens)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # and the model's own logits from a full forward pass: h W^T + b
    logits = ours @ static.output_weight.T + static.output_bias
    torch.testing.assert_close(logits, reference_logits(static, batch, tokens), rtol=1e-4, atol=1e-4)


def test_fixed_shape_step_equals_step(static, family):
    """step_fixed (whole capacity, masked; what a CUDA graph captures) gives step's h."""
    batch = _batch(static, 4, seed=5)
    gen = torch.Generator().manual_seed(6)
    prefix = torch.tensor(static.start_tokens(TGT[family])).expand(4, -1)
    tokens = torch.cat([prefix, torch.randint(3, VOCAB, (4, 7), generator=gen)], dim=1)
    want = decoder_steps(static, batch, tokens)
    torch.testing.assert_close(decoder_steps(static, batch, tokens, fixed=True), want, rtol=1e-5, atol=1e-5)


def test_packed_encoder_equals_the_hf_encoder(static, family):
    """The padding-free encoder: the HF encoder's states on every real token, zeros on padding."""
    assert isinstance(static._encoder, PackedEncoder)
    batch = _batch(static, 6, seed=9)
    mask = batch["attention_mask"].bool()
    assert len(set(mask.sum(1).tolist())) > 2 and not mask.all()  # padding in play
    ours = static.encode(batch).hidden
    with torch.inference_mode():
        ref = static.model.get_encoder()(**batch).last_hidden_state
    torch.testing.assert_close(ours[mask], ref[mask], rtol=1e-5, atol=1e-5)
    assert not ours[~mask].any()


def test_onnx_engine_encoder_equals_the_hf_encoder(static, family, tmp_path, switch):
    """The onnx engine exports every family's encoder layers (post-norm Marian, MBart's embedding norm)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from fastvocab.decoding.onnx_encoder import OnnxEncoder

    switch(CACHE_DIR=tmp_path)
    adapter = Seq2SeqAdapter(static.model, static.tokenizer, static.path, "cpu", torch.float32, engine="onnx")
    assert isinstance(adapter._encoder, OnnxEncoder)
    batch = _batch(static, 6, seed=9)
    mask = batch["attention_mask"].bool()
    ours = adapter.encode(batch).hidden
    with torch.inference_mode():
        ref = static.model.get_encoder()(**batch).last_hidden_state
    torch.testing.assert_close(ours[mask], ref[mask], rtol=1e-5, atol=1e-5)
    assert not ours[~mask].any()


@pytest.mark.parametrize("max_len", [5, 14])
def test_greedy_and_beam_equal_generate(static, family, max_len):
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = _batch(static, 7, seed=5)
    tgt = TGT[family]
    greedy = greedy_search(static, full, batch, SRC[family], tgt, max_len=max_len)
    assert greedy == _generate(static, batch, tgt, max_len, beam=1)
    assert len({tuple(s) for s in greedy}) > 1  # the outputs depend on the source: a real test
    for beam in (2, 4):
        settings = SearchSettings(beam=beam, max_len=max_len, early_stopping=False)
        ours = beam_search(static, full, batch, SRC[family], tgt, settings)
        assert ours == _generate(static, batch, tgt, max_len, beam=beam)


@pytest.mark.parametrize("max_len", [5, 14])
def test_graphed_searches_equal_generate(static, family, max_len, switch):
    """The fixed-shape searches CUDA graphs capture (run eagerly here): each family's forced prefix, banned
    decoder-start pad (Marian) and forced EOS at the length limit (MBart) go through them too."""
    from fastvocab.decoding.steppers import CapturedStepper

    switch(CPU_SYNC_EVERY=2)
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = _batch(static, 7, seed=5)
    src, tgt = SRC[family], TGT[family]
    fixed = CapturedStepper(static, capture=False)
    got = greedy_search(static, full, batch, src, tgt, max_len=max_len, stepper=fixed)
    assert got == _generate(static, batch, tgt, max_len, beam=1)
    for beam in (2, 4):
        settings = SearchSettings(beam=beam, max_len=max_len, early_stopping=False)
        got = beam_search(static, full, batch, src, tgt, settings, stepper=fixed)
        assert got == _generate(static, batch, tgt, max_len, beam=beam)


def test_position_table_end_is_an_error(static, family):
    """Learned/fixed tables end at max_position_embeddings (where HF fails with an index error)."""
    batch = _batch(static, 2, seed=6)
    tokens = torch.full((2, 41), 5)
    tokens[:, 0] = static.start_tokens(TGT[family])[0]
    with pytest.raises(
        ValueError, match=r"target position 40 is beyond the .* position table \(40 positions"
    ):
        decoder_steps(static, batch, tokens)


def test_cache_limit_names_the_sizes(static, family, switch):
    engine = StaticDecoder(static.model, max_cache_bytes=1000)
    enc = static.encode(_batch(static, 3, seed=7))
    what = (
        r"self-attention cache \(2, 2, 3, 4, 64, 8\) = 98,304 bytes .*limit is 1,000 bytes "
        r"\(max_cache_bytes / FASTVOCAB_CACHE_LIMIT_MB\).*rows = batch x beam.*--max-len"
    )
    with pytest.raises(MemoryError, match=what):
        engine.start(enc.hidden, enc.mask, capacity=64)
    switch(CACHE_LIMIT_MB=0.001)  # MiB
    assert StaticDecoder(static.model).max_cache_bytes == 1048


def test_beam_that_does_not_fit_fails_before_decoding(static, family):
    """The batch fits, batch x beam does not: beam expansion is refused, naming the rows."""
    full = create_projection("full", static.output_weight, static.output_bias)
    batch = _batch(static, 3, seed=8)
    max_len = 30
    positions = len(static.start_tokens(TGT[family])) + max_len - 1
    limit = 2 * 3 * static._static.cache_bytes_per_row(positions)  # 3 rows fit, 3 x 4 do not
    adapter = Seq2SeqAdapter(
        static.model, static.tokenizer, static.path, "cpu", torch.float32, max_cache_bytes=limit
    )
    assert len(greedy_search(adapter, full, batch, SRC[family], TGT[family], max_len=max_len)) == 3
    with pytest.raises(MemoryError, match=r"self-attention cache \(2, 2, 12, 4, \d+, 8\)"):
        settings = SearchSettings(beam=4, max_len=max_len, early_stopping=False)
        beam_search(adapter, full, batch, SRC[family], TGT[family], settings)


def test_embedding_on_the_host_equals_the_tensor_one(static):
    """The decoder step's input, made in numpy on CPU where the family allows it (no embedding layer
    norm): the same float32 rows as the tensor code, for each family's kind of positions."""
    assert_embedding_equals_the_tensor_one(static._static)
