"""Logits of the active columns only, float32 (or the weight's dtype): the rows of W a step needs, gathered
and multiplied, or a cluster's cached block; each row against its own cluster's set (per-row selection); on
CPU, a union over W's rows in popularity order, pre-packed (:class:`Fp32Blocks`, ``kernels.popular``).

The torch twin of the CuPy gather-GEMM kernels (``cupy_ops``), and the CPU path. With int8 rows
(:class:`~fastvocab.kernels.int8_union.Int8Weights`) a cluster's logits come from ``int8_union``.

Shapes: ``h`` (rows, d); ``weight`` (N, d), one vocabulary entry contiguous; ``bias`` (N,) or None.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fastvocab.kernels import prepack
from fastvocab.kernels.cluster_assign import PreparedMap
from fastvocab.kernels.int8_union import Int8Weights, int8_cluster_logits
from fastvocab.kernels.popular import dense_cheaper_by, map_skipped, popularity_order, union_over_blocks
from fastvocab.kernels.union_costs import (
    COST_ROWS,
    COST_UNIONS,
    CostTable,
    costs_from_timings,
    load_cost_table,
    machine,
    time_kernels,
)

# CPU gathers go through a reused 4 MB block: one big index_select would allocate a fresh C x d buffer per
# call (beyond glibc's mmap threshold, so every page faults in again: 3-5x slower at C = 12.5K, d = 1024,
# benchmarks/README.md) and stream it out of cache before the GEMM reads it back.
GATHER_CHUNK_BYTES = 4 << 20


def gathered_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cols: torch.Tensor
) -> torch.Tensor:
    """Logits of columns ``cols`` only, (rows, C): copy the active rows of W, then GEMM.

    On CPU, sets above ``GATHER_CHUNK_BYTES`` are gathered and multiplied a cache-sized block at a time.
    """
    c, d = cols.numel(), weight.shape[1]
    row_bytes = d * weight.element_size()
    if weight.device.type != "cpu" or c * row_bytes <= GATHER_CHUNK_BYTES:
        w = weight.index_select(0, cols)  # (C, d)
        b = None if bias is None else bias.index_select(0, cols)
        return F.linear(h, w, b)
    step = max(1, GATHER_CHUNK_BYTES // row_bytes)
    out_t = h.new_empty((c, h.shape[0]))  # (C, rows): each block fills contiguous rows
    buf = weight.new_empty((step, d))
    h_t = h.t()  # (d, rows)
    for lo in range(0, c, step):
        sel = cols[lo : lo + step]
        n = sel.numel()
        torch.index_select(weight, 0, sel, out=buf[:n])  # (n, d)
        if bias is None:
            torch.mm(buf[:n], h_t, out=out_t[lo : lo + n])
        else:
            torch.addmm(bias.index_select(0, sel).unsqueeze(1), buf[:n], h_t, out=out_t[lo : lo + n])
    return out_t.t().contiguous()


def cluster_logits(
    h: torch.Tensor,
    pm: PreparedMap,
    c: int,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w8: Int8Weights | None = None,
) -> torch.Tensor:
    """Logits of rows ``h`` (all in cluster ``c``) over the cluster's own set, (rows, size_c); from the
    int8 rows ``w8`` when given (:func:`int8_cluster_logits`)."""
    if w8 is not None:
        return int8_cluster_logits(h, w8, pm, c)
    block = pm.blocks[c]
    if block is not None:
        return F.linear(h, block, pm.block_bias[c])  # contiguous cached block: no gather
    return gathered_logits(h, weight, bias, pm.ids[c])


def group_rows(clusters: Sequence[int]) -> dict[int, list[int]]:
    """Rows by cluster, clusters ascending, rows ascending within a cluster."""
    groups: dict[int, list[int]] = {}
    for row, c in enumerate(clusters):
        groups.setdefault(int(c), []).append(row)
    return dict(sorted(groups.items()))


def per_row_logits(
    h: torch.Tensor,
    clusters: Sequence[int],
    pm: PreparedMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w8: Int8Weights | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row against its own cluster's set: rows grouped by cluster, one GEMM per group (from the int8
    rows ``w8`` when given).

    Returns ``(logits, ids)``: (rows, C) and shared ids (C,) when every row is in one cluster; otherwise
    (rows, W) and per-row ids (rows, W) with W the largest set among the rows' clusters, padding positions
    holding ``-inf`` and repeating the row's first id.
    """
    groups = group_rows(clusters)
    if len(groups) == 1:
        c = next(iter(groups))
        return cluster_logits(h, pm, c, weight, bias, w8), pm.ids[c]
    rows = h.shape[0]
    width = max(pm.sizes[c] for c in groups)
    logits = h.new_full((rows, width), -math.inf)  # (rows, W)
    ids = torch.empty((rows, width), dtype=torch.int64, device=h.device)  # (rows, W)
    for c, members in groups.items():
        n = pm.sizes[c]
        if len(members) == members[-1] - members[0] + 1:  # consecutive rows (beams of one sentence)
            sel: slice | torch.Tensor = slice(members[0], members[-1] + 1)
        else:
            sel = torch.tensor(members, dtype=torch.int64, device=h.device)
        logits[sel, :n] = cluster_logits(h[sel], pm, c, weight, bias, w8)
        ids[sel, :n] = pm.ids[c]
        if n < width:
            ids[sel, n:] = pm.ids[c][:1]
    return logits, ids


# A float32 union step on CPU runs W's rows in popularity order this many at a time, each block pre-packed for
# oneDNN (kernels.prepack): a block the union fills densely enough costs less through the packed GEMM over
# all its ids than through a gather of its union columns, which copies rows and multiplies them with MKL's
# unpacked GEMM (benchmarks/README.md, "Turning the sets into speed").
FP32_BLOCK_COLUMNS = 4096
# The float32 kernels' per-column costs by the step's rows (``union_costs``: the packaged fp32 table, or the
# one FASTVOCAB_FP32_COSTS names, read once, here).
FP32_COSTS = load_cost_table(dtype="fp32")


@dataclass
class Fp32Blocks:
    """W's float32 rows in decreasing order of their ids' hit probability, pre-packed for oneDNN
    ``block_columns`` rows at a time, with their bias. Costs one more copy of W."""

    rank: torch.Tensor  # (N,) int64: each id's position in the order
    block_columns: int
    packed: list[torch.Tensor]  # block j: the ids at positions [j * block_columns, (j + 1) * ...)
    bias: list[torch.Tensor | None]


def fp32_blocks(weight: torch.Tensor, bias: torch.Tensor | None, hit: np.ndarray) -> Fp32Blocks:
    """Pack W's rows in decreasing ``hit`` order, ``FP32_BLOCK_COLUMNS`` at a time (CPU float32, where
    ``prepack.prepack_unavailable`` is None)."""
    order, rank = popularity_order(hit)
    width = FP32_BLOCK_COLUMNS
    packed, biases = [], []
    for lo in range(0, len(order), width):
        ids = order[lo : lo + width]
        packed.append(prepack.pack_weight(weight.index_select(0, ids)))
        biases.append(None if bias is None else bias.index_select(0, ids).contiguous())
    return Fp32Blocks(rank=rank, block_columns=width, packed=packed, bias=biases)


def fp32_dense_cheaper(columns, rows: int, ids):
    """Whether ``rows`` rows cost less over all ``ids`` columns (packed GEMM) than over ``columns`` gathered
    ones, by :data:`FP32_COSTS` (read at call time, so a test may replace it)."""
    t = FP32_COSTS
    return dense_cheaper_by(t.rows, t.gather_us, t.dense_us)(columns, rows, ids)


def fp32_union_logits(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cols: torch.Tensor,
    pb: Fp32Blocks | None,
) -> torch.Tensor:
    """Logits of the union ``cols`` (sorted ids), (rows, C): :func:`gathered_logits`, or with
    :class:`Fp32Blocks` each block of the popularity order run dense (packed) or gathered, whichever costs
    less (``kernels.popular.union_over_blocks``)."""
    if pb is None:
        return gathered_logits(h, weight, bias, cols)
    x = h.contiguous()
    logits = union_over_blocks(
        h,
        cols,
        pb.rank,
        pb.block_columns,
        weight.shape[0],
        fp32_dense_cheaper,
        lambda j: prepack.packed_linear(x, pb.packed[j], pb.bias[j]),
        lambda c: gathered_logits(h, weight, bias, c),
    )
    return gathered_logits(h, weight, bias, cols) if logits is None else logits


def fp32_full_logits(h: torch.Tensor, pb: Fp32Blocks) -> torch.Tensor:
    """All N columns from the packed blocks, in id order, (rows, N)."""
    x = h.contiguous()
    parts = [prepack.packed_linear(x, p, b) for p, b in zip(pb.packed, pb.bias, strict=True)]
    return torch.cat(parts, dim=1).index_select(1, pb.rank)


def fp32_map_skipped(hit: np.ndarray, draws: int, rows: int, n_vocab: int, width: int | None) -> bool:
    """:func:`~fastvocab.kernels.popular.map_skipped` by the float32 kernels' costs."""
    return map_skipped(hit, draws, rows, n_vocab, width, fp32_dense_cheaper)


def measure_fp32_costs(
    d: int = 1024,
    n_vocab: int = 128_112,
    rows: Sequence[int] = COST_ROWS,
    unions: Sequence[float] = COST_UNIONS,
    repeats: int = 5,
) -> CostTable:
    """This machine's float32 cost table: the gather (:func:`gathered_logits`) against the packed GEMM over
    all N (then the union's columns), on random weights (``n_vocab``, ``d``)
    (:func:`~fastvocab.kernels.union_costs.time_kernels`)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n_vocab, d, generator=gen) * d**-0.5
    packed = prepack.pack_weight(w)
    kernels = {
        "fp32-gather": functools.partial(_gathered, w=w),
        "fp32-dense": functools.partial(_dense_columns, packed=packed),
    }
    timings = time_kernels(kernels, d, n_vocab, rows, unions, repeats)
    return costs_from_timings(timings, n_vocab, machine(d, n_vocab, unions, repeats), dtype="fp32")


def _gathered(h: torch.Tensor, cols: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return gathered_logits(h, w, None, cols)


def _dense_columns(h: torch.Tensor, cols: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The packed GEMM over all N, then the columns ``cols``."""
    return prepack.packed_linear(h, packed, None).index_select(1, cols)
