"""From the corpus to token ids: directions, the parallel text of a split, the SentencePiece training sample,
and the bulk encoding of a direction into M2M100 sequences (``Encoded``).

Sequences follow the M2M100 convention: encoder input ``__src__ tokens </s>``, labels ``__tgt__ tokens </s>``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fastvocab.artifacts_schema.corpus import available_pairs, read_direction

if TYPE_CHECKING:
    from transformers import M2M100Tokenizer

log = logging.getLogger(__name__)


def parse_direction(direction: str) -> tuple[str, str]:
    """``"en-it"`` -> ``("en", "it")``; ``ValueError`` unless two different, non-empty languages."""
    src, sep, tgt = direction.partition("-")
    if not sep or not src or not tgt or src == tgt:
        raise ValueError(f"bad direction {direction!r}: expected SRC-TGT, e.g. en-it")
    return src, tgt


def corpus_directions(corpus_dir: str | Path) -> list[str]:
    """Both directions of every language pair in the corpus, e.g. ``["en-it", "it-en", ...]``."""
    dirs = []
    for a, b in available_pairs(corpus_dir):
        dirs += [f"{a}-{b}", f"{b}-{a}"]
    return dirs


def load_parallel(
    corpus_dir: str | Path, directions: Sequence[str], split: str, limit: int | None = None
) -> dict[str, tuple[list[str], list[str]]]:
    """(sources, targets) per direction for one split; empty or whitespace-only pairs are left out."""
    data = {}
    for d in directions:
        src, tgt = parse_direction(d)
        _, s, t = read_direction(corpus_dir, src, tgt, split, limit)
        keep = [i for i in range(len(s)) if s[i].strip() and t[i].strip()]
        data[d] = ([s[i] for i in keep], [t[i] for i in keep])
    return data


def languages_of(directions: Sequence[str]) -> list[str]:
    """Languages in order of first appearance (the first two become the tokenizer's defaults)."""
    langs: list[str] = []
    for d in directions:
        for lang in parse_direction(d):
            if lang not in langs:
                langs.append(lang)
    return langs


def spm_sample(data: dict[str, tuple[list[str], list[str]]], total: int, seed: int) -> list[str]:
    """A language-balanced sample of unique texts: at most ``total / n_languages`` per language."""
    per_lang: dict[str, set[str]] = {}
    for d, (s, t) in data.items():
        src, tgt = parse_direction(d)
        per_lang.setdefault(src, set()).update(s)
        per_lang.setdefault(tgt, set()).update(t)
    cap = max(1, total // max(1, len(per_lang)))
    rng = random.Random(seed)
    sample = []
    for lang in sorted(per_lang):
        texts = sorted(per_lang[lang])
        sample += rng.sample(texts, cap) if len(texts) > cap else texts
        log.info("SentencePiece sample: %s %d of %d unique texts", lang, min(cap, len(texts)), len(texts))
    return sample


@dataclass
class Encoded:
    """Token ids of one direction: ``src[i]`` = ``__src__ ... </s>``, ``tgt[i]`` = ``__tgt__ ... </s>``."""

    src: list[np.ndarray]
    tgt: list[np.ndarray]
    dropped: int = 0  # pairs longer than max_len on either side


def encode_direction(
    tokenizer: M2M100Tokenizer,
    sources: list[str],
    targets: list[str],
    src_lang: str,
    tgt_lang: str,
    max_len: int,
) -> Encoded:
    """Encode with the SentencePiece model in bulk (C++, threaded), as the tokenizer would.

    The tokenizer's ``vocab.json`` maps SentencePiece id i to id i (specials 0-3 agree by construction),
    which ``check_encoding`` verifies on a sample against the tokenizer itself.
    """
    sp = tokenizer.sp_model
    eos = tokenizer.eos_token_id
    s_tag, t_tag = tokenizer.get_lang_id(src_lang), tokenizer.get_lang_id(tgt_lang)
    s_ids = sp.encode(sources, num_threads=2)
    t_ids = sp.encode(targets, num_threads=2)
    enc = Encoded([], [])
    for a, b in zip(s_ids, t_ids, strict=True):
        if len(a) + 2 > max_len or len(b) + 2 > max_len:
            enc.dropped += 1
            continue
        enc.src.append(np.array([s_tag, *a, eos], dtype=np.int32))
        enc.tgt.append(np.array([t_tag, *b, eos], dtype=np.int32))
    return enc


def check_encoding(
    tokenizer: M2M100Tokenizer, sources: list[str], targets: list[str], src_lang: str, tgt_lang: str
) -> None:
    """Raise if the bulk encoding differs from ``tokenizer(src, text_target=tgt)`` (the M2M100 convention)."""
    if not sources:
        return
    enc = encode_direction(tokenizer, sources, targets, src_lang, tgt_lang, max_len=10**9)
    tokenizer.src_lang, tokenizer.tgt_lang = src_lang, tgt_lang
    ref = tokenizer(sources, text_target=targets)
    for i in range(len(sources)):
        if list(enc.src[i]) != ref["input_ids"][i] or list(enc.tgt[i]) != ref["labels"][i]:
            raise RuntimeError(
                f"bulk encoding disagrees with the tokenizer on {src_lang}-{tgt_lang} pair {i}: "
                f"{sources[i]!r} -> {list(enc.src[i])} vs {ref['input_ids'][i]}"
            )
