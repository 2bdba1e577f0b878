"""Batch tokenization straight through SentencePiece for slow (Python) tokenizers that are a SentencePiece
model plus a piece -> id table (M2M100 and the demo model).

The Python tokenizer spends ~200 us a line in per-line Python (added-token splitting, one dictionary lookup
per piece); SentencePiece encodes a whole batch in C++ on several threads, and a precomputed table maps its
piece ids to the model's ids in one gather. On the demo model, 2 cores, 40,000 en-it train lines: 95K
against 6.1K lines/s for the sources, 73K against 6.3K for the references, the same ids on every line
(benchmarks/results/tokenize-cpu-2026-11-27.json; benchmarks/history/retired-scripts.md), so a GPU dump
does not wait on its tokenizer. A line that holds an added token's text (``</s>``, a language tag such as
``__id__``), which the Python tokenizer splits out as that token, is tokenized by the Python tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import torch


class PieceTable:
    """``sp_model`` ids -> vocabulary ids of a SentencePiece-backed tokenizer; :meth:`encode` gives the
    tokenizer's ids for a batch."""

    def __init__(self, sp_model, encoder: dict[str, int], unk_id: int, added: list[str]) -> None:
        self.sp = sp_model
        self.table = np.array(
            [encoder.get(sp_model.id_to_piece(i), unk_id) for i in range(sp_model.get_piece_size())],
            dtype=np.int64,
        )
        self.added = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)))

    @classmethod
    def of(cls, tokenizer) -> PieceTable | None:
        """The table of ``tokenizer`` when it is a slow tokenizer made of ``sp_model`` and ``encoder``
        (piece -> id), else None (fast tokenizers are Rust already; other layouts keep their own path)."""
        sp, encoder = getattr(tokenizer, "sp_model", None), getattr(tokenizer, "encoder", None)
        if getattr(tokenizer, "is_fast", True) or sp is None or not isinstance(encoder, dict):
            return None
        # the layout checked against it, id for id (the lite one reads the same files: decoding.lite_m2m100)
        if type(tokenizer).__name__ not in ("M2M100Tokenizer", "LiteM2M100Tokenizer"):
            return None
        added = [t for t in tokenizer.get_added_vocab() if t]
        return cls(sp, encoder, int(tokenizer.unk_token_id), added)

    def encode(self, texts: list[str], fallback: Callable[[list[str]], list[list[int]]]) -> list[list[int]]:
        """Each text's piece ids in the model's vocabulary (no tags, no EOS); a text that holds an added
        token's string goes to ``fallback`` (the Python tokenizer, the same contract)."""
        odd = [i for i, t in enumerate(texts) if self.added.search(t)]
        skip = set(odd)
        plain = [t for i, t in enumerate(texts) if i not in skip]
        pieces = self.sp.encode(plain, out_type=int, num_threads=torch.get_num_threads()) if plain else []
        lengths = [len(p) for p in pieces]
        flat = self.table[np.fromiter((i for p in pieces for i in p), dtype=np.int64, count=sum(lengths))]
        out = [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])] if pieces else []
        for i, ids in zip(odd, fallback([texts[i] for i in odd]) if odd else [], strict=True):
            out.insert(i, ids)  # ascending positions: each lands where it was
        return out
