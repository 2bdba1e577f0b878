"""IBM Model 1 lexical translation probabilities ``p(t | s)`` over subword ids (Brown et al. 1993), in numpy.

The lexical shortlist (``tasks/shortlist.py``) needs, per source subword, the target subwords it most likely
translates into. eflomal (the first choice) ships only a source distribution on the package index: it
builds (C and Cython, ~50 s on 2 cores), but CI would need a compiler for it, so fastvocab has its own IBM-1.

EM over every (source position, target position) pair of every sentence, plus a NULL source word per sentence
(id ``n_src``) that absorbs target words with no counterpart, so function words are not forced onto content
words. Each target position's alignment posterior over its sentence's source positions is
``t(t_j | s_i) / sum_i' t(t_j | s_i')``; the expected counts, normalised per source word, are the next ``t``.

Memory: the co-occurring (s, t) types are numbered once (sorted int64 keys ``s * n_tgt + t``); each chunk of
sentences keeps only the int32 type number of each of its pairs. The demo corpus (106K pairs, ~140M position
pairs) takes ~0.6 GB this way, against ~4 GB for a dense (32K x 32K) float32 table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

CHUNK_PAIRS = 8_000_000  # position pairs per chunk: its float64 temporaries stay ~200 MB


@dataclass
class LexicalTable:
    """Sparse ``p(t | s)``: one entry per co-occurring (source, target) type, sorted by (src, -prob).

    ``src`` (nnz,) int32 source ids (NULL excluded), ``tgt`` (nnz,) int32 target ids, ``prob`` (nnz,) float32;
    ``iterations`` EM iterations run, ``log_likelihood`` per iteration (nats per target token, under the
    table that iteration started from; it rises every iteration).
    """

    src: np.ndarray
    tgt: np.ndarray
    prob: np.ndarray
    iterations: int
    log_likelihood: list[float]

    def top_k(self, s: int, k: int) -> list[tuple[int, float]]:
        """The ``k`` most probable (target, p) of source ``s``."""
        lo, hi = np.searchsorted(self.src, [s, s + 1])
        return [(int(t), float(p)) for t, p in zip(self.tgt[lo:hi][:k], self.prob[lo:hi][:k], strict=True)]


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` by sorting: numpy 2's hash-based ``unique`` is ~10x slower on these int64 keys."""
    a = np.sort(a)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if len(a) else a


def _chunks(src_len: np.ndarray, tgt_len: np.ndarray) -> list[tuple[int, int]]:
    """Sentence ranges [a, b) holding about ``CHUNK_PAIRS`` position pairs each (one long sentence alone)."""
    pairs = np.cumsum(src_len.astype(np.int64) * tgt_len)
    out, a = [], 0
    while a < len(src_len):
        base = pairs[a - 1] if a else 0
        b = int(np.searchsorted(pairs, base + CHUNK_PAIRS, side="right"))
        b = max(b, a + 1)
        out.append((a, b))
        a = b
    return out


def _pair_arrays(
    src: list[np.ndarray], tgt: list[np.ndarray], null_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (source position incl. NULL, target position) pair of a chunk of sentences.

    Returns ``src_tok`` and ``tgt_tok`` (pairs,) int64 and ``seg`` (pairs,) int64: the chunk-wide number of
    the target position each pair belongs to (pairs of one target position are contiguous).
    """
    src = [np.append(s, null_id) for s in src]
    m = np.array([len(s) for s in src], dtype=np.int64)  # (sents,) source length incl. NULL
    n = np.array([len(t) for t in tgt], dtype=np.int64)  # (sents,)
    src_flat = np.concatenate(src).astype(np.int64)
    tgt_flat = np.concatenate(tgt).astype(np.int64)  # (positions,)
    src_start = np.concatenate([[0], np.cumsum(m)[:-1]])  # (sents,)
    pos_sent = np.repeat(np.arange(len(src)), n)  # (positions,) sentence of each target position
    seg_len = m[pos_sent]  # (positions,) source positions each target position pairs with
    seg = np.repeat(np.arange(len(tgt_flat)), seg_len)  # (pairs,)
    seg_start = np.concatenate([[0], np.cumsum(seg_len)[:-1]])
    within = np.arange(len(seg)) - seg_start[seg]  # (pairs,) source position within the sentence
    src_tok = src_flat[src_start[pos_sent][seg] + within]
    return src_tok, tgt_flat[seg], seg


def ibm1(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    n_src: int,
    n_tgt: int,
    iterations: int = 5,
) -> LexicalTable:
    """IBM Model 1 ``p(t | s)`` from parallel id sequences (specials already removed), ``iterations`` of EM.

    ``n_src`` / ``n_tgt``: id ranges (ids must lie in ``[0, n)``); the NULL source word is ``n_src``. Pairs
    with an empty side are skipped. Deterministic (no sampling).
    """
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source sentences but {len(tgt)} target sentences")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    keep = [i for i in range(len(src)) if len(src[i]) and len(tgt[i])]
    s_arr = [np.asarray(src[i], dtype=np.int64) for i in keep]
    t_arr = [np.asarray(tgt[i], dtype=np.int64) for i in keep]
    if not s_arr:
        raise ValueError("no sentence pair with both sides non-empty")
    for name, arrs, hi in (("source", s_arr, n_src), ("target", t_arr, n_tgt)):
        lo_v, hi_v = min(int(a.min()) for a in arrs), max(int(a.max()) for a in arrs)
        if lo_v < 0 or hi_v >= hi:
            raise ValueError(f"{name} ids must lie in [0, {hi}), got [{lo_v}, {hi_v}]")
    m = np.array([len(s) + 1 for s in s_arr], dtype=np.int64)
    n = np.array([len(t) for t in t_arr], dtype=np.int64)
    chunks = _chunks(m, n)

    # Number the co-occurring types once; each chunk keeps its pairs' type numbers (int32). Sorting a chunk's
    # keys gives its distinct types and each pair's rank among them; the global numbers follow by a
    # searchsorted of the (sorted, much shorter) distinct keys.
    chunk_types: list[np.ndarray] = []
    chunk_inv: list[np.ndarray] = []
    for a, b in chunks:
        s_tok, t_tok, _ = _pair_arrays(s_arr[a:b], t_arr[a:b], n_src)
        keys = s_tok * n_tgt + t_tok
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        first = np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]])
        inv = np.empty(len(keys), dtype=np.int32)
        inv[order] = np.cumsum(first) - 1
        chunk_types.append(sorted_keys[first])
        chunk_inv.append(inv)
    types = _sorted_unique(np.concatenate(chunk_types))  # (types,) sorted int64
    type_of = [
        np.searchsorted(types, u).astype(np.int32)[inv] for u, inv in zip(chunk_types, chunk_inv, strict=True)
    ]
    del chunk_types, chunk_inv
    type_src = types // n_tgt  # (types,)
    log.info(
        "IBM-1: %d sentence pairs, %d position pairs, %d (s, t) types",
        len(s_arr),
        int((m * n).sum()),
        len(types),
    )

    t_prob = np.full(len(types), 1.0 / n_tgt)  # uniform start: first posteriors are 1 / (m + 1)
    lls: list[float] = []
    for it in range(iterations):
        counts = np.zeros(len(types), dtype=np.float64)
        ll = 0.0
        for (a, b), tid in zip(chunks, type_of, strict=True):
            seg_len = np.repeat(m[a:b], n[a:b])  # (positions,)
            seg = np.repeat(np.arange(len(seg_len)), seg_len)  # (pairs,)
            p = t_prob[tid]  # (pairs,)
            denom = np.bincount(seg, weights=p, minlength=len(seg_len))  # (positions,)
            ll += float(np.log(denom / seg_len).sum())
            counts += np.bincount(tid, weights=p / denom[seg], minlength=len(types))
        totals = np.bincount(type_src, weights=counts, minlength=n_src + 1)  # (n_src + 1,)
        t_prob = counts / totals[type_src]
        lls.append(ll / float(n.sum()))
        log.info("IBM-1 iteration %d: log-likelihood %.4f nats/token", it + 1, lls[-1])

    real = type_src < n_src  # the NULL word's row is not a translation
    s_out = type_src[real].astype(np.int32)
    t_out = (types[real] % n_tgt).astype(np.int32)
    p_out = t_prob[real].astype(np.float32)
    order = np.lexsort((t_out, -p_out, s_out))  # by source, then probability descending, then id
    return LexicalTable(s_out[order], t_out[order], p_out[order], iterations, lls)
