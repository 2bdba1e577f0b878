"""Everything derived from the corpus before training starts (``prepare`` -> ``Prepared``): the directions,
the SentencePiece model and M2M100 tokenizer (``demo_model``), the encoded train and dev pairs and the
batch stream over them."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fastvocab.training.batches import BatchStream
from fastvocab.training.config import TrainConfig
from fastvocab.training.data import (
    Encoded,
    check_encoding,
    corpus_directions,
    encode_direction,
    languages_of,
    load_parallel,
    parse_direction,
    spm_sample,
)
from fastvocab.training.demo_model import build_tokenizer, train_sentencepiece

if TYPE_CHECKING:
    from transformers import M2M100Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """Everything derived from the corpus before training starts."""

    directions: list[str]  # as given (or found in the corpus)
    langs: list[str]
    tokenizer: M2M100Tokenizer
    train_pairs: dict[str, int]
    dropped: dict[str, int]
    stream: BatchStream
    encoded: list[Encoded]  # in ``stream.directions`` order
    dev_encoded: list[Encoded]


def prepare(cfg: TrainConfig) -> Prepared:
    """Read the corpus, train (or reuse) the SentencePiece model, build the tokenizer, encode the pairs.

    The SentencePiece model is reused only when it was trained for the same directions and vocabulary size:
    a resumed run must see exactly the vocabulary its checkpoint was trained with.
    """
    directions = list(cfg.directions or corpus_directions(cfg.corpus))
    if not directions:
        raise ValueError(f"no language pairs in {cfg.corpus}")
    train = load_parallel(cfg.corpus, directions, "train")
    counts = {d: len(train[d][0]) for d in directions}
    log.info("training pairs per direction: %s", counts)
    langs = languages_of(directions)
    vocab = int(cfg.arch["vocab"])  # type: ignore[index]
    spm_dir = cfg.work_dir / "spm"
    meta = {"vocab": vocab, "directions": directions, "seed": cfg.seed, "spm_sentences": cfg.spm_sentences}
    meta_path = spm_dir / "meta.json"
    if not (meta_path.exists() and json.loads(meta_path.read_text()) == meta):
        t0 = time.perf_counter()
        train_sentencepiece(spm_sample(train, cfg.spm_sentences, cfg.seed), vocab, spm_dir)
        meta_path.write_text(json.dumps(meta))
        log.info("SentencePiece (%d pieces) trained in %.0f s", vocab, time.perf_counter() - t0)
    tokenizer = build_tokenizer(spm_dir / "spm.model", langs, cfg.work_dir / "tokenizer")
    for d in directions:
        check_encoding(tokenizer, train[d][0][:50], train[d][1][:50], *parse_direction(d))
    encoded = {
        d: encode_direction(tokenizer, *train[d], *parse_direction(d), cfg.max_len) for d in directions
    }
    del train
    dev = load_parallel(cfg.corpus, directions, "dev", limit=cfg.dev_loss_sentences)
    dev_encoded = [encode_direction(tokenizer, *dev[d], *parse_direction(d), cfg.max_len) for d in directions]
    lengths = {
        d: np.array([max(len(a), len(b)) for a, b in zip(e.src, e.tgt, strict=True)])
        for d, e in encoded.items()
    }
    stream = BatchStream(lengths, cfg.batch_tokens, cfg.temperature, cfg.seed)  # type: ignore[arg-type]
    log.info(
        "direction sampling (T=%.1f): %s",
        cfg.temperature,
        ", ".join(f"{d} {p:.3f}" for d, p in zip(stream.directions, stream.probs, strict=True)),
    )
    return Prepared(
        directions=directions,
        langs=langs,
        tokenizer=tokenizer,
        train_pairs=counts,
        dropped={d: e.dropped for d, e in encoded.items()},
        stream=stream,
        encoded=[encoded[d] for d in stream.directions],
        dev_encoded=dev_encoded,
    )
