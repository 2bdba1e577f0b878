"""Building blocks of the demo model: a shared SentencePiece vocabulary, an M2M100 tokenizer over it, and
M2M100 configurations (presets) built from scratch, never downloaded.

The tokenizer recipe is the one in docs/DESIGN-NOTES.md (checked with transformers 5.23): ``vocab.json`` is
``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3 then the SentencePiece pieces (no language tokens); the
``__xx__`` language codes go in ``additional_special_tokens``; the model's ``vocab_size`` is
``len(tokenizer) + tokenizer.num_madeup_words``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]

# Deep encoder, shallow decoder (Amer et al. used 12+2 or 6+... style models; Kasai et al. 2021).
PRESETS: dict[str, dict[str, int]] = {
    # For tests and smoke runs; trains on 2 CPU cores in minutes.
    "tiny": dict(vocab=8000, d_model=256, ffn=1024, heads=4, enc_layers=3, dec_layers=2),
    # The CPU-trainable model committed under models/ when no GPU is lent: big vocabulary, lean decoder,
    # so the output projection is a large share of a decoding step, as in the multilingual models.
    "cpu": dict(vocab=32000, d_model=256, ffn=1024, heads=4, enc_layers=4, dec_layers=2),
    # The GPU preset (as planned: d_model 512, vocabulary 32K+, 6-layer encoder, shallower decoder).
    "base": dict(vocab=32000, d_model=512, ffn=2048, heads=8, enc_layers=6, dec_layers=2),
}

# Training defaults per preset (``fastvocab train-demo`` flags override them). Budgets: ``tiny`` fits the
# "under 10 minutes on CPU" smoke run with SentencePiece and dev scoring included; ``cpu`` is the committed
# model's recipe on 2 shared cores; ``base`` is a GPU run.
# A CPU run sees well under one epoch of the corpus, so dropout only slows it down; a GPU run sees many.
TRAIN_DEFAULTS: dict[str, dict[str, float | int]] = {
    # 5 min of training + SentencePiece + dev scoring: 12 min end to end measured under a load of 9 on 2 cores
    "tiny": dict(batch_tokens=2048, lr=1.5e-3, warmup=150, dropout=0.0, max_minutes=5),
    # ~2-3 s a step on 2 shared cores: small batches buy more updates in a short run
    "cpu": dict(batch_tokens=2048, lr=1.5e-3, warmup=150, dropout=0.0, max_minutes=45),
    "base": dict(batch_tokens=16384, lr=7e-4, warmup=4000, dropout=0.1, max_steps=60_000),
}


def lang_token(lang: str) -> str:
    return f"__{lang}__"


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | Path,
    *,
    threads: int = 2,
    seed: int = 0,
    seed_sentences: int = 2_000_000,
) -> Path:
    """Train a unigram SentencePiece model on ``texts``; returns the path of ``spm.model``.

    ``vocab_size`` is the total vocabulary size of the SentencePiece model, special pieces included.
    """
    import sentencepiece as spm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        n = 0
        for t in texts:
            t = t.strip()
            if t:
                f.write(t + "\n")
                n += 1
        corpus = f.name
    if n == 0:
        raise ValueError("no text to train SentencePiece on")
    # SentencePiece seeds its shuffle from a random device unless told: fixed, same text -> same vocabulary.
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=str(out_dir / "spm"),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=0.9995,
        num_threads=threads,
        input_sentence_size=seed_sentences,
        shuffle_input_sentence=True,
        # ids 0-3 as in vocab.json below, so SentencePiece and the tokenizer agree on the specials
        bos_id=0,
        pad_id=1,
        eos_id=2,
        unk_id=3,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    Path(corpus).unlink()
    return out_dir / "spm.model"


def build_tokenizer(spm_model: str | Path, languages: list[str], out_dir: str | Path):
    """Write ``vocab.json`` + ``sentencepiece.bpe.model`` to ``out_dir`` and return an M2M100Tokenizer."""
    import sentencepiece as spm
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    all_codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
    unknown = sorted(set(languages) - set(all_codes))
    if unknown:
        raise ValueError(f"languages {unknown} are not M2M100 language codes")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if piece not in vocab:
            vocab[piece] = len(vocab)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    spm_target = out_dir / "sentencepiece.bpe.model"
    spm_target.write_bytes(Path(spm_model).read_bytes())
    return M2M100Tokenizer(
        vocab_file=str(out_dir / "vocab.json"),
        spm_file=str(spm_target),
        src_lang=languages[0],
        tgt_lang=languages[1] if len(languages) > 1 else languages[0],
        # All codes, in M2M100's order: the tokenizer maps tag ids by that order (encoder size + position),
        # and added special tokens get ids in the order given, so both must agree.
        additional_special_tokens=[lang_token(code) for code in all_codes],
    )


def model_config(preset: str | dict[str, int], tokenizer, max_positions: int = 256, dropout: float = 0.1):
    """An M2M100Config for a preset name (or a dict like ``PRESETS['tiny']``) and a tokenizer."""
    from transformers import M2M100Config

    p = PRESETS[preset] if isinstance(preset, str) else preset
    return M2M100Config(
        vocab_size=len(tokenizer) + tokenizer.num_madeup_words,
        d_model=p["d_model"],
        encoder_layers=p["enc_layers"],
        decoder_layers=p["dec_layers"],
        encoder_attention_heads=p["heads"],
        decoder_attention_heads=p["heads"],
        encoder_ffn_dim=p["ffn"],
        decoder_ffn_dim=p["ffn"],
        max_position_embeddings=max_positions,
        dropout=dropout,
        attention_dropout=0.0,
        # M2M100's default LayerDrop (0.05) is for its 12-24-layer models; with 2 decoder layers it is noise
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
