"""Batch tokenization through SentencePiece gives the Python tokenizer's ids, line for line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "  two  spaces ",
    "tab\there, a\nnewline",
    "emoji 🙂 and ÅÉ ﬁ ligatures",
    "x </s> y",  # an added token's text: the Python tokenizer splits it out
    "__it__ at the start, and __id__ (a language tag) inside",
    "<unk>",
    "\u200b",
]


@pytest.fixture(scope="module", params=["demo", "tiny"])
def adapter(request):
    """The demo model's tokenizer and the tiny test model's (another SentencePiece model, ~400 pieces)."""
    path = DEMO if request.param == "demo" else request.getfixturevalue("tiny_model_dir")
    return Seq2SeqAdapter.load(path, engine="hf")


def test_the_demo_tokenizer_has_a_piece_table(adapter):
    assert adapter._pieces is not None


@pytest.mark.parametrize("lang", ["en", "it", "fr"])
def test_piece_table_ids_equal_the_python_tokenizers(adapter, lang):
    fast_src, fast_tgt = adapter.tokenize(LINES, lang), adapter.tokenize_targets(LINES, lang)
    table, adapter._pieces = adapter._pieces, None
    try:
        slow_src, slow_tgt = adapter.tokenize(LINES, lang), adapter.tokenize_targets(LINES, lang)
    finally:
        adapter._pieces = table
    assert fast_src == slow_src and fast_tgt == slow_tgt
    assert fast_src[0][0] == adapter.lang_id(lang) and fast_src[0][-1] == adapter.eos_id
    assert adapter.eos_id in fast_src[5][1:-1]  # "</s>" in the text: the EOS token, as before
