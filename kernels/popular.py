"""A union step over W's rows in popularity order: the int8 union's blocks (``kernels.int8_union``) and the
expectations that decide, per row count, whether a step skips the map.

A map's sets overlap: the ids many clusters hold (function words, punctuation, frequent subwords) are in
nearly every union of a batch, the rare ones in few. Ordered by how likely a row's set holds them
(:func:`hit_probability`) and cut into blocks of a few thousand ids, the union of a batch is dense in the
first blocks and sparse in the rest. A dense block costs less through the packed GEMM over all its ids than
through a gather of its union columns; a sparse one the other way round. :func:`union_over_blocks` runs each
block the cheaper way (by a table of the two kernels' measured costs, ``union_costs``; the kernels themselves
come in as functions) and returns exactly the union's columns, in the union's order: which way a block ran
changes only the time. In float32 the same blocks measured slower than the plain gather
(docs/DESIGN-NOTES.md), so only the int8 path uses them.

The expectations here (:func:`expected_union`, :func:`expected_block_unions`) decide, once per row count,
whether a step should skip the map and run every column (:func:`map_skipped`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastvocab.kernels.cluster_assign import PreparedMap

# A step skips the map at a row count where even 1 / DENSE_UNION_MARGIN of the union expected there
# (:func:`expected_union`; per block, :func:`expected_block_unions`) would cost more gathered than the packed
# GEMM over all N (over every block): the assignment and the union then cost time and save none. The
# expectation draws rows independently; a beam's rows share clusters and have smaller unions, hence the
# margin.
DENSE_UNION_MARGIN = 2.0

# (columns, rows, ids) -> whether ``rows`` rows cost less over all ``ids`` columns of a block (the packed
# GEMM) than over ``columns`` of them gathered; ``columns`` and ``ids`` may be arrays (one answer per block).
DenseCheaper = Callable[[Any, int, Any], Any]


def hit_probability(pm: PreparedMap, n_vocab: int) -> np.ndarray:
    """Per id, the chance that a row in a cluster drawn by the clusters' populations has it in its set, (N,)
    float64 (always-active ids: 1)."""
    sizes = np.asarray(pm.sizes)
    pop = pm.population.astype(np.float64) * (sizes > 0)
    if pop.sum() == 0:  # no prediction counts: every non-empty cluster equally likely
        pop = (sizes > 0).astype(np.float64)
    p = pop / pop.sum()
    indptr, indices = pm.indptr.cpu().numpy(), pm.indices.cpu().numpy()
    hit = np.zeros(n_vocab)
    step = 256  # clusters at a time: a map of 2,000 sets of 20% of 256K ids holds 100M (cluster, id) pairs
    for lo in range(0, pm.r, step):
        hi = min(pm.r, lo + step)
        weights = np.repeat(p[lo:hi], sizes[lo:hi])
        hit += np.bincount(indices[indptr[lo] : indptr[hi]], weights=weights, minlength=n_vocab)
    return np.minimum(hit, 1.0)


def popularity_order(hit: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, rank)``: the ids in decreasing ``hit`` (ties by id), and each id's position in it; (N,)
    int64 each."""
    order = torch.from_numpy(np.argsort(-hit, kind="stable"))
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return order, rank


def block_sizes(n_vocab: int, width: int) -> np.ndarray:
    """Ids per block when ``n_vocab`` ids are cut into blocks of ``width`` (the last one shorter)."""
    return np.minimum(width, n_vocab - width * np.arange(-(-n_vocab // width)))


def union_probability(hit: np.ndarray, rows: int) -> np.ndarray:
    """Each id's chance to be in the union of ``rows`` sets drawn independently, each holding it with
    probability ``hit``: ``1 - (1 - hit_i) ** rows``."""
    with np.errstate(divide="ignore"):  # hit 1: log1p(-1) = -inf, and the id is in every union
        return -np.expm1(rows * np.log1p(-hit))


def expected_union(hit: np.ndarray, rows: int) -> float:
    """Expected size of the union of ``rows`` sets drawn independently (:func:`union_probability`, summed)."""
    return float(union_probability(hit, rows).sum())


def expected_block_unions(hit: np.ndarray, rows: int, width: int) -> np.ndarray:
    """:func:`expected_union` per block of ``width`` ids in decreasing ``hit`` order, (blocks,) float64."""
    inc = union_probability(np.sort(hit)[::-1], rows)
    return np.add.reduceat(inc, np.arange(0, len(inc), width))


def map_skipped(
    hit: np.ndarray, draws: int, rows: int, n_vocab: int, width: int | None, dense_cheaper: DenseCheaper
) -> bool:
    """Whether a union step of ``rows`` rows (``draws`` sets) skips the map: whether the packed GEMM beats
    the gather over all N (``width`` None) or over every block of ``width`` ids in popularity order, with
    ``1 / DENSE_UNION_MARGIN`` of the union expected there."""
    if width is None:
        expected = np.array([int(expected_union(hit, draws) / DENSE_UNION_MARGIN)])
        return bool(dense_cheaper(expected, rows, np.array([n_vocab]))[0])
    per_block = (expected_block_unions(hit, draws, width) / DENSE_UNION_MARGIN).astype(np.int64)
    return bool(np.all(dense_cheaper(per_block, rows, block_sizes(n_vocab, width))))


def union_over_blocks(
    h: torch.Tensor,
    cols: torch.Tensor,
    rank: torch.Tensor,
    width: int,
    n_vocab: int,
    dense_cheaper: DenseCheaper,
    dense_block: Callable[[int], torch.Tensor],
    gather: Callable[[torch.Tensor], torch.Tensor],
    full: Callable[[], torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Logits of the union ``cols``, (rows, C) float32, each block of ``width`` ids in popularity order
    (``rank``: each id's position) run dense or gathered, whichever ``dense_cheaper`` says costs less.

    ``dense_block(j)``: block j's logits over all its ids, in popularity order, (rows, size_j).
    ``gather(cols)``: the logits of the given columns, (rows, len(cols)). ``full()``: all N logits, (rows, N),
    one GEMM for a step whose every block runs dense. None when no block runs dense (the caller's gather over
    the whole union is then the step).
    """
    rows = h.shape[0]
    pos = rank.index_select(0, cols)  # (C,) positions in the popularity order
    block = pos // width
    sizes = block_sizes(n_vocab, width)
    counts = torch.bincount(block, minlength=len(sizes)).numpy()
    dense = np.flatnonzero(dense_cheaper(counts, rows, sizes)).tolist()
    if not dense:
        return None
    if full is not None and len(dense) == len(counts):
        return full().index_select(1, cols)  # every block dense: one GEMM over all N
    # Every dense block's logits and the gathered columns side by side in one (rows, S) buffer, then one
    # gather of the union's columns from it: cheaper than a scatter per block.
    slot = torch.full((len(counts),), -1, dtype=torch.int64)
    slot[dense] = torch.arange(len(dense))
    where = slot.index_select(0, block)  # (C,) the dense slot of each union column's block, -1: gathered
    rest = (where < 0).nonzero().squeeze(1)
    base = len(dense) * width
    src = torch.empty((rows, base + rest.numel()), dtype=torch.float32)
    for i, j in enumerate(dense):
        part = dense_block(j)  # (rows, size_j)
        src[:, i * width : i * width + part.shape[1]] = part
    where = where * width + pos % width  # a dense column's place in src
    if rest.numel():
        src[:, base:] = gather(cols.index_select(0, rest))
        where[rest] = base + torch.arange(rest.numel())
    return src.index_select(1, where)
