"""Lexical shortlists (Devlin 2017; the baseline of Hoang et al. 2022; Marian's ``--shortlist``): the table
behind ``kernels/shortlist.py``, and its export to CTranslate2's vocabulary map.

For one direction: tokenize the training pairs with the model's own tokenizer, learn ``p(t | s)`` over subword
ids with IBM Model 1 (``tasks/alignment.py``), and keep per source subword its ``k`` most probable target
subwords; add the ``frequent`` most frequent target subwords of the corpus and the always-active ids (EOS,
language tags). At decode time a sentence's candidates are the union of its source subwords' rows, the
frequent list and the always-active ids.

Stored as a method index (``artifacts_schema/method_index.py``, method ``"shortlist"``, one per direction):

- ``indptr`` (N + 1,) int64, ``indices`` (nnz,) int32, ``probs`` (nnz,) float32: the rows (CSR over source
  ids), each sorted by probability, so a projection can use fewer than ``k`` per row;
- ``frequent`` (F,) int32: target ids by corpus count, most frequent first;
- ``always_active`` (A,) int32: the adapter's always-active ids when the table was built, and the
  tokenizer's unknown token (the model emits it for characters its vocabulary lacks, whatever the source).

Pure functions: no Ray, no MLflow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.method_index import MethodIndex, new_index
from fastvocab.tasks.alignment import ibm1

log = logging.getLogger(__name__)

METHOD = "shortlist"


@dataclass(frozen=True)
class ShortlistParams:
    """How a shortlist table is built (the manifest records them).

    k: target subwords kept per source subword (by ``p(t | s)``); frequent: most frequent target subwords
    stored (always candidates); iterations: IBM-1 EM iterations; max_tokens: pairs longer than this
    (subwords, specials excluded) on either side are skipped, as in the demo model's training;
    max_sentences: use only the first pairs (None = all); min_prob: drop table entries below this
    probability.
    """

    k: int = 100
    frequent: int = 100
    iterations: int = 5
    max_tokens: int = 128
    max_sentences: int | None = None
    min_prob: float = 0.0

    def __post_init__(self) -> None:
        for name in ("k", "frequent", "iterations", "max_tokens"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if name == "frequent" else 1)
            ):
                raise ValueError(f"shortlist {name} must be an integer >= 1 (frequent: >= 0), got {value!r}")
        if self.max_sentences is not None and self.max_sentences < 1:
            raise ValueError(f"shortlist max_sentences must be >= 1 or None, got {self.max_sentences!r}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"shortlist min_prob must be in [0, 1), got {self.min_prob!r}")


def split_direction(direction: str) -> tuple[str, str]:
    parts = direction.split("-")
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ValueError(f"direction must look like 'en-it' (source-target), got {direction!r}")
    return parts[0], parts[1]


def shortlist_tensors(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    n_vocab: int,
    always_active: Sequence[int],
    params: ShortlistParams,
) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """The table's arrays (module docstring) from subword ids with specials removed, and statistics."""
    t0 = time.perf_counter()
    table = ibm1(src_ids, tgt_ids, n_vocab, n_vocab, iterations=params.iterations)
    em_seconds = time.perf_counter() - t0
    keep = table.prob >= params.min_prob if params.min_prob > 0 else np.ones(len(table.src), dtype=bool)
    src, tgt, prob = table.src[keep], table.tgt[keep], table.prob[keep]
    # Rank of each entry within its source row (entries are sorted by source, then probability).
    row_start = np.searchsorted(src, src, side="left")
    top = (np.arange(len(src)) - row_start) < params.k
    src, tgt, prob = src[top], tgt[top], prob[top]
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n_vocab), out=indptr[1:])

    counts = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for t in tgt_ids]), minlength=n_vocab)
    by_count = np.lexsort((np.arange(n_vocab), -counts))  # most frequent first, ties by id
    frequent = by_count[: params.frequent]
    frequent = frequent[counts[frequent] > 0].astype(np.int32)
    tensors = {
        "indptr": indptr,
        "indices": tgt.astype(np.int32),
        "probs": prob.astype(np.float32),
        "frequent": frequent,
        "always_active": np.array(sorted({int(i) for i in always_active}), dtype=np.int32),
    }
    lengths = np.diff(indptr)
    stats: dict[str, object] = {
        "entries": len(tgt),
        "source_types": int((lengths > 0).sum()),
        "mean_row": float(lengths[lengths > 0].mean()) if (lengths > 0).any() else 0.0,
        "target_types": int((counts > 0).sum()),
        "frequent_token_share": float(counts[frequent].sum() / max(1, counts.sum())),
        "ibm1_log_likelihood": [round(x, 5) for x in table.log_likelihood],
        "em_seconds": round(em_seconds, 3),
    }
    return tensors, stats


def _strip(seqs: list[list[int]], drop: set[int]) -> list[list[int]]:
    return [[i for i in s if i not in drop] for s in seqs]


def _sentencepiece_ids(adapter, texts: list[str], lang: str) -> list[list[int]] | None:
    """``adapter.tokenize`` for an M2M100-style tokenizer, ~10x faster: SentencePiece's batch encoder and the
    tokenizer's own piece-to-id table. Texts holding a special token's string go through ``adapter.tokenize``;
    the first lines are checked against it, and None (use ``adapter.tokenize``) is returned on any mismatch
    or for another tokenizer."""
    tok = adapter.tokenizer
    sp, table = getattr(tok, "sp_model", None), getattr(tok, "encoder", None)
    if getattr(adapter, "family", None) != "m2m" or sp is None or not isinstance(table, dict) or not texts:
        return None
    unk = tok.unk_token_id
    tag, eos = adapter.lang_id(lang), adapter.eos_id
    specials = [t for t in getattr(tok, "all_special_tokens", []) if t]
    plain = [i for i, t in enumerate(texts) if not any(x in t for x in specials)]
    ids: list[list[int]] = [[] for _ in texts]
    pieces = sp.encode([texts[i] for i in plain], out_type=str)
    for i, ps in zip(plain, pieces, strict=True):
        ids[i] = [tag, *(table.get(p, unk) for p in ps), eos]
    rest = [i for i in range(len(texts)) if not ids[i]]
    for i, seq in zip(rest, adapter.tokenize([texts[i] for i in rest], lang), strict=True):
        ids[i] = seq
    sample = list(range(min(200, len(texts))))
    if adapter.tokenize([texts[i] for i in sample], lang) != [ids[i] for i in sample]:
        log.warning("fast SentencePiece tokenization differs from the tokenizer's: using the tokenizer")
        return None
    return ids


def tokenize_pairs(
    adapter, src_lang: str, tgt_lang: str, sources: Sequence[str], targets: Sequence[str], max_tokens: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Subword ids of both sides with the model's tokenizer, specials and language tags removed; pairs with
    an empty side or longer than ``max_tokens`` on either side are left out."""
    src = _sentencepiece_ids(adapter, list(sources), src_lang)
    if src is None:
        src = adapter.tokenize(list(sources), src_lang, tgt_lang)
    tgt: list[list[int]] | None
    if getattr(adapter, "family", None) == "marian":  # a pair model's target side has its own vocabulary
        tgt = [list(ids) for ids in adapter.tokenizer(text_target=list(targets))["input_ids"]]
    else:  # shared vocabulary: the target text tokenizes like a source text in its own language
        tgt = _sentencepiece_ids(adapter, list(targets), tgt_lang)
        if tgt is None:
            tgt = adapter.tokenize(list(targets), tgt_lang)
    drop = set(adapter.always_active_ids()) | set(getattr(adapter.tokenizer, "all_special_ids", []))
    drop |= {adapter.pad_id, adapter.decoder_start_id, adapter.eos_id}
    src, tgt = _strip(src, drop), _strip(tgt, drop)
    keep = [i for i in range(len(src)) if 0 < len(src[i]) <= max_tokens and 0 < len(tgt[i]) <= max_tokens]
    return [src[i] for i in keep], [tgt[i] for i in keep]


def build_shortlist(
    adapter,
    direction: str,
    sources: Sequence[str],
    targets: Sequence[str],
    params: ShortlistParams | None = None,
    *,
    fingerprint: str | None = None,
) -> MethodIndex:
    """A lexical shortlist for ``direction`` ("en-it") from parallel sentences of its training split.

    ``adapter``: a ``Seq2SeqAdapter`` (its tokenizer, vocabulary size, always-active ids; the model is not
    run). ``sources`` / ``targets``: aligned sentences in the direction's source and target language (e.g.
    ``artifacts_schema.corpus.read_direction(corpus, "en", "it", "train")[1:]``). ``fingerprint``: the
    model's, when the caller knows it (else ``adapter.fingerprint``, a full read of W). Returns a
    :class:`MethodIndex` for ``save_method_index``; nothing is written.
    """
    params = params or ShortlistParams()
    src_lang, tgt_lang = split_direction(direction)
    adapter.check_language(src_lang)
    adapter.check_language(tgt_lang)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source sentences but {len(targets)} target sentences")
    t0 = time.perf_counter()
    if params.max_sentences is not None:
        sources, targets = sources[: params.max_sentences], targets[: params.max_sentences]
    src_ids, tgt_ids = tokenize_pairs(adapter, src_lang, tgt_lang, sources, targets, params.max_tokens)
    if not src_ids:
        raise ValueError(f"no usable sentence pair for {direction} (empty, or all longer than max_tokens)")
    tokenize_seconds = time.perf_counter() - t0
    unk = getattr(adapter.tokenizer, "unk_token_id", None)
    always = [
        *adapter.always_active_ids(),
        *([unk] if isinstance(unk, int) and 0 <= unk < adapter.n_vocab else []),
    ]
    tensors, stats = shortlist_tensors(src_ids, tgt_ids, adapter.n_vocab, always, params)
    seconds = time.perf_counter() - t0
    stats.update(
        pairs_given=len(sources),
        pairs_used=len(src_ids),
        source_tokens=sum(len(s) for s in src_ids),
        target_tokens=sum(len(t) for t in tgt_ids),
        tokenize_seconds=round(tokenize_seconds, 3),
        aligner="ibm1",
    )
    log.info(
        "shortlist %s: %d pairs, %d entries in %.1fs", direction, len(src_ids), stats["entries"], seconds
    )
    return new_index(
        METHOD,
        model_fingerprint=fingerprint or adapter.fingerprint,
        direction=direction,
        n_vocab=adapter.n_vocab,
        d=adapter.d_model,
        params=asdict(params),
        tensors=tensors,
        build_seconds=seconds,
        extra=stats,
    )


# --------------------------------------------------------------------------- CTranslate2 vocabulary map


def vocabulary_tokens(adapter) -> list[str | None]:
    """Token string of every output id (None where the tokenizer has none), as CTranslate2's vocabulary
    spells them (the converter takes them from the same tokenizer)."""
    tok = adapter.tokenizer
    size = min(adapter.n_vocab, len(tok))
    tokens: list[str | None] = list(tok.convert_ids_to_tokens(list(range(size))))
    return tokens + [None] * (adapter.n_vocab - size)


def export_vmap(
    index: MethodIndex,
    tokens: Sequence[str | None],
    path: str | Path,
    *,
    k: int | None = None,
    frequent: int | None = None,
) -> Path:
    """Write the table as a CTranslate2 vocabulary map (``ct2-transformers-converter --vocab_mapping``).

    One line per source token with a row, ``<source token>\\t<target token> <target token> ...``, and first
    a line with an empty source listing the tokens always allowed (the frequent list and the always-active
    ids). ``tokens``: the string of every id (:func:`vocabulary_tokens`); ids without one, or whose string
    holds a tab or space, are left out. ``k`` / ``frequent`` use fewer than the table holds. Written
    atomically.
    """
    t = index.tensors
    if index.manifest.method != METHOD:
        raise ValueError(f"not a shortlist index: method {index.manifest.method!r}")
    if len(tokens) != index.manifest.n_vocab:
        raise ValueError(f"{len(tokens)} token strings for a vocabulary of {index.manifest.n_vocab}")

    def ok(i: int) -> str | None:
        s = tokens[i]
        return s if s and not any(c in s for c in " \t\n") else None

    freq = t["frequent"][: frequent if frequent is not None else len(t["frequent"])]
    always = [ok(int(i)) for i in np.concatenate([freq, t["always_active"]])]
    lines = ["\t" + " ".join(dict.fromkeys(s for s in always if s))]
    indptr, indices = t["indptr"], t["indices"]
    for s in np.flatnonzero(np.diff(indptr)):
        key = ok(int(s))
        if key is None:
            continue
        row = indices[indptr[s] : indptr[s + 1]][: k if k is not None else None]
        targets = [x for x in (ok(int(i)) for i in row) if x]
        if targets:
            lines.append(key + "\t" + " ".join(targets))
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
